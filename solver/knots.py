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
