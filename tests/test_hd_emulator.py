"""libHD emulator (haptics/hd_emulator.c + haptics/emulator.py) driven end to end through pyOpenHaptics.

pyOpenHaptics loads ``CDLL("libHD.so")`` at import and the dynamic loader reads ``LD_LIBRARY_PATH`` only at process
start, so every scenario runs in a child process (``sys.executable``) with :func:`emulator_env`. A child prints one
``RESULT <json>`` line; the parent asserts on it and on the emulator's binary log.
"""

from __future__ import annotations

import concurrent.futures
import ctypes.util
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from suturesim.haptics.emulator import (
    CAP_FORCE_OUTPUT,
    CAP_MAX_FORCE_CLAMPING,
    CAP_SOFTWARE_FORCE_LIMIT,
    ENV_FAULT,
    ENV_LOG,
    ENV_MAX_CONTINUOUS_FORCE,
    ENV_SCRIPT,
    ENV_SCRIPTS,
    LOG_DISABLE,
    LOG_DTYPE,
    LOG_ENABLE,
    LOG_ERROR_PUSHED,
    LOG_FORCE,
    LOG_INIT,
    LOG_MOTORS_OFF,
    LOG_ORIENT,
    LOG_POSE,
    LOG_SCHED_START,
    LOG_SCHED_STOP,
    LOG_STUCK,
    MOTORS_OFF_DEVICE_DISABLED,
    MOTORS_OFF_SCHEDULER_STOPPED,
    EmulatorBuildError,
    build_emulator,
    emulator_env,
    read_log,
    write_script,
)

HD_INVALID_HANDLE = 0xFFFFFFFF
HD_INVALID_ENUM, HD_INVALID_VALUE, HD_INVALID_OPERATION, HD_BAD_HANDLE = 0x0100, 0x0101, 0x0103, 0x0104
HD_EXCEEDED_MAX_FORCE_IMPULSE = 0x0202
HD_DEVICE_ALREADY_INITIATED, HD_COMM_CONFIG_ERROR = 0x0301, 0x0303
HD_ILLEGAL_BEGIN, HD_ILLEGAL_END = 0x0400, 0x0401
HD_MAX_FORCE_CLAMPING, HD_SOFTWARE_FORCE_LIMIT = 0x4001, 0x4003

# Prepended to every child. The atexit hook stops the servo thread before interpreter shutdown even when a child
# fails half-way, so no callback ever calls into a finalising interpreter.
PRELUDE = """\
import atexit, ctypes, json, sys, threading, time
_hd_for_exit = ctypes.CDLL("libHD.so")
atexit.register(_hd_for_exit.hdStopScheduler)
def emit(obj):
    print("RESULT " + json.dumps(obj), flush=True)
"""

# pyOpenHaptics' standard servo session (HapticDevice + hd_callback) used by several tests: it records what the
# callback saw, commands a force in 3 frames out of 4, toggles HD_MAX_FORCE_CLAMPING from the main thread, and
# measures the callback rate over 0.5 s.
DEVICE_SESSION = """\
import pyOpenHaptics.hd as hd
from pyOpenHaptics.hd_define import HD_CURRENT_POSITION, HD_CURRENT_VELOCITY, HD_LAST_BUTTONS, HD_MAX_FORCE_CLAMPING
from pyOpenHaptics.hd_define import HDint
from pyOpenHaptics.hdu_matrix import hduVector3Dd
from pyOpenHaptics.hd_callback import hd_callback
from pyOpenHaptics.hd_device import HapticDevice

calls = []  # per callback: thread id, transform (4x4), position, velocity, buttons, last buttons

@hd_callback
def servo():
    k = len(calls) + 1
    transform = hd.get_transform()
    pos = hd._get_doublev(HD_CURRENT_POSITION, hduVector3Dd)
    vel = hd._get_doublev(HD_CURRENT_VELOCITY, hduVector3Dd)
    last = hd._get_integerv(HD_LAST_BUTTONS, HDint).value
    calls.append([threading.get_ident(), [list(r) for r in transform], list(pos), list(vel), hd.get_buttons(), last])
    if k % 4:
        hd.set_force([k * 1e-3, -k * 1e-3, 0.25])

device = HapticDevice(servo)
hd._lib_hd.hdEnable(HD_MAX_FORCE_CLAMPING)
time.sleep(0.2)
n0, t0 = len(calls), time.perf_counter()
time.sleep(0.5)
n1, t1 = len(calls), time.perf_counter()
hd._lib_hd.hdDisable(HD_MAX_FORCE_CLAMPING)
time.sleep(0.3)
device.close()
n_closed = len(calls)
time.sleep(0.05)
emit(dict(calls=calls, n0=n0, n1=n1, t0=t0, t1=t1, n_closed=n_closed, n_later=len(calls), handle=device.id,
          main_tid=threading.get_ident(), model=hd.get_model(), vendor=hd.get_vendor()))
"""

# Script of DEVICE_SESSION: holds before 0.1 s, three linear segments, a button step written as two rows at the same
# time (0.5 s: the later row, buttons 2, wins; buttons 3 must never be seen), hold after 0.7 s.
SCRIPT_ROWS = [
    (0.1, 10.0, 20.0, 30.0, 0),
    (0.3, 30.0, 0.0, 30.0, 1),
    (0.5, 40.0, -10.0, 30.0, 3),
    (0.5, 40.0, -10.0, 30.0, 2),
    (0.7, 40.0, -10.0, 60.0, 0),
]


def run_child(body: str, env: dict[str, str], cwd: Path, timeout: float = 30.0):
    """Run PRELUDE + body in a fresh interpreter; return (the RESULT object, the CompletedProcess)."""
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert proc.returncode == 0, f"child exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0][len("RESULT "):]), proc


def expected_pose(t: np.ndarray, rows=SCRIPT_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Independent reference of the script semantics: positions (n, 3) mm and buttons (n,) at times t (s)."""
    ts = np.array([r[0] for r in rows])
    pos = np.column_stack([np.interp(t, ts, [r[i] for r in rows]) for i in (1, 2, 3)])
    idx = np.searchsorted(ts, t, side="right") - 1  # last row with t_row <= t
    buttons = np.where(idx < 0, 0, np.array([r[4] for r in rows])[np.maximum(idx, 0)])
    return pos, buttons


def kinds(log: np.ndarray) -> list[int]:
    return [int(k) for k in log["kind"]]


# ------------------------------------------------------------------------------------------------ fixtures
# under -n one worker runs the module: its tests share the module's emulator build and pyOpenHaptics session
pytestmark = pytest.mark.xdist_group("hd-emulator")


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory) -> Path:
    return build_emulator(tmp_path_factory.mktemp("hd-emulator"))


@pytest.fixture(scope="module")
def session(lib_dir, tmp_path_factory):
    """One DEVICE_SESSION run shared by the rate/transform/buttons/force/stop tests (about 1 s)."""
    tmp = tmp_path_factory.mktemp("session")
    script = write_script(tmp / "script.txt", SCRIPT_ROWS)
    env = emulator_env(lib_dir, script=script, log=tmp / "hd.log")
    res, proc = run_child(DEVICE_SESSION, env, tmp)
    return res, read_log(tmp / "hd.log"), proc


# ------------------------------------------------------------------------------------------ python helpers
def test_build_default_cache_concurrent_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # Two builders at once (pytest-xdist workers): each renames a complete library into place.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        dirs = list(pool.map(lambda _: build_emulator(), range(2)))
    assert dirs[0] == dirs[1]
    out = dirs[0]
    assert out.parent == tmp_path / "cache" / "suturesim" / "hd-emulator"
    assert len(out.name) == 16 and int(out.name, 16) >= 0
    lib = out / "libHD.so"
    assert sorted(p.name for p in out.iterdir()) == ["libHD.so", "libHD.so.sha256"]  # no temp file left behind
    assert lib.read_bytes()[:4] == b"\x7fELF"  # (not dlopen'ed here: the library stays out of the pytest process)
    mtime = lib.stat().st_mtime_ns
    assert build_emulator() == out and lib.stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_build_without_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(EmulatorBuildError, match="not found"):
        build_emulator(tmp_path / "out")


def test_env_script_and_log_helpers(tmp_path, lib_dir):
    base = {"LD_LIBRARY_PATH": "/opt/x", ENV_FAULT: "stuck@1", ENV_LOG: "/old", "KEEP": "1"}
    env = emulator_env(lib_dir, script=tmp_path / "s.txt", fault=["nocal", "error:0x0202@0.5"],
                       max_continuous_force=1.25, base=base)
    assert env["LD_LIBRARY_PATH"] == f"{lib_dir}{os.pathsep}/opt/x"
    assert env[ENV_SCRIPT] == str(tmp_path / "s.txt") and env[ENV_FAULT] == "nocal,error:0x0202@0.5"
    assert env[ENV_MAX_CONTINUOUS_FORCE] == "1.25" and env["KEEP"] == "1"
    assert ENV_LOG not in env  # an inherited setting must not leak into the child
    assert base[ENV_LOG] == "/old"  # base untouched
    assert emulator_env(lib_dir, base={})["LD_LIBRARY_PATH"] == str(lib_dir)

    p = write_script(tmp_path / "s.txt", [(0, 1, 2, 3, 0), (0.1, 0.1, 1e-17, -3, 5)])
    assert p.read_text().splitlines()[1:] == ["0.0 1.0 2.0 3.0 0", "0.1 0.1 1e-17 -3.0 5"]
    for bad in ([(0, 1, 2, 3)], [(0, 1, 2, float("nan"), 0)], [(0, 0, 0, 0, -1)], [(0, 0, 0, 0, 1.5)],
                [(1, 0, 0, 0, 0), (0.5, 0, 0, 0, 0)]):
        with pytest.raises(ValueError):
            write_script(tmp_path / "bad.txt", bad)

    recs = np.zeros(3, LOG_DTYPE)
    recs["kind"], recs["t_ns"], recs["d"] = [1, 2, 10], [5, -6, 7], [0.5, 1.5, 2.5]
    (tmp_path / "log").write_bytes(recs.tobytes() + b"\x01" * 20)  # + a torn record
    back = read_log(tmp_path / "log")
    assert back.dtype == LOG_DTYPE and back.tobytes() == recs.tobytes()
    assert read_log(tmp_path / "log").flags.writeable


def test_script_orientation_rows_and_named_scripts_env(tmp_path, lib_dir):
    p = write_script(tmp_path / "q.txt", [(0, 1, 2, 3, 0, 1, 0, 0, 0), (0.5, 1, 2, 3, 2, 0, 0, -3, 0.5)])
    assert p.read_text().splitlines() == ["# t_s x_mm y_mm z_mm buttons qw qx qy qz",
                                          "0.0 1.0 2.0 3.0 0 1.0 0.0 0.0 0.0", "0.5 1.0 2.0 3.0 2 0.0 0.0 -3.0 0.5"]
    for bad in ([(0, 0, 0, 0, 0, 1, 0, 0)], [(0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 1, 0, 0, 0)],
                [(0, 0, 0, 0, 0, 1, 0, 0, 0), (1, 0, 0, 0, 0)], [(0, 0, 0, 0, 0, 0, 0, 0, 0)],
                [(0, 0, 0, 0, 0, 1, float("inf"), 0, 0)], [(0, 0, 0, 0, 1.5, 1, 0, 0, 0)]):
        with pytest.raises(ValueError):
            write_script(tmp_path / "bad.txt", bad)

    env = emulator_env(lib_dir, script="/s/default.txt", scripts={"Right Device": "/s/r.txt", "L": tmp_path / "l"},
                       base={ENV_SCRIPTS: "old=/x"})
    assert env[ENV_SCRIPT] == "/s/default.txt" and env[ENV_SCRIPTS] == f"Right Device=/s/r.txt;L={tmp_path / 'l'}"
    assert ENV_SCRIPTS not in emulator_env(lib_dir, base={ENV_SCRIPTS: "old=/x"})   # not inherited
    assert ENV_SCRIPTS not in emulator_env(lib_dir, scripts={}, base={})
    for name, path in (("a=b", "/p"), ("a;b", "/p"), ("", "/p"), (" a", "/p"), ("a", "/p;q")):
        with pytest.raises(ValueError):
            emulator_env(lib_dir, scripts={name: path}, base={})


# ------------------------------------------------------------------------------------------------ loading
def test_library_loads_via_ld_library_path(lib_dir, tmp_path):
    res, _ = run_child(
        """
        import pyOpenHaptics, pyOpenHaptics.hd as hd
        maps = [ln.split()[-1] for ln in open("/proc/self/maps") if ln.rstrip().endswith("libHD.so")]
        emit(dict(maps=sorted(set(maps)), model=hd.get_model(), vendor=hd.get_vendor()))
        """,
        emulator_env(lib_dir), tmp_path,
    )
    assert res == {"maps": [str(lib_dir / "libHD.so")], "model": "suturesim emulator", "vendor": "suturesim"}


def test_without_ld_library_path_pyopenhaptics_import_fails(tmp_path):
    if ctypes.util.find_library("HD"):
        pytest.skip("a libHD is installed system-wide")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH" and not k.startswith("SUTURESIM_HD_EMU")}
    proc = subprocess.run([sys.executable, "-c", "import pyOpenHaptics"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1
    assert "OSError" in proc.stderr and "libHD.so" in proc.stderr


# ----------------------------------------------------------------------------------- the pyOpenHaptics session
@pytest.mark.timed   # the servo's rate
def test_callback_runs_at_1khz_on_its_own_thread(session):
    res, _, proc = session
    count, elapsed = res["n1"] - res["n0"], res["t1"] - res["t0"]
    # time.sleep(0.5) may overshoot; normalise the count to exactly 0.5 s.
    assert 450 <= count * 0.5 / elapsed <= 550, (count, elapsed)
    tids = {c[0] for c in res["calls"]}
    assert len(tids) == 1 and res["main_tid"] not in tids
    assert "Intialized device! suturesim/suturesim emulator" in proc.stdout  # pyOpenHaptics' own print, sic
    assert (res["model"], res["vendor"]) == ("suturesim emulator", "suturesim")


def test_pose_log_follows_script(session):
    _, log, _ = session
    start = log["t_ns"][log["kind"] == LOG_SCHED_START]
    assert len(start) == 1
    pose = log[log["kind"] == LOG_POSE]
    assert np.all(np.diff(pose["t_ns"]) % 1_000_000 == 0)  # deadlines on the 1 ms grid
    t = (pose["t_ns"] - start[0]) / 1e9
    assert t[0] == 0.0 and t[-1] > 0.9
    want_pos, want_buttons = expected_pose(t)
    np.testing.assert_allclose(np.column_stack([pose["a"], pose["b"], pose["c"]]), want_pos, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(pose["d"], want_buttons)


def aligned_ticks(log: np.ndarray) -> np.ndarray:
    """The POSE record of each callback's tick (the POSE just before each FORCE), checking that they alternate."""
    pf = log[np.isin(log["kind"], [LOG_POSE, LOG_FORCE])]  # main-thread ENABLE/DISABLE records may interleave
    first = int(np.argmax(pf["kind"] == LOG_FORCE))
    tail = pf[first - 1:]
    assert np.all(tail["kind"][0::2] == LOG_POSE) and np.all(tail["kind"][1::2] == LOG_FORCE)
    assert len(tail) % 2 == 0  # the scheduler stops between ticks, never between a tick's POSE and its FORCE
    return tail[0::2]


def test_transform_and_velocity_follow_script(session):
    res, log, _ = session
    calls = res["calls"]
    ticks = aligned_ticks(log)
    assert len(ticks) == len(calls) == res["n_closed"] == res["n_later"]
    transform = np.array([c[1] for c in calls])  # (n, 4, 4) as indexed by pyOpenHaptics: [column][row]
    pos, vel = np.array([c[2] for c in calls]), np.array([c[3] for c in calls])
    np.testing.assert_array_equal(transform[:, :3, :3], np.broadcast_to(np.eye(3), (len(calls), 3, 3)))
    np.testing.assert_array_equal(transform[:, :3, 3], 0.0)
    np.testing.assert_array_equal(transform[:, 3, 3], 1.0)
    np.testing.assert_array_equal(transform[:, 3, :3], pos)  # translation in elements 12..14 (column-major)
    # Each callback sees its own tick's pose, exactly.
    np.testing.assert_array_equal(pos, np.column_stack([ticks["a"], ticks["b"], ticks["c"]]))
    # The path was covered: start hold, interior of a segment, end hold.
    assert np.any(np.all(pos == [10, 20, 30], axis=1)) and np.any(np.all(pos == [40, -10, 60], axis=1))
    assert np.any((pos[:, 0] > 10) & (pos[:, 0] < 30))
    # Velocity: finite difference over one tick, mm/s, e.g. (100, -100, 0) on the first segment, 150 on z later.
    pose = log[log["kind"] == LOG_POSE]
    p = np.column_stack([pose["a"], pose["b"], pose["c"]])
    fd = np.diff(p, axis=0) / (np.diff(pose["t_ns"])[:, None] / 1e9)
    idx = np.searchsorted(pose["t_ns"], ticks["t_ns"])
    np.testing.assert_allclose(vel, fd[idx - 1], rtol=0, atol=1e-6)
    for v in ([100, -100, 0], [50, -50, 0], [0, 0, 150], [0, 0, 0]):
        assert np.any(np.all(np.abs(vel - v) < 1e-6, axis=1)), v


def test_buttons_follow_script(session):
    res, log, _ = session
    ticks = aligned_ticks(log)
    buttons = np.array([c[4] for c in res["calls"]])
    last = np.array([c[5] for c in res["calls"]])
    np.testing.assert_array_equal(buttons, ticks["d"])
    np.testing.assert_array_equal(last[1:], buttons[:-1])  # HD_LAST_BUTTONS = previous tick's
    changes = [int(b) for i, b in enumerate(buttons) if i == 0 or b != buttons[i - 1]]
    assert changes == [0, 1, 2, 0]  # 3 is overridden by the later row at the same time


def test_forces_logged_at_end_frame_with_capability_mask(session):
    res, log, _ = session
    forces = log[log["kind"] == LOG_FORCE]
    k = np.arange(1, len(forces) + 1)
    set_in_frame = k % 4 != 0
    want = np.where(set_in_frame[:, None], np.column_stack([k * 1e-3, -k * 1e-3, np.full(len(k), 0.25)]), 0.0)
    # Exact: the double the callback passed is the double logged; a frame that set nothing commands zero.
    np.testing.assert_array_equal(np.column_stack([forces["a"], forces["b"], forces["c"]]), want)
    assert np.all(forces["d"] == res["handle"]) and res["handle"] == 0
    # The mask follows the main thread's hdEnable/hdDisable of HD_MAX_FORCE_CLAMPING, in log order.
    ks = kinds(log)
    i_on = ks.index(LOG_ENABLE, ks.index(LOG_ENABLE) + 1)
    i_off = ks.index(LOG_DISABLE)
    assert log["code"][ks.index(LOG_ENABLE)] == 0x4000 and ks.index(LOG_ENABLE) < ks.index(LOG_FORCE)
    assert log["code"][i_on] == HD_MAX_FORCE_CLAMPING == log["code"][i_off]
    order = np.arange(len(log))[log["kind"] == LOG_FORCE]
    on = CAP_FORCE_OUTPUT | CAP_MAX_FORCE_CLAMPING
    np.testing.assert_array_equal(forces["code"], np.where((order > i_on) & (order < i_off), on, CAP_FORCE_OUTPUT))
    assert np.sum(forces["code"] == on) > 400


def test_close_logs_sched_stop_and_motors_off(session):
    res, log, _ = session
    tail = log[-3:]
    assert kinds(tail) == [LOG_SCHED_STOP, LOG_MOTORS_OFF, LOG_MOTORS_OFF]
    assert [int(c) for c in tail["code"]] == [0, MOTORS_OFF_SCHEDULER_STOPPED, MOTORS_OFF_DEVICE_DISABLED]
    assert tail["d"][1] == tail["d"][2] == res["handle"]
    assert tail[1:][["a", "b", "c"]].tolist() == [(0.0, 0.0, 0.0)] * 2
    assert res["n_later"] == res["n_closed"]  # no callback after stop_scheduler


# ------------------------------------------------------------------------------------------------ orientation
# A 90 degree turn about the device's y axis over 0.3 s, then 90 degrees more over 0.2 s to a row written as -3
# times its unit quaternion (normalised, and the shorter arc: on to 180 degrees, not 270 back), held after 0.6 s.
# Button 2 alone is pressed from 0.4 s.
C45, S45 = math.cos(math.pi / 4), math.sin(math.pi / 4)
TURN_ROWS = [
    (0.1, 0.0, 0.0, 0.0, 0, 1.0, 0.0, 0.0, 0.0),
    (0.4, 10.0, 0.0, 0.0, 2, C45, 0.0, S45, 0.0),
    (0.6, 10.0, 0.0, 5.0, 2, 0.0, 0.0, -3.0, 0.0),
]


def turn_angle(t: np.ndarray) -> np.ndarray:
    """Independent reference of the turn: slerp about a fixed axis turns at a constant rate within each segment."""
    return np.interp(t, [0.1, 0.4, 0.6], [0.0, math.pi / 2, math.pi])


def rot_y(theta: np.ndarray) -> np.ndarray:
    c, s = np.cos(theta), np.sin(theta)
    z, o = np.zeros_like(theta), np.ones_like(theta)
    return np.stack([np.stack([c, z, s], -1), np.stack([z, o, z], -1), np.stack([-s, z, c], -1)], -2)


@pytest.fixture(scope="module")
def turn_session(lib_dir, tmp_path_factory):
    """pyOpenHaptics' servo session on TURN_ROWS, recording the transform and buttons of every callback."""
    tmp = tmp_path_factory.mktemp("turn")
    env = emulator_env(lib_dir, script=write_script(tmp / "turn.txt", TURN_ROWS), log=tmp / "hd.log")
    res, _ = run_child(
        """
        import pyOpenHaptics.hd as hd
        from pyOpenHaptics.hd_callback import hd_callback
        from pyOpenHaptics.hd_device import HapticDevice
        calls = []
        @hd_callback
        def servo():
            calls.append([[list(r) for r in hd.get_transform()], hd.get_buttons()])
        device = HapticDevice(servo)
        time.sleep(0.8)
        device.close()
        emit(dict(calls=calls))
        """, env, tmp)
    return res, read_log(tmp / "hd.log")


def test_orientation_log_is_slerp_along_the_shorter_arc(turn_session):
    _, log = turn_session
    start = log["t_ns"][log["kind"] == LOG_SCHED_START][0]
    ks = np.array(kinds(log))
    i_pose = np.nonzero(ks == LOG_POSE)[0]
    assert np.all(ks[i_pose + 1] == LOG_ORIENT)          # each tick's orientation right after its position
    pose, orient = log[i_pose], log[i_pose + 1]
    np.testing.assert_array_equal(orient["t_ns"], pose["t_ns"])
    assert np.all(orient["code"] == 0) and np.all(pose["code"] == 0)   # the handle
    t = (orient["t_ns"] - start) / 1e9
    assert t[-1] > 0.7
    half = turn_angle(t) / 2
    want = np.column_stack([np.cos(half), np.zeros_like(half), np.sin(half), np.zeros_like(half)])
    # the sign stays continuous into the hold: (0, 0, 1, 0) after 0.6 s, though the row says (0, 0, -3, 0)
    np.testing.assert_allclose(np.column_stack([orient[k] for k in "abcd"]), want, rtol=0, atol=1e-12)
    mid = np.degrees(turn_angle(t))
    assert np.any((mid > 10) & (mid < 80)) and np.any((mid > 100) & (mid < 170))   # sampled inside both turns


def test_transform_carries_the_scripted_orientation(turn_session):
    res, log = turn_session
    ticks = aligned_ticks(log)
    start = log["t_ns"][log["kind"] == LOG_SCHED_START][0]
    t = (ticks["t_ns"] - start) / 1e9
    transform = np.array([c[0] for c in res["calls"]])   # [column][row], as pyOpenHaptics indexes it
    assert len(transform) == len(ticks)
    # the rotation block is R (column-major: its transpose as [column][row]), the translation the position
    np.testing.assert_allclose(transform[:, :3, :3], np.transpose(rot_y(turn_angle(t)), (0, 2, 1)), rtol=0,
                               atol=1e-12)
    np.testing.assert_array_equal(transform[:, 3, :3], np.column_stack([ticks["a"], ticks["b"], ticks["c"]]))
    np.testing.assert_array_equal(transform[:, :3, 3], 0.0)
    np.testing.assert_array_equal(transform[:, 3, 3], 1.0)
    buttons = np.array([c[1] for c in res["calls"]])
    np.testing.assert_array_equal(buttons, np.where(t >= 0.4, 2, 0))   # HD_DEVICE_BUTTON_2 alone


# ---------------------------------------------------------------------------------------------------- faults
def test_fault_missing(lib_dir, tmp_path):
    res, proc = run_child(
        """
        import pyOpenHaptics.hd as hd
        from pyOpenHaptics.hd_define import HDErrorInfo
        first = hd.init_device()
        info = hd._get_error()
        second = hd.init_device()
        try:
            hd.get_error()
            raised = None
        except Exception as e:
            raised = [type(e).__name__, e.args[0]]
        emit(dict(first=first, second=second, err=[info.errorCode, info.internalErrorCode, info.hHD], raised=raised))
        """,
        emulator_env(lib_dir, log=tmp_path / "hd.log", fault="missing"), tmp_path,
    )
    # The emulator fails like libHD: HD_INVALID_HANDLE plus HD_COMM_CONFIG_ERROR on the error stack. pyOpenHaptics
    # 1.0.1's init_device compares the handle with HD_BAD_HANDLE (0x104, an *error code*), so it neither prints
    # "Unable to initialize the device" nor returns None: it returns 0xFFFFFFFF as if it were a device. Its get_error
    # then raises KeyError, since 0x303 is not in its exception table. A driver must check hdGetError itself.
    assert res["first"] == res["second"] == HD_INVALID_HANDLE
    assert "Unable to initialize" not in proc.stdout
    assert res["err"] == [HD_COMM_CONFIG_ERROR, -1, HD_INVALID_HANDLE]
    assert res["raised"] == ["KeyError", HD_COMM_CONFIG_ERROR]
    log = read_log(tmp_path / "hd.log")
    assert kinds(log) == [LOG_ERROR_PUSHED, LOG_INIT] * 2
    assert np.all(log["code"][1::2] == HD_INVALID_HANDLE) and np.all(log["code"][0::2] == HD_COMM_CONFIG_ERROR)


@pytest.mark.timed   # servo ticks counted over wall-clock sleeps
def test_fault_error_ends_pyopenhaptics_callback(lib_dir, tmp_path):
    res, proc = run_child(
        """
        import pyOpenHaptics.hd as hd
        from pyOpenHaptics.hd_callback import hd_callback
        from pyOpenHaptics.hd_device import HapticDevice
        n = [0]
        @hd_callback
        def servo():
            n[0] += 1
        device = HapticDevice(servo)
        time.sleep(0.15)
        before = n[0]
        time.sleep(0.25)
        mid = n[0]
        time.sleep(0.25)
        late = n[0]
        wait = hd._lib_hd.hdWaitForCompletion
        wait.argtypes, wait.restype = [ctypes.c_ulong, ctypes.c_uint], ctypes.c_ubyte
        still_scheduled = wait(1, 0)  # handle 1: the only callback ever scheduled; HD_WAIT_CHECK_STATUS
        device.close()
        emit(dict(before=before, mid=mid, late=late, still_scheduled=still_scheduled))
        """,
        emulator_env(lib_dir, log=tmp_path / "hd.log", fault="error:0x0202@0.2"), tmp_path,
    )
    # The known pyOpenHaptics trap: hd_callback's wrapper calls get_error() after every frame; for an error code
    # missing from its exception table (HD_EXCEEDED_MAX_FORCE_IMPULSE here) `except exception_dict[error]` itself
    # raises KeyError. ctypes prints "Exception ignored on calling ctypes callback function" with the traceback and
    # does not set the return value; observed (CPython 3.11, x86-64) it reads as 0 = HD_CALLBACK_DONE, so the
    # scheduler unschedules the callback: the servo loop silently ends at the first device error, while the process
    # (and HapticDevice) carry on as if nothing happened.
    assert "Exception ignored on calling ctypes callback function" in proc.stderr
    assert "KeyError: 514" in proc.stderr
    assert res["before"] >= 100
    assert res["mid"] == res["late"] and res["mid"] <= 201  # ticks 0..200: the last call is the t = 0.2 s tick
    assert res["still_scheduled"] == 0
    log = read_log(tmp_path / "hd.log")
    start = log["t_ns"][log["kind"] == LOG_SCHED_START][0]
    pushed = log[log["kind"] == LOG_ERROR_PUSHED]
    assert [int(c) for c in pushed["code"]] == [HD_EXCEEDED_MAX_FORCE_IMPULSE]
    assert 0.2 <= (pushed["t_ns"][0] - start) / 1e9 < 0.3
    assert np.sum(log["kind"] == LOG_FORCE) == res["late"]


@pytest.mark.timed   # servo ticks counted over wall-clock sleeps, the stop within 0.5 s
def test_fault_stuck(lib_dir, tmp_path):
    res, _ = run_child(
        """
        import pyOpenHaptics.hd as hd
        from pyOpenHaptics.hd_callback import hd_callback
        from pyOpenHaptics.hd_device import HapticDevice
        n = [0]
        @hd_callback
        def servo():
            n[0] += 1
        device = HapticDevice(servo)
        time.sleep(0.35)
        mid = n[0]
        time.sleep(0.25)
        late = n[0]
        t0 = time.perf_counter()
        device.close()
        emit(dict(mid=mid, late=late, stop_s=time.perf_counter() - t0))
        """,
        emulator_env(lib_dir, log=tmp_path / "hd.log", fault="stuck@0.2"), tmp_path,
    )
    assert res["mid"] == res["late"] and 100 <= res["late"] <= 200  # ticks 0..199 ran callbacks
    assert res["stop_s"] < 0.5  # a stuck servo thread still honours hdStopScheduler
    log = read_log(tmp_path / "hd.log")
    ks = kinds(log)
    assert ks.count(LOG_STUCK) == 1
    i_stuck = ks.index(LOG_STUCK)
    assert log["a"][i_stuck] == pytest.approx(0.2)
    assert ks[i_stuck + 1:] == [LOG_SCHED_STOP, LOG_MOTORS_OFF, LOG_MOTORS_OFF]  # nothing while stuck
    assert ks.count(LOG_FORCE) == res["late"]


def test_sigkill_leaves_whole_records(lib_dir, tmp_path):
    log_path = tmp_path / "hd.log"
    code = PRELUDE + textwrap.dedent(
        """
        import pyOpenHaptics.hd as hd
        from pyOpenHaptics.hd_callback import hd_callback, hdAsyncSheduler
        n = [0]
        @hd_callback
        def servo():
            n[0] += 1
            hd.set_force([n[0] * 1e-3, -n[0] * 1e-3, n[0] * 2e-3])
        hd.init_device()
        hd.enable_force()
        hd.start_scheduler()
        hdAsyncSheduler(servo)
        time.sleep(0.3)
        print("ready", flush=True)
        time.sleep(30)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], env=emulator_env(lib_dir, log=log_path), cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while (line := child.stdout.readline()) and line.strip() != "ready":
            pass
        assert line.strip() == "ready", child.stderr.read()
        time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert log_path.stat().st_size % 48 == 0  # whole records only, even killed mid-run
    log = read_log(log_path)
    assert set(kinds(log)) <= {LOG_INIT, LOG_ENABLE, LOG_SCHED_START, LOG_POSE, LOG_FORCE}
    forces = log[log["kind"] == LOG_FORCE]
    assert len(forces) >= 250
    # Every record is intact: each force was written as (a, -a, 2a) with a = k * 1e-3, k = 1, 2, ...
    np.testing.assert_array_equal(forces["a"], np.arange(1, len(forces) + 1) * 1e-3)
    np.testing.assert_array_equal(forces["b"], -forces["a"])
    np.testing.assert_array_equal(forces["c"], np.arange(1, len(forces) + 1) * 2e-3)


# ----------------------------------------------------------------------- the C API, called in odd orders
API_SETUP = """\
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_int, c_uint, c_ubyte, c_ulong, c_ushort
from ctypes import c_void_p
class HDErrorInfo(Structure):
    _fields_ = [("errorCode", c_uint), ("internalErrorCode", c_int), ("hHD", c_uint)]
CB = CFUNCTYPE(c_uint, c_void_p)
L = ctypes.CDLL("libHD.so")
for name in ("hdInitDevice",):
    getattr(L, name).argtypes, getattr(L, name).restype = [c_char_p], c_uint
for name in ("hdDisableDevice", "hdMakeCurrentDevice", "hdBeginFrame", "hdEndFrame", "hdEnable", "hdDisable"):
    getattr(L, name).argtypes, getattr(L, name).restype = [c_uint], None
L.hdGetCurrentDevice.restype = c_uint
L.hdIsEnabled.argtypes, L.hdIsEnabled.restype = [c_uint], c_ubyte
L.hdGetError.restype = HDErrorInfo
L.hdGetDoublev.argtypes = L.hdSetDoublev.argtypes = [c_uint, POINTER(c_double)]
L.hdGetIntegerv.argtypes = [c_uint, POINTER(c_int)]
L.hdGetString.argtypes = L.hdGetErrorString.argtypes = [c_uint]
L.hdGetString.restype = L.hdGetErrorString.restype = c_char_p
L.hdCheckCalibration.restype = c_uint
L.hdUpdateCalibration.argtypes = [c_uint]
L.hdScheduleAsynchronous.argtypes, L.hdScheduleAsynchronous.restype = [CB, c_void_p, c_ushort], c_ulong
L.hdScheduleSynchronous.argtypes, L.hdScheduleSynchronous.restype = [CB, c_void_p, c_ushort], None
L.hdUnschedule.argtypes = [c_ulong]
L.hdWaitForCompletion.argtypes, L.hdWaitForCompletion.restype = [c_ulong, c_uint], c_ubyte
L.hdGetSchedulerTimeStamp.restype = c_double

def drain():
    out = []
    while (e := L.hdGetError()).errorCode:
        out.append([e.errorCode, e.internalErrorCode, e.hHD])
    return out

def getd(e, n):
    v = (c_double * n)()
    L.hdGetDoublev(e, v)
    return list(v)

def geti(e):
    v = (c_int * 1)()
    L.hdGetIntegerv(e, v)
    return v[0]
"""


def test_api_devices_frames_parameters_errors(lib_dir, tmp_path):
    res, _ = run_child(
        API_SETUP + textwrap.dedent("""
        r = {}
        r["empty"] = [L.hdGetError().errorCode, L.hdGetError().hHD]
        L.hdEndFrame(0)
        r["no_device"] = drain()
        r["handles"] = [L.hdInitDevice(b"A"), L.hdInitDevice(b"A"), L.hdInitDevice(None), L.hdInitDevice(b"C")]
        r["init_errors"] = drain()
        r["current"] = L.hdGetCurrentDevice()
        L.hdMakeCurrentDevice(0)
        L.hdMakeCurrentDevice(7)
        r["current_after"] = L.hdGetCurrentDevice()
        L.hdBeginFrame(0); L.hdBeginFrame(0); L.hdEndFrame(0); L.hdEndFrame(0)
        r["frames"] = drain()
        v = (c_double * 16)()
        L.hdGetDoublev(0x9999, v); L.hdGetDoublev(0x2050, None); L.hdBeginFrame(9); L.hdSetDoublev(0x2050, v)
        r["fifo"] = [e[0] for e in drain()]
        r["doubles"] = [getd(e, 1)[0] for e in (0x2604, 0x2603, 0x2600, 0x2601)]
        r["ints"] = [geti(e) for e in (0x2555, 0x2600, 0x2553, 0x2554, 0x2000, 0x2200)]
        r["transform"] = getd(0x2052, 16)
        r["position"] = getd(0x2050, 3) + getd(0x2051, 3)
        r["strings"] = [L.hdGetString(e).decode() for e in (0x2501, 0x2503, 0x2504, 0x2502, 0x2500)]
        r["bad_string"] = L.hdGetString(0x1234).decode()
        r["error_string"] = L.hdGetErrorString(0x0202).decode()
        r["calibration"] = [L.hdCheckCalibration()]
        L.hdUpdateCalibration(4)
        r["calibration"].append(L.hdCheckCalibration())
        r["caps_before"] = [L.hdIsEnabled(c) for c in range(0x4000, 0x4005)]
        L.hdEnable(0x4000); L.hdEnable(0x4003); L.hdDisable(0x4000); L.hdEnable(0x4999)
        r["caps_after"] = [L.hdIsEnabled(c) for c in range(0x4000, 0x4005)]
        L.hdBeginFrame(0)
        L.hdSetDoublev(0x2700, (c_double * 3)(0.1, float("nan"), -0.3))
        r["force_in_frame"] = repr(getd(0x2700, 3))
        L.hdEndFrame(0)
        L.hdBeginFrame(0); L.hdEndFrame(0)  # nothing set: zero force
        L.hdDisableDevice(1); L.hdDisableDevice(1)
        r["current_after_disable1"] = L.hdGetCurrentDevice()
        L.hdDisableDevice(0)
        r["current_none"] = L.hdGetCurrentDevice()
        L.hdGetDoublev(0x2050, v)
        r["late_errors"] = drain()
        r["reinit"] = L.hdInitDevice(b"A")
        L.hdStopScheduler()  # never started: a no-op
        emit(r)
        """),
        emulator_env(lib_dir, log=tmp_path / "hd.log", fault="nocal", max_continuous_force=1.5), tmp_path,
    )
    inv = HD_INVALID_HANDLE
    assert res["empty"] == [0, inv]
    assert res["no_device"] == [[HD_BAD_HANDLE, 0, inv]]
    assert res["handles"] == [0, inv, 1, inv]
    assert res["init_errors"] == [[HD_DEVICE_ALREADY_INITIATED, 0, 0], [HD_COMM_CONFIG_ERROR, -2, 1]]
    assert (res["current"], res["current_after"]) == (1, 0)
    assert res["frames"] == [[HD_BAD_HANDLE, 0, 0], [HD_ILLEGAL_BEGIN, 0, 0], [HD_ILLEGAL_END, 0, 0]]
    assert res["fifo"] == [HD_INVALID_ENUM, HD_INVALID_VALUE, HD_BAD_HANDLE, HD_INVALID_ENUM]  # oldest first
    assert res["doubles"] == [1.5, 3.3, 1000.0, 1000.0]
    assert res["ints"] == [4, 1000, 6, 3, 0, 0]
    assert res["transform"] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]  # no script: at rest at the origin
    assert res["position"] == [0.0] * 6
    assert res["strings"] == ["suturesim emulator", "suturesim", "EMU-0001", "emulator", "3.4.0"]
    assert res["bad_string"] == "" and res["error_string"]
    assert res["calibration"] == [0x5001, 0x5000]  # nocal, then hdUpdateCalibration(HD_CALIBRATION_INKWELL)
    assert res["caps_before"] == [0] * 5 and res["caps_after"] == [0, 0, 0, 1, 0]
    assert res["force_in_frame"] == "[0.1, nan, -0.3]"
    assert (res["current_after_disable1"], res["current_none"]) == (0, inv)
    # hdGetString(0x1234) and hdEnable(0x4999) (invalid enums), hdDisableDevice(1) twice, a query with no device left.
    assert res["late_errors"] == [[HD_INVALID_ENUM, 0, 0], [HD_INVALID_ENUM, 0, 0], [HD_BAD_HANDLE, 0, 0],
                                  [HD_BAD_HANDLE, 0, inv]]
    assert res["reinit"] == 0  # a disabled device's name and slot are free again

    log = read_log(tmp_path / "hd.log")
    assert [int(c) for c in log["code"][log["kind"] == LOG_INIT]] == [0, inv, 1, inv, 0]
    # Three frames were closed properly: begin/begin(illegal)/end/end(illegal) counts as one (no force set), the
    # NaN one (logged as commanded, NaN included), and an empty one (zero).
    forces = log[log["kind"] == LOG_FORCE]
    np.testing.assert_array_equal(np.column_stack([forces["a"], forces["b"], forces["c"]]),
                                  [[0, 0, 0], [0.1, np.nan, -0.3], [0, 0, 0]])
    assert [int(c) for c in forces["code"]] == [0, CAP_SOFTWARE_FORCE_LIMIT, CAP_SOFTWARE_FORCE_LIMIT]
    caps = log[np.isin(log["kind"], [LOG_ENABLE, LOG_DISABLE])]
    assert [(int(k), int(c)) for k, c in caps[["kind", "code"]].tolist()] == [
        (LOG_ENABLE, 0x4000), (LOG_ENABLE, HD_SOFTWARE_FORCE_LIMIT), (LOG_DISABLE, 0x4000)]
    off = log[log["kind"] == LOG_MOTORS_OFF]
    assert [(int(c), d) for c, d in off[["code", "d"]].tolist()] == [(MOTORS_OFF_DEVICE_DISABLED, 1.0),
                                                                      (MOTORS_OFF_DEVICE_DISABLED, 0.0)]
    assert LOG_SCHED_STOP not in kinds(log)  # hdStopScheduler without a running scheduler logs nothing


@pytest.mark.timed   # servo ticks counted over wall-clock sleeps
def test_api_scheduler_semantics(lib_dir, tmp_path):
    res, _ = run_child(
        API_SETUP + textwrap.dedent("""
        r = {}
        L.hdInitDevice(None)
        main = threading.get_ident()
        order, seen = [], {}
        def once(tag):
            def f(_):
                order.append(tag)
                seen[tag] = threading.get_ident()
                return 0
            return CB(f)
        lo, hi = once("lo"), once("hi")
        L.hdScheduleAsynchronous(lo, None, 10)  # scheduled before the scheduler runs: kept until it starts
        L.hdScheduleAsynchronous(hi, None, 1000)

        sync_calls = []
        @CB
        def sync3(_):
            sync_calls.append(threading.get_ident())
            return 0 if len(sync_calls) % 3 == 0 else 1  # CONTINUE twice, then DONE
        L.hdScheduleSynchronous(sync3, None, 0)
        r["sync_offline"] = [len(sync_calls), set(sync_calls) == {main}]

        L.hdStartScheduler(); L.hdStartScheduler()  # the second call is a no-op
        L.hdScheduleSynchronous(sync3, None, 0)
        r["sync_online"] = [len(sync_calls), len(set(sync_calls[3:])), main in sync_calls[3:]]
        r["priority_order"] = order
        r["sched_thread_is_callback_thread"] = seen["hi"] == sync_calls[3]

        count5 = [0]
        @CB
        def five(_):
            count5[0] += 1
            return 0 if count5[0] == 5 else 1
        h5 = L.hdScheduleAsynchronous(five, None, 0)
        r["five"] = [L.hdWaitForCompletion(h5, 1), count5[0], L.hdWaitForCompletion(h5, 0)]  # INFINITE, CHECK

        forever, stamps = [0], []
        @CB
        def spin(_):
            forever[0] += 1
            stamps.append(L.hdGetSchedulerTimeStamp())
            return 1
        hs = L.hdScheduleAsynchronous(spin, None, 0)
        time.sleep(0.05)
        r["spin_scheduled"] = L.hdWaitForCompletion(hs, 0)
        L.hdUnschedule(hs)  # returns only once spin is not running, and it never runs again
        n_at = forever[0]
        time.sleep(0.02)
        r["unschedule"] = [n_at, forever[0]]
        L.hdUnschedule(hs); L.hdUnschedule(12345)
        r["unschedule_errors"] = [e[0] for e in drain()]
        r["stamps"] = [min(stamps), sorted(stamps)[len(stamps) // 2]]

        inner = []
        @CB
        def inner_cb(_):
            inner.append(threading.get_ident())
            return 0
        @CB
        def nested(_):
            L.hdScheduleSynchronous(inner_cb, None, 0)  # from a callback: runs inline, no self-deadlock
            return 0
        hn = L.hdScheduleAsynchronous(nested, None, 0)
        L.hdWaitForCompletion(hn, 1)
        r["nested_on_sched_thread"] = inner == [seen["hi"]]

        stop_calls = [0]
        @CB
        def stopper(_):
            stop_calls[0] += 1
            L.hdStopScheduler()  # from the servo thread itself: must not join itself
            return 1
        hst = L.hdScheduleAsynchronous(stopper, None, 0)
        time.sleep(0.05)
        r["self_stop_calls"] = stop_calls[0]
        r["still_scheduled_after_stop"] = L.hdWaitForCompletion(hst, 0)
        r["wait_infinite_when_stopped"] = L.hdWaitForCompletion(hst, 1)  # cannot complete: returns at once
        L.hdUnschedule(hst)
        hs2 = L.hdScheduleAsynchronous(spin, None, 0)
        before = forever[0]
        L.hdStartScheduler()
        time.sleep(0.05)
        L.hdStopScheduler()
        r["restart_calls"] = forever[0] - before
        r["final_errors"] = drain()
        emit(r)
        """),
        emulator_env(lib_dir, log=tmp_path / "hd.log"), tmp_path,
    )
    assert res["sync_offline"] == [3, True]  # no scheduler: run on the caller, until DONE
    assert res["sync_online"] == [6, 1, False]  # on the servo thread
    assert res["priority_order"] == ["hi", "lo"]
    assert res["sched_thread_is_callback_thread"]
    assert res["five"] == [1, 5, 0]  # waited until DONE on the 5th call, then no longer scheduled
    assert res["spin_scheduled"] == 1
    n_at, n_later = res["unschedule"]
    assert n_at >= 20 and n_later == n_at
    assert res["unschedule_errors"] == [HD_INVALID_OPERATION, HD_INVALID_OPERATION]
    # Seconds since the current tick started (OpenHaptics' duty-cycle probe), not since the scheduler started.
    assert 0.0 <= res["stamps"][0] and res["stamps"][1] < 0.01
    assert res["nested_on_sched_thread"]
    assert res["self_stop_calls"] == 1
    assert res["still_scheduled_after_stop"] == 1 and res["wait_infinite_when_stopped"] == 0
    assert res["restart_calls"] >= 20  # restarted after stopping itself; spin (rescheduled) runs again
    assert res["final_errors"] == []
    log = read_log(tmp_path / "hd.log")
    ks = [k for k in kinds(log) if k in (LOG_SCHED_START, LOG_SCHED_STOP)]
    assert ks == [LOG_SCHED_START, LOG_SCHED_STOP, LOG_SCHED_START, LOG_SCHED_STOP]
    assert kinds(log).count(LOG_MOTORS_OFF) == 2


# "Default Device" presses button 1 throughout and moves along x; "Right Device" stands 50 mm up, presses button 2
# from 0.1 s and turns 90 degrees about y while it moves along -z.
DEFAULT_ROWS = [(0.0, 0.0, 0.0, 0.0, 1), (0.3, 30.0, 0.0, 0.0, 1)]
RIGHT_ROWS = [(0.0, 0.0, 50.0, 0.0, 0, 1.0, 0.0, 0.0, 0.0), (0.1, 0.0, 50.0, 0.0, 2, 1.0, 0.0, 0.0, 0.0),
              (0.3, 0.0, 50.0, -30.0, 2, C45, 0.0, S45, 0.0)]


def test_two_devices_each_follow_their_own_script(lib_dir, tmp_path):
    """Two named devices, one scheduler: a callback that makes each device current in turn reads that device's
    stylus and commands that device's force; a name no script is configured for does not initialise."""
    env = emulator_env(lib_dir, script=write_script(tmp_path / "default.txt", DEFAULT_ROWS),
                       scripts={"Right Device": write_script(tmp_path / "right.txt", RIGHT_ROWS)},
                       log=tmp_path / "hd.log")
    res, _ = run_child(
        API_SETUP + textwrap.dedent("""
        r = {}
        h0, h1 = L.hdInitDevice(None), L.hdInitDevice(b"Right Device")
        r["handles"] = [h0, h1, L.hdInitDevice(b"Left Device")]
        r["init_errors"] = drain()
        seen = []
        mat, force, btn = (c_double * 16)(), (c_double * 3)(), (c_int * 1)()
        @CB
        def servo(_):
            for h in (h0, h1):
                L.hdMakeCurrentDevice(h)
                L.hdBeginFrame(h)
                L.hdGetDoublev(0x2052, mat)
                L.hdGetIntegerv(0x2000, btn)
                seen.append([h, L.hdGetCurrentDevice(), list(mat), btn[0]])
                force[0], force[1], force[2] = 0.1 + h, 0.0, -h
                L.hdSetDoublev(0x2700, force)
                L.hdEndFrame(h)
            return 1
        hs = L.hdScheduleAsynchronous(servo, None, 0)
        L.hdStartScheduler()
        time.sleep(0.4)
        L.hdStopScheduler()
        L.hdUnschedule(hs)
        r["seen"] = seen
        r["errors"] = drain()
        emit(r)
        """), env, tmp_path)
    assert res["handles"] == [0, 1, HD_INVALID_HANDLE]
    assert res["init_errors"] == [[HD_COMM_CONFIG_ERROR, -3, 1]]   # no device configured as "Left Device"
    assert res["errors"] == []
    log = read_log(tmp_path / "hd.log")
    start = log["t_ns"][log["kind"] == LOG_SCHED_START][0]
    # per tick: each device's position (by handle), the right one's orientation, then each device's frame
    ks = [k for k in kinds(log) if k in (LOG_POSE, LOG_ORIENT, LOG_FORCE)]
    n = len(ks) // 5
    assert n > 300 and ks == [LOG_POSE, LOG_POSE, LOG_ORIENT, LOG_FORCE, LOG_FORCE] * n
    seen = res["seen"]
    assert len(seen) == 2 * n and [s[:2] for s in seen] == [[0, 0], [1, 1]] * n   # current while it is served
    for h, rows in ((0, DEFAULT_ROWS), (1, RIGHT_ROWS)):
        pose = log[(log["kind"] == LOG_POSE) & (log["code"] == h)]
        t = (pose["t_ns"] - start) / 1e9
        want_pos, want_buttons = expected_pose(t, rows)
        np.testing.assert_allclose(np.column_stack([pose["a"], pose["b"], pose["c"]]), want_pos, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(pose["d"], want_buttons)
        mats = np.array([s[2] for s in seen if s[0] == h]).reshape(-1, 4, 4)   # [column][row]
        np.testing.assert_array_equal(mats[:, 3, :3], np.column_stack([pose["a"], pose["b"], pose["c"]]))
        np.testing.assert_array_equal([s[3] for s in seen if s[0] == h], want_buttons)
        angle = np.interp(t, [0.1, 0.3], [0.0, math.pi / 2]) if h == 1 else np.zeros_like(t)
        np.testing.assert_allclose(mats[:, :3, :3], np.transpose(rot_y(angle), (0, 2, 1)), rtol=0, atol=1e-12)
        forces = log[(log["kind"] == LOG_FORCE) & (log["d"] == h)]
        assert len(forces) == n and np.all(forces["a"] == 0.1 + h) and np.all(forces["c"] == -h)
    assert set(log["code"][log["kind"] == LOG_ORIENT]) == {1}   # the default device's rows carry no orientation
    assert {s[3] for s in seen if s[0] == 1} == {0, 2}          # button 2 pressed on the right device
