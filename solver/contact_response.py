"""Self-contact response inside a substep: continuous penalty force, Coulomb friction and a no-crossing floor.

Per substep, on the candidate pairs of the neighbour list (solver/contact.py, rebuilt by the integrator when
any vertex has moved more than half the list's skin since it was built):

1. **Continuous penalty force** (Wang 2017 Sec. 6.2, Eq. 14 and App. E.7, after Tang et al. 2012): the penalty
   k_s phi(d - g) along the pair's normal, averaged by the trapezoidal rule over the substep, with the gap g
   at its start and at the free-flight prediction 2 x^k - x^{k-1} of its end. The closest-point parameters
   (s, t) and the normal n are frozen at the start (App. E's w_c^app, n_E^app: for a 1 ms tick they barely
   move). The average makes the force start to act before the pair touches when it approaches fast, which is
   what keeps it from jittering. Printed E.7 lacks the k_s of E.5; it is restored here. phi is Wang's linear
   penalty with its kink at first touch rounded into a parabola over the first ``smooth`` metres
   (phi = p^2 / (2 delta) for p < delta, p - delta / 2 beyond), so the force is C^1 in the penetration: a
   stylus dragging one strand over another feels no step (the haptic signal must not buzz).
2. **Coulomb friction**, static and kinetic, at the position level (as Macklin et al. 2014 do for particles):
   the relative tangential slip Delta_t of the two contact points over the substep would be stopped by a force
   |Delta_t| / (W h^2), W the pair's effective inverse mass. If that is within mu_s f_n the pair sticks (the
   slip is removed, split by inverse mass); otherwise it slides and the force mu_k f_n opposes the slip. f_n
   is the penalty force plus the floor's force of the substep before; with ``polygon_friction`` on (the
   default) it is scaled by ``polygon_gain`` for the strands' turn at the pair: a polyline wrapped round a
   strand is pressed at the middles of its chords and loses part of a rope's capstan gain (docs/PHYSICS.md
   Sec. 7). It acts before the constraint solve and again after each solve, whose displacement along the
   edges is itself sliding along the strands (a strand drawn round another would otherwise slip through the
   constraints); the total it makes per substep is tracked, so it is applied once, not once per round. With
   ``CP_WARM`` a pair starts each substep with its friction force of the substep before (warm_friction), so a
   held knot's rounds settle in one or two instead of running out.
3. **The no-crossing floor** (continuous collision over the substep): after the constraint solve, each pair's
   gap at the end of the substep is measured along the normal frozen at its start, at the start's (s, t). A
   gap below ``min_gap`` is projected back to ``min_gap`` (an inelastic contact impulse, split by inverse mass
   and barycentric weight), and the inextensibility constraints are solved again; a few rounds of both meet
   them together. Because the normal is frozen at the start of the substep, a strand that would pass through
   the other within one substep (0.5 mm per tick at 0.5 m/s, more than a suture's diameter) shows a negative
   gap, not a healthy one on the far side, and is stopped.

Every kernel works on flat arrays and writes explicit outputs; units are SI (m, N, s).
Parameter vector ``cpar`` (float64): see the CP_* indices below.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .contact import find_contacts, segment_closest, tangential
from .forces import hinge_cos

CP_STIFFNESS = 0    # k_s, N/m (Wang 2017 Eq. 14)
CP_DISTANCE = 1     # Delta d, m: centre-line distance at which strands touch (twice the contact radius)
CP_SMOOTH = 2       # delta, m: width of the rounded onset of the penalty
CP_MIN_GAP = 3      # m: the floor below which the gap is projected back
CP_MU_S = 4         # static friction coefficient
CP_MU_K = 5         # kinetic friction coefficient
CP_SKIN = 6         # m: the neighbour list holds pairs closer than Delta d + skin
CP_RECOVER = 7      # m/s: how fast the floor may push apart a pair that started the substep below it
CP_ROUNDS = 8       # rounds of (no-crossing floor, friction, constraint solve) per substep at most, at substeps of
                    # 0.25 ms or longer (more at shorter ones: integrator.friction_rounds)
CP_POLYGON = 9      # 1: friction's normal force scaled by polygon_gain (a polyline's capstan made a rope's)
CP_NEAR = 10        # segments apart (exclude + 1) at or below which a pair counts for the stability bound only as
                    # its approach brings it near (REACH_*); 0: every pair half a skin ahead
CP_SETTLE = 11      # friction has settled when a round moves no contact point by more than this x min_gap, at
                    # substeps of 0.25 ms or longer (integrator.friction_rounds)
CP_WARM = 12        # 1: each substep's friction starts from the force of the one before (warm_friction)
CP_STALL = 13       # the rounds also end once a friction pass changes a contact point by more than this fraction of
                    # the pass before's change, the floor raising nothing (friction no longer converging); 0: never
CP_SIZE = 14

# contact_stats slots (per tick, filled by the integrator)
CS_COUNT = 0        # candidate pairs in the neighbour list
CS_REBUILDS = 1     # neighbour-list rebuilds in the last tick
CS_CONTACTS = 2     # pairs closer than Delta d (most over the substeps of the last tick)
CS_PENETRATION = 3  # largest Delta d - gap (m) over the substeps of the last tick (<= 0: nothing touches)
CS_PROJECTIONS = 4  # gaps the no-crossing floor had to restore in the last tick
CS_OVERFLOW = 5     # 1 if the neighbour list was too small for every candidate (contacts may be missed)
CS_STICKING = 6     # pairs in static friction in the last substep
CS_REVERTED = 7     # vertices the last-resort guard put back to the start of their substep in the last tick
CS_SKIN = 8         # m, the skin the neighbour list was built with
# the rounds of floor, friction and solve (integrator.contact_rounds) in the last tick, and why they went on
CS_ROUNDS = 9       # rounds run
CS_ROUNDS_RAISED = 10   # of them, rounds whose floor raised a gap
CS_ROUNDS_SLID = 11     # of them, rounds whose friction changed a contact point by more than it settles within
CS_ROUNDS_OUT = 12      # substeps whose rounds ended before the floor and friction settled (ran out or stalled)

# how far ahead of touching a pair one segment past the excluded ones (j, j + exclude + 1) counts for the
# stability bound: its present approach per substep times REACH_SUBSTEPS (the substep budget's default), but at
# least REACH_MIN and at most half of the skin (every other pair: half of the skin)
REACH_SUBSTEPS = 32.0
REACH_MIN = 0.1
CS_SIZE = 13

GUARD = 0.25        # fraction of min_gap below which a gap left after the floor's rounds is unsafe
GAP_TOL = 0.01      # fraction of min_gap a gap may fall short of the floor before it is projected (rounds end)
# fraction of min_gap kept between the floor's reach and twice the substep's largest move before the pairs it
# visits are listed again (floor_reach): covers the round-off of a frozen gap (1e-19 m) with room, and lists them
# again once the largest move has grown by half of this (a held knot moves micrometres a substep: once a substep)
FLOOR_MARGIN = 0.1


TURN_MAX = 2.0 * math.pi / 3.0   # rad: the sharpest turn polygon_gain corrects for


@njit(cache=True, error_model="numpy")
def vertex_turns(x: np.ndarray, turn: np.ndarray) -> None:
    """The thread's turn (rad) at every vertex into ``turn``: 0 at the ends, at most TURN_MAX."""
    n = x.shape[0]
    turn[0] = 0.0
    turn[n - 1] = 0.0
    for v in range(1, n - 1):
        c = hinge_cos(x, v)
        if not math.isfinite(c):   # a zero-length edge: no turn
            turn[v] = 0.0
            continue
        turn[v] = min(math.acos(max(-1.0, min(1.0, c))), TURN_MAX)


@njit(cache=True, error_model="numpy", inline="always")
def polygon_gain(turn: np.ndarray, a: int, s: float, b: int, t: float, mu: float) -> float:
    """The factor on a pair's normal force for friction that gives a polyline the capstan of a rope.

    A polyline wrapped round another strand touches it at the middles of its chords, where the normal force is
    square to the chord, not to the rope's tangent at the vertices. Balancing a vertex that turns the strand by
    theta between two pressed chords (normal force N on each, split half and half to their ends, friction
    mu N along each chord) gives T2^2 - 2 mu sin(theta) T1 T2 - T1^2 = 0, a tension ratio exp(asinh(mu sin
    theta)) where the rope has exp(mu theta) (docs/PHYSICS.md Sec. 7: a 60-degree polygon keeps 0.82 of
    mu = 0.3). A coefficient sinh(mu theta) / sin(theta) restores it, so f_n is scaled by that over mu. theta
    is the turn at the contact (``turn``, vertex_turns), interpolated between the segment's two vertices at
    (s, t), the larger of the two strands'. ``mu`` > 0."""
    ta = (1.0 - s) * turn[a] + s * turn[a + 1]
    tb = (1.0 - t) * turn[b] + t * turn[b + 1]
    th = ta if ta > tb else tb
    if th < 1e-4:
        return 1.0
    return math.sinh(mu * th) / (mu * math.sin(th))


@njit(cache=True, error_model="numpy", inline="always")
def _penalty(p: float, delta: float) -> float:
    """phi(p): Wang's linear penalty max(p, 0) with its kink rounded over [0, delta] (C^1)."""
    if p <= 0.0:
        return 0.0
    if p < delta:
        return 0.5 * p * p / delta
    return p - 0.5 * delta


@njit(cache=True, error_model="numpy", inline="always")
def _add_spring_rows(rows: np.ndarray, a: int, b: int, s: float, t: float, k_s: float) -> None:
    """Add a pair spring k_s (N/m) on segments a and b at (s, t) to the vertices' Gershgorin rows (N/m)."""
    rows[a] += 2.0 * k_s * (1.0 - s)
    rows[a + 1] += 2.0 * k_s * s
    rows[b] += 2.0 * k_s * (1.0 - t)
    rows[b + 1] += 2.0 * k_s * t


@njit(cache=True, error_model="numpy", inline="always")
def _move_pair(x: np.ndarray, a: int, b: int, s: float, t: float, w: np.ndarray, gx: float, gy: float,
               gz: float) -> None:
    """Change the relative point P(s) - Q(t) of segments a and b by W g (W their effective inverse mass), each
    vertex moving by its weight times its inverse mass times g: an impulse g / h^2 that keeps momentum."""
    for v, c in ((a, 1.0 - s), (a + 1, s), (b, -(1.0 - t)), (b + 1, -t)):
        k = c * w[v]
        x[v, 0] += k * gx
        x[v, 1] += k * gy
        x[v, 2] += k * gz


@njit(cache=True, error_model="numpy")
def rebuild_neighbours(x: np.ndarray, cpar: np.ndarray, skin: float, exclude: int, head, nxt, cells, scratch,
                       cand_i, cand_j, cand_s, cand_t, cand_d, cand_n, cand_fp, cand_ff, old_j, old_n, old_fp, old_ff,
                       old_next, seg_head, x_ref, cstats, parted) -> None:
    """Rebuild the neighbour list: every pair closer than Delta d + ``skin`` (m), and remember the positions it
    was built at (``x_ref``). A pair that was in the old list keeps its normal (the side each strand is on), its
    floor force and its friction force (the warm starts); old_* (P) and seg_head (segments) are scratch for
    carrying them over. A parted segment (``parted``, solver/breakage.py) is no material and pairs with nothing."""
    m = seg_head.shape[0]
    n_old = int(cstats[CS_COUNT])
    for k in range(m):
        seg_head[k] = -1
    for c in range(n_old):   # the old pairs, chained by their first segment
        old_j[c] = cand_j[c]
        old_fp[c] = cand_fp[c]
        for d in range(3):
            old_n[c, d] = cand_n[c, d]
            old_ff[c, d] = cand_ff[c, d]
        old_next[c] = seg_head[cand_i[c]]
        seg_head[cand_i[c]] = c
    count = find_contacts(x, cpar[CP_DISTANCE] + skin, exclude, head, nxt, cells, scratch,
                          cand_i, cand_j, cand_s, cand_t, cand_d)
    cap = cand_i.shape[0]
    n_new = min(count, cap)
    kept = 0
    for c in range(n_new):
        if parted[cand_i[c]] == 0 and parted[cand_j[c]] == 0:
            cand_i[kept] = cand_i[c]
            cand_j[kept] = cand_j[c]
            cand_s[kept] = cand_s[c]
            cand_t[kept] = cand_t[c]
            cand_d[kept] = cand_d[c]
            kept += 1
    n_new = kept
    for c in range(n_new):
        k = seg_head[cand_i[c]]
        while k >= 0 and old_j[k] != cand_j[c]:
            k = old_next[k]
        for d in range(3):
            cand_n[c, d] = old_n[k, d] if k >= 0 else 0.0
            cand_ff[c, d] = old_ff[k, d] if k >= 0 else 0.0
        cand_fp[c] = old_fp[k] if k >= 0 else 0.0
    cstats[CS_COUNT] = n_new
    cstats[CS_SKIN] = skin
    cstats[CS_OVERFLOW] = 1.0 if count > cap else 0.0
    cstats[CS_REBUILDS] += 1.0
    for i in range(x.shape[0]):
        for d in range(3):
            x_ref[i, d] = x[i, d]


@njit(cache=True, error_model="numpy")
def largest_step(x: np.ndarray, x_prev: np.ndarray) -> float:
    """The largest distance (m) a vertex moved in the last substep."""
    worst = 0.0
    for i in range(x.shape[0]):
        dx = x[i, 0] - x_prev[i, 0]
        dy = x[i, 1] - x_prev[i, 1]
        dz = x[i, 2] - x_prev[i, 2]
        worst = max(worst, dx * dx + dy * dy + dz * dz)
    return math.sqrt(worst)


@njit(cache=True, error_model="numpy")
def neighbours_stale(x: np.ndarray, x_ref: np.ndarray, skin: float, step: float) -> bool:
    """True once any vertex may be more than skin / 2 from where the list was built by the end of the coming
    substep (its distance from there plus twice ``step``, the largest last step): two vertices approaching each
    other could then close the skin, so the list could miss a pair within Delta d."""
    lim = 0.5 * skin - 2.0 * step
    if lim <= 0.0:
        return True
    lim2 = lim * lim
    for i in range(x.shape[0]):
        dx = x[i, 0] - x_ref[i, 0]
        dy = x[i, 1] - x_ref[i, 1]
        dz = x[i, 2] - x_ref[i, 2]
        if dx * dx + dy * dy + dz * dz > lim2:
            return True
    return False


@njit(cache=True, error_model="numpy")
def penalty_forces(x: np.ndarray, x_prev: np.ndarray, cpar: np.ndarray, n_cand: int, cand_i, cand_j,
                   cand_s, cand_t, cand_d, cand_n, cand_f, cand_fp, scratch, force: np.ndarray,
                   contact_k: np.ndarray, contact_k_act: np.ndarray, turn: np.ndarray) -> tuple:
    """Add the continuous penalty forces (N) of every candidate pair to ``force`` and freeze each pair's
    (s, t), normal and gap (``cand_d``, m) for the rest of the substep. ``cand_f`` gets the pair's normal force
    (N) as friction reads it: penalty plus the floor's force of the substep before (``cand_fp``), times
    ``polygon_gain`` if ``CP_POLYGON`` is set. ``contact_k`` (N/m per vertex) gets the Gershgorin row sum of
    the penalty springs that act or may within the tick (pairs within half the minimum skin of touching), for
    the stability bound; ``contact_k_act`` that of the springs acting now; ``turn`` (n,) is scratch for the
    vertices' turns. Returns (pairs closer than Delta d, largest penetration Delta d - gap in m)."""
    k_s = cpar[CP_STIFFNESS]
    dd = cpar[CP_DISTANCE]
    delta = cpar[CP_SMOOTH]
    reach_min = REACH_MIN * cpar[CP_SKIN]
    reach_max = 0.5 * cpar[CP_SKIN]
    near = int(cpar[CP_NEAR])
    # the static coefficient's gain serves the kinetic one too (silk's 0.3 and 0.25 differ by under 1 % in it)
    mu_gain = max(cpar[CP_MU_S], cpar[CP_MU_K])
    polygon = cpar[CP_POLYGON] > 0.0 and mu_gain > 0.0 and n_cand > 0
    if polygon:
        vertex_turns(x, turn)
    for i in range(contact_k.shape[0]):
        contact_k[i] = 0.0
        contact_k_act[i] = 0.0
    touching = 0
    worst = -math.inf
    for c in range(n_cand):
        a = cand_i[c]
        b = cand_j[c]
        segment_closest(x[a, 0], x[a, 1], x[a, 2], x[a + 1, 0], x[a + 1, 1], x[a + 1, 2],
                        x[b, 0], x[b, 1], x[b, 2], x[b + 1, 0], x[b + 1, 1], x[b + 1, 2], scratch)
        s = scratch[0]
        t = scratch[1]
        gap = math.sqrt(scratch[2])
        cand_s[c] = s
        cand_t[c] = t
        wx = (x[a, 0] + s * (x[a + 1, 0] - x[a, 0])) - (x[b, 0] + t * (x[b + 1, 0] - x[b, 0]))
        wy = (x[a, 1] + s * (x[a + 1, 1] - x[a, 1])) - (x[b, 1] + t * (x[b + 1, 1] - x[b, 1]))
        wz = (x[a, 2] + s * (x[a + 1, 2] - x[a, 2])) - (x[b, 2] + t * (x[b + 1, 2] - x[b, 2]))
        # the side each strand is on is remembered: a pair whose separation has turned more than 90 degrees
        # from its normal of the substep before has been pushed past the other's centre line (the floor lost
        # a round to a stronger pull); its gap is then negative along the old normal, which pushes it back
        # the way it came instead of on through
        px, py, pz = cand_n[c, 0], cand_n[c, 1], cand_n[c, 2]
        known = px != 0.0 or py != 0.0 or pz != 0.0
        if known and wx * px + wy * py + wz * pz < 0.0:
            nx, ny, nz = px, py, pz
            gap = wx * px + wy * py + wz * pz
        elif gap > 1e-300:
            nx, ny, nz = wx / gap, wy / gap, wz / gap
        else:
            nx, ny, nz = px, py, pz   # the centre lines meet: keep the normal of the substep before
        cand_n[c, 0] = nx
        cand_n[c, 1] = ny
        cand_n[c, 2] = nz
        cand_d[c] = gap
        if dd - gap > worst:
            worst = dd - gap
        if gap < dd:
            touching += 1
        # the gap at the free-flight end of the substep, same (s, t) and normal (Wang 2017 App. E, w_c^app)
        g1 = 0.0
        for d in range(3):
            pa = 2.0 * x[a, d] - x_prev[a, d]
            pb = 2.0 * x[a + 1, d] - x_prev[a + 1, d]
            qa = 2.0 * x[b, d] - x_prev[b, d]
            qb = 2.0 * x[b + 1, d] - x_prev[b + 1, d]
            nd = nx if d == 0 else (ny if d == 1 else nz)
            g1 += nd * ((pa + s * (pb - pa)) - (qa + t * (qb - qa)))
        # Wang 2017 Eq. E.7 (with E.5's k_s): the trapezoidal mean of the penalty at both ends of the substep
        f = 0.5 * k_s * (_penalty(dd - gap, delta) + _penalty(dd - g1, delta))
        fn = f + cand_fp[c]
        cand_f[c] = fn * polygon_gain(turn, a, s, b, t, mu_gain) if polygon and fn > 0.0 else fn
        # warm start: the floor's force of the substep before acts again from the start (enforce_min_gap keeps it
        # in cand_fp and corrects it, down to zero): a knot held tight by the floor then starts each substep
        # close to where the floor will put it, and its rounds with the constraints end in a few
        f += cand_fp[c]
        reach = min(reach_max, reach_min + REACH_SUBSTEPS * max(gap - g1, 0.0)) if b - a <= near else reach_max
        if min(gap, g1) < dd + reach:
            # the spring k_s acts on g = sum_v c_v n . x_v with |c| summing to 2: row sums k_s |c_v| * 2. It
            # counts for the stability bound before it touches: the bound and the mass scaling are set at the
            # start of a tick, and a 3-0 silk vertex (0.2 mg) on a 1000 N/m spring needs h < 15 us, so a spring
            # that engages unforeseen mid-tick rings up. Half a skin ahead for most pairs; the pair one segment
            # past the excluded ones only as far ahead as its approach reaches (REACH_*): a straight strand's
            # segments j and j + 2 lie 1.25 mm apart with a 1 mm contact distance, inside half a skin, and
            # counting them made every free 3-0 silk strand 5,400 times heavier (docs/PHYSICS.md Sec. 6)
            _add_spring_rows(contact_k, a, b, s, t, k_s)
        if f <= 0.0:
            continue
        _add_spring_rows(contact_k_act, a, b, s, t, k_s)
        fx, fy, fz = f * nx, f * ny, f * nz
        force[a, 0] += (1.0 - s) * fx
        force[a, 1] += (1.0 - s) * fy
        force[a, 2] += (1.0 - s) * fz
        force[a + 1, 0] += s * fx
        force[a + 1, 1] += s * fy
        force[a + 1, 2] += s * fz
        force[b, 0] -= (1.0 - t) * fx
        force[b, 1] -= (1.0 - t) * fy
        force[b, 2] -= (1.0 - t) * fz
        force[b + 1, 0] -= t * fx
        force[b + 1, 1] -= t * fy
        force[b + 1, 2] -= t * fz
    return touching, worst


@njit(cache=True, error_model="numpy", inline="always")
def _pair_w(w_eff: np.ndarray, a: int, s: float, b: int, t: float) -> float:
    """The effective inverse mass (1/kg) of the relative point P(s) - Q(t) of segments a and b."""
    ca0, ca1, cb0, cb1 = 1.0 - s, s, -(1.0 - t), -t
    return ca0 * ca0 * w_eff[a] + ca1 * ca1 * w_eff[a + 1] + cb0 * cb0 * w_eff[b] + cb1 * cb1 * w_eff[b + 1]


@njit(cache=True, error_model="numpy", inline="always")
def _pair(c: int, w_eff: np.ndarray, cand_i, cand_j, cand_s, cand_t) -> tuple:
    """Pair c's segments, their closest-point parameters and the pair's effective inverse mass: (a, b, s, t, W)."""
    a = cand_i[c]
    b = cand_j[c]
    s = cand_s[c]
    t = cand_t[c]
    return a, b, s, t, _pair_w(w_eff, a, s, b, t)


@njit(cache=True, error_model="numpy", inline="always")
def _friction_pair(c: int, x: np.ndarray, xbar: np.ndarray, w_eff: np.ndarray, h2: float, mu_s: float, mu_k: float,
                   cand_i, cand_j, cand_s, cand_t, cand_n, cand_f, cand_fa) -> tuple:
    """Coulomb friction on pair c (apply_friction): returns (1 if it sticks, the change made to its relative
    point, m)."""
    fn = cand_f[c]
    if fn <= 0.0:
        return 0, 0.0
    a, b, s, t, W = _pair(c, w_eff, cand_i, cand_j, cand_s, cand_t)
    if W <= 0.0:
        return 0, 0.0
    ca0, ca1, cb0, cb1 = 1.0 - s, s, -(1.0 - t), -t   # weights of the relative point P(s) - Q(t)
    nx, ny, nz = cand_n[c, 0], cand_n[c, 1], cand_n[c, 2]
    # relative displacement of the contact points over the substep so far, friction's share included
    ux = (ca0 * (xbar[a, 0] - x[a, 0]) + ca1 * (xbar[a + 1, 0] - x[a + 1, 0])
          + cb0 * (xbar[b, 0] - x[b, 0]) + cb1 * (xbar[b + 1, 0] - x[b + 1, 0]))
    uy = (ca0 * (xbar[a, 1] - x[a, 1]) + ca1 * (xbar[a + 1, 1] - x[a + 1, 1])
          + cb0 * (xbar[b, 1] - x[b, 1]) + cb1 * (xbar[b + 1, 1] - x[b + 1, 1]))
    uz = (ca0 * (xbar[a, 2] - x[a, 2]) + ca1 * (xbar[a + 1, 2] - x[a + 1, 2])
          + cb0 * (xbar[b, 2] - x[b, 2]) + cb1 * (xbar[b + 1, 2] - x[b + 1, 2]))
    un = ux * nx + uy * ny + uz * nz
    # the slip friction has to answer for: the tangential displacement without friction's share
    fx, fy, fz = ux - un * nx - cand_fa[c, 0], uy - un * ny - cand_fa[c, 1], uz - un * nz - cand_fa[c, 2]
    free = math.sqrt(fx * fx + fy * fy + fz * fz)
    if free <= 0.0:
        return 0, 0.0
    # stopping the slip is a change -free of the relative point; a force F on the pair changes it by
    # h^2 W F, so it needs F = |free| / (h^2 W)
    stick = 0
    if free <= mu_s * fn * h2 * W:
        lam = 1.0                         # static: friction takes the whole slip
        stick = 1
    else:
        lam = mu_k * fn * h2 * W / free   # kinetic: mu_k f_n against the slip (< 1 since mu_k <= mu_s)
    # the change still to make: the new total -lam * free minus what friction already made
    dx = -lam * fx - cand_fa[c, 0]
    dy = -lam * fy - cand_fa[c, 1]
    dz = -lam * fz - cand_fa[c, 2]
    cand_fa[c, 0] += dx
    cand_fa[c, 1] += dy
    cand_fa[c, 2] += dz
    _move_pair(xbar, a, b, s, t, w_eff, dx / W, dy / W, dz / W)
    return stick, math.sqrt(dx * dx + dy * dy + dz * dz)


@njit(cache=True, error_model="numpy")
def apply_friction(x: np.ndarray, xbar: np.ndarray, w_eff: np.ndarray, h: float, cpar: np.ndarray, n_cand: int,
                   cand_i, cand_j, cand_s, cand_t, cand_n, cand_f, cand_fa) -> tuple:
    """Coulomb friction on the positions ``xbar`` (m) the substep is heading to, pair by pair (Gauss-Seidel):
    stick within the static cone mu_s f_n, else slide against mu_k f_n. Called after each constraint solve
    (whose displacement along the edges is sliding along the strands), so ``cand_fa`` (P, 3) accumulates the
    change of the pair's relative point that friction has made this substep, and each call sets the total, not
    adds another share. Returns (sticking pairs, largest change made, m)."""
    mu_s = cpar[CP_MU_S]
    mu_k = cpar[CP_MU_K]
    if mu_s <= 0.0 and mu_k <= 0.0:
        return 0, 0.0
    h2 = h * h
    sticking = 0
    moved = 0.0
    for c in range(n_cand):
        stick, change = _friction_pair(c, x, xbar, w_eff, h2, mu_s, mu_k, cand_i, cand_j, cand_s, cand_t, cand_n,
                                       cand_f, cand_fa)
        sticking += stick
        moved = max(moved, change)
    return sticking, moved


@njit(cache=True, error_model="numpy")
def warm_friction(x: np.ndarray, xbar: np.ndarray, w_eff: np.ndarray, h: float, cpar: np.ndarray, n_cand: int,
                  cand_i, cand_j, cand_s, cand_t, cand_n, cand_f, cand_fa, cand_ff) -> None:
    """Friction before the substep's first constraint solve, on the prediction ``xbar`` (m); ``cand_fa`` is
    cleared first. With ``CP_WARM`` set, a pair that had a friction force in the substep before (``cand_ff``, N:
    keep_friction) starts with it: its part square to the pair's normal now, clipped to the static cone
    mu_s f_n, moves the relative point by h^2 W F (``cand_fa`` gets the change), as the floor's force is
    warm-started (penalty_forces). The rounds after the solve correct it (apply_friction sets friction's total
    afresh from the slip each time), and in a held knot, whose friction changes little from one substep to the
    next, they end after one or two, where started from nothing friction and the solve take turns until the
    rounds run out (docs/PHYSICS.md Sec. 7). A warm-started pair is not evaluated on the prediction: the pull
    friction holds against comes with the solve, so the prediction's slip is near nothing, and stopping it would
    take the warm start back. Every other pair (all of them without ``CP_WARM``) gets apply_friction's friction
    on the prediction."""
    mu_s = cpar[CP_MU_S]
    mu_k = cpar[CP_MU_K]
    warm = cpar[CP_WARM] > 0.0
    for c in range(n_cand):
        cand_fa[c, 0] = 0.0
        cand_fa[c, 1] = 0.0
        cand_fa[c, 2] = 0.0
    if mu_s <= 0.0 and mu_k <= 0.0:
        return
    h2 = h * h
    for c in range(n_cand):
        fn = cand_f[c]
        gx, gy, gz = cand_ff[c, 0], cand_ff[c, 1], cand_ff[c, 2]
        if not warm or fn <= 0.0 or (gx == 0.0 and gy == 0.0 and gz == 0.0):
            _friction_pair(c, x, xbar, w_eff, h2, mu_s, mu_k, cand_i, cand_j, cand_s, cand_t, cand_n, cand_f, cand_fa)
            continue
        a, b, s, t, W = _pair(c, w_eff, cand_i, cand_j, cand_s, cand_t)
        if W <= 0.0:
            continue
        gx, gy, gz, g = tangential(gx, gy, gz, cand_n[c, 0], cand_n[c, 1], cand_n[c, 2])
        cone = mu_s * fn
        k = h2 * W * (cone / g if g > cone else 1.0)   # the force's change of the relative point, within the cone
        cand_fa[c, 0] = k * gx
        cand_fa[c, 1] = k * gy
        cand_fa[c, 2] = k * gz
        _move_pair(xbar, a, b, s, t, w_eff, k * gx / W, k * gy / W, k * gz / W)


@njit(cache=True, error_model="numpy")
def keep_friction(w_eff: np.ndarray, h: float, n_cand: int, kept: bool, cand_i, cand_j, cand_s, cand_t, cand_f,
                  cand_fa, cand_ff) -> None:
    """At the end of a substep's rounds: each pair's friction force (N), friction's change of its relative point
    over h^2 W (``cand_fa`` to ``cand_ff``), the next substep's warm start (warm_friction). Zero where the pair
    did not press (f_n <= 0), and everywhere unless the substep is ``kept``."""
    h2 = h * h
    for c in range(n_cand):
        W = _pair_w(w_eff, cand_i[c], cand_s[c], cand_j[c], cand_t[c]) if kept and cand_f[c] > 0.0 else 0.0
        k = 1.0 / (h2 * W) if W > 0.0 else 0.0
        for d in range(3):
            cand_ff[c, d] = k * cand_fa[c, d]


@njit(cache=True, error_model="numpy", inline="always")
def floor_reach(step: float, min_gap: float) -> float:
    """The reach (m) floor_pairs lists pairs for while no vertex has moved more than ``step`` (m) in the substep:
    twice the move, plus FLOOR_MARGIN of ``min_gap`` twice over (one for the round-off of a frozen gap, with
    room; one that the move may grow by before the pairs are listed again, integrator.contact_rounds)."""
    return 2.0 * step + 2.0 * FLOOR_MARGIN * min_gap


@njit(cache=True, error_model="numpy")
def floor_pairs(cpar: np.ndarray, n_cand: int, cand_d: np.ndarray, cand_fp: np.ndarray, reach: float,
                out: np.ndarray) -> int:
    """The pairs the no-crossing floor may act on while no vertex is more than ``reach`` / 2 (m) from where the
    substep started, into ``out`` in list order; returns how many. The floor raises a gap only below min_gap
    and pulls only where it holds a force (``cand_fp``). A pair's frozen-normal gap moves by at most the sum of
    its four vertices' moves times their weights, which sum to 1 on each strand: at most twice the largest move.
    So a pair without a floor force whose gap at the start (``cand_d``) is min_gap + ``reach`` or more stays
    out of the floor's reach, and a sweep over the rest does what a sweep over all does, bit for bit. In a
    held knot about 10 of the 280 listed pairs are within reach."""
    lim = cpar[CP_MIN_GAP] + reach
    k = 0
    for c in range(n_cand):
        if cand_d[c] < lim or cand_fp[c] > 0.0:
            out[k] = c
            k += 1
    return k


@njit(cache=True, error_model="numpy", inline="always")
def _frozen_gap(x: np.ndarray, c: int, cand_i, cand_j, cand_s, cand_t, cand_n) -> float:
    """Pair c's gap (m) at positions x, along its frozen normal, between its frozen closest points."""
    a = cand_i[c]
    b = cand_j[c]
    s = cand_s[c]
    t = cand_t[c]
    g = 0.0
    for d in range(3):
        g += cand_n[c, d] * ((x[a, d] + s * (x[a + 1, d] - x[a, d])) - (x[b, d] + t * (x[b + 1, d] - x[b, d])))
    return g


@njit(cache=True, error_model="numpy")
def enforce_min_gap(xn: np.ndarray, w_eff: np.ndarray, h: float, cpar: np.ndarray, pairs: np.ndarray,
                    n_pairs: int, cand_i, cand_j, cand_s, cand_t, cand_d, cand_n, cand_fp) -> int:
    """The no-crossing floor on the end-of-substep positions ``xn`` (m): the gap of every pair in
    ``pairs[:n_pairs]`` (floor_pairs lists those that can reach the floor), measured along the normal and at the
    (s, t) frozen at the substep's start, is raised to at least min_gap by moving the four vertices along the
    normal in proportion to inverse mass and weight. A pair that started the substep below
    min_gap (``cand_d``: an initial shape, or a squeeze the rounds could not undo) is raised only to its start
    gap plus recover_speed * h: pushing it out in one substep would fire it apart. ``cand_fp`` accumulates the
    force (N) each projection stands for (its impulse over the substep). Returns how many gaps were raised."""
    gmin = cpar[CP_MIN_GAP]
    recover = cpar[CP_RECOVER] * h
    inv_h2 = 1.0 / (h * h)
    raised = 0
    for k in range(n_pairs):
        c = pairs[k]
        a = cand_i[c]
        b = cand_j[c]
        s = cand_s[c]
        t = cand_t[c]
        nx, ny, nz = cand_n[c, 0], cand_n[c, 1], cand_n[c, 2]
        g = _frozen_gap(xn, c, cand_i, cand_j, cand_s, cand_t, cand_n)
        d0 = max(cand_d[c], 0.0)
        target = min(gmin, d0 + recover)
        # a gap within GAP_TOL of the floor is left as it is, so the rounds can end; but a pair already below the
        # floor may not sink below where it started, or it would creep through at GAP_TOL per substep
        lim = target - GAP_TOL * gmin
        if d0 < gmin:
            lim = max(lim, d0)
        push = g < lim
        # the warm-started force is taken back where it holds the pair open past the floor (never below zero,
        # never closer than the floor): the floor pushes, it does not pull
        pull = cand_fp[c] > 0.0 and g > target + GAP_TOL * gmin
        if not push and not pull:
            continue
        ca0, ca1, cb0, cb1 = 1.0 - s, s, -(1.0 - t), -t
        W = ca0 * ca0 * w_eff[a] + ca1 * ca1 * w_eff[a + 1] + cb0 * cb0 * w_eff[b] + cb1 * cb1 * w_eff[b + 1]
        if W <= 0.0:
            continue
        lam = (target - g) / W
        if pull:
            lam = max(lam, -cand_fp[c] * h * h)
        cand_fp[c] += lam * inv_h2
        if cand_fp[c] < 0.0:
            cand_fp[c] = 0.0
        _move_pair(xn, a, b, s, t, w_eff, lam * nx, lam * ny, lam * nz)
        raised += 1
    return raised


@njit(cache=True, error_model="numpy")
def _any_unsafe(x: np.ndarray, xn: np.ndarray, limit: float, n_cand: int, cand_i, cand_j, cand_s, cand_t,
                cand_n) -> bool:
    """Whether some pair's frozen-normal gap at ``xn`` is below ``limit`` (m) and below what it was at ``x``
    (a pair that started that close and got no closer is the floor's business)."""
    for c in range(n_cand):
        g = _frozen_gap(xn, c, cand_i, cand_j, cand_s, cand_t, cand_n)
        if g < limit and g < _frozen_gap(x, c, cand_i, cand_j, cand_s, cand_t, cand_n) - 1e-15:
            return True
    return False


@njit(cache=True, error_model="numpy")
def guard_crossings(x: np.ndarray, xn: np.ndarray, kinematic: np.ndarray, cpar: np.ndarray, n_cand: int,
                    cand_i, cand_j, cand_s, cand_t, cand_n) -> int:
    """The last resort when the floor's rounds did not converge (strands squeezed together by several grasps
    at once): if any pair is still closer than GUARD * min_gap along its frozen normal, and closer than at the
    start of the substep, the whole thread is put back where it was at the start (``x``), where it met every
    constraint and no pair was that close: the substep becomes an inelastic stop of the thread instead of a
    strand passing through another. Putting back only the vertices of the offending pairs would leave their
    segments to the unmoved ones stretched, and the next constraint solve would kick them apart. Returns how
    many vertices were put back (0 almost always)."""
    if not _any_unsafe(x, xn, GUARD * cpar[CP_MIN_GAP], n_cand, cand_i, cand_j, cand_s, cand_t, cand_n):
        return 0
    total = 0
    for i in range(x.shape[0]):
        if kinematic[i] == 0:
            for d in range(3):
                xn[i, d] = x[i, d]
            total += 1
    return total
