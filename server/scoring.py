"""The live score: a process of its own that reads the server's published stream and publishes the attempt's
score (docs/PROTOCOL.md Sec. 3.5, docs/ASSESSMENT.md).

It subscribes to the server's PUB endpoint (``state`` and ``event``, all the score reads) as any client does,
feeds every message to server/assessment.py's :class:`Scorer` (the code `suturesim score` runs on a recording)
and binds a PUB socket of its own, ``endpoints.score``, on which it publishes

* topic ``score``, :data:`SCORE_HZ` times a second: the attempt so far (its summary, below);
* topic ``event``, kind ``score``, when a phase ends (the needle grasped, a bite, the thread pulled through, a
  throw, cinched): ``phase``, ``at`` (s from the attempt's start) and the summary's ``score`` then.

A `reset` or `load` event starts a new attempt. The score is computed here and never in the physics loop: the
loop publishes as it always does, and a scorer that falls behind loses messages at its socket's high-water
mark, never slowing the loop.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import zmq

from . import protocol

if TYPE_CHECKING:
    from .assessment import Attempt
    from .config import ServerConfig
    from .security import ClientCurve

SCORE_HZ = 2.0            # `score` messages a second
SUB_HWM = 2_000           # messages queued from the server (~20 s of states and events) before ZeroMQ drops
DRAIN_S = 0.02            # s between the scorer's drains of what the server published
SCORE_SNDHWM = 100
NICENESS = 10             # the scorer's scheduling priority below the server's (os.nice)


def summary(a: Attempt) -> dict:
    """The attempt ``a`` as the `score` topic carries it (docs/PROTOCOL.md Sec. 3.5)."""
    return {"scenario": a.scenario, "trainee": a.trainee, "score": round(a.score, 3),
            "done": a.completed_s is not None, "passed": a.passed, "elapsed_s": round(a.duration_s, 3),
            "completed_s": a.completed_s,
            "phases": [[name, round(t, 3)] for name, t in sorted(a.phases.items(), key=lambda kv: kv[1])],
            "marks": [[p.target, round(p.offset_mm, 3)] for p in a.placements],
            "knot": a.knot, "square": a.knot_secure,
            "gap_mm": None if a.gap_end_mm is None else round(a.gap_end_mm, 3),
            "peak_tension_n": round(a.peak_tension_n, 4),
            "tension_share": None if a.tension_share is None else round(a.tension_share, 4),
            "breaks": a.breaks,
            "peak_lateral_n": round(a.peak_lateral_n, 4), "tears": a.tears,
            "edges_n": {pad: round(f, 4) for pad, f in sorted(a.edge_peaks_n.items())},
            "drawn_mm": {pad: round(mm, 2) for pad, mm in sorted(a.drawn_mm.items())},
            "penalties": [[p.what, round(p.points, 3)] for p in a.penalties],
            "checks": [[c.what, c.passed] for c in a.checks]}


class LiveScore:
    """The scorer's state between messages: the attempt, and what it has published."""

    def __init__(self, scenario: str, trainee: str):
        from .assessment import Scorer

        self.scenario, self.trainee = scenario, trainee
        self.scorer = Scorer(scenario, trainee)
        self.phases_seen: set[str] = set()
        self.seq = 0
        self.t = 0.0
        self.unreadable = 0           # messages the score could not read

    def take(self, topic: bytes, payload: bytes) -> list[tuple[bytes, bytes]]:
        """One message from the server; returns the phase events it ended (topic, payload) to publish."""
        from .assessment import Scorer

        try:
            msg = protocol.decode(payload, topic)
        except protocol.ProtocolError:
            self.unreadable += 1
            return []
        self.t = float(msg.get("t", self.t))
        if topic == protocol.TOPIC_EVENT and msg.get("kind") in ("reset", "load"):
            if msg.get("kind") == "load" and isinstance(msg.get("scenario"), str):
                self.scenario = msg["scenario"]
            self.scorer, self.phases_seen = Scorer(self.scenario, self.trainee), set()
        try:
            self.scorer.feed(topic.decode(), msg)
        except (KeyError, TypeError, ValueError, IndexError):
            self.unreadable += 1
            return []
        out = []
        phases = self.scorer.a.phases
        for name in [p for p in phases if p not in self.phases_seen]:
            self.phases_seen.add(name)
            self.seq += 1
            out.append((protocol.TOPIC_EVENT, protocol.encode_event(
                self.seq, self.t, "score", phase=name, at=round(phases[name], 3),
                score=round(self.scorer.attempt().score, 3))))
        return out

    def report(self) -> tuple[bytes, bytes]:
        """The `score` message of the attempt so far."""
        self.seq += 1
        body = summary(self.scorer.attempt())
        body["unreadable"] = self.unreadable
        return protocol.TOPIC_SCORE, protocol.encode_score(self.seq, self.t, body)


def run(pub: str, score: str, scenario: str, trainee: str, stop, ready=None, security=None,
        client: ClientCurve | None = None) -> None:
    """Score the stream of ``pub`` and publish on ``score`` until ``stop`` (``is_set()``) is set. ``security``:
    the server's SecurityConfig (the score socket binds under the server's policy); ``client``: the keys to
    subscribe with when the server's PUB socket needs CURVE. ``ready``: called once bound (or with the reason it
    could not bind)."""
    from .security import SocketSecurity

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, SUB_HWM)
    sub.setsockopt(zmq.LINGER, 0)
    for topic in (protocol.TOPIC_STATE, protocol.TOPIC_EVENT):     # what the score reads (not force: 1 kHz)
        sub.setsockopt(zmq.SUBSCRIBE, topic)
    if client is not None:
        client.apply(sub)
    out = ctx.socket(zmq.PUB)
    out.setsockopt(zmq.SNDHWM, SCORE_SNDHWM)
    out.setsockopt(zmq.LINGER, 0)
    guard = None
    try:
        if security is not None:
            guard = SocketSecurity(ctx, security, [score], require_curve=security.curve_on_loopback)
            guard.apply(out, score)
        try:
            out.bind(score)
        except zmq.ZMQError as exc:
            if ready is not None:
                ready(f"cannot bind {score}: {exc.strerror}")
            return
        sub.connect(pub)
        if ready is not None:
            ready(None)
        live = LiveScore(scenario, trainee)
        due = time.monotonic()
        # woken every DRAIN_S, not by every message: a wake-up costs more than a message (ZeroMQ queues them
        # meanwhile)
        while not stop.is_set():
            time.sleep(DRAIN_S)
            while True:
                try:
                    topic, payload = sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except ValueError:    # not two frames: not ours
                    continue
                for msg in live.take(topic, payload):
                    out.send_multipart(msg)
            now = time.monotonic()
            if now >= due:
                due = now + 1.0 / SCORE_HZ
                out.send_multipart(live.report())
    finally:
        sub.close(0)
        out.close(0)
        if guard is not None:
            guard.close()
        ctx.term()


def scorer_main(cfg: ServerConfig, scenario: str, stop, conn, client: ClientCurve | None = None) -> None:
    """Entry point of the scorer process (multiprocessing, spawn, through haptics/process.py child_main):
    ``conn`` is told ("ready", "") once bound, or ("error", why)."""
    import signal

    from ..haptics.process import StopRequest

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:        # a background reader: it yields the CPU to the physics process starting beside it
        os.nice(NICENESS)
    except OSError:
        pass

    def ready(why: str | None) -> None:
        conn.send(("ready", "") if why is None else ("error", why))

    run(cfg.endpoints.pub, cfg.endpoints.score, scenario, cfg.trainee, StopRequest(stop), ready, cfg.security,
        client)


class ScorerProcess:
    """The supervisor's handle on the scorer process: started with the server (it connects to the PUB socket
    whenever the physics binds it, and again after a restart of the physics), restarted (a new attempt) if it
    dies, at most MAX_RESTARTS times, stopped with the server. Nothing here waits on it."""

    MAX_RESTARTS = 3

    def __init__(self, ctx, cfg: ServerConfig, scenario: str, client: ClientCurve | None, say):
        self.ctx, self.cfg, self.scenario, self.client, self.say = ctx, cfg, scenario, client, say
        self.proc = None
        self.conn = None
        self.stop_flag = None
        self.restarts = 0
        self.failed = False           # it could not bind: no live score, and no restart

    def start(self) -> None:
        from ..haptics.process import child_main, shared_flag

        self.stop_flag = shared_flag(self.ctx)
        self.conn, child = self.ctx.Pipe(duplex=False)
        self.proc = self.ctx.Process(target=child_main, name="suturesim-scorer",
                                     args=("suturesim.server.scoring", "scorer_main", self.cfg, self.scenario,
                                           self.stop_flag, child, self.client))
        self.proc.start()
        child.close()

    def check(self) -> None:
        """Report a scorer that could not bind (the server runs on without a live score); restart one that
        died."""
        if self.proc is None:
            return
        try:
            if self.conn.poll(0):
                what, why = self.conn.recv()
                if what != "ready":
                    self.failed = True
                    self.stop()
                    self.say(f"suturesim: no live score: {why}", err=True)
                    return
        except (EOFError, OSError):
            pass
        if self.proc.is_alive():
            return
        code = self.proc.exitcode
        self.proc = None
        if self.restarts >= self.MAX_RESTARTS:
            self.say(f"suturesim: the scorer process died (exit code {code}) and has been restarted "
                     f"{self.MAX_RESTARTS} times: no live score from now on", err=True)
            return
        self.restarts += 1
        self.say(f"suturesim: the scorer process died (exit code {code}); restarted, its attempt anew", err=True)
        self.start()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.stop_flag.value = 1
        self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(1.0)
        self.proc = None
        self.conn.close()
