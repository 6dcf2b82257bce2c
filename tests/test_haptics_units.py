"""Unit tests of the device side and of what feeds it: the device-to-scene transform, one servo tick on a real
shared-memory link, the replay pose track and its loader, the per-device force messages, and the scripted stylus
paths (circle / wrap / lift_and_pull) a scenario compiles into its timeline."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import yaml

from suturesim.haptics import servo as servo_mod
from suturesim.haptics.link import DeviceLink
from suturesim.haptics.replay import PoseTrack
from suturesim.haptics.safety import (FLAG_CLAMPED, FLAG_FAULT, FLAG_SLEWED, FLAG_WATCHDOG, ForceSafety,
                                      SafetyConfig)
from suturesim.haptics.servo import Servo
from suturesim.haptics.transform import DeviceTransform, quat_from_matrix, rotation_from_euler_deg
from suturesim.server import protocol
from suturesim.server.messages import MessageBuilder
from suturesim.server.recording import McapRecorder
from suturesim.server.replay_poses import load_pose_tracks
from suturesim.solver.config import ConfigError
from suturesim.solver.integrator import Stepper
from suturesim.solver.motion import MOTION_GRASP, apply_motions
from suturesim.solver.scenario import SCENARIOS_DIR, build_scenario, load_scenario

MS = 1_000_000  # ns


# ------------------------------------------------------------------------------------------------ helpers
def quat_to_matrix(q) -> np.ndarray:
    """Rotation matrix of a unit quaternion (w, x, y, z): an implementation independent of the code under test."""
    w, x, y, z = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def random_rotation(rng) -> np.ndarray:
    """A random proper rotation (QR of a Gaussian matrix, sign-fixed so that det = +1)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def axis_angle(axis, angle) -> np.ndarray:
    a = np.asarray(axis, float) / np.linalg.norm(axis)
    k = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * (k @ k)


# ---------------------------------------------------------------------------------------- DeviceTransform
def test_identity_rotation_maps_p_to_offset_plus_scale_p():
    tf = DeviceTransform(scale=0.001, offset=(0.1, -0.2, 0.3))
    pos, quat = np.zeros(3), np.zeros(4)
    tf.pose_to_scene(120.0, -45.0, 7.5, None, pos, quat)
    np.testing.assert_allclose(pos, [0.1 + 0.12, -0.2 - 0.045, 0.3 + 0.0075], rtol=0, atol=1e-15)
    # no rotation anywhere: the scene orientation is the identity quaternion
    np.testing.assert_array_equal(quat, [1.0, 0.0, 0.0, 0.0])
    out = np.zeros(3)
    tf.force_to_device(1.0, -2.0, 0.5, out)
    np.testing.assert_array_equal(out, [1.0, -2.0, 0.5])   # forces are N on both sides: no scale, no offset


def test_rotation_x_90_turns_device_y_up_and_device_z_to_minus_y():
    # OpenHaptics: y up, z toward the user; the scene has z up. Rx(90) is the documented mounting.
    tf = DeviceTransform(rotation_deg=(90.0, 0.0, 0.0))
    pos, quat = np.zeros(3), np.zeros(4)
    tf.pose_to_scene(0.0, 1.0, 0.0, None, pos, quat)
    np.testing.assert_allclose(pos, [0.0, 0.0, 1.0], atol=1e-15)
    tf.pose_to_scene(0.0, 0.0, 1.0, None, pos, quat)
    np.testing.assert_allclose(pos, [0.0, -1.0, 0.0], atol=1e-15)
    tf.pose_to_scene(1.0, 0.0, 0.0, None, pos, quat)
    np.testing.assert_allclose(pos, [1.0, 0.0, 0.0], atol=1e-15)
    # and the orientation of an unrotated stylus is that same rotation
    np.testing.assert_allclose(quat_to_matrix(quat), tf.matrix, atol=1e-15)


def test_force_to_device_is_the_transpose_and_round_trips():
    rng = np.random.default_rng(3)
    for _ in range(20):
        tf = DeviceTransform(rotation_deg=tuple(rng.uniform(-180, 180, 3)), scale=0.001, offset=(1.0, 2.0, 3.0))
        r = tf.matrix
        f = rng.uniform(-1.0, 1.0, 3)
        out = np.zeros(3)
        tf.force_to_device(*f, out)
        np.testing.assert_allclose(out, r.T @ f, rtol=0, atol=1e-15)
        # back to the scene with R: unchanged (a wrong R or R instead of R^T would fail this)
        np.testing.assert_allclose(r @ out, f, rtol=0, atol=1e-15)


def test_rotation_from_euler_is_rz_ry_rx():
    rx, ry, rz = 20.0, -35.0, 110.0
    expect = (axis_angle([0, 0, 1], math.radians(rz)) @ axis_angle([0, 1, 0], math.radians(ry))
              @ axis_angle([1, 0, 0], math.radians(rx)))
    np.testing.assert_allclose(rotation_from_euler_deg(rx, ry, rz), expect, atol=1e-15)


def test_pose_quaternion_is_unit_and_composes_q_r_times_q_device():
    rng = np.random.default_rng(7)
    pos, quat = np.zeros(3), np.zeros(4)
    for _ in range(25):
        tf = DeviceTransform(rotation_deg=tuple(rng.uniform(-180, 180, 3)))
        rot = random_rotation(rng)
        tf.pose_to_scene(0.0, 0.0, 0.0, rot.tolist(), pos, quat)
        assert np.linalg.norm(quat) == pytest.approx(1.0, abs=1e-14)
        # the stylus orientation in the scene is R_mount @ R_device (q_R * q_dev in quaternions)
        np.testing.assert_allclose(quat_to_matrix(quat), tf.matrix @ rot, atol=1e-13)


def test_quat_from_matrix_round_trips_every_branch():
    rng = np.random.default_rng(11)
    mats = [random_rotation(rng) for _ in range(40)]
    # trace < 0 (angle > 120 deg) exercises Shepperd's three other branches; the half turns about x, y, z hit
    # each of them exactly
    mats += [axis_angle(rng.normal(size=3), rng.uniform(2.2, math.pi)) for _ in range(40)]
    mats += [np.diag([1.0, -1.0, -1.0]), np.diag([-1.0, 1.0, -1.0]), np.diag([-1.0, -1.0, 1.0]), np.eye(3)]
    assert sum(np.trace(m) < 0 for m in mats) >= 40
    for m in mats:
        q = quat_from_matrix(m.tolist())
        assert math.fsum(c * c for c in q) == pytest.approx(1.0, abs=1e-14)
        assert q[0] >= 0.0   # one sign for one rotation
        np.testing.assert_allclose(quat_to_matrix(q), m, atol=1e-13)


@pytest.mark.parametrize("kwargs", [
    {"scale": 0.0}, {"scale": -1.0}, {"scale": math.nan}, {"scale": math.inf},
    {"offset": (0.0, math.nan, 0.0)}, {"offset": (math.inf, 0.0, 0.0)}, {"offset": (0.0, 0.0)},
    {"rotation_deg": (0.0, math.nan, 0.0)}, {"rotation_deg": (90.0, 0.0)},
])
def test_transform_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        DeviceTransform(**kwargs)


# ------------------------------------------------------------------------------------------------- Servo
@pytest.fixture
def link():
    lk = DeviceLink.create(1)
    try:
        yield lk
    finally:
        lk.close()
        lk.unlink()


# a mount with every axis turned, so a missing or transposed rotation shows
TF = DeviceTransform(rotation_deg=(90.0, 0.0, 30.0), scale=0.001, offset=(0.1, 0.2, 0.3))


def to_device(f) -> np.ndarray:
    out = np.zeros(3)
    TF.force_to_device(*f, out)
    return out


def test_servo_passes_a_healthy_force_unchanged_into_the_device_frame(link):
    servo = Servo(link, 0, TF, SafetyConfig())
    out = np.zeros(3)
    t0 = time.monotonic_ns()
    # within the 3 N clamp and well within the backstop's slew (3 x 500 N/s: 1.5 N per 1 ms tick)
    forces = [[0.5, -0.3, 1.0], [0.9, -0.2, 1.1], [1.2, 0.4, 0.8], [1.0, 0.9, -0.2], [0.0, 0.0, 0.0]]
    for k, f in enumerate(forces):
        now = t0 + k * MS
        link.write_force(0, f, 0.0, 0, k, now - MS // 5)       # physics computed it 0.2 ms ago: fresh
        flags = servo.tick(10.0, 20.0, 30.0, None, 0, now, out)
        assert flags == 0                                       # the backstop stayed idle
        np.testing.assert_array_equal(out, to_device(f))        # bit for bit what physics published
        np.testing.assert_allclose(TF.matrix @ out, f, rtol=0, atol=1e-15)
    assert servo.backstop_ticks == 0


def test_servo_watchdog_ramps_a_stale_force_linearly_to_exactly_zero(link):
    cfg = SafetyConfig()
    servo = Servo(link, 0, TF, cfg)
    out = np.zeros(3)
    f = np.array([1.0, -0.5, 0.8])
    t0 = time.monotonic_ns()
    prev_flags = 0
    last_fresh = None
    for k in range(70):
        now = t0 + k * MS
        if k < 5:   # physics writes for 5 ticks, then stops (stalled); written 0.5 ms before each tick
            link.write_force(0, f, 0.0, 0, k, now - MS // 2)
        flags = servo.tick(0.0, 0.0, 0.0, None, 0, now, out)
        # the pose record carries the previous tick's flags to physics
        assert link.driver_flags(0) & 0xFFFF == prev_flags
        prev_flags = flags
        age_ms = (k - 4) + 0.5
        if age_ms <= cfg.watchdog_s * 1e3:                      # fresh (last at 4.5 ms, k = 8)
            assert flags == 0
            np.testing.assert_array_equal(out, to_device(f))
            last_fresh = k
            continue
        assert flags & FLAG_WATCHDOG
        # linear in time from the last fresh output, reaching exactly zero ramp_down_s (50 ms) after it
        factor = max(0.0, 1.0 - (k - last_fresh) * 1e-3 / cfg.ramp_down_s)
        np.testing.assert_allclose(out, factor * to_device(f), rtol=0, atol=1e-12)
        if k - last_fresh >= round(cfg.ramp_down_s * 1e3):
            assert out.tolist() == [0.0, 0.0, 0.0]
        else:
            assert np.linalg.norm(out) > 0.0
    assert last_fresh == 8
    # counted: each tick of the ramp that sent the motors a nonzero force physics did not publish (9 .. 57)
    assert servo.backstop_ticks == round(cfg.ramp_down_s * 1e3) - 1
    # fresh forces again: the output resumes (through the slew limit, from zero) and the flag clears
    now = t0 + 70 * MS
    link.write_force(0, f, 0.0, 0, 70, now)
    assert servo.tick(0.0, 0.0, 0.0, None, 0, now, out) == 0
    np.testing.assert_array_equal(out, to_device(f))


@pytest.mark.parametrize("device_max, limit", [(2.0, 2.0), (5.0, 3.0)])
def test_servo_clamps_at_the_smaller_of_device_and_configured_limit(link, device_max, limit):
    servo = Servo(link, 0, TF, SafetyConfig(), device_max_force_n=device_max)
    assert servo.safety.max_force_n == limit
    out = np.zeros(3)
    f = np.array([3.0, -1.0, 2.0])      # 3.74 N: beyond both limits
    t0 = time.monotonic_ns()
    for k in range(4):
        now = t0 + k * MS
        link.write_force(0, f, 0.0, 0, k, now)
        flags = servo.tick(0.0, 0.0, 0.0, None, 0, now, out)
    assert flags == FLAG_CLAMPED         # steady: clamped, no longer slewing
    assert np.linalg.norm(out) == pytest.approx(limit, rel=1e-12)
    # the direction is kept
    np.testing.assert_allclose(out / np.linalg.norm(out), to_device(f) / np.linalg.norm(f), atol=1e-12)


def test_servo_below_the_limit_is_not_clamped(link):
    # the contrast to the clamp test: 2.5 N passes with the default 3 N limit and no device limit
    servo = Servo(link, 0, TF, SafetyConfig())
    out = np.zeros(3)
    f = np.array([2.0, 1.5, 0.0])
    t0 = time.monotonic_ns()
    flags = []
    for k in range(3):
        link.write_force(0, f, 0.0, 0, k, t0 + k * MS)
        flags.append(servo.tick(0.0, 0.0, 0.0, None, 0, t0 + k * MS, out))
    assert flags[0] == FLAG_SLEWED       # 2.5 N from zero is more than 1.5 N in one tick
    assert flags[-1] == 0
    np.testing.assert_array_equal(out, to_device(f))


def test_servo_stopping_ramps_to_zero_even_with_fresh_forces(link):
    cfg = SafetyConfig()
    servo = Servo(link, 0, TF, cfg)
    out = np.zeros(3)
    f = np.array([0.6, 0.0, -0.9])
    t0 = time.monotonic_ns()
    for k in range(3):
        link.write_force(0, f, 0.0, 0, k, t0 + k * MS)
        servo.tick(0.0, 0.0, 0.0, None, 0, t0 + k * MS, out)
    np.testing.assert_array_equal(out, to_device(f))
    servo.stopping = True
    n_ramp = round(cfg.ramp_down_s * 1e3)
    for j in range(1, n_ramp + 5):
        now = t0 + (2 + j) * MS
        link.write_force(0, f, 0.0, 0, 2 + j, now)              # physics keeps sending: stopping wins
        flags = servo.tick(0.0, 0.0, 0.0, None, 0, now, out)
        assert flags & FLAG_WATCHDOG
        np.testing.assert_allclose(out, max(0.0, 1.0 - j / n_ramp) * to_device(f), rtol=0, atol=1e-12)
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_servo_publishes_the_transformed_pose_and_driver_flags_with_error_code(link):
    servo = Servo(link, 0, TF, SafetyConfig())
    servo.error_code = 0x2A
    rng = np.random.default_rng(5)
    rot = random_rotation(rng)
    out = np.zeros(3)
    pos, quat = np.zeros(3), np.zeros(4)
    t0 = time.monotonic_ns()
    # nothing was ever written on the force record: stale, so the watchdog acts and the output is zero
    flags = servo.tick(120.0, -40.0, 65.0, rot.tolist(), 0b101, t0, out)
    assert flags == FLAG_WATCHDOG and out.tolist() == [0.0, 0.0, 0.0]
    seq, t_ns, buttons = link.read_pose(0, pos, quat)
    assert (t_ns, buttons) == (t0, 0b101)
    # p_scene = offset + scale R p_device, q_scene = R_mount R_device
    np.testing.assert_allclose(pos, np.array(TF.offset) + 0.001 * TF.matrix @ [120.0, -40.0, 65.0],
                               rtol=0, atol=1e-15)
    np.testing.assert_allclose(quat_to_matrix(quat), TF.matrix @ rot, atol=1e-13)
    # flags of the first tick were 0 (none yet); the error code rides in the high 16 bits from the start
    assert link.driver_flags(0) == 0x2A << 16
    servo.tick(121.0, -40.0, 65.0, None, 0, t0 + MS, out)
    d = link.driver_flags(0)
    assert d & 0xFFFF == FLAG_WATCHDOG and d >> 16 == 0x2A
    assert link.read_pose(0, pos, quat)[0] == seq + 2


def test_servo_latency_recorded_from_stats_after_s_after_first_posed_force(link, monkeypatch):
    monkeypatch.setattr(servo_mod, "STATS_AFTER_S", 0.010)
    servo = Servo(link, 0, TF, SafetyConfig())
    out = np.zeros(3)
    t0 = time.monotonic_ns()
    expected = []
    stats_from = None
    for k in range(60):
        now = t0 + k * MS
        lat = None
        if k < 5:
            pose_t = 0                      # forces not computed from a pose: they start no statistics
        elif k % 3 == 2:
            pose_t = None                   # no new force this tick: the same record is not counted twice
        else:
            lat = 150_000 + 7_000 * k       # a different latency per force, so a mix-up shows
            pose_t = now - lat
        if pose_t is not None:
            link.write_force(0, [0.1, 0.0, 0.0], 0.0, 0, k, now - 100_000, pose_t)
        servo.tick(0.0, 0.0, 0.0, None, 0, now, out)
        if lat is not None:
            if stats_from is None:
                stats_from = now + 10 * MS  # first fresh force carrying a pose
            if now >= stats_from:
                expected.append(lat / 1000.0)
        if k < 5:
            assert servo.stats_from_ns == 0
    assert servo.stats_from_ns == stats_from == t0 + 16 * MS   # first posed force at k = 6
    assert len(expected) > 20
    np.testing.assert_array_equal(servo.latencies_us(), expected)


def test_servo_latency_default_waits_one_second(link):
    assert servo_mod.STATS_AFTER_S == 1.0
    servo = Servo(link, 0, TF, SafetyConfig())
    out = np.zeros(3)
    t0 = time.monotonic_ns()
    for k, dt in enumerate([0, 500 * MS, 999 * MS, 1000 * MS, 1200 * MS]):
        now = t0 + dt
        link.write_force(0, [0.0, 0.0, 0.0], 0.0, 0, k, now, now - 300_000)
        servo.tick(0.0, 0.0, 0.0, None, 0, now, out)
    # the ticks at 1.0 s and 1.2 s after the first posed force count; the earlier ones do not
    np.testing.assert_array_equal(servo.latencies_us(), [300.0, 300.0])


def test_latency_histogram_counts_whole_servo_periods():
    # one period after the pose, the next callback woken a little early or late: all in the one-period bin,
    # not split at 1000 us between the first two bins
    one = [999.0, 1000.0, 1000.4, 970.0, 1034.0, 1499.0]
    two = [1500.0, 2004.0, 1996.0]
    hist = servo_mod.latency_histogram(np.array(one + two + [3100.0, 9400.0, 9500.0, 61000.0, 120.0]))
    assert hist == [1, 6, 3, 1, 0, 0, 0, 0, 0, 1, 2]
    assert len(servo_mod.latency_histogram(np.array([]))) == servo_mod.HIST_BINS


# --------------------------------------------------------------------------------------------- PoseTrack
def test_pose_track_sample_and_hold():
    t = np.array([0.1, 0.2, 0.2, 0.5])
    pos = np.arange(12.0).reshape(4, 3)
    tr = PoseTrack(t, pos)
    assert tr.duration == 0.5
    out = np.full(3, -1.0)
    assert tr.pose_at(0.05, out) is False
    assert out.tolist() == [-1.0, -1.0, -1.0]                # untouched before the first sample
    assert tr.pose_at(0.1, out) and out.tolist() == pos[0].tolist()
    assert tr.pose_at(0.15, out) and out.tolist() == pos[0].tolist()      # held, not interpolated
    assert tr.pose_at(0.2, out) and out.tolist() == pos[2].tolist()       # the last of equal times
    assert tr.pose_at(0.2 - 1e-12, out) and out.tolist() == pos[2].tolist()  # float rounding of tick times
    assert tr.pose_at(0.49, out) and out.tolist() == pos[2].tolist()
    assert tr.pose_at(7.0, out) and out.tolist() == pos[3].tolist()       # held after the end


def test_pose_track_cursor_matches_brute_force_with_time_going_back():
    rng = np.random.default_rng(2)
    t = np.cumsum(rng.uniform(0.0, 0.01, 200)) + 0.05
    t[50] = t[49]                                            # a repeated time
    pos = rng.normal(size=(200, 3))
    tr = PoseTrack(t, pos)
    # increasing runs (the replay loop) interrupted by resets to earlier times, some before the first sample
    queries = np.concatenate([np.linspace(0.0, t[-1] + 0.1, 300), np.linspace(0.03, 0.5, 50),
                              rng.uniform(0.0, t[-1] + 0.1, 200)])
    out = np.zeros(3)
    for q in queries:
        idx = np.nonzero(t <= q + 1e-9)[0]
        got = tr.pose_at(q, out)
        if idx.size == 0:
            assert got is False
        else:
            assert got is True
            np.testing.assert_array_equal(out, pos[idx[-1]])


@pytest.mark.parametrize("t, pos", [
    (np.zeros(0), np.zeros((0, 3))),                         # empty
    (np.zeros((2, 1)), np.zeros((2, 3))),                    # t not 1-D
    (np.array([0.0, 1.0]), np.zeros((2, 2))),                # not x, y, z
    (np.array([0.0, 1.0, 2.0]), np.zeros((2, 3))),           # lengths differ
    (np.array([0.0, 2.0, 1.0]), np.zeros((3, 3))),           # time goes back
    (np.array([0.0, np.nan]), np.zeros((2, 3))),
    (np.array([0.0, 1.0]), np.array([[0.0, 0.0, 0.0], [np.inf, 0.0, 0.0]])),
])
def test_pose_track_validation(t, pos):
    with pytest.raises(ValueError):
        PoseTrack(t, pos)


# ---------------------------------------------------------------------------------------- load_pose_tracks
def _write_run(rec, log, ticks, pose_of):
    for k in ticks:
        t = k * 1e-3
        for d in ("stylus0", "stylus1", "vertex5"):
            rec.write(protocol.TOPIC_FORCE, protocol.encode_force(k, t, d, pose_of(d, k), [0.0, 0.0, 0.0], 0.0, 0),
                      log[0], log[0], k)
            log[0] += 1000   # log time is wall time in the daemon's recorder: increasing across a reset


def test_load_pose_tracks_reads_the_first_run_of_each_device(tmp_path):
    path = tmp_path / "replay.mcap"
    log = [1_000_000_000]

    def first(d, k):
        return {"stylus0": [0.01 * k, 0.0, 0.0], "stylus1": [0.0, 0.02 * k, 0.0], "vertex5": [9.0, 9.0, 9.0]}[d]

    with McapRecorder(path, background_flush=False) as rec:
        _write_run(rec, log, range(1, 6), first)
        rec.write(protocol.TOPIC_EVENT, protocol.encode_event(5, 0.005, "reset"), log[0], log[0], 5)
        log[0] += 1000
        # after the reset the time starts over, then passes the first run's end: all of it is ignored
        _write_run(rec, log, range(1, 9), lambda d, k: [-1.0, -1.0, -1.0])
    tracks = load_pose_tracks(path)
    assert set(tracks) == {"stylus0", "stylus1"}                # "vertex5" is a loaded vertex, not a stylus
    for d in ("stylus0", "stylus1"):
        np.testing.assert_array_equal(tracks[d].t, [0.001, 0.002, 0.003, 0.004, 0.005])
        np.testing.assert_array_equal(tracks[d].pos, [first(d, k) for k in range(1, 6)])


def test_load_pose_tracks_replays_the_stylus_not_the_lagging_grasp(tmp_path):
    """After a jump a grasp follows its stylus at the device's max_speed, so `pose` lags `stylus`: the replay
    (and a resimulation, which gathers the paths the same way) drives the device with where the stylus was."""
    path = tmp_path / "lag.mcap"
    with McapRecorder(path, background_flush=False) as rec:
        for k in range(1, 4):
            rec.write(protocol.TOPIC_FORCE, protocol.encode_force(k, k * 1e-3, "stylus0", [0.001 * k, 0.0, 0.0],
                                                                  [0.0, 0.0, 0.0], 0.0, 0, [0.05, 0.0, 0.0]),
                      k, k, k)
    np.testing.assert_array_equal(load_pose_tracks(path)["stylus0"].pos, [[0.05, 0.0, 0.0]] * 3)


def test_load_pose_tracks_without_styluses_raises(tmp_path):
    path = tmp_path / "vertex_only.mcap"
    with McapRecorder(path, background_flush=False) as rec:
        rec.write(protocol.TOPIC_FORCE, protocol.encode_force(1, 0.001, "vertex5", [0, 0, 0], [0, 0, 1], 0.0, 0),
                  1, 1, 1)
    with pytest.raises(ValueError, match="no stylus poses"):
        load_pose_tracks(path)


# ------------------------------------------------------------------------------------------ MessageBuilder
N_TICKS = 300


@pytest.fixture(scope="module")
def knot_run():
    """The two-hand scene with its hands pulling apart from the start, so both grasps carry newtons within a
    few hundred ticks (the shipped timeline keeps them near zero for 8 s); a copy of the state per tick."""
    sc = load_scenario("two-hand-knot", overrides={"timeline": [
        {"grasp": "right", "move_to": [0.48, 0.0, 0.0], "from": 0.0, "to": 0.3},
        {"grasp": "left", "move_to": [-0.03, 0.0, 0.01], "from": 0.0, "to": 0.3}]})
    state = sc.new_state()
    stepper = Stepper(sc.model, state)
    states = []
    for _ in range(N_TICKS):
        stepper.tick()
        states.append(state.copy())
    slots = {g.device: g.slot for g in sc.grasps}
    assert slots == {"stylus0": 0, "stylus1": 1}
    return sc, states, slots


def _check_stream(sc, states, builder, refs, slots, extra_flags=None, corrupt=None):
    """Step ``builder`` over ``states`` against independent pipelines ``refs``; returns per device the forces
    and flags. ``corrupt(k, state)`` may change a copy of the state of tick k first."""
    tick = float(sc.model.solver.tick)
    got = {d: ([], []) for d in slots}
    ref_out = np.zeros(3)
    for k, st in enumerate(states, start=1):
        if corrupt is not None:
            st = st.copy()
            corrupt(k, st)
        for d, f in (extra_flags or {}).items():     # what a driver reports on the link, into its record
            dev = builder.table.get(d)
            if dev is not None:
                dev.driver_flags = f
        payloads = builder.forces(k, st)
        msgs = [protocol.decode_force(p) for p in payloads]
        assert [m["device"] for m in msgs] == ["stylus0", "stylus1"]
        t = float(st.time[0])
        for m in msgs:
            d = m["device"]
            assert m["seq"] == k and m["t"] == t
            ref_flags = refs[d].step(-st.grasp_force[slots[d]], t, t, tick, ref_out)
            np.testing.assert_allclose(m["force"], ref_out, rtol=0, atol=1e-12)
            extra = (extra_flags or {}).get(d, 0)
            assert m["flags"] == ref_flags | extra
            np.testing.assert_array_equal(m["pose"], st.grasp_target[slots[d]])   # its own grasp's target
            got[d][0].append(m["force"])
            got[d][1].append(m["flags"])
    return {d: (np.array(f), np.array(fl)) for d, (f, fl) in got.items()}


@pytest.mark.xdist_group("knot-run")   # one worker runs the module's knot_run (under -n)
def test_builder_each_device_gets_its_own_grasp_through_its_own_pipeline(knot_run):
    sc, states, slots = knot_run
    builder = MessageBuilder(sc)
    refs = {d: ForceSafety(SafetyConfig()) for d in slots}
    got = _check_stream(sc, states, builder, refs, slots)
    f0, f1 = got["stylus0"][0], got["stylus1"][0]
    # not a trivial comparison: newtons, pulling the two hands apart along x (a swap of devices would fail)
    assert np.linalg.norm(f0, axis=1).max() > 2.0 and np.linalg.norm(f1, axis=1).max() > 2.0
    assert f0[-1, 0] < -1.0 and f1[-1, 0] > 1.0


@pytest.mark.xdist_group("knot-run")   # one worker runs the module's knot_run (under -n)
def test_builder_nan_faults_only_that_device(knot_run):
    sc, states, slots = knot_run
    # from a fresh pipeline a NaN grasp force gives exactly zero with FLAG_FAULT
    builder = MessageBuilder(sc)
    bad = states[0].copy()
    bad.grasp_force[slots["stylus0"]] = [np.nan, 0.0, 0.0]
    m0, m1 = (protocol.decode_force(p) for p in builder.forces(1, bad))
    assert m0["force"] == [0.0, 0.0, 0.0] and m0["flags"] & FLAG_FAULT
    assert not m1["flags"] & FLAG_FAULT
    ref = np.zeros(3)
    ForceSafety(SafetyConfig()).step(-bad.grasp_force[slots["stylus1"]], bad.time[0], bad.time[0], 1e-3, ref)
    np.testing.assert_allclose(m1["force"], ref, rtol=0, atol=1e-12)

    # mid-stream, with newtons flowing: NaN on stylus1 from tick 200 on. Its input is zeroed, so its force goes
    # down through the slew limit and low-pass (as the reference pipeline does) and reaches zero; stylus0 is
    # untouched and never flagged.
    def corrupt(k, st):
        if k >= 200:
            st.grasp_force[slots["stylus1"], 1] = np.nan

    builder = MessageBuilder(sc)
    refs = {d: ForceSafety(SafetyConfig()) for d in slots}
    got = _check_stream(sc, states, builder, refs, slots, corrupt=corrupt)
    f1, fl1 = got["stylus1"]
    assert np.all(fl1[199:] & FLAG_FAULT) and not np.any(fl1[:199] & FLAG_FAULT)
    assert not np.any(got["stylus0"][1] & FLAG_FAULT)
    assert np.linalg.norm(f1[198]) > 1.0                    # it was carrying force before the fault
    assert np.all(np.linalg.norm(f1[240:], axis=1) < 1e-9)  # and is at zero 40 ms after it
    assert np.linalg.norm(got["stylus0"][0][-1]) > 1.0


@pytest.mark.xdist_group("knot-run")   # one worker runs the module's knot_run (under -n)
def test_builder_extra_flags_go_to_that_device_only(knot_run):
    sc, states, slots = knot_run
    builder = MessageBuilder(sc)
    refs = {d: ForceSafety(SafetyConfig()) for d in slots}
    extra = {"stylus1": FLAG_WATCHDOG | 0x100, "stylus7": FLAG_FAULT}   # a device without a stream has no record
    got = _check_stream(sc, states[:100], builder, refs, slots, extra_flags=extra)
    assert np.all(got["stylus1"][1] & (FLAG_WATCHDOG | 0x100) == (FLAG_WATCHDOG | 0x100))
    assert not np.any(got["stylus0"][1] & (FLAG_WATCHDOG | 0x100 | FLAG_FAULT))


@pytest.mark.xdist_group("knot-run")   # one worker runs the module's knot_run (under -n)
def test_builder_device_limit_clamps_that_device_only(knot_run):
    sc, states, slots = knot_run
    builder = MessageBuilder(sc, limits={"stylus0": 1.0})
    refs = {"stylus0": ForceSafety(SafetyConfig(), 1.0), "stylus1": ForceSafety(SafetyConfig())}
    got = _check_stream(sc, states, builder, refs, slots)
    f0, fl0 = got["stylus0"]
    f1, _ = got["stylus1"]
    assert np.linalg.norm(f0, axis=1).max() <= 1.0 + 1e-12
    assert np.any(fl0 & FLAG_CLAMPED)
    assert np.linalg.norm(f1, axis=1).max() > 2.0           # the other hand still gets its full force


# ------------------------------------------------------------------------------------ scripted stylus paths
def _default_with(timeline) -> dict:
    data = yaml.safe_load((SCENARIOS_DIR / "default.yaml").read_text())
    data["timeline"] = timeline
    return data


def grasp_at(sc, slot: int, t: float) -> np.ndarray:
    """The grasp target at time t, integrated by the solver's own motion kernel over [0, t]."""
    m = sc.model
    target = sc.initial.grasp_target.copy()
    st = sc.initial.copy()
    apply_motions(0.0, t, m.mot_kind, m.mot_index, m.mot_t0, m.mot_t1, m.mot_vel,
                  st.kin_target, target, np.zeros(2), st.nst, st.grasp_k, st.grasp_c, st.grasp_fmax)
    return target[slot]


def waypoint_times(sc, slot: int) -> np.ndarray:
    m = sc.model
    sel = (m.mot_kind == MOTION_GRASP) & (m.mot_index == slot)
    return np.unique(np.concatenate([m.mot_t0[sel], m.mot_t1[sel]]))


@pytest.mark.parametrize("normal, radius, turns, a, b", [
    (None, 0.05, 1, 0.0, 4.0),
    ([0.3, -0.1, 0.9], 0.03, 2, 1.0, 3.0),
])
def test_circle_path_closes_and_is_a_circle(normal, radius, turns, a, b):
    entry = {"grasp": "right", "path": "circle", "radius": radius, "turns": turns, "from": a, "to": b}
    if normal is not None:
        entry["normal"] = normal
    sc = build_scenario(_default_with([entry]), "circle.yaml")
    n = np.array([0.0, 0.0, 1.0] if normal is None else normal)
    n /= np.linalg.norm(n)
    start = sc.initial.grasp_target[0].copy()
    np.testing.assert_allclose(grasp_at(sc, 0, a), start, atol=1e-15)
    np.testing.assert_allclose(grasp_at(sc, 0, b), start, atol=1e-12)   # back at the start
    period = (b - a) / turns
    # centre: the mean over one turn sampled uniformly in time (the 48-gon is symmetric under its rotation)
    ts = a + period * np.arange(4800) / 4800
    pts = np.array([grasp_at(sc, 0, t) for t in ts])
    c = pts.mean(axis=0)
    assert np.linalg.norm(start - c) == pytest.approx(radius, rel=1e-9)
    # half a turn in: diametrically opposite the start
    np.testing.assert_allclose(grasp_at(sc, 0, a + period / 2), 2 * c - start, atol=0.003 * radius)
    # every point on the circle (chords sit at most 0.3 % inside) and in the plane normal to `normal`
    d = np.linalg.norm(pts - c, axis=1)
    assert d.max() <= radius * (1 + 1e-9) and d.min() >= radius * (1 - 0.003)
    np.testing.assert_allclose((pts - start) @ n, 0.0, atol=1e-12)
    assert grasp_at(sc, 0, b + 1.0).tolist() == grasp_at(sc, 0, b).tolist()   # and stays there


def test_wrap_path_keeps_its_radius_and_advances_along_the_axis():
    around, axis, advance, a, b = np.array([0.3, 0.0, -0.02]), np.array([0.0, 1.0, 1.0]), 0.04, 0.5, 2.5
    sc = build_scenario(_default_with([{"grasp": "right", "path": "wrap", "around": around.tolist(),
                                        "axis": axis.tolist(), "advance": advance, "turns": 2,
                                        "from": a, "to": b}]), "wrap.yaml")
    ax = axis / np.linalg.norm(axis)
    here = sc.initial.grasp_target[0].copy()

    def polar(p):
        rel = p - around
        s = rel @ ax
        return np.linalg.norm(rel - s * ax), s

    r0, s0 = polar(here)
    times = waypoint_times(sc, 0)
    assert times[0] == a and times[-1] == b and len(times) == 97    # 2 turns of 48 points
    for t in times:
        r, s = polar(grasp_at(sc, 0, t))
        assert r == pytest.approx(r0, rel=1e-12, abs=1e-15)
        assert s - s0 == pytest.approx(advance * (t - a) / (b - a), abs=1e-12)
    np.testing.assert_allclose(grasp_at(sc, 0, b), here + advance * ax, atol=1e-12)  # whole turns: same angle
    # the shipped knot: the wrap starts where the waypoints left the right hand and ends 5 cm further along x
    knot = load_scenario("two-hand-knot")
    np.testing.assert_allclose(grasp_at(knot, 0, 4.0), [0.12, 0.03, 0.03], atol=1e-12)
    np.testing.assert_allclose(grasp_at(knot, 0, 8.0), [0.17, 0.03, 0.03], atol=1e-12)


def test_lift_and_pull_path_from_where_the_stylus_is():
    lift, pull = 0.03, np.array([-0.1, 0.02, 0.0])
    sc = build_scenario(_default_with([
        {"grasp": "right", "move_to": [0.40, 0.0, 0.05], "from": 0.0, "to": 1.0},
        {"grasp": "right", "path": "lift_and_pull", "lift": lift, "pull": pull.tolist(), "from": 1.0, "to": 4.0},
    ]), "lift.yaml")
    here = np.array([0.40, 0.0, 0.05])            # where the earlier entry left it at `from`
    up = here + [0.0, 0.0, lift]
    np.testing.assert_allclose(grasp_at(sc, 0, 1.0), here, atol=1e-12)
    np.testing.assert_allclose(grasp_at(sc, 0, 1.5), here + [0.0, 0.0, lift / 2], atol=1e-12)
    np.testing.assert_allclose(grasp_at(sc, 0, 2.0), up, atol=1e-12)          # a + (b - a) / 3
    np.testing.assert_allclose(grasp_at(sc, 0, 3.0), up + pull / 2, atol=1e-12)
    np.testing.assert_allclose(grasp_at(sc, 0, 4.0), up + pull, atol=1e-12)


@pytest.mark.parametrize("entry, key", [
    ({"grasp": "right", "path": "spiral", "from": 0.0, "to": 1.0}, "timeline[0].path"),
    # the default stylus sits at the thread's end, on the x axis through the origin
    ({"grasp": "right", "path": "wrap", "around": [0.0, 0.0, 0.0], "axis": [1.0, 0.0, 0.0], "from": 0.0,
      "to": 1.0}, "timeline[0].around"),
    ({"grasp": "right", "path": "circle", "from": 0.0, "to": 1.0}, "timeline[0].radius"),
    ({"grasp": "right", "path": "circle", "radius": 0.01, "from": 0.0, "to": 1.0, "centre": [0, 0, 0]},
     "timeline[0].centre"),
])
def test_bad_paths_raise_config_error_naming_the_key(entry, key):
    with pytest.raises(ConfigError) as exc:
        build_scenario(_default_with([entry]), "bad.yaml")
    assert exc.value.key == key
    assert str(exc.value).startswith(f"bad.yaml: {key}: ")


# ------------------------------------------------------------------------------------------ process stop
def test_a_stop_signal_only_marks_the_request_and_is_set_passes_it_to_the_shared_flag():
    """haptics/process.py: the handler touches nothing shared (it may interrupt a thread inside anything);
    the next is_set() sets the flag the child processes read."""
    import multiprocessing
    import os
    import signal

    from suturesim.haptics.process import StopRequest, shared_flag

    flag = shared_flag(multiprocessing.get_context("spawn"))
    req = StopRequest(flag, (signal.SIGUSR2,))
    try:
        assert not req.is_set() and flag.value == 0
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.01)          # the handler has run by now (any bytecode boundary)
        assert req.signalled and flag.value == 0
        assert req.is_set() and flag.value == 1
        child = StopRequest(flag, ())   # what a child process holds: set through the flag alone
        assert child.is_set() and child.wait(10.0)
    finally:
        req.restore()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
