"""One device's servo tick: what a driver's 1 kHz callback does between reading the stylus and commanding
the motors (docs/ARCHITECTURE.md Sec. 2).

Per tick: map the stylus pose into the scene and publish it on the shared-memory link; take the newest force
physics computed; pass it through this device's last safety stage; turn it into the device frame.

Where the safety stages run. The physics process shapes each device's force (NaN guard -> scale -> clamp ->
slew -> low-pass, haptics/safety.py) once per tick, so the `force` topic carries exactly what is sent and a
recording replays bit for bit. The servo then runs its own :class:`ForceSafety` as a backstop and as the
watchdog, which only the device side can be: a NaN guard, the clamp at the device's limit again, a slew limit
at ``BACKSTOP_SLEW_FACTOR`` times the configured one (the servo samples physics' output on its own clock, so
two physics ticks can land in one servo period; the factor keeps the backstop idle on a healthy stream), no
low-pass, and the watchdog: a force older than ``watchdog_s`` ramps to zero. While physics runs normally the
device receives the published force unchanged.

Nothing here allocates arrays, blocks or raises on the tick path: a failed link read counts as a stale force.
"""
from __future__ import annotations

import numpy as np

from .link import DeviceLink
from .safety import FLAG_FAULT, FLAG_SLEWED, FLAG_WATCHDOG, ForceSafety, SafetyConfig
from .transform import DeviceTransform

BACKSTOP_SLEW_FACTOR = 3.0
LATENCY_CAPACITY = 1 << 16     # samples kept for the pose-to-force latency and callback-time statistics
STATS_AFTER_S = 1.0            # timings are kept from this long after the first fresh force: the start-up of
                               # the physics process (loading every kernel) is not the servo's steady state
SERVO_PERIOD_US = 1000.0       # the servo callback's period: the HD scheduler's 1 kHz, which the driver keeps
HIST_BINS = 11                 # latency histogram: 0 to 9 servo periods, and 10 or more


def backstop_config(cfg: SafetyConfig) -> SafetyConfig:
    """The servo's safety settings derived from the physics-side ones (see the module docstring)."""
    return SafetyConfig(scale=1.0, max_force_n=cfg.max_force_n,
                        max_slew_n_per_s=cfg.max_slew_n_per_s * BACKSTOP_SLEW_FACTOR, lowpass_hz=0.0,
                        watchdog_s=cfg.watchdog_s, ramp_down_s=cfg.ramp_down_s)


class Servo:
    """The servo tick of one device on link slot ``slot``.

    :param link: the shared-memory link (attached).
    :param slot: this device's slot.
    :param transform: device-to-scene mapping.
    :param safety: the configured safety settings (the backstop is derived from them).
    :param device_max_force_n: the device's nominal max continuous force (N), or None.
    """

    def __init__(self, link: DeviceLink, slot: int, transform: DeviceTransform, safety: SafetyConfig,
                 device_max_force_n: float | None = None):
        self.link = link
        self.slot = slot
        self.transform = transform
        self.safety = ForceSafety(backstop_config(safety), device_max_force_n)
        self._pos = np.zeros(3)
        self._quat = np.array([1.0, 0.0, 0.0, 0.0])
        self._force = np.zeros(3)       # scene frame, from the link
        self._safe = np.zeros(3)        # scene frame, after the backstop
        self._pose_t = [0]
        self._last_seq = -1
        self._last_ns = 0
        self.stopping = False           # set: treat every force as stale, so the output ramps to zero
        self.flags = 0
        self.error_code = 0             # the last device error (e.g. an HD error code), reported to physics
        self.ticks = 0
        # ticks, from the first force physics computed until stopping, on which the backstop sent the motors
        # something physics did not publish: a nonzero watchdog ramp (physics late by more than watchdog_s) or
        # a slew-limited step. A test or a log matches published forces against the device's with these aside.
        self.backstop_ticks = 0
        # pose-to-force latency (ns): the time from a pose being published to the first servo tick commanding a
        # force computed from it
        self.latency_ns = np.zeros(LATENCY_CAPACITY, dtype=np.int64)
        self.n_latency = 0
        self.stats_from_ns = 0          # 0 until the first fresh force; then when statistics start

    def reset(self) -> None:
        """Zero the output state (start, or after the device itself cut the force)."""
        self.safety.reset()

    def tick(self, px: float, py: float, pz: float, rot, buttons: int, now_ns: int, out) -> int:
        """One servo tick. ``(px, py, pz)``: stylus position (device units); ``rot``: its 3x3 orientation
        (device frame, rows) or None; ``buttons``: bitmask; ``now_ns``: ``time.monotonic_ns()``. Writes the
        force to command (N, device frame) into ``out`` and returns the safety flags."""
        link, slot = self.link, self.slot
        self.transform.pose_to_scene(px, py, pz, rot, self._pos, self._quat)
        link.write_pose(slot, self._pos, self._quat, buttons, now_ns, (self.flags & 0xFFFF) | (self.error_code << 16))
        rec = link.read_force(slot, self._force, self._pose_t)
        if rec is None or self.stopping:
            force_t = -1.0     # never written, unreadable or stopping: stale, so the watchdog ramps to zero
        else:
            seq, t_ns, _axial, flags, _tick = rec
            force_t = t_ns * 1e-9
            if seq != self._last_seq:
                self._last_seq = seq
                pose_t = self._pose_t[0]
                if not self.stats_from_ns and pose_t > 0:
                    self.stats_from_ns = now_ns + int(STATS_AFTER_S * 1e9)
                if pose_t > 0 and now_ns >= self.stats_from_ns:
                    self.latency_ns[self.n_latency & (LATENCY_CAPACITY - 1)] = now_ns - pose_t
                    self.n_latency += 1
        dt = (now_ns - self._last_ns) * 1e-9 if self._last_ns else 1e-3
        self._last_ns = now_ns
        if not 0.0 < dt < 0.1:
            dt = 1e-3   # a first tick or a stalled scheduler: the backstop is judged against a nominal period
        flags = self.safety.step(self._force, force_t, now_ns * 1e-9, dt, self._safe)
        self.transform.force_to_device(self._safe[0], self._safe[1], self._safe[2], out)
        self.flags = flags
        self.ticks += 1
        if self._last_seq >= 0 and not self.stopping and (
                flags & FLAG_SLEWED or (flags & FLAG_WATCHDOG and (self._safe[0] != 0.0 or self._safe[1] != 0.0
                                                                   or self._safe[2] != 0.0))):
            self.backstop_ticks += 1
        return flags

    def zero(self, out) -> None:
        """Command zero (fault path) and make the next output start from zero."""
        out[0] = out[1] = out[2] = 0.0
        self.safety.reset()
        self.flags = FLAG_FAULT

    def latencies_us(self) -> np.ndarray:
        """The recorded pose-to-force latencies (µs), oldest first (at most LATENCY_CAPACITY), from
        ``STATS_AFTER_S`` after the first force computed from one of this device's poses."""
        n = min(self.n_latency, LATENCY_CAPACITY)
        if self.n_latency <= LATENCY_CAPACITY:
            return self.latency_ns[:n] / 1000.0
        k = self.n_latency & (LATENCY_CAPACITY - 1)
        return np.concatenate([self.latency_ns[k:], self.latency_ns[:k]]) / 1000.0


def latency_histogram(latency_us: np.ndarray, period_us: float = SERVO_PERIOD_US) -> list[int]:
    """Forces by the whole number of servo periods nearest their pose-to-force latency: bin k holds latencies
    in [k - 1/2, k + 1/2) periods, the last bin everything from HIST_BINS - 1.5 periods up. A latency is the
    time between two servo callbacks, a whole number of periods apart up to their wake-up jitter, so a force
    one period after its pose lands in bin 1 whether its callback woke a little early or a little late; bins
    cut at whole periods would split those forces about evenly between the first two bins."""
    k = np.floor(np.asarray(latency_us, dtype=float) / period_us + 0.5)
    return np.bincount(np.clip(k, 0, HIST_BINS - 1).astype(int), minlength=HIST_BINS).tolist()
