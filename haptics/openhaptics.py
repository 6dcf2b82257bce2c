"""The `openhaptics` backend: Phantom / Touch devices through OpenHaptics' HD API, via pyOpenHaptics.

pyOpenHaptics (PyPI pyopenhaptics 1.0.1) is a thin ctypes wrapper; it is the binding we use, but several of its
habits are unsafe for a device that pushes on a hand, so this module works around each one:

* It loads ``libHD.so`` when imported, so importing it without the OpenHaptics runtime raises ``OSError``.
  It is imported only here, lazily, and the ``OSError`` becomes :class:`OpenHapticsUnavailable` with a message
  that says what to install or to use ``--device simulated``.
* ``init_device`` prints and returns None when its own check fires, and that check compares the handle with
  ``HD_BAD_HANDLE`` (an error code, 0x104) instead of ``HD_INVALID_HANDLE`` (0xFFFFFFFF), so a real failure is
  returned as the handle 0xFFFFFFFF. :meth:`OpenHapticsDriver.start` treats both as failure and reads the HD
  error stack to say why.
* ``get_error`` looks an error code up in a five-entry dict inside its own ``except`` clause: any other code
  (``HD_EXCEEDED_MAX_FORCE_IMPULSE``, ``HD_COMM_ERROR``, ...) raises ``KeyError``, which inside a ctypes callback
  is printed and swallowed, and its ``hd_callback`` wrapper returns ``HD_CALLBACK_DONE`` on any error, which
  ends force output for good. We use neither: our servo callback is our own ``CFUNCTYPE``; it never raises,
  reads every error on the stack with ``hdGetError`` and handles every code (:data:`HD_ERRORS`): force errors
  (the device cut its force) restart our output from zero and carry on; device and communication errors stop
  the servo deliberately (zero force, ``HD_CALLBACK_DONE``, a fault reported to the supervisor); anything else
  is counted and reported.
* It enables no safety feature of the device. We enable ``HD_FORCE_RAMPING``, ``HD_MAX_FORCE_CLAMPING`` and
  ``HD_SOFTWARE_FORCE_LIMIT`` besides ``HD_FORCE_OUTPUT``, read ``HD_NOMINAL_MAX_CONTINUOUS_FORCE`` (our clamp
  never exceeds it) and check the calibration.
* Its per-call helpers reassign ``argtypes`` on the shared function objects and allocate ctypes buffers on every
  call. The servo callback instead calls the same loaded library (pyOpenHaptics' ``_lib_hd``) through
  prototypes made once, with buffers allocated once; the library, the constants and the types are
  pyOpenHaptics'.
"""
from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass

import numpy as np

from .servo import Servo, latency_histogram

STALL_S = 0.05          # no servo callback for this long: the scheduler is stuck, and the device is stopped
MAX_CONSECUTIVE_EXCEPTIONS = 100   # a callback failing this many times in a row stops the servo deliberately
CALLBACK_CAPACITY = 1 << 16

HD_CALLBACK_DONE = 0
HD_CALLBACK_CONTINUE = 1
HD_INVALID_HANDLE = 0xFFFFFFFF
HD_CURRENT_BUTTONS = 0x2000
HD_CURRENT_TRANSFORM = 0x2052
HD_NOMINAL_MAX_STIFFNESS = 0x2602
HD_NOMINAL_MAX_FORCE = 0x2603
HD_NOMINAL_MAX_CONTINUOUS_FORCE = 0x2604
HD_CURRENT_FORCE = 0x2700
HD_FORCE_OUTPUT = 0x4000
HD_MAX_FORCE_CLAMPING = 0x4001
HD_FORCE_RAMPING = 0x4002
HD_SOFTWARE_FORCE_LIMIT = 0x4003
HD_MAX_SCHEDULER_PRIORITY = (1 << 16) - 1
HD_CALIBRATION_OK = 0x5000
HD_CALIBRATION_NEEDS_UPDATE = 0x5001
HD_CALIBRATION_NEEDS_MANUAL_INPUT = 0x5002

# Every HD error code (OpenHaptics 3.4 hdDefines.h) -> (name, action). "force": the device cut or limited its
# force; our output restarts from zero and the servo continues. "fatal": the device or its link is gone; the
# servo stops deliberately. "count": a misuse or a transient; counted and reported, the servo continues.
HD_ERRORS: dict[int, tuple[str, str]] = {
    0x0100: ("HD_INVALID_ENUM", "count"),
    0x0101: ("HD_INVALID_VALUE", "count"),
    0x0103: ("HD_INVALID_OPERATION", "count"),
    0x0104: ("HD_BAD_HANDLE", "fatal"),
    0x0200: ("HD_WARM_MOTORS", "force"),
    0x0201: ("HD_EXCEEDED_MAX_FORCE", "force"),
    0x0202: ("HD_EXCEEDED_MAX_FORCE_IMPULSE", "force"),
    0x0203: ("HD_EXCEEDED_MAX_VELOCITY", "force"),
    0x0204: ("HD_FORCE_ERROR", "force"),
    0x0300: ("HD_DEVICE_FAULT", "fatal"),
    0x0301: ("HD_DEVICE_ALREADY_INITIATED", "count"),
    0x0302: ("HD_COMM_ERROR", "fatal"),
    0x0303: ("HD_COMM_CONFIG_ERROR", "fatal"),
    0x0304: ("HD_TIMER_ERROR", "fatal"),
    0x0400: ("HD_ILLEGAL_BEGIN", "count"),
    0x0401: ("HD_ILLEGAL_END", "count"),
    0x0402: ("HD_FRAME_ERROR", "count"),
    0x0500: ("HD_INVALID_PRIORITY", "count"),
    0x0501: ("HD_SCHEDULER_FULL", "fatal"),
    0x0600: ("HD_INVALID_LICENSE", "fatal"),
}


def error_name(code: int) -> str:
    """``HD_NAME (0x0202)`` for a known code, ``unknown HD error 0x....`` otherwise."""
    known = HD_ERRORS.get(code)
    return f"{known[0]} (0x{code:04x})" if known else f"unknown HD error 0x{code:04x}"


class OpenHapticsUnavailable(RuntimeError):
    """The OpenHaptics runtime (libHD.so) or pyOpenHaptics cannot be loaded."""


class DeviceError(RuntimeError):
    """A device could not be initialised or configured."""


def load_bindings():
    """Import pyOpenHaptics (which loads libHD.so). Raises :class:`OpenHapticsUnavailable` with what to do."""
    try:
        from pyOpenHaptics import hd  # noqa: PLC0415 - lazy on purpose: the import loads libHD.so
    except OSError as exc:
        raise OpenHapticsUnavailable(
            f"OpenHaptics runtime not found ({exc}): install the OpenHaptics runtime and your device's driver "
            "(3D Systems, 'OpenHaptics for Linux Developer Edition' and the Touch device driver), make libHD.so "
            "findable (ldconfig, or LD_LIBRARY_PATH), or use --device simulated") from None
    except ImportError as exc:
        raise OpenHapticsUnavailable(f"pyOpenHaptics is not importable ({exc}): pip install pyopenhaptics==1.0.1,"
                                     " or use --device simulated") from None
    return hd


@dataclass(frozen=True)
class HDDeviceSpec:
    """One OpenHaptics device of the server: our name for it, OpenHaptics' name (as configured with
    Touch_Setup; "Default Device" for the first), and the Servo that handles its ticks."""
    name: str
    hd_name: str
    servo_factory: object   # callable (device_max_force_n: float | None) -> Servo


class _Device:
    """Per-device state touched by the servo callback (buffers allocated once)."""

    def __init__(self, spec: HDDeviceSpec, handle: int, servo: Servo):
        self.spec = spec
        self.handle = handle
        self.servo = servo
        self.mat = (ctypes.c_double * 16)()
        self.buttons = ctypes.c_int(0)
        self.out = (ctypes.c_double * 3)()
        self.rot = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
        self.last_ns = 0
        self.callback_ns = np.zeros(CALLBACK_CAPACITY, dtype=np.int64)
        self.n_callbacks = 0
        self.errors: dict[int, int] = {}
        self.exceptions = 0
        self.consecutive_exceptions = 0
        self.last_exception = ""
        self.stop_reason: str | None = None
        self.callback = None     # the CFUNCTYPE object: kept referenced for as long as the scheduler may call it
        self.sched_handle = 0


class OpenHapticsDriver:
    """All OpenHaptics devices of a server: one HD scheduler, one servo callback per device."""

    def __init__(self, specs: list[HDDeviceSpec], log=print):
        self.specs = specs
        self.log = log
        self.devices: list[_Device] = []
        self.started = False
        self._lock = threading.Lock()

    # -- set-up ---------------------------------------------------------------------------------------
    def _prototypes(self, hd) -> None:
        from pyOpenHaptics.hd_define import HDErrorInfo  # noqa: PLC0415 - loaded with the library
        lib = hd._lib_hd
        c_uint, c_void_p = ctypes.c_uint, ctypes.c_void_p

        def proto(name, restype, *argtypes):
            return ctypes.CFUNCTYPE(restype, *argtypes)((name, lib))

        self._begin = proto("hdBeginFrame", None, c_uint)
        self._end = proto("hdEndFrame", None, c_uint)
        self._make_current = proto("hdMakeCurrentDevice", None, c_uint)
        self._get_doublev = proto("hdGetDoublev", None, c_uint, c_void_p)
        self._get_integerv = proto("hdGetIntegerv", None, c_uint, c_void_p)
        self._set_doublev = proto("hdSetDoublev", None, c_uint, c_void_p)
        self._get_error = proto("hdGetError", HDErrorInfo)
        self._enable = proto("hdEnable", None, c_uint)
        self._schedule = proto("hdScheduleAsynchronous", ctypes.c_ulong, c_void_p, c_void_p, ctypes.c_ushort)
        self._unschedule = proto("hdUnschedule", None, ctypes.c_ulong)
        try:
            self._check_calibration = proto("hdCheckCalibration", c_uint)
        except AttributeError:   # not every libHD build exports it
            self._check_calibration = None
        self._callback_type = ctypes.CFUNCTYPE(c_uint, c_void_p)

    def _errors(self) -> list[tuple[int, int]]:
        out = []
        for _ in range(32):
            info = self._get_error()
            if info.errorCode == 0:
                break
            out.append((int(info.errorCode), int(info.internalErrorCode)))
        return out

    def start(self) -> list[dict]:
        """Load the library, initialise and configure every device, start the scheduler. Returns one info dict
        per device (model, vendor, nominal forces, calibration). Raises :class:`OpenHapticsUnavailable` or
        :class:`DeviceError` (with every device already initialised disabled again)."""
        hd = load_bindings()
        self.hd = hd
        self._prototypes(hd)
        infos = []
        try:
            for spec in self.specs:
                handle = hd.init_device(spec.hd_name)
                errors = self._errors()
                if handle is None or handle == HD_INVALID_HANDLE or any(HD_ERRORS.get(c, ("", "fatal"))[1] ==
                                                                        "fatal" for c, _ in errors):
                    why = "; ".join(f"{error_name(c)}, internal code {i}" for c, i in errors) or "no HD error"
                    raise DeviceError(f"OpenHaptics device {spec.hd_name!r} (for {spec.name}) could not be "
                                      f"initialised ({why}): is it plugged in, powered and set up with "
                                      "Touch_Setup? Or use --device simulated")
                handle = int(handle)
                self._make_current(handle)
                for cap in (HD_FORCE_OUTPUT, HD_FORCE_RAMPING, HD_MAX_FORCE_CLAMPING, HD_SOFTWARE_FORCE_LIMIT):
                    self._enable(cap)
                value = ctypes.c_double(0.0)
                self._get_doublev(HD_NOMINAL_MAX_CONTINUOUS_FORCE, ctypes.byref(value))
                cont = float(value.value)
                self._get_doublev(HD_NOMINAL_MAX_FORCE, ctypes.byref(value))
                peak = float(value.value)
                value.value = 0.0
                self._get_doublev(HD_NOMINAL_MAX_STIFFNESS, ctypes.byref(value))
                stiffness = float(value.value) * 1000.0   # OpenHaptics reports N/mm
                calibration = "unknown"
                if self._check_calibration is not None:
                    c = self._check_calibration()
                    calibration = {HD_CALIBRATION_OK: "ok", HD_CALIBRATION_NEEDS_UPDATE: "needs update",
                                   HD_CALIBRATION_NEEDS_MANUAL_INPUT: "needs manual input (put the stylus in "
                                   "its inkwell)"}.get(c, f"0x{c:04x}")
                errors = self._errors()
                if errors:
                    self.log(f"suturesim: {spec.name}: configuring reported "
                             + ", ".join(error_name(c) for c, _ in errors))
                limit = cont if cont > 0.0 and np.isfinite(cont) else None
                dev = _Device(spec, handle, spec.servo_factory(limit))
                self.devices.append(dev)
                infos.append({"device": spec.name, "hd_name": spec.hd_name, "model": hd.get_model(),
                              "vendor": hd.get_vendor(), "max_continuous_force_n": cont, "max_force_n": peak,
                              "max_stiffness_n_per_m": stiffness if stiffness > 0.0 and np.isfinite(stiffness)
                              else 0.0,
                              "calibration": calibration, "clamp_n": dev.servo.safety.max_force_n})
            for i, dev in enumerate(self.devices):
                dev.callback = self._callback_type(self._make_servo(i))
                dev.sched_handle = self._schedule(ctypes.cast(dev.callback, ctypes.c_void_p), None,
                                                  HD_MAX_SCHEDULER_PRIORITY)
            hd.start_scheduler()
            self.started = True
            errors = self._errors()
            if any(HD_ERRORS.get(c, ("", "fatal"))[1] == "fatal" for c, _ in errors):
                raise DeviceError("the OpenHaptics scheduler did not start: "
                                  + ", ".join(error_name(c) for c, _ in errors))
        except BaseException:
            self.stop(ramp_s=0.0)
            raise
        return infos

    # -- the servo callback ---------------------------------------------------------------------------
    def _make_servo(self, i: int):
        dev = self.devices[i]
        servo, begin, end, make_current = dev.servo, self._begin, self._end, self._make_current
        get_doublev, get_integerv, set_doublev = self._get_doublev, self._get_integerv, self._set_doublev
        get_error, mat, buttons, out, rot = self._get_error, dev.mat, dev.buttons, dev.out, dev.rot
        monotonic_ns = time.monotonic_ns
        handle = dev.handle
        multi = len(self.devices) > 1

        def callback(_user_data):
            # Runs on the HD scheduler's thread at 1 kHz. It must never raise (ctypes would print and swallow it
            # and return 0 = HD_CALLBACK_DONE, ending force output) and returns DONE only on purpose.
            t0 = monotonic_ns()
            try:
                if multi:
                    make_current(handle)
                begin(handle)
                get_doublev(HD_CURRENT_TRANSFORM, mat)
                get_integerv(HD_CURRENT_BUTTONS, ctypes.byref(buttons))
                # HD_CURRENT_TRANSFORM is column-major: column j at mat[4j:4j+3], translation at mat[12:15]
                rot[0][0], rot[1][0], rot[2][0] = mat[0], mat[1], mat[2]
                rot[0][1], rot[1][1], rot[2][1] = mat[4], mat[5], mat[6]
                rot[0][2], rot[1][2], rot[2][2] = mat[8], mat[9], mat[10]
                if dev.stop_reason is not None:
                    out[0] = out[1] = out[2] = 0.0
                else:
                    servo.tick(mat[12], mat[13], mat[14], rot, buttons.value, t0, out)
                set_doublev(HD_CURRENT_FORCE, out)
                end(handle)
                while True:
                    info = get_error()
                    code = info.errorCode
                    if code == 0:
                        break
                    dev.errors[code] = dev.errors.get(code, 0) + 1
                    servo.error_code = code & 0xFFFF
                    action = HD_ERRORS.get(code, ("", "count"))[1]
                    if action == "force":
                        servo.reset()     # the device cut its force: ours restarts from zero, through the slew
                    elif action == "fatal" and dev.stop_reason is None:
                        dev.stop_reason = f"{dev.spec.name}: {error_name(code)} (internal {info.internalErrorCode})"
                dev.consecutive_exceptions = 0
            except BaseException as exc:  # noqa: BLE001 - nothing may escape into the HD scheduler
                dev.exceptions += 1
                dev.consecutive_exceptions += 1
                dev.last_exception = f"{exc.__class__.__name__}: {exc}"
                try:
                    out[0] = out[1] = out[2] = 0.0
                    servo.zero(out)
                    set_doublev(HD_CURRENT_FORCE, out)
                    end(handle)
                except BaseException:  # noqa: BLE001
                    pass
                if dev.consecutive_exceptions >= MAX_CONSECUTIVE_EXCEPTIONS and dev.stop_reason is None:
                    dev.stop_reason = f"{dev.spec.name}: the servo callback kept failing ({dev.last_exception})"
            t1 = monotonic_ns()
            dev.last_ns = t1
            if servo.stats_from_ns and t0 >= servo.stats_from_ns:   # the servo's steady state, as latency
                dev.callback_ns[dev.n_callbacks & (CALLBACK_CAPACITY - 1)] = t1 - t0
                dev.n_callbacks += 1
            # a fatal device error: the zero force above went out in this frame; now stop calling us
            return HD_CALLBACK_DONE if dev.stop_reason is not None else HD_CALLBACK_CONTINUE

        return callback

    # -- supervision ----------------------------------------------------------------------------------
    def poll(self) -> str | None:
        """Called every few ms by the driver's main thread: a reason to stop (a fatal device error, or no
        servo callback for ``STALL_S``), or None."""
        now = time.monotonic_ns()
        for dev in self.devices:
            if dev.stop_reason is not None:
                return dev.stop_reason
            if dev.last_ns and now - dev.last_ns > STALL_S * 1e9:
                return (f"{dev.spec.name}: the servo callback stalled (none for {(now - dev.last_ns) / 1e6:.0f} "
                        "ms); the device was stopped")
        return None

    def stop(self, ramp_s: float = 0.06) -> None:
        """Ramp every output to zero (the watchdog's ramp, ``ramp_s`` long), stop the scheduler and disable
        the devices (their motors off). Safe to call more than once and after a failed start."""
        with self._lock:
            for dev in self.devices:
                dev.servo.stopping = True
            if self.started and ramp_s > 0.0 and not self.poll():
                time.sleep(ramp_s)
            hd = getattr(self, "hd", None)
            if hd is None:
                return
            if self.started:
                for dev in self.devices:
                    if dev.sched_handle:
                        self._unschedule(dev.sched_handle)
                        dev.sched_handle = 0
                hd.stop_scheduler()
                self.started = False
            for dev in self.devices:
                hd.close_device(dev.handle)
            self.devices_closed = list(self.devices)
            self.devices = []

    def summary(self, devices: list | None = None) -> dict:
        """Per device: pose-to-force latency (µs: p50, p99, max, count), servo callback time (µs: p99, max),
        ticks on which the servo's backstop acted (watchdog ramp or slew limit, see Servo.backstop_ticks), HD
        errors seen by name, callback exceptions."""
        out = {}
        for dev in devices if devices is not None else (self.devices or getattr(self, "devices_closed", [])):
            lat = dev.servo.latencies_us()
            n = min(dev.n_callbacks, CALLBACK_CAPACITY)
            cb = dev.callback_ns[:n] / 1000.0
            out[dev.spec.name] = {
                "latency_us": _percentiles(lat), "callback_us": _percentiles(cb), "callbacks": dev.n_callbacks,
                "backstop_ticks": dev.servo.backstop_ticks,
                # forces by the nearest whole number of servo periods of their latency: 0, 1, ..., 9, >= 10
                "latency_hist_periods": latency_histogram(lat),
                "errors": {error_name(c): k for c, k in dev.errors.items()}, "exceptions": dev.exceptions,
                "last_exception": dev.last_exception}
        return out


def _percentiles(a: np.ndarray) -> dict:
    if a.size == 0:
        return {"count": 0}
    return {"count": int(a.size), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}
