"""Loose open knots as initial thread shapes: overhand knots of n = 1..4 (Choi et al. 2021's unknotting number:
the trefoil and its longer cousins), square (reef) and granny knots.

A knot in a thread with free ends is a *long knot*: a knotted stretch with two tails. An overhand knot of
unknotting number n here is the (2, 2n + 1) torus knot r(phi) = ((R + r cos q phi) cos 2 phi,
(R + r cos q phi) sin 2 phi, r sin q phi), q = 2n + 1 (n = 1: the trefoil, 3 crossings; n = 2: 5_1; ...; Choi
2021 Fig. 1: n = (crossings - 1) / 2), cut open at its outermost point (phi = 0, the only point of the curve at
radius R + r): the arc |phi| < cut is removed and the two ends leave radially outward, where no other strand
is, then turn into tails along -x and +x.
Mirroring z flips the knot's handedness. Two trefoils side by side, joined tail to tail, make the composite
knots: opposite handedness is the square (reef) knot, equal handedness the granny knot (Ashley; Adams, The
Knot Book, Sec. 1.2). Because the curve is only deformed (tails added outside the knot's hull), its knot type
is exactly the torus knot's.

A bend (:func:`bend_thread`) is the other kind of knot a suture ends in: the thread's two ends tied together round
a loop, as reef, granny, thief or grief knot (the thesis's knot test, 001 Sec. 4.2.2), woven from two double
helices (:func:`_bend_rope`).

The thread is then laid along this curve in equal chords (:func:`lay_chords`): each vertex is the first point
of the curve one segment length on from the vertex before (a sphere-curve intersection), so every segment has
exactly the thread's rest length; whatever thread is left when the curve ends continues straight along the
last tail. Units: m.
"""
from __future__ import annotations

import math

import numpy as np

KNOT_KINDS = ("overhand", "square", "granny")


def _trefoil(R: float, r: float, handed: int, cut: float, lift: float, samples: int, q: int = 3) -> np.ndarray:
    """An open (2, q) torus knot centred on the origin, its cut at the top (+y): dense points from the left end
    of the cut through the knot to its right end, with a vertical lead of ``lift`` (m) above each end."""
    phi = np.linspace(cut, 2.0 * math.pi - cut, samples)
    rad = R + r * np.cos(q * phi)
    # rotated by +90 degrees about z so that phi = 0 (the outermost point) is at +y
    x = -rad * np.sin(2.0 * phi)
    y = rad * np.cos(2.0 * phi)
    z = handed * r * np.sin(q * phi)
    core = np.stack([x, y, z], axis=1)
    top = R + r + lift
    head = np.array([[core[0, 0], top, core[0, 2]]])
    tail = np.array([[core[-1, 0], top, core[-1, 2]]])
    return np.concatenate([head, core, tail])


def knot_curve(kind: str, R: float, r: float, tail: float, samples: int = 600, n: int = 1) -> np.ndarray:
    """Dense points (k, 3) of a loose open knot of ``kind`` (KNOT_KINDS) with torus radii R > r > 0 (m),
    tails of length ``tail`` (m) along -x (start) and +x (end), at height y = R + r + r. An overhand knot has
    unknotting number ``n`` (the (2, 2n + 1) torus knot)."""
    if kind not in KNOT_KINDS:
        raise ValueError(f"unknown knot {kind!r}; known: {', '.join(KNOT_KINDS)}")
    cut = 0.12 * 3.0 / (2 * n + 1)   # the cut spans the same arc of the tube's winding whatever q
    lift = r
    knots = [_trefoil(R, r, +1, cut, lift, samples * n, 2 * n + 1)]
    if kind != "overhand":
        second = _trefoil(R, r, -1 if kind == "square" else +1, cut, lift, samples)
        second[:, 0] += 2.0 * (R + r) + 2.0 * r    # side by side, a gap of 2 r between their hulls
        knots.append(second)
    top = R + r + lift
    pieces = [np.array([[knots[0][0, 0] - tail, top, knots[0][0, 2]]])]
    for k in knots:
        pieces.append(k)   # the straight join between two knots is the segment from one to the next
    last = knots[-1][-1]
    pieces.append(np.array([[last[0] + tail, top, last[2]]]))
    return np.concatenate(pieces)


def lay_chords(curve: np.ndarray, n_seg: int, seg_len: float) -> np.ndarray:
    """n_seg + 1 vertices (m) along the polyline ``curve`` from its first point, each exactly ``seg_len`` (m)
    from the one before; past the curve's end the thread continues straight along its last direction."""
    pts = np.empty((n_seg + 1, 3))
    pts[0] = curve[0]
    k = 0                      # the curve segment [curve[k], curve[k+1]] the walk is on
    for v in range(1, n_seg + 1):
        c = pts[v - 1]
        found = False
        while k < len(curve) - 1:
            a, b = curve[k], curve[k + 1]
            d = b - a
            if np.linalg.norm(b - c) >= seg_len:
                # the sphere |p - c| = seg_len meets [a, b]: take the root with the largest parameter in [0, 1]
                f = a - c
                qa, qb, qc = d @ d, 2.0 * f @ d, f @ f - seg_len * seg_len
                disc = max(qb * qb - 4.0 * qa * qc, 0.0)
                u = (-qb + math.sqrt(disc)) / (2.0 * qa)
                p = a + min(max(u, 0.0), 1.0) * d
                pts[v] = c + seg_len * (p - c) / np.linalg.norm(p - c)   # the chord exact to round-off
                found = True
                break
            k += 1
        if not found:
            direction = curve[-1] - curve[-2]
            pts[v] = c + seg_len * direction / np.linalg.norm(direction)
    return pts


def min_separation(x: np.ndarray, exclude: int = 1) -> float:
    """The smallest distance (m) between two segments of polyline x that are more than ``exclude`` apart."""
    from .contact import ContactBuffers
    n = x.shape[0]
    span = float(np.linalg.norm(x.max(axis=0) - x.min(axis=0)))
    buf = ContactBuffers(n, max_pairs=n * n)
    count = buf.find(x, span + 1.0, exclude)
    return float(buf.d[:count].min()) if count else math.inf


# --- bends tied round a loop: reef, granny, thief and grief -------------------------------------------------------

BEND_KINDS = ("reef", "granny", "thief", "grief")


def _bend_rope(kind: str, d: float, tail: float, samples: int) -> np.ndarray:
    """Rope A of a loose bend (dense points, m) from its tail end to its standing end; d is the centre-line
    spacing of strands in contact (m), every length below a multiple of it.

    The knot is two interlocked bights (Ashley's reef knot: each rope's bight is collared by the other's).
    Rope A: tail from the left along the top (y = H), its bend at the right (x = +w), back along the bottom
    (y = 0) and out to the left as its standing part. Rope B is A turned half round the y axis, (x, y, z) ->
    (-x, y, -z). Along the weave |x| <= w = 1.5 p, the two top legs form a double helix of radius rho round the
    line y = H, z = 0, and the two bottom legs another round y = 0: each pair crosses three times in projection
    (x = -p, 0, p), six crossings in all, the reef knot's diagram (A passes over, under, over B along both of
    its legs). Both helices winding the same way gives the granny knot (A: over, under, over along the top,
    under, over, under along the bottom), the two knots Ashley tells apart by which way the second throw goes.
    Everything is at least 2 rho = 1.2 d from every other strand, so the knot starts without contact."""
    rho = 0.6 * d                      # helix radius: the strands of a pair are 2 rho apart
    p = 2.5 * d                        # half-period of the weave
    w = 1.5 * p                        # the weave spans |x| <= w; the bights turn just outside it
    rb = 1.0 * d                       # radius of the bend
    H = 2.0 * rho + 2.0 * rb           # height of the top legs' axis
    same = kind in ("granny", "grief")
    xs = np.linspace(-w, w, samples)
    th = math.pi * xs / p
    # top leg, left to right: y = H + rho sin, z = -rho cos (A passes over at x = -p, under at 0, over at p)
    top = np.stack([xs, H + rho * np.sin(th), -rho * np.cos(th)], axis=1)
    # bend at the right: a half circle from (w, H - rho) down to (w, rho), bulging to +x
    ang = np.linspace(0.5 * math.pi, -0.5 * math.pi, samples // 2)
    bend = np.stack([w + rb * np.cos(ang), 0.5 * H + rb * np.sin(ang), np.zeros_like(ang)], axis=1)
    # bottom leg, right to left: y = -rho sin (meets the bend at y = rho), z = -/+ rho cos
    xb = xs[::-1]
    tb = math.pi * xb / p
    zb = (1.0 if same else -1.0) * rho * np.cos(tb)
    bottom = np.stack([xb, -rho * np.sin(tb), zb], axis=1)
    head = np.array([[-w - tail, H + rho, 0.0]])
    foot = np.array([[-w - tail, -rho, 0.0]])
    return np.concatenate([head, top[1:-1], bend, bottom[1:-1], foot])


def bend_curve(kind: str, d: float, tail: float, depth: float, samples: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Dense points (k, 3) of one thread tied into a loose bend of ``kind`` (BEND_KINDS) round a loop, and the
    two points (2, 3) where the loop's sides leave the knot (the standing parts' outer ends, where hands pull).

    The thread runs: rope A's tail -> the knot -> A's standing part -> the loop -> B's standing part -> the knot
    -> B's tail. d: centre-line spacing of strands in contact (m, the contact distance); tail: tail length past
    the knot (m); depth: how far the loop hangs below the knot (m), which sets its length (slack: hands that
    pull the standing parts apart load the knot, not the loop). Reef and granny have both tails on the top side;
    thief and grief (the same knots) take B's top leg as its standing part, so the tails leave on opposite
    sides and the loop runs round B's tail to reach it."""
    if kind not in BEND_KINDS:
        raise ValueError(f"unknown bend {kind!r}; known: {', '.join(BEND_KINDS)}")
    a = _bend_rope("reef" if kind in ("reef", "thief") else "granny", d, tail, samples)
    b = a * np.array([-1.0, 1.0, -1.0])          # rope B: A turned half round the y axis
    w_out = abs(a[0, 0])                          # x of the tails' ends
    rho = 0.6 * d
    H = a[0, 1] - rho
    corner_a = a[-1]                              # A's standing end (left, bottom)
    r = 2.0 * d                                   # radius of the loop's corners
    if kind in ("reef", "granny"):
        # A's standing end -> down -> across -> up -> B's standing end, then B's path backwards to its tail
        corner_b = b[-1]
        loop = _rounded_path([corner_a, corner_a - [0.0, depth, 0.0], corner_b - [0.0, depth, 0.0], corner_b], r)
        rope_b = b[::-1]
    else:
        # B's top leg is its standing part: the loop goes down, across beyond B's tail, up and back in along
        # the top; B is then walked from its top leg's end (b[0]) to its bottom leg's end (the tail)
        corner_b = b[0]
        far = w_out + 3.0 * d
        loop = _rounded_path([corner_a, corner_a - [0.0, depth, 0.0], [far, corner_a[1] - depth, 0.0],
                              [far, H + rho, 0.0], corner_b], r)
        rope_b = b
    curve = np.concatenate([a, loop[1:-1], rope_b])
    return curve, np.array([corner_a, corner_b])


def _rounded_path(corners: list, r: float, per_arc: int = 24) -> np.ndarray:
    """A polyline through ``corners`` (m) with each inner corner replaced by a circular arc of radius r."""
    c = [np.asarray(p, dtype=float) for p in corners]
    out = [c[0]]
    for k in range(1, len(c) - 1):
        u = c[k - 1] - c[k]
        v = c[k + 1] - c[k]
        u /= np.linalg.norm(u)
        v /= np.linalg.norm(v)
        half = 0.5 * math.acos(max(-1.0, min(1.0, float(u @ v))))
        cut = r / math.tan(half)
        p0 = c[k] + cut * u
        p1 = c[k] + cut * v
        bis = u + v
        centre = c[k] + (r / math.sin(half)) * bis / np.linalg.norm(bis)
        a0 = p0 - centre
        a1 = p1 - centre
        for s in np.linspace(0.0, 1.0, per_arc):
            q = (1 - s) * a0 + s * a1
            out.append(centre + r * q / np.linalg.norm(q))
    out.append(c[-1])
    return np.array(out)


def bend_thread(kind: str, n_seg: int, length: float, d: float, tail: float) -> tuple[np.ndarray, tuple[int, int]]:
    """A thread of ``length`` (m) in ``n_seg`` equal chords tied into a loose bend of ``kind`` round a loop
    (bend_curve), the loop as deep as the thread allows. Returns the vertices (n_seg + 1, 3) and the two
    vertices nearest the loop's corners at the knot (where two hands pull the standing parts apart)."""
    base, _ = bend_curve(kind, d, tail, 6.0 * d)
    per_depth = 2.0    # the loop's two sides each grow by the depth
    used = float(np.linalg.norm(np.diff(base, axis=0), axis=1).sum())
    depth = 6.0 * d + (length - used) / per_depth
    if depth < 6.0 * d:
        raise ValueError(f"a {kind} bend with spacing {d:.4g} m and tails of {tail:.4g} m needs more than "
                         f"{used:.4g} m of thread; the thread is {length:.4g} m")
    curve, corners = bend_curve(kind, d, tail, depth)
    pts = lay_chords(curve, n_seg, length / n_seg)
    idx = tuple(int(np.argmin(np.linalg.norm(pts - c, axis=1))) for c in corners)
    return pts, idx
