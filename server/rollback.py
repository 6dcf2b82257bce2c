"""The state a divergence goes back to: a copy of the running scene's carried buffers (solver/model.py
ThreadState.packed), taken every ROLLBACK_TICKS ticks as a tick is to start, so that a fault costs a trainee at most
the last half second of a suture instead of the whole of it (server/physics.py PhysicsLoop.roll_back).

The copy is made at the end of the tick before (PhysicsLoop.tick_scene), before any input of the next, keyed on
the loop's tick number, so a resimulation of a recording takes the same copies at the same ticks and goes back to
the same state. A scene's start (install, reset) clears it: before the first copy of a scene there is nothing to
go back to but the start, which a reset is.
"""
from __future__ import annotations

import numpy as np

ROLLBACK_TICKS = 500   # a copy this often (half a second at 1 kHz): ~0.1 MB for 80 segments, one np.copyto each


class Rollback:
    """Preallocated copies of a state's carried buffers (float64, int64, int8) and the tick they were taken at."""

    def __init__(self, state):
        cf, _, ci, _, cb, _ = state.packed()
        self._copies = (np.empty_like(cf), np.empty_like(ci), np.empty_like(cb))
        self.seq: int | None = None       # the tick whose start the copy holds; None: no copy in this scene
        self.t = 0.0                      # its scene time (s)

    def take(self, state, seq: int) -> None:
        """Copy ``state`` as tick ``seq`` starts (no allocation)."""
        cf, _, ci, _, cb, _ = state.packed()
        f, i, b = self._copies
        np.copyto(f, cf)
        np.copyto(i, ci)
        np.copyto(b, cb)
        self.seq = seq
        self.t = float(state.time[0])

    def restore(self, state) -> bool:
        """Copy the kept state back into ``state``'s buffers. False (and nothing written) if there is none."""
        if self.seq is None:
            return False
        cf, _, ci, _, cb, _ = state.packed()
        f, i, b = self._copies
        np.copyto(cf, f)
        np.copyto(ci, i)
        np.copyto(cb, b)
        return True

    def clear(self) -> None:
        """A scene's start: nothing to go back to but it."""
        self.seq = None
