"""A grasp on a point inside a segment (grasp_frac f > 0): it holds (1 - f) x[v] + f x[v+1] by the same
implicit spring-damper a vertex grasp has (integrator.couple_point). At rest the point sits off the target by the
coupling's stretch, the reported force is k (p - c) and equals the thread's pull; a free thread gains exactly the
impulse of the reported forces; past max_force the pull is max_force."""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.solver import diagnostics, integrator
from suturesim.solver.forces import constraint_force_at
from suturesim.solver.integrator import Stepper
from suturesim.solver.scenario import build_scenario

SEG = 0.005                                 # m: 10 cm of 3-0 silk in 20 segments
TARGET = np.array([0.023225, 0.04371, 0.0])  # m: 5.0 cm from where the grasped point starts, 49.5 mm from the pin


def pinned(frac: float, v: int = 9, k: float = 1000.0, c: float = 0.5, max_force: float = 10.0,
           halves: bool = False):
    """The thread pinned at vertex 0 along x, gravity off, held at the point ``frac`` along segment ``v`` (or,
    ``halves``, by two grasps of half the stiffness and damping on v and v+1), the target moved in 0.5 s to
    TARGET: past the held point's reach (47.5 mm at v = 9, f = 0.5), so the thread ends taut."""
    start = [(v + frac) * SEG, 0.0, 0.0]
    if halves:
        grasps = [{"id": gid, "vertex": u, "stiffness": k / 2, "damping": c / 2, "max_force": max_force}
                  for gid, u in (("a", v), ("b", v + 1))]
    else:
        grasps = [{"id": "s", "vertex": v, "stiffness": k, "damping": c, "max_force": max_force, "target": start}]
    data = {"name": "held", "duration": 3.0, "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 20},
            "shape": {"kind": "straight", "direction": [1.0, 0.0, 0.0]}, "gravity": [0.0, 0.0, 0.0],
            "contact": {"enabled": False}, "boundary": {"pinned": [0], "grasps": grasps},
            "timeline": [{"grasp": g["id"], "move_to": TARGET.tolist(), "from": 0.0, "to": 0.5} for g in grasps]}
    sc = build_scenario(data, "held.yaml")
    state = sc.new_state()
    if not halves:
        state.grasp_frac[0] = frac
    return sc.model, state


def run(model, state, ticks: int) -> None:
    stepper = Stepper(model, state)
    for _ in range(ticks):
        stepper.tick()


def point(state, v: int, f: float) -> np.ndarray:
    return (1.0 - f) * state.x[v] + f * state.x[v + 1]


def test_a_point_held_by_a_stiff_coupling_sits_at_the_target_and_feels_the_threads_pull():
    k, v, f = 1000.0, 9, 0.5
    model, state = pinned(f, v, k)
    run(model, state, 3000)
    c = point(state, v, f)
    force = state.grasp_force[0]
    # steady: the thread taut from the pin through the held point, which lies at its arc length from the pin
    assert np.linalg.norm(c) == pytest.approx((v + f) * SEG, rel=1e-9)
    stretch = np.linalg.norm(TARGET) - (v + f) * SEG            # 2.0 mm
    assert np.linalg.norm(TARGET - c) == pytest.approx(stretch, rel=1e-6)
    assert np.linalg.norm(force) / k == pytest.approx(stretch, rel=1e-6)     # the coupling's stretch: F / k
    assert np.allclose(force, k * (TARGET - c), rtol=0, atol=1e-6)           # the reported force is k (p - c)
    # the thread's pull: its net constraint force on the held segment's vertices, and the taut segments' tension
    on_v, on_next = np.zeros(3), np.zeros(3)
    constraint_force_at(state.x, state.tension, v, on_v)
    constraint_force_at(state.x, state.tension, v + 1, on_next)
    assert np.allclose(force, -(on_v + on_next), rtol=0, atol=1e-6)
    assert np.allclose(state.tension[:v], np.linalg.norm(force), rtol=1e-6)
    # the held segment carries only the share f the far vertex passes on
    assert state.tension[v] == pytest.approx(f * np.linalg.norm(force), rel=1e-6)


def test_a_point_grasp_pulls_as_two_half_stiffness_vertex_grasps_at_rest():
    model, state = pinned(0.5)
    run(model, state, 3000)
    model2, state2 = pinned(0.5, halves=True)
    run(model2, state2, 3000)
    both = state2.grasp_force[0] + state2.grasp_force[1]
    assert np.allclose(state.grasp_force[0], both, rtol=0, atol=1e-5)
    assert np.allclose(point(state, 9, 0.5), point(state2, 9, 0.5), rtol=0, atol=1e-8)


def test_the_axial_force_at_a_point_grasp_is_the_pull():
    from suturesim.server.messages import MessageBuilder

    model, state = pinned(0.5)
    run(model, state, 3000)
    sc = build_scenario({"name": "held", "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 20}}, "h.yaml")
    builder = MessageBuilder(sc, grasps=[])
    pull = np.linalg.norm(state.grasp_force[0])
    assert builder.axial(state, 9, 0.5) == pytest.approx(pull, rel=1e-6)
    assert builder.axial(state, 9) == pytest.approx(0.5 * pull, rel=1e-6)   # vertex 9 alone: its share


def free(frac: float, max_force: float, v: int = 9):
    """The thread free in space (no gravity, no air drag, contact off), a grasp at ``frac`` along segment ``v``
    whose target moves at 0.2 m/s across the thread for 0.1 s."""
    data = {"name": "free", "duration": 1.0,
            "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 20, "air_drag": 0.0,
                       "air_drag_linear": 0.0},
            "shape": {"kind": "straight", "direction": [1.0, 0.0, 0.0]}, "gravity": [0.0, 0.0, 0.0],
            "contact": {"enabled": False},
            "boundary": {"grasps": [{"id": "s", "vertex": v, "stiffness": 200.0, "damping": 0.05,
                                     "max_force": max_force, "target": [(v + frac) * SEG, 0.0, 0.0]}]},
            "timeline": [{"grasp": "s", "velocity": [0.05, 0.2, 0.0], "from": 0.0, "to": 0.1}]}
    sc = build_scenario(data, "free.yaml")
    state = sc.new_state()
    state.grasp_frac[0] = frac
    return sc.model, state


@pytest.mark.parametrize("frac, max_force", [(0.3, 10.0), (0.3, 0.002), (0.0, 10.0)])
def test_a_free_thread_gains_the_impulse_of_the_reported_grasp_forces(frac, max_force):
    """One substep per step() call, so each reported force is the whole of its step's: the momentum the thread
    gains is the sum of force * h to round-off, coupled implicitly (10 N) or saturated (2 mN), as for a vertex
    grasp (f = 0, the reference)."""
    model, state = free(frac, max_force)
    h = 1e-4
    p0 = diagnostics.linear_momentum(model, state).copy()
    impulse = np.zeros(3)
    saturated = 0
    for _ in range(2000):
        integrator.step(model, state, 1, h)
        impulse += state.grasp_force[0] * h
        saturated += int(state.grasp_sat[0])
    gained = diagnostics.linear_momentum(model, state) - p0
    assert np.linalg.norm(impulse) > 1e-7                      # kg m/s: it did pull
    assert np.abs(gained - impulse).max() <= 2e-9 * np.abs(impulse).max()
    assert (saturated > 0) == (max_force < 1.0)


def test_a_point_grasp_past_its_limit_pulls_with_max_force_along_the_stretch():
    """Undamped (c = 0): a saturated coupling's pull is explicit, and with damping in it its direction follows the
    light vertices' velocity over the substep, which keeps them chattering (a vertex grasp too)."""
    f = 0.25
    model, state = pinned(f, v=9, k=1000.0, c=0.0, max_force=0.5)
    run(model, state, 3000)
    c = point(state, 9, f)
    force = state.grasp_force[0]
    assert state.grasp_sat[0] == 1
    assert np.linalg.norm(force) == pytest.approx(0.5, rel=1e-12)
    # along the spring's pull p - c, the thread taut behind it at the limit, its held segment at the share f
    assert np.allclose(force / 0.5, (TARGET - c) / np.linalg.norm(TARGET - c), rtol=0, atol=1e-5)
    assert np.allclose(state.tension[:9], 0.5, rtol=1e-5)
    assert state.tension[9] == pytest.approx(f * 0.5, rel=1e-5)


def test_a_point_grasp_next_to_a_pinned_vertex_turns_the_free_one():
    """Vertex 0 pinned, the grasp at f = 0.5 of segment 0: the free vertex 1 takes the coupling's share f, and
    at rest the held point is at the target (within reach) with no pull left."""
    data = {"name": "pin", "duration": 1.0, "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 20},
            "shape": {"kind": "straight", "direction": [1.0, 0.0, 0.0]}, "gravity": [0.0, 0.0, 0.0],
            "contact": {"enabled": False},
            "boundary": {"pinned": [0], "grasps": [{"id": "s", "vertex": 1, "stiffness": 1000.0, "damping": 0.5,
                                                    "target": [0.5 * SEG, 0.0, 0.0]}]},
            "timeline": [{"grasp": "s", "move_to": [0.0, 0.5 * SEG, 0.0], "from": 0.0, "to": 0.3}]}
    sc = build_scenario(data, "pin.yaml")
    state = sc.new_state()
    state.grasp_vertex[0] = 0     # a scenario grasps free vertices only; the server may hold segment 0's middle
    state.grasp_frac[0] = 0.5
    run(sc.model, state, 2000)
    assert np.array_equal(state.x[0], [0.0, 0.0, 0.0])
    assert np.allclose(point(state, 0, 0.5), [0.0, 0.5 * SEG, 0.0], rtol=0, atol=1e-6)
    assert np.linalg.norm(state.grasp_force[0]) < 1e-3


def test_the_loop_grasps_a_point_checks_frac_and_lets_go():
    """PhysicsLoop.add_grasp(frac=...): the state holds the point, the `grasp` event says `frac` (and only when it
    is not 0), a frac outside [0, 1) or past the last segment is refused, remove_grasp clears it."""
    from suturesim.server import protocol
    from suturesim.server.config import ServerConfig
    from suturesim.server.physics import PhysicsLoop
    from suturesim.solver.scenario import load_scenario

    out = []
    loop = PhysicsLoop(ServerConfig(file="<test>", scenario=load_scenario("default")),
                       sink=lambda topic, payload: out.append((topic, bytes(payload))))
    try:
        n = loop.model.n_vertices
        for vertex, frac in ((40, 1.0), (40, -0.1), (40, float("nan")), (n - 1, 0.5), (-1, 0.5)):
            with pytest.raises(ValueError):
                loop.add_grasp(vertex, "hand", None, 500.0, 0.1, 2.0, frac=frac)
        spec = loop.add_grasp(40, "hand", None, 500.0, 0.1, 2.0, frac=0.25)
        st = loop.state
        assert st.grasp_vertex[spec.slot] == 40 and st.grasp_frac[spec.slot] == 0.25
        assert np.allclose(st.grasp_target[spec.slot], 0.75 * st.x[40] + 0.25 * st.x[41])
        other = loop.add_grasp(60, "other", None, 500.0, 0.1, 2.0)
        grasps = [protocol.decode_event(p) for t, p in out if t == protocol.TOPIC_EVENT]
        grasps = [e for e in grasps if e["kind"] == "grasp"]
        assert grasps[-2]["frac"] == 0.25 and "frac" not in grasps[-1]
        for _ in range(50):
            loop.seq += 1
            loop.tick_scene(0)
        assert np.all(np.isfinite(st.x))
        assert loop.remove_grasp(spec.id) and loop.remove_grasp(other.id)
        assert st.grasp_frac[spec.slot] == 0.0 and st.grasp_vertex[spec.slot] == -1
    finally:
        loop.close()
