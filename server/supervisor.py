"""`suturesim serve`: the supervisor (docs/ARCHITECTURE.md Sec. 2).

It validates the configuration (before anything starts), creates the shared-memory link to the device driver,
starts the physics process and, when asked, a recorder process (server/recordings.py); on SIGINT/SIGTERM it
zeroes every force, stops the children, flushes the recording and exits 0. If the physics process dies, or stops
ticking for `fault.stall_s` once warmed up (a heartbeat in shared memory; it is then killed), it zeroes the forces
at once and, by the configured policy, starts it again from the running scene's last snapshot (server/snapshot.py;
the new process publishes a `fault` event first) or exits non-zero with the reason, after publishing the `fault`
event itself.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import replace

import zmq

from ..haptics.driver import DriverDevice
from ..haptics.link import DeviceLink
from ..haptics.process import StopRequest, child_main, dump_stacks_on_signal, shared_flag
from ..solver.scenario import load_scenario
from . import protocol
from .config import ServerConfig, server_metadata
from .console import say
from .headless import recording_metadata
from .recordings import RecorderProcess, RecordingDesk
from .scoring import ScorerProcess
from .security import ZapService, check_bind_policy, start_server_zap
from .snapshot import Snapshot, unlink_snapshot

STOP_TIMEOUT_S = 1.5     # the physics process gets this long to stop by itself before it is killed
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
    proc = ctx.Process(target=child_main, name="suturesim-device",
                       args=("suturesim.haptics.driver", "driver_main", specs, link.name, child, stop))
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


class PhysicsChannel:
    """The supervisor's end of the pipe to one physics process. A thread reads it as messages arrive, so the
    physics process's sends never wait on the supervisor, whatever the supervisor is doing (starting a
    recorder, stopping one: seconds). Messages: ("snapshot", segment name) on each scene installed,
    ("record_start", name), ("record_stop", None), ("startup_error", reason)."""

    def __init__(self, conn, on_message):
        self.conn = conn
        self.on_message = on_message
        self.startup_error: str | None = None
        self._send_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="physics-channel", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "startup_error":
                self.startup_error = msg[1]
            else:
                self.on_message(msg)

    def send(self, msg: tuple) -> None:
        with self._send_lock:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):   # the physics process is gone; its successor asks again
                pass

    def close(self) -> None:
        self.conn.close()
        self.thread.join(1.0)


class Supervisor:
    def __init__(self, cfg: ServerConfig, out=print):
        self.cfg = cfg
        self.out = out
        self.mp = mp.get_context("spawn")
        self.stop = shared_flag(self.mp)   # read by the physics process
        # [ticks, armed]: the physics loop counts its ticks; armed once it has warmed up (a cold numba compile
        # is not a hang). Lock-free, like the stop flag.
        self.heartbeat = self.mp.RawArray("q", 2)
        self.link: DeviceLink | None = None
        self.driver: DeviceDriver | None = None
        self.desk: RecordingDesk | None = None
        self.scorer: ScorerProcess | None = None   # the live score's process, beside the physics
        self.channel: PhysicsChannel | None = None
        self.snapshot_name: str | None = None   # the running scene's snapshot (server/snapshot.py)
        self.recorder_curve = None              # client keys of the server's own recorder, when CURVE needs them
        self.zap: ZapService | None = None      # the ZAP handler of the physics process's CURVE sockets

    # -- device driver ----------------------------------------------------------------------------------
    def poll_driver(self) -> None:
        if self.driver is not None and not self.driver.poll():
            self.driver = None

    def stop_driver(self) -> None:
        if self.driver is not None:
            self.driver.stop()
            self.driver = None

    # -- the physics process's messages -------------------------------------------------------------------
    def on_physics_message(self, msg: tuple) -> None:
        what, arg = msg[0], msg[1]
        if what == "snapshot":
            self.snapshot_name = arg
        elif what in ("record_start", "record_stop") and self.desk is not None:
            self.desk.requests.put((what, arg))

    def answer_physics(self, msg: tuple) -> None:
        if self.channel is not None:
            self.channel.send(msg)

    def scene_metadata(self) -> dict:
        """The running scene (from its snapshot) and the server's settings, as a recording's metadata."""
        name = self.snapshot_name
        if name is None:
            raise RuntimeError("no scene is running")
        snap = Snapshot.attach(name)
        try:
            scene = snap.scene()
        finally:
            snap.close()
        meta = recording_metadata(scene.name, scene.file, scene.source)
        meta["server"] = server_metadata(self.cfg)
        return meta

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

    def watch(self, proc, stopping: StopRequest) -> str | None:
        """Watch a serving physics process until it exits, the server is asked to stop, or the process stops
        ticking (then it is killed). Returns why it was killed as hung, else None."""
        stall_s = self.cfg.fault.stall_s
        last_ticks, last_change = -1, time.monotonic()
        while proc.is_alive() and not stopping.is_set():
            self.poll_driver()
            if self.desk is not None:
                self.desk.check()
            if self.scorer is not None:
                self.scorer.check()
            now = time.monotonic()
            ticks = self.heartbeat[0]
            if not self.heartbeat[1] or ticks != last_ticks:
                last_ticks, last_change = ticks, now
            elif now - last_change > stall_s:
                proc.kill()
                proc.join(2.0)
                return f"the physics process stopped ticking for {now - last_change:.1f} s and was killed"
            stopping.wait(0.05)
        return None

    # -- main -------------------------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        for line in check_bind_policy(cfg.endpoints.all(), cfg.security):
            say(line, err=True)
        # CURVE handshakes are checked here, at ordinary priority, not in the real-time physics process
        self.zap, self.recorder_curve = start_server_zap(cfg.security, cfg.endpoints.all())
        if self.zap is not None:
            cfg = self.cfg = replace(cfg, security=replace(cfg.security, zap_endpoint=self.zap.endpoint))
        scenario = load_scenario(cfg.scenario)
        # the scene's styluses: its grasps' devices, the devices its `devices` section places, the configured ones
        devices = list(dict.fromkeys([*(g.device for g in scenario.grasps), *scenario.workspaces,
                                      *(d.name for d in cfg.devices)]))
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
                if self.zap is not None:
                    self.zap.close()
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
        self.desk = RecordingDesk(RecorderProcess(self.mp, cfg.endpoints.pub, self.recorder_curve),
                                  cfg.files.recordings_dir, self.scene_metadata, self.answer_physics, self.out)
        if cfg.endpoints.score:     # it connects to the PUB socket whenever the physics binds it
            self.scorer = ScorerProcess(self.mp, cfg, scenario.name, self.recorder_curve, say)
            self.scorer.start()
        restarts = 0
        fault_note = None
        restore: str | None = None   # the snapshot a restarted physics process resumes from
        code = 0
        try:
            if cfg.record:
                meta = recording_metadata(scenario.name, scenario.file, scenario.source)
                meta["server"] = server_metadata(cfg)
                self.desk.start_operator_recording(cfg.record, meta)
            while True:
                ready = self.mp.Event()
                conn, child_conn = self.mp.Pipe()
                self.heartbeat[0] = self.heartbeat[1] = 0
                proc = self.mp.Process(target=child_main, name="suturesim-physics",
                                       args=("suturesim.server.physics", "physics_main", cfg, self.link.name, ready,
                                             self.stop, child_conn, fault_note, self.heartbeat, restore))
                proc.start()
                child_conn.close()
                self.channel = PhysicsChannel(conn, self.on_physics_message)
                t_start = time.monotonic()
                while not ready.wait(0.05):
                    if not proc.is_alive() or stopping.is_set() or time.monotonic() - t_start > READY_TIMEOUT_S:
                        break
                if not ready.is_set() and not proc.is_alive() and not stopping.is_set():
                    # it never served: a start-up error (a port in use, say) is not worth restarting for
                    self.channel.thread.join(0.5)
                    why = self.channel.startup_error or f"exit code {proc.exitcode}"
                    say(f"suturesim: the physics process could not start: {why}", err=True)
                    code = 1
                    break
                if ready.is_set():
                    score = f", score on {cfg.endpoints.score}" if self.scorer is not None else ""
                    self.out(f"suturesim: serving {scenario.name!r}: state/force/stats/event on {cfg.endpoints.pub}, "
                             f"control on {cfg.endpoints.control}, stylus on {cfg.endpoints.stylus}{score} "
                             f"(first tick {time.monotonic() - t_start:.2f} s after start)")
                    if restore is not None and restore != self.snapshot_name:
                        unlink_snapshot(restore)   # the new process has resumed from it and made its own
                        restore = None
                hung = self.watch(proc, stopping)
                if hung is None and (stopping.is_set() or proc.exitcode == 0):
                    stopping.set()
                    proc.join(STOP_TIMEOUT_S)
                    if proc.is_alive():
                        proc.kill()
                        proc.join(1.0)
                        say(f"suturesim: the physics process did not stop within {STOP_TIMEOUT_S:g} s and was "
                            "killed", err=True)
                    break
                # the physics process died on its own, or hung and was killed
                self.link.zero_forces(protocol.FLAG_FAULT, time.monotonic_ns())
                reason = hung or f"the physics process died (exit code {proc.exitcode})"
                say(f"suturesim: {reason}; forces zeroed", err=True)
                self.channel.close()
                self.channel = None
                if cfg.fault.policy == "restart" and restarts < cfg.fault.max_restarts:
                    restarts += 1
                    restore = self.snapshot_name
                    fault_note = f"{reason}; restarted ({restarts} of {cfg.fault.max_restarts})" + (
                        ", resuming from the last snapshot" if restore else "")
                    continue
                self.publish_fault(reason)
                code = 1
                break
        finally:
            self.link.zero_forces(protocol.FLAG_FAULT if code else 0, time.monotonic_ns())  # zero on stop
            self.stop_driver()
            if self.scorer is not None:
                self.scorer.stop()
            self.desk.close()
            if self.channel is not None:
                self.channel.close()
            for name in {self.snapshot_name, restore} - {None}:
                unlink_snapshot(name)   # a physics process that stopped cleanly has removed its own already
            self.link.close()
            self.link.unlink()
            stopping.restore()
            if self.zap is not None:   # after the physics process: its handshakes need the service until then
                self.zap.close()
        return code


def serve(cfg: ServerConfig) -> int:
    return Supervisor(cfg, out=say).run()
