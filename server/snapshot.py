"""The running scene's snapshot in shared memory: what the supervisor restarts a stalled or dead physics process
from, so that a trainee's suture is not lost with it.

One segment per installed scene, made by the physics process when it installs the scene and unlinked when the
next one replaces it (or, after a restart, by the supervisor). It holds the scene's identity (name, file, the
validated source it was built from) and two slots of the thread state's carried buffers
(solver/model.py ThreadState.packed: everything a tick carries over; the neighbour list and per-tick scratch are
rebuilt). The loop writes one slot at least once a second, alternating, so a process killed in the middle of a
write leaves the other slot whole; ``writes`` counts finished writes and names the newest whole slot.

Layout (native little-endian)::

    header (64 B)  magic u64 | n_float u64 | n_int u64 | n_byte u64 | scene_bytes u64 | seq0 u64 | seq1 u64 |
                   writes u64
    scene          msgpack {"name", "file", "source", "base_dir"}, padded to 8 bytes
    slot 0, 1      float64[n_float] | int64[n_int] | int8[n_byte] (padded to 8 bytes)

A write allocates nothing: three ``np.copyto`` into views made when the segment was.
"""
from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory

import msgpack
import numpy as np

from ..haptics.link import open_untracked

MAGIC = 0x50414E534D495353   # "SSIMSNAP"
HEADER_BYTES = 64
_N_FLOAT, _N_INT, _N_BYTE, _SCENE, _SEQ0, _SEQ1, _WRITES = range(1, 8)


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


@dataclass(frozen=True)
class SnapshotScene:
    """The scene a snapshot belongs to, as the physics process installed it."""
    name: str
    file: str
    source: dict
    base_dir: str                # where its relative references resolved (Scenario.base_dir)


class Snapshot:
    """A snapshot segment: :meth:`create` in the physics process at install, :meth:`attach` elsewhere by name."""

    def __init__(self, shm: SharedMemory, owner: bool):
        self.shm = shm
        self.name = shm.name
        self.owner = owner
        self._hdr = np.ndarray((8,), np.uint64, shm.buf, 0)
        if int(self._hdr[0]) != MAGIC:
            raise ValueError(f"{shm.name} is not a suturesim snapshot")
        nf, ni, nb, scene = (int(self._hdr[k]) for k in (_N_FLOAT, _N_INT, _N_BYTE, _SCENE))
        self.sizes = (nf, ni, nb)
        at = HEADER_BYTES + _pad8(scene)
        self._scene = (HEADER_BYTES, scene)
        stride = 8 * nf + 8 * ni + _pad8(nb)
        self._slots = []
        for k in range(2):
            base = at + k * stride
            self._slots.append((np.ndarray((nf,), np.float64, shm.buf, base),
                                np.ndarray((ni,), np.int64, shm.buf, base + 8 * nf),
                                np.ndarray((nb,), np.int8, shm.buf, base + 8 * nf + 8 * ni)))

    @staticmethod
    def size_for(state, scene_bytes: int) -> int:
        cf, _, ci, _, cb, _ = state.packed()
        return HEADER_BYTES + _pad8(scene_bytes) + 2 * (8 * cf.size + 8 * ci.size + _pad8(cb.size))

    @classmethod
    def create(cls, scene: SnapshotScene, state) -> "Snapshot":
        """A new segment for ``scene`` whose state is laid out like ``state`` (a ThreadState), holding no state
        yet (``writes`` 0)."""
        packed = msgpack.packb({"name": scene.name, "file": scene.file, "source": scene.source,
                                "base_dir": scene.base_dir}, use_bin_type=True, default=str)
        cf, _, ci, _, cb, _ = state.packed()
        shm = SharedMemory(create=True, size=cls.size_for(state, len(packed)))
        hdr = np.ndarray((8,), np.uint64, shm.buf, 0)
        hdr[:] = 0
        hdr[_N_FLOAT], hdr[_N_INT], hdr[_N_BYTE], hdr[_SCENE] = cf.size, ci.size, cb.size, len(packed)
        shm.buf[HEADER_BYTES:HEADER_BYTES + len(packed)] = packed
        hdr[0] = MAGIC
        return cls(shm, owner=True)

    @classmethod
    def attach(cls, name: str) -> "Snapshot":
        """Open an existing segment (not registered with this process's resource tracker: its maker owns it)."""
        return cls(open_untracked(name), owner=False)

    # -- writing (the physics loop) -------------------------------------------------------------------
    def write(self, state) -> None:
        """Copy ``state``'s carried buffers into the older slot (no allocation)."""
        cf, _, ci, _, cb, _ = state.packed()
        writes = int(self._hdr[_WRITES])
        k = writes % 2
        seq = _SEQ0 + k
        self._hdr[seq] += np.uint64(1)         # odd: being written
        f, i, b = self._slots[k]
        np.copyto(f, cf)
        np.copyto(i, ci)
        np.copyto(b, cb)
        self._hdr[seq] += np.uint64(1)         # even: whole
        self._hdr[_WRITES] = writes + 1

    # -- reading (the supervisor, a restarted physics process) --------------------------------------------
    @property
    def writes(self) -> int:
        return int(self._hdr[_WRITES])

    def scene(self) -> SnapshotScene:
        at, size = self._scene
        m = msgpack.unpackb(bytes(self.shm.buf[at:at + size]), raw=False, strict_map_key=False)
        return SnapshotScene(name=str(m["name"]), file=str(m["file"]), source=m["source"],
                             base_dir=m.get("base_dir"))

    def restore(self, state) -> bool:
        """Copy the newest whole slot into ``state`` (a ThreadState laid out as the snapshot's). False if nothing
        was written or the layout differs (a state of another size)."""
        writes = self.writes
        cf, _, ci, _, cb, _ = state.packed()
        if writes == 0 or (cf.size, ci.size, cb.size) != self.sizes:
            return False
        k = (writes - 1) % 2
        if int(self._hdr[_SEQ0 + k]) % 2:      # cannot happen with a dead writer (see the module docstring)
            return False
        f, i, b = self._slots[k]
        np.copyto(cf, f)
        np.copyto(ci, i)
        np.copyto(cb, b)
        return True

    def close(self) -> None:
        self._hdr = None
        self._slots = []
        try:
            self.shm.close()
        except BufferError:   # a view still held by a caller: released with the process
            pass

    def unlink(self) -> None:
        """Destroy the segment (the maker, or the supervisor once its maker is dead)."""
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass


def unlink_snapshot(name: str) -> None:
    """Destroy the segment ``name`` if it still exists (the supervisor, for a physics process that is gone)."""
    try:
        shm = SharedMemory(name=name, create=False)
    except FileNotFoundError:
        return
    shm.close()
    shm.unlink()


__all__ = ["Snapshot", "SnapshotScene", "unlink_snapshot"]
