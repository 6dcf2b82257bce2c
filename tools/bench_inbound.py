"""`suturesim bench inbound`: what the server's inbound validation (server/protocol.py decode_request,
decode_stylus) costs the tick for ordinary and hostile messages: each decoded (or refused) many times, best and
median per call in µs. A control request is decoded in the tick that takes it, a stylus sample in the tick it
arrives in (at most STYLUS_DRAIN_PER_TICK of them), so these are the worst a client can add to a tick."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import msgpack

from ..server import protocol
from ..server.config import SecurityConfig
from ..solver.scenario import scenario_path
from ..solver.config import load_yaml


@dataclass
class InboundRow:
    what: str
    bytes: int
    accepted: bool
    best_us: float
    median_us: float


def _time(call: Callable[[], object], repeats: int) -> tuple[bool, float, float]:
    accepted = True
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        try:
            call()
        except protocol.ProtocolError:
            accepted = False
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    return accepted, min(times), statistics.median(times)


def _cases() -> list[tuple[str, bytes, str]]:
    """(what, raw bytes, kind: request or stylus)."""
    pack = msgpack.packb
    inline = load_yaml(scenario_path("needle-tie-surgeons-knot"))
    depth = b"\x91" * 60_000 + b"\xc0"                       # 60 000 nested one-item arrays
    return [
        ("`status` request", pack({"cmd": "status"}), "request"),
        ("inline scenario (needle-tie-surgeons-knot)", pack({"cmd": "load", "scenario": inline}), "request"),
        ("list of 8000 ints", pack({"cmd": "set", "path": "x", "value": list(range(8000))}), "request"),
        ("map of 5000 keys", pack({"cmd": "set", "path": "x", "value": {str(k): k for k in range(5000)}}),
         "request"),
        ("map of 9000 keys (over the 64 KiB cap)",
         pack({"cmd": "set", "path": "x", "value": {str(k): k for k in range(9000)}}), "request"),
        ("60 KB string", pack({"cmd": "load", "scenario": "x" * 60_000}), "request"),
        ("array header of 1e6 items", b"\x81\xa3cmd\xdd\x00\x0f\x42\x40", "request"),
        ("60 KB depth bomb", depth, "request"),
        ("stylus sample", pack({"device": "stylus0", "seq": 1, "t": 0.001, "pos": [0.1, 0.0, 0.05],
                                "quat": [1.0, 0.0, 0.0, 0.0], "buttons": 1}), "stylus"),
        ("60 KB stylus sample", pack({"device": "stylus0", "pos": [0.0, 0.0, 0.0], "pad": "x" * 60_000}), "stylus"),
    ]


def measure_inbound(quick: bool, log: Callable[[str], None]) -> list[InboundRow]:
    repeats = 20 if quick else 200
    limit = SecurityConfig().max_message_bytes
    rows = []
    for what, raw, kind in _cases():
        log(f"  {what}")
        call = (lambda r=raw: protocol.decode_request(r, limit)) if kind == "request" else \
            (lambda r=raw: protocol.decode_stylus(r))
        accepted, best, median = _time(call, repeats)
        rows.append(InboundRow(what, len(raw), accepted, best, median))
    return rows


def render_inbound(rows: list[InboundRow]) -> list[str]:
    out = ["## 8. Inbound validation", "",
           "What server/protocol.py costs the tick for one message: a control request (decode_request, at most one "
           "a tick) or a stylus sample (decode_stylus, at most 32 a tick), best and median of repeated calls.", "",
           "| message | bytes | result | best µs | median µs |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.what} | {r.bytes} | {'accepted' if r.accepted else 'refused'} | {r.best_us:.1f} | "
                   f"{r.median_us:.1f} |")
    return out + [""]
