"""Tissue: pads held by springs, the thread's collision with them, and punctures the thread slides through.

A pad is an axis-aligned box that translates (it does not turn), held at its rest centre by a spring-damper,
so the suture's tension can pull two pads across a wound gap and the user feels the tissue resist. A pass of
the thread through a pad is two punctures on its surface, one where the needle went in and one where it came
out; the thread between them runs through the tissue (the "tunnel") and is the only thread allowed inside it.

Each puncture is a point fixed on its pad. Each substep it sits at a thread coordinate sigma = j + u (segment
j, fraction u), the point of the thread closest to it, and acts on the two vertices of segment j, split
(1 - u, u), in the prediction step, implicitly (as a grasp's coupling does, integrator.py):
  * a lateral spring k holds the thread on the puncture: it pulls each vertex toward its start plus the
    offset of the thread from the puncture. With sigma the closest point, that offset is across the thread,
    so the spring holds the thread on the point without holding it along itself;
  * a drag opposes the thread's slide through the puncture: a damper c on the velocity relative to the pad,
    with c = D(|v|) / |v| from the slide speed v of the substep before (a lagged, implicit Coulomb law).
    D(v) = f_kinetic + c_viscous v while sliding, and at |v| < v_stick c = f_static / v_stick, so a thread
    pulled with less than f_static creeps at most at v_stick f/f_static, and breaks away above it. At a
    steady slide the lag vanishes and the drag is exactly D(v). The lateral spring itself resists the slide
    by k h v (its target is the vertex's start); the damper is lowered by that much, so the sum is D(v).
The forces the punctures apply to the thread, reversed, pull their pad (Newton's third law; the thesis,
001_*.txt Sec. 3.5.2, splits a suture's force between its piercings the same way). Pads move explicitly with
the reaction of the substep before (they weigh grams and their springs are soft), the thread implicitly.

A thread vertex outside a tunnel is kept out of every pad inflated by the thread's radius: after each
constraint solve, one that entered is put back on the face it came through, with Coulomb friction against the
pad's surface (position level); its push, m dx / h^2, pulls the pad. Vertices only: a segment may cut a pad's
corner between two vertices outside it (segments are a few millimetres, pads centimetres).

A puncture is removed when an end of the thread passes through it; a pass is gone when both are.
SI units. The slot constants below name the columns of the packed arrays the kernels take.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

MAX_PUNCTURES = 16  # puncture slots of a state (8 passes)

# tpar: the tissue's parameter vector
TP_K_LAT = 0       # N/m, a puncture's lateral spring
TP_F_STATIC = 1    # N, a puncture's largest drag while the thread holds (breakaway)
TP_F_KINETIC = 2   # N, the Coulomb part of a puncture's drag while the thread slides
TP_VISCOUS = 3     # N*s/m, the part of the drag that grows with the slide speed
TP_V_STICK = 4     # m/s, the slide speed below which a puncture holds
TP_MU = 5          # Coulomb coefficient of the thread on a pad's surface
TP_RADIUS = 6      # m, the thread's radius against a pad
TP_ROUNDS = 7      # rounds of (vertices put back out of the pads, constraint solve) per substep at most
TP_EDGE_MU = 8     # Coulomb coefficient between two pads' faces where they meet (the wound's edges)
TP_TEAR = 9        # N, the lateral needle force at a puncture past which the tissue tears there (a `tear` event)
TP_COUNT = 10

# pads (P, PD_COUNT): the pads' parameters
PD_HALF = 0        # 3 columns: half extents (m)
PD_REST = 3        # 3 columns: rest centre (m)
PD_INV_MASS = 6    # 1/kg (0: fixed)
PD_K = 7           # 3 columns: N/m, the spring to the rest centre along x, y, z
PD_C = 10          # N*s/m, its damper
PD_COUNT = 11

# pst (P, PS_COUNT): the pads' state
PS_X = 0           # 3: centre (m)
PS_V = 3           # 3: velocity (m/s)
PS_F = 6           # 3: the thread's pull gathered over the substep, applied in the next (N)
PS_DX = 9          # 3: the centre's move over the current substep (m)
PS_COUNT = 12

# pun_i (Q, PI_COUNT) int64: the punctures' integer state
PI_STATE = 0       # PUN_FREE, PUN_ACTIVE, PUN_PASSED
PI_PAD = 1         # the pad it is on
PI_MATE = 2        # the other puncture of the same pass, or -1
PI_COUNT = 3
PUN_FREE = 0
PUN_ACTIVE = 1
PUN_PASSED = 2     # an end of the thread went through it: its tunnel reaches to that end
PUN_NEEDLE = 3     # the needle runs through it (solver/needle.py): PF_SIGMA is then an arc angle (rad)

# pun_f (Q, PF_COUNT): the punctures' float state
PF_LOCAL = 0       # 3: position relative to its pad's centre (m)
PF_SIGMA = 3       # thread coordinate j + u of the thread's point on it (a passed one: -1 or segments + 1)
PF_SPEED = 4       # m/s, the slide speed of the last substep
PF_DAMP = 5        # N*s/m, the drag damper used in the current substep
PF_OFF = 6         # 3: the thread's offset from the puncture at the substep's start (m)
PF_FORCE = 9       # 3: the force the puncture applied to the thread in the last substep (N); while the needle
                   # runs through it, the tissue's lateral push on the needle there (needle.needle_constraints)
PF_DRAG = 12       # N, that force's component along the thread, opposing the slide (the drag felt)
PF_COUNT = 13


@njit(cache=True, error_model="numpy")
def _pad_coupling(h, pads, pst, p, g, g_target, g_target_prev, g_k, g_c, g_fmax, g_force, g_sat) -> None:
    """Pad p over one substep h (s) with grasp g's virtual coupling (N/m, N*s/m) to its target (where the jaw
    holds the pad's centre) beside its own spring-damper: backward Euler on both,
    m (v1 - v0)/h = f - k (x0 + h v1 - rest) - c v1 + kg (p1 - x0 - h v1) + cg (vp - v1), vp the target's velocity;
    past the coupling's force limit, a constant pull of the limit toward the target (as a thread grasp's). The
    force the coupling applied is left in g_force[g] (N, on the pad; the hand feels its reaction)."""
    m = 1.0 / pads[p, PD_INV_MASS]
    kg, cg = g_k[g], g_c[g]
    fx = fy = fz = 0.0
    for d in range(3):   # the coupling's force were the pad to keep its velocity: saturated or not
        vp = (g_target[g, d] - g_target_prev[g, d]) / h
        f = kg * (g_target[g, d] - pst[p, PS_X + d]) + cg * (vp - pst[p, PS_V + d])
        if d == 0:
            fx = f
        elif d == 1:
            fy = f
        else:
            fz = f
    fmag = math.sqrt(fx * fx + fy * fy + fz * fz)
    sat = fmag > g_fmax[g]
    g_sat[g] = 1 if sat else 0
    for d in range(3):
        k = pads[p, PD_K + d]
        c = pads[p, PD_C]
        x0 = pst[p, PS_X + d]
        f = pst[p, PS_F + d] - k * (x0 - pads[p, PD_REST + d])
        if sat:
            fd = fx if d == 0 else (fy if d == 1 else fz)
            pull = fd * g_fmax[g] / fmag
            v1 = (m * pst[p, PS_V + d] + h * (f + pull)) / (m + h * c + h * h * k)
            g_force[g, d] = pull
        else:
            vp = (g_target[g, d] - g_target_prev[g, d]) / h
            v1 = (m * pst[p, PS_V + d] + h * (f + kg * (g_target[g, d] - x0) + cg * vp)) / (
                m + h * (c + cg) + h * h * (k + kg))
            g_force[g, d] = kg * (g_target[g, d] - x0 - h * v1) + cg * (vp - v1)
        pst[p, PS_V + d] = v1
        pst[p, PS_DX + d] = h * v1
        pst[p, PS_X + d] += h * v1
        pst[p, PS_F + d] = 0.0


@njit(cache=True, error_model="numpy")
def step_pads(h: float, pads: np.ndarray, pst: np.ndarray, crack: float, mu_edge: float, g_pad: np.ndarray,
              g_target: np.ndarray, g_target_prev: np.ndarray, g_k: np.ndarray, g_c: np.ndarray, g_fmax: np.ndarray,
              g_force: np.ndarray, g_sat: np.ndarray) -> None:
    """Move every pad over one substep h (s): backward Euler on its spring-damper to the rest centre, the
    thread's pull (PS_F, gathered over the substep before) explicit, and the coupling of a grasp that holds it
    (``g_pad[g]`` = the pad: a tool's jaw holding a tissue edge, _pad_coupling); then clear PS_F. Pads closer than
    ``crack`` (m) are pushed apart along the axis of least overlap, in proportion to their inverse masses, and
    their closing velocity is removed: the wound's edges meet on the thread that crosses between them and
    stop (the crack is a few thread radii: room for it). Where they meet, Coulomb friction ``mu_edge`` acts
    between them across the other two axes: the closed wound's edges, pressed together by the suture, do not
    slide freely past each other (without it the two pads rocked up and down against each other, driven by
    the two punctures on the thread's one segment across the crack, and shook the knot: docs/PHYSICS.md
    Sec. 9)."""
    P = pads.shape[0]
    for p in range(P):
        w = pads[p, PD_INV_MASS]
        held = -1
        for g in range(g_pad.shape[0]):
            if g_pad[g] == p and g_k[g] > 0.0:
                held = g
        if held >= 0 and w > 0.0:
            _pad_coupling(h, pads, pst, p, held, g_target, g_target_prev, g_k, g_c, g_fmax, g_force, g_sat)
            continue
        for d in range(3):
            if w == 0.0:
                pst[p, PS_V + d] = 0.0
                pst[p, PS_DX + d] = 0.0
                continue
            # m (v1 - v0)/h = f - k (x0 + h v1 - rest) - c v1
            m = 1.0 / w
            k = pads[p, PD_K + d]
            c = pads[p, PD_C]
            v1 = (m * pst[p, PS_V + d] + h * (pst[p, PS_F + d] - k * (pst[p, PS_X + d] - pads[p, PD_REST + d]))) / (
                m + h * c + h * h * k)
            pst[p, PS_V + d] = v1
            pst[p, PS_DX + d] = h * v1
            pst[p, PS_X + d] += h * v1
        for d in range(3):
            pst[p, PS_F + d] = 0.0
    for p in range(P):
        for q in range(p + 1, P):
            best = math.inf
            ax = -1
            for d in range(3):
                ov = pads[p, PD_HALF + d] + pads[q, PD_HALF + d] + crack - abs(pst[q, PS_X + d] - pst[p, PS_X + d])
                if ov <= 0.0:
                    ax = -1
                    break
                if ov < best:
                    best = ov
                    ax = d
            if ax < 0:
                continue
            wp = pads[p, PD_INV_MASS]
            wq = pads[q, PD_INV_MASS]
            if wp + wq == 0.0:
                continue
            sgn = 1.0 if pst[q, PS_X + ax] >= pst[p, PS_X + ax] else -1.0
            dp = -sgn * best * wp / (wp + wq)
            dq = sgn * best * wq / (wp + wq)
            pst[p, PS_X + ax] += dp
            pst[q, PS_X + ax] += dq
            pst[p, PS_DX + ax] += dp
            pst[q, PS_DX + ax] += dq
            # inelastic: the closing part of the relative velocity goes, momentum kept
            vrel = sgn * (pst[q, PS_V + ax] - pst[p, PS_V + ax])
            # the normal impulse between the edges over the substep (N s): the closing velocity removed below, or
            # the push apart as the relative velocity best / h it stands for (as in position-based dynamics),
            # whichever is larger, times the reduced mass 1 / (wp + wq). Resting pressed together under a force
            # F, each gives F h: the substep's closing made the overlap, so adding them would count F twice
            pn = max(best / h, -vrel) / (wp + wq)
            if vrel < 0.0:
                vc = (wq * pst[p, PS_V + ax] + wp * pst[q, PS_V + ax]) / (wp + wq)
                pst[p, PS_V + ax] = vc
                pst[q, PS_V + ax] = vc
            # Coulomb friction between the edges: a tangential impulse of at most mu pn against the relative
            # sliding velocity, which it changes by at most mu pn (wp + wq) (face_friction's clamp), shared by
            # inverse mass. Applied as if before this substep's move, so the positions (and PS_DX, which the
            # punctures follow) are corrected by h dv too
            if mu_edge > 0.0:
                a0 = (ax + 1) % 3
                a1 = (ax + 2) % 3
                c0, c1 = face_friction(pst[q, PS_V + a0] - pst[p, PS_V + a0], pst[q, PS_V + a1] - pst[p, PS_V + a1],
                                       mu_edge, pn * (wp + wq))
                for e in range(2):
                    d = a0 if e == 0 else a1
                    dv = (c0 if e == 0 else c1) / (wp + wq)
                    pst[p, PS_V + d] -= wp * dv
                    pst[q, PS_V + d] += wq * dv
                    pst[p, PS_X + d] -= h * wp * dv
                    pst[q, PS_X + d] += h * wq * dv
                    pst[p, PS_DX + d] -= h * wp * dv
                    pst[q, PS_DX + d] += h * wq * dv


@njit(cache=True, error_model="numpy")
def closest_on_thread(x: np.ndarray, px: float, py: float, pz: float, j0: int, j1: int) -> tuple[float, float]:
    """(sigma, squared distance): the point of segments j0..j1 of polyline x closest to p (m)."""
    best = math.inf
    sig = 0.0
    for j in range(j0, j1 + 1):
        ex = x[j + 1, 0] - x[j, 0]
        ey = x[j + 1, 1] - x[j, 1]
        ez = x[j + 1, 2] - x[j, 2]
        rx = px - x[j, 0]
        ry = py - x[j, 1]
        rz = pz - x[j, 2]
        ee = ex * ex + ey * ey + ez * ez
        u = (rx * ex + ry * ey + rz * ez) / ee if ee > 0.0 else 0.0
        u = min(max(u, 0.0), 1.0)
        dx = rx - u * ex
        dy = ry - u * ey
        dz = rz - u * ez
        d2 = dx * dx + dy * dy + dz * dz
        if d2 < best:
            best = d2
            sig = j + u
    return sig, best


@njit(cache=True, error_model="numpy")
def puncture_point(q: int, pst: np.ndarray, pun_i: np.ndarray, pun_f: np.ndarray):
    """Where puncture q is now (m): its point fixed on its pad, moved with the pad."""
    p = pun_i[q, PI_PAD]
    return (pst[p, PS_X] + pun_f[q, PF_LOCAL], pst[p, PS_X + 1] + pun_f[q, PF_LOCAL + 1],
            pst[p, PS_X + 2] + pun_f[q, PF_LOCAL + 2])


@njit(cache=True, error_model="numpy")
def _segment_of(q: int, m: int, pun_f: np.ndarray):
    """(j, u): the segment and fraction along it of a thread-held puncture's thread coordinate sigma."""
    sig = pun_f[q, PF_SIGMA]
    j = min(int(sig), m - 1)
    return j, sig - j


SETTLED = 0.05   # thread radii: a vertex put back by less has settled on its face
SEARCH = 3   # segments either side of its last place searched for a puncture's new closest point


@njit(cache=True, error_model="numpy")
def locate_punctures(h: float, x: np.ndarray, rest: np.ndarray, pst: np.ndarray, pun_i: np.ndarray,
                     pun_f: np.ndarray, full: bool, needle_on: bool, margin: float) -> int:
    """Put each active puncture at the thread's point closest to it (near where it was, or anywhere with
    ``full``), and set its slide speed (m/s) from the move; a puncture that an end of the thread has gone
    through becomes PUN_PASSED (or, at the swaged end of a thread with a needle, goes back onto the needle at
    its swage, once ``margin`` (m) past it), and a pass whose punctures have both passed is freed. Returns the
    number of punctures that passed in this call."""
    m = x.shape[0] - 1
    passed = 0
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] != PUN_ACTIVE:
            continue
        px, py, pz = puncture_point(q, pst, pun_i, pun_f)
        old = pun_f[q, PF_SIGMA]
        if full:
            j0 = 0
            j1 = m - 1
        else:
            jc = min(int(old), m - 1)
            j0 = max(jc - SEARCH, 0)
            j1 = min(jc + SEARCH, m - 1)
        sig, _ = closest_on_thread(x, px, py, pz, j0, j1)
        # the slide: the thread's length that went through the point, in metres
        ja = min(int(old), m - 1)
        jb = min(int(sig), m - 1)
        slide = (sig - jb) * rest[jb] - (old - ja) * rest[ja]
        if jb > ja:
            for j in range(ja, jb):
                slide += rest[j]
        elif jb < ja:
            for j in range(jb, ja):
                slide -= rest[j]
        if not full:
            pun_f[q, PF_SPEED] = abs(slide) / h
        pun_f[q, PF_SIGMA] = sig
        # an end went through: the closest point is the end and the puncture lies beyond it along the thread
        end = -1
        if sig <= 0.0:
            ox = x[0, 0] - x[1, 0]
            oy = x[0, 1] - x[1, 1]
            oz = x[0, 2] - x[1, 2]
            # back onto a needle only once clearly past the swage (a wire's width along the thread), so a
            # puncture at the swage does not flick between the two
            beyond = 0.0 if not needle_on else margin * math.sqrt(ox * ox + oy * oy + oz * oz)
            if (px - x[0, 0]) * ox + (py - x[0, 1]) * oy + (pz - x[0, 2]) * oz > beyond:
                end = 0
        elif sig >= m:
            ox = x[m, 0] - x[m - 1, 0]
            oy = x[m, 1] - x[m - 1, 1]
            oz = x[m, 2] - x[m - 1, 2]
            if (px - x[m, 0]) * ox + (py - x[m, 1]) * oy + (pz - x[m, 2]) * oz > 0.0:
                end = m
        if end == 0 and needle_on:
            pun_i[q, PI_STATE] = PUN_NEEDLE
            pun_f[q, PF_SIGMA] = 0.0
            pun_f[q, PF_SPEED] = 0.0
        elif end >= 0:
            pun_i[q, PI_STATE] = PUN_PASSED
            pun_f[q, PF_SIGMA] = -1.0 if end == 0 else m + 1.0
            pun_f[q, PF_SPEED] = 0.0
            for d in range(3):
                pun_f[q, PF_FORCE + d] = 0.0
            pun_f[q, PF_DRAG] = 0.0
            passed += 1
    for q in range(pun_i.shape[0]):
        mate = pun_i[q, PI_MATE]
        if pun_i[q, PI_STATE] == PUN_PASSED and (mate < 0 or pun_i[mate, PI_STATE] == PUN_PASSED
                                                 or pun_i[mate, PI_STATE] == PUN_FREE):
            pun_i[q, PI_STATE] = PUN_FREE
            pun_i[q, PI_MATE] = -1
    return passed


@njit(cache=True, error_model="numpy")
def _couple(xbar: np.ndarray, w_eff: np.ndarray, v: int, kk: float, cc: float, tx: float, ty: float, tz: float,
            ax: float, ay: float, az: float) -> None:
    """Backward Euler of a spring kk (N/m, scaled by h^2) to target t and a damper cc (scaled by h) to the
    point a (the vertex's start moved with the pad), on vertex v: m (x1 - xbar) = kk (t - x1) + cc (a - x1)."""
    mv = 1.0 / w_eff[v]
    me = mv + kk + cc
    xbar[v, 0] = (mv * xbar[v, 0] + kk * tx + cc * ax) / me
    xbar[v, 1] = (mv * xbar[v, 1] + kk * ty + cc * ay) / me
    xbar[v, 2] = (mv * xbar[v, 2] + kk * tz + cc * az) / me
    w_eff[v] = 1.0 / me


@njit(cache=True, error_model="numpy")
def puncture_predict(h: float, x: np.ndarray, xbar: np.ndarray, w_eff: np.ndarray, tpar: np.ndarray,
                     pst: np.ndarray, pun_i: np.ndarray, pun_f: np.ndarray, first: int) -> None:
    """Add every active puncture's lateral spring and drag to the prediction xbar and the effective inverse
    masses w_eff of the two vertices it acts on (see the module's docstring), from vertex ``first`` on (1 when
    vertex 0 is a needle's swage: the needle's own hold on the tissue moves it). Pads have moved already."""
    m = x.shape[0] - 1
    k = tpar[TP_K_LAT]
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] != PUN_ACTIVE:
            continue
        p = pun_i[q, PI_PAD]
        j, u = _segment_of(q, m, pun_f)
        # the offset from the thread's point to the puncture (its pad moved this substep already)
        for d in range(3):
            pt = (1.0 - u) * x[j, d] + u * x[j + 1, d]
            pun_f[q, PF_OFF + d] = pst[p, PS_X + d] + pun_f[q, PF_LOCAL + d] - pt
        v = pun_f[q, PF_SPEED]
        if v < tpar[TP_V_STICK]:
            c = tpar[TP_F_STATIC] / tpar[TP_V_STICK]
        else:
            c = (tpar[TP_F_KINETIC] + tpar[TP_VISCOUS] * v) / v
        c = max(c - k * h, 0.0)   # the spring's own k h of drag (module docstring)
        pun_f[q, PF_DAMP] = c
        for side in range(2):
            vtx = j + side
            wgt = u if side == 1 else 1.0 - u
            if wgt <= 0.0 or w_eff[vtx] == 0.0 or vtx < first:
                continue
            _couple(xbar, w_eff, vtx, h * h * wgt * k, h * wgt * c,
                    x[vtx, 0] + pun_f[q, PF_OFF], x[vtx, 1] + pun_f[q, PF_OFF + 1], x[vtx, 2] + pun_f[q, PF_OFF + 2],
                    x[vtx, 0] + pst[p, PS_DX], x[vtx, 1] + pst[p, PS_DX + 1], x[vtx, 2] + pst[p, PS_DX + 2])


@njit(cache=True, error_model="numpy")
def puncture_forces(h: float, x: np.ndarray, x1: np.ndarray, kinematic: np.ndarray, tpar: np.ndarray,
                    pst: np.ndarray, pun_i: np.ndarray, pun_f: np.ndarray, first: int) -> None:
    """After the substep's solve (x1, m): the force each active puncture applied to the thread (PF_FORCE, N)
    and its drag along the thread (PF_DRAG); the reverse of the force pulls its pad (PS_F)."""
    m = x.shape[0] - 1
    k = tpar[TP_K_LAT]
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] != PUN_ACTIVE:
            continue
        p = pun_i[q, PI_PAD]
        j, u = _segment_of(q, m, pun_f)
        c = pun_f[q, PF_DAMP]
        fx = 0.0
        fy = 0.0
        fz = 0.0
        for side in range(2):
            vtx = j + side
            wgt = u if side == 1 else 1.0 - u
            if wgt <= 0.0 or kinematic[vtx] == 1 or vtx < first:
                continue
            dx = x1[vtx, 0] - x[vtx, 0]
            dy = x1[vtx, 1] - x[vtx, 1]
            dz = x1[vtx, 2] - x[vtx, 2]
            fx += wgt * (k * (pun_f[q, PF_OFF] - dx) - c * (dx - pst[p, PS_DX]) / h)
            fy += wgt * (k * (pun_f[q, PF_OFF + 1] - dy) - c * (dy - pst[p, PS_DX + 1]) / h)
            fz += wgt * (k * (pun_f[q, PF_OFF + 2] - dz) - c * (dz - pst[p, PS_DX + 2]) / h)
        pun_f[q, PF_FORCE] = fx
        pun_f[q, PF_FORCE + 1] = fy
        pun_f[q, PF_FORCE + 2] = fz
        tx = x1[j + 1, 0] - x1[j, 0]
        ty = x1[j + 1, 1] - x1[j, 1]
        tz = x1[j + 1, 2] - x1[j, 2]
        tl = math.sqrt(tx * tx + ty * ty + tz * tz)
        pun_f[q, PF_DRAG] = abs(fx * tx + fy * ty + fz * tz) / tl if tl > 0.0 else 0.0
        pst[p, PS_F] -= fx
        pst[p, PS_F + 1] -= fy
        pst[p, PS_F + 2] -= fz


@njit(cache=True, error_model="numpy")
def in_tunnel(i: int, p: int, pun_i: np.ndarray, pun_f: np.ndarray, ext: float) -> bool:
    """Whether vertex i lies on the thread between the two punctures of a pass through pad p, or within
    ``ext`` (thread coordinate) of one: the vertex next to a puncture is on the surface, not in it."""
    for q in range(pun_i.shape[0]):
        st = pun_i[q, PI_STATE]
        if st == PUN_FREE or st == PUN_NEEDLE or pun_i[q, PI_PAD] != p:
            continue
        mate = pun_i[q, PI_MATE]
        a = pun_f[q, PF_SIGMA]
        # the pass's other end: on the thread, or (none yet, or still on the needle) before the swage
        b = pun_f[mate, PF_SIGMA] if mate >= 0 and pun_i[mate, PI_STATE] != PUN_NEEDLE else -1.0
        if min(a, b) - ext < i < max(a, b) + ext:
            return True
    return False


@njit(cache=True, error_model="numpy")
def entry_face(r0x: float, r0y: float, r0z: float, rx: float, ry: float, rz: float, pads: np.ndarray, p: int,
               grow: float, by_start: bool) -> tuple:
    """The face of pad p, inflated by ``grow`` (m), that a point inside it went in through: (axis, side), side
    the point's coordinate along the axis, whose sign is the face's. r0 is the point at the substep's start
    against the pad's centre then, r the point now against its centre now (m). With ``by_start``, the axis it
    was furthest outside along at the start, relative to the half extent; if it was inside then too (or
    without ``by_start``), the axis it is least deep along now."""
    ax = -1
    far = 0.0
    shallow = math.inf
    ax_in = 0
    for d in range(3):
        half = pads[p, PD_HALF + d] + grow
        a0 = r0x if d == 0 else (r0y if d == 1 else r0z)
        a = rx if d == 0 else (ry if d == 1 else rz)
        out0 = abs(a0) - half
        if by_start and out0 / half > far:
            far = out0 / half
            ax = d
        depth = half - abs(a)
        if depth < shallow:
            shallow = depth
            ax_in = d
    if ax >= 0:
        return ax, r0x if ax == 0 else (r0y if ax == 1 else r0z)
    return ax_in, rx if ax_in == 0 else (ry if ax_in == 1 else rz)


@njit(cache=True, error_model="numpy")
def face_friction(t0: float, t1: float, mu: float, dn: float) -> tuple:
    """Coulomb friction on a pad's face, at position level: the correction (m) of a slip (t0, t1) over the
    substep along the face's two axes (after the push's axis, in order), relative to the pad, for a push of dn
    (m) out of it. The slip shrinks by mu dn at most, and stops if it is smaller. step_pads uses the same clamp
    on two pads' relative velocity (m/s), dn then being the normal impulse over the reduced mass."""
    tm = math.sqrt(t0 * t0 + t1 * t1)
    f = 1.0 if tm <= mu * dn else (mu * dn / tm if tm > 0.0 else 0.0)
    return -f * t0, -f * t1


@njit(cache=True, error_model="numpy")
def collide_pads(h: float, x: np.ndarray, xbar: np.ndarray, w_eff: np.ndarray, rest: np.ndarray, tpar: np.ndarray,
                 pads: np.ndarray, pst: np.ndarray, pun_i: np.ndarray, pun_f: np.ndarray, first: int) -> int:
    """Put back every vertex of xbar from ``first`` on (1 when vertex 0 is a needle's swage, which the needle's
    own constraints hold) that is inside a pad (inflated by the thread's radius) and not in one of its
    tunnels, onto the face it came through, with Coulomb friction against the face; the push pulls the pad
    (PS_F). Returns how many vertices were moved by more than SETTLED thread radii (the rounds of the substep
    go on while some are: a vertex resting on a face is pushed back by a hair every round)."""
    r = tpar[TP_RADIUS]
    mu = tpar[TP_MU]
    moved = 0
    h2 = h * h
    for p in range(pads.shape[0]):
        for i in range(first, x.shape[0]):
            if w_eff[i] == 0.0:
                continue
            inside = True
            for d in range(3):
                if abs(xbar[i, d] - pst[p, PS_X + d]) >= pads[p, PD_HALF + d] + r:
                    inside = False
                    break
            # a vertex within the thread's radius of a puncture is where the thread leaves the tissue
            if not inside or in_tunnel(i, p, pun_i, pun_f, r / rest[min(i, rest.shape[0] - 1)]):
                continue
            # the face: the axis the vertex was furthest outside along at the substep's start (the pad's start
            # centre is its centre less this substep's move); if it was inside then too, the shallowest one
            ax, side = entry_face(x[i, 0] - (pst[p, PS_X] - pst[p, PS_DX]),
                                  x[i, 1] - (pst[p, PS_X + 1] - pst[p, PS_DX + 1]),
                                  x[i, 2] - (pst[p, PS_X + 2] - pst[p, PS_DX + 2]),
                                  xbar[i, 0] - pst[p, PS_X], xbar[i, 1] - pst[p, PS_X + 1],
                                  xbar[i, 2] - pst[p, PS_X + 2], pads, p, r, True)
            half = pads[p, PD_HALF + ax] + r
            sgn = 1.0 if side >= 0.0 else -1.0
            target = pst[p, PS_X + ax] + sgn * half
            dn = abs(target - xbar[i, ax])
            corr0 = target - xbar[i, ax]
            xbar[i, ax] = target
            # Coulomb friction on the face: the slip relative to the pad over the substep shrinks by mu dn
            a0 = (ax + 1) % 3
            a1 = (ax + 2) % 3
            c0, c1 = face_friction((xbar[i, a0] - x[i, a0]) - pst[p, PS_DX + a0],
                                   (xbar[i, a1] - x[i, a1]) - pst[p, PS_DX + a1], mu, dn)
            xbar[i, a0] += c0
            xbar[i, a1] += c1
            me = 1.0 / w_eff[i]
            pst[p, PS_F + ax] -= me * corr0 / h2
            pst[p, PS_F + a0] -= me * c0 / h2
            pst[p, PS_F + a1] -= me * c1 / h2
            if dn > SETTLED * r:
                moved += 1
    return moved


@njit(cache=True, error_model="numpy")
def count_inside(x: np.ndarray, rest: np.ndarray, pads: np.ndarray, pst: np.ndarray, pun_i: np.ndarray,
                 pun_f: np.ndarray, margin: float, near: float, first: int) -> int:
    """Vertices from ``first`` on inside a pad shrunk by ``margin`` (m), in none of its tunnels and further
    than ``near`` (m, along the thread) from its punctures: the tests' check that only punctures let the
    thread in (a needle's swage, vertex 0, is checked with the needle: needle.needle_inside)."""
    n_in = 0
    for p in range(pads.shape[0]):
        for i in range(first, x.shape[0]):
            inside = True
            for d in range(3):
                if abs(x[i, d] - pst[p, PS_X + d]) >= pads[p, PD_HALF + d] - margin:
                    inside = False
                    break
            if inside and not in_tunnel(i, p, pun_i, pun_f, near / rest[min(i, rest.shape[0] - 1)]):
                n_in += 1
    return n_in


@njit(cache=True, error_model="numpy")
def puncture_load(tpar: np.ndarray, pun_i: np.ndarray, pun_f: np.ndarray) -> float:
    """The tension (N) the active punctures' drag can hold in the thread between them, whatever pulls it (a
    driven vertex as much as a grasp): the sum of their breakaway drags, or sliding drags at their last speeds.
    The mass scaling must count it as static (integrator.Stepper). Not the force they applied: a lateral
    spring snapping a vertex onto a new puncture makes a large force for a substep, not a tension."""
    total = 0.0
    for q in range(pun_i.shape[0]):
        if pun_i[q, PI_STATE] == PUN_ACTIVE:
            total += max(tpar[TP_F_STATIC], tpar[TP_F_KINETIC] + tpar[TP_VISCOUS] * pun_f[q, PF_SPEED])
    return total
