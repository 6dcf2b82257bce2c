"""Independent checks of a thread's topology: whether two segments pass through each other between two
states (:func:`crossings`), and how coiled a thread is (:func:`writhe`).

They share nothing with the solver's contact code (solver/contact.py, contact_response.py): a kernel of their
own over all pairs, used by the tests and by `suturesim validate` to check the contact response from outside.
Between states x0 and x1 every vertex moves on a straight line, x(tau) = x0 + tau (x1 - x0). Two segments
[p0, p1], [q0, q1] can only pass through each other at an instant where they are coplanar, i.e. where the
triple product V(tau) = (p1 - p0) . ((q0 - p0) x (q1 - p0)), a cubic in tau, is zero. So: find every sign
change of V on [0, 1] (sampled finely, then bisected), and at each root test whether the two segments, now in
one plane, actually meet (their distance is zero to round-off). Only pairs that could meet at all are
examined: a pair whose distance at tau = 0 exceeds the largest motion of its vertices cannot touch. The pairs
are found by sweep and prune, along the axis the thread spreads most on, over each segment's bounding sphere
grown by its motion, so a check costs about as much as the step it checks, not the all-pairs sum it replaces.
"""
from __future__ import annotations

import numpy as np
from numba import njit

SAMPLES = 64        # sign changes of V are looked for between these many instants of the interval
TOUCH = 1e-7        # m: at a coplanar instant, segments closer than this meet
BISECTIONS = 60     # halvings of a sign change's interval: tau to below 1e-18


@njit(cache=True, inline="always")
def _dist(r0, r1, r2, d10, d11, d12, d20, d21, d22, s, t) -> float:
    w0 = r0 + s * d10 - t * d20
    w1 = r1 + s * d11 - t * d21
    w2 = r2 + s * d12 - t * d22
    return np.sqrt(w0 * w0 + w1 * w1 + w2 * w2)


@njit(cache=True)
def _segment_distance(p0, p1, q0, q1) -> float:
    """Distance (m) between segments [p0, p1] and [q0, q1] (3-vectors): the minimum over the unit square of
    |p0 + s d1 - q0 - t d2|, from the interior stationary point and the four edges."""
    d10, d11, d12 = p1[0] - p0[0], p1[1] - p0[1], p1[2] - p0[2]
    d20, d21, d22 = q1[0] - q0[0], q1[1] - q0[1], q1[2] - q0[2]
    r0, r1, r2 = p0[0] - q0[0], p0[1] - q0[1], p0[2] - q0[2]
    a = d10 * d10 + d11 * d11 + d12 * d12
    e = d20 * d20 + d21 * d21 + d22 * d22
    b = d10 * d20 + d11 * d21 + d12 * d22
    c = d10 * r0 + d11 * r1 + d12 * r2
    f = d20 * r0 + d21 * r1 + d22 * r2
    best = np.inf
    det = a * e - b * b
    if det > 1e-12 * a * e:
        s = (b * f - c * e) / det
        t = (a * f - b * c) / det
        if 0.0 <= s <= 1.0 and 0.0 <= t <= 1.0:
            best = _dist(r0, r1, r2, d10, d11, d12, d20, d21, d22, s, t)
    safe_a = a if a > 0.0 else 1.0
    safe_e = e if e > 0.0 else 1.0
    for s_fix in (0.0, 1.0):                       # edges s = 0, 1: best t for that s
        t = min(max((f + b * s_fix) / safe_e, 0.0), 1.0)
        best = min(best, _dist(r0, r1, r2, d10, d11, d12, d20, d21, d22, s_fix, t))
    for t_fix in (0.0, 1.0):                       # edges t = 0, 1: best s for that t
        s = min(max((b * t_fix - c) / safe_a, 0.0), 1.0)
        best = min(best, _dist(r0, r1, r2, d10, d11, d12, d20, d21, d22, s, t_fix))
    return best


@njit(cache=True)
def _segment_distances(p0, p1, q0, q1, out) -> None:
    for k in range(p0.shape[0]):
        out[k] = _segment_distance(p0[k], p1[k], q0[k], q1[k])


def segment_distance(p0: np.ndarray, p1: np.ndarray, q0: np.ndarray, q1: np.ndarray) -> np.ndarray:
    """Distances (m) between segments [p0, p1] and [q0, q1], arrays (k, 3)."""
    arrays = [np.ascontiguousarray(v, dtype=np.float64) for v in (p0, p1, q0, q1)]
    out = np.empty(arrays[0].shape[0])
    _segment_distances(*arrays, out)
    return out


@njit(cache=True)
def _at(x0, x1, v, tau, out) -> None:
    for c in range(3):
        out[c] = x0[v, c] + tau * (x1[v, c] - x0[v, c])


@njit(cache=True)
def _triple(x0, x1, i, j, tau, p0, p1, q0, q1) -> float:
    """V(tau) of segments i and j (p0 .. q1: scratch 3-vectors, left holding the four vertices at tau)."""
    _at(x0, x1, i, tau, p0)
    _at(x0, x1, i + 1, tau, p1)
    _at(x0, x1, j, tau, q0)
    _at(x0, x1, j + 1, tau, q1)
    a0, a1, a2 = q0[0] - p0[0], q0[1] - p0[1], q0[2] - p0[2]
    b0, b1, b2 = q1[0] - p0[0], q1[1] - p0[1], q1[2] - p0[2]
    return ((p1[0] - p0[0]) * (a1 * b2 - a2 * b1) + (p1[1] - p0[1]) * (a2 * b0 - a0 * b2)
            + (p1[2] - p0[2]) * (a0 * b1 - a1 * b0))


@njit(cache=True)
def _sign(v: float) -> float:
    return 1.0 if v > 0.0 else (-1.0 if v < 0.0 else 0.0)


@njit(cache=True)
def _crossings(x0, x1, exclude, parted, out_i, out_j, out_tau) -> int:
    """Writes the crossings found into out_* (as many as fit) and returns how many there are; segments with
    ``parted`` nonzero pair with nothing."""
    m = x0.shape[0] - 1
    seg_move = np.empty(m)
    mid = np.empty((m, 3))
    half = np.empty(m)
    lo = np.empty(m)
    for s in range(m):
        ma = np.sqrt(np.sum((x1[s] - x0[s]) ** 2))
        mb = np.sqrt(np.sum((x1[s + 1] - x0[s + 1]) ** 2))
        seg_move[s] = max(ma, mb)
        for c in range(3):
            mid[s, c] = 0.5 * (x0[s, c] + x0[s + 1, c])
        half[s] = 0.5 * np.sqrt(np.sum((x0[s + 1] - x0[s]) ** 2)) + seg_move[s] + TOUCH
    # sweep along the axis the midpoints spread most on: along one the thread lies across (a knot pulled along
    # y, swept along x), every pair overlaps and the sweep visits all m^2 / 2 of them
    axis, widest = 0, -1.0
    for c in range(3):
        w = np.max(mid[:, c]) - np.min(mid[:, c])
        if w > widest:
            axis, widest = c, w
    for s in range(m):
        lo[s] = mid[s, axis] - half[s]
    order = np.argsort(lo)
    taus = np.linspace(0.0, 1.0, SAMPLES + 1)
    v = np.empty(SAMPLES + 1)
    p0, p1, q0, q1 = np.empty(3), np.empty(3), np.empty(3), np.empty(3)
    count = 0
    for a in range(m):
        sa = order[a]
        hi = mid[sa, axis] + half[sa]
        for b in range(a + 1, m):
            sb = order[b]
            if lo[sb] > hi:
                break
            i, j = min(sa, sb), max(sa, sb)
            if j - i <= exclude or parted[i] != 0 or parted[j] != 0:
                continue
            # first by bounding spheres (midpoint, half length grown by the motion), then by the exact distance
            # at tau = 0
            reach = half[i] + half[j]
            dm = 0.0
            for c in range(3):
                dm += (mid[i, c] - mid[j, c]) ** 2
            if dm > reach * reach:
                continue
            if _segment_distance(x0[i], x0[i + 1], x0[j], x0[j + 1]) > seg_move[i] + seg_move[j] + TOUCH:
                continue
            for k in range(SAMPLES + 1):
                v[k] = _triple(x0, x1, i, j, taus[k], p0, p1, q0, q1)
            last = -1.0
            for k in range(SAMPLES):
                if _sign(v[k]) * _sign(v[k + 1]) > 0.0:
                    continue
                t_lo, t_hi, v_lo = taus[k], taus[k + 1], v[k]
                for _ in range(BISECTIONS):
                    t_mid = 0.5 * (t_lo + t_hi)
                    v_mid = _triple(x0, x1, i, j, t_mid, p0, p1, q0, q1)
                    if _sign(v_mid) == _sign(v_lo):
                        t_lo, v_lo = t_mid, v_mid
                    else:
                        t_hi = t_mid
                tau = 0.5 * (t_lo + t_hi)
                _triple(x0, x1, i, j, tau, p0, p1, q0, q1)
                # a root exactly at a sample closes two intervals: count it once
                if _segment_distance(p0, p1, q0, q1) < TOUCH and not (last >= 0.0 and abs(last - tau) < 1e-9):
                    if count < out_i.shape[0]:
                        out_i[count], out_j[count], out_tau[count] = i, j, tau
                    count += 1
                    last = tau
    return count


def _parted_flags(x: np.ndarray, parted: np.ndarray | None) -> np.ndarray:
    """``parted`` as int8 flags, one per segment of x (none parted if None); a ValueError if it has another shape."""
    flags = np.zeros(x.shape[0] - 1, np.int8) if parted is None else np.ascontiguousarray(parted, dtype=np.int8)
    if flags.shape != (x.shape[0] - 1,):
        raise ValueError(f"parted must have one entry per segment ({x.shape[0] - 1}), got shape {flags.shape}")
    return flags


def crossings(x0: np.ndarray, x1: np.ndarray, exclude: int = 1,
              parted: np.ndarray | None = None) -> list[tuple[int, int, float]]:
    """Every pair of segments (i, j), j - i > exclude, that passes through each other while the vertices move
    linearly from x0 to x1 (n, 3; m), with the fraction tau of the interval where it happens; ordered by i,
    then j, then tau. ``parted`` (n - 1,), nonzero for a segment the thread broke at (solver/breakage.py: no
    material; the state's ``parted`` at the start of the interval): such a segment pairs with nothing, so the
    loose ends of a break swinging through the thread are not counted as tunnelling."""
    x0 = np.ascontiguousarray(x0, dtype=np.float64)
    x1 = np.ascontiguousarray(x1, dtype=np.float64)
    if x0.shape[0] < 2:
        return []
    parted = _parted_flags(x0, parted)
    cap = 64
    while True:
        oi, oj, ot = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap)
        n = _crossings(x0, x1, int(exclude), parted, oi, oj, ot)
        if n <= cap:
            break
        cap = n
    order = np.lexsort((ot[:n], oj[:n], oi[:n]))
    return [(int(oi[k]), int(oj[k]), float(ot[k])) for k in order]


@njit(cache=True)
def _substep_count(x_start, trace, substeps, exclude, parted, out_i, out_j, out_tau) -> int:
    """How many crossings :func:`substep_crossings` finds (out_*: scratch for _crossings)."""
    total = _crossings(x_start, trace[0], exclude, parted, out_i, out_j, out_tau) if substeps > 0 else 0
    for s in range(1, substeps):
        total += _crossings(trace[s - 1], trace[s], exclude, parted, out_i, out_j, out_tau)
    return total


def substep_crossings(x_start: np.ndarray, trace: np.ndarray, substeps: int, exclude: int = 1,
                      parted: np.ndarray | None = None) -> list[tuple[int, int, float]]:
    """The crossings (as :func:`crossings`) of one tick's ``substeps`` substeps: from ``x_start`` (the positions
    at the tick's start) through each of the stepper's ``trace`` rows in turn (Stepper.trace, the positions after
    each substep), each substep's in :func:`crossings`' order. ``parted``: the state's at the tick's start (a break
    is applied after its tick, so its substeps ran on the thread as it was). The tick is counted in one call
    (a check runs after every tick of a long validation); only a tick with crossings is listed substep by
    substep."""
    x_start = np.ascontiguousarray(x_start, dtype=np.float64)
    trace = np.ascontiguousarray(trace, dtype=np.float64)
    if x_start.shape[0] < 2 or substeps <= 0:
        return []
    flags = _parted_flags(x_start, parted)
    scratch = (np.empty(1, np.int64), np.empty(1, np.int64), np.empty(1))
    if _substep_count(x_start, trace, int(substeps), int(exclude), flags, *scratch) == 0:
        return []
    found: list[tuple[int, int, float]] = []
    prev = x_start
    for s in range(substeps):
        found += crossings(prev, trace[s], exclude, parted)
        prev = trace[s]
    return found


def writhe(x: np.ndarray) -> float:
    """The writhe of the open polyline x (n, 3): the Gauss double integral over every pair of non-adjacent
    segments, each pair's term the signed solid angle its two segments subtend at each other over 4 pi
    (Klenin & Langowski 2000, Biopolymers 54:307, method 1a). A plectoneme of k crossings has |writhe| ~ k; a
    plane curve has 0."""
    m = x.shape[0] - 1
    ii, jj = np.triu_indices(m, k=2)
    if len(ii) == 0:
        return 0.0
    p1, p2, p3, p4 = x[ii], x[ii + 1], x[jj], x[jj + 1]
    r13, r14, r23, r24 = p3 - p1, p4 - p1, p3 - p2, p4 - p2
    faces = [(r13, r14), (r14, r24), (r24, r23), (r23, r13)]
    normals = []
    for a, b in faces:
        c = np.cross(a, b)
        norm = np.linalg.norm(c, axis=1)
        normals.append(np.where(norm[:, None] > 1e-300, c / np.where(norm > 1e-300, norm, 1.0)[:, None], 0.0))
    omega = np.zeros(len(ii))
    for k in range(4):
        dot = np.clip(np.einsum("ij,ij->i", normals[k], normals[(k + 1) % 4]), -1.0, 1.0)
        omega += np.arcsin(dot)
    sign = np.sign(np.einsum("ij,ij->i", np.cross(p4 - p3, p2 - p1), r13))
    return float(2.0 * np.sum(omega * sign) / (4.0 * np.pi))
