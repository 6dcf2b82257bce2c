"""Forces on the thread's vertices at x^k: gravity, external loads, quadratic and linear air drag, discrete
bending, internal bending dissipation and uniform twist.

All arrays are float64, SI units: positions in m, forces in N. Vertices are 0..n-1, edge j joins j and j+1, and
hinge i (1 <= i <= n-2) sits between edges i-1 and i. See docs/PHYSICS.md for the derivations.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy", inline="always")
def hinge_cos(x: np.ndarray, i: int) -> float:
    """cos phi_i = e_{i-1} . e_i / (|e_{i-1}| |e_i|) at hinge i (1 <= i <= n-2) of positions x."""
    ax = x[i, 0] - x[i - 1, 0]
    ay = x[i, 1] - x[i - 1, 1]
    az = x[i, 2] - x[i - 1, 2]
    bx = x[i + 1, 0] - x[i, 0]
    by = x[i + 1, 1] - x[i, 1]
    bz = x[i + 1, 2] - x[i, 2]
    return (ax * bx + ay * by + az * bz) / math.sqrt((ax * ax + ay * ay + az * az) * (bx * bx + by * by + bz * bz))


@njit(cache=True, error_model="numpy")
def edge_vectors(x: np.ndarray, edges: np.ndarray, elen: np.ndarray) -> None:
    """Edges e_j = x_{j+1} - x_j (m) and their lengths (m)."""
    for j in range(x.shape[0] - 1):
        ex = x[j + 1, 0] - x[j, 0]
        ey = x[j + 1, 1] - x[j, 1]
        ez = x[j + 1, 2] - x[j, 2]
        edges[j, 0] = ex
        edges[j, 1] = ey
        edges[j, 2] = ez
        elen[j] = math.sqrt(ex * ex + ey * ey + ez * ez)


@njit(cache=True, error_model="numpy")
def accumulate_forces(x: np.ndarray, x_prev: np.ndarray, edges: np.ndarray, elen: np.ndarray, h: float,
                      mass: np.ndarray, inv_mass: np.ndarray, hinge_k: np.ndarray, k_d: float,
                      drag_quad: np.ndarray, drag_lin: np.ndarray, gravity: np.ndarray, ext_force: np.ndarray,
                      twist_k: float, force: np.ndarray, twist_grad: np.ndarray, parted: np.ndarray) -> None:
    """Write the non-constraint force (N) on every vertex into ``force`` and dTheta/dx (rad/m), the gradient of
    the end-to-end twist angle, into ``twist_grad`` (left at zero when twist_k is 0). The twist force itself,
    -twist_k theta dTheta/dx, is added by the integrator once theta is known (integrator.add_forces).

    edges, elen: the edges of x and their lengths (edge_vectors). h: step (s), for the velocities
    (x - x_prev)/h of the drag and the bending rate of the dissipation.
    hinge_k: K_i (J) of the bending energy K_i * (2/(1+cos phi_i) - 1), zero at the two end vertices.
    k_d: Wang 2017 Eq. 5 bending-dissipation coefficient (J*s per hinge).
    drag_quad: per-vertex quadratic drag (N*s^2/m^2), drag_lin: per-vertex linear drag (N*s/m).
    mass: the vertices' own masses (kg), which gravity weighs; inv_mass: the inverse masses the substep integrates
    with (1/kg), larger masses where selective mass scaling made a vertex heavier: its drag grows with it.
    twist_k: GJ / L_bar (N*m); only whether it is 0 matters here.
    parted: (n-1,) int8, 1 where the thread broke (solver/breakage.py): the two hinges either side bend nothing.
    """
    n = x.shape[0]
    inv_h = 1.0 / h
    for i in range(n):
        vx = (x[i, 0] - x_prev[i, 0]) * inv_h
        vy = (x[i, 1] - x_prev[i, 1]) * inv_h
        vz = (x[i, 2] - x_prev[i, 2]) * inv_h
        # Wang 2017 Eq. 4 (quadratic drag, -k |v| v) plus a linear Stokes term for low Reynolds numbers.
        c = drag_lin[i] + drag_quad[i] * math.sqrt(vx * vx + vy * vy + vz * vz)
        # a vertex made f times heavier by the mass scaling (stability.scale_masses) is dragged f times harder:
        # its motion then still dies at the air's rate c/m. Without it a scaled vertex kept 1/f of its damping,
        # and the slowed modes of a knot and its tails rang for tens of seconds (docs/PHYSICS.md Sec. 6)
        scaled = mass[i] * inv_mass[i]
        if 0.0 < scaled < 1.0:
            c /= scaled
        force[i, 0] = mass[i] * gravity[0] + ext_force[i, 0] - c * vx
        force[i, 1] = mass[i] * gravity[1] + ext_force[i, 1] - c * vy
        force[i, 2] = mass[i] * gravity[2] + ext_force[i, 2] - c * vz
        twist_grad[i, 0] = 0.0
        twist_grad[i, 1] = 0.0
        twist_grad[i, 2] = 0.0

    with_twist = twist_k != 0.0
    for i in range(1, n - 1):
        if parted[i - 1] != 0 or parted[i] != 0:
            continue
        ax = edges[i - 1, 0]
        ay = edges[i - 1, 1]
        az = edges[i - 1, 2]
        bx = edges[i, 0]
        by = edges[i, 1]
        bz = edges[i, 2]
        la = elen[i - 1]
        lb = elen[i]
        ila = 1.0 / la
        ilb = 1.0 / lb
        dot = ax * bx + ay * by + az * bz
        c = dot * ila * ilb
        onepc = 1.0 + c
        if onepc < 1e-12:
            onepc = 1e-12  # a fully folded hinge: keep the force finite; contact keeps real threads away from it
        # dE/dc for E = K (2/(1+c) - 1) = K tan^2(phi/2)  (Wang 2017 Eq. 3 read as an energy per hinge)
        s = -2.0 * hinge_k[i] / (onepc * onepc)
        if k_d != 0.0:
            # Wang 2017 Eq. 5-6 / App. A: P = 1/2 k_d (d beta/dt)^2 with beta = cos phi, force -k_d beta_dot dbeta/dx;
            # it has the same geometric factor dc/dx as the bending force, so it folds into s. Explicit in the
            # rate, it removes h k_d S of the hinge's rate per step, S = sum_v |dc/dx_v|^2 / m_v <= (1 - c^2)
            # (1/(m_a l_a^2) + 1/(m_b l_b^2) + (1/l_a + 1/l_b)^2 / m_i); past h k_d S ~ 2/3 (the hinge shares its
            # vertices with its neighbours) it overshoots and the hinge oscillates with growing amplitude (a
            # 200-segment knot, 5 mm segments, kinks to phi ~ 30 deg and whips). So k_d is capped at
            # 1 / (3 h S): a third of the rate per step at most, and the five hinges sharing a vertex stay under
            # 2 together; k_d itself wherever the step resolves the damping (docs/PHYSICS.md Sec. 3).
            ilab = ila + ilb
            sg = (1.0 - c * c) * (ila * ila / mass[i - 1] + ilb * ilb / mass[i + 1] + ilab * ilab / mass[i])
            kd_i = k_d
            if 3.0 * h * k_d * sg > 1.0:
                kd_i = 1.0 / (3.0 * h * sg)
            s += kd_i * (c - hinge_cos(x_prev, i)) * inv_h
        # dc/da = (t_b - c t_a)/|a|, dc/db = (t_a - c t_b)/|b|: exact, perpendicular to a and b, so bending
        # never loads the constraint direction (Wang 2017 App. C drops the projection; the tension would absorb it)
        sa = s * ila * ila
        sb = s * ilb * ilb
        da_x = sa * (bx * la * ilb - c * ax)
        da_y = sa * (by * la * ilb - c * ay)
        da_z = sa * (bz * la * ilb - c * az)
        db_x = sb * (ax * lb * ila - c * bx)
        db_y = sb * (ay * lb * ila - c * by)
        db_z = sb * (az * lb * ila - c * bz)
        force[i - 1, 0] += da_x
        force[i - 1, 1] += da_y
        force[i - 1, 2] += da_z
        force[i + 1, 0] -= db_x
        force[i + 1, 1] -= db_y
        force[i + 1, 2] -= db_z
        force[i, 0] += db_x - da_x
        force[i, 1] += db_y - da_y
        force[i, 2] += db_z - da_z

        if with_twist:
            # Holonomy gradient (Bergou et al. 2008 Sec. 7): kb = 2 a x b / (|a||b| + a.b),
            # grad_{i-1} psi = kb / (2|a|), grad_{i+1} psi = -kb / (2|b|), grad_i psi = -(sum).
            # The twist Theta between fixed end material frames falls as the transported frame turns,
            # so dTheta/dx = -sum grad psi (checked against parallel transport in tests/test_forces.py).
            den = 1.0 / (la * lb + dot)
            kx = 2.0 * (ay * bz - az * by) * den
            ky = 2.0 * (az * bx - ax * bz) * den
            kz = 2.0 * (ax * by - ay * bx) * den
            gm = 0.5 * ila
            gp = -0.5 * ilb
            twist_grad[i - 1, 0] -= gm * kx
            twist_grad[i - 1, 1] -= gm * ky
            twist_grad[i - 1, 2] -= gm * kz
            twist_grad[i + 1, 0] -= gp * kx
            twist_grad[i + 1, 1] -= gp * ky
            twist_grad[i + 1, 2] -= gp * kz
            twist_grad[i, 0] += (gm + gp) * kx
            twist_grad[i, 1] += (gm + gp) * ky
            twist_grad[i, 2] += (gm + gp) * kz



@njit(cache=True, error_model="numpy")
def bending_energy(x: np.ndarray, hinge_k: np.ndarray, parted: np.ndarray) -> float:
    """Discrete bending energy (J): sum over hinges of K_i * tan^2(phi_i / 2), but the hinges either side of a
    parted segment (``parted`` (n-1,) int8, solver/breakage.py)."""
    e = 0.0
    for i in range(1, x.shape[0] - 1):
        if parted[i - 1] != 0 or parted[i] != 0:
            continue
        e += hinge_k[i] * (2.0 / (1.0 + hinge_cos(x, i)) - 1.0)
    return e


@njit(cache=True, error_model="numpy")
def constraint_force_at(x: np.ndarray, tension: np.ndarray, v: int, out: np.ndarray) -> float:
    """Net axial constraint force (N) the thread's segments exert on vertex v (Wang 2017 Eq. 8): tension T_v
    pulls it toward v+1, T_{v-1} toward v-1. Writes the vector into ``out`` (3,) and returns its magnitude."""
    n = x.shape[0]
    out[0] = 0.0
    out[1] = 0.0
    out[2] = 0.0
    if v < n - 1:
        ex = x[v + 1, 0] - x[v, 0]
        ey = x[v + 1, 1] - x[v, 1]
        ez = x[v + 1, 2] - x[v, 2]
        s = tension[v] / math.sqrt(ex * ex + ey * ey + ez * ez)
        out[0] += s * ex
        out[1] += s * ey
        out[2] += s * ez
    if v > 0:
        ex = x[v, 0] - x[v - 1, 0]
        ey = x[v, 1] - x[v - 1, 1]
        ez = x[v, 2] - x[v - 1, 2]
        s = tension[v - 1] / math.sqrt(ex * ex + ey * ey + ez * ez)
        out[0] -= s * ex
        out[1] -= s * ey
        out[2] -= s * ez
    return math.sqrt(out[0] * out[0] + out[1] * out[1] + out[2] * out[2])
