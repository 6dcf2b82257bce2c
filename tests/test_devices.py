"""Haptic devices end to end (issue 5): `suturesim serve --device openhaptics` against the libHD emulator
(haptics/hd_emulator.c, loaded through LD_LIBRARY_PATH, so pyOpenHaptics' real import path and our servo
callback run), with fault injection, and the simulated and replay backends.

What a device actually received is read from the emulator's own log (every force applied at hdEndFrame, every
pose it reported), independently of the server's bookkeeping.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from suturesim.haptics import emulator as emu
from suturesim.server import protocol
from suturesim.server.recording import read_messages
from conftest import Daemon, MachineLateness, Sub, find_link, wait_for

CLAMP_N = 0.88          # the emulator's HD_NOMINAL_MAX_CONTINUOUS_FORCE: the clamp (config allows 3 N)
END_X_MM = 0.0          # device origin = the default thread's grasped end (offset below)
CAPS = (emu.CAP_FORCE_OUTPUT | emu.CAP_FORCE_RAMPING | emu.CAP_MAX_FORCE_CLAMPING | emu.CAP_SOFTWARE_FORCE_LIMIT)

CONFIG = """\
scenario: default
device: openhaptics
devices:
  stylus0:
    transform: {rotation_deg: [0, 0, 0], scale: 0.001, offset: [0.45, 0.0, 0.0]}
    workspace_offset: [0, 0, 0]    # the device's origin where the transform puts it, not the scene's workspace
    motion_scale: 1.0
"""

# slack (50 mm in), then 0.5 mm past the thread's reach (taut: ~0.5 N through the 1000 N/m coupling), a step
# back to 3 mm inside it at 4.5 s (slack: the force drops; its latency is measured), then 20 mm past its reach
# (at the clamp)
# (script time runs from the driver's start; physics serves ~1 s later with a warm numba cache, so the taut
# phase starts at 5.5 s)
PULL = [(0.0, 0.0, 0, 0, 0), (1.0, -50.0, 0, 0, 0), (4.0, -50.0, 0, 0, 0), (5.5, 0.5, 0, 0, 0),
        (6.5, 0.5, 0, 0, 0), (6.5, -3.0, 0, 0, 0), (7.5, -3.0, 0, 0, 0), (8.5, 20.0, 0, 0, 0),
        (60.0, 20.0, 0, 0, 0)]
STEP_S, STEP_TO_MM = 6.5, -3.0


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory):
    return emu.build_emulator(tmp_path_factory.mktemp("hd-emulator"))


class Rig:
    """A daemon on the emulator, a subscriber collecting everything it publishes, the emulator log."""

    def __init__(self, tmp_path, lib_dir, script=PULL, fault=None, config=CONFIG, with_emulator=True,
                 extra=(), scripts=None):
        self.tmp = tmp_path
        self.log = tmp_path / "emulator.bin"
        self.stats = tmp_path / "device-stats.json"
        cfg = tmp_path / "server.yaml"
        cfg.write_text(config)
        env = dict(os.environ)
        if with_emulator:
            named = {name: emu.write_script(tmp_path / f"script-{i}.txt", rows)
                     for i, (name, rows) in enumerate((scripts or {}).items())}
            env = emu.emulator_env(lib_dir, emu.write_script(tmp_path / "script.txt", script), self.log, fault,
                                   scripts=named)
        env["SUTURESIM_DEVICE_STATS"] = str(self.stats)
        self.d = Daemon("--config", str(cfg), *extra, env=env)
        self.sub = None
        self.msgs: list = []
        self._thread = None
        self._stop = threading.Event()

    def serve(self) -> "Rig":
        self.d.wait_serving()
        self.sub = Sub(self.d.pub)
        self.sub.wait_live()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()
        return self

    def _collect(self):
        while not self._stop.is_set():
            self.msgs.extend(self.sub.collect(0.2))

    def forces(self, device="stylus0") -> list[dict]:
        return [m for m in (protocol.decode(p, t) for _, t, p in list(self.msgs) if t == protocol.TOPIC_FORCE)
                if m["device"] == device]

    def events(self, kind=None) -> list[dict]:
        out = [protocol.decode(p, t) for _, t, p in list(self.msgs) if t == protocol.TOPIC_EVENT]
        return [e for e in out if kind is None or e["kind"] == kind]

    def emulator(self) -> np.ndarray:
        return emu.read_log(self.log)

    def stop(self) -> int | None:
        self.d.proc.send_signal(signal.SIGTERM)
        code = self.d.wait_exit(10.0)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        return code

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self.sub is not None:
            self.sub.close()
        self.d.close()


@pytest.fixture
def rig(tmp_path, lib_dir):
    made = []

    def make(**kw) -> Rig:
        r = Rig(tmp_path, lib_dir, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def emulator_forces(log: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    f = log[log["kind"] == emu.LOG_FORCE]
    return f["t_ns"], np.column_stack([f["a"], f["b"], f["c"]])


# ----------------------------------------------------------------------------------------------- end to end
def pulled_past_reach(r: "Rig") -> bool:
    """The stylus is 15 mm past the thread's reach (the script's last phase): the force is at the clamp."""
    return any(m["pose"][0] > 0.465 for m in r.forces())


@pytest.mark.timed   # pose-to-force latency by servo periods, a step at the motors within 2.3 ms
def test_openhaptics_pull_taut_forces_match_clamp_and_latency(rig):
    r = rig().serve()
    with MachineLateness(cpu=r.d.status()["cpu"]) as machine:   # what the machine alone made late meanwhile
        wait_for(lambda: pulled_past_reach(r), 20.0, what="the stylus past the thread's reach")
        time.sleep(0.5)
        t_stop = time.monotonic_ns()   # after it, the watchdog's ramp to zero: forces never published
        seconds = [protocol.decode_stats(p) for _, t, p in list(r.msgs) if t == protocol.TOPIC_STATS]
    assert r.stop() == 0, r.d.output()
    log = r.emulator()
    t_f, f = emulator_forces(log)
    mags = np.linalg.norm(f, axis=1)
    # every force the device received: finite, within the clamp, with the device's own safety features on
    assert np.all(np.isfinite(f)) and mags.max() <= CLAMP_N + 1e-12, mags.max()
    assert mags.max() > 0.85                                    # pulled taut, it reached the clamp
    assert np.all(log[log["kind"] == emu.LOG_FORCE]["code"] & CAPS == CAPS)
    # what the device received is what `force` published (identity rotation: the same floats)
    published = {tuple(m["force"]) for m in r.forces()}
    t_first = r.msgs[0][0] * 1e9 + 5e6           # forces sent before the subscriber joined cannot match
    live = (mags > 0.0) & (t_f > t_first) & (t_f < t_stop)
    matched = np.array([tuple(v) in published for v in f[live]])
    # the rest are the servo's backstop's own (a watchdog ramp while physics was late by more than watchdog_s, or
    # a slew-limited step), which the driver counts: on a loaded machine physics stalls, and they are many
    stats = json.loads(r.stats.read_text())["stylus0"]
    unmatched = int((~matched).sum())
    assert unmatched <= 0.01 * matched.size + stats["backstop_ticks"], \
        f"{unmatched} of {matched.size} device forces were never published ({stats['backstop_ticks']} backstop ticks)"
    pub_mags = np.array([np.linalg.norm(m["force"]) for m in r.forces()])
    assert pub_mags.max() <= CLAMP_N + 1e-12
    assert any(m["flags"] & protocol.FLAG_CLAMPED for m in r.forces())
    assert all(m["axial"] >= 0.0 for m in r.forces())
    # stopped: the last force the motors got is zero, then the scheduler stopped and the motors went off
    assert mags[-1] == 0.0
    kinds = log["kind"].tolist()
    assert emu.LOG_SCHED_STOP in kinds and emu.LOG_MOTORS_OFF in kinds
    # pose-to-force latency, measured by the driver (each force against the time of the pose it came from): the
    # time between two servo callbacks, so a multiple of the servo period plus the callbacks' own wake-up jitter.
    # The 2 ms target is met by a force read at the second callback after its pose, on the device's clock, so the
    # forces are judged by the whole number of periods nearest their latency: at most 1 % later than two, beyond
    # the ticks the machine alone made late over the same window (the physics loop's CPU stolen, or a bare loop's
    # wake-ups late; MachineLateness.late_ticks). A bound on the latency in µs judged the servo thread's wake-up
    # instead: CI read p99 2001.4 µs, and a run here 2397 µs, with the forces at the second callback.
    lat = stats["latency_us"]
    periods = stats["latency_hist_periods"]
    beyond = sum(periods[3:])
    assert lat["count"] > 1000 and lat["p50"] <= 2050.0, lat
    assert beyond <= 0.01 * lat["count"] + machine.late_ticks(seconds), \
        f"{beyond} of {lat['count']} forces more than two servo periods after their pose: {periods} ({machine})"
    assert stats["errors"] == {} and stats["exceptions"] == 0
    # ... and independently from the emulator's log: the step at 6.5 s reaches the motors within 2 ms
    poses = log[log["kind"] == emu.LOG_POSE]
    t_step = poses["t_ns"][np.argmax((poses["t_ns"] > poses["t_ns"][0] + (STEP_S - 0.1) * 1e9) &
                                     (poses["a"] <= STEP_TO_MM + 1e-9))]
    before = f[np.searchsorted(t_f, t_step) - 1]
    assert np.linalg.norm(before) > 0.3                                  # taut before the step
    after = np.nonzero((t_f > t_step) & (np.linalg.norm(f - before, axis=1) > 0.1))[0]
    assert after.size and (t_f[after[0]] - t_step) / 1e6 <= 2.0 + 0.3, (t_f[after[0]] - t_step) / 1e6


def test_buttons_release_and_grasp_are_events(rig):
    # hold the end; release the button-less initial grasp with a press-and-release; press again: grasp the end
    # (from 4 s: physics runs by then)
    script = [(0.0, 0.0, 0, 0, 0), (4.0, 0.0, 0, 0, 1), (4.2, 0.0, 0, 0, 0), (4.22, 0.0, 0, 0, 1),
              (60.0, 0.0, 0, 0, 1)]
    r = rig(script=script).serve()
    wait_for(lambda: r.events("grasp"), 15.0, what="a button grasp")
    release = r.events("release")
    assert release and release[0]["id"] == "right" and release[0]["device"] == "stylus0"
    grasp = r.events("grasp")[0]
    assert grasp["device"] == "stylus0" and grasp["vertex"] == 100     # the end, where the stylus is
    status = r.d.status()
    assert status["devices"] == ["stylus0"]
    assert [g["device"] for g in status["grasps"]] == ["stylus0"]
    assert r.stop() == 0


# --------------------------------------------------------------------------------------------------- faults
@pytest.mark.timed   # servo frames counted over wall time after the error
def test_unmapped_hd_error_keeps_the_servo_running(rig):
    # HD_EXCEEDED_MAX_FORCE_IMPULSE: pyOpenHaptics' get_error has no entry for it (KeyError, callback DONE)
    r = rig(fault="error:0x0202@4.0").serve()
    wait_for(lambda: r.events("device_error"), 15.0, what="a device_error event")
    assert r.events("device_error")[0]["code"] == 0x0202
    time.sleep(1.0)
    assert r.stop() == 0
    log = r.emulator()
    t_err = log["t_ns"][log["kind"] == emu.LOG_ERROR_PUSHED][0]
    t_f, _ = emulator_forces(log)
    assert (t_f > t_err + 400_000_000).sum() > 300       # the servo kept commanding forces after the error
    stats = json.loads(r.stats.read_text())["stylus0"]
    assert stats["errors"] == {"HD_EXCEEDED_MAX_FORCE_IMPULSE (0x0202)": 1}


def test_missing_device_fails_clearly_or_falls_back(rig, tmp_path):
    r = rig(fault="missing")
    assert r.d.wait_exit(30.0) == 2, r.d.output()
    err = "\n".join(r.d.stderr)
    assert "could not be initialised" in err and "HD_COMM_CONFIG_ERROR" in err and "--device simulated" in err
    r2 = rig(fault="missing", config=CONFIG + "device_fallback: simulated\n").serve()
    assert "falling back to the simulated stylus" in "\n".join(r2.d.stderr)
    assert r2.stop() == 0


def test_no_openhaptics_runtime_is_a_clear_message(rig):
    r = rig(with_emulator=False)
    assert r.d.wait_exit(30.0) == 2, r.d.output()
    err = "\n".join(r.d.stderr)
    assert "OpenHaptics runtime not found" in err and "--device simulated" in err


@pytest.mark.timed   # the ramp to zero within 62 ms, servo frames counted
def test_physics_stalled_force_ramps_to_zero(rig):
    r = rig().serve()
    wait_for(lambda: pulled_past_reach(r), 20.0, what="the stylus past the thread's reach")
    physics = r.d.status()["pid"]
    os.kill(physics, signal.SIGSTOP)
    t_stop = time.monotonic_ns()
    try:
        time.sleep(0.3)
    finally:
        os.kill(physics, signal.SIGCONT)
    time.sleep(0.5)
    assert r.stop() == 0
    t_f, f = emulator_forces(r.emulator())
    mags = np.linalg.norm(f, axis=1)
    assert mags[t_f < t_stop].max() > 0.8
    # watchdog 5 ms, then a linear ramp over 50 ms: zero within 60 ms (+ the servo's own period)
    stalled = (t_f > t_stop + 62_000_000) & (t_f < t_stop + 300_000_000)
    assert stalled.sum() > 200 and np.all(mags[stalled] == 0.0), mags[stalled].max()
    ramp = (t_f > t_stop) & (t_f <= t_stop + 62_000_000)
    assert np.all(np.abs(np.diff(mags[ramp])) <= 3 * 500.0 * 1.5e-3)   # no jump on the way down
    assert mags[t_f > t_stop + 400_000_000].max() > 0.8                  # and back once physics runs again


@pytest.mark.timed   # motors off within 1 s of the kill
def test_server_killed_device_sees_zero_force(rig):
    r = rig().serve()
    wait_for(lambda: pulled_past_reach(r), 20.0, what="the stylus past the thread's reach")
    children = [c for c in r.d.children() if b"spawn_main" in open(f"/proc/{c}/cmdline", "rb").read()]
    assert len(children) == 2                                            # the driver and physics
    os.kill(r.d.pid, signal.SIGKILL)
    t_kill = time.monotonic_ns()

    def gone():
        return all(not os.path.exists(f"/proc/{c}") or open(f"/proc/{c}/stat").read().split()[2] == "Z"
                   for c in children)
    wait_for(gone, 5.0, what="the driver and physics processes to exit")
    log = r.emulator()
    t_f, f = emulator_forces(log)
    assert np.linalg.norm(f[-1]) == 0.0
    off = log[(log["kind"] == emu.LOG_MOTORS_OFF)]
    assert off.size and (off["t_ns"][0] - t_kill) / 1e6 < 1000.0


def test_stuck_servo_callback_stops_the_device_and_the_server_runs_on(rig):
    r = rig(fault="stuck@4.0").serve()
    r.d.wait_line(r"device driver stopped: .*stalled", 15.0, stream="stderr")
    wait_for(lambda: r.events("device_lost"), 5.0, what="a device_lost event")
    log = r.emulator()
    kinds = log["kind"].tolist()
    assert emu.LOG_STUCK in kinds and emu.LOG_MOTORS_OFF in kinds
    assert r.d.status()["t"] > 0.0        # physics runs on without the device
    assert r.stop() == 0


# --------------------------------------------------------------------------------------------------- replay
@pytest.mark.timed   # forces counted over 1.5 s of wall time
def test_replay_backend_plays_recorded_stylus_poses(tmp_path):
    """`--device replay`: the stylus follows the recording's poses tick by tick (scene time to scene time)."""
    rec = tmp_path / "scripted.mcap"
    done = subprocess.run([sys.executable, "-m", "suturesim.server.cli", "run", "default", "--duration", "4",
                           "--record", str(rec)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    recorded = {}
    for topic, payload, _, _ in read_messages(rec):
        if topic == "force":
            m = protocol.decode_force(payload)
            recorded[round(m["t"], 6)] = m["pose"]
    d = Daemon("--device", "replay", "--replay", str(rec))
    try:
        d.wait_serving()
        sub = Sub(d.pub, (protocol.TOPIC_FORCE,))
        sub.wait_live()
        got = [protocol.decode(p, t) for _, t, p in sub.collect(1.5)]
        sub.close()
    finally:
        d.close()
    pairs = [(m["pose"], recorded[round(m["t"], 6)]) for m in got
             if m["device"] == "stylus0" and round(m["t"], 6) in recorded]
    assert len(pairs) > 1000
    err = max(float(np.abs(np.subtract(a, b)).max()) for a, b in pairs)
    assert err < 1e-9, err          # the default path moves slower than max_speed: no lag
    moved = max(float(np.linalg.norm(np.subtract(a, pairs[0][0]))) for a, _ in pairs)
    assert moved > 0.01             # and it did move


def test_replay_without_a_recording_is_a_config_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "suturesim.server.cli", "serve", "--device", "replay"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "replay" in done.stderr and "recording" in done.stderr, done.stderr


@pytest.mark.timed   # the hands' scripted pull, felt at the motors within the test's wall-clock window
def test_two_openhaptics_devices_each_get_their_own_force(rig):
    """Two Touch devices (one HD scheduler) hold the two ends of the two-hand scene; the same scripted hand path,
    mirrored by the second device's transform, pulls them apart: each device's motors get its own stream."""
    config = """\
scenario: two-hand-knot
device: openhaptics
devices:
  stylus0:
    hd_name: Right Touch
    transform: {rotation_deg: [0, 0, 0], scale: 0.001, offset: [0.45, 0.0, 0.0]}
    workspace_offset: [0, 0, 0]    # the device's origin where the transform puts it, not the scene's workspace
    motion_scale: 1.0
  stylus1:
    hd_name: Left Touch
    transform: {rotation_deg: [0, 0, 180], scale: 0.001, offset: [0.0, 0.0, 0.0]}
    workspace_offset: [0, 0, 0]
"""
    script = [(0.0, 0.0, 0, 0, 0), (4.0, 0.0, 0, 0, 0), (5.0, 10.0, 0, 0, 0), (60.0, 10.0, 0, 0, 0)]
    r = rig(script=script, config=config).serve()
    wait_for(lambda: any(m["pose"][0] > 0.459 for m in r.forces("stylus0")), 20.0, what="the hands apart")
    time.sleep(0.5)
    # the motors' forces up to the stop: after it the physics no longer publishes, and the safety's watchdog ramps
    # each device to zero over 50 ms (forces never published). Left among the last 300, that ramp failed a run of
    # the full suite (0.86 of them matched) when the physics stopped before the devices.
    t_stop = time.monotonic_ns()
    assert r.stop() == 0, r.d.output()
    log = r.emulator()
    f = log[log["kind"] == emu.LOG_FORCE]
    t_first = r.msgs[0][0] * 1e9 + 5e6
    for handle, device, sign in ((0, "stylus0", -1.0), (1, "stylus1", -1.0)):
        mine = f[(f["d"] == handle) & (f["t_ns"] > t_first) & (f["t_ns"] < t_stop)]
        vec = np.column_stack([mine["a"], mine["b"], mine["c"]])
        published = {tuple(m["force"]) for m in r.forces(device)}
        # each device's motors got its own published stream; the second device's frame is turned by 180°
        # about z, so its device-frame force is the published one with x and y negated
        # (R^T f for R = Rz(180°) is exact only to rounding: compare to 1e-12 N)
        turned = {tuple(np.round((-x, -y, z) if handle == 1 else (x, y, z), 12)) for x, y, z in published}
        live = vec[np.linalg.norm(vec, axis=1) > 0][-300:]
        hits = np.mean([tuple(np.round(v, 12)) in turned for v in live])
        assert len(live) == 300 and hits > 0.95, (device, hits)
        # pulled apart: each hand is pulled back toward the other (device frame: -x for both)
        assert sign * vec[-400:-300, 0].mean() > 0.5, (device, vec[-400:-300].mean(axis=0))


def test_coupling_is_limited_to_the_device_stiffness(tmp_path, lib_dir):
    """A device that renders 0.5 N/mm gets a 500 N/m coupling, not the scenario's 1000 N/m."""
    cfg = tmp_path / "server.yaml"
    cfg.write_text(CONFIG)
    env = emu.emulator_env(lib_dir, emu.write_script(tmp_path / "script.txt", PULL), max_stiffness=0.5)
    d = Daemon("--config", str(cfg), env=env)
    try:
        d.wait_serving()
        line = d.wait_line(r"coupling stiffness", 10.0)
        assert "1000 N/m" in line and "(500 N/m)" in line
    finally:
        d.close()


# ------------------------------------------------------------------------------ orientation, buttons, two devices
def qmul(a, b) -> np.ndarray:
    """Hamilton product of quaternions (w, x, y, z), broadcasting over leading axes."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw], -1)


def qconj(q) -> np.ndarray:
    return np.asarray(q, float) * [1.0, -1.0, -1.0, -1.0]


C45 = math.cos(math.pi / 4)
Q_R = np.array([C45, C45, 0.0, 0.0])          # both devices' frame: +90 deg about x (device y -> scene z)
Q_NEEDLE = np.array([0.0, 0.0, C45, -C45])    # simple-interrupted-suture's needle at rest (scene frame)
Q0 = qmul(qconj(Q_R), Q_NEEDLE)               # the needle hand's stylus, device frame, holding it as it rests
Q1 = qmul([C45, 0.0, C45, 0.0], Q0)           # ... turned 90 deg about the device's y axis
SWAGE = (0.0, 0.0, 0.0143908)                 # the thread's two ends in simple-interrupted-suture
TAIL = (-0.0988932, 0.0, 0.0292248)
HANDS_S = 5.0        # script time the hands start at: physics serves about 1 s after the driver starts (warm cache)

SUTURE_CONFIG = f"""\
scenario: simple-interrupted-suture
device: openhaptics
devices:
  stylus0:
    transform: {{rotation_deg: [90, 0, 0], scale: 0.001, offset: [{SWAGE[0]}, {SWAGE[1]}, {SWAGE[2]}]}}
    workspace_offset: [0, 0, 0]    # the device's origin at the swage, not where the scene puts the workspace
  stylus1:
    hd_name: Left Device
    grasp_button: 2
    clutch_button: 0               # no clutch: button 2 is this hand's grasp button
    workspace_offset: [0, 0, 0]
    transform: {{rotation_deg: [90, 0, 0], scale: 0.001, offset: [{TAIL[0]}, {TAIL[1]}, {TAIL[2]}]}}
"""
# "Default Device" holds the needle: it lifts it 30 mm (device y: scene z), then turns it 90 degrees about the
# device's y axis over 1 s (scene z)
TURN_S = HANDS_S + 1
NEEDLE_HAND = [(0.0, 0, 0, 0, 0, *Q0), (HANDS_S, 0, 0, 0, 0, *Q0), (TURN_S, 0, 30, 0, 0, *Q0),
               (TURN_S + 1, 0, 30, 0, 0, *Q1), (60.0, 0, 30, 0, 0, *Q1)]
# "Left Device" holds the tail with button 1 down throughout; its grasp button is button 2: pressed and released,
# the tail is let go; pressed again 20 ms later, grasped again; then the hand moves 20 mm along x
TAIL_HAND = [(0.0, 0, 0, 0, 1), (HANDS_S + 0.2, 0, 0, 0, 3), (HANDS_S + 0.4, 0, 0, 0, 1),
             (HANDS_S + 0.42, 0, 0, 0, 3), (TURN_S, 0, 0, 0, 3), (TURN_S + 1, 20, 0, 0, 3), (60.0, 20, 0, 0, 3)]


def needle_turn_deg(quats: np.ndarray) -> np.ndarray:
    """How far each scene-frame stylus orientation is turned from the needle at rest about the scene's z axis
    (degrees), checking that it is a turn about z: the rest relative to Q_NEEDLE must be nothing."""
    rel = qmul(quats, qconj(Q_NEEDLE))
    rel *= np.where(rel[:, :1] < 0.0, -1.0, 1.0)          # q and -q: the same orientation
    np.testing.assert_allclose(rel[:, 1:3], 0.0, rtol=0, atol=1e-9)
    return np.degrees(2.0 * np.arctan2(rel[:, 3], rel[:, 0]))


@pytest.fixture(scope="module")
def suture_hands(tmp_path_factory, lib_dir):
    """`serve --device openhaptics` on simple-interrupted-suture with two emulated devices, each on its own
    script; run until both hands have done everything, then stopped. (rig, the emulator's log)"""
    r = Rig(tmp_path_factory.mktemp("suture-hands"), lib_dir, script=NEEDLE_HAND, config=SUTURE_CONFIG,
            scripts={"Left Device": TAIL_HAND})
    stop = threading.Event()
    r.link_buttons = []         # stylus1's button mask on the link, each time it changed
    sampler = None
    try:
        r.serve()
        link, slot = find_link(r.d), r.d.status()["devices"].index("stylus1")

        def sample():
            pos, quat = np.zeros(3), np.zeros(4)
            while not stop.is_set():
                got = link.read_pose(slot, pos, quat)
                if got is not None and (not r.link_buttons or got[2] != r.link_buttons[-1]):
                    r.link_buttons.append(got[2])
                time.sleep(0.002)
            link.close()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        def done():
            turned = [m for m in r.forces("stylus0") if "quat" in m]
            moved = [m for m in r.forces("stylus1") if m["stylus"][0] > TAIL[0] + 0.0199]
            return turned and needle_turn_deg(np.array([turned[-1]["quat"]]))[0] > 89.999 and moved
        wait_for(done, 40.0, what="both hands' scripts played")
        stop.set()
        sampler.join(2.0)
        assert r.stop() == 0, r.d.output()
        yield r, r.emulator()
    finally:
        stop.set()
        if sampler is not None:
            sampler.join(2.0)
        r.close()


@pytest.mark.long(cost=12)   # the shared run: 7 s of script, the start and the stop
@pytest.mark.xdist_group("suture-hands")
def test_scripted_orientation_arrives_through_the_device_transform(suture_hands):
    r, log = suture_hands
    start = log["t_ns"][log["kind"] == emu.LOG_SCHED_START][0]
    orient = log[(log["kind"] == emu.LOG_ORIENT) & (log["code"] == 0)]
    assert len(orient) > 5000 and not np.any((log["kind"] == emu.LOG_ORIENT) & (log["code"] == 1))
    t = (orient["t_ns"] - start) / 1e9
    q_dev = np.column_stack([orient[k] for k in "abcd"])
    # the emulator turned the stylus by slerp: about its y axis at a constant rate, from Q0 to Q1 in 1 s
    half = np.radians(np.interp(t, [TURN_S, TURN_S + 1], [0.0, 90.0])) / 2
    want = qmul(np.column_stack([np.cos(half), 0 * half, np.sin(half), 0 * half]), Q0)
    np.testing.assert_allclose(q_dev * np.sign(np.sum(q_dev * want, axis=1))[:, None], want, rtol=0, atol=1e-12)
    # the server got each orientation turned into the scene frame (Q_R q_dev): a turn about the scene's z axis
    sent = needle_turn_deg(qmul(Q_R, q_dev))
    got = needle_turn_deg(np.array([m["quat"] for m in r.forces("stylus0") if "quat" in m]))
    sent = np.unique(sent)
    i = np.clip(np.searchsorted(sent, got), 1, len(sent) - 1)
    nearest = np.minimum(np.abs(got - sent[i - 1]), np.abs(got - sent[i]))
    assert nearest.max() < 1e-7, nearest.max()       # every one it published is one the device reported
    assert np.any((got > 10) & (got < 80)) and got.max() > 89.999   # through the turn, to 90 degrees
    assert np.all(np.diff(got) >= -1e-9)             # in order


@pytest.mark.long(cost=12)   # the shared run: 7 s of script, the start and the stop
@pytest.mark.xdist_group("suture-hands")
def test_button_2_arrives(suture_hands):
    r, log = suture_hands
    start = log["t_ns"][log["kind"] == emu.LOG_SCHED_START][0]
    served = r.msgs[0][0] - start / 1e9
    assert served < HANDS_S, f"physics served {served:.1f} s after the driver started, after the button presses"
    pose = log[(log["kind"] == emu.LOG_POSE) & (log["code"] == 1)]
    assert set(pose["d"].astype(int)) == {1, 3}                     # the device reported both buttons
    # the driver passed both bits to the link: seen by a sampler every 2 ms, which on a busy machine can miss the
    # 20 ms gap between the release and the press (a suite run saw [1, 3]); that the server got each change is
    # what its release and grasp events below show
    assert set(r.link_buttons) == {1, 3} and r.link_buttons[:2] == [1, 3], r.link_buttons
    # button 1 (held throughout) does nothing; button 2, the tail hand's grasp button, lets go and grasps
    release = [e for e in r.events("release") if e["device"] == "stylus1"]
    grasp = [e for e in r.events("grasp") if e["device"] == "stylus1"]
    assert [e["id"] for e in release] == ["left"], r.events()
    # on the thread's last segment, where the hand let go of its end: the jaw takes the nearest point along a
    # segment, and how far the free end swung in the 20 ms before the press depends on how late the loop ran
    # (a suite run on a busy machine took vertex 79 and a point along it)
    assert len(grasp) == 1 and grasp[0]["vertex"] + grasp[0].get("frac", 0.0) >= 79.0, r.events()
    assert grasp[0]["t"] > release[0]["t"], r.events()


@pytest.mark.long(cost=12)   # the shared run: 7 s of script, the start and the stop
@pytest.mark.xdist_group("suture-hands")
def test_two_devices_drive_their_own_styluses(suture_hands):
    r, log = suture_hands
    # each device's stylus arrives under its own name, where its own script put it
    for device, offset, end_mm in (("stylus0", SWAGE, (0.0, 0.0, 30.0)), ("stylus1", TAIL, (20.0, 0.0, 0.0))):
        final = np.array(r.forces(device)[-1]["stylus"])
        np.testing.assert_allclose(final, np.add(offset, np.multiply(end_mm, 1e-3)), rtol=0, atol=1e-12)
    # the needle hand went only up, the tail hand only along x
    s0 = np.array([m["stylus"] for m in r.forces("stylus0")])
    s1 = np.array([m["stylus"] for m in r.forces("stylus1")])
    np.testing.assert_allclose(s0[:, :2], np.broadcast_to(SWAGE[:2], (len(s0), 2)), rtol=0, atol=1e-12)
    np.testing.assert_allclose(s1[:, 1:], np.broadcast_to(TAIL[1:], (len(s1), 2)), rtol=0, atol=1e-12)
    assert s0[:, 2].max() > SWAGE[2] + 0.0299 and s1[:, 0].max() > TAIL[0] + 0.0199
    # one HD scheduler served both: each device's motors got frames, by its own handle
    f = log[log["kind"] == emu.LOG_FORCE]
    assert min(np.sum(f["d"] == 0), np.sum(f["d"] == 1)) > 5000
