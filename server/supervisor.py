"""`suturesim serve`: the supervisor (DESIGN.md, "Processes and data flow").

It validates the configuration (before anything starts), creates the shared-memory link to the device driver,
starts the physics process and, when asked, a recorder process; on SIGINT/SIGTERM it zeroes every force, stops
the children, flushes the recording and exits 0. If the physics process dies, it zeroes the forces at once and,
by the configured policy, starts it again (which publishes a `fault` event first) or exits non-zero with the
reason, after publishing the `fault` event itself.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from dataclasses import replace

import zmq

from ..haptics.driver import DriverDevice, driver_main
from ..haptics.link import DeviceLink
from ..haptics.process import StopRequest, dump_stacks_on_signal, shared_flag
from ..solver.scenario import load_scenario
from . import protocol
from .config import ServerConfig, server_metadata
from .console import say
from .headless import recording_metadata
from .physics import physics_main
from .recorder import recorder_main
from .security import check_bind_policy

STOP_TIMEOUT_S = 1.5     # the physics process gets this long to stop by itself before it is killed
RECORDER_IDLE_S = 5.0    # a stopping recorder that writes nothing for this long is killed ...
RECORDER_STOP_S = 60.0   # ... and one still writing its queue after this long too
READY_TIMEOUT_S = 120.0  # first start on a cold numba cache compiles every kernel
DRIVER_READY_TIMEOUT_S = 20.0   # the device driver's start: load libHD, initialise and calibrate the devices
DEVICE_STATS_ENV = "SUTURESIM_DEVICE_STATS"   # if set: the driver's timing summary is written there as JSON


class DeviceStartError(RuntimeError):
    """A device backend could not start (the message says why and what to do)."""


class DeviceDriver:
    """The running device-driver process (haptics/driver.py) of the openhaptics devices."""

    def __init__(self, proc, conn, stop, out):
        self.proc, self.conn, self.stop_flag, self.out = proc, conn, stop, out
        self.summary: dict = {}

    def poll(self) -> bool:
        """Report a driver that stopped by itself (a device fault, a stalled servo). False once it has."""
        if not self.conn.poll(0):
            return True
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            msg = ("stopped", f"the device driver died (exit code {self.proc.exitcode})", {})
        if msg[0] != "stopped":
            return True
        _, reason, self.summary = msg
        say(f"suturesim: device driver stopped: {reason}; its devices get no force, and their grasps hold still",
            err=True)
        self.proc.join(2.0)
        return False

    def stop(self) -> None:
        """Stop the driver (every output ramps to zero, the devices are disabled) and report its timings."""
        self.stop_flag.value = 1
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and (self.proc.is_alive() or self.conn.poll(0)):
            if self.conn.poll(0.05):
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    break
                if msg[0] == "stopped":
                    self.summary = msg[2]
                    break
        self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
        for name, s in self.summary.items():
            lat, cb = s.get("latency_us", {}), s.get("callback_us", {})
            if lat.get("count"):
                self.out(f"suturesim: {name}: pose-to-force latency p50 {lat['p50']:.0f} µs, p99 {lat['p99']:.0f} "
                         f"µs, max {lat['max']:.0f} µs over {lat['count']} forces; servo callback p99 "
                         f"{cb.get('p99', 0):.0f} µs, max {cb.get('max', 0):.0f} µs; HD errors {s['errors'] or 'none'}")
        path = os.environ.get(DEVICE_STATS_ENV)
        if path and self.summary:
            with open(path, "w") as f:
                json.dump(self.summary, f, indent=1)


def start_driver(ctx, cfg: ServerConfig, link: DeviceLink, devices: list[str], out=print, stiffness: dict | None = None
                 ) -> tuple[DeviceDriver | None, dict[str, float]]:
    """Start the driver process for the devices on the openhaptics backend (link slot = index in ``devices``;
    ``ctx``: a multiprocessing context). Returns it (None if no device needs one) and device -> nominal max
    continuous force (N); ``stiffness``, if given, receives device -> nominal max stiffness (N/m). Raises
    DeviceStartError with the driver's reason."""
    specs = []
    for slot, name in enumerate(devices):
        if cfg.backend_of(name) == "openhaptics":
            dc = cfg.device_config(name)
            specs.append(DriverDevice(name=name, slot=slot, hd_name=dc.hd_name, transform=dc.transform,
                                      safety=cfg.safety))
    if not specs:
        return None, {}
    stop = shared_flag(ctx)
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=driver_main, name="suturesim-device", args=(specs, link.name, child, stop))
    proc.start()
    driver = DeviceDriver(proc, conn, stop, out)
    if not conn.poll(DRIVER_READY_TIMEOUT_S):
        driver.stop()
        raise DeviceStartError(f"the device driver did not start within {DRIVER_READY_TIMEOUT_S:g} s")
    try:
        what, arg = conn.recv()
    except (EOFError, OSError):
        what, arg = "error", f"the device driver died at start (exit code {proc.exitcode})"
    if what != "ready":
        driver.stop()
        raise DeviceStartError(arg)
    limits = {}
    for info in arg:
        out(f"suturesim: {info['device']}: {info['vendor']} {info['model']} ({info['hd_name']}), nominal max "
            f"continuous force {info['max_continuous_force_n']:g} N, force clamp {info['clamp_n']:g} N, "
            f"calibration {info['calibration']}")
        if info["max_continuous_force_n"] > 0:
            limits[info["device"]] = float(info["max_continuous_force_n"])
        if stiffness is not None and info.get("max_stiffness_n_per_m", 0.0) > 0:
            stiffness[info["device"]] = float(info["max_stiffness_n_per_m"])
    return driver, limits


class Supervisor:
    def __init__(self, cfg: ServerConfig, out=print):
        self.cfg = cfg
        self.out = out
        self.mp = mp.get_context("spawn")
        self.stop = shared_flag(self.mp)   # read by the physics process
        self.link: DeviceLink | None = None
        self.recorder = None
        self.recorder_stop = None
        self.recorder_path = ""
        self.recorder_counts = None
        self.driver: DeviceDriver | None = None

    # -- device driver ----------------------------------------------------------------------------------
    def poll_driver(self) -> None:
        if self.driver is not None and not self.driver.poll():
            self.driver = None

    def stop_driver(self) -> None:
        if self.driver is not None:
            self.driver.stop()
            self.driver = None

    # -- recorder ---------------------------------------------------------------------------------------
    def start_recording(self, path: str, name: str, file: str, source: dict) -> None:
        """Record the published messages to ``path``, with the running scenario (``name``, ``file``,
        ``source``) as metadata."""
        self.stop_recording()
        meta = recording_metadata(name, file, source)
        meta["server"] = server_metadata(self.cfg)
        self.recorder_stop = shared_flag(self.mp)
        self.recorder_path = path
        # messages written, force seq gaps; read without a lock, which a killed recorder could leave held
        self.recorder_counts = self.mp.Array("q", 2, lock=False)
        ready = self.mp.Event()
        self.recorder = self.mp.Process(target=recorder_main, name="suturesim-recorder",
                                        args=(self.cfg.endpoints.pub, path, self.recorder_stop, ready, meta, None,
                                              self.recorder_counts))
        self.recorder.start()
        ready.wait(10.0)
        time.sleep(0.2)  # ZeroMQ's slow joiner: let the subscription reach the publisher
        self.out(f"suturesim: recording to {path}")

    def stop_recording(self) -> None:
        """Stop the recorder once it has written what it has queued (it loses nothing), for as long as it keeps
        writing (RECORDER_IDLE_S, at most RECORDER_STOP_S); a recorder killed past that is reported."""
        if self.recorder is None:
            return
        self.recorder_stop.value = 1
        t0 = last_change = time.monotonic()
        written = self.recorder_counts[0]
        while self.recorder.is_alive():
            self.recorder.join(0.1)
            now = time.monotonic()
            if self.recorder_counts[0] != written:
                written, last_change = self.recorder_counts[0], now
            if now - last_change > RECORDER_IDLE_S or now - t0 > RECORDER_STOP_S:
                break
        waited = time.monotonic() - t0
        if self.recorder.is_alive():
            self.recorder.kill()
            self.recorder.join(1.0)
            say(f"suturesim: the recorder did not finish within {waited:.1f} s of the stop and was killed: "
                f"{self.recorder_path} has {written} messages and no summary (readers that need one fail)",
                err=True)
        elif waited > 1.0:
            say(f"suturesim: the recorder took {waited:.1f} s after the stop to write what it had queued", err=True)
        self.recorder = None

    # -- faults -----------------------------------------------------------------------------------------
    def publish_fault(self, reason: str) -> None:
        """Publish a `fault` event from the supervisor (the physics process, which owns the PUB socket, is gone)."""
        ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 500)
        try:
            pub.bind(self.cfg.endpoints.pub)
            time.sleep(0.3)  # subscribers reconnect to the new socket
            pub.send_multipart((protocol.TOPIC_EVENT, protocol.encode_event(0, 0.0, "fault", reason=reason)))
            time.sleep(0.1)
        except zmq.ZMQError:
            pass
        finally:
            pub.close()
            ctx.term()

    # -- main -------------------------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        for line in check_bind_policy(cfg.endpoints.all(), cfg.security):
            say(line, err=True)
        scenario = load_scenario(cfg.scenario)
        devices = list(dict.fromkeys([*(g.device for g in scenario.grasps), *(d.name for d in cfg.devices)]))
        self.link = DeviceLink.create(max(1, len(devices)))
        self.link.zero_forces(0, time.monotonic_ns())   # zero force on start
        try:
            stiffness: dict[str, float] = {}
            self.driver, limits = start_driver(self.mp, cfg, self.link, devices, self.out, stiffness)
        except DeviceStartError as exc:
            if cfg.device_fallback != "simulated":
                say(f"suturesim: {exc}", err=True)
                self.link.close()
                self.link.unlink()
                return 2
            say(f"suturesim: {exc}; falling back to the simulated stylus (device_fallback: simulated)", err=True)
            cfg = replace(cfg, device="simulated" if cfg.device == "openhaptics" else cfg.device,
                          devices=tuple(replace(d, backend=None if d.backend == "openhaptics" else d.backend)
                                        for d in cfg.devices))
            limits, stiffness = {}, {}
        cfg = replace(cfg, link_devices=tuple(devices), device_limits=tuple(limits.items()),
                      device_stiffness=tuple(stiffness.items()))
        self.cfg = cfg
        dump_stacks_on_signal()
        stopping = StopRequest(self.stop, (signal.SIGINT, signal.SIGTERM))  # sets self.stop for the children
        restarts = 0
        fault_note = None
        code = 0
        try:
            if cfg.record:
                self.start_recording(cfg.record, scenario.name, scenario.file, scenario.source)
            while True:
                ready = self.mp.Event()
                conn, child_conn = self.mp.Pipe()
                proc = self.mp.Process(target=physics_main, name="suturesim-physics",
                                       args=(cfg, self.link.name, ready, self.stop, child_conn, fault_note))
                proc.start()
                t_start = time.monotonic()
                while not ready.wait(0.05):
                    if not proc.is_alive() or stopping.is_set() or time.monotonic() - t_start > READY_TIMEOUT_S:
                        break
                if not ready.is_set() and not proc.is_alive() and not stopping.is_set():
                    # it never served: a start-up error (a port in use, say) is not worth restarting for
                    why = f"exit code {proc.exitcode}"
                    if conn.poll(0.5):
                        what, arg = conn.recv()
                        if what == "startup_error":
                            why = arg
                    say(f"suturesim: the physics process could not start: {why}", err=True)
                    code = 1
                    break
                if ready.is_set():
                    self.out(f"suturesim: serving {scenario.name!r}: state/force/stats/event on {cfg.endpoints.pub}, "
                             f"control on {cfg.endpoints.control}, stylus on {cfg.endpoints.stylus} "
                             f"(first tick {time.monotonic() - t_start:.2f} s after start)")
                while proc.is_alive() and not stopping.is_set():
                    self.poll_driver()
                    if conn.poll(0.05):
                        try:
                            what, arg = conn.recv()
                        except (EOFError, OSError):
                            continue
                        if what == "record_start":
                            self.start_recording(*arg)
                        elif what == "record_stop":
                            self.stop_recording()
                if stopping.is_set() or proc.exitcode == 0:
                    stopping.set()
                    proc.join(STOP_TIMEOUT_S)
                    if proc.is_alive():
                        proc.kill()
                        proc.join(1.0)
                        say(f"suturesim: the physics process did not stop within {STOP_TIMEOUT_S:g} s and was "
                            "killed", err=True)
                    break
                # the physics process died on its own
                self.link.zero_forces(protocol.FLAG_FAULT, time.monotonic_ns())
                reason = f"the physics process died (exit code {proc.exitcode})"
                say(f"suturesim: {reason}; forces zeroed", err=True)
                if cfg.fault.policy == "restart" and restarts < cfg.fault.max_restarts:
                    restarts += 1
                    fault_note = f"{reason}; restarted ({restarts} of {cfg.fault.max_restarts})"
                    continue
                self.publish_fault(reason)
                code = 1
                break
        finally:
            self.link.zero_forces(protocol.FLAG_FAULT if code else 0, time.monotonic_ns())  # zero on stop
            self.stop_driver()
            self.stop_recording()
            self.link.close()
            self.link.unlink()
            stopping.restore()
        return code


def serve(cfg: ServerConfig) -> int:
    return Supervisor(cfg, out=say).run()
