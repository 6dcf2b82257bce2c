"""The live score (server/scoring.py): the scorer process beside the physics publishes the attempt's score and
an event at each phase's end, computed from the published stream by server/assessment.py's Scorer."""
from __future__ import annotations

import time

import pytest
import zmq

from suturesim.server import protocol
from suturesim.server.config import load_server_config
from suturesim.server.scoring import LiveScore
from conftest import Daemon
from test_score import Stream, encode


def test_the_live_score_ends_each_phase_once_and_reports_the_attempt():
    s = Stream()
    s.suture(exit_=(0.0065, 0.0, 0.0))
    live = LiveScore("suture-practice", "Ana")
    events = []
    for seq, (topic, msg) in enumerate(s.msgs):
        events += [protocol.decode(p, t) for t, p in live.take(topic.encode(), encode(seq, topic, msg))]
    assert [(e["kind"], e["phase"]) for e in events] == [("score", p) for p in (
        "needle grasped", "bite 1", "bite 2", "pulled through", "throw 1", "throw 2", "cinched")]
    assert events[-1]["at"] == pytest.approx(38.0) and events[-1]["score"] == pytest.approx(600 - 38 - 1.5)
    topic, payload = live.report()
    m = protocol.decode(payload, topic)
    assert topic == protocol.TOPIC_SCORE and m["done"] and not m["passed"] and m["trainee"] == "Ana"
    assert m["score"] == pytest.approx(600 - 38 - 1.5) and m["marks"] == [["in", 0.0], ["out", 1.5]]
    assert m["t"] == pytest.approx(s.t) and m["unreadable"] == 0
    # a malformed payload is counted, and a reset starts a new attempt
    assert live.take(protocol.TOPIC_STATE, b"\x93not a map") == [] and live.unreadable == 1
    live.take(protocol.TOPIC_EVENT, protocol.encode_event(11, 0.0, "reset")[:-3])
    assert protocol.decode(live.report()[1], "score")["unreadable"] == 2
    live.take(protocol.TOPIC_EVENT, protocol.encode_event(10**6, s.t, "reset"))
    m = protocol.decode(live.report()[1], "score")
    assert m["phases"] == [] and not m["done"]


def test_the_score_endpoint_is_configured_or_turned_off(tmp_path):
    assert load_server_config().endpoints.score == "tcp://127.0.0.1:5558"
    cfg = tmp_path / "server.yaml"
    cfg.write_text("endpoints:\n  score: null\n")
    off = load_server_config(str(cfg))
    assert off.endpoints.score is None and len(off.endpoints.all()) == 3
    cfg.write_text("endpoints:\n  score: off\n")              # YAML reads `off` as false
    assert load_server_config(str(cfg)).endpoints.score is None
    assert load_server_config(overrides={"endpoints": {"score": "off"}}).endpoints.score is None    # --score off
    cfg.write_text("endpoints:\n  score: tcp://127.0.0.1:5555\n")
    with pytest.raises(Exception, match="endpoints.score: is the same endpoint as endpoints.pub"):
        load_server_config(str(cfg))


def test_serve_publishes_the_live_score_of_the_scripted_suture():
    """`serve` of the scripted simple interrupted suture: on --score, `score` messages at about 2 Hz whose
    phases grow as the suture goes (its bites at 0.96 s and 1.75 s, the thread through at 3.41 s), and a `score`
    event when the thread is pulled through."""
    d = Daemon("--scenario", "simple-interrupted-suture", score=True)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(d.score)
    try:
        d.wait_serving()
        assert f"score on {d.score}" in d.output()
        scores, events = [], []
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and not any(e["phase"] == "pulled through" for e in events):
            if sub.poll(200):
                topic, payload = sub.recv_multipart()
                (scores if topic == protocol.TOPIC_SCORE else events).append((time.monotonic(),
                                                                               protocol.decode(payload, topic)))
                if topic != protocol.TOPIC_SCORE:
                    events[-1] = events[-1][1]
        assert any(e["phase"] == "pulled through" for e in events), (events, d.output())
        last = dict(scores[-1][1]["phases"])
        assert last["bite 1"] == pytest.approx(0.96, abs=0.01) and last["bite 2"] == pytest.approx(1.75, abs=0.01)
        assert all(not m["done"] and m["unreadable"] == 0 for _, m in scores)
        gaps = [b[0] - a[0] for a, b in zip(scores, scores[1:])]
        assert len(scores) >= 4 and 0.3 < sorted(gaps)[len(gaps) // 2] < 0.8, gaps      # about 2 Hz
    finally:
        sub.close(0)
        ctx.term()
        d.close()
