"""The `replay` backend's data: a stylus path taken from a recording, played back against scene time.

A recording's `force` messages carry, every tick, each device's stylus position and the scene time ``t`` at the
end of that tick, and for a device holding a needle, the orientation its live stylus sent (``quat``). Played
back, the stylus is where it was recorded at the end of the tick being stepped (sample and hold, no
interpolation), so re-stepping the same scenario on the same ticks moves the grasp exactly as recorded. Reading
the file is the server's job (the message format is the wire protocol); this module only holds the samples.
"""
from __future__ import annotations

import numpy as np


class PoseTrack:
    """Stylus positions ``pos`` (n, 3; m, scene frame) at scene times ``t`` (n; s, non-decreasing), and
    optionally orientations ``quat`` (n, 4; w, x, y, z; a row of NaN where none was sent yet).

    :meth:`pose_at` is called once per tick with increasing times; it keeps a cursor, so each call is O(1)
    amortised and allocates nothing.
    """

    def __init__(self, t: np.ndarray, pos: np.ndarray, quat: np.ndarray | None = None):
        t = np.ascontiguousarray(t, dtype=np.float64)
        pos = np.ascontiguousarray(pos, dtype=np.float64)
        if t.ndim != 1 or pos.shape != (t.size, 3) or t.size == 0:
            raise ValueError(f"a pose track needs n times and n x 3 positions, n >= 1; got {t.shape}, {pos.shape}")
        if np.any(np.diff(t) < 0.0) or not np.all(np.isfinite(t)) or not np.all(np.isfinite(pos)):
            raise ValueError("a pose track's times must be finite and non-decreasing, its positions finite")
        if quat is not None:
            quat = np.ascontiguousarray(quat, dtype=np.float64)
            if quat.shape != (t.size, 4):
                raise ValueError(f"a pose track's orientations must be n x 4; got {quat.shape} for n = {t.size}")
        self.t = t
        self.pos = pos
        self.quat = quat
        self._i = 0
        self._eps = 1e-9   # s: the tick times of a recording and of a replay agree to float rounding

    @property
    def duration(self) -> float:
        return float(self.t[-1])

    def pose_at(self, t: float, out: np.ndarray) -> bool:
        """Write the last recorded position at or before scene time ``t`` (s) into ``out`` (3, m). False (and
        ``out`` untouched) before the first sample."""
        ts = self.t
        i = self._i
        if i > 0 and ts[i] > t + self._eps:   # time went back (a reset): search from the start
            i = 0
        n = ts.shape[0]
        while i + 1 < n and ts[i + 1] <= t + self._eps:
            i += 1
        self._i = i
        if ts[i] > t + self._eps:
            return False
        out[0] = self.pos[i, 0]
        out[1] = self.pos[i, 1]
        out[2] = self.pos[i, 2]
        return True

    def quat_at(self, quat_out: np.ndarray) -> bool:
        """After :meth:`pose_at` found a sample: write its orientation (w, x, y, z) into ``quat_out`` (4). False
        (and ``quat_out`` untouched) if the track has none, or none had been sent by then."""
        q = self.quat
        if q is None or q[self._i, 0] != q[self._i, 0]:   # NaN: no orientation yet
            return False
        for k in range(4):
            quat_out[k] = q[self._i, k]
        return True


def quat_rows(quats: list) -> np.ndarray | None:
    """One device's recorded orientations (each a `force` message's ``quat``, or None where it has none) as the
    rows of a PoseTrack's ``quat`` (NaN where none); None if no message has one."""
    if all(q is None for q in quats):
        return None
    return np.array([q if q is not None else [np.nan] * 4 for q in quats], dtype=np.float64)
