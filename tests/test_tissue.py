"""Tissue (solver/tissue.py): pads held by springs, the thread kept out of them, punctures it slides through.

The drag a puncture puts on a thread drawn through it at constant speed must match the configured law,
D(v) = drag_kinetic + drag_viscous v per puncture, within 5 % (issue 7), and no vertex may lie inside a pad
except in a tunnel between the two punctures of a pass."""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.solver.config import ConfigError
from suturesim.solver.integrator import Stepper
from suturesim.solver.scenario import build_scenario
from suturesim.solver.tissue import (PD_C, PD_COUNT, PD_HALF, PD_INV_MASS, PD_K, PD_REST, PF_DRAG, PF_SIGMA, PI_STATE,
                                     PS_COUNT, PS_F, PS_V, PS_X, PUN_ACTIVE, PUN_FREE, PUN_PASSED, TP_EDGE_MU, TP_RADIUS,
                                     TP_ROUNDS, count_inside, step_pads)

F_S, F_K, C_V = 0.3, 0.2, 1.0   # N, N, N*s/m

# step_pads' grasp arguments when no grasp holds a pad
NO_GRASPS = (np.full(0, -1, np.int64), np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0), np.zeros(0), np.zeros(0),
             np.zeros((0, 3)), np.zeros(0, np.int8))


def inside(model, state) -> int:
    """Vertices inside a pad other than in a tunnel or within the thread's radius of a puncture."""
    return count_inside(state.x, model.rest_length, model.pads, state.pst, state.pun_i, state.pun_f, 0.0,
                        model.tissue_par[TP_RADIUS], 1 if model.needle_on else 0)


def drawn(speed: float = 0.01, pull: str = "driven", max_force: float = 1.0, gravity=(0.0, 0.0, 0.0),
          fixed: bool = True, duration: float = 10.0):
    """A 0.2 m 3-0 silk thread hanging straight down through a 1 cm pad, its top end drawn up at ``speed``
    (m/s) by a driven vertex, or by a grasp whose force is at most ``max_force`` (N)."""
    data = {
        "thread": {"preset": "silk-3-0", "length": 0.2, "segments": 80},
        "gravity": list(gravity),
        "shape": {"kind": "straight", "start": [0.0, 0.0, 0.1], "direction": [0.0, 0.0, -1.0]},
        "tissue": {"pads": [{"id": "pad", "center": [0.0, 0.0, 0.0], "size": [0.02, 0.02, 0.01], "fixed": fixed}],
                   "puncture": {"drag_static": F_S, "drag_kinetic": F_K, "drag_viscous": C_V},
                   "passes": [{"pad": "pad", "entry": [0.0, 0.0, 0.005], "exit": [0.0, 0.0, -0.005]}]},
        "duration": duration,
    }
    if pull == "driven":
        data["boundary"] = {"driven": [0]}
        data["timeline"] = [{"vertex": 0, "velocity": [0.0, 0.0, speed], "from": 0.0, "to": duration}]
    else:
        data["boundary"] = {"grasps": [{"id": "hand", "vertex": 0, "stiffness": 1000.0, "max_force": max_force}]}
        data["timeline"] = [{"grasp": "hand", "velocity": [0.0, 0.0, speed], "from": 0.0, "to": duration}]
    sc = build_scenario(data, "drawn.yaml")
    return sc.model, sc.new_state()


@pytest.mark.parametrize("speed", [0.005, 0.02])
def test_drag_through_a_puncture_matches_the_law(speed):
    model, state = drawn(speed)
    stepper = Stepper(model, state)
    law = F_K + C_V * speed
    tension_above, reaction, drag = [], [], []
    for k in range(1500):
        stepper.tick()
        assert inside(model, state) == 0
        if k >= 500:   # past the breakaway
            j = int(state.pun_f[0, PF_SIGMA])
            tension_above.append(state.tension[j - 2])
            reaction.append(state.pst[0, PS_F + 2])
            drag.append(state.pun_f[:2, PF_DRAG].copy())
    assert np.all(state.pun_i[:2, PI_STATE] == PUN_ACTIVE)
    # what the hand feels above the pad: both punctures' drag; the free thread below carries nothing (g = 0)
    assert np.mean(tension_above) == pytest.approx(2 * law, rel=0.05)
    assert np.max(np.abs(np.array(tension_above) - 2 * law)) < 0.05 * 2 * law
    # the pad is pulled up by what it holds back
    assert np.mean(reaction) == pytest.approx(2 * law, rel=0.05)
    assert np.mean(drag, axis=0) == pytest.approx([law, law], rel=0.05)


def slid_through(max_force: float, seconds: float) -> float:
    """Length of thread (m) a hand pulling with at most ``max_force`` (N) draws through the pad in ``seconds``
    (s), after 0.3 s to take up the pull."""
    model, state = drawn(speed=0.05, pull="grasp", max_force=max_force)
    stepper = Stepper(model, state)
    for _ in range(300):
        stepper.tick()
    s0 = state.pun_f[0, PF_SIGMA]
    for _ in range(int(round(seconds * 1000))):
        stepper.tick()
    return (state.pun_f[0, PF_SIGMA] - s0) * model.rest_length[0]


def test_a_puncture_holds_below_breakaway_and_slides_above_it():
    # a hand that can pull with 0.5 N, less than the two punctures' 2 x 0.3 N breakaway: the thread creeps
    # at most at stick_speed (1 mm/s) * 0.5/0.6
    crept = slid_through(0.5, 1.0)
    assert 0.0 <= crept < 1e-3 * 0.5 / 0.6 * 1.0 + 1e-5
    # with 0.8 N it breaks away and slides at the speed where 2 (0.2 + 1.0 v) = 0.8, v = 0.2 m/s; the hand's
    # target moves at 0.05 m/s, so the grasp catches up and the thread follows the hand
    assert slid_through(0.8, 0.5) == pytest.approx(0.05 * 0.5, rel=0.1)


def test_the_end_passes_through_and_the_punctures_go():
    model, state = drawn(speed=0.1)
    stepper = Stepper(model, state)
    seen = set()
    for _ in range(1300):    # 0.13 m drawn: the lower end (0.1 m below the pad) goes through both
        stepper.tick()
        seen.update(int(v) for v in state.pun_i[:2, PI_STATE])
        assert inside(model, state) == 0
    assert PUN_PASSED in seen
    assert np.all(state.pun_i[:2, PI_STATE] == PUN_FREE)
    assert np.all(state.x[:, 2] > 0.005)   # the whole thread is above the pad now


def test_a_thread_falling_on_a_pad_rests_on_it():
    data = {
        "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 40},
        "shape": {"kind": "straight", "start": [-0.05, 0.0, 0.02], "direction": [1.0, 0.0, 0.0]},
        "tissue": {"pads": [{"id": "pad", "center": [0.0, 0.0, 0.0], "size": [0.06, 0.04, 0.01],
                             "stiffness": 200.0}], "friction": 0.5},
    }
    sc = build_scenario(data, "fall.yaml")
    model, state = sc.model, sc.new_state()
    stepper = Stepper(model, state)
    for _ in range(3000):
        stepper.tick()
        assert inside(model, state) == 0
    on_pad = np.abs(state.x[:, 0]) < 0.03
    r = model.tissue_par[6]
    # the middle lies on the top face; the pad sank a little under the thread's weight, held by its spring (the
    # thread's micro-bounces on the face die out with its air drag, about 1 s)
    top = state.pst[0, PS_X + 2] + 0.005
    above = state.x[on_pad, 2] - (top + r)
    assert np.all(above > -1e-5) and np.all(above < 5e-4)   # on it (friction may leave it arched a hair)
    weight = model.params.mass * 9.81
    assert state.pst[0, PS_X + 2] < 0.0
    assert -state.pst[0, PS_X + 2] * 200.0 == pytest.approx(weight, rel=0.1)


def wound(gap: float = 0.004, pull: float = 0.02):
    """Two sprung pads either side of a wound ``gap`` (m) wide, a thread through both as a simple suture
    leaves it (down through the left pad's top, out of its wound face, across, in through the right pad's
    wound face and up out of its top), both ends drawn up by grasps at ``pull`` (m/s)."""
    half = 0.5 * gap
    a, b = -half - 0.006, half + 0.006
    corners = [[a, 0.0, 0.05], [a, 0.0, 0.0], [-half, 0.0, -0.005], [half, 0.0, -0.005], [b, 0.0, 0.0],
               [b, 0.0, 0.05]]
    length = float(np.linalg.norm(np.diff(np.array(corners), axis=0), axis=1).sum())
    # the wound's edges give sideways (50 N/m) and hardly lift (2000 N/m): tissue is anchored below
    pad = {"size": [0.02, 0.03, 0.01], "mass": 0.01, "stiffness": [50.0, 50.0, 2000.0], "damping": 0.5}
    data = {
        "thread": {"preset": "silk-3-0", "length": length, "segments": 60},
        "gravity": [0.0, 0.0, -9.81],
        "shape": {"kind": "polyline", "points": corners},
        "tissue": {"pads": [dict(pad, id="left", center=[-half - 0.01, 0.0, -0.005]),
                            dict(pad, id="right", center=[half + 0.01, 0.0, -0.005])],
                   "passes": [{"pad": "left", "entry": corners[1], "exit": corners[2]},
                              {"pad": "right", "entry": corners[3], "exit": corners[4]}]},
        "boundary": {"grasps": [{"id": "l", "vertex": 0, "max_force": 1.5}, {"id": "r", "vertex": -1, "max_force": 1.5}]},
        "timeline": [{"grasp": "l", "velocity": [0.0, 0.0, pull], "from": 0.0, "to": 1.0},
                     {"grasp": "r", "velocity": [0.0, 0.0, pull], "from": 0.0, "to": 1.0}],
    }
    sc = build_scenario(data, "wound.yaml")
    return sc.model, sc.new_state()


def gap_of(model, state) -> float:
    return (state.pst[1, PS_X] - model.pads[1, 0]) - (state.pst[0, PS_X] + model.pads[0, 0])


def test_tightening_the_suture_closes_the_gap():
    model, state = wound()
    stepper = Stepper(model, state)
    g0 = gap_of(model, state)
    gaps = []
    for _ in range(2000):
        stepper.tick()
        gaps.append(gap_of(model, state))
        assert inside(model, state) == 0
    assert g0 == pytest.approx(0.004)
    # the edges meet on the thread between them (a crack of 3 thread radii) and do not pass into each other
    assert min(gaps) >= 3.0 * model.tissue_par[TP_RADIUS] - 1e-9
    assert gaps[-1] < 0.1 * g0           # closed (0.34 mm: the crack)
    assert np.all(state.pun_i[:4, PI_STATE] == PUN_ACTIVE)
    # the edges are held together by the suture against the pads' springs: each spring is stretched by
    # about half the gap, 50 N/m x 2 mm = 0.1 N, which the thread's loop must pull
    j = int(round(state.pun_f[1, PF_SIGMA]))     # the wound faces met: the two punctures hold one vertex
    loop = state.tension[j - 1:j + 1]
    assert np.max(loop) > 0.08


def edges_pressed(mu: float, f_t: float, f_n: float = 0.5, mass: float = 0.1, h: float = 2.5e-4,
                  steps: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Two free 1 cm pads of ``mass`` (kg) meeting at the crack (0.3 mm), pressed together along x by f_n (N)
    and sheared along z by f_t (N, +z on the left one, -z on the right one) for ``steps`` substeps of h (s),
    their edges' friction ``mu``. Returns the pads' z velocities (m/s) and x centres (m), one row a substep."""
    crack = 3e-4
    pads = np.zeros((2, PD_COUNT))
    pads[:, PD_HALF:PD_HALF + 3] = 0.005
    pads[:, PD_INV_MASS] = 1.0 / mass
    pads[:, PD_K:PD_K + 3] = 0.0
    pads[:, PD_C] = 0.0
    pads[0, PD_REST] = -0.005 - 0.5 * crack
    pads[1, PD_REST] = 0.005 + 0.5 * crack
    pst = np.zeros((2, PS_COUNT))
    pst[:, PS_X:PS_X + 3] = pads[:, PD_REST:PD_REST + 3]
    vz, xs = [], []
    for _ in range(steps):
        pst[0, PS_F], pst[1, PS_F] = f_n, -f_n
        pst[0, PS_F + 2], pst[1, PS_F + 2] = f_t, -f_t
        step_pads(h, pads, pst, crack, mu, *NO_GRASPS)
        vz.append(pst[:, PS_V + 2].copy())
        xs.append(pst[:, PS_X].copy())
    return np.array(vz), np.array(xs)


def test_the_wound_edges_hold_by_friction_where_they_meet():
    mu, f_n, m, h = 0.6, 0.5, 0.1, 2.5e-4
    # below mu f_n the pressed edges stick: neither slides along the other
    vz, xs = edges_pressed(mu, 0.9 * mu * f_n)
    assert np.abs(vz).max() < 1e-12
    assert xs[-1, 1] - xs[-1, 0] == pytest.approx(0.0103, abs=1e-9)       # still touching at the crack
    # above it they slide (by 1.9 mm over the 25 ms), each pad driven by f_t less the kinetic friction mu f_n
    f_t = 2.0 * mu * f_n
    vz, _ = edges_pressed(mu, f_t)
    t = h * np.arange(1, vz.shape[0] + 1)
    assert vz[-1, 0] == pytest.approx((f_t - mu * f_n) / m * t[-1], rel=0.01)
    assert vz[-1, 1] == pytest.approx(-vz[-1, 0], rel=1e-9)                # momentum kept
    # frictionless (the default), the edges slide freely
    vz, _ = edges_pressed(0.0, f_t)
    assert vz[-1, 0] == pytest.approx(f_t / m * t[-1], rel=1e-9)
    # pulled apart, the edges do not touch and no friction acts
    vz, xs = edges_pressed(mu, f_t, f_n=-f_n)
    assert xs[-1, 1] - xs[-1, 0] > 0.0104
    assert vz[-1, 0] == pytest.approx(f_t / m * t[-1], rel=1e-9)


def test_tissue_config_errors():
    base = {
        "thread": {"preset": "silk-3-0", "length": 0.2, "segments": 80},
        "shape": {"kind": "straight", "start": [0.0, 0.0, 0.1], "direction": [0.0, 0.0, -1.0]},
    }
    pad = {"id": "pad", "center": [0.0, 0.0, 0.0], "size": [0.02, 0.02, 0.01]}
    through = {"pad": "pad", "entry": [0.0, 0.0, 0.005], "exit": [0.0, 0.0, -0.005]}

    def fails(tissue, match):
        with pytest.raises(ConfigError, match=match):
            build_scenario(dict(base, tissue=tissue), "t.yaml")

    fails({"pads": [pad], "puncture": {"drag_static": 0.1, "drag_kinetic": 0.2}, "passes": [through]},
          r"t.yaml: tissue.puncture.drag_kinetic: 0.2 N exceeds drag_static")
    fails({"pads": [pad], "passes": [dict(through, entry=[0.0, 0.0, 0.004])]},
          r"tissue.passes\[0\].entry: must lie on the surface of pad 'pad'")
    fails({"pads": [pad], "passes": [dict(through, entry=[0.005, 0.0, 0.005])]},
          r"tissue.passes\[0\].entry: the thread's initial shape passes 5 mm from this point")
    fails({"pads": [pad]}, r"tissue.pads: the thread's initial shape has vertices inside a pad")
    fails({"pads": [pad], "passes": [dict(through, pad="nope")]}, r"tissue.passes\[0\].pad: no pad 'nope'")
    fails({"pads": [pad, dict(pad, id="b")]}, r"tissue.pads\[1\].center: pad 'b' overlaps pad 'pad'")
    fails({"pads": [dict(pad, size=[0.02, 0.0, 0.01])]}, r"tissue.pads\[0\].size: must be three positive")
    fails({"pads": [dict(pad, colour="red")]}, r"tissue.pads\[0\].colour: unknown key")
    fails({"pads": []}, r"tissue.pads: give at least one pad")
    fails({"pads": [pad], "passes": [through], "rounds": 0}, r"tissue.rounds: must be >= 1")
    fails({"pads": [pad], "passes": [through], "edge_friction": -0.1}, r"tissue.edge_friction: must be >= 0")
    model = build_scenario(dict(base, tissue={"pads": [pad], "passes": [through], "edge_friction": 0.6}),
                           "t.yaml").model
    assert model.tissue_par[TP_EDGE_MU] == 0.6


def test_polyline_shape_puts_a_vertex_on_every_corner():
    corners = [[0.0, 0.0, 0.0], [0.01, 0.0, 0.0], [0.01, 0.01, 0.0]]

    def shape(length, segments):
        return build_scenario({"thread": {"preset": "silk-3-0", "length": length, "segments": segments},
                               "shape": {"kind": "polyline", "points": corners}}, "p.yaml")

    sc = shape(0.03, 6)          # 2 cm of corners, 1 cm straight on past the last one
    x = sc.initial.x
    assert any(np.allclose(v, corners[1]) for v in x) and any(np.allclose(v, corners[2]) for v in x)
    assert sc.model.rest_length.sum() == pytest.approx(0.03) and np.allclose(sc.model.rest_length, 0.005)
    assert np.allclose(x[-1], [0.01, 0.02, 0.0])
    # a length equal to the corners' but for rounding makes no null segment
    assert shape(0.02 + 1e-15, 4).model.rest_length.min() == pytest.approx(0.005)
    with pytest.raises(ConfigError, match=r"shape.points: 2 legs and the rest of the thread past them need at least 3"):
        shape(0.03, 2)
    with pytest.raises(ConfigError, match=r"shape.points: the polyline is 0.02 m long but the thread only 0.01 m"):
        shape(0.01, 4)


def test_the_tissues_rounds_are_counted_with_what_kept_them_going():
    """state.stats' tissue round counters, each tick of the scripted suture's bite: the rounds run (one at least in
    every substep, at most the tissue's budget), those in which the pads, the needle's hold and the needle against
    its thread pushed, and the substeps that ran out (each ran the whole budget, the others one at least)."""
    from suturesim.solver.integrator import (STAT_TISSUE_NEEDLE, STAT_TISSUE_OUT, STAT_TISSUE_PADS,
                                             STAT_TISSUE_ROUNDS, STAT_TISSUE_THREAD)
    from suturesim.solver.scenario import load_scenario

    sc = load_scenario("simple-interrupted-suture")
    st = sc.new_state()
    stepper = Stepper(sc.model, st)
    budget = int(sc.model.tissue_par[TP_ROUNDS])
    seen = np.zeros(5)
    for _ in range(3000):    # the tip into and out of the first edge, and into the second
        n = stepper.tick()
        run, pads, needle, thread, out = (st.stats[k] for k in (STAT_TISSUE_ROUNDS, STAT_TISSUE_PADS,
                                                                STAT_TISSUE_NEEDLE, STAT_TISSUE_THREAD,
                                                                STAT_TISSUE_OUT))
        assert n <= run <= n * budget, (n, run, budget)
        assert max(pads, needle, thread) <= run and out <= n
        assert run >= out * budget + (n - out)
        seen += (run, pads, needle, thread, out)
    # the needle's bite: the tissue holds the needle in most rounds, and the rounds run out
    assert seen[2] > 0.5 * seen[0] and seen[4] > 0, seen
