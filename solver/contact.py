"""Self-contact detection: which non-adjacent segments of the thread are closer than a distance, and where. The
integrator's neighbour list is built with these kernels (solver/contact_response.py rebuild_neighbours); what
contacts do to the thread is solver/contact_response.py.

* Narrow phase: the closest points of two segments, robust for parallel, collinear and zero-length segments
  (:func:`segment_closest`). The distance between segments P(s) = p0 + s (p1 - p0) and Q(t) = q0 + t (q1 - q0),
  s, t in [0, 1], is a convex quadratic in (s, t); its minimum is either interior, where both partial
  derivatives vanish, or on an edge of the unit square, where one parameter is clamped and the other solves a
  1-D problem. Solving for s first from the unconstrained system, clamping it, then computing t for that s and
  clamping t (re-solving s when t was clamped) reaches the minimum in every case; when the segments are
  parallel the system is singular (the determinant a e - b^2 vanishes) and any s is optimal, so s = 0 is taken.
* Broad phase: a uniform grid hashed into a table of N to 2N buckets, a power of two (:func:`find_contacts`).
  Every segment goes into the cell of its midpoint; the cell size is the longest segment plus the contact
  distance, so two segments closer than the contact distance have midpoints at most one cell apart on each
  axis, and each segment is tested against its own cell and the 13 neighbouring cells on one side (the other
  13 see it from theirs), so each pair is met once; a pair whose midpoints are further apart than the contact
  distance plus the longest segment is dropped before its closest points are computed. With the thread's
  segments of bounded length and its vertices not piling up, each cell holds O(1) segments: O(N) expected
  work, no allocation (every buffer lives in :class:`ContactBuffers`).
* Segments sharing a vertex, or within ``exclude`` segments of each other along the thread, are never paired:
  neighbours along the thread are kept apart by bending, not by contact.

Units: positions in m, distances in m. Kernels compile with ``cache=True``; call :func:`warm_up` before a
real-time loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

_EPS = 1e-300   # below this a squared length is a point


@njit(cache=True, error_model="numpy", inline="always")
def segment_closest(p0x, p0y, p0z, p1x, p1y, p1z, q0x, q0y, q0z, q1x, q1y, q1z, out):
    """Closest points of segments [p0, p1] and [q0, q1] (m): writes (s, t, squared distance m^2) into
    ``out[0:3]``; the points are p0 + s (p1 - p0) and q0 + t (q1 - q0)."""
    dx, dy, dz = p1x - p0x, p1y - p0y, p1z - p0z          # d1
    ex, ey, ez = q1x - q0x, q1y - q0y, q1z - q0z          # d2
    rx, ry, rz = p0x - q0x, p0y - q0y, p0z - q0z          # r = p0 - q0
    a = dx * dx + dy * dy + dz * dz
    e = ex * ex + ey * ey + ez * ez
    f = ex * rx + ey * ry + ez * rz
    if a <= _EPS and e <= _EPS:
        s = 0.0
        t = 0.0
    elif a <= _EPS:
        s = 0.0
        t = min(max(f / e, 0.0), 1.0)
    else:
        c = dx * rx + dy * ry + dz * rz
        if e <= _EPS:
            t = 0.0
            s = min(max(-c / a, 0.0), 1.0)
        else:
            b = dx * ex + dy * ey + dz * ez
            denom = a * e - b * b
            # parallel (denom ~ 0 relative to a e): every s is optimal up to the clamp of t; take s = 0
            if denom > 1e-14 * a * e:
                s = min(max((b * f - c * e) / denom, 0.0), 1.0)
            else:
                s = 0.0
            t = (b * s + f) / e
            if t < 0.0:
                t = 0.0
                s = min(max(-c / a, 0.0), 1.0)
            elif t > 1.0:
                t = 1.0
                s = min(max((b - c) / a, 0.0), 1.0)
    wx = (p0x + s * dx) - (q0x + t * ex)
    wy = (p0y + s * dy) - (q0y + t * ey)
    wz = (p0z + s * dz) - (q0z + t * ez)
    out[0] = s
    out[1] = t
    out[2] = wx * wx + wy * wy + wz * wz


@njit(cache=True, error_model="numpy", inline="always")
def closest_if_near(x, j, a0x, a0y, a0z, a1x, a1y, a1z, reach, out) -> bool:
    """Segment j of ``x`` (x[j], x[j+1]) against the segment [a0, a1] (m): False if their midpoints are further
    apart than ``reach`` (m; a quick reject), else True with their closest points in ``out`` (segment_closest)."""
    mx = 0.5 * (x[j, 0] + x[j + 1, 0]) - 0.5 * (a0x + a1x)
    my = 0.5 * (x[j, 1] + x[j + 1, 1]) - 0.5 * (a0y + a1y)
    mz = 0.5 * (x[j, 2] + x[j + 1, 2]) - 0.5 * (a0z + a1z)
    if mx * mx + my * my + mz * mz > reach * reach:
        return False
    segment_closest(x[j, 0], x[j, 1], x[j, 2], x[j + 1, 0], x[j + 1, 1], x[j + 1, 2], a0x, a0y, a0z, a1x, a1y, a1z,
                    out)
    return True


@njit(cache=True, error_model="numpy", inline="always")
def segment_move(x, xn, j) -> float:
    """How far the farther-moving end of segment j went from ``x`` to ``xn`` (m)."""
    return max(math.sqrt((xn[j, 0] - x[j, 0]) ** 2 + (xn[j, 1] - x[j, 1]) ** 2 + (xn[j, 2] - x[j, 2]) ** 2),
               math.sqrt((xn[j + 1, 0] - x[j + 1, 0]) ** 2 + (xn[j + 1, 1] - x[j + 1, 1]) ** 2
                         + (xn[j + 1, 2] - x[j + 1, 2]) ** 2))


# the 13 neighbour offsets after (0, 0, 0) in lexicographic order: half of the 26, one of each opposite pair
_FORWARD = np.array([(ox, oy, oz) for ox in (-1, 0, 1) for oy in (-1, 0, 1) for oz in (-1, 0, 1)
                     if (ox, oy, oz) > (0, 0, 0)], dtype=np.int64)


@njit(cache=True, error_model="numpy", inline="always")
def tangential(vx: float, vy: float, vz: float, nx: float, ny: float, nz: float) -> tuple:
    """The part of (vx, vy, vz) square to the unit normal (nx, ny, nz), and its length: (tx, ty, tz, |t|)."""
    vn = vx * nx + vy * ny + vz * nz
    tx = vx - vn * nx
    ty = vy - vn * ny
    tz = vz - vn * nz
    return tx, ty, tz, math.sqrt(tx * tx + ty * ty + tz * tz)


@njit(cache=True, error_model="numpy", inline="always")
def _cell(v: float, inv: float) -> int:
    return int(np.floor(v * inv))


@njit(cache=True, error_model="numpy", inline="always")
def _hash(ix: int, iy: int, iz: int, mask: int) -> int:
    # large primes mixing the three coordinates (Teschner et al. 2003's spatial hash), then the low bits: the
    # table is a power of two, so no integer division in the 14 bucket visits per segment
    return ((ix * 73856093) ^ (iy * 19349663) ^ (iz * 83492791)) & mask


@njit(cache=True, error_model="numpy")
def find_contacts(x: np.ndarray, radius: float, exclude: int, head: np.ndarray, nxt: np.ndarray,
                  cells: np.ndarray, scratch: np.ndarray, pair_i: np.ndarray, pair_j: np.ndarray,
                  pair_s: np.ndarray, pair_t: np.ndarray, pair_d: np.ndarray) -> int:
    """Every pair of segments (i < j, j - i > ``exclude``) of the polyline ``x`` (n, 3; m) whose distance is
    below ``radius`` (m), with the closest-point parameters s (on i), t (on j) and the distance (m). Writes up to
    ``pair_i.shape[0]`` pairs in the order found and returns how many pairs exist (which may exceed the
    capacity: the caller sees it was too small). ``head`` (table size), ``nxt`` and ``cells``
    (m, 3) are scratch for m = n - 1 segments; ``scratch`` holds 3 floats."""
    n = x.shape[0]
    m = n - 1
    if m < 2:
        return 0
    longest = 0.0
    for k in range(m):
        d0 = x[k + 1, 0] - x[k, 0]
        d1 = x[k + 1, 1] - x[k, 1]
        d2 = x[k + 1, 2] - x[k, 2]
        longest = max(longest, np.sqrt(d0 * d0 + d1 * d1 + d2 * d2))
    # two segments closer than radius have midpoints closer than longest + radius: one cell apart at most
    size_cell = longest + radius
    if size_cell <= 0.0:
        size_cell = 1.0
    inv = 1.0 / size_cell
    table = 1
    while 2 * table <= head.shape[0]:
        table *= 2
    mask = table - 1
    for b in range(table):
        head[b] = -1
    for k in range(m):
        ix = _cell(0.5 * (x[k, 0] + x[k + 1, 0]), inv)
        iy = _cell(0.5 * (x[k, 1] + x[k + 1, 1]), inv)
        iz = _cell(0.5 * (x[k, 2] + x[k + 1, 2]), inv)
        cells[k, 0] = ix
        cells[k, 1] = iy
        cells[k, 2] = iz
        b = _hash(ix, iy, iz, mask)
        nxt[k] = head[b]
        head[b] = k
    r2 = radius * radius
    # segments closer than radius have midpoints closer than radius + longest: a cheap test before the
    # closest points, which most pairs of neighbouring cells fail
    reach2 = (radius + longest) * (radius + longest)
    count = 0
    cap = pair_i.shape[0]
    for i in range(m):
        ci0, ci1, ci2 = cells[i, 0], cells[i, 1], cells[i, 2]
        mx = x[i, 0] + x[i + 1, 0]
        my = x[i, 1] + x[i + 1, 1]
        mz = x[i, 2] + x[i + 1, 2]
        # the own cell and the 13 cells after it in (x, y, z) order: every pair of neighbouring cells is
        # visited from one side only, so each pair of segments is met once (in the own cell: when j > i)
        for k in range(14):
            ox, oy, oz = 0, 0, 0
            if k > 0:
                ox, oy, oz = _FORWARD[k - 1, 0], _FORWARD[k - 1, 1], _FORWARD[k - 1, 2]
            cx, cy, cz = ci0 + ox, ci1 + oy, ci2 + oz
            j = head[_hash(cx, cy, cz, mask)]
            while j >= 0:
                # a bucket shared by two cells (a hash collision) is filtered by the cell check; neighbours
                # along the thread are never paired
                dmx = 0.5 * (mx - x[j, 0] - x[j + 1, 0])
                dmy = 0.5 * (my - x[j, 1] - x[j + 1, 1])
                dmz = 0.5 * (mz - x[j, 2] - x[j + 1, 2])
                if (cells[j, 0] == cx and cells[j, 1] == cy and cells[j, 2] == cz
                        and (j > i + exclude or (k > 0 and j < i - exclude))
                        and dmx * dmx + dmy * dmy + dmz * dmz < reach2):
                    a, b = (i, j) if i < j else (j, i)
                    segment_closest(x[a, 0], x[a, 1], x[a, 2], x[a + 1, 0], x[a + 1, 1], x[a + 1, 2],
                                    x[b, 0], x[b, 1], x[b, 2], x[b + 1, 0], x[b + 1, 1], x[b + 1, 2], scratch)
                    if scratch[2] < r2:
                        if count < cap:
                            pair_i[count] = a
                            pair_j[count] = b
                            pair_s[count] = scratch[0]
                            pair_t[count] = scratch[1]
                            pair_d[count] = np.sqrt(scratch[2])
                        count += 1
                j = nxt[j]
    return count


@dataclass
class ContactBuffers:
    """Scratch and output of :func:`find_contacts` for a thread of ``n_vertices``, at most ``max_pairs``
    contacts reported per call."""
    n_vertices: int
    max_pairs: int = 4096

    def __post_init__(self):
        m = max(self.n_vertices - 1, 1)
        self.head = np.empty(2 * m + 1, dtype=np.int64)
        self.nxt = np.empty(m, dtype=np.int64)
        self.cells = np.empty((m, 3), dtype=np.int64)
        self.scratch = np.empty(3)
        self.i = np.empty(self.max_pairs, dtype=np.int64)
        self.j = np.empty(self.max_pairs, dtype=np.int64)
        self.s = np.empty(self.max_pairs)
        self.t = np.empty(self.max_pairs)
        self.d = np.empty(self.max_pairs)

    def find(self, x: np.ndarray, radius: float, exclude: int = 1) -> int:
        """Contacts of positions ``x`` (n, 3; m) closer than ``radius`` (m); returns the count (the first
        ``min(count, max_pairs)`` are in ``i, j, s, t, d``)."""
        return find_contacts(x, radius, exclude, self.head, self.nxt, self.cells, self.scratch, self.i, self.j,
                             self.s, self.t, self.d)


@njit(cache=True, error_model="numpy")
def signed_volume(p0: np.ndarray, p1: np.ndarray, q0: np.ndarray, q1: np.ndarray) -> float:
    """(p1 - p0) . ((q0 - p0) x (q1 - p0)) (m^3): six times the signed volume of the tetrahedron of two
    segments. It changes sign exactly when one segment passes through the line of the other, so a sign
    change between two instants with the segments touching in between is a crossing (tests' independent
    tunnelling check)."""
    ax, ay, az = p1[0] - p0[0], p1[1] - p0[1], p1[2] - p0[2]
    bx, by, bz = q0[0] - p0[0], q0[1] - p0[1], q0[2] - p0[2]
    cx, cy, cz = q1[0] - p0[0], q1[1] - p0[1], q1[2] - p0[2]
    return ax * (by * cz - bz * cy) + ay * (bz * cx - bx * cz) + az * (bx * cy - by * cx)


def warm_up() -> None:
    """Compile (or load from the cache) every kernel here, on a tiny thread."""
    x = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
    ContactBuffers(x.shape[0], 8).find(x, 0.2)
    signed_volume(x[0], x[1], x[2], x[3])
