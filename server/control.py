"""Control requests on the REP socket (DESIGN.md, "Public interfaces"; docs/PROTOCOL.md).

A request is a msgpack map {"cmd": ..., ...}; the reply is {"ok": true, ...} or {"ok": false, "error": ...}.
Anything wrong with a request — not msgpack, not a map, an unknown command, a wrong type, a value a scenario
file would reject — is an error reply; nothing a client sends can stop the loop. At most one request is
handled per tick, after the tick's physics and publishing. `load` and `set` build and validate a whole scene
(milliseconds), so a worker process does that while the loop keeps ticking; the loop installs the result and
replies at a tick boundary, and takes no other request meanwhile (REP answers one request at a time anyway).
A process, not a thread: a thread building a scene shares the loop's GIL, and its pure-Python parsing held the
loop back by up to a few milliseconds at a time (measured: lateness p99 0.35 ms, max 0.8-3 ms while scenes were
built beside a 1 kHz ticker), enough for a loaded tick to overrun.
"""
from __future__ import annotations

import math
import os
import multiprocessing
from multiprocessing.pool import AsyncResult
from typing import Any, Callable

import msgpack
import numpy as np
import zmq

from ..solver.config import ConfigError
from ..solver.scenario import build_scenario, load_scenario
from ..solver.integrator import STAT_SUBSTEPS


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


def _ordinary_process(loop_cpu: int) -> None:
    """The worker process starts before the loop takes SCHED_FIFO and its CPU, so it inherits neither; keep it
    off the loop's CPU (``loop_cpu``, -1: the last CPU, where set_realtime pins the loop by default) when there
    is more than one."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    try:
        cpus = set(os.sched_getaffinity(0))
        if len(cpus) > 1:
            cpus.discard(loop_cpu if loop_cpu >= 0 else max(cpus))
            os.sched_setaffinity(0, cpus)
    except (OSError, AttributeError, ValueError):
        pass


class ControlHandler:
    """Answers requests for one PhysicsLoop."""

    def __init__(self, loop):
        self.loop = loop
        # spawned now, before the loop turns real-time (the handler is made before set_realtime), and started at
        # once so that the first `load` or `set` does not wait for its imports
        self.worker = multiprocessing.get_context("spawn").Pool(1, initializer=_ordinary_process,
                                                                initargs=(loop.cfg.loop.cpu,))
        self.pending: tuple[Callable[[Any], dict], AsyncResult] | None = None   # (apply, scene being built)
        self.commands: dict[str, Callable[[dict], dict]] = {
            "status": self.status, "reset": self.reset, "pause": self.pause, "resume": self.resume,
            "load": self.load, "set": self.set, "grasp": self.grasp, "release": self.release,
            "record_start": self.record_start, "record_stop": self.record_stop, "shutdown": self.shutdown,
            "describe": self.describe,
        }

    def busy(self) -> bool:
        """True while a `load` or `set` is being prepared (no new request is taken)."""
        return self.pending is not None

    def handle_one(self) -> None:
        """Receive one request (one is waiting) and send its reply, or start preparing a `load`/`set`."""
        sock = self.loop.ctl
        try:
            raw = sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return
        reply = self.reply(raw)
        if reply is not None:
            self._send(reply)

    def finish_pending(self) -> None:
        """Called every tick: install a prepared `load`/`set` and reply, once the worker is done."""
        if self.pending is None or not self.pending[1].ready():
            return
        apply, future = self.pending
        self.pending = None
        try:
            reply = {"ok": True, **apply(future.get())}
        except (RequestError, ConfigError) as exc:
            self.loop.stats.control_errors += 1
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001
            self.loop.stats.control_errors += 1
            reply = {"ok": False, "error": f"internal error: {exc.__class__.__name__}: {exc}"}
        self._send(reply)

    def close(self) -> None:
        # stopped, not waited for (it may still be importing if the server is stopped right after its start):
        # the physics process exits at once and leaves no child behind
        self.worker.terminate()
        self.worker.join()

    def _send(self, reply: dict) -> None:
        try:
            self.loop.ctl.send(msgpack.packb(reply, use_bin_type=True), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def reply(self, raw: bytes) -> dict | None:
        try:
            if len(raw) > self.loop.cfg.security.max_message_bytes:
                raise RequestError("request too large")
            try:
                req = msgpack.unpackb(raw, raw=False, strict_map_key=True)
            except Exception as exc:  # noqa: BLE001 - any decoding failure is the client's
                raise RequestError(f"not a msgpack message: {exc.__class__.__name__}") from None
            if not isinstance(req, dict):
                raise RequestError("a request must be a map with a 'cmd' field")
            cmd = req.get("cmd")
            if not isinstance(cmd, str):
                raise RequestError("missing or non-string 'cmd'")
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
                "devices": sorted(lp.device_live),
                "stats": {**lp.last_stats, **lp.stats.summary_counters()},
                "realtime": lp.realtime, "cpu": lp.cpu, "pid": os.getpid(),
                "link": lp.link.name if lp.link is not None else None}

    def describe(self, req: dict) -> dict:
        """The running scenario (name, file, content) and the server settings a resimulation needs: what a
        recorder stores as metadata."""
        from .config import server_metadata

        sc = self.loop.scenario
        return {"scenario": sc.name, "file": sc.file, "source": sc.source, "server": server_metadata(self.loop.cfg)}

    def reset(self, req: dict) -> dict:
        lp = self.loop
        lp.install(lp.scenario)
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
            lp.install(scenario)
            lp.event("load", scenario=scenario.name)
            return {"scenario": scenario.name}

        self.pending = (apply, self.worker.apply_async(load_scenario, (spec,)) if isinstance(spec, str) else
                        self.worker.apply_async(build_scenario, (spec, "<load request>")))
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

        self.pending = (apply, self.worker.apply_async(build_scenario, (data, f"<set {path}>")))
        return None

    def grasp(self, req: dict) -> dict:
        vertex = _field(req, "vertex", int)
        gid = _field(req, "id", str, None)
        device = _field(req, "device", str, gid if gid is not None else "")
        try:
            spec = self.loop.add_grasp(vertex, device or None, gid, _number(req, "stiffness", 1000.0),
                                       _number(req, "damping", 0.0), _number(req, "max_force", 3.0))
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        return {"id": spec.id, "slot": spec.slot}

    def release(self, req: dict) -> dict:
        gid = _field(req, "id", str)
        if not self.loop.remove_grasp(gid):
            raise RequestError(f"no grasp {gid!r}")
        return {}

    def record_start(self, req: dict) -> dict:
        path = _field(req, "path", str)
        if self.loop.supervisor is None:
            raise RequestError("recording is run by the supervisor (suturesim serve)")
        sc = self.loop.scenario  # the scene running now, which a `load` or `set` may have changed
        self.loop.supervisor.send(("record_start", (path, sc.name, sc.file, sc.source)))
        self.loop.event("record_start", path=path)
        return {"path": path}

    def record_stop(self, req: dict) -> dict:
        if self.loop.supervisor is None:
            raise RequestError("recording is run by the supervisor (suturesim serve)")
        self.loop.supervisor.send(("record_stop", None))
        self.loop.event("record_stop")
        return {}

    def shutdown(self, req: dict) -> dict:
        self.loop.running = False
        return {}
