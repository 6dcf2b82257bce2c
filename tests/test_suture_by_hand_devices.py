"""The start of a suture by hand (tests/suture_by_hand.py: pick up, drive through both edges, the other hand takes
the needle at its tip) played by two Touch devices on the libHD emulator under `suturesim serve --device
openhaptics --scenario suture-practice`.

The hands are rehearsed in process first, every tick's tool pose recorded. Those poses are turned into each
device's own frame and units by inverting what the server does with a device's pose (the device transform, then
the scene's workspace mapping) and written as the emulator's scripts, one row every few milliseconds (the
emulator interpolates between them; button changes and jumps keep their exact tick).

The scripts' clock starts with the devices' scheduler, the scene's with the physics' first tick, 1 to 10 s later
(a warm numba cache; the longer on a machine busy with other work). The hands wait at their devices' origins
until a script time well after that, and the test resets the scene (a control `reset`: the scene from its start,
exactly as installed afresh) as long before it as the rehearsal let the needle settle, so that the pick-up
closes the jaw where the needle lies in the rehearsal (a deterministic scene; the needle rests there, creeping
by a few micrometres per 100 ms, so that the reset's latency, up to 0.2 s on a busy machine, does not show).
From then on the scene's ticks follow the devices' servo ticks one for one (the loop locks its phase to the
first device), but for a loop that falls too far behind on a busy machine and re-anchors its schedule: the
hands then move a little faster in scene time than rehearsed, and the needle goes a little differently. The
live run is held to the rehearsal by positions (the needle in the jaw, the punctures, the handover's point on
the arc), not by ticks.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from suturesim.haptics import emulator as emu
from suturesim.haptics.safety import ForceSafety, SafetyConfig
from suturesim.haptics.servo import BACKSTOP_SLEW_FACTOR
from suturesim.server import protocol
from suturesim.server.config import load_server_config
from suturesim.server.device import Device
from suturesim.server.recording import read_messages
from suturesim.solver.scenario import load_scenario
from conftest import wait_for
from suture_by_hand import LEFT, RIGHT, SETTLE_TICKS, Scene, qconj, qmul, start_of_suture
from test_devices import CLAMP_N, Rig

SCENARIO = "suture-practice"
CONFIG = """\
loop:
  sndhwm: 1000000                 # the recorder may fall seconds behind on a busy machine: it loses no tick
devices:
  stylus0:                        # the right hand's needle driver
    hd_name: Default Device
  stylus1:                        # the left hand's forceps
    hd_name: Left Touch
"""
HD_NAMES = {RIGHT: "Default Device", LEFT: "Left Touch"}
HANDLES = {RIGHT: 0, LEFT: 1}     # the emulator's handles, in the order the driver initialises the devices
# the script time the hands start at: the physics' first tick came 1 to 10 s after the devices' scripts started
# (on a 2-core machine busy with other test suites), and the scene is reset SETTLE_TICKS before it
HANDS_S = 15.0
ROW_MAX = 10                      # ticks between script rows, at most
ROW_TOL_MM, ROW_TOL_DEG = 1e-3, 1e-3   # how closely the emulator's interpolation plays every tick's pose
TAIL_TICKS = 300                  # after the handover: both hands hold still


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory):
    return emu.build_emulator(tmp_path_factory.mktemp("hd-emulator"))


def rest_tool(cfg, scenario, device: str) -> np.ndarray:
    """Where the tool of ``device`` is (m, scene frame) with its stylus at the device's origin."""
    offset, _ = cfg.workspace_of(device, scenario)
    return np.add(cfg.device_config(device).transform.offset, offset)


def to_device(cfg, scenario, device: str, poses: list) -> tuple[np.ndarray, np.ndarray]:
    """Tool poses (position m, quaternion w x y z, scene frame) -> the stylus in the device's own frame: (mm, 3),
    (w x y z, 4). Inverts the workspace mapping tool = o + w + s (stylus - o) (o the transform's offset, w the
    workspace offset, s the motion scale; no clutch) and the transform stylus = o + scale R p_device,
    q_scene = q_R q_device."""
    t = cfg.device_config(device).transform
    offset, scale = cfg.workspace_of(device, scenario)
    o, r, q_r = np.array(t.offset), t.matrix, np.array(t.quat)
    pos = np.array([p for p, _, _ in poses])
    stylus = o + (pos - o - np.asarray(offset)) / scale
    p_dev = (stylus - o) @ r / t.scale                    # R^T (stylus - o) / scale, row by row
    q_dev = np.array([qmul(qconj(q_r), q) for _, q, _ in poses])
    return p_dev, q_dev


def to_scene_as_the_server_does(cfg, scenario, device: str, p_dev, q_dev) -> tuple[np.ndarray, np.ndarray]:
    """The tool poses the server makes of device-frame poses: the driver's DeviceTransform.pose_to_scene, then the
    physics' Device.to_tool with the scene's workspace."""
    t = cfg.device_config(device).transform
    offset, scale = cfg.workspace_of(device, scenario)
    dev = Device(device, ForceSafety(SafetyConfig()))
    dev.set_workspace(t.offset, offset, scale, t.quat)
    stylus, hand_q = np.zeros(3), np.zeros(4)
    pos, quat = np.zeros((len(p_dev), 3)), np.zeros((len(p_dev), 4))
    for i, (p, q) in enumerate(zip(p_dev, q_dev)):
        w, x, y, z = q / np.linalg.norm(q)
        rot = [[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
               [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
               [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]]
        t.pose_to_scene(*p, rot, stylus, hand_q)
        dev.to_tool(stylus, hand_q, pos[i], quat[i])
    return pos, quat


def script_rows(p_dev, q_dev, buttons, start_tick: int, t_start: float) -> list[tuple]:
    """The emulator's rows for a device whose hand first moves at tick ``start_tick``, played from script time
    ``t_start``: its first pose until then, then as few rows as the emulator's interpolation needs to play each
    tick's pose to within ROW_TOL_MM and ROW_TOL_DEG, at most ROW_MAX ticks apart. A row stands at its own tick,
    so the buttons change where they did and a jump is made between two ticks."""
    n = len(p_dev)
    rows = [(0.0, *p_dev[0], int(buttons[0]), *q_dev[0])]
    keep = [start_tick - 1, start_tick]
    i = start_tick
    while i < n - 1:
        best = i + 1
        for j in range(i + 2, min(i + ROW_MAX, n - 1) + 1):
            if buttons[j - 1] != buttons[i]:      # the buttons a row sets hold until the next row
                break
            s = (np.arange(i + 1, j) - i) / (j - i)
            pos = p_dev[i] + s[:, None] * (p_dev[j] - p_dev[i])
            quat = slerp_rows(np.broadcast_to(q_dev[i], (len(s), 4)), np.broadcast_to(q_dev[j], (len(s), 4)), s)
            if np.abs(pos - p_dev[i + 1:j]).max() > ROW_TOL_MM or \
                    turn_deg(quat, q_dev[i + 1:j]).max() > ROW_TOL_DEG:
                break
            best = j
        keep.append(best)
        i = best
    for i in keep:
        rows.append((t_start + (i - start_tick) * 1e-3, *p_dev[i], int(buttons[i]), *q_dev[i]))
    return rows


def slerp_rows(a: np.ndarray, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Slerp from each row of ``a`` toward the row of ``b`` (its sign the one nearer ``a``) by ``s``."""
    b = np.where(np.sum(a * b, axis=1)[:, None] < 0.0, -b, b)
    th = np.arccos(np.clip(np.sum(a * b, axis=1), -1.0, 1.0))
    small = th < 1e-9
    sin = np.where(small, 1.0, np.sin(th))
    wa = np.where(small, 1.0 - s, np.sin((1.0 - s) * th) / sin)
    wb = np.where(small, s, np.sin(s * th) / sin)
    q = wa[:, None] * a + wb[:, None] * b
    return q / np.linalg.norm(q, axis=1)[:, None]


def played(rows, ticks: np.ndarray, t_start: float, start_tick: int) -> tuple[np.ndarray, np.ndarray]:
    """What the emulator makes of ``rows`` at each of ``ticks``: position by linear interpolation, orientation by
    slerp (each row's sign the one nearer the row before), as haptics/hd_emulator.c plays a script."""
    t_rows = np.array([r[0] for r in rows])
    p_rows = np.array([r[1:4] for r in rows])
    q_rows = np.array([r[5:9] for r in rows], float)
    for i in range(1, len(q_rows)):
        if np.dot(q_rows[i], q_rows[i - 1]) < 0.0:
            q_rows[i] = -q_rows[i]
    t = t_start + (ticks - start_tick) * 1e-3
    pos = np.column_stack([np.interp(t, t_rows, p_rows[:, k]) for k in range(3)])
    j = np.clip(np.searchsorted(t_rows, t, side="right") - 1, 0, len(rows) - 2)
    span = t_rows[j + 1] - t_rows[j]
    s = np.clip(np.where(span > 0, (t - t_rows[j]) / np.where(span > 0, span, 1.0), 1.0), 0.0, 1.0)
    return pos, slerp_rows(q_rows[j], q_rows[j + 1], s)


def turn_deg(a, b) -> np.ndarray:
    """The angle (degrees) between orientations ``a`` and ``b`` (rows of unit quaternions)."""
    return np.degrees(2.0 * np.arccos(np.clip(np.abs(np.sum(np.atleast_2d(a) * np.atleast_2d(b), axis=1)),
                                              0.0, 1.0)))


def recorded(path) -> tuple[dict, list[dict]]:
    """A recording's forces (device -> decoded messages, in order) and events."""
    forces, events = {RIGHT: [], LEFT: []}, []
    for topic, payload, _, _ in read_messages(path):
        if topic == "force":
            m = protocol.decode_force(payload)
            forces.setdefault(m["device"], []).append(m)
        elif topic == "event":
            events.append(protocol.decode_event(payload))
    return forces, events


def rehearse(cfg, scenario) -> tuple[Scene, int]:
    """The start of the suture in process, the hands starting at their devices' origins, every tick's tool poses
    kept; then both hands hold still for TAIL_TICKS. (the scene, the tick the hands first moved)"""
    scene = Scene(rest={d: rest_tool(cfg, scenario, d) for d in (RIGHT, LEFT)}, record=True)
    hands = start_of_suture(scene, settle=SETTLE_TICKS)
    scene.tick(TAIL_TICKS)
    assert [(e["pad"], e["side"]) for e in scene.events("puncture")] == [
        ("left", "entry"), ("left", "exit"), ("right", "entry"), ("right", "exit")]
    return scene, hands["start_tick"]


def device_scripts(cfg, scenario, scene: Scene, start_tick: int) -> dict[str, list[tuple]]:
    """Each device's script: the rehearsed tool poses in its own frame and units, the hands starting at HANDS_S."""
    scripts = {}
    for device in (RIGHT, LEFT):
        poses = [tick[device] for tick in scene.poses_sent]
        p_dev, q_dev = to_device(cfg, scenario, device, poses)
        buttons = np.array([b for _, _, b in poses])
        # the server maps them back to the rehearsed tool poses (to rounding)
        pos, quat = to_scene_as_the_server_does(cfg, scenario, device, p_dev, q_dev)
        np.testing.assert_allclose(pos, [p for p, _, _ in poses], rtol=0, atol=1e-12)
        assert turn_deg(quat, np.array([q for _, q, _ in poses])).max() < 1e-5
        rows = script_rows(p_dev, q_dev, buttons, start_tick, HANDS_S)
        # and the emulator, interpolating between the rows, plays every tick's pose to within a micrometre and a
        # millidegree
        got_p, got_q = played(rows, np.arange(start_tick, scene.ticks), HANDS_S, start_tick)
        assert np.abs(got_p - p_dev[start_tick:]).max() <= ROW_TOL_MM * 1.0001
        assert turn_deg(got_q, q_dev[start_tick:]).max() <= ROW_TOL_DEG * 1.0001
        assert len(rows) < 0.25 * (scene.ticks - start_tick), len(rows)
        scripts[device] = rows
    return scripts


def play(tmp_path, lib_dir, scripts: dict, end_s: float):
    """`serve --device openhaptics --scenario suture-practice --record` with the two devices on their scripts, the
    scene reset SETTLE_TICKS before the hands start, stopped once the scripts have played (until ``end_s``).
    (the emulator's log, the recording's path)"""
    rec = tmp_path / "live.mcap"
    r = Rig(tmp_path, lib_dir, script=scripts[RIGHT], config=CONFIG, scripts={HD_NAMES[LEFT]: scripts[LEFT]},
            extra=("--device", "openhaptics", "--scenario", SCENARIO, "--record", str(rec)))
    try:
        r.serve()

        def sched_start() -> int | None:
            log = r.emulator() if r.log.exists() else None
            starts = None if log is None else log["t_ns"][log["kind"] == emu.LOG_SCHED_START]
            return int(starts[0]) if starts is not None and len(starts) else None
        t0 = wait_for(sched_start, 10.0, what="the emulator's scheduler started") / 1e9
        t_reset = t0 + HANDS_S - SETTLE_TICKS * 1e-3
        assert time.monotonic() < t_reset - 0.2, f"physics served {time.monotonic() - t0:.1f} s after the " \
            f"devices' scripts started, too late to reset the scene before the hands move\n{r.d.output()}"
        time.sleep(t_reset - time.monotonic())
        r.d.ok({"cmd": "reset"})                   # the scene from its start: the needle settles as rehearsed
        wait_for(lambda: time.monotonic() > t0 + end_s + 0.3, end_s + 30.0, what="the scripts played")
        assert r.stop() == 0, r.d.output()
        return r.emulator(), rec
    finally:
        r.close()


# the rehearsal (6.9 s of scene, about 6 s), the devices' start (up to 10 s on a busy machine, within HANDS_S),
# the scripts (HANDS_S + 5.3 s), the stop. Timed: the devices play their scripts on the wall clock, so a loop that
# falls behind them (a long test on the other core) closes the jaws where the needle is not yet
@pytest.mark.long(cost=50)
@pytest.mark.timed
def test_the_start_of_a_suture_by_hand_played_by_two_emulated_devices(tmp_path, lib_dir):
    cfg_path = tmp_path / "server.yaml"
    cfg_path.write_text(CONFIG)
    cfg = load_server_config(cfg_path, {"scenario": SCENARIO, "device": "openhaptics"})
    scenario = load_scenario(SCENARIO)
    scene, start_tick = rehearse(cfg, scenario)                                  # 1.
    scripts = device_scripts(cfg, scenario, scene, start_tick)                   # 2.
    end_s = HANDS_S + (scene.ticks - start_tick) * 1e-3
    log, rec = play(tmp_path, lib_dir, scripts, end_s)                           # 3.
    rehearsed = {"punctures": [(e["pad"], e["side"], np.array(e["pos"])) for e in scene.events("puncture")],
                 "grasps": scene.events("grasp")}
    forces, events = recorded(rec)
    kinds = {k: [e for e in events if e["kind"] == k] for k in ("grasp", "release", "puncture")}
    assert [(g["device"], g["holds"]) for g in kinds["grasp"]] == [(RIGHT, "needle"), (LEFT, "needle")], events
    assert len(kinds["puncture"]) == 4, kinds["puncture"]
    (pick, handover), punctures = kinds["grasp"], kinds["puncture"]
    want_pick, want_handover = rehearsed["grasps"]
    # how the live run went beside the rehearsal (shown when an assertion below fails)
    apart = [float(np.linalg.norm(np.subtract(e["pos"], pos))) for e, (_, _, pos) in
             zip(punctures, rehearsed["punctures"])]
    print(f"live vs rehearsed: pick-up at scene time {pick['t']:.3f} s vs {want_pick['t']:.3f} s, the needle in "
          f"the jaw {1e6 * np.linalg.norm(np.subtract(pick['offset'], want_pick['offset'])):.1f} um and "
          f"{turn_deg(np.array(pick['q_rel']), np.array(want_pick['q_rel']))[0]:.3f} deg apart; punctures "
          f"{', '.join(f'{1e3 * d:.2f}' for d in apart)} mm apart; handover {handover['t'] - pick['t']:.3f} s after "
          f"the pick-up vs {want_handover['t'] - want_pick['t']:.3f} s, at arc {handover['arc']:.3f} vs "
          f"{want_handover['arc']:.3f} rad")
    # 4. the right jaw closed on the needle where it did in the rehearsal (the needle lay where it had settled) ...
    assert np.linalg.norm(np.subtract(pick["offset"], want_pick["offset"])) < 0.1e-3
    assert turn_deg(np.array(pick["q_rel"]), np.array(want_pick["q_rel"]))[0] < 0.5
    # ... drove it through both edges, in order, where the rehearsal did (the scene's ticks follow the servo's
    # but for a loop that falls behind on a busy machine: the hands then move a little faster in scene time)
    assert [(e["pad"], e["side"]) for e in punctures] == [("left", "entry"), ("left", "exit"),
                                                          ("right", "entry"), ("right", "exit")], punctures
    assert max(apart) < 1.5e-3, apart
    assert np.linalg.norm(np.subtract(punctures[0]["pos"][:2], [-0.005, 0.0])) < 1.5e-3   # at the entry mark
    # ... and the left jaw took it near its tip where the rehearsal did, the right one letting go of it
    assert handover["arc"] == pytest.approx(want_handover["arc"], abs=0.1)
    assert [(e["device"], e["holds"]) for e in kinds["release"]] == [(RIGHT, "needle")], kinds["release"]
    assert kinds["release"][0]["t"] == handover["t"] > punctures[-1]["t"]          # in the same tick
    # 5. both forces bounded and continuous: as published, tick by tick ...
    safety, tick = cfg.safety, cfg.loop.tick_s
    slew = safety.max_slew_n_per_s * tick
    for device in (RIGHT, LEFT):
        f = np.array([m["force"] for m in forces[device]])
        t = np.array([m["t"] for m in forces[device]])
        # every tick, none missing; the scene's time back to its start once, at the reset
        back = np.nonzero(np.abs(np.diff(t) - tick) > 1e-9)[0]
        assert len(back) == 1 and t[back[0] + 1] <= tick + 1e-9, (device, t[back], t[back + 1])
        assert np.linalg.norm(f, axis=1).max() <= min(safety.max_force_n, CLAMP_N) + 1e-12, device
        assert np.linalg.norm(np.diff(f, axis=0), axis=1).max() <= slew * 1.0001, device
    # the drive was felt: the needle's drag through the tissue is some mN; when the tip meets a face at an angle it
    # jams for a moment and the hand feels up to the clamp, which some runs show and some do not (0.011 N peak in
    # one run of the suite, the clamp's 0.88 N in others)
    felt = np.linalg.norm([m["force"] for m in forces[RIGHT]], axis=1)
    print(f"felt: max {felt.max():.4f} N, rehearsed {np.linalg.norm(scene.forces(RIGHT), axis=1).max():.4f} N")
    assert felt.max() > 0.005
    # ... and as the devices' motors got them (the emulator's log, per handle): within the clamp, and no step
    # larger than the servo's backstop lets through (two physics ticks can land in one servo period)
    f_log = log[log["kind"] == emu.LOG_FORCE]
    for device, handle in HANDLES.items():
        mine = f_log[f_log["d"] == handle]
        vec = np.column_stack([mine["a"], mine["b"], mine["c"]])
        assert len(vec) > 1000 * (end_s - 1.0), (device, len(vec))
        assert np.all(np.isfinite(vec)) and np.linalg.norm(vec, axis=1).max() <= CLAMP_N + 1e-12, device
        dt = np.maximum(np.diff(mine["t_ns"]) / 1e9, tick)
        steps = np.linalg.norm(np.diff(vec, axis=0), axis=1)
        assert np.all(steps <= BACKSTOP_SLEW_FACTOR * safety.max_slew_n_per_s * dt * 1.0001), (device, steps.max())
