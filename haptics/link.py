"""Shared-memory link between the physics process and a haptic device driver.

docs/ARCHITECTURE.md Sec. 2: the device driver's servo callback (1 kHz, its own thread or process)
writes the stylus pose and reads the newest force; the physics process (1 kHz, dedicated process) reads the
newest pose and writes the force. Neither side may block the other, so there are no locks: every record is
guarded by a *sequence lock* with a single writer.

Segment layout (little-endian, native alignment; every record starts on a 128-byte boundary so that the pose
record, written by the driver, and the force record, written by physics, never share a cache line, nor a pair
of lines pulled in together by the adjacent-line prefetcher)::

    header  (128 B)  magic u64 | version u32 | n_devices u32 | slot_stride u32 | header_size u32 |
                     owner_pid i64 | created_ns i64
    slot i  (256 B)  pose record  at header + 256 i          force record at header + 256 i + 128
      pose   seq u64 | t_ns i64 | pos[3] f64 (m) | quat[4] f64 (w, x, y, z) | buttons u32 | active u32 |
             driver_flags u32
      force  seq u64 | t_ns i64 | force[3] f64 (N) | axial f64 (N) | flags u32 | (pad u32) | tick i64 |
             pose_t_ns i64

``driver_flags`` are the safety flags of the driver's last servo tick (its own watchdog and backstop, which
physics ORs into the published ``flags``); ``pose_t_ns`` is the ``t_ns`` of the pose the force was computed
from, so the driver measures pose-to-force latency without a clock of its own.

Sequence lock protocol (one writer per record):

- writer: ``s = seq; seq = s | 1`` (odd: write in progress), store the fields, ``seq = (s | 1) + 1`` (even).
  If ``seq`` is found odd, the previous writer died mid-write; the new writer simply completes the cycle from
  that odd value, so the sequence stays monotonic across writer restarts (and the supervisor's
  :meth:`DeviceLink.zero_forces` works even when physics crashed inside a write).
- reader: ``s1 = seq``; retry if odd; copy the fields to locals; ``s2 = seq``; accept only if ``s1 == s2``.
  After ``max_retries`` failed attempts (a writer stuck or descheduled mid-write) the read returns ``None``;
  read paths never raise on a torn read and leave the caller's output arrays untouched unless they succeed.
- ``seq == 0`` means "never written" (the first completed write leaves seq == 2).

Memory ordering. The protocol needs (writer) the odd-seq store to become visible before the field stores, and
the field stores before the even-seq store; (reader) the first seq load to happen before the field loads, and
the field loads before the second seq load. On x86-64 (TSO) the hardware gives exactly this for free: stores
are not reordered with other stores, loads are not reordered with other loads. Every field here is naturally
aligned, so each 8-byte access is a single-copy-atomic ``mov``; CPython performs each store/load as a plain
``memcpy`` of 1 element inside a separate, opaque C call per bytecode, which the C compiler cannot reorder across
one another. So on x86-64 the seqlock is correct as written. On weakly ordered CPUs (ARM64, POWER) it is *not*:
the writer needs a release fence (``dmb ishst``) after the odd-seq store and before the even-seq store, and
the reader an acquire fence (``dmb ishld``) after the first seq load and before the second. Pure Python
cannot emit fences; there we would move the two record copies into a tiny compiled helper (a numba
``@intrinsic`` emitting LLVM ``fence release``/``fence acquire``, or a C/cffi function using
``__atomic_thread_fence``) keeping this class's API. Until then :class:`DeviceLink` warns once
(``RuntimeWarning``) when created or attached on a non-x86 machine.

Hot paths (``write_*``/``read_*``) allocate no arrays: they use typed ``memoryview`` casts of the segment,
created once (a single-element access through them costs about half a numpy element access, and
``np.copyto`` on a 3-vector costs more than the whole record write). Inputs are validated before the odd-seq
store, so a rejected call never leaves a record half written.

Resource tracker. On POSIX, Python < 3.13 registers *every* ``SharedMemory`` it opens, attached ones included,
with the process's ``resource_tracker``, which unlinks (and warns about "leaked" segments) when the process
tree that shares that tracker exits. A driver process that merely attaches would therefore destroy the owner's
segment on exit. :meth:`DeviceLink.attach` opens the segment without registering it (``track=False`` on
Python >= 3.13; on older versions the registration call for exactly this name is filtered out while the
segment is opened). Register-then-unregister, the usual workaround, is wrong when the attaching process shares
the owner's tracker (any ``multiprocessing`` child does): the tracker keeps a *set* of names, so the child's
unregister would erase the owner's registration (no crash clean-up for the owner, and a ``KeyError`` traceback
in the tracker when the owner unlinks). The owner's own registration is kept, so a crashed owner's segment is
still removed by its tracker.
"""

from __future__ import annotations

import operator
import os
import platform
import secrets
import struct
import sys
import threading
import time
import warnings
from multiprocessing.shared_memory import SharedMemory

import numpy as np

__all__ = ["DeviceLink", "MAX_DEVICES", "MAGIC", "VERSION", "ORDERING_SAFE"]

MAX_DEVICES = 8
MAGIC = int.from_bytes(b"SSIMLNK1", "little")
VERSION = 2

HEADER_SIZE = 128
RECORD_SIZE = 128
SLOT_STRIDE = 2 * RECORD_SIZE

# Byte offsets inside a pose record.
_P_SEQ, _P_T, _P_POS, _P_QUAT, _P_BUTTONS, _P_ACTIVE, _P_DFLAGS = 0, 8, 16, 40, 72, 76, 80
# Byte offsets inside a force record.
_F_SEQ, _F_T, _F_FORCE, _F_AXIAL, _F_FLAGS, _F_TICK, _F_POSE_T = 0, 8, 16, 40, 48, 56, 64

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U32_MAX = (1 << 32) - 1

#: True where the plain-store seqlock is correct without fences (x86 / x86-64, total store order).
ORDERING_SAFE = platform.machine().lower() in {"x86_64", "amd64", "x86", "i386", "i686"}
_warned_ordering = False

_track_lock = threading.Lock()


def _warn_ordering() -> None:
    global _warned_ordering
    if not ORDERING_SAFE and not _warned_ordering:
        _warned_ordering = True
        warnings.warn(
            f"suturesim.haptics.link: the lock-free seqlock relies on x86 total store order; on "
            f"{platform.machine()!r} torn pose/force reads are possible (see the module docstring)",
            RuntimeWarning,
            stacklevel=3,
        )


def open_untracked(name: str) -> SharedMemory:
    """Open an existing segment without registering it with this process's resource tracker."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, create=False, track=False)
    if os.name != "posix":  # Windows: no resource tracker for shared memory; handles are refcounted.
        return SharedMemory(name=name, create=False)
    from multiprocessing import resource_tracker

    bare = name.lstrip("/")
    with _track_lock:
        original = resource_tracker.register

        def register(rname: str, rtype: str) -> None:
            if rtype == "shared_memory" and rname.lstrip("/") == bare:
                return  # attached, not owned: the owner's tracker entry is the only one
            original(rname, rtype)

        resource_tracker.register = register
        try:
            return SharedMemory(name=name, create=False)
        finally:
            resource_tracker.register = original


class DeviceLink:
    """Lock-free shared-memory link carrying stylus poses (driver → physics) and forces (physics → driver).

    Create it in the owning process with :meth:`create`, open it elsewhere with :meth:`attach` (by
    :attr:`name`). Each of the ``n_devices`` slots holds one pose record (single writer: the driver) and one
    force record (single writer: physics, or the supervisor's :meth:`zero_forces` once physics is stopped).
    Units: positions in metres (scene frame), forces in newtons, times in ``time.monotonic_ns()``
    nanoseconds. Use as a context manager: on exit it closes, and the owner also unlinks.

    Attributes:
        name: the segment name to pass to :meth:`attach`.
        n_devices: number of device slots (1..8), fixed at creation.
        max_retries: read attempts before a read gives up and returns ``None`` (default 100).
    """

    name: str
    n_devices: int

    def __init__(self, shm: SharedMemory, n_devices: int, owner: bool, max_retries: int = 100) -> None:
        # Private: use create() or attach().
        self._shm = shm
        self.name = shm.name
        self.n_devices = int(n_devices)
        self._owner = owner
        self._closed = False
        self._unlinked = False
        self.max_retries = int(max_retries)
        buf = shm.buf
        size = (HEADER_SIZE + SLOT_STRIDE * self.n_devices) // 8 * 8
        self._raw = buf[:size]
        self._u64 = self._raw.cast("Q")
        self._i64 = self._raw.cast("q")
        self._f64 = self._raw.cast("d")
        self._u32 = self._raw.cast("I")

    # ---------------------------------------------------------------------------------------- lifecycle
    @classmethod
    def create(cls, n_devices: int, name: str | None = None) -> "DeviceLink":
        """Create (and own) a new, zeroed link segment with ``n_devices`` slots (1..8).

        ``name`` defaults to ``suturesim_<pid>_<random>``. Raises ``ValueError`` for a bad ``n_devices`` and
        ``FileExistsError`` if a segment of that name exists.
        """
        n = operator.index(n_devices)
        if not 1 <= n <= MAX_DEVICES:
            raise ValueError(f"n_devices must be in 1..{MAX_DEVICES}, got {n}")
        if name is None:
            name = f"suturesim_{os.getpid()}_{secrets.token_hex(4)}"
        _warn_ordering()
        shm = SharedMemory(name=name, create=True, size=HEADER_SIZE + SLOT_STRIDE * n)
        link = None
        try:
            shm.buf[:] = bytes(len(shm.buf))
            link = cls(shm, n, owner=True)
            u32, i64 = link._u32, link._i64
            u32[2] = VERSION
            u32[3] = n
            u32[4] = SLOT_STRIDE
            u32[5] = HEADER_SIZE
            i64[3] = os.getpid()
            i64[4] = time.monotonic_ns()
            link._u64[0] = MAGIC  # last: a concurrent attach sees a complete header or a bad magic
        except BaseException:
            if link is not None:
                link.close()
            else:
                shm.close()
            shm.unlink()
            raise
        return link

    @classmethod
    def attach(cls, name: str) -> "DeviceLink":
        """Open an existing link by name (not owned: :meth:`unlink` is refused, nothing is unlinked on exit).

        Raises ``FileNotFoundError`` if no such segment exists and ``ValueError`` if it is not a suturesim
        link of this version.
        """
        _warn_ordering()
        shm = open_untracked(name)
        try:
            if shm.size < HEADER_SIZE:
                raise ValueError(f"shared memory {name!r} is too small to be a DeviceLink")
            magic, version, n, stride, hsize = struct.unpack_from("=QIIII", shm.buf, 0)
            if magic != MAGIC:
                raise ValueError(f"shared memory {name!r} is not a suturesim DeviceLink (bad magic)")
            if version != VERSION or stride != SLOT_STRIDE or hsize != HEADER_SIZE:
                raise ValueError(f"DeviceLink {name!r} has layout version {version}, expected {VERSION}")
            if not 1 <= n <= MAX_DEVICES or shm.size < HEADER_SIZE + SLOT_STRIDE * n:
                raise ValueError(f"DeviceLink {name!r} has a corrupt header (n_devices={n}, size={shm.size})")
            return cls(shm, n, owner=False)
        except BaseException:
            shm.close()
            raise

    @property
    def is_owner(self) -> bool:
        """True in the process that created the segment."""
        return self._owner

    @property
    def owner_pid(self) -> int:
        """PID of the process that created the segment."""
        return self._i64[3]

    def close(self) -> None:
        """Release this process's mapping (idempotent). The segment itself lives on until the owner unlinks."""
        if self._closed:
            return
        self._closed = True
        for mv in (self._u64, self._i64, self._f64, self._u32, self._raw):
            mv.release()
        self._shm.close()

    def unlink(self) -> None:
        """Destroy the segment (owner only; idempotent). Attached processes keep their mapping until close."""
        if not self._owner:
            raise RuntimeError("only the process that created the DeviceLink may unlink it")
        if self._unlinked:
            return
        self._unlinked = True
        self._shm.unlink()

    def __del__(self) -> None:
        # Release our views before SharedMemory.__del__ tries to close the mapping (else: BufferError noise).
        # Never unlinks: a forgotten owner object is cleaned up by the resource tracker at exit instead.
        if getattr(self, "_shm", None) is not None:
            try:
                self.close()
            except Exception:
                pass

    def __enter__(self) -> "DeviceLink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        if self._owner:
            self.unlink()

    def __repr__(self) -> str:
        role = "owner" if self._owner else "attached"
        state = ", closed" if self._closed else ""
        return f"DeviceLink(name={self.name!r}, n_devices={self.n_devices}, {role}{state})"

    # ------------------------------------------------------------------------------------------ helpers
    def _slot(self, slot: int) -> int:
        try:
            s = operator.index(slot)
        except TypeError:
            raise ValueError(f"device slot must be an integer, got {slot!r}") from None
        if not 0 <= s < self.n_devices:
            raise ValueError(f"device slot {s} out of range 0..{self.n_devices - 1}")
        return s

    # ----------------------------------------------------------------------------------------- poses
    def write_pose(self, slot: int, pos, quat, buttons: int, t_ns: int, driver_flags: int = 0) -> None:
        """Publish the stylus pose of device ``slot`` (driver side; single writer per slot).

        Args:
            slot: device slot, 0..n_devices-1 (``ValueError`` otherwise).
            pos: 3 floats, stylus position in metres, scene frame.
            quat: 4 floats, orientation quaternion (w, x, y, z), scene frame.
            buttons: button bitmask, 0..2**32-1.
            t_ns: ``time.monotonic_ns()`` of the sample (ns).
            driver_flags: the driver's safety flags of its last servo tick (haptics/safety.py FLAG_*).

        Raises ``ValueError`` for a bad slot, wrong vector lengths, or any non-finite component; the record
        is untouched in that case.
        """
        k = HEADER_SIZE + SLOT_STRIDE * self._slot(slot)
        if pos.__class__ is np.ndarray:
            pos = pos.tolist()
        if quat.__class__ is np.ndarray:
            quat = quat.tolist()
        try:
            px, py, pz = pos
            qw, qx, qy, qz = quat
        except (ValueError, TypeError):
            raise ValueError("pos must have 3 and quat 4 components") from None
        px, py, pz = float(px), float(py), float(pz)
        qw, qx, qy, qz = float(qw), float(qx), float(qy), float(qz)
        # x - x is 0.0 for finite x and NaN for ±inf/NaN; the sum is 0.0 iff every component is finite.
        if (px - px) + (py - py) + (pz - pz) + (qw - qw) + (qx - qx) + (qy - qy) + (qz - qz) != 0.0:
            raise ValueError(f"refusing non-finite pose: pos={pos!r}, quat={quat!r}")
        buttons = operator.index(buttons)
        t_ns = operator.index(t_ns)
        driver_flags = operator.index(driver_flags)
        if not (0 <= buttons <= _U32_MAX and 0 <= driver_flags <= _U32_MAX):
            raise ValueError(f"buttons and driver_flags must fit in uint32, got {buttons}, {driver_flags}")
        if not _I64_MIN <= t_ns <= _I64_MAX:
            raise ValueError(f"t_ns must fit in int64, got {t_ns}")

        u64, f64 = self._u64, self._f64
        iseq = k >> 3
        s = u64[iseq] | 1  # odd: write in progress (an odd value left by a dead writer is reused)
        u64[iseq] = s
        self._i64[(k + _P_T) >> 3] = t_ns
        j = (k + _P_POS) >> 3
        f64[j] = px
        f64[j + 1] = py
        f64[j + 2] = pz
        j = (k + _P_QUAT) >> 3
        f64[j] = qw
        f64[j + 1] = qx
        f64[j + 2] = qy
        f64[j + 3] = qz
        u32 = self._u32
        u32[(k + _P_BUTTONS) >> 2] = buttons
        u32[(k + _P_ACTIVE) >> 2] = 1
        u32[(k + _P_DFLAGS) >> 2] = driver_flags
        u64[iseq] = s + 1

    def clear_pose(self, slot: int, t_ns: int) -> None:
        """Mark device ``slot``'s pose as unavailable (driver side, e.g. device unplugged); readers then get
        ``None`` until the next :meth:`write_pose`. ``t_ns``: ``time.monotonic_ns()`` (ns)."""
        k = HEADER_SIZE + SLOT_STRIDE * self._slot(slot)
        t_ns = operator.index(t_ns)
        if not _I64_MIN <= t_ns <= _I64_MAX:
            raise ValueError(f"t_ns must fit in int64, got {t_ns}")
        u64 = self._u64
        iseq = k >> 3
        s = u64[iseq] | 1
        u64[iseq] = s
        self._i64[(k + _P_T) >> 3] = t_ns
        self._u32[(k + _P_ACTIVE) >> 2] = 0
        u64[iseq] = s + 1

    def read_pose(self, slot: int, pos_out: np.ndarray, quat_out: np.ndarray) -> tuple[int, int, int] | None:
        """Read the newest pose of device ``slot`` (physics side) into ``pos_out`` (3, m) and ``quat_out``
        (4, w x y z).

        Returns ``(seq, t_ns, buttons)`` — seq is the record's even sequence number (increases by 2 per
        write), t_ns the sample's ``time.monotonic_ns()`` — or ``None`` if the slot was never written, was
        cleared, or no consistent copy was obtained within ``max_retries`` attempts (writer stuck or
        descheduled mid-write). The output arrays are written only on success. Never raises on a torn read;
        raises ``ValueError`` for a bad slot.
        """
        k = HEADER_SIZE + SLOT_STRIDE * self._slot(slot)
        u64, f64, u32 = self._u64, self._f64, self._u32
        iseq = k >> 3
        it = (k + _P_T) >> 3
        ip = (k + _P_POS) >> 3
        iq = (k + _P_QUAT) >> 3
        ib = (k + _P_BUTTONS) >> 2
        for _ in range(self.max_retries):
            s1 = u64[iseq]
            if s1 & 1:
                continue
            if s1 == 0:
                return None
            t = self._i64[it]
            px = f64[ip]
            py = f64[ip + 1]
            pz = f64[ip + 2]
            qw = f64[iq]
            qx = f64[iq + 1]
            qy = f64[iq + 2]
            qz = f64[iq + 3]
            b = u32[ib]
            active = u32[ib + 1]
            if u64[iseq] == s1:
                if not active:
                    return None
                pos_out[0] = px
                pos_out[1] = py
                pos_out[2] = pz
                quat_out[0] = qw
                quat_out[1] = qx
                quat_out[2] = qy
                quat_out[3] = qz
                return s1, t, b
        return None

    def driver_flags(self, slot: int) -> int:
        """The safety flags the driver of ``slot`` reported with its last pose (one aligned 4-byte load: atomic
        on its own, so no sequence check is needed for this single field)."""
        return self._u32[(HEADER_SIZE + SLOT_STRIDE * self._slot(slot) + _P_DFLAGS) >> 2]

    # ---------------------------------------------------------------------------------------- forces
    def write_force(self, slot: int, force, axial: float, flags: int, tick: int, t_ns: int,
                    pose_t_ns: int = 0) -> None:
        """Publish the force for device ``slot`` (physics side; single writer per slot).

        Args:
            slot: device slot, 0..n_devices-1 (``ValueError`` otherwise).
            force: 3 floats, force to command to the device in newtons, scene frame, *before* the driver's
                safety pipeline.
            axial: axial constraint force magnitude at the grasp (N).
            flags: status bitmask, 0..2**32-1.
            tick: physics tick number the force belongs to.
            t_ns: ``time.monotonic_ns()`` when the force was computed (ns); the driver's watchdog ages it.
            pose_t_ns: ``t_ns`` of the device pose this force was computed from (0: none), for latency.

        Raises ``ValueError`` for a bad slot, a wrong force length, or a non-finite force/axial — a NaN must
        never reach a motor. The record is untouched in that case.
        """
        k = HEADER_SIZE + SLOT_STRIDE * self._slot(slot)
        if force.__class__ is np.ndarray:
            force = force.tolist()
        try:
            fx, fy, fz = force
        except (ValueError, TypeError):
            raise ValueError("force must have 3 components") from None
        fx, fy, fz = float(fx), float(fy), float(fz)
        axial = float(axial)
        if (fx - fx) + (fy - fy) + (fz - fz) + (axial - axial) != 0.0:  # 0.0 iff all finite
            raise ValueError(f"refusing non-finite force: force={force!r}, axial={axial!r}")
        flags = operator.index(flags)
        tick = operator.index(tick)
        t_ns = operator.index(t_ns)
        pose_t_ns = operator.index(pose_t_ns)
        if not 0 <= flags <= _U32_MAX:
            raise ValueError(f"flags must fit in uint32, got {flags}")
        if not (_I64_MIN <= tick <= _I64_MAX and _I64_MIN <= t_ns <= _I64_MAX and _I64_MIN <= pose_t_ns <= _I64_MAX):
            raise ValueError(f"tick, t_ns and pose_t_ns must fit in int64, got {tick}, {t_ns}, {pose_t_ns}")
        self._write_force(k + RECORD_SIZE, fx, fy, fz, axial, flags, tick, t_ns, pose_t_ns)

    def _write_force(self, k: int, fx: float, fy: float, fz: float, axial: float, flags: int, tick: int,
                     t_ns: int, pose_t_ns: int = 0) -> None:
        # k: byte offset of the force record; every argument already validated.
        u64, f64, i64 = self._u64, self._f64, self._i64
        iseq = k >> 3
        s = u64[iseq] | 1  # odd: write in progress (an odd value left by a dead writer is reused)
        u64[iseq] = s
        i64[(k + _F_T) >> 3] = t_ns
        j = (k + _F_FORCE) >> 3
        f64[j] = fx
        f64[j + 1] = fy
        f64[j + 2] = fz
        f64[j + 3] = axial
        self._u32[(k + _F_FLAGS) >> 2] = flags
        i64[(k + _F_TICK) >> 3] = tick
        i64[(k + _F_POSE_T) >> 3] = pose_t_ns
        u64[iseq] = s + 1

    def read_force(self, slot: int, force_out: np.ndarray, pose_t_out: list | None = None
                   ) -> tuple[int, int, float, int, int] | None:
        """Read the newest force for device ``slot`` (driver side) into ``force_out`` (3, N, pre-safety).

        Returns ``(seq, t_ns, axial, flags, tick)`` — axial in N, t_ns the ``time.monotonic_ns()`` at which
        physics computed it — or ``None`` if the slot was never written or no consistent copy was obtained
        within ``max_retries`` attempts. ``force_out`` is written only on success, and so is
        ``pose_t_out[0]`` (if a list is given): the ``t_ns`` of the pose the force was computed from. Never raises on a torn
        read; raises ``ValueError`` for a bad slot.
        """
        k = HEADER_SIZE + SLOT_STRIDE * self._slot(slot) + RECORD_SIZE
        u64, f64, i64 = self._u64, self._f64, self._i64
        iseq = k >> 3
        it = (k + _F_T) >> 3
        jf = (k + _F_FORCE) >> 3
        ifl = (k + _F_FLAGS) >> 2
        itk = (k + _F_TICK) >> 3
        for _ in range(self.max_retries):
            s1 = u64[iseq]
            if s1 & 1:
                continue
            if s1 == 0:
                return None
            t = i64[it]
            fx = f64[jf]
            fy = f64[jf + 1]
            fz = f64[jf + 2]
            ax = f64[jf + 3]
            fl = self._u32[ifl]
            tk = i64[itk]
            pt = i64[itk + 1]
            if u64[iseq] == s1:
                force_out[0] = fx
                force_out[1] = fy
                force_out[2] = fz
                if pose_t_out is not None:
                    pose_t_out[0] = pt
                return s1, t, ax, fl, tk
        return None

    def zero_forces(self, flags: int, t_ns: int) -> None:
        """Write a zero force (and zero axial) with ``flags`` to every slot: the supervisor's fault path.

        Call it once the physics writer is stopped (crashed, killed or hung); it completes a write that a
        dead writer left half done. ``tick`` is carried over from each slot's last record. ``t_ns``:
        ``time.monotonic_ns()`` (ns).
        """
        flags = operator.index(flags)
        t_ns = operator.index(t_ns)
        if not 0 <= flags <= _U32_MAX:
            raise ValueError(f"flags must fit in uint32, got {flags}")
        if not _I64_MIN <= t_ns <= _I64_MAX:
            raise ValueError(f"t_ns must fit in int64, got {t_ns}")
        for slot in range(self.n_devices):
            k = HEADER_SIZE + SLOT_STRIDE * slot + RECORD_SIZE
            tick = self._i64[(k + _F_TICK) >> 3]
            self._write_force(k, 0.0, 0.0, 0.0, 0.0, flags, tick, t_ns)
