"""Control requests on the REP socket (docs/PROTOCOL.md Sec. 4; docs/ARCHITECTURE.md Sec. 3).

A request is a msgpack map {"cmd": ..., ...}; the reply is {"ok": true, ...} or {"ok": false, "error": ...}.
Anything wrong with a request — not msgpack, not a map, an unknown command, a wrong type, a value a scenario
file would reject — is an error reply; nothing a client sends can stop the loop. At most one request is
handled per tick, after the tick's physics and publishing. `load` and `set` build and validate a whole scene
(milliseconds), so a process of its own (server/builder.py) does that while the loop keeps ticking; the loop
installs the result and replies at a tick boundary, and takes no other request meanwhile (REP answers one request
at a time anyway).
A process, not a thread: a thread building a scene shares the loop's GIL, and its pure-Python parsing held the
loop back by up to a few milliseconds at a time (measured: lateness p99 0.35 ms, max 0.8-3 ms while scenes were
built beside a 1 kHz ticker), enough for a loaded tick to overrun.
"""
from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgpack
import numpy as np
import zmq

from ..solver.breakage import rating
from ..solver.config import MAX_NAME_CHARS, ConfigError, is_name
from ..solver.scenario import build_scenario, load_scenario_request
from ..solver.sources import FilePolicy
from ..solver.integrator import STAT_SUBSTEPS
from .builder import SceneBuilder
from .config import check_scene_fits_loop
from .protocol import ProtocolError, decode_request


class RequestError(ValueError):
    """A request the server cannot carry out; its message goes back to the client."""


def _field(req: dict, key: str, kinds: type | tuple, default: Any = ...) -> Any:
    if key not in req:
        if default is ...:
            raise RequestError(f"missing field {key!r}")
        return default
    value = req[key]
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise RequestError(f"field {key!r} has the wrong type: {type(value).__name__}")
    if not isinstance(value, kinds):
        raise RequestError(f"field {key!r} has the wrong type: {type(value).__name__}")
    return value


def _number(req: dict, key: str, default: Any = ..., positive: bool = False) -> float:
    value = float(_field(req, key, (int, float), default))
    if not math.isfinite(value) or (positive and value <= 0):
        raise RequestError(f"field {key!r} must be a finite{' positive' if positive else ''} number")
    return value


def _nested(path: str, value: Any) -> dict:
    keys = path.split(".")
    if not path or any(not k for k in keys):
        raise RequestError(f"bad parameter path {path!r}")
    out: dict = {keys[-1]: value}
    for k in reversed(keys[:-1]):
        out = {k: out}
    return out


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


BUILD_TIMEOUT_S = 30.0          # a scene build taking longer is abandoned (its builder is replaced)
SUPERVISOR_TIMEOUT_S = 90.0     # the supervisor answers a recording request within this (a stop may take 60 s)


@dataclass
class Pending:
    """A request being carried out off the tick: a scene built by the builder process, or a recording started or
    stopped by the supervisor. The loop polls it each tick (never waits on it) and replies once it is done,
    failed or past its time."""
    what: str                            # for the error reply: "scene build", "recording request"
    done: Callable[[], bool]
    result: Callable[[], Any]
    apply: Callable[[Any], dict]
    timeout_s: float
    broken: Callable[[], str | None] = lambda: None   # why it can never finish (its builder died), or None
    started: float = field(default_factory=time.monotonic)


class ControlHandler:
    """Answers requests for one PhysicsLoop."""

    def __init__(self, loop):
        self.loop = loop
        self.builder = SceneBuilder(loop.cfg.loop.cpu)   # before the loop turns real-time: it inherits neither
        self.pending: Pending | None = None
        self.supervisor_answer: tuple | None = None   # the supervisor's answer to the request out, once it came
        self.failure: str | None = None               # a recording that failed, said in the next reply
        self.commands: dict[str, Callable[[dict], dict]] = {
            "status": self.status, "reset": self.reset, "pause": self.pause, "resume": self.resume,
            "load": self.load, "set": self.set, "grasp": self.grasp, "release": self.release,
            "record_start": self.record_start, "record_stop": self.record_stop, "recordings": self.recordings,
            "shutdown": self.shutdown, "describe": self.describe,
        }

    def build(self, func: Callable, args: tuple, apply: Callable[[Any], dict]) -> None:
        """Build a scene in the builder process; ``apply`` installs it and returns the reply's fields."""
        self.builder.submit(func, args)
        self.pending = Pending("scene build", self.builder.done, self.builder.result, apply, BUILD_TIMEOUT_S,
                               self.builder.died)

    def busy(self) -> bool:
        """True while a request is carried out off the tick (no new request is taken)."""
        return self.pending is not None

    def handle_one(self) -> None:
        """Receive one request (one is waiting) and send its reply, or start carrying it out off the tick."""
        sock = self.loop.ctl
        try:
            raw = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        if self.failure is not None:   # said once, in place of carrying the request out: nothing is lost
            self.loop.stats.control_errors += 1
            reply = {"ok": False, "error": f"{self.failure}; this request was not carried out, send it again"}
            self.failure = None
        else:
            reply = self.reply(raw)
        if reply is not None:
            self._send(reply)

    def finish_pending(self) -> None:
        """Called every tick while busy: apply what was prepared and reply, once it is done; or reply with the
        error once it has failed or is past its time."""
        p = self.pending
        if p is None:
            return
        why = p.broken()
        if why is None and not p.done():
            if time.monotonic() - p.started <= p.timeout_s:
                return
            why = f"the {p.what} took more than {p.timeout_s:g} s and was abandoned"
        self.pending = None
        if why is not None:
            if p.what == "scene build":   # its builder is dead or stuck: a new one for the next build
                self.builder.kill()
                self.builder = SceneBuilder(self.loop.cfg.loop.cpu)
                self.loop.place_helper_threads()   # its thread inherited the loop's CPU and priority
            self.loop.stats.control_errors += 1
            self._send({"ok": False, "error": why})
            return
        try:
            reply = {"ok": True, **p.apply(p.result())}
        except (RequestError, ConfigError) as exc:
            self.loop.stats.control_errors += 1
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001
            self.loop.stats.control_errors += 1
            reply = {"ok": False, "error": f"internal error: {exc.__class__.__name__}: {exc}"}
        self._send(reply)

    def poll_supervisor(self) -> None:
        """Take what the supervisor sent (never waits): the answer to the recording request out, or a recording
        that failed (an `event`, and the next reply says it)."""
        conn = self.loop.supervisor
        if conn is None:
            return
        try:
            while conn.poll(0):
                msg = conn.recv()
                if msg[0] == "record":
                    self.supervisor_answer = msg
                elif msg[0] == "record_failed":
                    self.loop.recording = {"path": self.loop.recording.get("path", ""), "state": "failed",
                                           "error": msg[1]}
                    self.loop.event("record_error", reason=msg[1])
                    self.failure = f"recording failed: {msg[1]}"
        except (EOFError, OSError):
            pass

    def ask_supervisor(self, msg: tuple, apply: Callable[[Any], dict]) -> None:
        """Send a recording request to the supervisor (one at a time: a request is taken only while none is out)
        and reply once it answers."""
        if self.loop.supervisor is None:
            raise RequestError("recording is run by the supervisor (suturesim serve)")
        self.supervisor_answer = None
        self.loop.supervisor.send(msg)
        self.pending = Pending("recording request", lambda: self.supervisor_answer is not None,
                               lambda: self.supervisor_answer, apply, SUPERVISOR_TIMEOUT_S)

    def close(self) -> None:
        # stopped, not waited for (it may still be importing if the server is stopped right after its start):
        # the physics process exits at once and leaves no child behind
        self.builder.kill()

    def _send(self, reply: dict) -> None:
        try:
            self.loop.ctl.send(msgpack.packb(reply, use_bin_type=True), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def reply(self, raw: bytes) -> dict | None:
        try:
            try:   # the one inbound check: size before decoding, then bounded decoding (server/protocol.py)
                req = decode_request(raw, self.loop.cfg.security.max_message_bytes)
            except ProtocolError as exc:
                raise RequestError(str(exc)) from None
            cmd = req["cmd"]
            handler = self.commands.get(cmd)
            if handler is None:
                raise RequestError(f"unknown command {cmd!r} (known: {', '.join(sorted(self.commands))})")
            out = handler(req)
            if out is None:
                return None  # a `load`/`set` is being prepared: finish_pending replies
            return {"ok": True, **out}
        except (RequestError, ConfigError) as exc:
            self.loop.stats.control_errors += 1
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - a bug in a handler must not stop the loop
            self.loop.stats.control_errors += 1
            return {"ok": False, "error": f"internal error: {exc.__class__.__name__}: {exc}"}

    # -- commands -------------------------------------------------------------------------------------------
    def status(self, req: dict) -> dict:
        lp = self.loop
        st = lp.state
        return {"scenario": lp.scenario.name, "seq": lp.seq, "t": float(st.time[0]), "paused": lp.paused,
                "substeps": int(st.stats[STAT_SUBSTEPS]), "n": lp.model.n_vertices,
                "grasps": [{"id": g.id, "vertex": g.vertex, "device": g.device,
                            "force": st.grasp_force[g.slot].tolist()} for g in lp.grasps],
                "devices": sorted(d.name for d in lp.devices if d.live_at is not None),
                "stats": {**lp.last_stats, **lp.stats.summary_counters()},
                "realtime": lp.realtime, "cpu": lp.cpu, "pid": os.getpid(), "recording": lp.recording,
                "link": lp.link.name if lp.link is not None else None}

    def describe(self, req: dict) -> dict:
        """The running scenario (name, file, content) and the server settings a resimulation needs: what a
        recorder stores as metadata."""
        from .config import server_metadata

        sc = self.loop.scenario
        return {"scenario": sc.name, "file": sc.file, "source": sc.source, "server": server_metadata(self.loop.cfg)}

    def reset(self, req: dict) -> dict:
        lp = self.loop
        lp.reset()
        lp.event("reset")
        return {}

    def pause(self, req: dict) -> dict:
        self.loop.paused = True
        self.loop.event("pause")
        return {}

    def resume(self, req: dict) -> dict:
        self.loop.paused = False
        self.loop.event("resume")
        return {}

    def load(self, req: dict) -> None:
        lp = self.loop
        spec = _field(req, "scenario", (str, dict))


        def apply(scenario) -> dict:
            check_scene_fits_loop(scenario, lp.cfg)
            lp.install(scenario)
            lp.event("load", scenario=scenario.name, strength=rating(scenario.model))
            return {"scenario": scenario.name}

        # confined (solver/sources.py): a shipped name, a file name under files.scenarios_dir, or an inline map whose
        # preset / shape.file stay there or under the shipped configs
        self.build(load_scenario_request, (spec, lp.cfg.files.scenarios_dir), apply)
        return None

    def set(self, req: dict) -> None:
        """Change a scenario parameter by dotted path; validated by rebuilding the scenario. The thread keeps
        its state when the vertex count is unchanged."""
        lp = self.loop
        path = _field(req, "path", str)
        if "value" not in req:
            raise RequestError("missing field 'value'")
        value = req["value"]
        data = _merge(lp.scenario.source, _nested(path, value))

        def apply(scenario) -> dict:
            check_scene_fits_loop(scenario, lp.cfg)
            old = lp.state
            if scenario.model.n_vertices == lp.model.n_vertices:
                new = scenario.new_state()
                for name in ("x", "x_prev", "h", "time", "tension", "twist", "grasp_target",
                             "grasp_target_prev", "grasp_force"):
                    np.copyto(getattr(new, name), getattr(old, name))
                lp.install(scenario, new)
            else:
                lp.install(scenario)
            lp.event("set", path=path, value=value if isinstance(value, (int, float, str, bool)) else str(value))
            return {}

        # rebuilt where the running scenario's references resolved, confined like a `load` but for the files the
        # running scenario already read (a trusted scenario's own preset or points file beside it)
        sc = lp.scenario
        policy = FilePolicy(roots=(Path(lp.cfg.files.scenarios_dir),), files=frozenset(map(Path, sc.files_read)))
        self.build(functools.partial(build_scenario, policy=policy, base_dir=sc.base_dir), (data, f"<set {path}>"),
                   apply)
        return None

    def grasp(self, req: dict) -> dict:
        vertex = _field(req, "vertex", int)
        gid = _field(req, "id", str, None)
        device = _field(req, "device", str, gid if gid is not None else "")
        for key, name in (("id", gid), ("device", device)):
            # the limit a scenario's grasps have (solver/scenario.py): a name is copied into every `force`
            if name and not is_name(name):
                raise RequestError(f"{key}: must be printable and at most {MAX_NAME_CHARS} characters, got "
                                   f"{len(name)}")
        try:
            spec = self.loop.add_grasp(vertex, device or None, gid, _number(req, "stiffness", 1000.0),
                                       _number(req, "damping", 0.0), _number(req, "max_force", 3.0),
                                       frac=_number(req, "frac", 0.0))
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        return {"id": spec.id, "slot": spec.slot}

    def release(self, req: dict) -> dict:
        gid = _field(req, "id", str)
        if not self.loop.remove_grasp(gid):
            raise RequestError(f"no grasp {gid!r}")
        return {}

    def record_start(self, req: dict) -> None:
        """Record to a new file ``name`` in the recordings directory (server/files.py); the reply, once the
        recorder has created it and records, gives its full path."""
        if "path" in req:
            raise RequestError("record_start takes `name`, a file name in the server's recordings directory "
                               "(files.recordings_dir); paths are not accepted")
        name = _field(req, "name", str)
        self.ask_supervisor(("record_start", name), self._recorded("record_start", "recording"))
        return None

    def record_stop(self, req: dict) -> None:
        self.ask_supervisor(("record_stop", None), self._recorded("record_stop", "stopped"))
        return None

    def _recorded(self, kind: str, state: str) -> Callable[[tuple], dict]:
        """The reply to the supervisor's answer ("record", ok, the file's path or the reason): on success the
        loop's `recording` becomes ``state`` (none if no file was recording) and a ``kind`` event says so."""
        lp = self.loop

        def apply(answer: tuple) -> dict:
            _, ok, text = answer
            if not ok:
                raise RequestError(text)
            lp.recording = {"path": text, "state": state} if text else {}
            lp.event(kind, path=text)
            return {"path": text}

        return apply

    def recordings(self, req: dict) -> dict:
        """The recordings in the recordings directory: name, bytes, mtime (s since the epoch)."""
        from .files import list_recordings

        directory = self.loop.cfg.files.recordings_dir
        return {"dir": directory, "recordings": list_recordings(directory)}

    def shutdown(self, req: dict) -> dict:
        self.loop.running = False
        return {}
