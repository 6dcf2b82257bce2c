"""Self-contact detection kernels (solver/contact.py): segment closest points against brute force, including the
degenerate cases, and the hashed broad phase against an O(N^2) search on crumpled threads."""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.solver.contact import ContactBuffers, segment_closest, signed_volume


def closest(p0, p1, q0, q1):
    out = np.empty(3)
    segment_closest(*p0, *p1, *q0, *q1, out)
    return out


def brute(p0, p1, q0, q1, k=201):
    s = np.linspace(0, 1, k)
    P = p0 + s[:, None] * (p1 - p0)
    Q = q0 + s[:, None] * (q1 - q0)
    d = np.linalg.norm(P[:, None, :] - Q[None, :, :], axis=2)
    return d.min()


def test_closest_points_match_brute_force_on_random_segments():
    rng = np.random.default_rng(1)
    for _ in range(300):
        p0, p1, q0, q1 = rng.normal(size=(4, 3))
        s, t, d2 = closest(p0, p1, q0, q1)
        assert 0.0 <= s <= 1.0 and 0.0 <= t <= 1.0
        d = np.sqrt(d2)
        # the reported distance is the distance of the reported points ...
        assert d == pytest.approx(np.linalg.norm(p0 + s * (p1 - p0) - q0 - t * (q1 - q0)), abs=1e-12)
        # ... and the minimum: never above the grid's, and below it by at most the grid's resolution
        g = brute(p0, p1, q0, q1)
        res = (np.linalg.norm(p1 - p0) + np.linalg.norm(q1 - q0)) / 200
        assert d <= g + 1e-12 and g - d <= res


@pytest.mark.parametrize("case, expect", [
    # parallel, overlapping, 0.1 apart
    (([0, 0, 0], [1, 0, 0], [0.5, 0.1, 0], [1.5, 0.1, 0]), 0.1),
    # parallel, anti-aligned, no overlap along x: end to end
    (([0, 0, 0], [1, 0, 0], [3, 0.0, 0], [2, 0.0, 0]), 1.0),
    # collinear, overlapping: touching
    (([0, 0, 0], [1, 0, 0], [0.5, 0, 0], [2, 0, 0]), 0.0),
    # crossing
    (([0, 0, 0], [1, 0, 0], [0.5, -0.5, 0], [0.5, 0.5, 0]), 0.0),
    # skew, 0.2 apart above the crossing point
    (([0, 0, 0], [1, 0, 0], [0.5, -0.5, 0.2], [0.5, 0.5, 0.2]), 0.2),
    # a T: the end of one on the middle of the other, 0.05 off
    (([0, 0, 0], [1, 0, 0], [0.5, 0.05, 0], [0.5, 1.0, 0]), 0.05),
    # zero-length both, one, the other
    (([0, 0, 0], [0, 0, 0], [0, 3, 4], [0, 3, 4]), 5.0),
    (([0, 0, 1], [0, 0, 1], [-1, 0, 0], [1, 0, 0]), 1.0),
    (([-1, 0, 0], [1, 0, 0], [2, 0, 0], [2, 0, 0]), 1.0),
    # nearly parallel (1e-12 rad): no blow-up
    (([0, 0, 0], [1, 0, 0], [0, 0.3, 0], [1, 0.3 + 1e-12, 0]), 0.3),
])
def test_closest_points_degenerate_cases(case, expect):
    p0, p1, q0, q1 = (np.array(v, dtype=float) for v in case)
    s, t, d2 = closest(p0, p1, q0, q1)
    assert np.isfinite([s, t, d2]).all() and 0 <= s <= 1 and 0 <= t <= 1
    assert np.sqrt(d2) == pytest.approx(expect, abs=1e-9)
    assert np.sqrt(d2) == pytest.approx(brute(p0, p1, q0, q1, 401), abs=5e-3)


def crumpled(n: int, seg: float, rng) -> np.ndarray:
    """A random-walk thread folded into a small box: many close non-adjacent segments."""
    steps = rng.normal(size=(n - 1, 3))
    steps *= seg / np.linalg.norm(steps, axis=1)[:, None]
    x = np.vstack([np.zeros(3), np.cumsum(steps, axis=0)])
    return np.mod(x, 6 * seg)     # fold into a 6-segment box (jumps make some long segments: also tested)


def all_pairs(x, radius, exclude):
    out = {}
    m = x.shape[0] - 1
    for i in range(m):
        for j in range(i + exclude + 1, m):
            s, t, d2 = closest(x[i], x[i + 1], x[j], x[j + 1])
            if d2 < radius * radius:
                out[(i, j)] = np.sqrt(d2)
    return out


@pytest.mark.parametrize("n, exclude", [(60, 1), (200, 1), (200, 3)])
def test_broad_phase_finds_exactly_the_brute_force_pairs(n, exclude):
    rng = np.random.default_rng(n + exclude)
    seg = 0.01
    x = crumpled(n, seg, rng)
    radius = 0.8 * seg
    buf = ContactBuffers(n, max_pairs=50_000)
    count = buf.find(x, radius, exclude)
    got = {(int(i), int(j)): float(d) for i, j, d in zip(buf.i[:count], buf.j[:count], buf.d[:count])}
    want = all_pairs(x, radius, exclude)
    assert count == len(got) == len(want) and count > 20       # crumpled: there is something to find
    assert got.keys() == want.keys()
    assert max(abs(got[k] - want[k]) for k in want) < 1e-15
    assert all(j - i > exclude for i, j in got)


def test_capacity_overflow_is_reported_not_written_past():
    rng = np.random.default_rng(7)
    x = crumpled(200, 0.01, rng)
    buf = ContactBuffers(200, max_pairs=5)
    count = buf.find(x, 0.008, 1)
    assert count > 5 and buf.i.shape[0] == 5


def test_straight_and_short_threads_have_no_contacts():
    # a contact distance below the segment length (Wang 2017 uses 0.3 L/N) with the neighbours excluded; a
    # longer one must exclude more neighbours: segments i and i + k are (k - 1) l apart on a straight thread
    x = np.column_stack([np.linspace(0, 1, 101), np.zeros(101), np.zeros(101)])
    assert ContactBuffers(101).find(x, 0.003, 1) == 0
    assert ContactBuffers(101).find(x, 0.019, 1) == 98            # every i, i + 2 pair (of 100): 0.01 apart
    assert ContactBuffers(101).find(x, 0.019, 2) == 0
    assert ContactBuffers(2).find(x[:2], 0.5, 1) == 0


def test_signed_volume_changes_sign_when_one_segment_passes_through_the_other():
    p0, p1 = np.array([0.0, 0, 0]), np.array([1.0, 0, 0])
    above = signed_volume(p0, p1, np.array([0.5, -0.5, 0.1]), np.array([0.5, 0.5, 0.1]))
    below = signed_volume(p0, p1, np.array([0.5, -0.5, -0.1]), np.array([0.5, 0.5, -0.1]))
    assert above * below < 0
