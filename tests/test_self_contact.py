"""Self-contact response (solver/contact_response.py) and its place in the integrator: the penalty force,
Coulomb friction, the no-crossing floor, and whole scenes checked for tunnelling by tests/crossing.py, which
shares no code with the solver."""
from __future__ import annotations

import math

import numpy as np
import pytest

from suturesim.tools.bench_contact import (CONTACT_3MM, HELD_UNTIL, HELD_UNTIL_3MM, held_knot, held_run, knot,
                                           same_tick)
from suturesim.tools.crossings import crossings, segment_distance, substep_crossings
from suturesim.tools.validate_contact import TracedRun
from suturesim.solver.config import ConfigError
from suturesim.solver.contact_response import (CP_NEAR, CP_SETTLE, CP_SIZE, CP_STALL, CS_CONTACTS, CS_COUNT,
                                               CS_PENETRATION, CS_PROJECTIONS, CS_REBUILDS, CS_REVERTED, CS_ROUNDS,
                                               CS_ROUNDS_OUT, CS_ROUNDS_RAISED, CS_ROUNDS_SLID, CP_MIN_GAP,
                                               apply_friction, enforce_min_gap, floor_pairs, floor_reach,
                                               largest_step, penalty_forces)
from suturesim.solver.integrator import Stepper, friction_rounds
from suturesim.solver.model import ContactSettings
from suturesim.solver.scenario import build_scenario, load_scenario

DD = 0.01          # m, contact distance of the unit cases
KS = 100.0         # N/m


def _par(mu_s=0.0, mu_k=0.0, smooth=0.0, min_gap=0.005):
    # polygon friction off: the two strands of _cross are one 4-vertex thread whose joining segment turns it at
    # the pair's ends, which would scale the normal force friction reads (test_polygon_gain... checks that)
    c = ContactSettings(enabled=True, stiffness=KS, distance=DD, smooth=smooth, min_gap=min_gap,
                        friction_static=mu_s, friction_kinetic=mu_k, skin=DD, recover_speed=100.0,
                        polygon_friction=False)
    p = c.par()
    assert p.shape == (CP_SIZE,)
    # the pair (0-1, 2-3) of _cross is one segment past the excluded ones only in a thread; here it stands for
    # any pair (test_a_straight_strands_next_pair... checks the near pair's own reach)
    p[CP_NEAR] = 0.0
    return p


def _cross(gap: float) -> np.ndarray:
    """Two perpendicular segments, 0-1 along x at z = gap, 2-3 along y at z = 0 (a 4-vertex 'thread' whose
    middle segment 1-2 joins them)."""
    return np.array([[-0.05, 0.0, gap], [0.05, 0.0, gap], [0.0, -0.05, 0.0], [0.0, 0.05, 0.0]])


def _pair_arrays(n_pairs=1):
    z = np.zeros
    return (np.array([0]), np.array([2]), z(n_pairs), z(n_pairs), z((n_pairs, 3)), z(n_pairs), z(n_pairs),
            z(3))


def _penalty(x, x_prev, par):
    ci, cj, cs, ct, cn, cf, cfp, scratch = _pair_arrays()
    force = np.zeros_like(x)
    ck = np.zeros(x.shape[0])
    cd = np.zeros(1)
    touching, pen = penalty_forces(x, x_prev, par, 1, ci, cj, cs, ct, cd, cn, cf, cfp, scratch,
                                   force, ck, _penalty.k_act, np.zeros(x.shape[0]))
    _penalty.k_near = ck
    return force, touching, pen, cs, ct, cn, cf


_penalty.k_act = np.zeros(4)


def test_penalty_is_wang_eq14_at_rest_and_conserves_momentum():
    gap = 0.004
    x = _cross(gap)
    force, touching, pen, s, t, n, f = _penalty(x, x.copy(), _par())
    assert touching == 1
    assert pen == pytest.approx(DD - gap)
    # at rest both ends of the substep have the same gap: E.7 reduces to k_s (dd - |d|) along d / |d|
    assert f[0] == pytest.approx(KS * (DD - gap))
    np.testing.assert_allclose(n[0], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(force[0] + force[1], [0.0, 0.0, KS * (DD - gap)])
    np.testing.assert_allclose(force.sum(axis=0), 0.0, atol=1e-15)          # action = reaction
    # and no torque about any point: the forces act at the same contact point, equal and opposite
    torque = sum(np.cross(x[i], force[i]) for i in range(4))
    np.testing.assert_allclose(torque, 0.0, atol=1e-15)


def test_springs_about_to_engage_count_for_the_stability_bound_before_they_act():
    # 1.5 DD apart and at rest: no force, but within half a skin (DD / 2) of touching, so the bound set at the
    # start of a tick already sees the spring that may engage within it (a silk vertex on k_s rings up otherwise)
    force, touching, _, s, t, _, f = _penalty(_cross(1.4 * DD), _cross(1.4 * DD), _par())
    assert touching == 0 and f[0] == 0.0 and not force.any()
    assert _penalty.k_near.sum() == pytest.approx(4.0 * KS)      # 2 k_s on each strand, split by the weights
    assert not _penalty.k_act.any()                                # nothing acted: the check after a tick ignores it
    _penalty(_cross(1.6 * DD), _cross(1.6 * DD), _par())
    assert not _penalty.k_near.any()
    _penalty(_cross(0.5 * DD), _cross(0.5 * DD), _par())
    assert _penalty.k_act.sum() == pytest.approx(4.0 * KS) and _penalty.k_near.sum() == pytest.approx(4.0 * KS)


def test_a_straight_strands_next_pair_counts_for_the_bound_only_as_its_approach_brings_it_near():
    """Segments j and j + 2 of a straight 3-0 silk strand (1.25 mm segments, 1 mm contact distance, exclude 1)
    lie a quarter of the contact distance past touching, inside the half skin every other pair looks ahead:
    counted, they made every free strand thousands of times heavier under mass scaling (docs/PHYSICS.md Sec. 6).
    Such a pair counts once its approach over REACH_SUBSTEPS substeps would bring it within reach, or once
    within a tenth of the skin."""
    par = _par()
    par[CP_NEAR] = 2.0                          # _cross's pair (0-1, 2-3) is then segments j and j + 2 (exclude 1)
    _penalty(_cross(1.25 * DD), _cross(1.25 * DD), par)
    assert not _penalty.k_near.any()                               # at rest, a quarter of DD off: not counted
    _penalty(_cross(1.08 * DD), _cross(1.08 * DD), par)
    assert _penalty.k_near.sum() == pytest.approx(4.0 * KS)       # within a tenth of the skin (DD here)
    # closing at 0.01 DD per substep: 32 substeps of it reach past touching
    _penalty(_cross(1.25 * DD), _cross(1.26 * DD), par)
    assert _penalty.k_near.sum() == pytest.approx(4.0 * KS)
    # moving apart, or closing too slowly to arrive within the budget: not counted
    _penalty(_cross(1.25 * DD), _cross(1.24 * DD), par)
    assert not _penalty.k_near.any()
    _penalty(_cross(1.25 * DD), _cross(1.251 * DD), par)
    assert not _penalty.k_near.any()


def test_penalty_averages_over_the_substep_so_an_approach_is_felt_before_touching():
    # approaching at 3 mm per substep from 11 mm: the free-flight end of the substep is at 8 mm, inside dd
    x = _cross(0.011)
    x_prev = _cross(0.014)
    _, touching, _, _, _, _, f = _penalty(x, x_prev, _par())
    assert touching == 0
    assert f[0] == pytest.approx(0.5 * KS * (DD - 0.008))     # Wang 2017 Eq. E.7: half of the end's penalty


def test_penalty_onset_is_smooth():
    delta = 0.002
    par = _par(smooth=delta)
    gaps = np.linspace(DD + 0.001, DD - 3 * delta, 400)
    f = np.array([_penalty(_cross(g), _cross(g), par)[6][0] for g in gaps])
    assert f[0] == 0.0 and np.all(np.diff(f) >= -1e-12)
    slope = np.diff(f) / -np.diff(gaps)
    # C1: the slope grows from 0 to k_s without a jump (the largest step between samples is one sample's worth)
    assert slope[0] == pytest.approx(0.0, abs=1e-9)
    assert slope[-1] == pytest.approx(KS)
    assert np.max(np.abs(np.diff(slope))) < 2.0 * KS * (gaps[0] - gaps[1]) / delta
    # beyond the rounded onset the penalty is Wang's linear one, shifted by delta / 2
    assert f[-1] == pytest.approx(KS * (3 * delta - delta / 2))


def _friction_case(slip: float, fn: float, mu_s: float, mu_k: float, h: float = 1e-3):
    """Pair (0-1, 2-3) touching; the upper segment's predicted positions slip by ``slip`` along x."""
    x = _cross(0.004)
    xbar = x.copy()
    xbar[0:2, 0] += slip
    w = np.full(4, 1.0 / 0.001)            # 1 g vertices
    ci, cj, cs, ct, cn, cf, _, _ = _pair_arrays()
    cs[0], ct[0] = 0.5, 0.5
    cn[0] = [0.0, 0.0, 1.0]
    cf[0] = fn
    sticking, _ = apply_friction(x, xbar, w, h, _par(mu_s, mu_k), 1, ci, cj, cs, ct, cn, cf, np.zeros((1, 3)))
    rel = 0.5 * (xbar[0] + xbar[1]) - 0.5 * (xbar[2] + xbar[3]) - (0.5 * (x[0] + x[1]) - 0.5 * (x[2] + x[3]))
    return sticking, rel, xbar


def test_static_friction_holds_within_the_cone():
    # W = 4 * 0.25 / 1 g = 1000 /kg; stopping a 1 um slip over 1 ms takes 1e-6 / (1e-6 * 1000) = 1 mN
    sticking, rel, xbar = _friction_case(slip=1e-6, fn=0.1, mu_s=0.02, mu_k=0.01)   # cone: 2 mN
    assert sticking == 1
    np.testing.assert_allclose(rel, 0.0, atol=1e-18)
    # the friction impulse is internal: the pair's momentum is unchanged
    np.testing.assert_allclose(xbar.sum(axis=0), _cross(0.004).sum(axis=0) + [2e-6, 0, 0], atol=1e-15)


def test_polygon_gain_restores_the_capstan_of_a_turn():
    """A vertex turning the thread by theta between two chords pressed at their middles gains
    exp(asinh(mu sin theta)); polygon_gain's factor sinh(mu theta) / (mu sin theta) on the normal force makes it
    exp(mu theta). A straight run and a thread's end get 1."""
    from suturesim.solver.contact_response import polygon_gain, vertex_turns
    mu = 0.3
    turn = np.zeros(7)
    for deg in (30.0, 60.0, 90.0):
        th = math.radians(deg)
        # a strand turning by th at vertex 1; segment 4 is the middle of a straight post (vertices 3-6)
        x = np.array([[-math.cos(th / 2), -math.sin(th / 2), 0.0], [0.0, 0.0, 0.0],
                      [math.cos(th / 2), -math.sin(th / 2), 0.0]] + [[k - 1.5, 2.0, 0.0] for k in range(4)]) * 1e-3
        vertex_turns(x, turn)
        assert turn[0] == turn[6] == 0.0 and turn[1] == pytest.approx(th, rel=1e-12)
        g = polygon_gain(turn, 0, 1.0, 4, 0.5, mu)
        assert math.exp(math.asinh(g * mu * math.sin(th))) == pytest.approx(math.exp(mu * th), rel=1e-12)
        half = polygon_gain(turn, 0, 0.5, 4, 0.5, mu)     # halfway to the vertex: half the turn
        assert half == pytest.approx(math.sinh(mu * th / 2) / (mu * math.sin(th / 2)), rel=1e-12)
        assert polygon_gain(turn, 4, 0.5, 0, 1.0, mu) == g                                # either strand's turn
    vertex_turns(np.array([[k * 1e-3, 0.0, 0.0] for k in range(7)]), turn)
    assert polygon_gain(turn, 0, 0.5, 4, 0.5, mu) == 1.0


def test_kinetic_friction_opposes_the_slip_with_mu_k_fn():
    h = 1e-3
    sticking, rel, _ = _friction_case(slip=1e-5, fn=0.1, mu_s=0.02, mu_k=0.01, h=h)   # needs 10 mN > 2 mN
    assert sticking == 0
    # the slip shrinks by h^2 W mu_k f_n = 1e-6 * 1000 * 1e-3 = 1 um
    assert rel[0] == pytest.approx(1e-5 - 1e-6)
    assert rel[1] == pytest.approx(0.0, abs=1e-18) and rel[2] == pytest.approx(0.0, abs=1e-18)


def test_a_pairs_friction_starts_warm_from_its_force_of_the_substep_before_within_the_cone():
    """warm_friction: the force kept from the substep before (keep_friction) moves the relative point by
    h^2 W F at the substep's start, its part along the normal dropped and its size clipped to mu_s f_n; the
    pair is then not evaluated on the prediction. A pair that kept nothing, or without CP_WARM every pair, gets
    apply_friction's friction there. The impulse is internal (momentum kept). keep_friction turns friction's
    change back into a force, and keeps none after a substep the guard undid."""
    from suturesim.solver.contact_response import CP_WARM, keep_friction, warm_friction
    h = 1e-3
    x = _cross(0.004)
    w = np.full(4, 1.0 / 0.001)            # 1 g vertices: W = 4 * 0.25 / 1 g = 1000 /kg
    ci, cj, cs, ct, cn, cf, _, _ = _pair_arrays()
    cs[0], ct[0] = 0.5, 0.5
    cn[0] = [0.0, 0.0, 1.0]
    cf[0] = 0.1                            # N: the cone mu_s f_n is 2 mN

    def start(ff, slip=1e-6, warm=True):
        xbar = x.copy()
        xbar[0:2, 0] += slip
        fa = np.full((1, 3), 7.0)          # left over from the substep before: cleared
        par = _par(0.02, 0.01)
        par[CP_WARM] = 1.0 if warm else 0.0
        warm_friction(x, xbar, w, h, par, 1, ci, cj, cs, ct, cn, cf, fa, np.array([ff], float))
        rel = 0.5 * (xbar[0] + xbar[1]) - 0.5 * (xbar[2] + xbar[3]) - (0.5 * (x[0] + x[1]) - 0.5 * (x[2] + x[3]))
        return rel, fa, xbar

    rel, fa, xbar = start([-1e-3, 0.0, 5e-3])             # 1 mN against the slip, and a normal part
    np.testing.assert_allclose(fa[0], [-1e-6, 0.0, 0.0], atol=1e-18)   # h^2 W F = 1e-6 * 1000 * 1 mN
    np.testing.assert_allclose(rel, [1e-6 - 1e-6, 0.0, 0.0], atol=1e-18)   # the slip's 1 um not evaluated
    np.testing.assert_allclose(xbar.sum(axis=0), x.sum(axis=0) + [2e-6, 0, 0], atol=1e-15)
    _, fa, _ = start([-4e-3, 3e-3, 0.0])                  # 5 mN: clipped to the 2 mN cone, its direction kept
    np.testing.assert_allclose(fa[0], [-1.6e-6, 1.2e-6, 0.0], rtol=1e-12)
    for ff, warm in (([0.0, 0.0, 0.0], True), ([-4e-3, 3e-3, 0.0], False)):   # evaluated: the slip stopped
        rel, fa, _ = start(ff, warm=warm)
        np.testing.assert_allclose(rel, 0.0, atol=1e-18)
        np.testing.assert_allclose(fa[0], [-1e-6, 0.0, 0.0], atol=1e-18)
    ff = np.zeros((1, 3))
    keep_friction(w, h, 1, True, ci, cj, cs, ct, cf, np.array([[-1.6e-6, 1.2e-6, 0.0]]), ff)
    np.testing.assert_allclose(ff[0], [-1.6e-3, 1.2e-3, 0.0], rtol=1e-12)    # N
    keep_friction(w, h, 1, False, ci, cj, cs, ct, cf, np.array([[-1.6e-6, 1.2e-6, 0.0]]), ff)
    assert not ff.any()


def test_floor_restores_min_gap_and_keeps_momentum():
    x = _cross(0.001)
    w = np.array([1000.0, 1000.0, 500.0, 500.0])
    m = 1.0 / w
    ci, cj, cs, ct, cn, _, cfp, _ = _pair_arrays()
    cs[0], ct[0] = 0.5, 0.5
    cn[0] = [0.0, 0.0, 1.0]
    p0 = (m[:, None] * x).sum(axis=0)
    cd = np.array([0.001])   # started the substep 1 mm apart: raised by at most recover_speed * h = 0.1 m
    raised = enforce_min_gap(x, w, 1e-3, _par(min_gap=0.005), np.zeros(1, np.int64), 1, ci, cj, cs, ct, cd, cn,
                             cfp)
    assert raised == 1
    assert 0.5 * (x[0, 2] + x[1, 2]) - 0.5 * (x[2, 2] + x[3, 2]) == pytest.approx(0.005)
    np.testing.assert_allclose((m[:, None] * x).sum(axis=0), p0, atol=1e-18)
    assert cfp[0] > 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_floor_on_its_listed_pairs_does_what_a_sweep_over_all_pairs_does(seed):
    """floor_pairs leaves out only pairs the floor would leave alone, and keeps the list's order: on a tight
    knot's neighbour list, with the positions moved at random as far as the listed reach allows, the sweeps
    over the list and over every pair give the same positions and forces bit for bit. A pair left out although
    its gap could reach the floor shows as a difference."""
    sc = load_scenario("wang2017-square-knot", {"contact": {"friction_static": 0.3, "friction_kinetic": 0.25}})
    st = sc.new_state()
    stepper = Stepper(sc.model, st)
    for _ in range(1500):
        stepper.tick()
    par = sc.model.contact_par
    n = int(st.contact_stats[CS_COUNT])
    assert n > 20
    gmin = par[CP_MIN_GAP]
    rng = np.random.default_rng(seed)
    # the three closest pairs pushed together along their normals to 0.7 min_gap (the floor raises them), on top
    # of a random move of up to 0.2 min_gap everywhere
    xbar = st.x + rng.uniform(-1.0, 1.0, st.x.shape) * 0.2 * gmin / math.sqrt(3.0)
    for c in np.argsort(st.cand_d[:n])[:3]:
        a, b = st.cand_i[c], st.cand_j[c]
        push = 0.5 * (st.cand_d[c] - 0.7 * gmin) * st.cand_n[c]
        xbar[a:a + 2] -= push
        xbar[b:b + 2] += push
    # a pair far from the floor that holds a floor force: the floor may take it back, so it must be listed
    far = int(np.argmax(st.cand_d[:n]))
    st.cand_fp[far] = 0.01
    reach = floor_reach(largest_step(xbar, st.x), gmin)
    near = np.zeros(n, np.int64)
    k = floor_pairs(par, n, st.cand_d, st.cand_fp, reach, near)
    assert 0 < k < n and far in near[:k]
    assert all(st.cand_d[c] >= gmin + reach for c in set(range(n)) - set(near[:k]) if c != far)
    w = sc.model.inv_mass
    h = 2.5e-4
    runs = []
    for pairs, count in ((np.arange(n), n), (near, k)):
        xb, fp = xbar.copy(), st.cand_fp.copy()
        raised = enforce_min_gap(xb, w, h, par, pairs, count, st.cand_i, st.cand_j, st.cand_s, st.cand_t,
                                 st.cand_d, st.cand_n, fp)
        runs.append((raised, xb, fp))
    assert runs[0][0] == runs[1][0] and runs[0][0] >= 3
    assert np.array_equal(runs[0][1], runs[1][1]) and np.array_equal(runs[0][2], runs[1][2])


def test_the_crossing_checker_sees_a_crossing_and_only_a_crossing():
    x0 = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0], [1.5, -1, 0.1], [1.5, 1, 0.1]], float)
    through = x0.copy()
    through[4:, 2] -= 0.2
    short = x0.copy()
    short[4:, 2] -= 0.05
    beside = x0.copy()
    beside[4:, 0] += 5.0
    beside[4:, 2] -= 0.2
    assert [c[:2] for c in crossings(x0, through, 1)] == [(1, 4)]
    assert crossings(x0, short, 1) == [] and crossings(x0, beside, 1) == []
    # a segment the thread broke at is no material: its passing through another is no crossing (nor is the
    # other's through it); a break elsewhere changes nothing
    broke_at = lambda j: np.eye(1, x0.shape[0] - 1, j, dtype=np.int8)[0]   # noqa: E731
    assert crossings(x0, through, 1, broke_at(1)) == [] and crossings(x0, through, 1, broke_at(4)) == []
    assert [c[:2] for c in crossings(x0, through, 1, broke_at(2))] == [(1, 4)]
    with pytest.raises(ValueError, match="one entry per segment"):
        crossings(x0, through, 1, np.zeros(3, np.int8))
    d = segment_distance(x0[[1]], x0[[2]], x0[[4]], x0[[5]])
    assert d[0] == pytest.approx(0.1)



def test_the_crossing_checker_finds_a_crossing_whichever_axis_the_thread_lies_along():
    """The sweep runs along the axis the segments spread most on: the same crossing is found, at the same
    instant, with the thread laid along x, y or z; and a tick's substeps, counted in one call, list it in the
    substep it happened in."""
    x0 = np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0], [1.5, -1, 0.1], [1.5, 1, 0.1]], float)
    through = x0.copy()
    through[4:, 2] -= 0.2
    (i, j, tau), = crossings(x0, through, 1)
    for perm in ([1, 0, 2], [2, 1, 0], [1, 2, 0]):
        assert crossings(x0[:, perm], through[:, perm], 1) == [(i, j, tau)]
    # three substeps: still, through, still
    trace = np.stack([x0, through, through, through])
    assert substep_crossings(x0, trace, 3, 1) == [(i, j, tau)]
    assert substep_crossings(x0, trace, 1, 1) == [] and substep_crossings(x0, trace, 0, 1) == []
    assert substep_crossings(x0[:, [2, 0, 1]], np.stack([x0, x0, through])[:, :, [2, 0, 1]], 3, 1) == [(i, j, tau)]

def _run(sc, seconds: float, check: bool = True, exclude: int = 1):
    """Run ``sc`` for ``seconds``; with ``check``, look for crossings between every two consecutive states the
    integrator went through (substeps, traced by the stepper)."""
    st = sc.new_state()
    stepper = Stepper(sc.model, st)
    s = sc.model.solver
    if check:
        stepper.trace = np.zeros((max(s.max_substeps, s.retry_substeps) + 1, st.x.shape[0], 3))
    found = []
    for _ in range(int(round(seconds / s.tick))):
        x0 = st.x.copy()
        n = stepper.tick()
        if check:
            found += substep_crossings(x0, stepper.trace, n, exclude)
    return st, found


def _drag_through(speed: float, contact: bool) -> dict:
    """A 3-0 silk suture (diameter 0.225 mm) laid as two strands: a lower one along x and an upper one along y
    crossing 2 mm above it, both pinned at their ends, the upper one's middle dragged 10 mm straight down
    through the lower one by a grasp at ``speed`` (m/s; 0.5 m/s is 0.5 mm per tick, twice the suture's
    diameter)."""
    # each strand sags 5 mm sideways: a straight string between two pins cannot move across (its constraints
    # would be singular)
    lower = [[-0.03 + 0.003 * i, -0.005 * math.sin(math.pi * i / 20), 0.0] for i in range(21)]
    bend = [[0.03 - 0.003 * k, -0.003 * k, 0.0002 * k + 0.004 * math.sin(math.pi * k / 10)] for k in range(1, 11)]
    upper = [[0.005 * math.sin(math.pi * k / 20), -0.03 + 0.003 * k, 0.002] for k in range(1, 21)]
    pts = np.array(lower + bend + upper)
    grasped = len(lower) + len(bend) + 9          # the upper strand's vertex above (0, 0, 0)
    assert np.allclose(pts[grasped], [0.005, 0.0, 0.002])
    data = {
        "name": "drag-through", "duration": 1.0,
        "thread": {"preset": "silk-3-0", "length": float(np.linalg.norm(np.diff(pts, axis=0), axis=1).sum()),
                   "segments": len(pts) - 1},
        "gravity": [0.0, 0.0, 0.0],
        "shape": {"kind": "points", "points": pts.tolist()},
        # both strands pinned at both ends: no free end can swing round the other strand, nor can the crossing
        # slide off through the bend that joins them
        "boundary": {"pinned": [0, 20, len(lower) + len(bend) - 1, len(pts) - 1],
                     "grasps": [{"id": "g", "vertex": grasped, "stiffness": 500.0, "max_force": 1.0}]},
        "timeline": [{"grasp": "g", "velocity": [0.0, 0.0, -speed], "from": 0.0, "to": 0.01 / speed}],
    }
    if contact:
        data["contact"] = {"stiffness": 1.0}
    return data


@pytest.mark.parametrize("speed", [0.5, 2.0])
def test_a_strand_dragged_fast_never_passes_through_another(speed):
    sc = build_scenario(_drag_through(speed, contact=True), "drag-through")
    st, found = _run(sc, 0.01 / speed + 0.05)
    assert found == []
    cs = st.contact_stats
    assert cs[CS_CONTACTS] >= 1
    # the floor (half the contact distance) held, up to what the last constraint solve after it moved (a few
    # per cent of the distance)
    c = sc.model.contact
    assert cs[CS_PENETRATION] <= c.distance - c.min_gap + 0.05 * c.distance
    # the grasp target went 10 mm down, more than the slack of both strands: the upper strand carried the lower
    # one down with it and now presses on it
    assert st.x[:21, 2].min() < -2e-3


def test_without_contact_the_same_drag_passes_through():
    sc = build_scenario(_drag_through(0.5, contact=False), "drag-through")
    _, found = _run(sc, 0.05)
    assert found, "the checker must see the strand pass through when nothing stops it"


def test_neighbour_list_follows_the_motion():
    sc = build_scenario(_drag_through(2.0, contact=True), "drag-through")
    st, _ = _run(sc, 0.02, check=False)
    assert st.contact_stats[CS_COUNT] >= 1
    # 2 m/s is 2 mm per tick, far more than half the skin: the list was rebuilt within ticks
    assert st.contact_stats[CS_REBUILDS] >= 1


def _counted_rounds(sc, ticks: int) -> np.ndarray:
    """Run ``sc`` for ``ticks``, checking contact_stats' round counters each tick: the rounds run (one at least
    in every substep, at most the budget), those in which the floor raised a gap (one at least where it projected
    any) and in which friction had not settled, and the substeps that ran out of rounds (each one ran the whole
    budget). Returns the four summed."""
    st = sc.new_state()
    stepper = Stepper(sc.model, st)
    c = sc.model.contact
    seen = np.zeros(4)
    for _ in range(ticks):
        n = stepper.tick()
        budget = friction_rounds(c.rounds, c.min_gap, c.settle, sc.model.solver.tick / n)[0]
        cs = st.contact_stats
        run, raised, slid, out = cs[CS_ROUNDS], cs[CS_ROUNDS_RAISED], cs[CS_ROUNDS_SLID], cs[CS_ROUNDS_OUT]
        assert n <= run <= n * budget, (n, run, budget)
        assert raised <= run and slid <= run and out <= n
        assert raised >= 1 or cs[CS_PROJECTIONS] == 0
        assert run >= out * budget + (n - out)
        seen += (run, raised, slid, out)
    return seen


def test_the_rounds_are_counted_with_what_kept_them_going():
    # an overhand knot pulled tight by two hands, then held: friction keeps the rounds going (the floor's force
    # is warm-started from the substep before, so it seldom has a gap to raise), and substeps run out of rounds
    run, _, slid, out = _counted_rounds(held_knot(seconds=2.5), 2500)
    assert run > 2500 * 4 and slid > 0 and out > 0
    # a strand dragged through another at 2 m/s: the floor raises gaps
    _, raised, _, _ = _counted_rounds(build_scenario(_drag_through(2.0, contact=True), "drag-through"), 20)
    assert raised > 0


def test_square_knot_tightens_without_tunnelling():
    sc = load_scenario("wang2017-square-knot")
    st, found = _run(sc, 3.0)
    assert found == []
    assert st.contact_stats[CS_CONTACTS] > 5
    c = sc.model.contact
    assert st.contact_stats[CS_PENETRATION] <= c.distance - c.min_gap + 0.05 * c.distance


def test_contact_is_reported_in_the_state_topic():
    from suturesim.server import protocol
    from suturesim.server.messages import MessageBuilder
    sc = load_scenario("wang2017-square-knot")
    st, _ = _run(sc, 0.01, check=False)
    msg = protocol.decode(MessageBuilder(sc).state(1, st), protocol.TOPIC_STATE)
    assert msg["contacts"] == int(st.contact_stats[CS_CONTACTS]) > 0
    assert msg["solver"]["penetration"] == pytest.approx(st.contact_stats[CS_PENETRATION])
    assert msg["solver"]["projections"] == int(st.contact_stats[CS_PROJECTIONS])


@pytest.mark.parametrize("section, key, message", [
    ({"distance": 0.0}, "distance", "contact distance"),
    ({"min_gap": 0.05}, "min_gap", "must be in"),
    ({"friction_static": 0.1, "friction_kinetic": 0.2}, "friction_kinetic", "at most static"),
    ({"stifness": 1.0}, "stifness", ""),
])
def test_contact_section_errors_name_the_key(section, key, message):
    data = {"name": "c", "thread": {"preset": "wang2017-square-knot", "contact_radius": 0.0125},
            "contact": dict({"stiffness": 50.0}, **section)}
    with pytest.raises(ConfigError) as err:
        build_scenario(data, "c.yaml")
    assert key in str(err.value) and message in str(err.value)


def test_contact_off_without_a_contact_section_and_zero_cost_arrays():
    sc = load_scenario("wang2017-energy")
    assert not sc.model.contact.enabled
    st = sc.new_state()
    assert st.cand_i.shape == (0,)


def test_the_served_scenes_have_contact_on():
    for name in ("default", "two-hand-knot"):
        c = load_scenario(name).model.contact
        assert c.enabled and c.stiffness == 1000.0 and c.friction_static == 0.3


def test_friction_rounds_and_tolerance_follow_a_short_substep():
    # at 4 substeps of a 1 ms tick or fewer, as configured; at 64 the tolerance is 256 times finer (it scales
    # as the slip it answers, h^2) and the rounds 4 times more (integrator.friction_rounds)
    gap, settle = 5e-4, ContactSettings.settle
    assert friction_rounds(6, gap, settle, 1e-3 / 4) == (6, settle * gap)
    assert friction_rounds(6, gap, settle, 1e-3) == (6, settle * gap)
    assert friction_rounds(6, gap, settle / 10, 1e-3 / 4) == (6, pytest.approx(settle * gap / 10))
    rounds, tol = friction_rounds(6, gap, settle, 1e-3 / 64)
    assert rounds == 24 and tol == pytest.approx(settle * gap / 256)
    rounds, tol = friction_rounds(6, gap, settle, 1e-3 / 16)
    assert rounds == 12 and tol == pytest.approx(settle * gap / 16)


def test_contact_settle_reaches_the_kernels_and_is_checked():
    """`contact.settle` (friction's settling tolerance, a fraction of min_gap) is read from a scenario, lands in
    the kernels' parameter vector, and a value out of bounds names its key."""
    base = {"contact": {"distance": 0.001}}
    assert load_scenario("default", base).model.contact_par[CP_SETTLE] == ContactSettings.settle
    m = load_scenario("default", {"contact": {"distance": 0.001, "settle": 1e-4}}).model
    assert m.contact.settle == 1e-4 and m.contact_par[CP_SETTLE] == 1e-4
    for bad in (0.0, -1e-3, 2.0):
        with pytest.raises(ConfigError, match="settle"):
            load_scenario("default", {"contact": {"settle": bad}})


def test_a_knot_held_at_the_styluses_keeps_its_tension_and_stays_live():
    """An overhand knot in two-hand-knot's thread, pulled tight by both hands and held still (the bench's held
    knot, docs/BENCHMARKS.md Sec. 6): under the scene's budget, strands touching at the thread's diameter, no
    segment's tension runs past what the hands pull with, the knot holds, and the thread is never frozen by the
    last-resort guard. With friction started cold the same budget froze the thread in every held tick: a knot
    smaller than a segment, its floor and lengths at a toggle (docs/PHYSICS.md Sec. 7)."""
    run = held_run("as shipped", held_knot(seconds=2.5))
    assert run.diverged is None
    assert 1.0 < run.force < 3.0              # N: tight, below the grasps' 3 N limit
    assert run.tension < 1.2 * run.force      # N
    assert run.undone == 0
    assert abs(run.slip) < 1e-3               # m over the hold


def test_contact_stall_reaches_the_kernels_and_is_checked():
    """`contact.stall` is off by default (every scene but suture-practice runs all its rounds, bit for bit as
    before), lands in the kernels' parameter vector, and a value out of [0, 1] names its key."""
    assert load_scenario("default").model.contact_par[CP_STALL] == 0.0
    assert load_scenario("suture-practice").model.contact_par[CP_STALL] == 0.5
    m = load_scenario("default", {"contact": {"stall": 0.25}}).model
    assert m.contact.stall == 0.25 and m.contact_par[CP_STALL] == 0.25
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="stall"):
            load_scenario("default", {"contact": {"stall": bad}})


def test_a_knot_pulled_as_hard_as_the_device_allows_does_not_pass_through_itself():
    """A trainee pulls a tighter loose knot (torus radii 10 and 4 mm) in two-hand-knot until both couplings
    saturate at 3 N, holds it, and lets the hands come back together. Under the scene's budget no two segments
    cross between any two substeps (tools/crossings.py, which shares no code with the solver), the guard never
    freezes the thread, no tension runs away, and the hands' force falls to nothing once they come back. Strands
    touch at the thread's diameter; with friction started cold such a knot read 189 N and diverged at 2.17 s
    under 2 rounds, and took 4 ms a tick under 32 (docs/PHYSICS.md Sec. 7)."""
    sc0 = held_knot(seconds=2.6, until=1.45)
    data = dict(sc0.source)
    data["shape"] = {**data["shape"], "radius": 0.010, "tube": 0.004}
    data["timeline"] = data["timeline"] + [{"grasp": e["grasp"], "velocity": [-e["velocity"][0], 0.0, 0.0],
                                             "from": 2.1, "to": 2.6} for e in data["timeline"]]
    sc = build_scenario(data, sc0.file)
    run = TracedRun(sc)
    rows = run.run(sc.duration, lambda st: (np.linalg.norm(st.grasp_force[:2], axis=1).min(),
                                            np.abs(st.tension).max(), st.contact_stats[CS_REVERTED]), every=1)
    force, tension, reverted = np.array(rows).T
    assert run.crossings == []
    assert reverted.max() == 0
    assert force[1500:2100].min() > 2.9       # N: both couplings saturated while held
    assert tension.max() < 10.0               # N: the mass-scaled knot's tension peaked at 6.2 N (p99 4.1)
    assert force[-50:].max() < 0.5            # N: the hands back, the thread slack


def _held(warm: bool, diameter: bool):
    """The bench's held knot in two-hand-knot (held_knot, held_run), as shipped (strands touching at the thread's
    diameter) or with strands touching at 3 mm (the scene's contact before) under the same budget (6 rounds, at
    most 4 substeps), friction warm-started or not, for 2.5 s."""
    contact = {"warm_friction": warm, **({} if diameter else CONTACT_3MM)}
    return held_run("held", held_knot(contact=contact, seconds=2.5, until=HELD_UNTIL if diameter else HELD_UNTIL_3MM))


def test_a_held_knots_friction_started_warm_settles_in_a_round_or_two():
    """The held knot with strands touching at 3 mm: friction started each substep from nothing takes turns with the
    solve through all six rounds of most held substeps; started from its force of the substep before
    (contact.warm_friction, the default), the rounds end after one or two (docs/PHYSICS.md Sec. 7)."""
    run = _held(True, False)
    assert run.ran < 2.5 and run.undone == 0 and 1.0 < run.force and run.tension < 1.2 * run.force
    assert _held(False, False).ran > 5.0


def test_a_knot_held_at_the_diameter_is_not_frozen_when_its_friction_starts_warm():
    """The held knot with strands touching at the thread's own diameter (0.225 mm), as shipped. Started from
    nothing, friction leaves the floor unmet when the rounds run out and the guard freezes the thread in every
    held tick (docs/PHYSICS.md Sec. 7). Warm-started, the rounds still run on (the floor and the solve take turns
    in a knot smaller than a segment), but what they leave is met: nothing freezes and no segment's tension runs
    past 1.2 times the pull."""
    run = _held(True, True)
    assert run.undone == 0 and 1.0 < run.force and run.tension < 1.2 * run.force      # N
    cold = _held(False, True)
    assert cold.undone > 0.9 * len(cold.held)                              # every held tick, here


def test_a_substep_the_guard_undid_keeps_the_tensions_and_floor_forces_before_it():
    """Under too few contact rounds (2, at most 8 substeps) and friction started from nothing each substep, the
    held knot's floor is still unmet when they run out, and the last-resort guard puts the whole thread back in
    every substep (warm-started, the rounds settle and nothing is undone). A tick so undone must leave the
    tensions as they were: read from its thrown-away solve, they fed the mass scaling, the masses grew, and the
    next undone solve read more (22 kN at 2 N of pull 0.3 s after the hands stopped; diverged at 11 s). And the
    pairs' floor forces (cand_fp): kept from the undone rounds, they summed without bound (4173 N at 1.8 s, with
    the tensions at 137 N by 2.1 s); given back, 8.6 N and 0.48 N."""
    sc = held_knot(contact={"rounds": 2, "warm_friction": False}, solver={"max_substeps": 8}, seconds=3.0)
    state = sc.new_state()
    stepper = Stepper(sc.model, state)
    free = int(np.count_nonzero(sc.model.kinematic == 0))
    undone = 0
    floor = 0.0
    for _ in range(3000):
        before = state.tension.copy()
        n = stepper.tick()
        if state.contact_stats[CS_REVERTED] == n * free:
            undone += 1
            np.testing.assert_array_equal(state.tension, before)
        floor = max(floor, state.cand_fp[:int(state.contact_stats[CS_COUNT])].max(initial=0.0))
    assert undone > 500
    assert floor < 20.0                          # N
    assert np.abs(state.tension).max() < 10.0    # N


def test_same_tick_times_one_tick_again_and_puts_the_state_back():
    """`bench contact`'s machine-noise row: the tick is run again from one state, which it leaves as it was."""
    sc = knot(40)
    st = sc.new_state()
    stepper = Stepper(sc.model, st)
    for _ in range(20):
        stepper.tick()
    x0, t0 = st.x.copy(), float(st.time[0])
    again = same_tick(stepper, 5)
    assert again.shape == (5,) and np.all(again > 0.0)
    assert np.array_equal(st.x, x0) and float(st.time[0]) == t0
    stepper.tick()
    assert not np.array_equal(st.x, x0)   # the tick it timed moves the knot: it was real work


def test_a_packed_state_holds_every_field_where_its_layout_says_and_a_tick_copy_puts_it_back():
    """ThreadState.packed: the step kernel rebuilds the fields from these buffers and the layout
    (integrator.advance_state), so each field must be the view the layout describes. TickCopy copies the carried
    buffers and the neighbour list's used rows: after it, the state is the one copied from."""
    from suturesim.solver.model import (BUF_CARRIED_B, BUF_CARRIED_F, BUF_CARRIED_I, BUF_SCRATCH_F, BUF_SCRATCH_I,
                                        NEIGHBOUR_LIST, STATE_FIELDS, TickCopy)

    sc = knot(40)
    st = sc.new_state()
    cf, sf, ci, si, cb, lay = st.packed()
    buffers = {BUF_CARRIED_F: cf, BUF_SCRATCH_F: sf, BUF_CARRIED_I: ci, BUF_SCRATCH_I: si, BUF_CARRIED_B: cb}
    for k, name in enumerate(STATE_FIELDS):
        field = getattr(st, name)
        buf, at, rows, cols = lay[k]
        assert field.shape in ((rows,), (rows, cols)) and (field.ndim == 2 or cols == 1), name
        view = buffers[buf][at:at + field.size].reshape(field.shape)
        assert view.dtype == field.dtype and np.array_equal(view, field), name
        assert field.size == 0 or np.shares_memory(view, field), name
    stepper = Stepper(sc.model, st)
    for _ in range(30):
        stepper.tick()
    saved = st.copy()
    TickCopy(st, saved)()          # copies into an independent state of the same model
    for _ in range(10):
        stepper.tick()
    assert not np.array_equal(st.x, saved.x)
    TickCopy(saved, st)()
    count = int(saved.contact_stats[CS_COUNT])
    assert count > 0 and np.array_equal(st.x, saved.x) and np.array_equal(st.tension, saved.tension)
    for name in NEIGHBOUR_LIST:
        assert np.array_equal(getattr(st, name)[:count], getattr(saved, name)[:count]), name


def _crossings_by_roots(x0: np.ndarray, x1: np.ndarray, exclude: int) -> set[tuple[int, int]]:
    """A second way to the same answer, over every pair with no pruning: V(tau) is a cubic, fitted exactly
    through four samples; at each real root in [0, 1] the two segments meet if their distance is ~0."""
    found = set()
    taus = np.array([0.0, 1 / 3, 2 / 3, 1.0])
    for i in range(len(x0) - 1):
        for j in range(i + exclude + 1, len(x0) - 1):
            def at(tau):
                return x0 + tau * (x1 - x0)
            vs = [np.dot(at(t)[i + 1] - at(t)[i], np.cross(at(t)[j] - at(t)[i], at(t)[j + 1] - at(t)[i]))
                  for t in taus]
            for r in np.roots(np.polyfit(taus, vs, 3)):
                if abs(r.imag) < 1e-9 and 0.0 <= r.real <= 1.0:
                    y = at(r.real)
                    if segment_distance(y[[i]], y[[i + 1]], y[[j]], y[[j + 1]])[0] < 1e-9:
                        found.add((i, j))
    return found


def test_the_crossing_checker_finds_what_an_all_pairs_search_finds():
    """Random polylines moved at random by up to a few segment lengths: the pruned search finds exactly the pairs
    an unpruned root search over every pair finds (hundreds of crossings in all)."""
    rng = np.random.default_rng(7)
    total = 0
    for _ in range(60):
        n = int(rng.integers(4, 25))
        x0 = np.cumsum(rng.normal(size=(n, 3)) * 0.01, axis=0)
        x1 = x0 + rng.normal(size=(n, 3)) * rng.choice([0.003, 0.01, 0.03])
        got = crossings(x0, x1, 1)
        assert [c[:2] for c in got] == sorted(c[:2] for c in got)
        assert {c[:2] for c in got} == _crossings_by_roots(x0, x1, 1)
        total += len(got)
    assert total > 100
