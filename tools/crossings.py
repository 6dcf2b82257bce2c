"""Independent checks of a thread's topology: whether two segments pass through each other between two
states (:func:`crossings`), and how coiled a thread is (:func:`writhe`).

They share nothing with the solver's contact code (solver/contact.py, contact_response.py): plain numpy over
all pairs, used by the tests and by `suturesim validate` to check the contact response from outside. Between states x0 and x1 every vertex moves on a straight line, x(tau) = x0 + tau (x1 - x0). Two
segments [p0, p1], [q0, q1] can only pass through each other at an instant where they are coplanar, i.e. where
the triple product V(tau) = (p1 - p0) . ((q0 - p0) x (q1 - p0)), a cubic in tau, is zero. So: find every sign
change of V on [0, 1] (sampled finely, then bisected), and at each root test whether the two segments, now in
one plane, actually meet (their distance is zero to round-off). Only pairs that could meet at all are
examined: a pair whose distance at tau = 0 exceeds the largest motion of its vertices cannot touch.
"""
from __future__ import annotations

import numpy as np

SAMPLES = 64        # sign changes of V are looked for between these many instants of the interval
TOUCH = 1e-7        # m: at a coplanar instant, segments closer than this meet


def segment_distance(p0, p1, q0, q1) -> np.ndarray:
    """Distances (m) between segments [p0, p1] and [q0, q1], arrays (k, 3): minimum over the unit square of
    |p0 + s d1 - q0 - t d2|, by checking the interior stationary point and the four edges."""
    d1 = p1 - p0
    d2 = q1 - q0
    r = p0 - q0
    a = np.einsum("ij,ij->i", d1, d1)
    e = np.einsum("ij,ij->i", d2, d2)
    b = np.einsum("ij,ij->i", d1, d2)
    c = np.einsum("ij,ij->i", d1, r)
    f = np.einsum("ij,ij->i", d2, r)

    def dist(s, t):
        w = r + s[:, None] * d1 - t[:, None] * d2
        return np.sqrt(np.einsum("ij,ij->i", w, w))

    safe_a = np.where(a > 0, a, 1.0)
    safe_e = np.where(e > 0, e, 1.0)
    best = np.full(len(a), np.inf)
    det = a * e - b * b
    ok = det > 1e-12 * a * e
    s_in = np.where(ok, (b * f - c * e) / np.where(ok, det, 1.0), -1.0)
    t_in = np.where(ok, (a * f - b * c) / np.where(ok, det, 1.0), -1.0)
    inside = ok & (s_in >= 0) & (s_in <= 1) & (t_in >= 0) & (t_in <= 1)
    best = np.where(inside, dist(np.clip(s_in, 0, 1), np.clip(t_in, 0, 1)), best)
    for s_fix in (0.0, 1.0):                       # edges s = 0, 1: best t for that s
        s = np.full(len(a), s_fix)
        t = np.clip((f + b * s) / safe_e, 0, 1)
        best = np.minimum(best, dist(s, t))
    for t_fix in (0.0, 1.0):                       # edges t = 0, 1: best s for that t
        t = np.full(len(a), t_fix)
        s = np.clip((b * t - c) / safe_a, 0, 1)
        best = np.minimum(best, dist(s, t))
    return best


def _triple(x0, x1, i, j, tau):
    """V(tau) for pairs (i, j), tau (k,) or (k, m)."""
    tau = np.asarray(tau)
    shape = tau.shape

    def at(v):
        a = x0[v]
        d = x1[v] - x0[v]
        if tau.ndim == 2:
            return a[:, None, :] + tau[..., None] * d[:, None, :]
        return a + tau[:, None] * d

    p0, p1, q0, q1 = at(i), at(i + 1), at(j), at(j + 1)
    v = np.einsum("...k,...k->...", p1 - p0, np.cross(q0 - p0, q1 - p0))
    return v.reshape(shape)


_PAIRS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _pairs(m: int, exclude: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j) with j - i > exclude among m segments (cached)."""
    key = (m, exclude)
    if key not in _PAIRS:
        _PAIRS[key] = np.triu_indices(m, k=exclude + 1)
    return _PAIRS[key]


def crossings(x0: np.ndarray, x1: np.ndarray, exclude: int = 1) -> list[tuple[int, int, float]]:
    """Every pair of segments (i, j), j - i > exclude, that passes through each other while the vertices move
    linearly from x0 to x1 (n, 3; m), with the fraction tau of the interval where it happens."""
    n = x0.shape[0]
    ii, jj = _pairs(n - 1, exclude)
    if len(ii) == 0:
        return []
    move = np.linalg.norm(x1 - x0, axis=1)
    seg_move = np.maximum(move[:-1], move[1:])
    # first by bounding spheres (midpoint, half length), then by the exact distance at tau = 0
    mid = 0.5 * (x0[1:] + x0[:-1])
    half = 0.5 * np.linalg.norm(x0[1:] - x0[:-1], axis=1) + seg_move + TOUCH
    dm = mid[ii] - mid[jj]
    reach = half[ii] + half[jj]
    maybe = np.einsum("ij,ij->i", dm, dm) <= reach * reach
    ii, jj = ii[maybe], jj[maybe]
    if len(ii) == 0:
        return []
    d0 = segment_distance(x0[ii], x0[ii + 1], x0[jj], x0[jj + 1])
    near = d0 <= seg_move[ii] + seg_move[jj] + TOUCH
    ii, jj = ii[near], jj[near]
    if len(ii) == 0:
        return []
    taus = np.linspace(0.0, 1.0, SAMPLES + 1)
    v = _triple(x0, x1, ii, jj, np.broadcast_to(taus, (len(ii), SAMPLES + 1)))
    found = []
    sign = np.sign(v)
    k_pair, k_step = np.nonzero(sign[:, :-1] * sign[:, 1:] <= 0)
    if len(k_pair) == 0:
        return []
    lo = taus[k_step].copy()
    hi = taus[k_step + 1].copy()
    pi, pj = ii[k_pair], jj[k_pair]
    vlo = _triple(x0, x1, pi, pj, lo)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        vm = _triple(x0, x1, pi, pj, mid)
        left = np.sign(vm) == np.sign(vlo)
        lo = np.where(left, mid, lo)
        vlo = np.where(left, vm, vlo)
        hi = np.where(left, hi, mid)
    tau = 0.5 * (lo + hi)
    xa = x0[None] + tau[:, None, None] * (x1 - x0)[None]
    k = np.arange(len(tau))
    dist = segment_distance(xa[k, pi], xa[k, pi + 1], xa[k, pj], xa[k, pj + 1])
    for a, b, t, d in zip(pi, pj, tau, dist):
        # a root exactly at a sample closes two intervals: count it once
        if d < TOUCH and not (found and found[-1][:2] == (a, b) and abs(found[-1][2] - t) < 1e-9):
            found.append((int(a), int(b), float(t)))
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
