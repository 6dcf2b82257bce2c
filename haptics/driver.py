"""The device-driver process: runs the servo callbacks of the hardware devices (today: OpenHaptics) next to the
physics process, joined to it only by the shared-memory link (docs/ARCHITECTURE.md Sec. 2).

The supervisor starts it before the physics process and waits for one message on the pipe: ``("ready", infos)``
(one dict per device: model, nominal forces, calibration, effective clamp) or ``("error", message)`` (the
runtime or a device is missing; nothing was left running). Then it runs until told to stop, or until a device
fails; either way every output ramps to zero, the scheduler stops, the devices are disabled (motors off), each
device's pose is marked unavailable on the link, and ``("stopped", reason or None, summary)`` is sent, with
the pose-to-force latency and servo-callback timings of each device.

It also stops, with zero force, if the supervisor dies without telling it (Linux: PR_SET_PDEATHSIG), so a
killed server never leaves a motor pushing.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from .link import DeviceLink
from .openhaptics import DeviceError, HDDeviceSpec, OpenHapticsDriver, OpenHapticsUnavailable
from .process import StopRequest, dump_stacks_on_signal
from .safety import SafetyConfig
from .servo import Servo
from .transform import DeviceTransform

POLL_S = 0.005
SERVO_PRIORITY = 60     # above the physics loop's default 50: the servo tick is short and must never wait


@dataclass(frozen=True)
class DriverDevice:
    """What the driver needs for one device: our name, its link slot, OpenHaptics' name, the transform and
    the safety settings (the servo's backstop is derived from them)."""
    name: str
    slot: int
    hd_name: str
    transform: DeviceTransform
    safety: SafetyConfig


def realtime_servo(priority: int = SERVO_PRIORITY) -> None:
    """SCHED_FIFO for this thread and the threads it creates afterwards (the HD scheduler's servo thread
    inherits it), as OpenHaptics runs its servo loop, on the CPUs the physics loop does not pin; quietly
    normal priority where it is not permitted."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (PermissionError, OSError, AttributeError):
        pass
    try:  # off the CPU the physics loop pins itself to (the last one), when there is another
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) > 1:
            os.sched_setaffinity(0, allowed[:-1])
    except (OSError, AttributeError):
        pass


def _log_line(line: str) -> None:
    """A line on stderr in one write, so that another process's line cannot land inside it (server/console.py)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def driver_main(devices: list[DriverDevice], link_name: str, conn, stop) -> None:
    """Entry point of the driver process (multiprocessing, spawn). ``conn``: a Pipe end to the supervisor;
    ``stop``: a shared stop flag (haptics/process.py). Started through process.child_main, which armed
    die-with-parent before this module's imports."""
    realtime_servo()
    dump_stacks_on_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the supervisor decides when to stop
    stop = StopRequest(stop)                          # or SIGTERM (a dying supervisor's, among others)
    link = DeviceLink.attach(link_name)

    def factory(dev: DriverDevice):
        return lambda max_force: Servo(link, dev.slot, dev.transform, dev.safety, max_force)

    driver = OpenHapticsDriver([HDDeviceSpec(d.name, d.hd_name, factory(d)) for d in devices],
                               log=_log_line)
    try:
        infos = driver.start()
    except (OpenHapticsUnavailable, DeviceError) as exc:
        conn.send(("error", str(exc)))
        link.close()
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - anything else at start-up is reported the same way
        conn.send(("error", f"the OpenHaptics driver failed to start: {exc.__class__.__name__}: {exc}"))
        link.close()
        sys.exit(2)
    conn.send(("ready", infos))
    reason = None
    while not stop.wait(POLL_S):
        reason = driver.poll()
        if reason is not None:
            break
    driver.stop()
    now = time.monotonic_ns()
    for d in devices:
        link.clear_pose(d.slot, now)
    try:
        conn.send(("stopped", reason, driver.summary()))
    except (OSError, EOFError):
        pass
    link.close()
    sys.exit(1 if reason else 0)
