"""Force-safety pipeline between the physics force and the haptic device (docs/ARCHITECTURE.md Sec. 4.1).

Stages, in this order, applied once per servo tick (1 kHz, inside the device callback)::

    NaN/inf guard -> scale -> magnitude clamp -> slew-rate limit -> low-pass -> watchdog -> device

* NaN/inf guard: a non-finite input component makes the whole input vector zero (``FLAG_FAULT``).
* scale: multiply by ``SafetyConfig.scale`` (dimensionless, >= 0).
* clamp: ``|F| <= min(config.max_force_n, device nominal max continuous force)`` (N), keeping the
  direction (``FLAG_CLAMPED``). Computed without overflow even for inputs near the float64 maximum.
* slew-rate limit: ``|F_k - F_{k-1}| <= max_slew_n_per_s * dt`` on the *vector* change (``FLAG_SLEWED``).
* low-pass: first order, exact discretisation ``y += alpha (x - y)`` with ``alpha = 1 - exp(-2 pi fc dt)``
  (``fc = lowpass_hz``; 0 disables it).
* watchdog: when ``now_s - force_t_s > watchdog_s`` (or either time is non-finite) the target becomes zero and
  the output ramps down *linearly* from the last output to exactly zero over ``ramp_down_s`` and stays there
  (``FLAG_WATCHDOG``). While ramping, the slew and low-pass states track the output, so when fresh forces
  arrive the output resumes continuously from where it is, through the slew limit.
* a bad ``dt`` (<= 0 or non-finite) writes zero, clears the state and sets ``FLAG_FAULT``.

Zero force on start (a new :class:`ForceSafety` outputs from zero), stop and fault (:meth:`ForceSafety.reset`);
on a crash the supervisor zeroes the device link. :meth:`ForceSafety.step` never raises, never writes a
non-finite value and creates no numpy temporaries: it works on plain Python floats for the three components
(a few microseconds per call in CPython).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# `flags` bits of the `force` topic (docs/PROTOCOL.md): which stage acted. Defined here, where the stages are;
# server/protocol.py re-exports them (haptics never imports server).
FLAG_CLAMPED = 1
FLAG_SLEWED = 2
FLAG_WATCHDOG = 4
FLAG_FAULT = 8

__all__ = ["SafetyConfig", "ForceSafety", "FLAG_CLAMPED", "FLAG_SLEWED", "FLAG_WATCHDOG", "FLAG_FAULT"]

_TWO_PI = 2.0 * math.pi
_isfinite = math.isfinite
_hypot = math.hypot


@dataclass(frozen=True)
class SafetyConfig:
    """Force-safety settings (SI units).

    :param scale: dimensionless gain applied to the physics force, finite and >= 0.
    :param max_force_n: clamp on the force magnitude (N), finite and > 0. The device's nominal max continuous
        force is passed to :class:`ForceSafety` separately; the smaller of the two applies.
    :param max_slew_n_per_s: limit on ``|dF/dt|`` (N/s), finite and > 0.
    :param lowpass_hz: first-order low-pass cutoff (Hz), finite and >= 0; 0 turns the filter off.
    :param watchdog_s: a force older than this (s) is stale and the output ramps to zero; finite and > 0.
    :param ramp_down_s: duration (s) of the watchdog's linear ramp to zero, finite and >= 0 (0: drop at once).
    """

    scale: float = 1.0
    max_force_n: float = 3.0
    max_slew_n_per_s: float = 500.0
    lowpass_hz: float = 200.0
    watchdog_s: float = 0.005
    ramp_down_s: float = 0.05

    def validated(self) -> "SafetyConfig":
        """Return ``self`` if every field is valid, else raise :class:`ValueError` naming the field."""
        rules = (
            ("scale", False),
            ("max_force_n", True),
            ("max_slew_n_per_s", True),
            ("lowpass_hz", False),
            ("watchdog_s", True),
            ("ramp_down_s", False),
        )
        for name, strictly_positive in rules:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"SafetyConfig.{name} must be a number, got {value!r}")
            v = float(value)
            if not math.isfinite(v):
                raise ValueError(f"SafetyConfig.{name} must be finite, got {value!r}")
            if strictly_positive and v <= 0.0:
                raise ValueError(f"SafetyConfig.{name} must be > 0, got {value!r}")
            if not strictly_positive and v < 0.0:
                raise ValueError(f"SafetyConfig.{name} must be >= 0, got {value!r}")
        return self


class ForceSafety:
    """Per-device force-safety state machine; call :meth:`step` once per servo tick.

    :param config: the settings; validated here (``ValueError`` naming the field).
    :param device_max_force_n: the device's nominal max continuous force (N), or ``None`` if unknown. The
        effective clamp is ``min(config.max_force_n, device_max_force_n)``.
    """

    __slots__ = (
        "config", "max_force_n", "_scale", "_slew", "_fc", "_watchdog_s", "_ramp_s",
        "_sx", "_sy", "_sz", "_yx", "_yy", "_yz", "_ox", "_oy", "_oz",
        "_ramping", "_ramp_elapsed", "_rx", "_ry", "_rz", "_alpha_dt", "_alpha", "last_flags",
    )

    def __init__(self, config: SafetyConfig, device_max_force_n: float | None = None) -> None:
        self.config = config.validated()
        limit = float(config.max_force_n)
        if device_max_force_n is not None:
            d = float(device_max_force_n)
            if not math.isfinite(d) or d <= 0.0:
                raise ValueError(f"device_max_force_n must be finite and > 0, got {device_max_force_n!r}")
            limit = min(limit, d)
        #: effective magnitude clamp (N)
        self.max_force_n = limit
        self._scale = float(config.scale)
        self._slew = float(config.max_slew_n_per_s)
        self._fc = float(config.lowpass_hz)
        self._watchdog_s = float(config.watchdog_s)
        self._ramp_s = float(config.ramp_down_s)
        self._alpha_dt = -1.0
        self._alpha = 1.0
        self.reset()

    def reset(self) -> None:
        """Zero the output and clear all state (start, stop, fault). The next step slews up from zero."""
        self._sx = self._sy = self._sz = 0.0   # slew-limiter output (N)
        self._yx = self._yy = self._yz = 0.0   # low-pass output (N)
        self._ox = self._oy = self._oz = 0.0   # last output (N)
        self._ramping = False
        self._ramp_elapsed = 0.0
        self._rx = self._ry = self._rz = 0.0   # output when the watchdog ramp started (N)
        self.last_flags = 0

    @property
    def last_output(self) -> tuple[float, float, float]:
        """The force (N) written by the last :meth:`step` (zero after :meth:`reset`)."""
        return (self._ox, self._oy, self._oz)

    def step(self, force_in, force_t_s: float, now_s: float, dt_s: float, out: np.ndarray) -> int:
        """Run the pipeline once and write the safe force (N, shape (3,)) into ``out``.

        :param force_in: physics force (N), 3 components (array or sequence).
        :param force_t_s: time (s) at which ``force_in`` was computed.
        :param now_s: current time (s), same clock as ``force_t_s``.
        :param dt_s: servo period (s) since the previous step.
        :param out: preallocated float array of 3 elements, written in place.
        :returns: the ``FLAG_*`` bitmask of the stages that acted (also kept in :attr:`last_flags`).
        Never raises; on any internal error writes zero and returns ``FLAG_FAULT``.
        """
        try:
            return self._step(force_in, force_t_s, now_s, dt_s, out)
        except Exception:  # noqa: BLE001 - a servo callback must never raise
            self.reset()
            self.last_flags = FLAG_FAULT
            try:
                out[0] = 0.0
                out[1] = 0.0
                out[2] = 0.0
            except Exception:  # noqa: BLE001
                pass
            return FLAG_FAULT

    def _step(self, force_in, force_t_s, now_s, dt_s, out) -> int:
        # long: one function on purpose. It runs in every servo callback (1 kHz, holding the GIL), its stages
        # (guard, watchdog, clamp, slew limit, low-pass, final guard) share the per-call locals, and as calls
        # they would add a Python call each to the callback without reading any clearer.
        flags = 0
        try:
            dt = float(dt_s)
        except (TypeError, ValueError):
            dt = math.nan
        if not (dt > 0.0) or not _isfinite(dt):
            self.reset()
            out[0] = 0.0
            out[1] = 0.0
            out[2] = 0.0
            self.last_flags = FLAG_FAULT
            return FLAG_FAULT

        # --- NaN/inf guard -------------------------------------------------------------------------------
        try:
            x = float(force_in[0])
            y = float(force_in[1])
            z = float(force_in[2])
        except (TypeError, ValueError, IndexError, OverflowError):
            x = y = z = math.nan
        if not (_isfinite(x) and _isfinite(y) and _isfinite(z)):
            x = y = z = 0.0
            flags |= FLAG_FAULT

        # --- watchdog decision (needed before the filters, which are bypassed while stale) ------------------
        try:
            age = float(now_s) - float(force_t_s)
        except (TypeError, ValueError, OverflowError):
            age = math.nan
        if not _isfinite(age):
            flags |= FLAG_FAULT
            stale = True
        else:
            stale = age > self._watchdog_s

        if stale:
            flags |= FLAG_WATCHDOG
            if not self._ramping:
                self._ramping = True
                self._ramp_elapsed = 0.0
                self._rx, self._ry, self._rz = self._ox, self._oy, self._oz
            self._ramp_elapsed += dt
            ramp = self._ramp_s
            k = 0.0 if ramp <= 0.0 else 1.0 - self._ramp_elapsed / ramp
            if k <= 1e-9:
                ox = oy = oz = 0.0
            else:
                ox = self._rx * k
                oy = self._ry * k
                oz = self._rz * k
            # The filters track the output so that fresh forces resume from here, through the slew limit.
            self._sx = self._yx = ox
            self._sy = self._yy = oy
            self._sz = self._yz = oz
        else:
            self._ramping = False
            # --- scale and clamp (overflow-free: normalise by the largest component) -------------------------
            lim = self.max_force_n
            m = max(abs(x), abs(y), abs(z))
            if m > 0.0:
                nx = x / m
                ny = y / m
                nz = z / m
                hn = _hypot(nx, ny, nz)          # in [1, sqrt(3)]
                # scale first: m * hn alone can overflow to inf when a tiny scale would bring it in range; the
                # product may still be inf for huge inputs, which is fine for the comparison
                mag = m * (hn * self._scale)
                if mag > lim:
                    f = lim / hn
                    tx = nx * f
                    ty = ny * f
                    tz = nz * f
                    flags |= FLAG_CLAMPED
                else:
                    s = self._scale
                    tx = x * s
                    ty = y * s
                    tz = z * s
            else:
                tx = ty = tz = 0.0

            # --- slew-rate limit on the vector change ------------------------------------------------------
            sx, sy, sz = self._sx, self._sy, self._sz
            dx = tx - sx
            dy = ty - sy
            dz = tz - sz
            dmax = self._slew * dt
            dm = _hypot(dx, dy, dz)
            if dm > dmax:
                f = dmax / dm
                sx += dx * f
                sy += dy * f
                sz += dz * f
                flags |= FLAG_SLEWED
            else:
                sx, sy, sz = tx, ty, tz
            self._sx, self._sy, self._sz = sx, sy, sz

            # --- first-order low-pass, exact discretisation -------------------------------------------------
            if self._fc > 0.0:
                if dt != self._alpha_dt:
                    self._alpha = -math.expm1(-_TWO_PI * self._fc * dt)
                    self._alpha_dt = dt
                a = self._alpha
                ox = self._yx + a * (sx - self._yx)
                oy = self._yy + a * (sy - self._yy)
                oz = self._yz + a * (sz - self._yz)
            else:
                ox, oy, oz = sx, sy, sz
            self._yx, self._yy, self._yz = ox, oy, oz

        # --- final guard: never hand the device a non-finite value (should be unreachable) -----------------
        if not (_isfinite(ox) and _isfinite(oy) and _isfinite(oz)):
            self.reset()
            ox = oy = oz = 0.0
            flags |= FLAG_FAULT
        self._ox, self._oy, self._oz = ox, oy, oz
        out[0] = ox
        out[1] = oy
        out[2] = oz
        self.last_flags = flags
        return flags
