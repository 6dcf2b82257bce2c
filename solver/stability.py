"""How many substeps a 1 ms tick needs.

The scheme is explicit in the bending forces and in the direction of the constraint forces, so it is stable
while h * omega_max < 2 (Wang 2017 Sec. 3 (1), after Skeel et al. 1997). omega_max^2 is bounded by Gershgorin's
theorem on M^-1 K: per vertex, its inverse mass times the absolute row sum of the stiffness. Two stiffnesses
count:
- bending, K_i tan^2(phi/2) per hinge: its straight-thread row sums are precomputed in the model
  (model.bend_gersh) and scaled by the current hinge's stiffening factor (E'' + |E'|)/E''(0) of
  E(phi) = tan^2(phi/2), which grows as a hinge folds;
- the geometric stiffness of tension: a segment under tension T acts transversally as a spring T / l, so a
  vertex gets 2 (T_{j-1} / l_{j-1} + T_j / l_j) (the string mode of a taut thread). Only tension counts: a
  compressed segment (T < 0) has a negative geometric stiffness, which makes the thread buckle (a growing mode
  that explicit Verlet follows at its physical rate, r + 1/r = 2 + h^2 |lambda|) and sets no step limit. Counting
  it would slow a compressed thread's buckling by mass scaling, so a thread pushed back along itself, as by a
  stylus easing off a taut pull, would stay straight and keep pushing for seconds.
- self-contact penalty springs (solver/contact_response.py), whose row sums the contact kernel leaves in the
  state per vertex (``contact_k``; zeros without contact).
Grasp couplings are integrated implicitly and the stretch of extensible threads is a compliant constraint, so
neither limits the step. Light, stiff sutures need many substeps (bench-suture: docs/BENCHMARKS.md).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .forces import hinge_cos


@njit(cache=True, error_model="numpy", inline="always")
def hinge_factor(x: np.ndarray, i: int) -> float:
    """How much stiffer hinge i is than a straight one, (E'' + |E'|) / E''(0) for E(phi) = tan^2(phi/2): with
    u = tan^2(phi/2) = (1-c)/(1+c) and sec^2 = 1 + u, E' = tan sec^2, E'' = sec^4/2 + tan^2 sec^2 and
    E''(0) = 1/2. 1 past the ends (0 < i < n - 1 are hinges)."""
    if i < 1 or i > x.shape[0] - 2:
        return 1.0
    # cos phi of a straight hinge can round to just above 1: u would be negative and its root NaN
    c = min(max(hinge_cos(x, i), -0.999), 1.0)
    u = (1.0 - c) / (1.0 + c)
    sec2 = 1.0 + u
    return (0.5 * sec2 * sec2 + u * sec2 + math.sqrt(u) * sec2) / 0.5


@njit(cache=True, error_model="numpy")
def hinge_factors(x: np.ndarray, fold: np.ndarray, parted: np.ndarray) -> float:
    """Every hinge's factor (hinge_factor) into ``fold`` (n,), 1 at the two ends and either side of a parted
    segment (``parted`` (n-1,) int8, solver/breakage.py: those hinges bend nothing, however the pieces lie);
    returns the largest (the whole-thread scaling's fold). Each hinge once: a vertex's fold reads three hinges
    (local_fold). Read from x
    each time, they cost the mass scaling 12.4 us and the bound 10.2 us on a 200-segment thread (6.2 and 6.2 us
    now, kernels alone), and a tick of the default scene 58.4 us (54.2 now; 2026-11-28)."""
    f = 1.0
    m = parted.shape[0]
    for i in range(x.shape[0]):
        if (i >= 1 and parted[i - 1] != 0) or (i < m and parted[i] != 0):
            fold[i] = 1.0
            continue
        v = hinge_factor(x, i)
        fold[i] = v
        f = max(f, v)
    return f


@njit(cache=True, error_model="numpy", inline="always")
def local_fold(fold: np.ndarray, i: int) -> float:
    """The fold factor of vertex i's bending row: the stiffest of the hinges it takes part in (i - 1, i, i + 1),
    from ``fold`` (hinge_factors). Each hinge's linearised stiffness scaled by its own factor is still a
    Gershgorin bound; the thread's most folded hinge for all would make a knot's tightest turn stiffen every
    free strand."""
    left = fold[i - 1] if i >= 1 else 1.0
    right = fold[i + 1] if i + 1 < fold.shape[0] else 1.0
    return max(left, max(fold[i], right))


@njit(cache=True, error_model="numpy", inline="always")
def vertex_fold(fold: np.ndarray, i: int, contact_k: np.ndarray, local: bool, whole: float) -> float:
    """The fold factor that stiffens vertex i's bending row: its own hinges' (local_fold, from ``fold``) under
    the local scaling, unless a contact spring may act on it, and the thread's most folded hinge's (``whole``)
    otherwise. In a knot the hinges fold and unfold within a tick, and its vertices each read by their own
    hinges made the strands of a 200-segment square knot pulled tight at 3 substeps jitter (median vertex speed
    102-144 mm/s against 25 with the whole thread's fold; docs/PHYSICS.md Sec. 6)."""
    if local and contact_k[i] == 0.0:
        return local_fold(fold, i)
    return whole


@njit(cache=True, error_model="numpy", inline="always")
def geometric_stiffness(t: float, length: float, tension_margin: float) -> float:
    """A segment's share of the Gershgorin row sum (N/m) of each of its two vertices: 2 T / l, the string mode
    of a taut thread, with the tension T (N) times tension_margin; compression counts 0. Scalars: omega_bound's
    loop passed the tension and length arrays to an inlined helper, which kept their reference counts per vertex
    (about 2 us of omega_bound's 3.4 us on 101 vertices; about 0.5 us with scalars)."""
    return 2.0 * max(t, 0.0) * tension_margin / length


@njit(cache=True, error_model="numpy")
def omega_bound(x: np.ndarray, inv_mass: np.ndarray, bend_gersh: np.ndarray, rest: np.ndarray,
                tension: np.ndarray, tension_margin: float, contact_k: np.ndarray, fold: np.ndarray,
                parted: np.ndarray, local: bool = True) -> float:
    """Upper bound (rad/s) of the highest natural frequency at configuration x (m) with tensions (N)
    multiplied by ``tension_margin`` (tension can grow within a tick) and the contact springs ``contact_k``
    (N/m per vertex). Bending is stiffened by vertex_fold (``local``) or by the thread's most folded hinge (the
    whole-thread scaling). ``fold`` (n,) is scratch (hinge_factors); ``parted`` the segments that broke."""
    n = x.shape[0]
    worst = 0.0
    whole = hinge_factors(x, fold, parted)
    for i in range(n):
        # Gershgorin row sum (N/m): bending scaled by the fold factor, the tensions, the contact springs
        k = bend_gersh[i] * vertex_fold(fold, i, contact_k, local, whole) + contact_k[i]
        if i > 0:
            k += geometric_stiffness(tension[i - 1], rest[i - 1], tension_margin)
        if i < n - 1:
            k += geometric_stiffness(tension[i], rest[i], tension_margin)
        w2 = inv_mass[i] * k
        if w2 > worst:
            worst = w2
    return math.sqrt(worst)


def substeps_for(omega: float, tick: float, target: float, max_substeps: int) -> int:
    """Substeps so that h * omega <= target (dimensionless), capped at max_substeps."""
    if not math.isfinite(omega):
        return max_substeps
    return int(min(max(1, math.ceil(tick * omega / target)), max_substeps))


@njit(cache=True, error_model="numpy", inline="always")
def _counted(t: float, t_in: float, f: float, local: bool) -> float:
    """The tension (N) the scaling counts of a segment's t, whose inertial part is t_in, under a scale factor f
    at its ends: the inertial part divided by f (local), or all of it (whole-thread). The inertial part is taken
    within [0, t]: it is a first-order split, and in a fast cinch it overshot (1 N read of 0.24), which counted
    the rest as negative and left the vertex too light (docs/PHYSICS.md Sec. 6)."""
    if not local:
        return t / f
    part = min(max(t_in, 0.0), max(t, 0.0))
    return t - part + part / f


@njit(cache=True, error_model="numpy")
def scale_masses(mass: np.ndarray, inv_mass: np.ndarray, bend_gersh: np.ndarray, rest: np.ndarray,
                 tension: np.ndarray, tension_in: np.ndarray, tension_floor: np.ndarray, tension_margin: float,
                 h: float, target: float,
                 contact_k: np.ndarray, out: np.ndarray, x: np.ndarray, x_prev: np.ndarray,
                 keep_energy: bool, local: bool, fold: np.ndarray, parted: np.ndarray) -> tuple:
    """Selective mass scaling: the inverse masses (1/kg) for a substep h (s) such that every vertex's Gershgorin
    bound meets h * omega_i <= target. A vertex that already does keeps its mass; a stiffer one (a taut or
    sharply bent stretch of a light suture) gets just enough extra inertia, m_i' = h^2 K_i / target^2, with K_i
    from the bending row sum times its fold factor (vertex_fold), the contact springs ``contact_k``
    (N/m per vertex) and the geometric stiffness of the tensions (N; each segment's at least its
    ``tension_floor``, times ``tension_margin``). Kinematic vertices keep 0. Static forces are unchanged, so
    equilibria and their tensions are exact; only the dynamics of the scaled vertices slow down.

    ``out`` holds the inverse masses the tensions were computed with. Under scaled masses the inertial part of
    a tension (``tension_in``, constraints.inertial_tension) is inflated by the scale factor, so that part is
    divided by the larger factor at its segment's ends before it is used; without that the scaling would feed
    on itself. The rest (loads, couplings, contact) is counted in full: divided too, a knot's static 0.8 N read
    as nothing under a factor of 75,000, and the vertex's mass fell a thousandfold. Without ``local`` (the
    whole-thread scaling, as before 2026-11-27): every hinge is stiffened by the thread's most folded one and
    every tension is divided, inertial or not. With ``keep_energy``, a vertex made
    heavier has its history ``x_prev`` (m; positions ``x``) shortened so that its kinetic energy stays, not its
    velocity. ``fold`` (n,) is scratch (hinge_factors); ``parted`` the segments that broke. Returns (vertices
    scaled, largest factor)."""
    n = mass.shape[0]
    scaled = 0
    worst = 1.0
    lim = target * target / (h * h)
    whole = hinge_factors(x, fold, parted)
    f_left = 1.0                       # the old factor of vertex i-1 (out[i-1] is already overwritten)
    f_here = inv_mass[0] / out[0] if out[0] > 0.0 else 1.0
    for i in range(n):
        f_right = 1.0
        if i < n - 1:
            f_right = inv_mass[i + 1] / out[i + 1] if out[i + 1] > 0.0 else 1.0
        old = out[i]
        if inv_mass[i] == 0.0:
            out[i] = 0.0
        else:
            k = bend_gersh[i] * vertex_fold(fold, i, contact_k, local, whole) + contact_k[i]
            if i > 0:
                t = _counted(tension[i - 1], tension_in[i - 1], max(f_left, f_here), local)
                k += 2.0 * max(t, tension_floor[i - 1]) * tension_margin / rest[i - 1]
            if i < n - 1:
                t = _counted(tension[i], tension_in[i], max(f_here, f_right), local)
                k += 2.0 * max(t, tension_floor[i]) * tension_margin / rest[i]
            if k * inv_mass[i] > lim:
                m_new = k / lim
                out[i] = 1.0 / m_new
                scaled += 1
                f = m_new / mass[i]
                if f > worst:
                    worst = f
            else:
                out[i] = inv_mass[i]
            if keep_energy and old > 0.0 and out[i] < old:
                # the mass grew under a moving vertex: keep its kinetic energy, not its velocity (the velocity is
                # the position history, (x - x_prev) / h, so the history is shortened by sqrt(m / m')). Kept
                # velocity would give it (m' / m - 1) of its kinetic energy from nothing, and the masses follow
                # the tensions, which a swinging or vibrating thread modulates at twice its frequency: parametric
                # pumping (docs/PHYSICS.md Sec. 6). A vertex made lighter keeps its velocity and so loses energy:
                # no change of mass adds any.
                r = math.sqrt(out[i] / old)
                for d in range(3):
                    x_prev[i, d] = x[i, d] - r * (x[i, d] - x_prev[i, d])
        f_left = f_here
        f_here = f_right
    return scaled, worst
