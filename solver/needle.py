"""A rigid curved needle swaged to the thread's first vertex, driven by a stylus's full pose.

The needle is a circular arc of radius R and angle A. In its body frame the swage (where the thread is
crimped in) is the origin, the arc leaves it along +x and curves toward +y about the centre (0, R, 0):
    a(theta) = R (sin theta, 1 - cos theta, 0),   0 <= theta <= A,   the tip at theta = A.
A positive turn about the body z axis through the centre drives it tip first.

Position: the swage is the thread's vertex 0, which carries the needle's mass on top of its own; a stylus
holding the needle is a grasp on vertex 0 (integrator.py's implicit virtual coupling), so the force felt and
the thread's pull at the swage come out of the thread's own solve. The swage is the body's reference point, so
the thread's pull there exerts no torque on the needle.
Orientation: a quaternion q (body to world) tied to the stylus's orientation q_t by a rotational spring-damper,
integrated by backward Euler on the rotation-vector error (any stiffness is stable), with a torque limit; the
needle's inertia is a ring's, m R^2, about every axis (its coupling, not its inertia, sets how it moves).

The tissue acts on the needle at position level (as XPBD does for rigid bodies, Mueller et al. 2020): after
the thread's solve, a point of the needle that must move by d along n (out of a pad, or back onto a puncture it
is passing through) moves the swage by w_lin * lambda * n and turns the body by I^-1 (r x n) lambda, with
lambda = d / (w_lin + |r x n|^2 / I), w_lin the swage's effective inverse mass; the thread is then solved
again. The pad feels lambda n / h^2.

Punctures: when the tip enters a pad where it was outside at the substep's start, a puncture is made where
the tip's path crossed the surface; when it leaves a pad it entered, the exit is made the same way. The needle
then passes through them: each needle-held puncture sits at the arc angle closest to it, and the arc is kept
on it. When the swage has passed it (the closest angle < 0) it moves onto the thread (tissue.py); if the tip
backs out of it, it is gone. A thread-held puncture pulled back past the swage returns to the needle. Only
the tip makes punctures: nothing else of the needle, and nothing of the thread, can enter a pad elsewhere.

Units: SI; angles in radians.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .contact import closest_if_near, segment_closest, segment_move
from .tissue import (PD_HALF, PF_FORCE, PF_LOCAL, PF_OFF, PF_SIGMA, PF_SPEED, PI_MATE, PI_PAD, PI_STATE, PS_DX, PS_F, PS_X,
                     PUN_ACTIVE, PUN_FREE, PUN_NEEDLE, TP_F_KINETIC, TP_F_STATIC, TP_K_LAT, TP_MU, TP_RADIUS,
                     closest_on_thread, entry_face, face_friction, puncture_point)

# npar: the needle's parameters
NP_RADIUS = 0      # m, arc radius R
NP_ARC = 1         # rad, arc angle A
NP_MASS = 2        # kg
NP_INERTIA = 3     # kg*m^2, m R^2
NP_K_ROT = 4       # N*m/rad, the rotational coupling to the stylus (0: none)
NP_C_ROT = 5       # N*m*s/rad, its damper
NP_WIRE = 6        # m, the needle's wire radius
NP_MAX_TORQUE = 7  # N*m, the coupling's torque limit
NP_COUNT = 8

# nst: the needle's state
NS_Q = 0           # 4: orientation (w, x, y, z), body to world
NS_W = 4           # 3: angular velocity (rad/s, world)
NS_QT = 7          # 4: the stylus's orientation (the coupling's target)
NS_WT = 11         # 3: the stylus's angular velocity (rad/s; a live device's, across a tick)
NS_TORQUE = 14     # 3: the torque the coupling applied to the needle in the last substep (N*m); felt reversed
NS_Q0 = 17         # 4: orientation at the substep's start
NS_TIP0 = 21       # 3: the tip at the substep's start (m)
NS_COUNT = 24

N_SAMPLES = 13     # points along the arc tested against the pads (about 1 mm apart on a 12 mm needle)
POINT_TOL = 1e-7   # m, a needle point this close to where it must be is left alone
GRIP_AHEAD = 2e-3  # m: how far into its tunnel a puncture holds a needle no hand holds (_hold_tunnel)


@njit(cache=True, error_model="numpy")
def quat_mul(a0, a1, a2, a3, b0, b1, b2, b3):
    """The Hamilton product a b of quaternions (w, x, y, z)."""
    return (a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3,
            a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
            a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1,
            a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0)


@njit(cache=True, error_model="numpy")
def quat_rotate(q: np.ndarray, o: int, vx: float, vy: float, vz: float, inverse: bool = False):
    """Rotate v by the unit quaternion stored at q[o:o+4] (by its inverse with ``inverse``)."""
    w, x, y, z = q[o], q[o + 1], q[o + 2], q[o + 3]
    if inverse:
        x, y, z = -x, -y, -z
    # v + 2 w (u x v) + 2 u x (u x v), u = (x, y, z)
    cx = y * vz - z * vy
    cy = z * vx - x * vz
    cz = x * vy - y * vx
    return (vx + 2.0 * (w * cx + y * cz - z * cy),
            vy + 2.0 * (w * cy + z * cx - x * cz),
            vz + 2.0 * (w * cz + x * cy - y * cx))


@njit(cache=True, error_model="numpy")
def turn(q: np.ndarray, o: int, rx: float, ry: float, rz: float) -> None:
    """q[o:o+4] <- exp(r) q: turn by the rotation vector r (rad, world), renormalised."""
    ang = math.sqrt(rx * rx + ry * ry + rz * rz)
    if ang == 0.0:
        return
    s = math.sin(0.5 * ang) / ang
    w, x, y, z = quat_mul(math.cos(0.5 * ang), rx * s, ry * s, rz * s, q[o], q[o + 1], q[o + 2], q[o + 3])
    nrm = math.sqrt(w * w + x * x + y * y + z * z)
    q[o] = w / nrm
    q[o + 1] = x / nrm
    q[o + 2] = y / nrm
    q[o + 3] = z / nrm


@njit(cache=True, error_model="numpy")
def rotvec_between(q: np.ndarray, oa: int, ob: int):
    """The rotation vector r (rad, world) with exp(r) q_a = q_b: the turn from q[oa:] to q[ob:], the short way."""
    # q_b q_a^-1
    w, x, y, z = quat_mul(q[ob], q[ob + 1], q[ob + 2], q[ob + 3], q[oa], -q[oa + 1], -q[oa + 2], -q[oa + 3])
    if w < 0.0:
        w, x, y, z = -w, -x, -y, -z
    s = math.sqrt(x * x + y * y + z * z)
    if s < 1e-12:
        return 2.0 * x, 2.0 * y, 2.0 * z
    ang = 2.0 * math.atan2(s, w)
    return ang * x / s, ang * y / s, ang * z / s


@njit(cache=True, error_model="numpy")
def arc_point(x: np.ndarray, nst: np.ndarray, o: int, radius: float, theta: float):
    """The world point (m) of the needle at arc angle theta, with the swage at x[0] and orientation nst[o:]."""
    px, py, pz = quat_rotate(nst, o, radius * math.sin(theta), radius * (1.0 - math.cos(theta)), 0.0)
    return x[0, 0] + px, x[0, 1] + py, x[0, 2] + pz


@njit(cache=True, error_model="numpy")
def arc_angle(x: np.ndarray, nst: np.ndarray, radius: float, px: float, py: float, pz: float) -> float:
    """The angle (rad, in (-pi, pi]) of the point of the needle's whole circle closest to p."""
    # p in the body frame: q^-1 (p - swage); the angle about the centre (0, R, 0), 0 at the swage
    bx, by, _ = quat_rotate(nst, NS_Q, px - x[0, 0], py - x[0, 1], pz - x[0, 2], True)
    return math.atan2(bx, radius - by)


@njit(cache=True, error_model="numpy")
def needle_held(grasp_vertex: np.ndarray, grasp_k: np.ndarray) -> bool:
    """Whether a hand holds the needle: a grasp on its swage (vertex 0) that has not let go."""
    for g in range(grasp_vertex.shape[0]):
        if grasp_vertex[g] == 0 and grasp_k[g] > 0.0:
            return True
    return False


@njit(cache=True, error_model="numpy")
def needle_turn(h: float, npar: np.ndarray, nst: np.ndarray, x: np.ndarray, held: bool,
                gravity: np.ndarray) -> None:
    """Turn the needle over one substep h (s) under its rotational coupling (backward Euler on the error's
    rotation vector, torque-limited), or once no hand holds it (``held``) under its weight (``gravity``,
    m/s^2, _free_turn); remember the orientation and the tip at the substep's start."""
    for k in range(4):
        nst[NS_Q0 + k] = nst[NS_Q + k]
    tx, ty, tz = arc_point(x, nst, NS_Q, npar[NP_RADIUS], npar[NP_ARC])
    nst[NS_TIP0] = tx
    nst[NS_TIP0 + 1] = ty
    nst[NS_TIP0 + 2] = tz
    inertia = npar[NP_INERTIA]
    # a hand that let go no longer turns the needle: until 2026-11-27 the stylus's last orientation held a
    # released needle's, which then fell without turning and lay on a pad at the angle it was let go
    k = npar[NP_K_ROT] if held else 0.0
    c = npar[NP_C_ROT] if held else 0.0
    ex, ey, ez = rotvec_between(nst, NS_Q, NS_QT)
    # I (w1 - w0)/h = k (e - h w1 + h wt) + c (wt - w1), per component (the error e as a rotation vector)
    den = inertia + h * c + h * h * k
    tmag = 0.0
    for d in range(3):
        e = ex if d == 0 else (ey if d == 1 else ez)
        wt = nst[NS_WT + d]
        w1 = (inertia * nst[NS_W + d] + h * k * e + h * (c + h * k) * wt) / den
        tau = k * (e - h * w1 + h * wt) + c * (wt - w1)
        nst[NS_TORQUE + d] = tau
        tmag += tau * tau
    tmag = math.sqrt(tmag)
    if tmag > npar[NP_MAX_TORQUE]:
        # saturated: the coupling softened until its torque is at the limit, still implicit (an explicit
        # torque at the limit on a needle of ~1e-9 kg m^2 would spin it by radians in one substep)
        sc = npar[NP_MAX_TORQUE] / tmag
        k *= sc
        c *= sc
        den = inertia + h * c + h * h * k
    for d in range(3):
        e = ex if d == 0 else (ey if d == 1 else ez)
        wt = nst[NS_WT + d]
        w1 = (inertia * nst[NS_W + d] + h * k * e + h * (c + h * k) * wt) / den
        nst[NS_TORQUE + d] = k * (e - h * w1 + h * wt) + c * (wt - w1)
        nst[NS_W + d] = w1
    if not held:
        _free_turn(h, npar, nst, gravity)
    turn(nst, NS_Q, h * nst[NS_W], h * nst[NS_W + 1], h * nst[NS_W + 2])


@njit(cache=True, error_model="numpy")
def _free_turn(h: float, npar: np.ndarray, nst: np.ndarray, gravity: np.ndarray) -> None:
    """The turn of a needle no hand holds, over one substep h (s): its weight (``gravity``, m/s^2) acts at the
    arc's centroid, R ((1 - cos A)/A, 1 - sin A / A, 0) in the body frame, about the swage (the swage carries
    the needle's mass, so the weight there alone never turned it: a needle let go stood on whatever point it
    landed on, and spun on its swage), damped critically as a pendulum about the swage: nothing else in the
    model damps its swing (the thread's drag acts on the thread, not on the needle's turn). Backward Euler."""
    r = npar[NP_RADIUS]
    arc = npar[NP_ARC]
    inertia = npar[NP_INERTIA]
    mass = npar[NP_MASS]
    cx, cy, cz = quat_rotate(nst, NS_Q, r * (1.0 - math.cos(arc)) / arc, r * (1.0 - math.sin(arc) / arc), 0.0)
    tq0 = mass * (cy * gravity[2] - cz * gravity[1])
    tq1 = mass * (cz * gravity[0] - cx * gravity[2])
    tq2 = mass * (cx * gravity[1] - cy * gravity[0])
    g = math.sqrt(gravity[0] ** 2 + gravity[1] ** 2 + gravity[2] ** 2)
    arm = math.sqrt(cx * cx + cy * cy + cz * cz)
    # critical damping of the pendulum about the swage: c = 2 I omega_0, omega_0^2 = m g |c| / I
    damp = 2.0 * math.sqrt(inertia * mass * g * arm)
    for d in range(3):
        tq = tq0 if d == 0 else (tq1 if d == 1 else tq2)
        nst[NS_W + d] = (inertia * nst[NS_W + d] + h * tq) / (inertia + h * damp)


@njit(cache=True, error_model="numpy")
def _segment_box_entry(ax, ay, az, bx, by, bz, cx, cy, cz, hx, hy, hz):
    """Where the segment a -> b first meets the box (centre c, half extents h): (found, x, y, z)."""
    t0 = 0.0
    t1 = 1.0
    a = (ax - cx, ay - cy, az - cz)
    dd = (bx - ax, by - ay, bz - az)
    hh = (hx, hy, hz)
    for k in range(3):
        if abs(dd[k]) < 1e-300:
            if abs(a[k]) > hh[k]:
                return False, 0.0, 0.0, 0.0
            continue
        ta = (-hh[k] - a[k]) / dd[k]
        tb = (hh[k] - a[k]) / dd[k]
        if ta > tb:
            ta, tb = tb, ta
        t0 = max(t0, ta)
        t1 = min(t1, tb)
        if t0 > t1:
            return False, 0.0, 0.0, 0.0
    return True, ax + t0 * dd[0], ay + t0 * dd[1], az + t0 * dd[2]


@njit(cache=True, error_model="numpy")
def _inside(px, py, pz, pads, pst, p, grow):
    return (abs(px - pst[p, PS_X]) < pads[p, PD_HALF] + grow
            and abs(py - pst[p, PS_X + 1]) < pads[p, PD_HALF + 1] + grow
            and abs(pz - pst[p, PS_X + 2]) < pads[p, PD_HALF + 2] + grow)


@njit(cache=True, error_model="numpy")
def _open_entry(p, pun_i):
    """The needle-held puncture through which the tip is inside pad p (an entry without an exit), or -1."""
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] == PUN_NEEDLE and pun_i[q, PI_PAD] == p and pun_i[q, PI_MATE] < 0:
            return q
    return -1


@njit(cache=True, error_model="numpy")
def _new_puncture(pun_i, pun_f, p, px, py, pz, pst, theta, mate) -> int:
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] == PUN_FREE:
            pun_i[q, PI_STATE] = PUN_NEEDLE
            pun_i[q, PI_PAD] = p
            pun_i[q, PI_MATE] = mate
            if mate >= 0:
                pun_i[mate, PI_MATE] = q
            pun_f[q, PF_LOCAL] = px - pst[p, PS_X]
            pun_f[q, PF_LOCAL + 1] = py - pst[p, PS_X + 1]
            pun_f[q, PF_LOCAL + 2] = pz - pst[p, PS_X + 2]
            pun_f[q, PF_SIGMA] = theta
            pun_f[q, PF_SPEED] = 0.0
            return q
    return -1   # no slot left: the tip is then held out like any other point


@njit(cache=True, error_model="numpy")
def _near_hole(cx, cy, cz, p, pst, pun_i, pun_f, dist) -> bool:
    """Whether a needle-held puncture of pad p lies within ``dist`` (m) of c."""
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] == PUN_NEEDLE and pun_i[q, PI_PAD] == p:
            hx, hy, hz = puncture_point(q, pst, pun_i, pun_f)
            if (hx - cx) ** 2 + (hy - cy) ** 2 + (hz - cz) ** 2 < dist * dist:
                return True
    return False


@njit(cache=True, error_model="numpy")
def needle_pierce(x: np.ndarray, npar: np.ndarray, nst: np.ndarray, pads: np.ndarray, pst: np.ndarray,
                  pun_i: np.ndarray, pun_f: np.ndarray, held: bool) -> int:
    """Make the punctures the tip made this substep (from its start NS_TIP0 to where it is now): an entry where
    it went into a pad, if a hand holds the needle (``held``), an exit where it came out of one it had entered.
    Returns how many were made."""
    made = 0
    r = npar[NP_RADIUS]
    arc = npar[NP_ARC]
    tx, ty, tz = arc_point(x, nst, NS_Q, r, arc)
    sx, sy, sz = nst[NS_TIP0], nst[NS_TIP0 + 1], nst[NS_TIP0 + 2]
    for p in range(pads.shape[0]):
        was = _inside(sx, sy, sz, pads, pst, p, 0.0)
        now = _inside(tx, ty, tz, pads, pst, p, 0.0)
        entry = _open_entry(p, pun_i)
        # a needle let go does not pierce: it falls with its weight (0.3 mN for 30 mg), where a bite takes a
        # driven tip; its tip is held out of the pads as the rest of it is (needle_constraints)
        if not was and now and entry < 0 and held:
            ok, cx, cy, cz = _segment_box_entry(sx, sy, sz, tx, ty, tz, pst[p, PS_X], pst[p, PS_X + 1],
                                                pst[p, PS_X + 2], pads[p, PD_HALF], pads[p, PD_HALF + 1],
                                                pads[p, PD_HALF + 2])
            # a tip that just came out and slips back in goes through the hole it made, not a new one
            if ok and not _near_hole(cx, cy, cz, p, pst, pun_i, pun_f, 4.0 * npar[NP_WIRE]) and _new_puncture(
                    pun_i, pun_f, p, cx, cy, cz, pst, arc, -1) >= 0:
                made += 1
        elif was and not now and entry >= 0:
            # the way out: the first box point met walking back from the tip's end. A tip that backs out through
            # the hole it went in by makes no exit there: a tip just in, pushed back over the face within a
            # tick, made an exit at its own entry, and the needle, read as through the edge, missed the bite
            ok, cx, cy, cz = _segment_box_entry(tx, ty, tz, sx, sy, sz, pst[p, PS_X], pst[p, PS_X + 1],
                                                pst[p, PS_X + 2], pads[p, PD_HALF], pads[p, PD_HALF + 1],
                                                pads[p, PD_HALF + 2])
            if ok and not _near_hole(cx, cy, cz, p, pst, pun_i, pun_f, 4.0 * npar[NP_WIRE]) and _new_puncture(
                    pun_i, pun_f, p, cx, cy, cz, pst, arc, entry) >= 0:
                made += 1
    return made


@njit(cache=True, error_model="numpy")
def _pass_end(q: int, pun_i: np.ndarray, pun_f: np.ndarray, arc: float) -> float:
    """The arc angle (rad) at which the pass through needle-held puncture q ends: its mate's, if the needle
    still runs through it; beyond the tip (arc + 1) while it has none; before the swage (-1) once the thread
    runs through the mate."""
    mate = pun_i[q, PI_MATE]
    if mate < 0:
        return arc + 1.0
    if pun_i[mate, PI_STATE] == PUN_NEEDLE:
        return pun_f[mate, PF_SIGMA]
    return -1.0


@njit(cache=True, error_model="numpy")
def _needle_tunnel(theta: float, p: int, pun_i: np.ndarray, pun_f: np.ndarray, arc: float, ext: float,
                   near: float) -> bool:
    """Whether the needle's point at angle theta lies in a pass through pad p (between its needle-held
    puncture and the other end: the tip if the pass has no exit yet, the swage if it is on the thread), or
    is within ``near`` (rad) of the swage while the thread's first segment runs through a puncture of p (the
    swage has just come out of it; the needle's hold on it is compliant, so it may lag a little inside)."""
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] == PUN_ACTIVE and pun_i[q, PI_PAD] == p and pun_f[q, PF_SIGMA] < 1.0:
            if theta < near:
                return True
            continue
        if pun_i[q, PI_STATE] == PUN_ACTIVE and pun_i[q, PI_PAD] == p:
            # the thread runs in through q to the swage inside the pad, and the pass has lost its exit (the
            # needle, levered or drawn back, took its tip back out of it): the needle lies in that blind pass,
            # from the swage to the tip
            mate = pun_i[q, PI_MATE]
            if (mate < 0 or pun_i[mate, PI_STATE] == PUN_FREE) and theta < arc + ext:
                return True
            continue
        if pun_i[q, PI_STATE] != PUN_NEEDLE or pun_i[q, PI_PAD] != p:
            continue
        a = pun_f[q, PF_SIGMA]
        b = _pass_end(q, pun_i, pun_f, arc)
        if min(a, b) - ext < theta < max(a, b) + ext:
            return True
    return False


@njit(cache=True, error_model="numpy")
def _arm(xbar: np.ndarray, px: float, py: float, pz: float, nx: float, ny: float, nz: float):
    """r x n for the needle's point p (arm r from the swage xbar[0]) and unit direction n: the turn a push
    along n at p makes; |r x n|^2 / I is what the turn adds to the swage's inverse mass there."""
    rx = px - xbar[0, 0]
    ry = py - xbar[0, 1]
    rz = pz - xbar[0, 2]
    return ry * nz - rz * ny, rz * nx - rx * nz, rx * ny - ry * nx


@njit(cache=True, error_model="numpy")
def _push(h, x, xbar, w_eff, npar, nst, theta, dx, dy, dz, pst, p, compliance, tol=POINT_TOL) -> float:
    """Move the needle's point at angle theta toward d (m), sharing the move between the swage's translation
    and the body's turn by their inverse masses, less by the ``compliance`` (m/N) of what holds it (one XPBD
    step from zero each round, Macklin et al. 2016: lambda = d / (w + compliance / h^2): a soft hold that
    the rounds do not stiffen); the pad p (if >= 0) feels the reaction. Returns lambda (N*s^2; its force is
    lambda / h^2 along d), 0 if it did not move (d <= tol, m)."""
    d = math.sqrt(dx * dx + dy * dy + dz * dz)
    if d <= tol:
        return 0.0
    nx = dx / d
    ny = dy / d
    nz = dz / d
    px, py, pz = arc_point(xbar, nst, NS_Q, npar[NP_RADIUS], theta)
    cx, cy, cz = _arm(xbar, px, py, pz, nx, ny, nz)
    inertia = npar[NP_INERTIA]
    w_lin = w_eff[0]
    lam = d / (w_lin + (cx * cx + cy * cy + cz * cz) / inertia + compliance / (h * h))
    xbar[0, 0] += w_lin * lam * nx
    xbar[0, 1] += w_lin * lam * ny
    xbar[0, 2] += w_lin * lam * nz
    turn(nst, NS_Q, cx * lam / inertia, cy * lam / inertia, cz * lam / inertia)
    if p >= 0:
        f = lam / (h * h)
        pst[p, PS_F] -= f * nx
        pst[p, PS_F + 1] -= f * ny
        pst[p, PS_F + 2] -= f * nz
    return lam


@njit(cache=True, error_model="numpy")
def _edge_end(pads, pst, p, d, sa, sb, q, end):
    """Coordinate q (m) of an end (``end`` -1 or 1) of pad p's edge along axis d at the corner (sa, sb) of the
    other two axes, taken in order after d."""
    c = pst[p, PS_X + q]
    half = pads[p, PD_HALF + q]
    if q == d:
        return c + end * half
    return c + (sa if q == (d + 1) % 3 else sb) * half


@njit(cache=True, error_model="numpy")
def _hold_out(h, x, xbar, w_eff, npar, nst, tpar, pads, pst, pun_i, pun_f, p, th, near, free) -> bool:
    """Put the needle's point at angle th (rad) out of pad p (inflated by the wire's radius) if it is inside and
    outside its passes. A ``free`` needle (no hand holds it) goes out through the face the point came through,
    the axis it was furthest outside along at the substep's start (against the pad's start centre), as the
    thread's vertices do (tissue.collide_pads), or if it was inside then too the face it is least deep behind,
    with Coulomb friction on the face; every push is made, however small. A held needle goes out through the
    face it is least deep behind, frictionless, by pushes over POINT_TOL: the rules the needle-tie script was
    tuned with (docs/PHYSICS.md Sec. 9). Returns whether it was moved by more than POINT_TOL."""
    r = npar[NP_RADIUS]
    arc = npar[NP_ARC]
    grow = npar[NP_WIRE]
    ext = (npar[NP_WIRE] + tpar[TP_RADIUS]) / r
    sx, sy, sz = arc_point(xbar, nst, NS_Q, r, th)
    if not _inside(sx, sy, sz, pads, pst, p, grow) or _needle_tunnel(th, p, pun_i, pun_f, arc, ext, near):
        return False
    bx, by, bz = arc_point(x, nst, NS_Q0, r, th)
    rx = sx - pst[p, PS_X]
    ry = sy - pst[p, PS_X + 1]
    rz = sz - pst[p, PS_X + 2]
    ax, side = entry_face(bx - (pst[p, PS_X] - pst[p, PS_DX]), by - (pst[p, PS_X + 1] - pst[p, PS_DX + 1]),
                          bz - (pst[p, PS_X + 2] - pst[p, PS_DX + 2]), rx, ry, rz, pads, p, grow, free)
    now = rx if ax == 0 else (ry if ax == 1 else rz)
    half = pads[p, PD_HALF + ax] + grow
    best = half - abs(now) if side * now >= 0.0 else half + abs(now)
    sgn = best if side >= 0.0 else -best
    # a free needle's every push is made, however small: one at rest sinks g h^2 a substep (1e-8 m at 32
    # substeps), and left in until it passed POINT_TOL it slid freely, frictionless, in the substeps between
    if 0.0 == _push(h, x, xbar, w_eff, npar, nst, th, sgn if ax == 0 else 0.0, sgn if ax == 1 else 0.0,
                 sgn if ax == 2 else 0.0, pst, p, 0.0, 0.0 if free else POINT_TOL):
        return False
    if not free:
        return True
    # Coulomb friction on the face, as the thread has: the point's slip over the substep relative to the pad
    # shrinks by mu times the push. Frictionless, a needle laid on a pad and let go slid off it under its
    # thread's pull
    ex, ey, ez = arc_point(xbar, nst, NS_Q, r, th)
    slip = (ex - bx - pst[p, PS_DX], ey - by - pst[p, PS_DX + 1], ez - bz - pst[p, PS_DX + 2])
    a0 = (ax + 1) % 3
    a1 = (ax + 2) % 3
    c0, c1 = face_friction(slip[a0], slip[a1], tpar[TP_MU], best)
    _push(h, x, xbar, w_eff, npar, nst, th, c0 if a0 == 0 else (c1 if a1 == 0 else 0.0),
          c0 if a0 == 1 else (c1 if a1 == 1 else 0.0), c0 if a0 == 2 else (c1 if a1 == 2 else 0.0), pst, p, 0.0,
          0.0)
    return best > POINT_TOL


@njit(cache=True, error_model="numpy", inline="always")
def _circle_clear(xbar, nst, r, pads, pst, p, grow) -> bool:
    """Whether the needle's whole circle (radius r, m) is clear of pad p inflated by ``grow`` (m): every point of
    the arc and of its chords lies within r of the circle's centre, so none of them is inside the pad if the
    centre is further than r from it (with 1e-6 of r to spare for a quaternion's round-off). Lets
    needle_constraints skip the ~75 arc points it would otherwise place against a pad the needle is nowhere
    near (15 of a 310 us tick went to the needle against the pads in the suture's held knot, 8 since)."""
    # the centre: the body frame's (0, r, 0) from the swage (arc_point)
    ox, oy, oz = quat_rotate(nst, NS_Q, 0.0, r, 0.0)
    cx = xbar[0, 0] + ox
    cy = xbar[0, 1] + oy
    cz = xbar[0, 2] + oz
    dx = max(abs(cx - pst[p, PS_X]) - (pads[p, PD_HALF] + grow), 0.0)
    dy = max(abs(cy - pst[p, PS_X + 1]) - (pads[p, PD_HALF + 1] + grow), 0.0)
    dz = max(abs(cz - pst[p, PS_X + 2]) - (pads[p, PD_HALF + 2] + grow), 0.0)
    reach = r * (1.0 + 1e-6)
    return dx * dx + dy * dy + dz * dz > reach * reach


@njit(cache=True, error_model="numpy")
def _grip(h, xbar, w_eff, npar, nst, tpar, th_g, th, px, py, pz) -> float:
    """The arc angle (rad) at which a puncture holds a needle no hand holds: where it held it the round before,
    ``th_g``, while the pull along the arc that keeps it there is within the puncture's breakaway drag
    (TP_F_STATIC, N); beyond it the arc slides through, held back by the Coulomb drag (TP_F_KINETIC). ``th``:
    the arc's point nearest the puncture (p, m). The pull is the XPBD force of the move along the arc's tangent
    t at th_g, d_t / (w_t h^2 + compliance) (Macklin et al. 2016), w_t the needle's inverse mass along t there.
    A driven needle slides freely through its punctures (the hand's coupling is what holds it)."""
    r = npar[NP_RADIUS]
    if th_g < 0.0 or th_g > npar[NP_ARC]:
        return th
    gx, gy, gz = arc_point(xbar, nst, NS_Q, r, th_g)
    tx, ty, tz = quat_rotate(nst, NS_Q, math.cos(th_g), math.sin(th_g), 0.0)     # d/dtheta of the arc, / r
    d_t = (px - gx) * tx + (py - gy) * ty + (pz - gz) * tz
    cx, cy, cz = _arm(xbar, gx, gy, gz, tx, ty, tz)
    soft = w_eff[0] * h * h + (cx * cx + cy * cy + cz * cz) / npar[NP_INERTIA] * h * h + 1.0 / tpar[TP_K_LAT]
    if abs(d_t) <= tpar[TP_F_STATIC] * soft:
        return th_g
    # sliding: the arc passes through until what is left of the move pulls with the kinetic drag
    keep = tpar[TP_F_KINETIC] * soft
    return th_g + (abs(d_t) - keep) / r * (1.0 if d_t > 0.0 else -1.0)


@njit(cache=True, error_model="numpy")
def _hold_tunnel(h, x, xbar, w_eff, npar, nst, tpar, pst, pun_i, pun_f, q, p, th) -> bool:
    """The tunnel behind puncture q holds a needle no hand holds in its direction through the tissue: the arc's
    point GRIP_AHEAD (m) from the puncture along the pass (toward its mate, or the tip while it has none) is kept
    where it was relative to pad p when the hand let go (PF_OFF), through the same lateral spring. The
    punctures alone hold the arc at points, and a circle through two of them turns freely about their chord."""
    r = npar[NP_RADIUS]
    ahead = 1.0 if _pass_end(q, pun_i, pun_f, npar[NP_ARC]) > th else -1.0
    tha = th + ahead * GRIP_AHEAD / r
    gx, gy, gz = arc_point(xbar, nst, NS_Q, r, tha)
    if pun_f[q, PF_OFF] == 0.0 and pun_f[q, PF_OFF + 1] == 0.0 and pun_f[q, PF_OFF + 2] == 0.0:
        pun_f[q, PF_OFF] = gx - pst[p, PS_X]
        pun_f[q, PF_OFF + 1] = gy - pst[p, PS_X + 1]
        pun_f[q, PF_OFF + 2] = gz - pst[p, PS_X + 2]
        return False
    return _push(h, x, xbar, w_eff, npar, nst, tha, pst[p, PS_X] + pun_f[q, PF_OFF] - gx,
                 pst[p, PS_X + 1] + pun_f[q, PF_OFF + 1] - gy, pst[p, PS_X + 2] + pun_f[q, PF_OFF + 2] - gz, pst, p,
                 1.0 / tpar[TP_K_LAT]) > 0.0


@njit(cache=True, error_model="numpy")
def needle_constraints(h: float, x: np.ndarray, xbar: np.ndarray, w_eff: np.ndarray, rest: np.ndarray,
                       npar: np.ndarray, nst: np.ndarray, tpar: np.ndarray, pads: np.ndarray, pst: np.ndarray,
                       pun_i: np.ndarray, pun_f: np.ndarray, held: bool, scratch: np.ndarray) -> int:
    """One round of the tissue's hold on the needle (after a solve of the thread, xbar): each needle-held
    puncture is moved onto the thread when the swage has passed it, dropped when the tip has backed out of it,
    and otherwise kept on the arc; then every sample point of the arc inside a pad, outside its passes, is put
    out through the face it came through, with Coulomb friction against it. The tip is held out too once no
    hand holds the needle (``held``), and each puncture then grips the arc where it holds it (_grip). Returns
    how many points were moved."""
    r = npar[NP_RADIUS]
    arc = npar[NP_ARC]
    m = xbar.shape[0] - 1
    moved = 0
    grow = npar[NP_WIRE]
    ext = (npar[NP_WIRE] + tpar[TP_RADIUS]) / r   # rad: a wire's thickness along the arc
    near = rest[0] / r                            # rad: the thread's first segment along the arc
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] != PUN_NEEDLE:
            continue
        p = pun_i[q, PI_PAD]
        px, py, pz = puncture_point(q, pst, pun_i, pun_f)
        th = arc_angle(xbar, nst, r, px, py, pz)
        if th < 0.0:
            # the swage went through: the thread now runs through the puncture
            sig, _ = closest_on_thread(xbar, px, py, pz, 0, min(3, m - 1))
            pun_i[q, PI_STATE] = PUN_ACTIVE
            pun_f[q, PF_SIGMA] = sig
            # the thread enters it at the speed the needle left it: sliding, not stuck (a stuck start would
            # make the drag's damper f_static / v_stick for a substep and jam the needle against the thread)
            pun_f[q, PF_SPEED] = r * math.sqrt(nst[NS_W] ** 2 + nst[NS_W + 1] ** 2 + nst[NS_W + 2] ** 2)
            continue
        if th > arc + ext:
            # the tip backed out of it: nothing runs through it any more
            mate = pun_i[q, PI_MATE]
            if mate >= 0:
                pun_i[mate, PI_MATE] = -1
            pun_i[q, PI_STATE] = PUN_FREE
            pun_i[q, PI_MATE] = -1
            continue
        if held:
            for d in range(3):
                pun_f[q, PF_OFF + d] = 0.0        # the tunnel's hold is taken afresh when the hand lets go
        else:
            th_g = pun_f[q, PF_SIGMA]
            th = _grip(h, xbar, w_eff, npar, nst, tpar, th_g, th, px, py, pz)
            if th != th_g:
                for d in range(3):
                    pun_f[q, PF_OFF + d] = 0.0    # sliding through: the tunnel holds it where it stops
        pun_f[q, PF_SIGMA] = th
        ax, ay, az = arc_point(xbar, nst, NS_Q, r, th)
        # the tissue round a puncture gives like the thread's lateral spring: two pads that moved apart can
        # hold a rigid needle through three or four punctures no longer on one circle
        lam = _push(h, x, xbar, w_eff, npar, nst, th, px - ax, py - ay, pz - az, pst, p, 1.0 / tpar[TP_K_LAT])
        if lam > 0.0:
            moved += 1
            # the push is across the arc (th is its point nearest the puncture): the needle's lateral load on
            # the tissue there, summed over the rounds as the substep's force (needle_forces_clear starts it)
            dl = math.sqrt((px - ax) ** 2 + (py - ay) ** 2 + (pz - az) ** 2)
            f = lam / (h * h * dl)
            pun_f[q, PF_FORCE] += f * (px - ax)
            pun_f[q, PF_FORCE + 1] += f * (py - ay)
            pun_f[q, PF_FORCE + 2] += f * (pz - az)
        if not held and _hold_tunnel(h, x, xbar, w_eff, npar, nst, tpar, pst, pun_i, pun_f, q, p, th):
            moved += 1
    for p in range(pads.shape[0]):
        if _circle_clear(xbar, nst, r, pads, pst, p, grow):
            continue
        # the tip of a held needle is not held out: it pierces what it meets (needle_pierce)
        top = arc - ext if held else arc
        for k in range(N_SAMPLES - 1 if held else N_SAMPLES):
            if _hold_out(h, x, xbar, w_eff, npar, nst, tpar, pads, pst, pun_i, pun_f, p,
                         min(arc * k / (N_SAMPLES - 1), top), near, not held):
                moved += 1
        if held:
            continue
        # between the samples, the arc's points nearest the pad's edges: a needle let go across an edge (it slid
        # off a pad's side, hanging on its thread) otherwise sank onto it between two samples, up to 1 mm deep
        hx = pads[p, PD_HALF] + grow
        hy = pads[p, PD_HALF + 1] + grow
        hz = pads[p, PD_HALF + 2] + grow
        for c in range(N_SAMPLES - 1):
            ta = arc * c / (N_SAMPLES - 1)
            tb = min(arc * (c + 1) / (N_SAMPLES - 1), top)
            if tb <= ta:
                continue
            ax_, ay_, az_ = arc_point(xbar, nst, NS_Q, r, ta)
            bx_, by_, bz_ = arc_point(xbar, nst, NS_Q, r, tb)
            # the chord (its sagitta is under 0.1 mm for 13 samples) against the box, inflated: most chords are
            # far from every pad
            cx0 = pst[p, PS_X]
            cy0 = pst[p, PS_X + 1]
            cz0 = pst[p, PS_X + 2]
            if (min(ax_, bx_) > cx0 + hx or max(ax_, bx_) < cx0 - hx or min(ay_, by_) > cy0 + hy
                    or max(ay_, by_) < cy0 - hy or min(az_, bz_) > cz0 + hz or max(az_, bz_) < cz0 - hz):
                continue
            for e in range(12):
                # edge e runs along axis e // 4, at the corners (+-, +-) of the other two (the plain box's)
                d = e // 4
                sa = 1.0 if e % 2 == 0 else -1.0
                sb = 1.0 if (e // 2) % 2 == 0 else -1.0
                e0x = _edge_end(pads, pst, p, d, sa, sb, 0, -1.0)
                e0y = _edge_end(pads, pst, p, d, sa, sb, 1, -1.0)
                e0z = _edge_end(pads, pst, p, d, sa, sb, 2, -1.0)
                e1x = _edge_end(pads, pst, p, d, sa, sb, 0, 1.0)
                e1y = _edge_end(pads, pst, p, d, sa, sb, 1, 1.0)
                e1z = _edge_end(pads, pst, p, d, sa, sb, 2, 1.0)
                segment_closest(ax_, ay_, az_, bx_, by_, bz_, e0x, e0y, e0z, e1x, e1y, e1z, scratch)
                if scratch[2] >= grow * grow * 4.0:
                    continue
                th = ta + scratch[0] * (tb - ta)
                if _hold_out(h, x, xbar, w_eff, npar, nst, tpar, pads, pst, pun_i, pun_f, p, th, near, True):
                    moved += 1
    return moved


@njit(cache=True, error_model="numpy")
def needle_forces_clear(pun_i: np.ndarray, pun_f: np.ndarray) -> None:
    """Before a substep's tissue rounds: the lateral force of each needle-held puncture (PF_FORCE, N) from zero,
    for needle_constraints to sum."""
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] == PUN_NEEDLE:
            for d in range(3):
                pun_f[q, PF_FORCE + d] = 0.0


THREAD_SKIP = 2     # thread segments from the swage that are not tested against the arc: they leave the swage


@njit(cache=True, error_model="numpy")
def _needle_move(h: float, x: np.ndarray, xbar: np.ndarray, nst: np.ndarray, r: float) -> float:
    """A bound on how far any point of the needle moved this substep (m): the swage's move from x to xbar plus
    the turn's at the radius r."""
    return (math.sqrt((xbar[0, 0] - x[0, 0]) ** 2 + (xbar[0, 1] - x[0, 1]) ** 2 + (xbar[0, 2] - x[0, 2]) ** 2)
            + r * math.sqrt(nst[NS_W] ** 2 + nst[NS_W + 1] ** 2 + nst[NS_W + 2] ** 2) * h)


@njit(cache=True, error_model="numpy")
def needle_thread(h: float, x: np.ndarray, xbar: np.ndarray, w_eff: np.ndarray, npar: np.ndarray, nst: np.ndarray,
                  tpar: np.ndarray, pst: np.ndarray, scratch: np.ndarray) -> int:
    """One round of the needle against its own thread (after a solve, xbar): every thread segment (but the
    first THREAD_SKIP, which leave the swage) closer than the needle's wire radius plus the thread's radius to a
    chord of the arc (N_SAMPLES - 1 chords) is pushed apart from it, the move shared between the segment's two
    vertices and the needle (swage and turn) by inverse mass, as `_push` shares a pad's. The gap is measured
    along the normal between the two at the substep's start, at the closest points of then (x and the start
    pose NS_Q0), as the self-contact floor does: a segment that would pass through the wire within one
    substep shows a negative gap on the side it came from and is put back there. ``scratch`` (>= 3). Returns
    how many pairs were pushed."""
    r = npar[NP_RADIUS]
    arc = npar[NP_ARC]
    touch = npar[NP_WIRE] + tpar[TP_RADIUS]
    inertia = npar[NP_INERTIA]
    m = x.shape[0] - 1
    pushed = 0
    # the arc lies on the circle of radius R round its centre (body (0, R, 0)); a segment whose middle is
    # further than its half length, the contact distance and its move this substep off that circle, at the
    # start, cannot touch the wire: most of the thread is skipped here
    ox, oy, oz = quat_rotate(nst, NS_Q0, 0.0, r, 0.0)
    cx0 = x[0, 0] + ox
    cy0 = x[0, 1] + oy
    cz0 = x[0, 2] + oz
    needle_move = _needle_move(h, x, xbar, nst, r)   # again after each push below, which moves the swage
    for j in range(THREAD_SKIP, m):
        if w_eff[j] == 0.0 and w_eff[j + 1] == 0.0:
            continue
        lj = math.sqrt((x[j + 1, 0] - x[j, 0]) ** 2 + (x[j + 1, 1] - x[j, 1]) ** 2 + (x[j + 1, 2] - x[j, 2]) ** 2)
        dmove = max(segment_move(x, xbar, j), needle_move)
        slack = 0.5 * lj + touch + 2.0 * dmove
        dc = math.sqrt((0.5 * (x[j, 0] + x[j + 1, 0]) - cx0) ** 2 + (0.5 * (x[j, 1] + x[j + 1, 1]) - cy0) ** 2
                       + (0.5 * (x[j, 2] + x[j + 1, 2]) - cz0) ** 2)
        if abs(dc - r) > slack:
            continue
        # the chords' ends at the start pose: a chord's far end is the next one's near end (x and NS_Q0 stay
        # as they are through the pushes), so each is computed once
        a1x, a1y, a1z = arc_point(x, nst, NS_Q0, r, 0.0)
        for k in range(N_SAMPLES - 1):
            t0 = arc * k / (N_SAMPLES - 1)
            t1 = arc * (k + 1) / (N_SAMPLES - 1)
            a0x, a0y, a0z = a1x, a1y, a1z
            a1x, a1y, a1z = arc_point(x, nst, NS_Q0, r, t1)
            # quick reject on the start geometry: midpoints further apart than both half lengths and the margin
            reach = slack + 0.5 * math.sqrt((a1x - a0x) ** 2 + (a1y - a0y) ** 2 + (a1z - a0z) ** 2)
            if not closest_if_near(x, j, a0x, a0y, a0z, a1x, a1y, a1z, reach, scratch):
                continue
            sj = scratch[0]
            tk = scratch[1]
            d0 = math.sqrt(scratch[2])
            if d0 < 1e-12:
                continue   # the centre lines met at the start: no side to keep (not reached from a healthy start)
            nx = (x[j, 0] + sj * (x[j + 1, 0] - x[j, 0]) - (a0x + tk * (a1x - a0x))) / d0
            ny = (x[j, 1] + sj * (x[j + 1, 1] - x[j, 1]) - (a0y + tk * (a1y - a0y))) / d0
            nz = (x[j, 2] + sj * (x[j + 1, 2] - x[j, 2]) - (a0z + tk * (a1z - a0z))) / d0
            # the same points now (xbar, the current pose)
            theta = t0 + tk * (t1 - t0)
            b0x, b0y, b0z = arc_point(xbar, nst, NS_Q, r, t0)
            b1x, b1y, b1z = arc_point(xbar, nst, NS_Q, r, t1)
            qx = b0x + tk * (b1x - b0x)
            qy = b0y + tk * (b1y - b0y)
            qz = b0z + tk * (b1z - b0z)
            gap = (nx * (xbar[j, 0] + sj * (xbar[j + 1, 0] - xbar[j, 0]) - qx)
                   + ny * (xbar[j, 1] + sj * (xbar[j + 1, 1] - xbar[j, 1]) - qy)
                   + nz * (xbar[j, 2] + sj * (xbar[j + 1, 2] - xbar[j, 2]) - qz))
            if gap >= touch - POINT_TOL:
                continue
            # the needle's effective inverse mass at the point along n: the swage's and the turn's
            cx, cy, cz = _arm(xbar, qx, qy, qz, nx, ny, nz)
            w_needle = w_eff[0] + (cx * cx + cy * cy + cz * cz) / inertia
            w_thread = (1.0 - sj) * (1.0 - sj) * w_eff[j] + sj * sj * w_eff[j + 1]
            if w_needle + w_thread <= 0.0:
                continue
            lam = (touch - gap) / (w_needle + w_thread)
            for d, nd in enumerate((nx, ny, nz)):
                xbar[j, d] += w_eff[j] * (1.0 - sj) * lam * nd
                xbar[j + 1, d] += w_eff[j + 1] * sj * lam * nd
            # the needle's share, the other way: `_push` moves its point by w_needle * lam along -n
            _push(h, x, xbar, w_eff, npar, nst, theta, -w_needle * lam * nx, -w_needle * lam * ny,
                  -w_needle * lam * nz, pst, -1, 0.0)
            needle_move = _needle_move(h, x, xbar, nst, r)
            pushed += 1
    return pushed


@njit(cache=True, error_model="numpy")
def needle_finish(h: float, nst: np.ndarray) -> None:
    """The needle's angular velocity over the substep, from its turn (the tissue's pushes included)."""
    rx, ry, rz = rotvec_between(nst, NS_Q0, NS_Q)
    nst[NS_W] = rx / h
    nst[NS_W + 1] = ry / h
    nst[NS_W + 2] = rz / h


@njit(cache=True, error_model="numpy")
def needle_inside(x: np.ndarray, rest: np.ndarray, npar: np.ndarray, nst: np.ndarray, tpar: np.ndarray,
                  pads: np.ndarray, pst: np.ndarray, pun_i: np.ndarray, pun_f: np.ndarray, margin: float,
                  samples: int) -> int:
    """Points of the needle (``samples`` along the arc, the tip excluded) inside a pad shrunk by ``margin``
    (m) and outside its passes: the tests' check that the needle enters tissue only through punctures."""
    r = npar[NP_RADIUS]
    arc = npar[NP_ARC]
    ext = (npar[NP_WIRE] + tpar[TP_RADIUS]) / r
    n_in = 0
    for p in range(pads.shape[0]):
        for k in range(samples):
            th = arc * k / samples
            sx, sy, sz = arc_point(x, nst, NS_Q, r, th)
            if _inside(sx, sy, sz, pads, pst, p, -margin) and not _needle_tunnel(th, p, pun_i, pun_f, arc, ext,
                                                                                  rest[0] / r):
                n_in += 1
    return n_in
