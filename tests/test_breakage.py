"""A thread pulled past its rated strength breaks where its tension peaks, and both pieces go on
(solver/breakage.py): no constraint, bending, twist or contact across the break, each piece inextensible, the
momentum kept, the `break` event and the `state` message's `parted`, a reset that mends it."""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.server import protocol
from suturesim.server.messages import MessageBuilder
from suturesim.server.scene import SceneRunner
from suturesim.solver.breakage import BREAK_TICKS, part, pieces, whole
from suturesim.solver.diagnostics import energies
from suturesim.solver.integrator import Stepper
from suturesim.solver.presets import load_preset
from suturesim.solver.scenario import build_scenario


def held_and_pulled(max_force: float, strength: float | None = 2.0, preset: str = "silk-3-0",
                    contact: bool = False, travel: float = 0.01):
    """20 cm of thread (40 segments) along x, vertex 0 pinned, a stylus on vertex 24 pulled ``travel`` (m) out
    along x at 5 cm/s with the coupling limited to ``max_force`` (N): segments 0-23 carry the pull, the tail
    beyond the stylus hangs slack. ``strength``: the thread's knot_pull_strength (N; None: the preset's)."""
    thread = {"preset": preset, "length": 0.2, "segments": 40}
    if strength is not None:
        thread["knot_pull_strength"] = strength
    data = {"name": "break", "duration": 2.0, "thread": thread,
            "shape": {"kind": "straight", "direction": [1.0, 0.0, 0.0]},
            "boundary": {"pinned": [0], "grasps": [{"id": "s", "vertex": 24, "stiffness": 1000.0,
                                                     "max_force": max_force}]},
            "contact": {"enabled": contact},
            "timeline": [{"grasp": "s", "velocity": [0.05, 0.0, 0.0], "from": 0.1, "to": 0.1 + travel / 0.05}]}
    return build_scenario(data, "break.yaml")


def run_until_break(sc, ticks: int = 800):
    state = sc.new_state()
    stepper = Stepper(sc.model, state)
    peaks = []
    for k in range(ticks):
        stepper.tick()
        if stepper.broke >= 0:
            return stepper, state, k, peaks
        peaks.append((int(np.argmax(state.tension)), float(state.tension.max())))
    return stepper, state, -1, peaks


def test_a_pull_past_the_rating_breaks_the_thread_where_the_tension_peaks():
    sc = held_and_pulled(max_force=3.0)
    stepper, state, k, peaks = run_until_break(sc)
    assert k > 0, "the thread did not break"
    j = stepper.broke
    assert j < 24                                   # between the pin and the stylus: the pulled part
    # the tension stayed above the rating for BREAK_TICKS ticks, and the segment that parted is where it peaked
    assert all(t > 2.0 for _, t in peaks[-(BREAK_TICKS - 1):])
    assert stepper.broke_tension > 2.0
    assert stepper.broke_tension == pytest.approx(max(t for _, t in peaks[-1:]), rel=0.05)
    assert state.parted[j] == 1 and not whole(state)
    assert state.tension[j] == 0.0
    assert pieces(state.parted) == [(0, j), (j + 1, 40)]


def test_below_the_rating_the_thread_holds():
    sc = held_and_pulled(max_force=1.8)
    stepper, state, k, peaks = run_until_break(sc, ticks=1500)
    assert k == -1
    assert max(t for _, t in peaks) > 1.7        # really pulled near the rating
    assert whole(state)


def test_a_thread_without_a_rating_never_breaks():
    sc = held_and_pulled(max_force=5.0, strength=None, preset="wang2017-fig4")   # a paper's rod: no rating
    assert sc.model.params.knot_pull_strength == np.inf
    _, state, k, peaks = run_until_break(sc, ticks=1000)
    assert k == -1 and max(t for _, t in peaks) > 4.0


def test_both_pieces_go_on_inextensible_and_unjoined():
    sc = held_and_pulled(max_force=3.0)
    stepper, state, k, _ = run_until_break(sc)
    j = stepper.broke
    for _ in range(500):
        stepper.tick()
    assert stepper.broke == -1                      # the pull is gone with the piece: no second break
    length = np.linalg.norm(np.diff(state.x, axis=0), axis=1)
    rest = sc.model.rest_length
    keep = np.arange(40) != j
    assert np.max(np.abs(length[keep] - rest[keep]) / rest[keep]) < 1e-6    # each piece inextensible
    assert length[j] > 5.0 * rest[j]                # the pieces came apart: the stylus took the far one away
    assert state.tension[j] == 0.0 and state.twist[0] == 0.0
    # the bending energy counts no hinge across the break
    assert np.isfinite(energies(sc.model, state)["elastic"])


def test_a_break_keeps_the_momentum_of_a_free_thread():
    data = {"name": "free", "duration": 1.0, "gravity": [0.0, 0.0, 0.0],
            "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 20, "air_drag": 0.0,
                       "air_drag_linear": 0.0, "knot_pull_strength": 100.0},
            "shape": {"kind": "helix", "radius": 0.01, "pitch": 0.02},
            "contact": {"enabled": False}}
    sc = build_scenario(data, "free.yaml")
    state = sc.new_state()
    rng = np.random.default_rng(3)
    h = state.h[0]
    state.x_prev[:] = state.x - h * rng.normal(scale=0.05, size=state.x.shape)
    stepper = Stepper(sc.model, state)
    stepper.tick()
    p0 = (sc.model.mass[:, None] * (state.x - state.x_prev)).sum(axis=0) / state.h[0]
    part(state, 9)
    for _ in range(300):
        stepper.tick()
    p1 = (sc.model.mass[:, None] * (state.x - state.x_prev)).sum(axis=0) / state.h[0]
    np.testing.assert_allclose(p1, p0, atol=1e-12 + 1e-9 * np.abs(p0).max())
    length = np.linalg.norm(np.diff(state.x, axis=0), axis=1)
    keep = np.arange(20) != 9
    assert np.max(np.abs(length[keep] - sc.model.rest_length[keep])) < 1e-9


def test_a_parted_segment_touches_nothing_and_a_reset_mends_the_thread():
    sc = held_and_pulled(max_force=3.0, contact=True)
    initial = sc.new_state()
    stepper, state, k, _ = run_until_break(sc)
    j = stepper.broke
    stepper.tick()
    n = int(state.contact_stats[0])
    assert not np.any(state.cand_i[:n] == j) and not np.any(state.cand_j[:n] == j)
    initial.copy_into(state)
    assert whole(state) and not state.parted.any()


def test_the_break_is_an_event_and_the_state_says_where():
    sc = held_and_pulled(max_force=3.0)
    state = sc.new_state()
    stepper = Stepper(sc.model, state)
    builder = MessageBuilder(sc)
    events = []
    runner = SceneRunner(stepper, builder, None, 1, event=lambda kind, **d: events.append((kind, d)))
    for seq in range(800):
        runner.tick(seq)
        if events and events[-1][0] == "break":
            break
    kind, d = events[-1]
    assert kind == "break"
    j = d["segment"]
    assert j == stepper.broke and d["strength"] == 2.0 and d["tension"] > 2.0
    assert d["arc"] == pytest.approx((j + 0.5) * 0.005)
    msg = protocol.decode_state(builder.state(seq, state))
    assert msg["parted"] == [j]
    with pytest.raises(protocol.ProtocolError, match="state.parted"):
        bad = protocol.encode_state(0, 0.0, state.x, state.tension, 0.0, [], 0,
                                    {"kinetic": 0.0, "elastic": 0.0, "gravity": 0.0},
                                    {"iters": 0, "residual": 0.0, "substeps": 1}, parted=[40])
        protocol.decode_state(bad)


def test_the_fine_preset_breaks_within_a_stylus_reach():
    p = load_preset("nylon-6-0")
    assert 1.5 < p.knot_pull_strength < 2.5          # USP 6-0: within a Touch's 3.3 N
    # 12 cm of nylon pulled 3 cm: 25 % strain asks 4 N of its EA = 17 N
    sc = held_and_pulled(max_force=3.0, strength=None, preset="nylon-6-0", travel=0.03)
    stepper, _, k, _ = run_until_break(sc, ticks=1200)
    assert k > 0 and stepper.broke_tension > p.knot_pull_strength
