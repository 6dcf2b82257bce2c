"""One tick sequence (server/scene.py SceneRunner) for `serve`, `run` and a resimulation, and a reset that copies
the scene's initial state into the live buffers (ThreadState.copy_into) instead of installing the scene afresh.
A PhysicsLoop with a sink stands for the daemon (no socket), as tools/replay.py builds one."""
from __future__ import annotations

import multiprocessing
from dataclasses import fields

import msgpack
import numpy as np
import pytest

from suturesim.server import protocol
from suturesim.server.config import DeviceConfig, ServerConfig
from suturesim.server.headless import run_scenario
from suturesim.server.physics import PhysicsLoop
from suturesim.server.recording import read_messages
from suturesim.server.snapshot import Snapshot
from suturesim.solver.integrator import SolverDivergence
from suturesim.solver.scenario import load_scenario


def sink_loop(scene: str = "default", **cfg) -> tuple[PhysicsLoop, list[tuple[bytes, bytes]]]:
    out: list[tuple[bytes, bytes]] = []
    c = ServerConfig(file="<test>", scenario=load_scenario(scene), **cfg)
    return PhysicsLoop(c, sink=lambda topic, payload: out.append((topic, bytes(payload)))), out


def tick(loop: PhysicsLoop, n: int) -> None:
    for _ in range(n):
        loop.seq += 1
        loop.tick_scene(0)


def diverge_once_in(stepper) -> None:
    """``stepper``'s next tick raises SolverDivergence, as a tick whose every run diverged does."""
    real = stepper.tick

    def diverge():
        stepper.tick = real
        raise SolverDivergence("test")
    stepper.tick = diverge


def diverge_once(loop: PhysicsLoop) -> None:
    """One tick of ``loop`` whose solver step diverges."""
    diverge_once_in(loop.stepper)
    tick(loop, 1)


def buffers(loop: PhysicsLoop) -> dict:
    """Every array of the live state, and the stepper's, by name."""
    st = loop.state
    out = {f.name: getattr(st, f.name) for f in fields(st)}
    out["packed"] = st.packed()
    out["stepper backup"] = loop.stepper._backup
    out["stepper tension"] = loop.stepper._tension
    return out


def assert_initial(loop: PhysicsLoop) -> None:
    initial = loop.scenario.initial
    for f in fields(initial):
        np.testing.assert_array_equal(getattr(loop.state, f.name), getattr(initial, f.name), err_msg=f.name)


def test_run_and_a_loop_with_a_sink_publish_the_same_bytes(tmp_path):
    """`suturesim run` and the daemon's tick (a PhysicsLoop with a sink): the same messages, byte for byte, for the
    first 2000 ticks of the default scene."""
    path = tmp_path / "run.mcap"
    summary = run_scenario(load_scenario("default"), duration=2.0, record=str(path))
    assert summary.ticks == 2000 and summary.finite
    ran = [(topic.encode(), bytes(payload)) for topic, payload, _, _ in read_messages(path)]
    loop, out = sink_loop()
    try:
        tick(loop, 2000)
    finally:
        loop.close()
    assert len(ran) == 2200 and {t for t, _ in ran} == {protocol.TOPIC_FORCE, protocol.TOPIC_STATE}
    assert out == ran


def test_a_reset_copies_the_initial_state_into_the_live_buffers():
    """A reset allocates no state: the same state object and arrays (and the stepper's), now equal to the
    scenario's initial state; the grasp a device made by hand is let go and its force stream ends."""
    loop, _ = sink_loop()
    try:
        tick(loop, 300)
        loop.add_grasp(40, "hand", None, 500.0, 0.1, 2.0)
        tick(loop, 100)
        assert not np.array_equal(loop.state.x, loop.scenario.initial.x)
        state, stepper, builder, snapshot_of = loop.state, loop.stepper, loop.builder, buffers(loop)
        loop.reset()
        assert loop.state is state and loop.stepper is stepper and loop.builder is builder
        after = buffers(loop)
        for name, arr in snapshot_of.items():
            if name == "packed":
                assert all(a is b for a, b in zip(arr, after[name]))
            elif name == "stepper backup":
                assert after[name] is arr
            else:
                assert after[name] is arr and (arr.size == 0 or np.shares_memory(after[name], arr)), name
        assert_initial(loop)
        assert [g.id for g in loop.grasps] == ["right"] and builder.devices == ["stylus0"]
        assert loop.builder.grasps is loop.grasps
    finally:
        loop.close()


def _reset_against(scene: str, before: int, after: int, drive=None, **cfg) -> None:
    """Run ``before`` ticks (``drive(loop)`` once halfway), reset, run ``after`` more. A twin driven alike whose
    scene is installed afresh instead (what a reset did before) must publish the same bytes, and so must, when
    nothing drove the scene (no stylus known), a fresh loop run from the same seq."""
    runs = []
    for how in ("reset", "install"):
        loop, out = sink_loop(scene, **cfg)
        try:
            tick(loop, before // 2)
            if drive is not None:
                drive(loop)
            tick(loop, before - before // 2)
            if how == "reset":
                loop.reset()
            else:
                loop.install(loop.scenario)
            out.clear()
            tick(loop, after)
        finally:
            loop.close()
        runs.append(out)
    assert len(runs[0]) == len(runs[1]) and runs[0] == runs[1]
    if drive is None:
        fresh, fresh_out = sink_loop(scene, **cfg)
        try:
            fresh.seq = before
            tick(fresh, after)
        finally:
            fresh.close()
        assert runs[0] == fresh_out


def test_a_reset_scene_publishes_what_a_fresh_start_does():
    _reset_against("default", 600, 600)


def test_a_reset_after_a_grasp_by_hand_publishes_what_installing_afresh_did():
    def grasp_by_hand(loop):
        loop.add_grasp(60, "hand", None, 800.0, 0.2, 2.5)
        assert loop.builder.devices == ["stylus0", "hand"]

    _reset_against("default", 600, 600, grasp_by_hand)


def test_a_reset_suture_publishes_what_a_fresh_start_does():
    """With tissue, a needle and the suture's watch (its events and the `state` topic's tissue map)."""
    _reset_against("simple-interrupted-suture", 1500, 800)


def test_a_reset_with_a_live_device_keeps_it_driving():
    """A remote device drives the scene's grasp (its timeline motion removed when the scene was installed), a
    second one grasps by hand and sends its orientation: after the reset the scene's grasp still waits for its
    device and follows its last pose, exactly as when the scene was installed afresh."""
    def drive(loop):
        assert loop.model is loop.initial_model and loop.model is not loop.scenario.model
        loop.set_device_pose("stylus0", np.array([0.40, 0.02, 0.03]))
        at = loop.state.x[40].copy()
        loop.set_device_pose("hand", at, np.array([1.0, 0.0, 0.0, 0.0]))
        loop.on_buttons("hand", 1)
        assert any(g.device == "hand" for g in loop.grasps)

    _reset_against("default", 400, 400, drive, device="remote", devices=(DeviceConfig(name="hand"),))


def test_a_reset_restores_the_model_as_installed():
    """Timeline motions removed after the install (a device taking over a scripted grasp) come back with a reset,
    as they did when a reset installed the scene afresh; the stepper steps with that model again."""
    def take_over(loop):
        loop.drive_with_device(loop.grasps[0])
        assert loop.model is not loop.initial_model and loop.stepper.model is loop.model

    _reset_against("default", 400, 400, take_over)
    loop, _ = sink_loop()
    try:
        take_over(loop)
        loop.reset()
        assert loop.model is loop.initial_model is loop.scenario.model and loop.stepper.model is loop.model
    finally:
        loop.close()


def test_a_fault_resets_in_place():
    """A divergence: `fault` and `reset` events, the scene back to its start in the same buffers, and the tick goes
    on publishing from the reset state as a fresh start would."""
    loop, out = sink_loop()
    try:
        tick(loop, 200)
        state, arrays = loop.state, buffers(loop)
        out.clear()
        diverge_once(loop)
        kinds = [protocol.decode_event(p)["kind"] for t, p in out if t == protocol.TOPIC_EVENT]
        assert kinds == ["fault", "reset"]
        assert loop.state is state and all(buffers(loop)[k] is v for k, v in arrays.items() if k != "packed")
        assert_initial(loop)
        published = [p for t, p in out if t == protocol.TOPIC_FORCE]
    finally:
        loop.close()
    fresh, fresh_out = sink_loop()
    try:
        # a fresh start at the reset state publishes that state's forces at the same seq
        fresh.seq = 200
        fresh.paused = True
        tick(fresh, 1)
    finally:
        fresh.close()
    assert published == [p for t, p in fresh_out if t == protocol.TOPIC_FORCE]


def test_a_fault_goes_back_half_a_second_lets_the_hands_go_and_a_second_one_resets():
    """A divergence after the scene's first ROLLBACK_TICKS ticks: the scene goes back, in the same buffers, to its
    state as the last copy's tick started, the grasp made by hand let go and the scenario's kept; `fault`,
    `release` and `resume` (no `reset`: a scorer's attempt goes on), the clock running on from the failed tick's
    end. It ticks on from there; a second divergence within FAULT_WINDOW_TICKS resets the scene to its start."""
    from suturesim.server.rollback import ROLLBACK_TICKS
    from suturesim.solver.model import NEIGHBOUR_LIST, TICK_SCRATCH

    loop, out = sink_loop()
    try:
        tick(loop, ROLLBACK_TICKS - 1)
        copied = {f.name: getattr(loop.state, f.name).copy() for f in fields(loop.state)}
        tick(loop, 150)
        loop.add_grasp(60, "stylus1", "hand", 500.0, 0.5, 3.0)
        tick(loop, 50)
        state, arrays = loop.state, buffers(loop)
        t_fail = float(state.time[0])
        out.clear()
        diverge_once(loop)
        events = [protocol.decode_event(p) for t, p in out if t == protocol.TOPIC_EVENT]
        assert [e["kind"] for e in events] == ["fault", "release", "resume"], events
        assert events[1]["id"] == "hand" and [g.id for g in loop.grasps] == ["right"]
        tick_s = loop.model.solver.tick
        assert float(state.time[0]) == pytest.approx(t_fail + tick_s)
        assert events[2]["scene_t"] == pytest.approx(t_fail + tick_s)
        assert events[2]["undone_s"] == pytest.approx(201 * tick_s)
        assert loop.state is state and all(buffers(loop)[k] is v for k, v in arrays.items() if k != "packed")
        moved = ("time", "x_ref", "grasp_vel")
        for name, before in copied.items():
            if name not in TICK_SCRATCH and name not in NEIGHBOUR_LIST and name not in moved:
                np.testing.assert_array_equal(getattr(state, name), before, err_msg=name)
        assert np.all(state.grasp_vertex[[g.slot for g in loop.grasps]] >= 0)
        assert (state.grasp_vertex >= 0).sum() == 1
        out.clear()
        tick(loop, 100)
        assert np.all(np.isfinite(state.x)) and float(state.time[0]) == pytest.approx(t_fail + 101 * tick_s)
        assert not [p for t, p in out if t == protocol.TOPIC_EVENT]

        out.clear()
        diverge_once(loop)
        kinds = [protocol.decode_event(p)["kind"] for t, p in out if t == protocol.TOPIC_EVENT]
        assert kinds == ["fault", "reset"], kinds
        assert_initial(loop)
    finally:
        loop.close()


def test_a_session_by_hand_with_a_rollback_resimulates_exactly(tmp_path, monkeypatch):
    """suture-practice with two remote styluses (the right jaw takes the needle, lifts it and sets it over the
    entry mark; the left waits) whose solver faults once the needle is in the air: the scene goes back, the jaw
    lets go, the hands move on. What the loop published, written as a recording, resimulates exactly: the same
    fault, rollback and `release` at the same tick, and every force and state after them."""
    from suture_by_hand import RIGHT, Hand, Scene, set_for_bite

    from suturesim.server.config import server_metadata
    from suturesim.server.headless import recording_metadata
    from suturesim.server.recording import McapRecorder
    from suturesim.server.rollback import ROLLBACK_TICKS
    from suturesim.server.scene import SceneRunner
    from suturesim.tools.replay import resimulate

    fail = 2 * ROLLBACK_TICKS + 200          # the needle in the jaw, on its way over the entry mark
    real = SceneRunner.tick

    def tick_failing(self, seq, paused=False):   # the same tick diverges when the session runs and again
        if seq == fail:
            diverge_once_in(self.stepper)
        return real(self, seq, paused)
    monkeypatch.setattr(SceneRunner, "tick", tick_failing)

    scene = Scene()
    scene.tick(300)
    set_for_bite(scene, Hand(scene, RIGHT), scene.arc / 4.0)
    scene.tick(300)
    events = scene.events("release") + scene.events("resume")
    assert [e["kind"] for e in events] == ["release", "resume"] and events[0]["seq"] == fail, events
    assert not scene.events("reset")
    path = tmp_path / "rolled-back.mcap"
    sc = scene.loop.scenario
    with McapRecorder(path, metadata={**recording_metadata(sc.name, sc.file, sc.source),
                                      "server": server_metadata(scene.loop.cfg)}) as rec:
        for topic, payload in scene.out:
            rec.write(topic, payload, int(msgpack.unpackb(payload)["seq"]) * 1_000_000)
    scene.loop.close()
    report = resimulate(str(path))
    assert report.stopped is None and report.ticks == scene.ticks, report
    assert report.exact, report


def test_a_scene_that_diverges_again_and_again_is_paused_not_reset_for_ever():
    """A scene whose every start diverges (a value that passed validation but cannot be simulated) would fault and
    reset every tick for ever: the third divergence within FAULT_WINDOW_TICKS pauses it, with a `pause` event that
    says why, and the loop runs on (paused) until a client changes the scene."""
    from suturesim.server.physics import FAULT_WINDOW_TICKS, FAULTS_TO_PAUSE

    loop, out = sink_loop()
    try:
        def diverge():
            raise SolverDivergence("test")
        loop.stepper.tick = diverge
        tick(loop, FAULTS_TO_PAUSE)
        kinds = [protocol.decode_event(p)["kind"] for t, p in out if t == protocol.TOPIC_EVENT]
        assert kinds == ["fault", "reset"] * (FAULTS_TO_PAUSE - 1) + ["fault", "pause"], kinds
        assert loop.paused
        pause = [protocol.decode_event(p) for t, p in out if t == protocol.TOPIC_EVENT][-1]
        assert "diverged" in pause["reason"] and str(FAULT_WINDOW_TICKS) in pause["reason"]
        out.clear()
        tick(loop, 10)   # paused: no step, no fault; forces and state still published
        assert not [p for t, p in out if t == protocol.TOPIC_EVENT]
        assert len([p for t, p in out if t == protocol.TOPIC_FORCE]) == 10
    finally:
        loop.close()


def test_a_reset_keeps_the_snapshot_segment_and_writes_it_at_once():
    parent, child = multiprocessing.Pipe()
    out: list = []
    cfg = ServerConfig(file="<test>", scenario=load_scenario("default"))
    loop = PhysicsLoop(cfg, supervisor=child, sink=lambda t, p: out.append(t))
    try:
        assert parent.poll(1) and parent.recv()[0] == "snapshot"
        snap = loop.snapshot
        tick(loop, 300)
        snap.write(loop.state)
        writes = snap.writes
        loop.reset()
        assert loop.snapshot is snap and snap.writes == writes + 1 and not parent.poll(0)
        restored = loop.scenario.new_state()
        restored.x[:] = 0.0
        other = Snapshot.attach(snap.name)
        try:
            assert other.restore(restored)
        finally:
            other.close()
        np.testing.assert_array_equal(restored.x, loop.scenario.initial.x)
    finally:
        loop.close()
        parent.close()
        child.close()


def test_a_runner_without_messages_follows_the_suture_as_the_server_does():
    """What a test that steps a scene tick by tick should run: a SceneRunner that publishes nothing but hands the
    watch's events to a callback sees the events the server publishes, at the same scene times, and ends in the
    same state."""
    from suturesim.server.messages import MessageBuilder
    from suturesim.server.scene import SceneRunner
    from suturesim.solver.integrator import Stepper

    ticks = 7000
    sc = load_scenario("simple-interrupted-suture")
    state = sc.new_state()
    seen: list = []
    runner = SceneRunner(Stepper(sc.model, state), MessageBuilder(sc), None, 10,
                         event=lambda kind, **d: seen.append((runner.seq, float(state.time[0]), kind, d)))
    for k in range(1, ticks + 1):
        runner.tick(k)
    loop, out = sink_loop("simple-interrupted-suture")
    try:
        tick(loop, ticks)
        final = loop.state.x.copy()
    finally:
        loop.close()
    published = [protocol.decode_event(p) for t, p in out if t == protocol.TOPIC_EVENT]
    assert len(seen) >= 2 and [(e["seq"], e["t"], e["kind"]) for e in published] == [s[:3] for s in seen]
    np.testing.assert_array_equal(state.x, final)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
