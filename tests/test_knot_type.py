"""solver/knot_type.py: the knot a thread is tied in, read from its Jones polynomial, on threads whose knot is
known by construction (torus knots opened out, and two of them tied one after the other); and the strands'
linking (solver/suture.py), read in slices as the knot is."""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.solver.knot_type import MAX_CROSSINGS, knot_type

R_TORUS, r_TUBE = 0.01, 0.004       # m


def torus_knot(n: int, centre: np.ndarray, facing: float, points: int = 240) -> np.ndarray:
    """The (2, n) torus knot round the z axis through ``centre``, opened at its outermost point on the side
    ``facing`` (rad, in the x-y plane): the open polyline from just past that point round to just before it.
    Seen from +z its crossings are all negative (the over-strand crosses the under-strand from left to right):
    n = 3 is the left-handed trefoil (a half knot), n = 5 the left-handed cinquefoil (a double throw)."""
    t = np.linspace(0.0, 2.0 * np.pi, points, endpoint=False)[1:]    # t = 0 is the cut
    phi, theta = 2.0 * t + facing, n * t
    rad = R_TORUS + r_TUBE * np.cos(theta)
    return centre + np.column_stack([rad * np.cos(phi), rad * np.sin(phi), r_TUBE * np.sin(theta)])


def long_knot(a: np.ndarray) -> np.ndarray:
    """One open knot as a thread: 10 cm tails straight on from both ends of the cut."""
    out = (a[0] - a[1]) / np.linalg.norm(a[0] - a[1])
    back = (a[-1] - a[-2]) / np.linalg.norm(a[-1] - a[-2])
    return np.vstack([a[0] + 0.1 * out, a, a[-1] + 0.1 * back])


def two_knots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Knot a (opened facing +x) tied before knot b (opened facing -x), as one thread: a's end joins b's start
    straight across; the thread's ends are tails 10 cm long down -y from a's start and b's end."""
    down = np.array([0.0, -0.1, 0.0])
    return np.vstack([a[0] + down, a, b, b[-1] + down])


def mirror(x: np.ndarray) -> np.ndarray:
    return x * np.array([1.0, 1.0, -1.0])


HERE, THERE = np.array([-0.02, 0.0, 0.0]), np.array([0.02, 0.0, 0.0])


@pytest.mark.parametrize("name, thread, hand", [
    ("unknot", long_knot(torus_knot(1, HERE, 0.0)), ""),
    ("half knot", long_knot(torus_knot(3, HERE, 0.0)), "left"),
    ("half knot", mirror(long_knot(torus_knot(3, HERE, 0.0))), "right"),
    ("double throw", long_knot(torus_knot(5, HERE, 0.0)), "left"),
    ("square knot", two_knots(torus_knot(3, HERE, 0.0), mirror(torus_knot(3, THERE, np.pi))), ""),
    ("granny knot", two_knots(torus_knot(3, HERE, 0.0), torus_knot(3, THERE, np.pi)), "left"),
    ("granny knot", mirror(two_knots(torus_knot(3, HERE, 0.0), torus_knot(3, THERE, np.pi))), "right"),
    ("surgeon's knot", two_knots(torus_knot(5, HERE, 0.0), mirror(torus_knot(3, THERE, np.pi))), "left"),
    ("surgeon's granny", two_knots(torus_knot(5, HERE, 0.0), torus_knot(3, THERE, np.pi)), "left"),
])
def test_knots_of_known_type_are_named(name, thread, hand):
    kt = knot_type(thread)
    assert (kt.name, kt.hand) == (name, hand), kt
    assert kt.crossings <= MAX_CROSSINGS


def test_the_name_does_not_depend_on_where_the_thread_is_or_how_it_is_turned():
    thread = two_knots(torus_knot(3, HERE, 0.0), mirror(torus_knot(3, THERE, np.pi)))
    rng = np.random.default_rng(7)
    for _ in range(5):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        q *= np.sign(np.linalg.det(q))                  # a rotation, not a reflection (that would mirror it)
        kt = knot_type(thread @ q.T + rng.normal(size=3))
        assert kt.name == "square knot", kt


def test_the_trefoil_has_the_textbook_polynomial():
    """V(t) = t + t^3 - t^4 for the right-handed trefoil, whose crossings are positive (Jones 1985); the
    left-handed one's is V(1/t). The crossings' signs are checked first, on one crossing drawn by hand."""
    from suturesim.solver.knot_type import pd_code
    # over-strand from south-west to north-east above the under-strand from south-east to north-west, seen
    # from +z: a positive crossing
    quad = np.array([[0.0, 0.0, 1.0], [2.0, 2.0, 1.0], [2.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    assert pd_code(quad, 4, np.array([0.0, 0.0, 1.0]), np.empty((2, 4), np.int64)) == (1, 1)
    assert knot_type(mirror(long_knot(torus_knot(3, HERE, 0.0)))).jones == ((1, 1), (3, 1), (4, -1))
    assert knot_type(long_knot(torus_knot(3, HERE, 0.0))).jones == ((-4, -1), (-3, 1), (-1, 1))


def test_a_twist_is_not_a_knot():
    """Two strands wound twice round each other (what hands turning round each other make) and a straight
    thread are both the unknot: a twist is not a throw."""
    s = np.linspace(0.0, 1.0, 200)
    a = np.column_stack([0.002 * np.cos(4 * np.pi * s), 0.002 * np.sin(4 * np.pi * s), 0.03 * s])
    b = np.column_stack([-0.002 * np.cos(4 * np.pi * s), -0.002 * np.sin(4 * np.pi * s), 0.03 * s])
    strands = np.vstack([a[::-1], b])                   # joined at the bottom, as the tissue joins them
    assert knot_type(strands).name == "unknot"
    assert knot_type(np.column_stack([s, 0 * s, 0 * s])).name == "unknot"


@pytest.mark.parametrize("budget", [1, 100, 4000])
def test_a_knot_read_in_slices_is_the_knot_read_whole(budget):
    """KnotReading draws the diagram on its first call, adds the state sum up budget // c states per call after
    it and names the knot on the call after the last slice (solver/suture.py spreads a read over ticks, a call a
    tick): the surgeon's knot, its granny and the square knot come out as knot_type reads them whole, after the
    number of calls that takes, and not before."""
    from suturesim.solver.knot_type import KnotReading

    for thread in (two_knots(torus_knot(5, HERE, 0.0), mirror(torus_knot(3, THERE, np.pi))),
                   two_knots(torus_knot(5, HERE, 0.0), torus_knot(3, THERE, np.pi)),
                   two_knots(torus_knot(3, HERE, 0.0), mirror(torus_knot(3, THERE, np.pi)))):
        whole = knot_type(thread)
        reading = KnotReading(thread)
        assert reading.crossings is None and reading.advance(budget) is None   # the diagram
        c = reading.crossings
        assert c == whole.crossings and c >= 6 and reading.result is None
        calls = -(-(1 << c) // max(1, budget // c)) + 1   # the slices, and the name
        for _ in range(calls - 1):
            assert reading.advance(budget) is None
        assert reading.advance(budget) == whole


@pytest.mark.parametrize("budget", [1, 50, 10 ** 6])
def test_a_linking_read_in_slices_is_the_linking_of_the_thread_when_it_began(budget):
    """LinkReading adds whole rows of the first strand, about ``budget`` pairs a call, on its own copy of the
    thread: two rings linked once (a Hopf link, each ring closed, the two joined by a connector the reading
    leaves out) read +-1 after the rows the slices take, and not before, however the thread moves meanwhile."""
    from suturesim.solver.suture import LinkReading, linking

    t = np.linspace(0.0, 2.0 * np.pi, 41)                       # 40 segments, the ring closed
    ring_a = np.column_stack([0.01 * np.cos(t), 0.01 * np.sin(t), 0 * t])
    ring_b = np.column_stack([0.01 + 0.01 * np.cos(t), 0 * t, 0.01 * np.sin(t)])
    x = np.vstack([ring_a, ring_b])
    a1, b0 = 40, 41                                             # segment 40 -> 41 is the connector
    whole = linking(x, 0, a1, b0, x.shape[0] - 1)
    assert abs(abs(whole) - 1.0) < 1e-9
    copy = np.empty_like(x)
    reading = LinkReading(x, a1, b0, copy)
    moved = x.copy()
    x[:] = 0.0                                                  # the thread moves on; the reading has its copy
    rows = max(1, budget // (x.shape[0] - 1 - b0))
    calls = -(-a1 // rows)
    for _ in range(calls - 1):
        assert reading.advance(budget) is None
    assert reading.advance(budget) == pytest.approx(whole, abs=1e-12)
    assert np.array_equal(copy, moved)
