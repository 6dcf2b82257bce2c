"""`suturesim replay F.mcap`: a recording played back three ways (docs/RECORDING.md).

* ``--to publish`` (default): every recorded message, byte for byte, on a PUB socket with its original timing
  (log times) scaled by ``--speed``, from ``--from`` to ``--to-time`` (s into the recording), looping with
  ``--loop``. A viewer or any client sees the session as it happened.
* ``--to resimulate``: the recorded scenario and server settings rebuilt from the file's metadata, stepped
  tick by tick through the daemon's own tick code (server/physics.py ``PhysicsLoop.tick_scene``) with the
  recorded stylus positions of every live device and the recorded grasps, releases, resets and pauses; every
  recomputed `force` and `state` compared with the recorded one, and the events the scene reports of itself
  (punctures, knots, the wound's gap) made again at the same ticks. On the same machine and version the difference
  is exactly zero; ``--set key=value`` changes the scenario first, for a regression report.
* ``--to device``: the recorded force of one device played on a haptic device (``--device openhaptics``, or the
  simulated one, which publishes what it would render) through the full safety pipeline, in time.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import yaml

from ..server import protocol
from ..server.config import SecurityConfig
from ..server.recording import RecordingError, read_messages, read_metadata
from ..server.security import SecurityError


def _progress(done: int, total: int, what: str, last: list) -> None:
    """A progress line on stderr, at most 5 times a second."""
    now = time.monotonic()
    if now - last[0] >= 0.2 or done == total:
        last[0] = now
        print(f"\r{what}: {done}/{total} ({100.0 * done / max(total, 1):.0f} %)", end="", file=sys.stderr,
              flush=True)
        if done == total:
            print(file=sys.stderr, flush=True)


# -- publish ---------------------------------------------------------------------------------------------
def replay_publish(path: str, endpoint: str, speed: float = 1.0, t_from: float = 0.0, t_to: float | None = None,
                   loop: bool = False, wait_subscribers: int = 0, stop=None, out=print,
                   security: SecurityConfig | None = None) -> dict:
    """Republish the recording on ``endpoint`` (PUB, bound) with its original timing / ``speed``; returns
    {"messages": sent, "passes": completed passes, "late_ms": {p50, p99, max} of each send against its
    schedule (ms)}. ``security``: the server's binding policy and CURVE keys (default: loopback only); raises
    SecurityError for an endpoint it refuses."""
    import zmq

    from ..server.physics import wait_until
    from ..server.security import SocketSecurity, check_bind_policy

    security = security or SecurityConfig()
    check_bind_policy([endpoint], security)   # refuse before reading what may be a long recording
    msgs = [(t.encode(), p, log) for t, p, log, _ in read_messages(path)]
    if not msgs:
        raise RecordingError(f"{path}: no messages")
    base = msgs[0][2]
    lo = base + int(t_from * 1e9)
    hi = None if t_to is None else base + int(t_to * 1e9)
    msgs = [m for m in msgs if m[2] >= lo and (hi is None or m[2] <= hi)]
    if not msgs:
        raise RecordingError(f"{path}: no messages between --from {t_from:g} s and --to-time {t_to} s")
    ctx = zmq.Context()
    try:
        guard = SocketSecurity(ctx, security, [endpoint], require_curve=security.curve_on_loopback)
    except BaseException:
        ctx.term()
        raise
    for line in guard.warnings:
        print(line, file=sys.stderr, flush=True)
    pub = ctx.socket(zmq.XPUB)      # XPUB: the subscriptions arrive as messages, so we can wait for them
    pub.setsockopt(zmq.LINGER, 1000)
    pub.setsockopt(zmq.SNDHWM, 0)
    guard.apply(pub, endpoint)
    try:
        pub.bind(endpoint)
    except BaseException:
        pub.close(0)
        guard.close()
        ctx.term()
        raise
    subs = 0
    deadline = time.monotonic() + 30.0
    while subs < wait_subscribers and time.monotonic() < deadline:
        if pub.poll(100):
            if pub.recv()[:1] == b"\x01":
                subs += 1
    time.sleep(0.3 if wait_subscribers == 0 else 0.05)   # a subscription reaches the publisher (slow joiner)
    try:   # the original timing is the point: take SCHED_FIFO where it is granted (as the server's loop does)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(40))
    except (PermissionError, OSError, AttributeError):
        pass
    span = (msgs[-1][2] - msgs[0][2]) / 1e9
    out(f"suturesim replay: {len(msgs)} messages, {span:.3f} s, at {speed:g}x on {endpoint}"
        + (" (looping)" if loop else ""))
    sent, passes = 0, 0
    late = np.zeros(len(msgs), dtype=np.int64)       # ns, the last pass
    try:
        while True:
            t0 = time.monotonic_ns() + 1_000_000
            first = msgs[0][2]
            for k, (topic, payload, log) in enumerate(msgs):
                due = t0 + int((log - first) / speed)
                wait_until(due, 300_000)
                late[k] = time.monotonic_ns() - due
                pub.send_multipart((topic, payload))
                sent += 1
                if stop is not None and stop.is_set():
                    break
            else:
                passes += 1
            if not loop or (stop is not None and stop.is_set()):
                break
    finally:
        pub.close()
        guard.close()
        ctx.term()
    q = late[:min(sent, len(msgs))] / 1e6 if passes == 0 else late / 1e6
    return {"messages": sent, "passes": passes,
            "late_ms": {"p50": float(np.percentile(q, 50)), "p99": float(np.percentile(q, 99)),
                        "max": float(q.max())} if q.size else {}}


# -- resimulate ------------------------------------------------------------------------------------------
# what changes nothing a resimulation must follow (a fault's rollback or reset happens inside the tick itself; the
# rollback's `release` events come after it, for grasps it has let go already)
_IGNORED_EVENTS = {"start", "overrun", "shutdown", "device", "device_lost", "device_error", "record_start",
                   "record_stop", "grasp_missed", "fault", "coupling_limited"}
# what the scene itself reports of its state (solver/suture.py SutureWatch): not inputs to follow but outputs the
# resimulation makes again, compared with the recorded ones (kind, seq, time and every detail)
_DERIVED_EVENTS = {"puncture", "thread_through", "needle_out", "puncture_closed", "gap_closed", "gap_opened",
                   "knot", "throw", "tear", "break"}


@dataclass
class ResimReport:
    ticks: int = 0
    forces: int = 0
    states: int = 0
    max_force: float = 0.0      # N, largest |recomputed - recorded| component of `force`
    max_axial: float = 0.0      # N
    max_pose: float = 0.0       # m
    max_x: float = 0.0          # m, positions in `state` (float32 on the wire)
    max_needle: float = 0.0     # the needle's pose in `state`: largest difference of its quaternion's components
    #                             and of its tip's coordinates (m)
    first_diff: tuple | None = None      # (seq, t, what)
    stopped: str | None = None  # why the comparison ended before the recording did
    missing: int = 0            # recorded force messages with no recomputed counterpart, or the reverse
    events: int = 0             # recorded events of the scene's own (_DERIVED_EVENTS) compared
    event_diff: str | None = None   # the first of them the resimulation did not make the same, or made extra
    first_seq: int = 1          # the first recorded tick (a recorder that joined late): compared from there
    after: object = None        # what resimulate's ``after`` returned

    @property
    def exact(self) -> bool:
        return (self.max_force == 0.0 and self.max_axial == 0.0 and self.max_pose == 0.0 and self.max_x == 0.0
                and self.max_needle == 0.0 and self.missing == 0 and self.event_diff is None)

    def lines(self) -> list[str]:
        out = [f"resimulated {self.ticks} ticks: compared {self.forces} force and {self.states} state messages"
               + (f" and {self.events} events of the scene's (punctures, knots, the wound's gap)" if self.events
                  else "")
               + (f" (the recording starts at seq {self.first_seq}: the scene was stepped from its start and "
                  "compared from there)" if self.first_seq != 1 else ""),
               f"largest difference: force {self.max_force:.3g} N, axial {self.max_axial:.3g} N, pose "
               f"{self.max_pose:.3g} m, positions {self.max_x:.3g} m"
               + (f", needle {self.max_needle:.3g}" if self.max_needle else "")
               + (f"; {self.missing} messages without a counterpart" if self.missing else "")]
        if self.first_diff:
            seq, t, what = self.first_diff
            out.append(f"first difference at seq {seq} (t = {t:.3f} s): {what}")
        if self.event_diff:
            out.append(f"events differ: {self.event_diff}")
        if self.stopped:
            out.append(f"stopped early: {self.stopped}")
        out.append("EXACT: the recomputed session equals the recording" if self.exact else
                   "DIFFERENT: the recomputed session differs from the recording")
        return out


def recorded_scenario(meta: dict, path: str, assignments: list[str] | None = None):
    """The scenario a recording's metadata ``meta`` holds (its YAML as the server read it), with ``assignments``
    (``key.path=value``) applied. Raises RecordingError when the metadata holds none, ConfigError or
    yaml.YAMLError when it does not build."""
    from ..solver.scenario import build_scenario, set_keys

    if "scenario" not in meta or "yaml" not in meta["scenario"]:
        raise RecordingError(f"{path}: no scenario in the recording's metadata; cannot resimulate")
    source = yaml.safe_load(meta["scenario"]["yaml"])
    if assignments:
        source = set_keys(source, assignments)
    return build_scenario(source, meta["scenario"].get("file", "<recording>"))


def resimulate(path: str, assignments: list[str] | None = None, progress: bool = False, watch=None,
               after=None) -> ResimReport:
    """Step the recorded session again and compare (module docstring). ``watch(topic, payload)`` also sees
    every message the resimulation publishes; ``after(loop)``, if given, runs on the PhysicsLoop at the
    recording's end (unless the comparison stopped before it), its result in the report's ``after`` (the knot
    security test, tools/security.py). Raises RecordingError when the file cannot be resimulated (no scenario in
    its metadata, or it does not start at the scene's first tick)."""
    from ..server.config import server_config_from_metadata
    from ..server.physics import PhysicsLoop

    meta = read_metadata(path)
    scenario = recorded_scenario(meta, path, assignments)
    cfg = server_config_from_metadata(meta.get("server"))

    forces, states, events, stylus = _read_session(path)
    if not forces:
        raise RecordingError(f"{path}: no `force` messages to compare")
    first_seq, last_seq = min(forces), max(forces)
    # every device that was not scripted is driven by its recorded stylus positions (the replay backend)
    live = [d for d in stylus.devices() if cfg.backend_of(d) != "simulated"]
    if first_seq != 1 and live:
        raise RecordingError(f"{path}: the recording starts at seq {first_seq}, not at the scene's first tick, and "
                             f"{', '.join(live)} moved the thread before it: a resimulation needs the whole session")
    cfg = replace(cfg, scenario=scenario, device="replay" if cfg.device != "simulated" else "simulated",
                  devices=tuple(replace(d, backend="replay") if d.backend not in (None, "simulated") else d
                                for d in cfg.devices))
    out: list[tuple[bytes, bytes]] = []

    def sink(topic: bytes, payload: bytes) -> None:
        out.append((topic, payload))
        if watch is not None:
            watch(topic, payload)

    loop = PhysicsLoop(cfg, sink=sink)
    loop.replay = {d: stylus.track(d) for d in live} or None

    report = ResimReport(first_seq=first_seq)
    events.sort(key=lambda e: (e["seq"], e["t"]))
    made: list[dict] = []       # the scene's own events, as the resimulation makes them
    ev_i = 0
    last = [0.0]

    try:
        for seq in range(1, last_seq + 1):
            loop.seq = seq
            ev_i = _apply_events(loop, events, ev_i, seq, report)
            if report.stopped:
                break
            out.clear()
            loop.tick_scene(0)
            report.ticks += 1
            _compare_tick(seq, out, states, forces.get(seq, {}), first_seq, made, report)
            if progress:
                _progress(seq, last_seq, "resimulating", last)
        if after is not None and not report.stopped:
            report.after = after(loop)
    finally:
        loop.close()
    _compare_events([e for e in events if e["kind"] in _DERIVED_EVENTS and first_seq <= e["seq"] <= report.ticks],
                    made, report)
    return report


def _read_session(path: str) -> tuple:
    """A recording's messages for a resimulation: (force messages by seq and device, state messages by seq,
    events, the stylus poses)."""
    from ..server.replay_poses import PoseSamples

    forces: dict[int, dict[str, dict]] = {}
    states: dict[int, dict] = {}
    events: list[dict] = []
    stylus = PoseSamples()
    for topic, payload, _, _ in read_messages(path):
        if topic == "force":
            m = protocol.decode_force(payload)
            forces.setdefault(m["seq"], {})[m["device"]] = m
            stylus.add(m)
        elif topic == "state":
            m = protocol.decode_state(payload)
            states[m["seq"]] = m
        elif topic == "event":
            events.append(protocol.decode_event(payload))
    return forces, states, events, stylus


def _apply_events(loop, events: list[dict], ev_i: int, seq: int, report: ResimReport) -> int:
    """Do to ``loop`` what the recorded events from ``events[ev_i]`` on did before tick ``seq`` (grasps,
    releases, reset, pause); sets ``report.stopped`` at one a resimulation cannot follow. Returns the index of
    the first event not yet applied."""
    now_t = float(loop.state.time[0])
    while ev_i < len(events) and events[ev_i]["seq"] <= seq and events[ev_i]["t"] <= now_t + 1e-9:
        e = events[ev_i]
        ev_i += 1
        kind = e["kind"]
        if kind == "grasp":
            loop.grasp_as_recorded(e)
        elif kind == "clutch":   # a clutched hand felt no force; its tool's pose is in the recorded stylus
            loop.devices[e["device"]].clutched = bool(e["on"])
        elif kind == "release":
            loop.remove_grasp(e["id"])
        elif kind == "reset":
            loop.reset()
        elif kind == "pause":
            loop.paused = True
        elif kind == "resume":
            loop.paused = False
        elif kind not in _IGNORED_EVENTS and kind not in _DERIVED_EVENTS:
            report.stopped = (f"the recording's `{kind}` event at seq {e['seq']} (t = {e['t']:.3f} s) "
                              "changes the scene in a way a resimulation does not follow")
            break
    return ev_i


def _differ(report: ResimReport, seq: int, t: float, what: str, value: float, current: float) -> float:
    """The larger of a difference and the largest so far; the first nonzero one is the report's first_diff."""
    if value > current and report.first_diff is None and value > 0.0:
        report.first_diff = (seq, t, what)
    return max(value, current)


def _compare_tick(seq: int, out: list, states: dict, recorded: dict, first_seq: int, made: list,
                  report: ResimReport) -> None:
    """Compare what resimulated tick ``seq`` published (``out``: (topic, payload)) with the recording: its
    state (positions, needle) if one was recorded at this tick and each device's force message (``recorded``:
    by device); the scene's own events go to ``made``."""
    mine = {}
    for topic, payload in out:
        if topic == protocol.TOPIC_FORCE:
            m = protocol.decode_force(payload)
            mine[m["device"]] = m
        elif topic == protocol.TOPIC_EVENT and seq >= first_seq:
            m = protocol.decode_event(payload)
            if m["kind"] in _DERIVED_EVENTS:
                made.append(m)
        elif topic == protocol.TOPIC_STATE and seq in states:
            m = protocol.decode_state(payload)
            r = states[seq]
            dx = float(np.max(np.abs(np.asarray(m["x"]) - np.asarray(r["x"])))) if m["n"] == r["n"] \
                else math.inf
            report.max_x = _differ(report, seq, m["t"], "state positions", dx, report.max_x)
            if "needle" in r or "needle" in m:
                rn, mn = r.get("needle"), m.get("needle")
                dn = (max(float(np.max(np.abs(np.subtract(mn["quat"], rn["quat"])))),
                          float(np.max(np.abs(np.subtract(mn["tip"], rn["tip"])))))
                      if rn is not None and mn is not None else math.inf)
                report.max_needle = _differ(report, seq, m["t"], "needle pose", dn, report.max_needle)
            report.states += 1
    for dev, r in recorded.items():
        m = mine.get(dev)
        if m is None:
            report.missing += 1
            if report.first_diff is None:
                report.first_diff = (seq, r["t"], f"no recomputed force for {dev}")
            continue
        report.forces += 1
        report.max_force = _differ(report, seq, r["t"], f"{dev} force", float(np.max(np.abs(
            np.subtract(m["force"], r["force"])))), report.max_force)
        report.max_axial = _differ(report, seq, r["t"], f"{dev} axial", abs(m["axial"] - r["axial"]),
                                   report.max_axial)
        report.max_pose = _differ(report, seq, r["t"], f"{dev} pose", float(np.max(np.abs(
            np.subtract(m["pose"], r["pose"])))), report.max_pose)
    report.missing += len(set(mine) - set(recorded)) if recorded else 0


def _compare_events(recorded: list[dict], made: list[dict], report: ResimReport) -> None:
    """The scene's own events of the recording against those the resimulation made, in order: the same kinds at
    the same ticks with the same details, none missing and none extra."""
    report.events = len(recorded)
    for k in range(max(len(recorded), len(made))):
        r = recorded[k] if k < len(recorded) else None
        m = made[k] if k < len(made) else None
        if r != m:
            def say(e):
                return "none" if e is None else f"`{e['kind']}` at seq {e['seq']} (t = {e['t']:.3f} s)"
            report.event_diff = f"the recording's event {k + 1} is {say(r)}, the resimulation's {say(m)}"
            return


# -- device ----------------------------------------------------------------------------------------------
def replay_device(path: str, device: str | None, backend: str, cfg, speed: float = 1.0, pub: str | None = None,
                  out=print) -> dict:
    """Play the recorded `force` of ``device`` (default: the first device in the file) in time through the
    safety pipeline: on an OpenHaptics device (``backend`` "openhaptics", through the driver process and its
    servo backstop and watchdog), or on the simulated device, which publishes on ``pub`` what it renders.
    Returns {"device", "forces", "max_force_n", "flags"}."""
    import multiprocessing as mp

    import zmq

    from ..haptics.link import DeviceLink
    from ..haptics.safety import ForceSafety
    from ..server.physics import wait_until
    from ..server.security import SocketSecurity
    from ..server.supervisor import start_driver

    samples = [protocol.decode_force(p) for t, p, _, _ in read_messages(path) if t == "force"]
    devices = list(dict.fromkeys(m["device"] for m in samples if not m["device"].startswith("vertex")))
    if not devices:
        raise RecordingError(f"{path}: no device forces to play")
    device = device or devices[0]
    if device not in devices:
        raise RecordingError(f"{path}: no device {device!r} (recorded: {', '.join(devices)})")
    track = [m for m in samples if m["device"] == device]
    link = DeviceLink.create(1)
    ctx = sock = guard = None
    driver = None
    try:
        link.zero_forces(0, time.monotonic_ns())
        limit = None
        if backend == "openhaptics":
            cfg = replace(cfg, device="openhaptics", devices=tuple(d for d in cfg.devices if d.name == device))
            driver, limits = start_driver(mp.get_context("spawn"), cfg, link, [device], out)
            limit = limits.get(device)
        if pub:   # bound under the config's policy, as the server's own PUB socket
            ctx = zmq.Context()
            guard = SocketSecurity(ctx, cfg.security, [pub], require_curve=cfg.security.curve_on_loopback)
            for line in guard.warnings:
                print(line, file=sys.stderr, flush=True)
            sock = ctx.socket(zmq.PUB)
            guard.apply(sock, pub)
            sock.bind(pub)
            time.sleep(0.3)
        safety = ForceSafety(cfg.safety, limit)
        shaped = np.zeros(3)
        tick_ns = int(cfg.loop.tick_s * 1e9 / speed)
        t0 = time.monotonic_ns() + 1_000_000
        flags_seen = 0
        peak = 0.0
        zero = [0.0, 0.0, 0.0]
        out(f"suturesim replay: playing {len(track)} forces of {device} on the {backend} device at {speed:g}x")
        for k, m in enumerate(track):
            due = t0 + k * tick_ns
            wait_until(due, 300_000)
            fl = safety.step(m["force"], k * cfg.loop.tick_s, k * cfg.loop.tick_s, cfg.loop.tick_s, shaped)
            flags_seen |= fl
            peak = max(peak, float(np.linalg.norm(shaped)))
            link.write_force(0, shaped, m["axial"], fl, k + 1, time.monotonic_ns())
            if sock is not None:
                sock.send_multipart((protocol.TOPIC_FORCE, protocol.encode_force(
                    k + 1, m["t"], device, m["pose"], shaped, m["axial"], fl, m.get("stylus"))))
        link.write_force(0, zero, 0.0, 0, len(track) + 1, time.monotonic_ns())
        time.sleep(0.1)
    finally:
        if driver is not None:
            driver.stop()
        link.zero_forces(0, time.monotonic_ns())
        if sock is not None:
            sock.close(0)
        if guard is not None:
            guard.close()
        if ctx is not None:
            ctx.term()
        link.close()
        link.unlink()
    return {"device": device, "forces": len(track), "max_force_n": peak, "flags": flags_seen}


# -- command line ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="suturesim replay", description=__doc__.split("\n\n")[0].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split(
                                    "\n\n", 1)[1])
    p.add_argument("file", metavar="F.mcap")
    p.add_argument("--to", choices=("publish", "resimulate", "device"), default="publish", dest="mode",
                   help="publish (default): republish with the original timing; resimulate: step it again and "
                        "compare; device: play a device's recorded force on a device")
    p.add_argument("--pub", metavar="EP", default="tcp://127.0.0.1:5555",
                   help="publish / device: PUB endpoint to bind (default tcp://127.0.0.1:5555)")
    p.add_argument("--speed", type=float, default=1.0, help="publish / device: playback speed (default 1)")
    p.add_argument("--from", dest="t_from", type=float, default=0.0, metavar="S",
                   help="publish: start S seconds into the recording")
    p.add_argument("--to-time", dest="t_to", type=float, default=None, metavar="S",
                   help="publish: stop S seconds into the recording")
    p.add_argument("--loop", action="store_true", help="publish: start again at the end, until Ctrl-C")
    p.add_argument("--wait-subscribers", type=int, default=0, metavar="N",
                   help="publish: wait (up to 30 s) for N subscribers before starting")
    p.add_argument("--server-secret-key", metavar="F",
                   help="publish: CURVE, as the server's security.server_secret_key (a .key_secret, mode 0600); "
                        "needs --client-keys-dir. A --pub beyond loopback needs CURVE or --insecure")
    p.add_argument("--client-keys-dir", metavar="D",
                   help="publish: the allowed clients' public .key files, as the server's security.client_keys_dir")
    p.add_argument("--insecure", action="store_true",
                   help="publish: allow a --pub beyond loopback without CURVE (trusted networks only; loud)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="resimulate: change the recorded scenario first (e.g. solver.tol=1e-6), for a regression "
                        "report; repeatable")
    p.add_argument("--device", choices=("simulated", "openhaptics"), default="simulated",
                   help="device: the device to play on (default simulated: it publishes what it would render)")
    p.add_argument("--name", metavar="DEVICE", help="device: which recorded device's force (default: the first)")
    p.add_argument("--config", metavar="F", help="device: server config with the device and safety settings")
    args = p.parse_args(argv)
    if not args.speed > 0 or not math.isfinite(args.speed):
        p.error("--speed must be > 0")
    if (args.server_secret_key is None) != (args.client_keys_dir is None):
        p.error("CURVE needs both --server-secret-key and --client-keys-dir")
    for opt, value in (("--server-secret-key", args.server_secret_key), ("--client-keys-dir", args.client_keys_dir)):
        if value is not None and not os.path.exists(value):
            p.error(f"{opt}: no such {'file' if opt == '--server-secret-key' else 'directory'}: {value}")
    security = SecurityConfig(insecure=args.insecure, server_secret_key=args.server_secret_key,
                              client_keys_dir=args.client_keys_dir)
    try:
        if args.mode == "publish":
            r = replay_publish(args.file, args.pub, args.speed, args.t_from, args.t_to, args.loop,
                               args.wait_subscribers, security=security)
            lt = r["late_ms"]
            print(f"suturesim replay: sent {r['messages']} messages in {r['passes']} pass(es); lateness against "
                  f"the recorded timing p50 {lt['p50']:.3f} ms, p99 {lt['p99']:.3f} ms, max {lt['max']:.3f} ms")
            return 0
        if args.mode == "resimulate":
            report = resimulate(args.file, args.set, progress=sys.stderr.isatty())
            for line in report.lines():
                print(line)
            return 0 if report.exact else 1
        from ..server.config import load_server_config

        cfg = load_server_config(args.config)
        r = replay_device(args.file, args.name, args.device, cfg, args.speed, args.pub)
        print(f"suturesim replay: played {r['forces']} forces of {r['device']}; largest {r['max_force_n']:.4f} N "
              f"after safety; flags seen {r['flags']}")
        return 0
    except SecurityError as exc:
        print(f"suturesim replay: {exc} Here: --server-secret-key F --client-keys-dir D, or --insecure.",
              file=sys.stderr)
        return 2
    except (RecordingError, OSError, ValueError) as exc:
        print(f"suturesim replay: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
