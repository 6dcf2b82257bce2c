"""`suturesim view`: a live web page of a running server, or of any publisher of its messages (docs/PROTOCOL.md).

One process, one port. A ZeroMQ SUB socket (``--connect``) feeds a receiver thread; an asyncio ``websockets``
server on ``--host:--port`` serves the page's static files (``tools/viewer/``, shipped in the package: no CDN,
no internet) from its ``process_request`` hook and streams JSON frames to each page on ``/ws``.

Frames, not messages. A server publishes ~2000 messages a second (force at 1 kHz per device, state at 100 Hz)
and a page redraws at most ~60 times a second, so the bridge never queues messages for a page. Each page has a
:class:`FrameBuffer` holding only what it has not been sent yet, bounded whatever the page's pace:

* ``state``: the newest one only (older ones are dropped and counted);
* ``force``: folded into one summary point per device per :data:`FORCE_BUCKET_S` of simulated time (the peak
  ``|force|``, the peak ``axial``, the flags OR-ed), at most :data:`MAX_FORCE_POINTS` per device and
  :data:`MAX_DEVICES` devices (the oldest points go first);
* ``stats`` and ``event``: every one, in a deque of :data:`MAX_STATS` / :data:`MAX_EVENTS` (only a page stalled
  for that many loses the oldest).

The page's sender drains its buffer every :data:`FRAME_S` (~30 Hz) and awaits the WebSocket send, so a slow
browser only makes the next drain later: what piles up meanwhile is folded, not queued.

Page protocol (JSON text messages on ``/ws``; unknown keys are to be ignored):

``{"type": "hello", "endpoint": str, "frame_s": float, "bucket_s": float}``
    once, on connect.
``{"type": "frame", "endpoint": str, "age": float|null, "received": int, "state": {...}|null,
"force": {device: [[t, force_mag, axial, flags], ...]}, "stats": [{"recv": float, "stats": {...}}, ...],
"events": [{...}, ...], "dropped": {"state": int}}``
    ``age``: seconds since the bridge last received any message (null: none yet); ``received``: messages
    received in total. ``state`` is the decoded ``state`` payload with ``x`` a flat list of n*3 floats (m) and
    ``tension`` a list of n-1 floats (N), its ``grasps`` with ``holds`` and ``frac`` (null when the publisher
    left them out), plus its ``tissue`` (with ``targets`` in a scene that marks them), ``needle`` and ``tools``
    when it has them (scenes with tissue and a needle: the page draws the pads, the punctures, the entry and exit
    marks and the needle; once a stylus has sent a pose, its tool's jaw; absent otherwise). A target or tool
    whose position is not 3 numbers is left out, and a tool field of the wrong type is null. ``t`` in
    force points is simulated time (s), ``force_mag`` and ``axial`` are in N. ``recv`` is the bridge's wall
    clock (s, Unix time) when that ``stats`` arrived. Stats and events are the payloads as published.
    Non-finite numbers become null. A frame is sent whenever something arrived, and at least every
    :data:`HEARTBEAT_S` so the page can show the message age.
    ``score`` (every :data:`SCORE_S`, only in the frames that carry a new one): the attempt scored as
    `suturesim score` scores a recording (server/assessment.py), from what the bridge has received since it joined or
    since the last `reset` or `load`: ``{"tissue": bool (a suture scene), "score": float, "done": bool,
    "passed": bool, "elapsed_s": float, "phases": [[name, s], ...], "marks": [[mark id, mm off], ...],
    "knot": str|null, "square": bool, "gap_mm": float|null, "penalties": float (points), "checks": [[benchmark,
    passed], ...]}``. The score is computed in this process, never in the server's loop.
"""
from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import numpy as np
import zmq

from ..server import protocol
from ..server.recorder import receive_until
from ..server.security import ClientCurve
from ..server.assessment import Attempt, Scorer

DEFAULT_CONNECT = "tcp://127.0.0.1:5555"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765

FRAME_S = 1.0 / 30.0        # page update period (s)
HEARTBEAT_S = 0.5           # longest gap between frames when nothing arrives (s), so the page sees the age grow
FORCE_BUCKET_S = 0.01       # simulated seconds folded into one force point: ~3 points per device per frame
MAX_FORCE_POINTS = 64       # pending force points per device (~0.6 s of simulated time at the bucket width)
MAX_DEVICES = 16            # devices tracked per page; a publisher inventing names cannot grow the buffer
MAX_STATS = 16              # pending stats payloads (1 Hz from the server)
MAX_EVENTS = 64             # pending events
SCORE_S = 0.5               # the attempt's score summary goes to the pages this often (s)
SUB_HWM = 4000              # ZeroMQ's own queue (messages): ~2 s of a two-device server if the thread stalls
ASSETS_DIR = Path(__file__).with_name("viewer")
_CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                  ".css": "text/css; charset=utf-8"}
# The page loads nothing but its own files and talks to nothing but its own bridge.
_CSP = "default-src 'self'; connect-src 'self'; img-src 'self'; style-src 'self'; script-src 'self'"


class ViewerError(Exception):
    """A configuration problem the user can fix (bad endpoint, port in use); the message says how."""


# ----------------------------------------------------------------------------------------------- JSON helpers
def _floats(values: np.ndarray, decimals: int = 6) -> list:
    """A flat list of floats rounded to ``decimals`` (short JSON), with None for non-finite values."""
    a = np.round(np.asarray(values, dtype=np.float64).ravel(), decimals)
    if np.isfinite(a).all():
        return a.tolist()
    return [v if math.isfinite(v) else None for v in a.tolist()]


def json_safe(obj: Any) -> Any:
    """A free-form payload value made JSON-encodable: non-finite floats -> None, bytes -> a placeholder string,
    map keys -> str (stats and events may carry any msgpack value)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return f"<{len(obj)} bytes>"
    if isinstance(obj, np.ndarray):
        return _floats(obj)
    return obj


def _num(value: Any, decimals: int = 6) -> Any:
    """One number rounded to ``decimals`` (None if non-finite); anything else as :func:`json_safe` makes it (the
    decoder does not check every scalar of ``tissue`` and ``needle``, so a publisher's oddity passes through)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return json_safe(value)
    if isinstance(value, int):
        return value
    return round(value, decimals) if math.isfinite(value) else None


def _vec(value: Any, k: int = 3) -> list | None:
    """``value`` as a list of ``k`` floats rounded to 1e-6 (None for a non-finite one), or None if it is not a
    list of ``k`` numbers (the decoder does not check ``tools`` and ``tissue.targets``: the page gets only what
    it can draw)."""
    if not isinstance(value, (list, tuple)) or len(value) != k or \
            any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        return None
    return _floats(value)


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _choice(value: Any, allowed: tuple[str, ...]) -> str | None:
    return value if value in allowed else None


def targets_to_json(targets: Any) -> list[dict]:
    """``state.tissue.targets`` as the page gets it: each mark's ``id``, ``pad``, ``pos`` (m, to 1 µm) and
    ``kind`` ("entry", "exit", else None); an item that is not a map with a position is left out."""
    out = []
    for tg in targets if isinstance(targets, list) else ():
        pos = _vec(tg.get("pos")) if isinstance(tg, dict) else None
        if pos is not None:
            out.append({"id": _name(tg.get("id")), "pad": _name(tg.get("pad")), "pos": pos,
                        "kind": _choice(tg.get("kind"), ("entry", "exit"))})
    return out


HOLDS = ("needle", "thread", "tissue")   # what a grasp or a tool's jaw holds (docs/PROTOCOL.md Sec. 3.1)


def tools_to_json(tools: Any) -> list[dict]:
    """``state.tools`` as the page gets it, at most :data:`MAX_DEVICES`: each tool's ``device``, ``pos`` (m, the
    jaw, to 1 µm), ``quat`` and ``frame`` (w, x, y, z), ``clutched`` (bool), ``holds`` (one of :data:`HOLDS`
    or None), ``grasp`` (id or None), ``centre`` (m), ``scale`` and ``body`` (m: jaw length and radius, shaft
    length and radius). An item without a device name and a position is left out; any other field of the wrong
    type is None (``clutched``: false)."""
    out = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict) or not isinstance(tool.get("device"), str):
            continue
        pos = _vec(tool.get("pos"))
        if pos is None:
            continue
        scale = tool.get("scale")
        out.append({"device": tool["device"], "pos": pos, "quat": _vec(tool.get("quat"), 4),
                    "clutched": tool.get("clutched") is True,
                    "holds": _choice(tool.get("holds"), HOLDS), "grasp": _name(tool.get("grasp")),
                    "frame": _vec(tool.get("frame"), 4), "centre": _vec(tool.get("centre")),
                    "scale": _num(scale) if isinstance(scale, (int, float)) and not isinstance(scale, bool)
                    else None, "body": _vec(tool.get("body"), 4)})
        if len(out) == MAX_DEVICES:
            break
    return out


def tissue_to_json(tissue: dict) -> dict:
    """A decoded ``state.tissue`` map as the page gets it: pad centres and full extents (m) and puncture
    positions (m) rounded to 1 µm, drags (N) to 1 µN, the gap (m, None with fewer than two pads) to 1 µm; its
    ``targets`` (:func:`targets_to_json`) only when it has them."""
    out = {
        "pads": [{"id": p["id"], "pos": _floats(p["pos"]), "size": _floats(p["size"])} for p in tissue["pads"]],
        "punctures": [{"pad": p["pad"], "pos": _floats(p["pos"]), "on": p["on"], "drag": _num(p.get("drag"))}
                      for p in tissue["punctures"]],
        "gap": _num(tissue.get("gap")),
        "knot": tissue.get("knot") if isinstance(tissue.get("knot"), str) else None,
        "throws": _num(tissue.get("throws")),
        "linking": _num(tissue.get("linking")),
    }
    if "targets" in tissue:
        out["targets"] = targets_to_json(tissue["targets"])
    return out


def needle_to_json(needle: dict) -> dict:
    """A decoded ``state.needle`` map as the page gets it: swage and tip (m) rounded to 1 µm, the orientation
    quaternion (w, x, y, z) to 1e-6, radius (m) and arc (rad) to 1e-6, the torque (N m) to 1 nN m."""
    return {
        "pos": _floats(needle["pos"]), "quat": _floats(needle["quat"]),
        "radius": _num(needle.get("radius")), "arc": _num(needle.get("arc")),
        "tip": _floats(needle["tip"]), "torque": _floats(needle["torque"], 9),
    }


def state_to_json(m: dict) -> dict:
    """A decoded ``state`` payload (:func:`protocol.decode`) as the page gets it: positions (m) as a flat list
    of n*3 floats rounded to 1 µm, tensions (N) rounded to 1 µN; only the keys the protocol defines. Each grasp
    has ``holds`` (one of :data:`HOLDS`, None if absent or unknown) and ``frac`` (None if absent). ``tissue``
    and ``needle`` (scenes with tissue and a needle) and ``tools`` (:func:`tools_to_json`, once a stylus has
    sent a pose) are there only when the payload has them."""
    out = {
        "seq": m["seq"], "t": json_safe(m["t"]), "n": m["n"],
        "x": _floats(m["x"]), "tension": _floats(m["tension"]),
        "twist": json_safe(m["twist"]),
        "grasps": [{"id": g["id"], "vertex": g["vertex"], "device": g["device"],
                    "holds": _choice(g.get("holds"), HOLDS), "frac": _frac(g.get("frac")),
                    "pos": json_safe(g["pos"]), "force": json_safe(g["force"])} for g in m["grasps"]],
        "contacts": m["contacts"],
        "energy": json_safe(m["energy"]),
        "solver": json_safe(m["solver"]),
    }
    if "tissue" in m:
        out["tissue"] = tissue_to_json(m["tissue"])
    if "needle" in m:
        out["needle"] = needle_to_json(m["needle"])
    if "tools" in m:
        out["tools"] = tools_to_json(m["tools"])
    return out


def _frac(value: Any) -> float | None:
    """A grasp's ``frac`` (0 <= frac < 1 along its segment) to 1e-6, or None if it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return _num(float(value))


# ------------------------------------------------------------------------------------------ the frame buffer
class _ForceTrack:
    """One device's pending force points and the bucket being filled. Buckets sit on a fixed grid of simulated
    time (bucket k covers [k, k+1) x FORCE_BUCKET_S), so the points of different devices line up."""

    __slots__ = ("points", "k", "t", "mag", "axial", "flags")

    def __init__(self) -> None:
        self.points: deque[list] = deque(maxlen=MAX_FORCE_POINTS)
        self.k: int | None = None       # grid index of the open bucket

    def add(self, t: float, mag: float, axial: float, flags: int) -> None:
        k = math.floor(t / FORCE_BUCKET_S) if math.isfinite(t) else -1
        if k != self.k:                 # the next bucket, or simulated time went backwards (reset, load)
            self.close()
            self.k, self.t, self.mag, self.axial, self.flags = k, t, mag, axial, flags
            return
        # peak-preserving: a one-tick clamp or spike stays visible after decimation
        self.t = t
        self.mag = max(self.mag, mag)
        self.axial = max(self.axial, axial)
        self.flags |= flags

    def close(self) -> None:
        if self.k is not None:
            self.points.append([self.t, self.mag, self.axial, self.flags])
            self.k = None

    def take(self) -> list[list]:
        self.close()
        out = list(self.points)
        self.points.clear()
        return out


class FrameBuffer:
    """What one page has not been sent yet: the newest ``state``, force summary points per device, every
    ``stats`` and ``event`` (bounded deques). Thread-safe: the ZeroMQ thread adds, the page's sender drains.

    Memory is bounded whatever the drain rate: one state, MAX_DEVICES x MAX_FORCE_POINTS points, MAX_STATS
    stats and MAX_EVENTS events.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict | None = None
        self._forces: dict[str, _ForceTrack] = {}
        self._stats: deque[dict] = deque(maxlen=MAX_STATS)
        self._events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self._score: dict | None = None     # the newest score summary (score_to_json)
        self.dropped_states = 0         # states replaced by a newer one before a page got them
        self.dropped_devices = 0        # force messages of devices beyond MAX_DEVICES

    def add(self, topic: bytes, msg: dict, recv_wall: float) -> None:
        """Take one decoded message (``topic`` as published; ``recv_wall``: Unix time it arrived, s)."""
        with self._lock:
            if topic == protocol.TOPIC_STATE:
                if self._state is not None:
                    self.dropped_states += 1
                self._state = msg
            elif topic == protocol.TOPIC_FORCE:
                track = self._forces.get(msg["device"])
                if track is None:
                    if len(self._forces) >= MAX_DEVICES:
                        self.dropped_devices += 1
                        return
                    track = self._forces[msg["device"]] = _ForceTrack()
                fx, fy, fz = msg["force"]
                track.add(msg["t"], math.sqrt(fx * fx + fy * fy + fz * fz), abs(msg["axial"]), msg["flags"])
            elif topic == protocol.TOPIC_STATS:
                self._stats.append({"recv": recv_wall, "stats": msg})
            elif topic == protocol.TOPIC_EVENT:
                self._events.append(msg)

    def set_score(self, summary: dict) -> None:
        """The attempt's newest score summary (JSON-ready): sent with the next frame, replacing any older."""
        with self._lock:
            self._score = summary

    def held(self) -> int:
        """Items held (a state, force points incl. open buckets, stats, events): the bound the tests check."""
        with self._lock:
            forces = sum(len(tr.points) + (tr.k is not None) for tr in self._forces.values())
            return (self._state is not None) + forces + len(self._stats) + len(self._events)

    def drain(self) -> dict | None:
        """Everything pending as a JSON-ready frame body (``state``, ``force``, ``stats``, ``events``,
        ``dropped``), or None if nothing arrived since the last drain. Empties the buffer."""
        with self._lock:
            state, self._state = self._state, None
            forces = {dev: pts for dev, tr in self._forces.items() if (pts := tr.take())}
            stats, events = list(self._stats), list(self._events)
            self._stats.clear()
            self._events.clear()
            score, self._score = self._score, None
            dropped = self.dropped_states
        if state is None and not forces and not stats and not events and score is None:
            return None
        # converting outside the lock keeps the ZeroMQ thread from waiting on JSON work
        return {"state": None if state is None else state_to_json(state),
                "force": {dev: [json_safe(p) for p in pts] for dev, pts in forces.items()},
                "stats": [{"recv": s["recv"], "stats": json_safe(s["stats"])} for s in stats],
                "events": [json_safe(e) for e in events],
                **({"score": score} if score is not None else {}),
                "dropped": {"state": dropped}}


def score_to_json(a: Attempt) -> dict:
    """The page's summary of a scored attempt (server/assessment.py): strict JSON, names as text."""
    return json_safe({
        "tissue": a.gap_end_mm is not None or bool(a.placements), "score": round(a.score, 1),
        "done": a.completed_s is not None, "passed": a.passed, "elapsed_s": round(a.duration_s, 2),
        "phases": [[str(k), round(v, 2)] for k, v in sorted(a.phases.items(), key=lambda kv: kv[1])],
        "marks": [[p.target, round(p.offset_mm, 2)] for p in a.placements],
        "knot": a.knot, "square": a.knot_secure, "gap_mm": None if a.gap_end_mm is None else round(a.gap_end_mm, 2),
        "penalties": round(sum(p.points for p in a.penalties), 1),
        "checks": [[c.what, c.passed] for c in a.checks]})


# ------------------------------------------------------------------------------------------------ the bridge
def check_endpoint(endpoint: str) -> None:
    """Raise :class:`ViewerError` for a ``tcp://host:port`` endpoint ZeroMQ would accept and then retry forever
    (a port out of range, a host that does not resolve); other transports are left to ZeroMQ."""
    if not endpoint.startswith("tcp://"):
        return
    host, sep, port = endpoint[len("tcp://"):].rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ViewerError(f"bad --connect endpoint {endpoint!r}: expected tcp://HOST:PORT with a port "
                          f"1-65535, e.g. {DEFAULT_CONNECT}")
    host = host.strip("[]")
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ViewerError(f"bad --connect endpoint {endpoint!r}: cannot resolve host {host!r} "
                          f"({exc.strerror})") from None


class Bridge:
    """A ZeroMQ SUB socket connected to ``endpoint`` and a thread that decodes what arrives into every attached
    :class:`FrameBuffer`. Malformed messages are counted and skipped (``bad``)."""

    def __init__(self, endpoint: str, ctx: zmq.Context | None = None, curve: ClientCurve | None = None) -> None:
        """``curve``: the client keys, for a publisher with CURVE (which sends nothing to a client without)."""
        check_endpoint(endpoint)
        self.endpoint = endpoint
        self._ctx = ctx or zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, SUB_HWM)
        self._sub.setsockopt(zmq.LINGER, 0)
        for topic in protocol.TOPICS:
            self._sub.setsockopt(zmq.SUBSCRIBE, topic)
        if curve is not None:
            curve.apply(self._sub)
        try:
            self._sub.connect(endpoint)
        except zmq.ZMQError as exc:
            self._sub.close(0)
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ViewerError(f"bad --connect endpoint {endpoint!r}: {reason} "
                              f"(expected e.g. {DEFAULT_CONNECT})") from None
        self._buffers: list[FrameBuffer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="view-sub", daemon=True)
        self._last_monotonic: float | None = None
        self.received = 0
        self.bad = 0
        self.scorer = Scorer()
        self._score_due = 0.0
        self.score_errors = 0             # messages the score could not read (and the last one's reason)
        self.score_error = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self._sub.close(0)

    def attach(self) -> FrameBuffer:
        """A new buffer that gets every message from now on (one per page)."""
        buf = FrameBuffer()
        with self._lock:
            self._buffers = [*self._buffers, buf]
        return buf

    def detach(self, buf: FrameBuffer) -> None:
        with self._lock:
            self._buffers = [b for b in self._buffers if b is not buf]

    def age(self) -> float | None:
        """Seconds since the last message arrived, or None if none has."""
        last = self._last_monotonic
        return None if last is None else time.monotonic() - last

    def _run(self) -> None:
        for topic, payload in receive_until(self._sub, self._stop):
            self.take(topic, payload)

    def take(self, topic: bytes, payload: bytes) -> None:
        """One message as it arrived: into every page's buffer, and into the attempt's score (every state and
        event, watched or not: the score covers the attempt since the bridge joined it, or since the
        last `reset` or `load`), whose summary goes to the pages every SCORE_S."""
        self._last_monotonic = now_mono = time.monotonic()
        self.received += 1
        buffers = self._buffers             # copy-on-write list: no lock on the hot path
        scored = topic in (protocol.TOPIC_STATE, protocol.TOPIC_EVENT)
        if topic not in protocol.TOPICS or (not buffers and not scored):
            return                          # nobody watching and nothing to score: only the age matters
        try:
            msg = protocol.decode(payload, topic)
        except protocol.ProtocolError:
            self.bad += 1
            return
        if scored:
            self._score(topic, msg, now_mono, buffers)
        now = time.time()
        for buf in buffers:
            buf.add(topic, msg, now)

    def _score(self, topic: bytes, msg: dict, now: float, buffers: list[FrameBuffer]) -> None:
        if topic == protocol.TOPIC_EVENT and msg.get("kind") in ("reset", "load"):
            self.scorer = Scorer()          # a new attempt
        try:
            self.scorer.feed(topic.decode(), msg)
            if now >= self._score_due and buffers:
                self._score_due = now + SCORE_S
                summary = score_to_json(self.scorer.attempt())
                for buf in buffers:
                    buf.set_score(summary)
        except (KeyError, TypeError, ValueError, IndexError) as exc:   # a payload the score cannot read
            self.score_errors += 1
            self.score_error = f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------- the web server
def load_assets(directory: Path = ASSETS_DIR) -> dict[str, tuple[bytes, str]]:
    """URL path -> (body, content type) for every .html/.js/.css file of the page; ``/`` is index.html."""
    assets = {f"/{p.name}": (p.read_bytes(), _CONTENT_TYPES[p.suffix])
              for p in sorted(directory.iterdir()) if p.suffix in _CONTENT_TYPES}
    if "/index.html" not in assets:
        raise ViewerError(f"the viewer's page is missing from {directory} (a broken install?)")
    assets["/"] = assets["/index.html"]
    return assets


def is_loopback(host: str) -> bool:
    """True if every address ``host`` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


class ViewerServer:
    """The page's files and its WebSocket on one port (``websockets``' ``process_request`` serves the files)."""

    def __init__(self, bridge: Bridge, host: str, port: int, assets: dict[str, tuple[bytes, str]],
                 allow_hosts: tuple[str, ...] = ()) -> None:
        """``allow_hosts``: more host names the page may be asked for by (``Host`` header; see ``_host_ok``)."""
        self.bridge, self.host, self.port, self.assets = bridge, host, port, assets
        self.loopback = is_loopback(host)
        names = {h.strip().lower().rstrip(".") for h in allow_hosts if h.strip()}
        if not self.loopback:   # the names this machine answers to, and --host itself if it is a name
            names |= {host.lower(), socket.gethostname().lower(), socket.getfqdn().lower()}
        self.allowed_names = frozenset(names - {"", "0.0.0.0", "::", "*"})

    def _host_ok(self, host_header: str | None) -> bool:
        """Whether a request naming ``host_header`` is for us. A page on another site that rebinds its DNS name
        to our address (DNS rebinding) sends that name as Host, so names are checked whatever --host is:
        localhost, this machine's own names (bound beyond loopback), --host itself and --allow-host names pass.
        An IP address passes if it is loopback, or, bound beyond loopback, any (a rebinding page's Host is its
        own name, never an address)."""
        if not host_header:
            return False
        name = (urlsplit(f"//{host_header}").hostname or "").rstrip(".")
        if name == "localhost" or name in self.allowed_names:
            return True
        try:
            return ipaddress.ip_address(name).is_loopback or not self.loopback
        except ValueError:
            return False

    def process_request(self, connection: Any, request: Any) -> Any:
        """Serve a static file, refuse foreign hosts and origins, or let ``/ws`` through to the WebSocket."""
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        host = request.headers.get("Host")
        if not self._host_ok(host):
            return connection.respond(HTTPStatus.FORBIDDEN, "forbidden host\n")
        path = urlsplit(request.path).path
        if path == "/ws":
            origin = request.headers.get("Origin")
            # another site's page in the user's browser must not read the stream
            if origin is not None and urlsplit(origin).netloc != host:
                return connection.respond(HTTPStatus.FORBIDDEN, "cross-origin WebSocket refused\n")
            return None
        if path == "/favicon.ico":
            return connection.respond(HTTPStatus.NO_CONTENT, "")
        asset = self.assets.get(path)
        if asset is None:
            return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
        body, ctype = asset
        headers = Headers([("Content-Type", ctype), ("Content-Length", str(len(body))),
                           ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                           ("Content-Security-Policy", _CSP), ("Connection", "close")])
        return Response(HTTPStatus.OK.value, HTTPStatus.OK.phrase, headers, body)

    async def page(self, ws: Any) -> None:
        """One page's stream: a hello, then a frame whenever something arrived (at most every FRAME_S)."""
        from websockets.exceptions import ConnectionClosed

        buf = self.bridge.attach()
        try:
            await ws.send(json.dumps({"type": "hello", "endpoint": self.bridge.endpoint, "frame_s": FRAME_S,
                                      "bucket_s": FORCE_BUCKET_S}))
            loop = asyncio.get_running_loop()
            last_sent = -math.inf
            while True:
                start = loop.time()
                body = buf.drain()
                if body is not None or start - last_sent >= HEARTBEAT_S:
                    frame = {"type": "frame", "endpoint": self.bridge.endpoint, "age": self.bridge.age(),
                             "received": self.bridge.received, **(body or {})}
                    # awaiting the send is the back-pressure: a slow page just drains less often
                    await ws.send(json.dumps(frame, separators=(",", ":"), allow_nan=False))
                    last_sent = start
                await asyncio.sleep(max(0.0, FRAME_S - (loop.time() - start)))
        except ConnectionClosed:
            pass
        finally:
            self.bridge.detach(buf)

    async def run(self, stop: asyncio.Event, ready: Callable[[str], None]) -> None:
        """Listen until ``stop`` is set; ``ready`` gets the page's URL once listening."""
        from websockets.asyncio.server import serve

        try:
            server = await serve(self.page, self.host, self.port, process_request=self.process_request,
                                 compression=None,     # loopback: CPU matters more than bytes
                                 max_size=64 * 1024)   # the page sends nothing
        except socket.gaierror as exc:
            raise ViewerError(f"cannot listen on --host {self.host!r}: {exc.strerror}") from None
        except OSError as exc:
            raise ViewerError(_listen_error(self.host, self.port, exc)) from None
        async with server:
            port = server.sockets[0].getsockname()[1]
            shown = f"[{self.host}]" if ":" in self.host else self.host
            ready(f"http://{shown}:{port}/")
            await stop.wait()


def _listen_error(host: str, port: int, exc: OSError) -> str:
    code = exc.errno
    if code is None and exc.__context__ is not None:    # asyncio wraps several bind failures in one OSError
        code = getattr(exc.__context__, "errno", None)
    if code == errno.EADDRINUSE or "address already in use" in str(exc):
        return f"port {port} on {host} is already in use (is another viewer running? pick another with --port)"
    if code == errno.EACCES:
        return f"no permission to listen on port {port} (ports below 1024 need privileges; pick another --port)"
    if code == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}: not an address of this machine (--host)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


# ------------------------------------------------------------------------------------------------ entry point
def serve_viewer(connect: str = DEFAULT_CONNECT, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 curve: ClientCurve | None = None, allow_hosts: tuple[str, ...] = ()) -> int:
    """Run the viewer until SIGINT/SIGTERM; returns the exit code (0 after Ctrl-C, 2 for a bad endpoint, a port
    in use or a missing page). Messages go to stdout (the URL) and stderr (warnings, errors). ``curve``: client
    keys for a publisher with CURVE; ``allow_hosts``: see ViewerServer."""
    if not 0 <= port <= 65535:
        print(f"suturesim view: --port {port} is out of range (0-65535)", file=sys.stderr)
        return 2
    try:
        assets = load_assets()
        bridge = Bridge(connect, curve=curve)
    except ViewerError as exc:
        print(f"suturesim view: {exc}", file=sys.stderr)
        return 2
    server = ViewerServer(bridge, host, port, assets, allow_hosts)
    if not server.loopback:
        print(f"suturesim view: warning: --host {host} is not a loopback address: anyone who can reach it can "
              f"watch the simulation (the page has no authentication)", file=sys.stderr, flush=True)
    bridge.start()
    try:
        asyncio.run(_main(server, connect))
    except ViewerError as exc:
        print(f"suturesim view: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:       # only if the signal handlers could not be installed
        pass
    finally:
        bridge.stop()
    print("suturesim view: stopped", flush=True)
    return 0


async def _main(server: ViewerServer, connect: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or not a POSIX loop
            pass

    def ready(url: str) -> None:
        print(f"suturesim view: open {url} (showing {connect}); Ctrl-C stops", flush=True)

    await server.run(stop, ready)
