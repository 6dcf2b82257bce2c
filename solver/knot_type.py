"""Which knot the thread is tied in: its Jones polynomial, and the name of the knot that has it.

An open thread is knotted only once its ends are joined; it is closed here the way a knot tier reads it: each
end goes straight on, away from the thread's centre, to ten times the thread's size, and the two far points are
joined round the far side. Then:

1. **Reduce** the closed polygon (Koniaris & Muthukumar 1991): a vertex whose triangle with its two neighbours
   no other edge pierces can be deleted without passing the curve through itself, so it is, until none can.
   A loose knot of 80 segments comes down to 6-15 vertices.
2. **Project** it along the direction (of a fixed set) that shows the fewest crossings, and write the
   crossings as a planar-diagram code: each crossing's four arcs, counter-clockwise from the incoming
   under-arc.
3. **Kauffman bracket** by the state sum over the crossings' A/B smoothings, normalised by the writhe to the
   Jones polynomial V(t) (Kauffman 1987, Topology 26:395; t = A^-4).

V tells apart every knot a suture can be tied in: the unknot, the half knot (trefoil, either hand), the
double throw of a surgeon's knot (the cinquefoil), the square knot (a trefoil and its mirror image: V is
symmetric in t and 1/t) from the granny (two trefoils of the same hand), and a surgeon's knot from its granny
form. The linking number of the two strands cannot: it counts twists, which any closure undoes.

The kernels work on flat arrays with explicit outputs; `knot_type` allocates and is called a few times a
second at most (solver/suture.py), never in the physics step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

FAR = 10.0             # the closure's far points: this many times the thread's size from its centre
MAX_CROSSINGS = 12     # a diagram with more is not resolved: the state sum doubles with each crossing (12: 0.7 ms)
EPS = 1e-12            # relative tolerance of the triangle test's barycentric bounds
FLAT = 1e-6            # a vertex this close (times the polygon's size) to the line through its neighbours is in line

# projection directions: the three axes and the four body diagonals, then eight unit vectors of a golden-angle
# spiral, so that no polygon lies edge-on to all of them
_DIRS = [(0.0, 0.0, 1.0), (0.0, 1.0, 0.0), (1.0, 0.0, 0.0), (1.0, 1.0, 1.0), (1.0, -1.0, 1.0), (-1.0, 1.0, 1.0),
         (1.0, 1.0, -1.0)]
for _k in range(8):
    _z = 1.0 - (2.0 * _k + 1.0) / 8.0
    _r = math.sqrt(1.0 - _z * _z)
    _DIRS.append((_r * math.cos(2.399963 * _k + 0.3), _r * math.sin(2.399963 * _k + 0.3), _z))
DIRECTIONS = np.array([np.array(d) / np.linalg.norm(d) for d in _DIRS])


@njit(cache=True, error_model="numpy")
def close_far(x: np.ndarray, out: np.ndarray) -> int:
    """Write the thread x (n, 3) closed far away into out (n + 3, 3); returns n + 3. Each end goes straight on
    from the centre of the thread's vertices to FAR times its largest distance from it, and a point far beyond
    the centre on the side of the ends' mean direction joins the two. The thread's vertices are jittered by
    1e-7 of its size (below)."""
    n = x.shape[0]
    cx = cy = cz = 0.0
    for i in range(n):
        cx += x[i, 0]
        cy += x[i, 1]
        cz += x[i, 2]
    cx /= n
    cy /= n
    cz /= n
    size = 0.0
    for i in range(n):
        d = math.sqrt((x[i, 0] - cx) ** 2 + (x[i, 1] - cy) ** 2 + (x[i, 2] - cz) ** 2)
        if d > size:
            size = d
    size = max(size, 1e-9)
    # a fixed jitter of 1e-7 of the thread's size breaks ties the reduction's triangle test cannot judge (a thread
    # lying in one plane: every edge in every triangle's plane); it is far below the gap self-contact keeps
    # between strands, so it changes no crossing
    jit = 1e-7 * size
    for i in range(n):
        for d in range(3):
            h = math.sin(12.9898 * i + 78.233 * d + 1.0) * 43758.5453
            out[i, d] = x[i, d] + jit * (h - math.floor(h) - 0.5)
    ux = uy = uz = 0.0
    for k, end in enumerate((n - 1, 0)):
        dx, dy, dz = x[end, 0] - cx, x[end, 1] - cy, x[end, 2] - cz
        dn = math.sqrt(dx * dx + dy * dy + dz * dz)
        if dn < 1e-300:
            dx, dy, dz, dn = 0.0, 0.0, 1.0, 1.0
        dx /= dn
        dy /= dn
        dz /= dn
        ux += dx
        uy += dy
        uz += dz
        j = n if k == 0 else n + 2
        out[j, 0] = cx + FAR * size * dx
        out[j, 1] = cy + FAR * size * dy
        out[j, 2] = cz + FAR * size * dz
    un = math.sqrt(ux * ux + uy * uy + uz * uz)
    if un < 1e-9:
        # the ends leave in opposite directions: go round by any perpendicular
        ax, ay, az = out[n, 0] - cx, out[n, 1] - cy, out[n, 2] - cz
        if abs(ax) < abs(ay):
            ux, uy, uz = 0.0, -az, ay
        else:
            ux, uy, uz = -az, 0.0, ax
        un = math.sqrt(ux * ux + uy * uy + uz * uz)
    out[n + 1, 0] = cx + 2.0 * FAR * size * ux / un
    out[n + 1, 1] = cy + 2.0 * FAR * size * uy / un
    out[n + 1, 2] = cz + 2.0 * FAR * size * uz / un
    return n + 3


@njit(cache=True, error_model="numpy")
def _pierces(P: np.ndarray, j: int, k: int, a: int, b: int, c: int) -> bool:
    """Whether segment P[j]P[k] meets the closed triangle P[a]P[b]P[c] (Moller & Trumbore 1997, for a segment).
    A segment parallel to the triangle's plane counts as a hit, which keeps the vertex: safe (and, with the
    jitter of close_far, it does not happen)."""
    e1x, e1y, e1z = P[b, 0] - P[a, 0], P[b, 1] - P[a, 1], P[b, 2] - P[a, 2]
    e2x, e2y, e2z = P[c, 0] - P[a, 0], P[c, 1] - P[a, 1], P[c, 2] - P[a, 2]
    dx, dy, dz = P[k, 0] - P[j, 0], P[k, 1] - P[j, 1], P[k, 2] - P[j, 2]
    sx, sy, sz = P[j, 0] - P[a, 0], P[j, 1] - P[a, 1], P[j, 2] - P[a, 2]
    # quick reject: both ends on one side of the triangle's plane
    nx, ny, nz = e1y * e2z - e1z * e2y, e1z * e2x - e1x * e2z, e1x * e2y - e1y * e2x
    s0 = sx * nx + sy * ny + sz * nz
    s1 = s0 + dx * nx + dy * ny + dz * nz
    if (s0 > 0.0 and s1 > 0.0) or (s0 < 0.0 and s1 < 0.0):
        return False
    hx, hy, hz = dy * e2z - dz * e2y, dz * e2x - dx * e2z, dx * e2y - dy * e2x
    det = e1x * hx + e1y * hy + e1z * hz
    if det == 0.0:
        return True
    f = 1.0 / det
    u = f * (sx * hx + sy * hy + sz * hz)
    if u < -EPS or u > 1.0 + EPS:
        return False
    qx, qy, qz = sy * e1z - sz * e1y, sz * e1x - sx * e1z, sx * e1y - sy * e1x
    v = f * (dx * qx + dy * qy + dz * qz)
    if v < -EPS or u + v > 1.0 + EPS:
        return False
    t = f * (e2x * qx + e2y * qy + e2z * qz)
    return -EPS <= t <= 1.0 + EPS


@njit(cache=True, error_model="numpy")
def reduce_polygon(P: np.ndarray, m: int, nxt: np.ndarray, prv: np.ndarray, out: np.ndarray) -> int:
    """Delete vertices of the closed polygon P[:m] while the triangle each makes with its neighbours is pierced
    by no other edge (Koniaris & Muthukumar 1991): the knot type is kept. Writes the rest, in order, to out;
    returns how many (at least 3)."""
    scale = 0.0
    for i in range(m):
        nxt[i] = (i + 1) % m
        prv[i] = (i - 1) % m
        for d in range(3):
            scale = max(scale, abs(P[i, d] - P[0, d]))
    # a vertex closer than this to the line through its neighbours is in line with them: its triangle is a sliver
    # no other strand can pass through (self-contact keeps strands half a millimetre apart)
    flat = (FLAT * scale) ** 2
    alive = m
    start = 0
    changed = True
    while changed and alive > 3:
        changed = False
        i = start
        for _ in range(alive):
            if alive <= 3:
                break
            a = prv[i]
            c = nxt[i]
            ok = True
            # a vertex in line with its neighbours goes without a test
            e1x, e1y, e1z = P[i, 0] - P[a, 0], P[i, 1] - P[a, 1], P[i, 2] - P[a, 2]
            e2x, e2y, e2z = P[c, 0] - P[a, 0], P[c, 1] - P[a, 1], P[c, 2] - P[a, 2]
            area2 = ((e1y * e2z - e1z * e2y) ** 2 + (e1z * e2x - e1x * e2z) ** 2
                     + (e1x * e2y - e1y * e2x) ** 2)
            if area2 > flat * (e2x * e2x + e2y * e2y + e2z * e2z):
                # every edge (j, nxt[j]) but the four that touch the triangle at a vertex
                j = nxt[c]
                while j != prv[a]:
                    if _pierces(P, j, nxt[j], a, i, c):
                        ok = False
                        break
                    j = nxt[j]
            if ok:
                nxt[a] = c
                prv[c] = a
                alive -= 1
                changed = True
                start = c
                i = c
            else:
                i = nxt[i]
    i = start
    for k in range(alive):
        for d in range(3):
            out[k, d] = P[i, d]
        i = nxt[i]
    return alive


@njit(cache=True, error_model="numpy")
def count_crossings(Q: np.ndarray, m: int, dirn: np.ndarray) -> int:
    """Crossings of the closed polygon Q[:m] seen along the unit vector dirn."""
    ex, ey = _frame(dirn)
    c = 0
    for i in range(m):
        for j in range(i + 2, m):
            if i == 0 and j == m - 1:
                continue
            hit, _, _, _ = _cross2d(Q, m, i, j, ex, ey, dirn)
            if hit:
                c += 1
    return c


@njit(cache=True, error_model="numpy")
def fewest_crossings(Q: np.ndarray, m: int, dirs: np.ndarray) -> tuple:
    """(the row of ``dirs`` along which the closed polygon Q[:m] shows the fewest crossings, how many), the first
    such row on a tie. One call for every direction: called from Python once each, the calls cost more than the
    counting of a reduced suture's dozen vertices."""
    best, best_c = 0, 1 << 30
    for d in range(dirs.shape[0]):
        cc = count_crossings(Q, m, dirs[d])
        if cc < best_c:
            best, best_c = d, cc
    return best, best_c


@njit(cache=True, error_model="numpy")
def _frame(dirn: np.ndarray):
    """Two unit vectors completing dirn to a right-handed frame (ex, ey, dirn)."""
    if abs(dirn[0]) < 0.9:
        t = np.array([1.0, 0.0, 0.0])
    else:
        t = np.array([0.0, 1.0, 0.0])
    ex = np.cross(t, dirn)
    ex /= math.sqrt(ex[0] ** 2 + ex[1] ** 2 + ex[2] ** 2)
    ey = np.cross(dirn, ex)
    return ex, ey


@njit(cache=True, error_model="numpy")
def _cross2d(Q: np.ndarray, m: int, i: int, j: int, ex: np.ndarray, ey: np.ndarray, dirn: np.ndarray):
    """Whether edges i and j cross seen along dirn; (hit, t_i, t_j, i is over)."""
    i1 = (i + 1) % m
    j1 = (j + 1) % m
    px = Q[i, 0] * ex[0] + Q[i, 1] * ex[1] + Q[i, 2] * ex[2]
    py = Q[i, 0] * ey[0] + Q[i, 1] * ey[1] + Q[i, 2] * ey[2]
    rx = (Q[i1, 0] - Q[i, 0]) * ex[0] + (Q[i1, 1] - Q[i, 1]) * ex[1] + (Q[i1, 2] - Q[i, 2]) * ex[2]
    ry = (Q[i1, 0] - Q[i, 0]) * ey[0] + (Q[i1, 1] - Q[i, 1]) * ey[1] + (Q[i1, 2] - Q[i, 2]) * ey[2]
    qx = Q[j, 0] * ex[0] + Q[j, 1] * ex[1] + Q[j, 2] * ex[2]
    qy = Q[j, 0] * ey[0] + Q[j, 1] * ey[1] + Q[j, 2] * ey[2]
    sx = (Q[j1, 0] - Q[j, 0]) * ex[0] + (Q[j1, 1] - Q[j, 1]) * ex[1] + (Q[j1, 2] - Q[j, 2]) * ex[2]
    sy = (Q[j1, 0] - Q[j, 0]) * ey[0] + (Q[j1, 1] - Q[j, 1]) * ey[1] + (Q[j1, 2] - Q[j, 2]) * ey[2]
    den = rx * sy - ry * sx
    if abs(den) < 1e-300:
        return False, 0.0, 0.0, False
    t = ((qx - px) * sy - (qy - py) * sx) / den
    u = ((qx - px) * ry - (qy - py) * rx) / den
    if not (0.0 <= t < 1.0 and 0.0 <= u < 1.0):
        return False, 0.0, 0.0, False
    hi = 0.0
    hj = 0.0
    for d in range(3):
        hi += (Q[i, d] + t * (Q[i1, d] - Q[i, d])) * dirn[d]
        hj += (Q[j, d] + u * (Q[j1, d] - Q[j, d])) * dirn[d]
    return True, t, u, hi > hj


@njit(cache=True, error_model="numpy")
def pd_code(Q: np.ndarray, m: int, dirn: np.ndarray, X: np.ndarray) -> tuple:
    """The planar-diagram code of the closed polygon Q[:m] seen along dirn (looking from +dirn): X[k] the arcs
    (a, b, c, d) of crossing k counter-clockwise from the incoming under-arc a (c the outgoing under-arc); arc
    e runs from the e-th to the (e + 1)-th crossing passage along the polygon. Returns (crossings, writhe); -1
    crossings when there are more than X has rows."""
    ex, ey = _frame(dirn)
    cmax = X.shape[0]
    pos_o = np.empty(cmax)
    pos_u = np.empty(cmax)
    turn = np.empty(cmax)   # sign of (under direction x over direction) in the (ex, ey) plane
    c = 0
    for i in range(m):
        for j in range(i + 2, m):
            if i == 0 and j == m - 1:
                continue
            hit, t, u, i_over = _cross2d(Q, m, i, j, ex, ey, dirn)
            if not hit:
                continue
            if c == cmax:
                return -1, 0
            i1 = (i + 1) % m
            j1 = (j + 1) % m
            rx = ry = sx = sy = 0.0
            for d in range(3):
                rx += (Q[i1, d] - Q[i, d]) * ex[d]
                ry += (Q[i1, d] - Q[i, d]) * ey[d]
                sx += (Q[j1, d] - Q[j, d]) * ex[d]
                sy += (Q[j1, d] - Q[j, d]) * ey[d]
            if i_over:
                pos_o[c] = i + t
                pos_u[c] = j + u
                turn[c] = sx * ry - sy * rx      # under (s) x over (r)
            else:
                pos_o[c] = j + u
                pos_u[c] = i + t
                turn[c] = rx * sy - ry * sx      # under (r) x over (s)
            c += 1
    if c == 0:
        return 0, 0
    allpos = np.empty(2 * c)
    allpos[:c] = pos_o[:c]
    allpos[c:] = pos_u[:c]
    order = np.argsort(allpos)
    rank = np.empty(2 * c, np.int64)
    for r in range(2 * c):
        rank[order[r]] = r
    w = 0
    n_arcs = 2 * c
    for k in range(c):
        ro = rank[k]
        ru = rank[c + k]
        a = (ru - 1) % n_arcs
        cc = ru
        f_in = (ro - 1) % n_arcs
        f_out = ro
        if turn[k] > 0.0:
            # the over-strand runs counter-clockwise of the under-strand: from -u counter-clockwise one meets
            # the over-strand's incoming side first
            X[k, 0], X[k, 1], X[k, 2], X[k, 3] = a, f_in, cc, f_out
            w -= 1
        else:
            X[k, 0], X[k, 1], X[k, 2], X[k, 3] = a, f_out, cc, f_in
            w += 1
    return c, w


@njit(cache=True, error_model="numpy")
def _find(parent: np.ndarray, a: int) -> int:
    while parent[a] != a:
        parent[a] = parent[parent[a]]
        a = parent[a]
    return a


@njit(cache=True, error_model="numpy")
def bracket_setup(c: int, coef: np.ndarray, binom: np.ndarray) -> int:
    """Zero the bracket's coefficients ``coef`` (6 c + 5) and fill ``binom`` ((c + 2, c + 2)) with the
    binomials of (-A^2 - A^-2)^(L-1); returns the offset of A^0 in coef, 3 c + 2."""
    for e in range(coef.shape[0]):
        coef[e] = 0
    for n in range(c + 2):
        binom[n, 0] = 1
        for k in range(1, n + 1):
            binom[n, k] = binom[n - 1, k - 1] + (binom[n - 1, k] if k <= n - 1 else 0)
        for k in range(n + 1, c + 2):
            binom[n, k] = 0
    return 3 * c + 2


@njit(cache=True, error_model="numpy")
def bracket(X: np.ndarray, c: int, coef: np.ndarray) -> int:
    """Kauffman bracket <K> of the diagram X[:c] by the state sum: coef[e + off] the coefficient of A^e, off =
    3 c + 2 (coef needs 6 c + 5 entries). Returns off."""
    binom = np.zeros((c + 2, c + 2), np.int64)
    off = bracket_setup(c, coef, binom)
    bracket_states(X, c, coef, binom, np.empty(2 * c, np.int64), 0, 1 << c)
    return off


@njit(cache=True, error_model="numpy")
def bracket_states(X: np.ndarray, c: int, coef: np.ndarray, binom: np.ndarray, parent: np.ndarray, first: int,
                   last: int) -> None:
    """Add the states first ... last - 1 (of 2^c) of the bracket's state sum to ``coef`` (bracket_setup made
    it and ``binom``); ``parent`` (2 c) is scratch. The sum is of integers: any split into slices gives the
    bracket exactly (KnotReading spreads a large one over ticks)."""
    off = 3 * c + 2
    n_arcs = 2 * c
    for state in range(first, last):
        for e in range(n_arcs):
            parent[e] = e
        na = 0
        for k in range(c):
            if (state >> k) & 1:
                # A-smoothing joins a-b and c-d
                p1, q1, p2, q2 = X[k, 0], X[k, 1], X[k, 2], X[k, 3]
                na += 1
            else:
                p1, q1, p2, q2 = X[k, 0], X[k, 3], X[k, 1], X[k, 2]
            r1 = _find(parent, p1)
            s1 = _find(parent, q1)
            if r1 != s1:
                parent[r1] = s1
            r2 = _find(parent, p2)
            s2 = _find(parent, q2)
            if r2 != s2:
                parent[r2] = s2
        loops = 0
        for e in range(n_arcs):
            if _find(parent, e) == e:
                loops += 1
        base = na - (c - na)
        L1 = loops - 1
        sign = -1 if L1 % 2 else 1
        for j in range(L1 + 1):
            coef[base + 2 * L1 - 4 * j + off] += sign * binom[L1, j]


def _reduced(x: np.ndarray) -> np.ndarray:
    """The thread x closed far away and reduced (close_far, reduce_polygon): the polygon's vertices (k, 3)."""
    n = x.shape[0]
    P = np.empty((n + 3, 3))
    m = close_far(np.ascontiguousarray(x, dtype=np.float64), P)
    R = np.empty((m, 3))
    k = reduce_polygon(P, m, np.empty(m, np.int64), np.empty(m, np.int64), R)
    return R[:k]


def _diagram(R: np.ndarray):
    """The planar diagram of the reduced polygon R (_reduced), seen along the direction with the fewest
    crossings: (PD code X (c, 4), c, writhe w), or (None, c, 0) when c is 0 or over MAX_CROSSINGS."""
    k = R.shape[0]
    best, best_c = fewest_crossings(R, k, DIRECTIONS)
    if best_c > MAX_CROSSINGS or best_c == 0:
        return None, best_c, 0
    X = np.empty((best_c, 4), np.int64)
    c, w = pd_code(R, k, DIRECTIONS[best], X)
    return X, c, w


def _jones(coef: np.ndarray, off: int, w: int) -> tuple:
    """V(t) as ((power of t, coefficient), ...) from the bracket's coefficients and the diagram's writhe."""
    # V(t) = (-A^3)^-w <K>, t = A^-4 (Kauffman 1987)
    V: dict[int, int] = {}
    for e in np.flatnonzero(coef):
        a_pow = int(e) - off - 3 * w
        if a_pow % 4:
            raise ArithmeticError("bracket exponent not a multiple of 4 after normalisation")
        V[-a_pow // 4] = V.get(-a_pow // 4, 0) + int(coef[e]) * (-1 if w % 2 else 1)
    return tuple(sorted((p, v) for p, v in V.items() if v))


def _mul(p: dict, q: dict) -> dict:
    r: dict[int, int] = {}
    for a, u in p.items():
        for b, v in q.items():
            r[a + b] = r.get(a + b, 0) + u * v
    return {k: v for k, v in r.items() if v}


def _mirror(p: dict) -> dict:
    return {-k: v for k, v in p.items()}


_T3 = {1: 1, 3: 1, 4: -1}                   # right-handed trefoil
_T5 = {2: 1, 4: 1, 5: -1, 6: 1, 7: -1}      # right-handed cinquefoil, T(2,5)
_F8 = {-2: 1, -1: -1, 0: 1, 1: -1, 2: 1}    # figure-eight
# name, throws, V: a throw is one half knot; a surgeon's double throw is one throw wound twice
KNOTS = [("unknot", 0, {0: 1}),
         ("half knot", 1, _T3), ("half knot", 1, _mirror(_T3)),
         ("double throw", 1, _T5), ("double throw", 1, _mirror(_T5)),
         ("square knot", 2, _mul(_T3, _mirror(_T3))),
         ("granny knot", 2, _mul(_T3, _T3)), ("granny knot", 2, _mirror(_mul(_T3, _T3))),
         ("surgeon's knot", 2, _mul(_T5, _mirror(_T3))), ("surgeon's knot", 2, _mul(_mirror(_T5), _T3)),
         ("surgeon's granny", 2, _mul(_T5, _T3)), ("surgeon's granny", 2, _mirror(_mul(_T5, _T3))),
         ("figure-eight knot", 0, _F8)]


def _hand(v: dict) -> str:
    """"" for a knot that is its own mirror image (V symmetric in t and 1/t); else "right" when V leans to
    positive powers, as the right-handed trefoil's t + t^3 - t^4 does, "left" otherwise."""
    if v == _mirror(v):
        return ""
    return "right" if max(v) + min(v) > 0 else "left"


_BY_JONES = {tuple(sorted(v.items())): (name, throws, _hand(v)) for name, throws, v in KNOTS}


@dataclass(frozen=True)
class KnotType:
    """What `knot_type` found. ``name`` is one of KNOTS' names, "other" (a knot not in the table) or
    "unresolved" (more than MAX_CROSSINGS crossings in every projection tried); ``throws`` the half knots in
    it (None when not named); ``hand`` "left"/"right" for a chiral knot (its mirror image is another knot),
    "" otherwise; ``jones`` V(t) as ((power, coefficient), ...); ``crossings`` of the diagram used."""
    name: str
    throws: int | None
    hand: str
    jones: tuple
    crossings: int


def _named(V: tuple | None, c: int) -> KnotType:
    if V is None:
        return KnotType("unresolved", None, "", (), c)
    name, throws, hand = _BY_JONES.get(V, ("other", None, ""))
    return KnotType(name, throws, hand, V, c)


class KnotReading:
    """One knot read spread over calls, so that no call costs much (solver/suture.py makes one call a tick):
    ``KnotReading(x)`` closes the thread far away and reduces it (about 50 us for the suture's 81 vertices); the
    first ``advance(budget)`` projects it and draws the diagram (``crossings`` is known from then on); each next
    one adds up to ``budget`` crossings' worth of its state sum (budget // c states); the one after the last
    slice names the knot from the sum and returns the KnotType. None before. A 12-crossing diagram's 4096 states
    cost about 0.9 ms in one piece. The sum is exact whatever the slices."""

    def __init__(self, x: np.ndarray):
        self._R: np.ndarray | None = _reduced(x)
        self.crossings: int | None = None
        self.result: KnotType | None = None

    def advance(self, budget: int) -> KnotType | None:
        if self.result is not None:
            return self.result
        if self._R is not None:     # the diagram
            X, c, w = _diagram(self._R)
            self._R = None
            self.crossings = c
            if X is None:
                self.result = _named(((0, 1),) if c == 0 else None, c)
                return self.result
            self._X, self._w = X, w
            self._coef = np.empty(6 * c + 5, np.int64)
            self._binom = np.zeros((c + 2, c + 2), np.int64)
            self._parent = np.empty(2 * c, np.int64)
            self._off = bracket_setup(c, self._coef, self._binom)
            self._next = 0
            return None
        c = self.crossings
        if self._next < 1 << c:     # a slice of the state sum
            last = min(1 << c, self._next + max(1, budget // c))
            bracket_states(self._X, c, self._coef, self._binom, self._parent, self._next, last)
            self._next = last
            return None
        self.result = _named(_jones(self._coef, self._off, self._w), c)   # the name
        return self.result


def knot_type(x: np.ndarray) -> KnotType:
    """The knot the thread x (n, 3), m, is tied in, with its ends joined far away."""
    reading = KnotReading(x)
    while reading.advance(1 << 62) is None:   # the diagram, the whole sum, the name
        pass
    return reading.result


def warm_up() -> None:
    """Load (or compile) every kernel `knot_type` can reach, on a small trefoil: a straight thread would skip
    the diagram and the state sum, and their first call in the loop would then cost a cache load (~20 ms)."""
    t = np.linspace(0.0, 2.0 * np.pi, 37)[1:-1]
    rad = 1.0 + 0.4 * np.cos(3.0 * t)
    loop = np.column_stack([rad * np.cos(2.0 * t), rad * np.sin(2.0 * t), 0.4 * np.sin(3.0 * t)])
    reading = KnotReading(np.vstack([loop[0] + [3.0, -0.2, 0.0], loop, loop[-1] + [3.0, 0.2, 0.0]]))
    while reading.advance(1) is None:   # a state at a time, as a sliced read goes
        pass
    bracket(reading._X, reading.crossings, np.empty(6 * reading.crossings + 5, np.int64))
