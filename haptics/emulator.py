"""A libHD (OpenHaptics HD API) emulator for tests and benchmarks: no Phantom/Touch device needed.

``hd_emulator.c`` (next to this file) is compiled into a ``libHD.so`` that exports the HD 3.x symbols with the
OpenHaptics C signatures. pyOpenHaptics loads ``CDLL("libHD.so")`` at import time, so a process whose
``LD_LIBRARY_PATH`` starts with the emulator's directory gets the emulator; the loader reads ``LD_LIBRARY_PATH`` only
at process start, so the emulator is meant for a *child process* started with :func:`emulator_env`::

    lib_dir = build_emulator()
    write_script(tmp / "path.txt", [(0.0, 0, 0, 0, 0), (1.0, 50, 0, 0, 1)])
    env = emulator_env(lib_dir, script=tmp / "path.txt", log=tmp / "hd.log", fault="stuck@2.0")
    subprocess.run([sys.executable, "driver.py"], env=env)
    records = read_log(tmp / "hd.log")

Emulated device (all configuration through environment variables, read once at the library's first call):

* scheduler: one thread ticking at 1 kHz on absolute deadlines; per tick it samples the script, calls the
  asynchronous callbacks (by priority, removing those returning ``HD_CALLBACK_DONE``), then pending synchronous
  ones. Ticks more than 10 ms late are skipped, not replayed in a burst.
* script (``SUTURESIM_HD_EMU_SCRIPT``): rows ``t_s x_mm y_mm z_mm buttons``; position interpolated linearly in t
  (seconds since ``hdStartScheduler``, sampled at the tick's deadline), held outside the rows; buttons step (those
  of the last row with ``t_row <= t``). No script: the stylus rests at the origin, no button pressed.
* frames: ``hdBeginFrame`` zeroes the frame's force; ``hdSetDoublev(HD_CURRENT_FORCE)`` sets it (N, device frame);
  ``hdEndFrame`` logs it with the enabled-capability mask. Every capability starts disabled.
* faults (``SUTURESIM_HD_EMU_FAULT``, comma-separated): ``missing`` (``hdInitDevice`` fails with
  ``HD_COMM_CONFIG_ERROR``), ``nocal`` (``hdCheckCalibration`` says ``HD_CALIBRATION_NEEDS_UPDATE``),
  ``error:CODE@T`` (``CODE`` pushed once on the error stack at the first tick with ``t >= T`` s) and ``stuck@T``
  (from ``t >= T`` s the scheduler calls nothing and updates nothing until ``hdStopScheduler``; an
  ``hdScheduleSynchronous`` caller blocks until then, as it would on a hung servo thread).
* ``hdStopScheduler`` keeps asynchronous callbacks scheduled (OpenHaptics programs unschedule after stopping) and
  releases blocked ``hdScheduleSynchronous`` callers.

Log (``SUTURESIM_HD_EMU_LOG``): fixed 48-byte little-endian records, :data:`LOG_DTYPE`
``kind u4 | code u4 | t_ns i8 (CLOCK_MONOTONIC) | a f8 | b f8 | c f8 | d f8``, one ``write(2)`` each (a killed
process leaves only whole records). Per kind:

========================  =====================================  ========================================
kind                      code                                   a, b, c, d
========================  =====================================  ========================================
``LOG_FORCE`` 1           enabled capabilities (``CAP_*`` bits)  force (N) applied at hdEndFrame, handle
``LOG_POSE`` 2            0                                      position (mm), buttons. t_ns = deadline
``LOG_ENABLE`` 3          capability enum (0x4000..0x4004)       0, 0, 0, handle
``LOG_DISABLE`` 4         capability enum                        0, 0, 0, handle
``LOG_SCHED_START`` 5     0                                      0; t_ns = the script's time origin
``LOG_SCHED_STOP`` 6      0                                      0
``LOG_MOTORS_OFF`` 7      ``MOTORS_OFF_*`` reason                0, 0, 0, handle
``LOG_ERROR_PUSHED`` 8    error code                             internalErrorCode, 1 if dropped, 0, hHD
``LOG_STUCK`` 9           0                                      script time t (s) of the stuck tick
``LOG_INIT`` 10           handle, 0xFFFFFFFF on failure          0
========================  =====================================  ========================================

A ``LOG_POSE`` record's ``t_ns`` is the tick's deadline, so ``(t_ns - start_ns) / 1e9`` is exactly the script
time that produced the position; every other kind carries the clock at the event.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import math
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "EmulatorBuildError",
    "build_emulator",
    "write_script",
    "emulator_env",
    "read_log",
    "LOG_DTYPE",
    "LOG_RECORD_SIZE",
    "LOG_FORCE",
    "LOG_POSE",
    "LOG_ENABLE",
    "LOG_DISABLE",
    "LOG_SCHED_START",
    "LOG_SCHED_STOP",
    "LOG_MOTORS_OFF",
    "LOG_ERROR_PUSHED",
    "LOG_STUCK",
    "LOG_INIT",
    "MOTORS_OFF_DEVICE_DISABLED",
    "MOTORS_OFF_SCHEDULER_STOPPED",
    "CAP_FORCE_OUTPUT",
    "CAP_MAX_FORCE_CLAMPING",
    "CAP_FORCE_RAMPING",
    "CAP_SOFTWARE_FORCE_LIMIT",
    "CAP_ONE_FRAME_LIMIT",
    "ENV_SCRIPT",
    "ENV_LOG",
    "ENV_FAULT",
    "ENV_MAX_CONTINUOUS_FORCE",
    "ENV_MAX_STIFFNESS",
    "COMPILE_FLAGS",
]

# Record kinds (the `kind` field of LOG_DTYPE); the values are those of hd_emulator.c's enum.
LOG_FORCE = 1
LOG_POSE = 2
LOG_ENABLE = 3
LOG_DISABLE = 4
LOG_SCHED_START = 5
LOG_SCHED_STOP = 6
LOG_MOTORS_OFF = 7
LOG_ERROR_PUSHED = 8
LOG_STUCK = 9
LOG_INIT = 10

# `code` of a LOG_MOTORS_OFF record: why the motors went to zero.
MOTORS_OFF_DEVICE_DISABLED = 1
MOTORS_OFF_SCHEDULER_STOPPED = 2

# Bits of a LOG_FORCE record's `code`: bit i <-> capability enum 0x4000 + i (HD_FORCE_OUTPUT ... HD_ONE_FRAME_LIMIT).
CAP_FORCE_OUTPUT = 1 << 0
CAP_MAX_FORCE_CLAMPING = 1 << 1
CAP_FORCE_RAMPING = 1 << 2
CAP_SOFTWARE_FORCE_LIMIT = 1 << 3
CAP_ONE_FRAME_LIMIT = 1 << 4

LOG_DTYPE = np.dtype(
    [("kind", "<u4"), ("code", "<u4"), ("t_ns", "<i8"), ("a", "<f8"), ("b", "<f8"), ("c", "<f8"), ("d", "<f8")]
)
LOG_RECORD_SIZE = 48
assert LOG_DTYPE.itemsize == LOG_RECORD_SIZE

ENV_SCRIPT = "SUTURESIM_HD_EMU_SCRIPT"
ENV_LOG = "SUTURESIM_HD_EMU_LOG"
ENV_FAULT = "SUTURESIM_HD_EMU_FAULT"
ENV_MAX_CONTINUOUS_FORCE = "SUTURESIM_HD_EMU_MAX_CONTINUOUS_FORCE"
ENV_MAX_STIFFNESS = "SUTURESIM_HD_EMU_MAX_STIFFNESS"

COMPILE_FLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-std=c11", "-Wall", "-Werror")
_LIB_NAME = "libHD.so"
_STAMP_NAME = "libHD.so.sha256"  # digest of the source + flags the libHD.so next to it was built from


class EmulatorBuildError(RuntimeError):
    """The emulator could not be compiled (no C compiler, or the compiler failed)."""


def _source_bytes() -> bytes:
    return importlib.resources.files("suturesim.haptics").joinpath("hd_emulator.c").read_bytes()


def _default_cache_root() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "suturesim" / "hd-emulator"


def build_emulator(dest: str | os.PathLike[str] | None = None) -> Path:
    """Compile ``hd_emulator.c`` into ``<dir>/libHD.so`` and return ``<dir>`` (the ``LD_LIBRARY_PATH`` entry).

    :param dest: directory to build into (created if missing). Default: the per-user cache
        ``$XDG_CACHE_HOME/suturesim/hd-emulator/<digest>/`` (``~/.cache`` when unset), where ``<digest>`` is the
        first 16 hex digits of the SHA-256 of the source and :data:`COMPILE_FLAGS`, so an edited source gets a
        fresh directory and an unchanged one is never rebuilt.
    :returns: the directory holding ``libHD.so``.
    :raises EmulatorBuildError: no C compiler (``$CC``, default ``cc``) or a compile error (message included).

    An existing ``libHD.so`` is reused when the stamp file next to it records the same digest. Otherwise the
    library is compiled into a temporary file in the same directory and renamed over ``libHD.so``: the rename is
    atomic, so concurrent builders (pytest-xdist workers) never see a half-written library, and a process that
    already mapped the old file keeps its (unlinked) inode instead of crashing on a file rewritten in place.
    """
    source = _source_bytes()
    digest = hashlib.sha256(source + b"\0" + " ".join(COMPILE_FLAGS).encode()).hexdigest()
    out_dir = Path(dest) if dest is not None else _default_cache_root() / digest[:16]
    lib, stamp = out_dir / _LIB_NAME, out_dir / _STAMP_NAME
    try:
        if lib.is_file() and stamp.read_text().strip() == digest:
            return out_dir
    except OSError:
        pass  # no stamp yet: build

    cc = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    if shutil.which(cc[0]) is None:
        raise EmulatorBuildError(
            f"cannot build the libHD emulator: C compiler {cc[0]!r} not found "
            "(install gcc or clang, or point $CC at a C11 compiler)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_lib = tempfile.mkstemp(prefix=".libHD.", suffix=".so.tmp", dir=out_dir)
    os.close(fd)
    try:
        with importlib.resources.as_file(
            importlib.resources.files("suturesim.haptics").joinpath("hd_emulator.c")
        ) as src:
            proc = subprocess.run(
                [*cc, *COMPILE_FLAGS, "-o", tmp_lib, str(src)], capture_output=True, text=True, check=False
            )
        if proc.returncode != 0:
            raise EmulatorBuildError(
                f"compiling the libHD emulator failed ({shlex.join([*cc, *COMPILE_FLAGS])}, exit {proc.returncode}):\n"
                f"{proc.stderr.strip()}"
            )
        os.chmod(tmp_lib, 0o755)  # mkstemp made it 0600
        os.replace(tmp_lib, lib)
        fd, tmp_stamp = tempfile.mkstemp(prefix=".stamp.", suffix=".tmp", dir=out_dir)
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.chmod(tmp_stamp, 0o644)
        os.replace(tmp_stamp, stamp)  # written after the library, so a stamp never vouches for a missing one
    finally:
        if os.path.exists(tmp_lib):
            os.unlink(tmp_lib)
    return out_dir


def write_script(
    path: str | os.PathLike[str], rows: Iterable[Sequence[float]]
) -> Path:
    """Write an emulator motion script and return its path.

    :param path: file to (over)write.
    :param rows: ``(t_s, x_mm, y_mm, z_mm, buttons)`` per row: time in seconds since ``hdStartScheduler``
        (non-decreasing; two rows at the same time make a step), stylus position in the device frame in
        millimetres, and the button bitmask (``HD_DEVICE_BUTTON_1`` = 1, ``_2`` = 2, ...), an int >= 0.
    :raises ValueError: a row without 5 fields, a non-finite number, a negative or non-integer button mask, or
        time going backwards.
    """
    lines = ["# t_s x_mm y_mm z_mm buttons"]
    t_prev = -math.inf
    for i, row in enumerate(rows):
        if len(row) != 5:
            raise ValueError(f"script row {i}: expected (t_s, x_mm, y_mm, z_mm, buttons), got {row!r}")
        t, x, y, z = (float(v) for v in row[:4])
        buttons = row[4]
        if not all(math.isfinite(v) for v in (t, x, y, z)):
            raise ValueError(f"script row {i}: non-finite value in {row!r}")
        if int(buttons) != buttons or int(buttons) < 0:
            raise ValueError(f"script row {i}: buttons must be an int bitmask >= 0, got {buttons!r}")
        if t < t_prev:
            raise ValueError(f"script row {i}: t = {t} s goes back in time (previous row {t_prev} s)")
        t_prev = t
        # repr-exact floats: the emulator's interpolation can then be checked to the last bit.
        lines.append(f"{t!r} {x!r} {y!r} {z!r} {int(buttons)}")
    p = Path(path)
    p.write_text("\n".join(lines) + "\n")
    return p


def emulator_env(
    lib_dir: str | os.PathLike[str],
    script: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
    fault: str | Sequence[str] | None = None,
    max_continuous_force: float | None = None,
    max_stiffness: float | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a child process that should load the emulator as ``libHD.so``.

    :param lib_dir: directory returned by :func:`build_emulator`; prepended to ``LD_LIBRARY_PATH``.
    :param script: motion script (:func:`write_script`); ``None``: stylus at rest at the origin.
    :param log: binary log file (truncated when the child first logs); ``None``: no log.
    :param fault: ``"missing"``, ``"nocal"``, ``"stuck@T"``, ``"error:CODE@T"`` (T in seconds, CODE hex ``0x..``
        or decimal), or several of them as a comma-separated string or a sequence.
    :param max_continuous_force: ``HD_NOMINAL_MAX_CONTINUOUS_FORCE`` in N (emulator default 0.88 N).
    :param max_stiffness: ``HD_NOMINAL_MAX_STIFFNESS`` in N/mm (emulator default 1.02 N/mm).
    :param base: environment to start from (default: a copy of ``os.environ``); not modified.
    :returns: a new dict. ``SUTURESIM_HD_EMU_*`` variables for the arguments left at ``None`` are *removed*, so a
        setting inherited from the parent never leaks into the child.
    """
    env = dict(os.environ if base is None else base)
    old = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = os.fspath(lib_dir) + (os.pathsep + old if old else "")
    if fault is not None and not isinstance(fault, str):
        fault = ",".join(fault)
    settings = {
        ENV_SCRIPT: None if script is None else os.fspath(script),
        ENV_LOG: None if log is None else os.fspath(log),
        ENV_FAULT: fault,
        ENV_MAX_CONTINUOUS_FORCE: None if max_continuous_force is None else repr(float(max_continuous_force)),
        ENV_MAX_STIFFNESS: None if max_stiffness is None else repr(float(max_stiffness)),
    }
    for name, value in settings.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def read_log(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an emulator log into a structured array of :data:`LOG_DTYPE` (fields kind, code, t_ns, a, b, c, d).

    A trailing partial record (a writer killed mid-``write``, or a file read while being written) is ignored.
    The array is a copy, independent of the file.
    """
    data = Path(path).read_bytes()
    n = len(data) // LOG_RECORD_SIZE
    return np.frombuffer(data, dtype=LOG_DTYPE, count=n).copy()
