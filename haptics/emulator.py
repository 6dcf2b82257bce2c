"""A libHD (OpenHaptics HD API) emulator for tests and benchmarks: no Phantom/Touch device needed.

``hd_emulator.c`` (next to this file) is compiled into a ``libHD.so`` that exports the HD 3.x symbols with the
OpenHaptics C signatures. pyOpenHaptics loads ``CDLL("libHD.so")`` at import time, so a process whose
``LD_LIBRARY_PATH`` starts with the emulator's directory gets the emulator; the loader reads ``LD_LIBRARY_PATH`` only
at process start, so the emulator is meant for a *child process* started with :func:`emulator_env`::

    lib_dir = build_emulator()
    write_script(tmp / "path.txt", [(0.0, 0, 0, 0, 0), (1.0, 50, 0, 0, 1)])
    write_script(tmp / "left.txt", [(0.0, 0, 0, 0, 0, 1, 0, 0, 0), (1.0, 0, 0, 0, 2, 0.7071, 0, 0.7071, 0)])
    env = emulator_env(lib_dir, script=tmp / "path.txt", scripts={"Left Device": tmp / "left.txt"},
                       log=tmp / "hd.log", fault="stuck@2.0")
    subprocess.run([sys.executable, "driver.py"], env=env)
    records = read_log(tmp / "hd.log")

Emulated device (all configuration through environment variables, read once at the library's first call):

* scheduler: one thread ticking at 1 kHz on absolute deadlines; per tick it samples every device's script, calls
  the asynchronous callbacks (by priority, removing those returning ``HD_CALLBACK_DONE``), then pending synchronous
  ones. Ticks more than 10 ms late are skipped, not replayed in a burst.
* script (``SUTURESIM_HD_EMU_SCRIPT``): rows ``t_s x_mm y_mm z_mm buttons`` or
  ``t_s x_mm y_mm z_mm buttons qw qx qy qz``, every row of a file as wide as its first (a row of the other width
  is skipped with a message on stderr); position interpolated linearly in t (seconds since ``hdStartScheduler``,
  sampled at the tick's deadline), held outside the rows; orientation (a quaternion in the device frame,
  normalised when read, each row's sign the one nearer the row before; identity for 5-field rows) by slerp along
  the shorter arc, held likewise; buttons step (those of the last row with ``t_row <= t``). No script: the stylus
  rests at the origin, upright, no button pressed. ``HD_CURRENT_TRANSFORM`` (and ``HD_LAST_TRANSFORM``) is the
  column-major 4x4 of that pose: the orientation's rotation matrix R with column j in elements 4j..4j+2, the
  position (mm) in 12..14. Gimbal and joint angles are not emulated (``HD_INVALID_ENUM``): they follow from a
  Touch's arm geometry, which the emulator does not model.
* devices (``SUTURESIM_HD_EMU_SCRIPTS``, ``name=path;name=path``): up to two devices at once, each with its own
  stylus. Unset, every name ``hdInitDevice`` is given follows ``SUTURESIM_HD_EMU_SCRIPT``. Set, the devices are
  exactly the names it lists, each following its own script, and ``"Default Device"`` (``hdInitDevice(NULL)``),
  following ``SUTURESIM_HD_EMU_SCRIPT``; any other name fails with ``HD_COMM_CONFIG_ERROR`` (internal code -3), as
  OpenHaptics fails for a name no device is configured under. Getters, ``hdSetDoublev``, ``hdEnable`` and
  ``hdDisable`` act on the current device (the last initialised, or ``hdMakeCurrentDevice``'s);
  ``hdBeginFrame`` does not change it.
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
``LOG_POSE`` 2            handle                                 position (mm), buttons. t_ns = deadline
``LOG_ENABLE`` 3          capability enum (0x4000..0x4004)       0, 0, 0, handle
``LOG_DISABLE`` 4         capability enum                        0, 0, 0, handle
``LOG_SCHED_START`` 5     0                                      0; t_ns = the script's time origin
``LOG_SCHED_STOP`` 6      0                                      0
``LOG_MOTORS_OFF`` 7      ``MOTORS_OFF_*`` reason                0, 0, 0, handle
``LOG_ERROR_PUSHED`` 8    error code                             internalErrorCode, 1 if dropped, 0, hHD
``LOG_STUCK`` 9           0                                      script time t (s) of the stuck tick
``LOG_INIT`` 10           handle, 0xFFFFFFFF on failure          0
``LOG_ORIENT`` 11         handle                                 orientation qw, qx, qy, qz. t_ns = deadline
========================  =====================================  ========================================

Every tick logs one ``LOG_POSE`` per initialised device (by handle), each followed by a ``LOG_ORIENT`` when that
device's script has 9-field rows. Their ``t_ns`` is the tick's deadline, so ``(t_ns - start_ns) / 1e9`` is exactly
the script time that produced them; every other kind carries the clock at the event.
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
    "LOG_ORIENT",
    "MOTORS_OFF_DEVICE_DISABLED",
    "MOTORS_OFF_SCHEDULER_STOPPED",
    "CAP_FORCE_OUTPUT",
    "CAP_MAX_FORCE_CLAMPING",
    "CAP_FORCE_RAMPING",
    "CAP_SOFTWARE_FORCE_LIMIT",
    "CAP_ONE_FRAME_LIMIT",
    "ENV_SCRIPT",
    "ENV_SCRIPTS",
    "ENV_LOG",
    "ENV_FAULT",
    "ENV_MAX_CONTINUOUS_FORCE",
    "ENV_MAX_STIFFNESS",
    "COMPILE_FLAGS",
    "LINK_LIBS",
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
LOG_ORIENT = 11

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
ENV_SCRIPTS = "SUTURESIM_HD_EMU_SCRIPTS"
ENV_LOG = "SUTURESIM_HD_EMU_LOG"
ENV_FAULT = "SUTURESIM_HD_EMU_FAULT"
ENV_MAX_CONTINUOUS_FORCE = "SUTURESIM_HD_EMU_MAX_CONTINUOUS_FORCE"
ENV_MAX_STIFFNESS = "SUTURESIM_HD_EMU_MAX_STIFFNESS"

COMPILE_FLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-std=c11", "-Wall", "-Werror")
LINK_LIBS = ("-lm",)   # after the source: a linker with --as-needed drops a library named before what uses it
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
        first 16 hex digits of the SHA-256 of the source, :data:`COMPILE_FLAGS` and :data:`LINK_LIBS`, so an edited source gets a
        fresh directory and an unchanged one is never rebuilt.
    :returns: the directory holding ``libHD.so``.
    :raises EmulatorBuildError: no C compiler (``$CC``, default ``cc``) or a compile error (message included).

    An existing ``libHD.so`` is reused when the stamp file next to it records the same digest. Otherwise the
    library is compiled into a temporary file in the same directory and renamed over ``libHD.so``: the rename is
    atomic, so concurrent builders (pytest-xdist workers) never see a half-written library, and a process that
    already mapped the old file keeps its (unlinked) inode instead of crashing on a file rewritten in place.
    """
    source = _source_bytes()
    digest = hashlib.sha256(source + b"\0" + " ".join(COMPILE_FLAGS + LINK_LIBS).encode()).hexdigest()
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
                [*cc, *COMPILE_FLAGS, "-o", tmp_lib, str(src), *LINK_LIBS], capture_output=True, text=True,
                check=False
            )
        if proc.returncode != 0:
            raise EmulatorBuildError(
                f"compiling the libHD emulator failed ({shlex.join([*cc, *COMPILE_FLAGS, *LINK_LIBS])}, "
                f"exit {proc.returncode}):\n"
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
    :param rows: ``(t_s, x_mm, y_mm, z_mm, buttons)`` or ``(t_s, x_mm, y_mm, z_mm, buttons, qw, qx, qy, qz)`` per
        row, every row as wide as the first: time in seconds since ``hdStartScheduler`` (non-decreasing; two rows
        at the same time make a step), stylus position in the device frame in millimetres, the button bitmask
        (``HD_DEVICE_BUTTON_1`` = 1, ``_2`` = 2, ...), an int >= 0, and the stylus orientation in the device frame,
        a quaternion (w, x, y, z) the emulator normalises (identity when the rows have 5 fields).
    :raises ValueError: a row of neither 5 nor 9 fields or not as wide as the first, a non-finite number, a
        negative or non-integer button mask, a zero quaternion, or time going backwards.
    """
    lines: list[str] = []
    width = 0
    t_prev = -math.inf
    for i, row in enumerate(rows):
        if len(row) not in (5, 9):
            raise ValueError(f"script row {i}: expected (t_s, x_mm, y_mm, z_mm, buttons[, qw, qx, qy, qz]), "
                             f"got {row!r}")
        if width and len(row) != width:
            raise ValueError(f"script row {i}: {len(row)} fields, but the rows before it have {width}")
        width = len(row)
        t, x, y, z = (float(v) for v in row[:4])
        buttons = row[4]
        quat = [float(v) for v in row[5:]]
        if not all(math.isfinite(v) for v in (t, x, y, z, *quat)):
            raise ValueError(f"script row {i}: non-finite value in {row!r}")
        if int(buttons) != buttons or int(buttons) < 0:
            raise ValueError(f"script row {i}: buttons must be an int bitmask >= 0, got {buttons!r}")
        if quat and not math.fsum(v * v for v in quat) > 1e-24:
            raise ValueError(f"script row {i}: the quaternion must be non-zero, got {quat!r}")
        if t < t_prev:
            raise ValueError(f"script row {i}: t = {t} s goes back in time (previous row {t_prev} s)")
        t_prev = t
        # repr-exact floats: the emulator's interpolation can then be checked to the last bit.
        lines.append(" ".join([repr(t), repr(x), repr(y), repr(z), str(int(buttons)), *map(repr, quat)]))
    header = "# t_s x_mm y_mm z_mm buttons" + (" qw qx qy qz" if width == 9 else "")
    p = Path(path)
    p.write_text("\n".join([header, *lines]) + "\n")
    return p


def emulator_env(
    lib_dir: str | os.PathLike[str],
    script: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
    fault: str | Sequence[str] | None = None,
    max_continuous_force: float | None = None,
    max_stiffness: float | None = None,
    base: Mapping[str, str] | None = None,
    scripts: Mapping[str, str | os.PathLike[str]] | None = None,
) -> dict[str, str]:
    """Environment for a child process that should load the emulator as ``libHD.so``.

    :param lib_dir: directory returned by :func:`build_emulator`; prepended to ``LD_LIBRARY_PATH``.
    :param script: motion script (:func:`write_script`) of ``"Default Device"``, and of every device when
        ``scripts`` is ``None``; ``None``: that stylus rests at the origin.
    :param log: binary log file (truncated when the child first logs); ``None``: no log.
    :param fault: ``"missing"``, ``"nocal"``, ``"stuck@T"``, ``"error:CODE@T"`` (T in seconds, CODE hex ``0x..``
        or decimal), or several of them as a comma-separated string or a sequence.
    :param max_continuous_force: ``HD_NOMINAL_MAX_CONTINUOUS_FORCE`` in N (emulator default 0.88 N).
    :param max_stiffness: ``HD_NOMINAL_MAX_STIFFNESS`` in N/mm (emulator default 1.02 N/mm).
    :param base: environment to start from (default: a copy of ``os.environ``); not modified.
    :param scripts: OpenHaptics device name -> motion script, for devices other than ``"Default Device"``
        (``SUTURESIM_HD_EMU_SCRIPTS``). Given, the emulated devices are these and ``"Default Device"``; any
        other name fails to initialise (``HD_COMM_CONFIG_ERROR``); empty, the same as ``None``. A name may not
        contain ``=`` or ``;``, a path not ``;``.
    :returns: a new dict. ``SUTURESIM_HD_EMU_*`` variables for the arguments left at ``None`` are *removed*, so a
        setting inherited from the parent never leaks into the child.
    """
    env = dict(os.environ if base is None else base)
    old = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = os.fspath(lib_dir) + (os.pathsep + old if old else "")
    if fault is not None and not isinstance(fault, str):
        fault = ",".join(fault)
    named = None
    if scripts is not None:
        entries = []
        for name, path in scripts.items():
            path = os.fspath(path)
            if not name or name != name.strip() or "=" in name or ";" in name or ";" in path:
                raise ValueError(f"device {name!r} -> {path!r}: a name must be non-empty without surrounding "
                                 "spaces, '=' or ';', a path without ';'")
            entries.append(f"{name}={path}")
        named = ";".join(entries) or None
    settings = {
        ENV_SCRIPT: None if script is None else os.fspath(script),
        ENV_SCRIPTS: named,
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
