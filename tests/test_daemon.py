"""The real daemon, end to end (issue 4): `suturesim serve` runs as a subprocess on free loopback ports and is
driven only through its public surfaces (PUB/SUB topics, REQ/REP control, PUSH stylus, signals, exit codes),
plus the shared-memory device link for the zero-force checks.

Every daemon is killed in a finalizer; every wait is bounded. One class-scoped daemon serves the read-only tests
(rates, schema, status, bad requests, fuzz), one the two remote-stylus tests (which count from what they find),
one the tests that change state and put it back (TestStateRestored); other tests that change state get their own.
The harness is tests/conftest.py's.
"""
from __future__ import annotations

import glob
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time

from pathlib import Path

import msgpack
import numpy as np
import pytest
import yaml
import zmq

from suturesim.server import protocol
from suturesim.server.recording import read_messages, read_metadata
from suturesim.solver.scenario import load_scenario
from suturesim.solver.timers import HAS_COUNTER, STAGES

# the harness lives in conftest.py; its names stay importable from here
from conftest import (_CTX, DEVICE, REPLY_TIMEOUT_S, START_TIMEOUT_S, STOP_TIMEOUT_S, Daemon,  # noqa: F401
                      LoopTiming, MachineLateness, Sub, find_link, free_ports, overruns_past_catch_up, pose_msg,
                      push_socket, serving_daemon, wait_for)


def test_overruns_past_catch_up_tells_a_stall_from_a_scene_too_slow():
    second = {"seq": 2000, "tick_us": {"p50": 500.0, "p99": 900.0, "max": 4000.0},
              "step_us": {"p50": 300.0, "p99": 600.0, "max": 3500.0}}
    # a 4 ms stall at c = 0.5 ms: 4 / 0.5 + 1 = 9 ticks late at most; 12 leaves 3 unexplained
    assert overruns_past_catch_up([second], [{"seq": 1500, "late_us": 4000.0, "ticks": 9}]) == 0
    assert overruns_past_catch_up([second], [{"seq": 1500, "late_us": 4000.0, "ticks": 12}]) == 3
    # ticks of 1.1 ms never catch up: every overrun counts
    slow = {"seq": 2000, "tick_us": {"p50": 1100.0, "p99": 1200.0, "max": 1300.0},
            "step_us": {"p50": 900.0, "p99": 1000.0, "max": 1100.0}}
    assert overruns_past_catch_up([slow], [{"seq": 1100, "late_us": 50000.0, "ticks": 100}]) == 100
    # an event after the last `stats` takes the last second's
    assert overruns_past_catch_up([second], [{"seq": 2500, "late_us": 1000.0, "ticks": 5}]) == 2
    # a second whose ticks run past long_ticks_us at p99 explains its overruns; one within it does not
    assert overruns_past_catch_up([slow], [{"seq": 1100, "late_us": 50000.0, "ticks": 100}], 1000.0) == 0
    assert overruns_past_catch_up([second], [{"seq": 1500, "late_us": 4000.0, "ticks": 12}], 1000.0) == 3
    # a second whose step ran past SLOW_STEP times its median at p99 ran on a slow CPU: its overruns are explained
    slowed = {**second, "step_us": {"p50": 300.0, "p99": 1500.0, "max": 3500.0}}
    assert overruns_past_catch_up([slowed], [{"seq": 1500, "late_us": 4000.0, "ticks": 12}]) == 0
    assert overruns_past_catch_up([slowed], [{"seq": 1500, "late_us": 4000.0, "ticks": 12}], slow_step=None) == 3


def test_the_spin_before_a_deadline_keeps_a_realtime_loop_under_the_kernels_limit():
    from suturesim.server.physics import DUTY_MARGIN, spin_allowed
    tick, spin = 1_000_000, 300_000
    # light ticks spin as configured, whatever the limit
    assert spin_allowed(spin, tick, 100_000, 0.95) == spin
    assert spin_allowed(spin, tick, 100_000, 1.0) == spin
    # 0.65 ms ticks under a 95 % limit: tick and spin fill 90 % of the period, not 95 %
    allowed = spin_allowed(spin, tick, 650_000, 0.95)
    assert allowed < spin and abs(650_000 + allowed - (0.95 - DUTY_MARGIN) * tick) <= 1
    # ticks past the budget: no spin (the loop sleeps to its deadline, or runs late), never a negative one
    assert spin_allowed(spin, tick, 950_000, 0.95) == 0
    assert spin_allowed(spin, tick, 2_000_000, 0.95) == 0
    # a loop that is not real time is not throttled: it spins while its ticks leave room
    assert spin_allowed(spin, tick, 800_000, 1.0) == 200_000


# ---------------------------------------------------------------------------------------------- type checks
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_vec3(v) -> bool:
    return isinstance(v, list) and len(v) == 3 and all(isinstance(c, float) for c in v)


def check_raw_types(topic: bytes, raw: dict) -> None:
    """The documented msgpack types (docs/PROTOCOL.md Sec. 3) on the undecoded map: floats are floats, ints
    are ints (not bools), arrays are bin."""
    assert raw["v"] == 1 and _is_int(raw["seq"]) and raw["seq"] >= 0 and isinstance(raw["t"], float), raw
    if topic == protocol.TOPIC_STATE:
        n = raw["n"]
        assert _is_int(n) and n >= 1
        assert isinstance(raw["x"], bytes) and len(raw["x"]) == 12 * n
        assert isinstance(raw["tension"], bytes) and len(raw["tension"]) == 4 * (n - 1)
        assert isinstance(raw["twist"], float)
        assert isinstance(raw["grasps"], list)
        for g in raw["grasps"]:
            assert isinstance(g["id"], str) and _is_int(g["vertex"]) and isinstance(g["device"], str)
            assert _is_vec3(g["pos"]) and _is_vec3(g["force"]), g
        assert _is_int(raw["contacts"]) and raw["contacts"] >= 0
        assert all(isinstance(raw["energy"][k], float) for k in ("kinetic", "elastic", "gravity"))
        s = raw["solver"]
        assert _is_int(s["iters"]) and isinstance(s["residual"], float) and _is_int(s["substeps"]), s
    elif topic == protocol.TOPIC_FORCE:
        assert isinstance(raw["device"], str)
        assert _is_vec3(raw["pose"]) and _is_vec3(raw["force"]), raw
        assert isinstance(raw["axial"], float) and _is_int(raw["flags"]) and raw["flags"] >= 0
    elif topic == protocol.TOPIC_STATS:
        for key in ("lateness_us", "period_us"):
            assert set(raw[key]) >= {"p50", "p99", "p999", "max"}, raw
            assert all(isinstance(v, float) for v in raw[key].values()), raw
        for key in ("step_us", "tick_us", "inputs_us", "watch_us", "outputs_us"):
            assert set(raw[key]) >= {"p50", "p99", "max"}, raw
            assert all(isinstance(v, float) and v >= 0.0 for k, v in raw[key].items() if k != "hist"), raw
        for key in ("step_us", "tick_us"):   # the second's ticks in 10 µs bins: every one counted once
            h = raw[key]["hist"]
            assert isinstance(h, list) and len(h) == 200 and all(_is_int(c) and c >= 0 for c in h), raw
            assert 0 < sum(h) <= raw["ticks"], raw
        # the stages are parts of the tick: their medians add up to no more than its largest
        assert sum(raw[k]["p50"] for k in ("step_us", "inputs_us", "watch_us", "outputs_us")) <= \
            raw["tick_us"]["max"], raw
        assert _is_int(raw["overruns"]) and _is_int(raw["ticks"]) and _is_int(raw["retries"])
        assert _is_int(raw["retries_past_budget"]) and raw["retries_past_budget"] <= raw["retries"]
        assert isinstance(raw["substeps"]["mean"], float) and _is_int(raw["substeps"]["max"])
        if raw["substeps"]["mean"] > 0.0:   # the rounds, a substep's and the shares run out
            rounds = raw["rounds"]
            assert set(rounds) == {"contact", "contact_out", "tissue", "tissue_out"}, rounds
            assert all(isinstance(v, float) and v >= 0.0 for v in rounds.values()), rounds
            assert rounds["contact_out"] <= 1.0 and rounds["tissue_out"] <= 1.0, rounds
        assert isinstance(raw["realtime"], bool) and _is_int(raw["cpu"])
        if HAS_COUNTER:
            # the step's stages, each a part of its ticks' steps: their means add up to no more than its largest
            stages = raw["step_stages_us"]
            assert set(stages) == set(STAGES) and all(isinstance(v, float) and v >= 0.0 for v in stages.values())
            assert sum(stages.values()) <= raw["step_us"]["max"], raw
    elif topic == protocol.TOPIC_EVENT:
        assert isinstance(raw["kind"], str)
    else:
        raise AssertionError(f"unknown topic {topic!r}")


# ======================================================================================= one shared daemon
@pytest.fixture(scope="class")
def shared():
    """A daemon for read-only tests; torn down when the class is done, so that its SCHED_FIFO physics
    process (pinned to the last CPU) does not compete with the other tests' daemons."""
    yield from serving_daemon()


BAD_REQUESTS = {
    "not msgpack": b"\xc1\xc1\xc1 not msgpack",
    "truncated msgpack": msgpack.packb({"cmd": "status"})[:-3],
    "empty frame": b"",
    "a msgpack list": msgpack.packb(["status"]),
    "a msgpack string": msgpack.packb("status"),
    "missing cmd": msgpack.packb({"command": "status"}),
    "cmd not a string": msgpack.packb({"cmd": 7}),
    "cmd nil": msgpack.packb({"cmd": None}),
    "non-string map key": msgpack.packb({1: "status", "cmd": "status"}),
    "unknown cmd": msgpack.packb({"cmd": "fly"}),
    "grasp vertex a string": msgpack.packb({"cmd": "grasp", "vertex": "ten"}),
    "grasp vertex a float": msgpack.packb({"cmd": "grasp", "vertex": 10.0}),
    "grasp vertex a bool": msgpack.packb({"cmd": "grasp", "vertex": True}),
    "grasp vertex missing": msgpack.packb({"cmd": "grasp"}),
    "grasp vertex out of range": msgpack.packb({"cmd": "grasp", "vertex": 10_000}),
    "grasp a pinned vertex": msgpack.packb({"cmd": "grasp", "vertex": 0}),
    "grasp stiffness a string": msgpack.packb({"cmd": "grasp", "vertex": 50, "stiffness": "stiff"}),
    "grasp stiffness NaN": msgpack.packb({"cmd": "grasp", "vertex": 50, "stiffness": float("nan")}),
    "grasp id taken": msgpack.packb({"cmd": "grasp", "vertex": 50, "id": "right"}),
    "release id an int": msgpack.packb({"cmd": "release", "id": 3}),
    "release unknown id": msgpack.packb({"cmd": "release", "id": "nope"}),
    "load scenario an int": msgpack.packb({"cmd": "load", "scenario": 3}),
    "load unknown scenario": msgpack.packb({"cmd": "load", "scenario": "no-such-scenario"}),
    "load invalid inline scenario": msgpack.packb({"cmd": "load", "scenario": {"name": 5}}),
    "set path an int": msgpack.packb({"cmd": "set", "path": 5, "value": 1}),
    "set value missing": msgpack.packb({"cmd": "set", "path": "gravity"}),
    "set value wrong type": msgpack.packb({"cmd": "set", "path": "thread.segments", "value": "many"}),
    "set unknown key": msgpack.packb({"cmd": "set", "path": "no.such.key", "value": 1}),
    "set bad path": msgpack.packb({"cmd": "set", "path": "thread..segments", "value": 10}),
    "record_start name an int": msgpack.packb({"cmd": "record_start", "name": 1}),
    "record_start to a path": msgpack.packb({"cmd": "record_start", "path": "/home/x.mcap"}),
    "record_start name a path": msgpack.packb({"cmd": "record_start", "name": "../x.mcap"}),
}


@pytest.mark.xdist_group("daemon-shared")   # one worker starts the class's daemon (under -n)
class TestSharedDaemon:
    @pytest.mark.timed   # message rates and the loop's period against the wall clock
    def test_topic_rates_sequence_and_schema(self, shared):
        sub = Sub(shared.pub)
        try:
            sub.wait_live()
            window = 10.0
            msgs = sub.collect(window + 0.5)
        finally:
            sub.close()
        t_first = msgs[0][0]
        msgs = [m for m in msgs if m[0] - t_first <= window]
        by_topic: dict[bytes, list[tuple[dict, dict]]] = {t: [] for t in protocol.TOPICS}
        for _, topic, payload in msgs:
            raw = msgpack.unpackb(payload, raw=False)
            check_raw_types(topic, raw)
            by_topic[topic].append((protocol.decode(payload, topic), raw))

        states = [m for m, _ in by_topic[protocol.TOPIC_STATE]]
        forces = [m for m, _ in by_topic[protocol.TOPIC_FORCE]]
        stats = [m for m, _ in by_topic[protocol.TOPIC_STATS]]
        assert 950 <= len(states) <= 1050, f"{len(states)} state messages in {window} s (100 Hz ± 5 %)"
        assert {f["device"] for f in forces} == {DEVICE}
        assert 9800 <= len(forces) <= 10200, f"{len(forces)} force messages in {window} s (1 kHz ± 2 %)"
        seqs = np.array([f["seq"] for f in forces])
        gaps = np.flatnonzero(np.diff(seqs) != 1)
        assert gaps.size == 0, f"force seq not consecutive at {[(seqs[i], seqs[i + 1]) for i in gaps[:5]]}"
        assert np.all(np.diff([s["seq"] for s in states]) == 10)
        assert np.allclose(np.diff([s["t"] for s in states]), 0.010, atol=1e-9)

        n = load_scenario("default").model.n_vertices
        for s in states:
            assert s["n"] == n and s["x"].shape == (n, 3) and s["x"].dtype == np.float32
            assert s["tension"].shape == (n - 1,) and np.all(np.isfinite(s["x"]))
            assert [(g["id"], g["vertex"], g["device"]) for g in s["grasps"]] == [("right", n - 1, DEVICE)]
        for f in forces:
            assert all(map(math.isfinite, f["pose"] + f["force"] + [f["axial"]]))

        assert 9 <= len(stats) <= 11, f"{len(stats)} stats messages in {window} s (1 Hz)"
        for s in stats:
            assert 900 <= s["period_us"]["p50"] <= 1100, s
            assert s["step_us"]["p50"] < 1000, s
            assert s["overruns"] <= s["ticks"], s
        assert np.all(np.diff([s["ticks"] for s in stats]) > 0)

    @pytest.mark.timed   # ticks counted over 0.1 s of wall time
    def test_status_fields(self, shared):
        a = shared.status()
        time.sleep(0.1)
        b = shared.status()
        for r in (a, b):
            assert r["scenario"] == "default"
            assert _is_int(r["seq"]) and isinstance(r["t"], float) and r["paused"] is False
            assert _is_int(r["substeps"]) and r["substeps"] >= 1
            assert [(g["id"], g["vertex"], g["device"]) for g in r["grasps"]] == [("right", 100, DEVICE)]
            assert r["devices"] == []                       # nothing has sent a pose
            assert {"ticks", "overruns", "stylus_accepted", "stylus_rejected"} <= set(r["stats"])
        assert b["seq"] - a["seq"] >= 50 and b["t"] > a["t"]

    def test_status_stats_has_the_stats_topic_keys(self, shared):
        # the loop summarises its first second a second after its first tick: wait for it (the daemon may be new)
        wait_for(lambda: {"lateness_us", "period_us", "step_us"} <= set(shared.status()["stats"]), 5.0,
                 what="status stats with the stats topic's keys")

    def test_bad_requests_get_error_replies(self, shared):
        errors0 = shared.status()["stats"]["control_errors"]
        for what, raw in BAD_REQUESTS.items():
            reply = shared.request(raw=raw)
            assert reply["ok"] is False and isinstance(reply["error"], str) and reply["error"], (what, reply)
            assert shared.status()["ok"] is True, what
        after = shared.status()
        assert after["stats"]["control_errors"] - errors0 == len(BAD_REQUESTS)
        assert after["scenario"] == "default" and after["paused"] is False and after["n"] == 101
        assert [g["id"] for g in after["grasps"]] == ["right"]

    def test_oversized_request_gets_an_error_reply(self, shared):
        try:
            reply = shared.request(raw=msgpack.packb({"cmd": "status", "pad": "x" * 100_000}), timeout=1.5)
            assert reply["ok"] is False and isinstance(reply["error"], str)
        finally:
            assert shared.status()["ok"] is True    # either way it keeps answering

    @pytest.mark.timed   # overruns and lateness p99 under the fuzz
    def test_fuzz_control_and_stylus(self, shared):
        rng = random.Random(20240604)
        timing = LoopTiming(shared)   # the loop's timing meanwhile
        with MachineLateness(cpu=shared.status()["cpu"]) as machine:   # and the machine's over the same window
            before = timing.start()
            after, n_stylus = self._fuzz(shared, rng, before)
            ticks, overruns, past, during, overrun_events = timing.finish()

        assert after["stylus_rejected"] - before["stylus_rejected"] == n_stylus, (before, after)
        assert after["stylus_accepted"] == before["stylus_accepted"]
        # the loop keeps time under the fuzz: no overrun but the catch-up after a stall of the host's, and no
        # second slowed down short of an overrun (one with an overrun is judged by the first assertion). Stalls
        # that come in bursts outrun the catch-up's reading (one `overrun` event reports only its window's worst:
        # CI once saw an event of 77 ticks after a 12 ms stall), so the loop is also allowed what the machine alone
        # made late over the same window (MachineLateness.late_ticks), as the next test is
        p99 = [(s["lateness_us"]["p99"], s["overruns"] - b["overruns"]) for b, s in zip([before] + during, during)]
        assert ticks > 1000 and past < 0.01 * ticks + machine.late_ticks(during), \
            (f"{overruns} overruns in {ticks} ticks during the fuzz, {past} past catching up ({machine}): "
             f"{overrun_events}")
        assert max((p for p, n in p99 if n == 0), default=0.0) < 500.0, \
            f"lateness p99 per second during the fuzz (µs, overruns in that second): {p99}"
        final = shared.status()
        assert final["scenario"] == "default" and [g["id"] for g in final["grasps"]] == ["right"]

    @staticmethod
    def _fuzz(shared, rng: random.Random, before: dict) -> tuple[dict, int]:
        """Malformed control requests and stylus messages, every one answered or counted: the stats after, and
        how many stylus messages were sent."""
        # -- control: malformed, truncated, wrong-typed, unknown; never a valid state-changing request ------
        valid = [msgpack.packb(r) for r in ({"cmd": "status"}, {"cmd": "grasp", "vertex": 50, "stiffness": 200.0},
                                            {"cmd": "release", "id": "right"}, {"cmd": "load", "scenario": "x"})]
        wrong = [None, True, 1.5, -7, 2 ** 40, "", "x" * 300, [1, 2], {"a": 1}, b"\x00\xff", float("nan")]

        def control_request() -> bytes:
            kind = rng.randrange(9)
            if kind == 0:
                return rng.randbytes(rng.randrange(0, 300))
            if kind == 1:
                v = rng.choice(valid)
                return v[:rng.randrange(0, len(v))]                                    # truncated
            if kind == 2:
                return msgpack.packb(rng.choice(wrong))                                 # not a map
            if kind == 3:
                return msgpack.packb({"cmd": rng.choice(wrong)})                        # cmd wrong type
            if kind == 4:
                return msgpack.packb({"cmd": "".join(rng.choices("abcxyz_", k=rng.randrange(1, 12))) + "!"})
            if kind == 5:                                                               # wrong-typed fields
                cmd, field, ok_types = rng.choice([("grasp", "vertex", int), ("release", "id", str),
                                                   ("load", "scenario", (str, dict)), ("set", "path", str),
                                                   ("record_start", "name", str)])
                bad = rng.choice([w for w in wrong if isinstance(w, bool) or not isinstance(w, ok_types)])
                return msgpack.packb({"cmd": cmd, field: bad, "value": rng.choice(wrong)})
            if kind == 6:                                                               # bad grasp numbers
                return msgpack.packb({"cmd": "grasp", "vertex": rng.choice([0, 10 ** 6, -10 ** 6, 2 ** 63 - 1]),
                                      "stiffness": rng.choice([-1.0, 0.0, float("inf"), float("nan"), "k"])})
            if kind == 7:                                                               # random map
                return msgpack.packb({rng.choice(["cmd", "vertex", "id", "x"]): rng.choice(wrong)
                                      for _ in range(rng.randrange(0, 5))} | {"cmd": rng.choice(wrong)})
            return b"\x81\xa3cmd" + rng.randbytes(rng.randrange(1, 40))                 # a map, garbage value

        n_control = 2500
        no_reply = []
        for i in range(n_control):
            raw = control_request()
            try:
                reply = shared.request(raw=raw, timeout=2.0)
            except TimeoutError:
                no_reply.append(raw[:40])
                continue
            if reply["ok"]:   # only status may succeed
                assert msgpack.unpackb(raw, raw=False) == {"cmd": "status"}, (raw, reply)
            else:
                assert isinstance(reply["error"], str), reply
        assert not no_reply, f"{len(no_reply)} control requests got no reply, e.g. {no_reply[:3]}"

        # oversized requests: ZMQ_MAXMSGSIZE drops them (and the connection); the server must stay up
        for size in (70_000, 200_000):
            big = _CTX.socket(zmq.REQ)
            big.setsockopt(zmq.LINGER, 0)
            big.connect(shared.control)
            big.send(b"\x81\xa3cmd\xa6status" + b"\x00" * size)
            big.poll(300)
            big.close(0)

        # -- stylus: garbage, NaN/inf/huge positions, wrong types, unknown devices -------------------------
        def stylus_message() -> bytes:
            kind = rng.randrange(7)
            if kind == 0:
                return rng.randbytes(rng.randrange(0, 200))
            if kind == 1:
                v = pose_msg([0.4, 0.0, 0.0])
                return v[:rng.randrange(0, len(v))]
            if kind == 2:
                bad = rng.choice([float("nan"), float("inf"), -float("inf"), 1e6, 11.0, -1e308])
                pos = [0.4, 0.0, 0.0]
                pos[rng.randrange(3)] = bad
                return pose_msg(pos)
            if kind == 3:
                return msgpack.packb({"device": DEVICE, "pos": rng.choice([None, 1.0, [0.1, 0.2], [0.1] * 4,
                                                                          {"x": 1}, [None, 0, 0], [[0], 0, 0]])})
            if kind == 4:
                return msgpack.packb({"device": rng.choice([None, 3, 1.5, [DEVICE], b"stylus0"]),
                                      "pos": [0.4, 0.0, 0.0]})
            if kind == 5:
                return pose_msg([0.4, 0.0, 0.0], device="nobody-" + str(rng.randrange(100)))  # no such grasp
            return msgpack.packb(rng.choice([[DEVICE, [0.4, 0, 0]], "pose", 42, None, {"pos": [0.4, 0, 0]}]))

        push = push_socket(shared, linger_ms=5000)
        n_stylus = 0
        try:
            for _ in range(1500):
                push.send(stylus_message())
                n_stylus += 1
        finally:
            push.close()
        big = push_socket(shared, linger_ms=1000)
        big.send(b"\x00" * 100_000)  # over the cap: dropped by ZeroMQ, never counted
        big.close()

        def settled():
            s = shared.status()["stats"]
            return s if s["stylus_rejected"] - before["stylus_rejected"] >= n_stylus else None
        try:
            return wait_for(settled, 10.0, what="every stylus message counted"), n_stylus
        except AssertionError:
            return shared.status()["stats"], n_stylus

    def test_the_loops_helper_threads_stay_off_its_cpu(self, shared):
        """The physics process's other SCHED_FIFO threads (the scene builder's thread) may not run on the
        loop's CPU: sharing it, they stalled the loop 5 to 40 ms around each scene build
        (server/physics.py place_helper_threads)."""
        st = shared.status()
        cpu, pid = st["cpu"], st["pid"]
        if cpu < 0 or not st["realtime"]:
            pytest.skip("the loop has no CPU of its own or no SCHED_FIFO here")
        helpers = []
        for task in glob.glob(f"/proc/{pid}/task/[0-9]*"):
            tid = int(task.rsplit("/", 1)[1])
            stat = open(f"{task}/stat").read()
            if tid == pid or int(stat[stat.rindex(")") + 2:].split()[38]) != os.SCHED_FIFO:
                continue
            helpers.append((tid, os.sched_getaffinity(tid)))
        assert helpers, "the scene builder's thread is raised to SCHED_FIFO beside the loop"
        assert all(cpu not in cpus for _, cpus in helpers), (cpu, helpers)

    @pytest.mark.timed   # overruns
    def test_invalid_set_and_load_requests_do_not_overrun(self, shared):
        # judged as the fuzz is: a stall of the host's (CI once saw 9 overruns in the 238 ticks these requests
        # took) makes the ticks after it late while they catch up; the requests must add no overrun of their own.
        # Stalls that come in bursts outrun that reading (one `overrun` event reports only its window's worst), so
        # the loop is also allowed what the machine alone made late over the same window: a bare wait loop's late
        # wake-ups, or the catch-up after the time stolen from the loop's CPU (MachineLateness.late_ticks)
        timing = LoopTiming(shared)
        with MachineLateness(cpu=shared.status()["cpu"]) as machine:
            before = timing.start()
            for i in range(60):
                req = [{"cmd": "set", "path": "thread.segments", "value": "many"},
                       {"cmd": "set", "path": "no.such.key", "value": 1},
                       {"cmd": "load", "scenario": "no-such-scenario"}][i % 3]
                assert shared.request(req)["ok"] is False
            ticks = shared.status()["stats"]["ticks"] - before["ticks"]   # the requests' ticks, not the wait after
            _, overruns, past, during, overrun_events = timing.finish()
        assert past < 0.01 * ticks + machine.late_ticks(during), \
            (f"{overruns} overruns in {ticks} ticks for 60 rejected requests, {past} past catching up "
             f"({machine}): {overrun_events}")


# =================================================================================== commands that change state
def _as_started(d: Daemon) -> bool:
    """The daemon is as `serve` started it, as far as status tells: running the default scene, not paused, the
    scene's grasp alone."""
    try:
        st = d.request({"cmd": "status"}, timeout=REPLY_TIMEOUT_S)
    except TimeoutError:
        return False
    grasps = [(g["id"], g["vertex"], g["device"]) for g in st["grasps"]]
    return (d.proc.poll() is None and st["ok"] and st["scenario"] == "default" and st["paused"] is False
            and st["n"] == 101 and grasps == [("right", 100, DEVICE)])


@pytest.fixture(scope="class")
def _restored_holder():
    holder: dict[str, Daemon] = {}
    yield holder
    if "d" in holder:
        holder["d"].close()


@pytest.fixture
def restored(_restored_holder):
    """The class's daemon as `serve` started it (a new one if the last test left it otherwise)."""
    d = _restored_holder.get("d")
    if d is not None and not _as_started(d):
        d.close()
        d = None
    if d is None:
        d = _restored_holder["d"] = Daemon()
        d.wait_serving()
    return d


@pytest.mark.xdist_group("daemon-restored")   # one worker starts the class's daemon (under -n)
class TestStateRestored:
    """Commands whose tests put back what they changed (pause then resume, grasp then release, reset then resume,
    record_start then record_stop, load then load `default`) and a signal that changes nothing (SIGUSR1) share
    one daemon, torn down when the class is done. Each test gets it as `serve` started it (_as_started): one
    left otherwise (a failed test) is replaced before the next. The recording tests wait for their own lines of
    the daemon's output (count_lines: the ones before)."""

    @pytest.mark.timed   # states counted and scene time advanced over wall-clock windows
    def test_pause_and_resume(self, restored, subscribe):
        sub = subscribe(restored)
        t_running = [s["t"] for s in sub.states(0.2)]
        assert t_running[-1] > t_running[0]
        restored.ok({"cmd": "pause"})
        sub.event("pause")
        paused = sub.states(0.3)
        assert len(paused) >= 20 and len({s["t"] for s in paused}) == 1, [s["t"] for s in paused]
        assert len({s["seq"] for s in paused}) == len(paused)          # still published, still counting ticks
        st = restored.status()
        assert st["paused"] is True and st["t"] == paused[-1]["t"]
        restored.ok({"cmd": "resume"})
        sub.event("resume")
        resumed = [s["t"] for s in sub.states(0.3)]
        assert resumed[0] >= paused[-1]["t"] and resumed[-1] - resumed[0] > 0.15
        assert restored.status()["paused"] is False

    @pytest.mark.timed   # forces counted over 0.5 s of wall time
    def test_grasp_and_release(self, restored, subscribe):
        sub = subscribe(restored)
        reply = restored.ok({"cmd": "grasp", "vertex": 50, "device": "left", "id": "g-left", "stiffness": 500.0})
        assert reply["id"] == "g-left"
        ev, _ = sub.event("grasp", id="g-left")
        assert ev["vertex"] == 50 and ev["device"] == "left"
        msgs = [(t, protocol.decode(p, t)) for _, t, p in sub.collect(0.5)]
        left = [m for t, m in msgs if t == protocol.TOPIC_FORCE and m["device"] == "left"]
        assert len(left) >= 400 and left[0]["seq"] == ev["seq"] + 1
        assert np.all(np.diff([m["seq"] for m in left]) == 1)
        states = [m for t, m in msgs if t == protocol.TOPIC_STATE]
        assert all(("g-left", 50, "left") in [(g["id"], g["vertex"], g["device"]) for g in s["grasps"]]
                   for s in states)
        g = next(g for g in restored.status()["grasps"] if g["id"] == "g-left")
        assert (g["vertex"], g["device"]) == (50, "left")

        reply = restored.request({"cmd": "grasp", "vertex": 60, "id": "g-left"})
        assert reply["ok"] is False                                        # the id is taken

        restored.ok({"cmd": "release", "id": "g-left"})
        ev, before = sub.event("release", id="g-left")
        after = [(t, protocol.decode(p, t)) for _, t, p in sub.collect(0.3)]
        assert not [m for t, m in after if t == protocol.TOPIC_FORCE and m["device"] == "left"]
        assert [m for t, m in after if t == protocol.TOPIC_FORCE and m["device"] == DEVICE]
        assert all(g["id"] != "g-left" for t, m in after if t == protocol.TOPIC_STATE for g in m["grasps"])
        assert [g["id"] for g in restored.status()["grasps"]] == ["right"]
        assert restored.request({"cmd": "release", "id": "g-left"})["ok"] is False

    def test_sigusr1_prints_each_process_stack_and_the_server_runs_on(self, restored):
        """`kill -USR1` on the supervisor or a child prints its threads' Python stacks on stderr (how to see where
        a server that does not stop is stuck; the tests' Daemon.close does it before a SIGKILL)."""
        # one at a time: two processes' dumps on one pipe interleave (faulthandler writes a line in pieces)
        os.kill(restored.pid, signal.SIGUSR1)
        restored.wait_line(r'File ".*server/supervisor\.py", line \d+ in run', 5.0, stream="stderr")
        os.kill(restored.physics_pid(), signal.SIGUSR1)
        restored.wait_line(r'File ".*server/physics\.py", line \d+ in run', 5.0, stream="stderr")
        assert restored.status()["ok"] and restored.proc.poll() is None

    def test_reset_restores_the_initial_shape(self, restored, subscribe):
        x0 = load_scenario("default").initial.x.astype(np.float32)
        sub = subscribe(restored)
        time.sleep(1.0)
        sub.drain()
        moved = sub.next_state()
        assert moved["t"] > 0.5 and np.abs(moved["x"] - x0).max() > 1e-3  # the thread has moved

        # running: the first state after the reset is at most one state period (10 ticks) past the initial state
        restored.ok({"cmd": "reset"})
        sub.event("reset")
        first = sub.next_state()
        assert first["t"] <= 0.0105
        assert np.abs(first["x"] - x0).max() < 5e-3    # 10 ms of motion from the initial shape at most

        # paused: nothing steps between the reset and the next state, which is the initial shape exactly
        time.sleep(0.5)
        restored.ok({"cmd": "pause"})
        sub.event("pause")
        assert np.abs(sub.next_state()["x"] - x0).max() > 1e-3
        restored.ok({"cmd": "reset"})
        sub.event("reset")
        first = sub.next_state()
        assert first["t"] == 0.0
        np.testing.assert_allclose(first["x"], x0, rtol=0, atol=np.finfo(np.float32).eps)
        assert restored.status()["t"] == 0.0
        restored.ok({"cmd": "resume"})       # as it was, for the class's next test

    @pytest.mark.timed   # forces and states recorded over 1 s of wall time
    def test_record_start_and_stop(self, restored, subscribe, tmp_path):
        out = Path(restored.data_home) / "suturesim" / "recordings" / "rec.mcap"
        sub = subscribe(restored, (protocol.TOPIC_EVENT,))
        # the shared daemon's earlier recordings' lines
        started = restored.count_lines(r"^suturesim: recording to ")
        recordings = restored.count_lines(r"^suturesim record: \d+ messages to ")
        assert restored.ok({"cmd": "record_start", "name": "rec.mcap"})["path"] == str(out)
        sub.event("record_start")
        restored.wait_line(r"^suturesim: recording to ", 15.0, count=started + 1)
        time.sleep(1.0)
        restored.ok({"cmd": "record_stop"})
        sub.event("record_stop")
        done = restored.wait_line(r"^suturesim record: \d+ messages to ", 15.0, count=recordings + 1)
        assert str(out) in done and "no force message missing" in done, done
        msgs = list(read_messages(out))
        forces = [protocol.decode(p, t) for t, p, _, _ in msgs if t == "force"]
        states = [protocol.decode(p, t) for t, p, _, _ in msgs if t == "state"]
        assert len(forces) >= 500 and len(states) >= 50, (len(forces), len(states))
        assert {f["device"] for f in forces} == {DEVICE}
        assert np.all(np.diff([f["seq"] for f in forces]) == 1)
        assert restored.status()["ok"] is True

    @pytest.mark.timed   # states counted over 0.5 s of wall time
    def test_load_switches_scenario(self, restored, subscribe):
        hanging = load_scenario("wang2017-hanging")
        assert not hanging.grasps and not hanging.force_vertices
        sub = subscribe(restored)
        reply = restored.ok({"cmd": "load", "scenario": "wang2017-hanging"})
        assert reply.get("scenario", "wang2017-hanging") == "wang2017-hanging"
        sub.event("load", scenario="wang2017-hanging")
        msgs = [(t, protocol.decode(p, t)) for _, t, p in sub.collect(0.5)]
        assert not [m for t, m in msgs if t == protocol.TOPIC_FORCE], "force still published without grasps"
        states = [m for t, m in msgs if t == protocol.TOPIC_STATE]
        assert len(states) >= 30
        assert all(s["n"] == hanging.model.n_vertices and s["grasps"] == [] for s in states)
        assert hanging.model.n_vertices != 101
        st = restored.status()
        assert st["scenario"] == "wang2017-hanging" and st["grasps"] == [] and st["n"] == hanging.model.n_vertices
        restored.ok({"cmd": "load", "scenario": "default"})   # as it was, for the class's next test

    def test_recording_metadata_names_the_running_scenario(self, restored, subscribe, tmp_path):
        """A recording started after `load` carries the scenario that is running, not the one served at start."""
        sub = subscribe(restored, (protocol.TOPIC_EVENT,))
        # the shared daemon's earlier recordings' lines
        started = restored.count_lines(r"^suturesim: recording to ")
        recordings = restored.count_lines(r"^suturesim record: \d+ messages to ")
        restored.ok({"cmd": "load", "scenario": "wang2017-hanging"})
        sub.event("load")
        out = restored.ok({"cmd": "record_start", "name": "loaded.mcap"})["path"]
        restored.wait_line(r"^suturesim: recording to ", 15.0, count=started + 1)
        time.sleep(0.3)
        restored.ok({"cmd": "record_stop"})
        restored.wait_line(r"^suturesim record: \d+ messages to ", 15.0, count=recordings + 1)
        meta = read_metadata(out)
        assert meta["scenario"]["name"] == "wang2017-hanging"
        assert yaml.safe_load(meta["scenario"]["yaml"])["name"] == "wang2017-hanging"


def test_set_changes_parameters(daemon, subscribe):
    sub = subscribe(daemon)
    g = [s["energy"]["gravity"] for s in sub.states(0.3)]
    assert np.ptp(g) > 0                                               # the thread falls: gravity energy changes
    n0 = daemon.status()["n"]

    daemon.ok({"cmd": "set", "path": "gravity", "value": [0.0, 0.0, 0.0]})
    ev, _ = sub.event("set", path="gravity")
    after = sub.states(0.3)
    assert len(after) >= 20 and all(s["energy"]["gravity"] == 0.0 for s in after)
    assert all(s["n"] == n0 for s in after) and after[0]["t"] > 0.1  # same thread, same shape: not reset

    reply = daemon.request({"cmd": "set", "path": "thread.segments", "value": -3})
    assert reply["ok"] is False and "segments" in reply["error"]
    assert daemon.status()["n"] == n0                                 # a rejected set changes nothing

    daemon.ok({"cmd": "set", "path": "thread.segments", "value": 50})
    sub.event("set", path="thread.segments", value=50)
    s = sub.next_state()
    assert s["n"] == 51 and s["x"].shape == (51, 3) and s["tension"].shape == (50,)
    st = daemon.status()
    assert st["n"] == 51 and [(g["id"], g["vertex"]) for g in st["grasps"]] == [("right", 50)]


def test_shutdown_command(daemon, subscribe):
    sub = subscribe(daemon, (protocol.TOPIC_EVENT,))
    assert daemon.ok({"cmd": "shutdown"}) == {"ok": True}
    sub.event("shutdown")
    assert daemon.wait_exit(5.0) == 0, daemon.output()
    assert not glob.glob(f"/dev/shm/suturesim_{daemon.pid}_*"), "the device link was not unlinked"


@pytest.fixture(scope="class")
def remote_shared():
    yield from serving_daemon("--device", "remote")


@pytest.mark.xdist_group("daemon-remote")   # one worker starts the class's daemon (under -n)
class TestRemoteStylus:
    """One daemon whose devices are remote styluses for the two stylus tests (each counts from the stats it finds);
    torn down when the class is done, as TestSharedDaemon's."""

    def test_remote_stylus_drives_the_grasp(self, remote_shared, subscribe):
        daemon = remote_shared
        stats0 = daemon.status()["stats"]
        sub = subscribe(daemon, (protocol.TOPIC_FORCE,))
        push = push_socket(daemon)
        try:
            targets = [[0.40, 0.00, 0.05], [0.35, 0.05, 0.10], [0.30, -0.05, 0.00], [0.42, 0.01, -0.02]]
            for i, pos in enumerate(targets):
                sub.drain()
                push.send(pose_msg(pos, seq=i))
                sub.until(lambda t, m: m["device"] == DEVICE and np.allclose(m["pose"], pos, rtol=0, atol=1e-9),
                          2.0, f"force pose at {pos}")
            # a stream of poses: the force pose follows it, and stays at the last one when the poses stop
            for k in range(200):
                push.send(pose_msg([0.38 + 0.02 * math.cos(k / 30), 0.02 * math.sin(k / 30), 0.05], seq=10 + k))
                time.sleep(0.002)
            last = [0.38 + 0.02 * math.cos(199 / 30), 0.02 * math.sin(199 / 30), 0.05]
            sub.until(lambda t, m: np.allclose(m["pose"], last, rtol=0, atol=1e-9), 2.0, "the last pose")
            time.sleep(0.5)   # no more poses: the scripted timeline must not take the grasp back
            sub.drain()
            (_, m), _ = sub.until(lambda t, m: m["device"] == DEVICE, 1.0)
            np.testing.assert_allclose(m["pose"], last, rtol=0, atol=1e-9)
        finally:
            push.close(0)
        st = daemon.status()
        assert DEVICE in st["devices"]
        assert st["stats"]["stylus_accepted"] - stats0["stylus_accepted"] == len(targets) + 200
        assert st["stats"]["stylus_rejected"] - stats0["stylus_rejected"] == 0

    def test_stylus_positions_of_the_wrong_type_are_rejected(self, remote_shared):
        daemon = remote_shared
        stats0 = daemon.status()["stats"]
        push = push_socket(daemon, linger_ms=2000)
        try:
            push.send(msgpack.packb({"device": DEVICE, "pos": ["0.40", "0.0", "0.05"]}))
            push.send(msgpack.packb({"device": DEVICE, "pos": [True, False, False]}))
        finally:
            push.close()
        stats = wait_for(lambda: (s := daemon.status()["stats"])["stylus_rejected"] + s["stylus_accepted"]
                         - stats0["stylus_rejected"] - stats0["stylus_accepted"] >= 2 and s, 5.0)
        assert stats["stylus_rejected"] - stats0["stylus_rejected"] == 2, (stats0, stats)
        assert stats["stylus_accepted"] - stats0["stylus_accepted"] == 0, (stats0, stats)


@pytest.mark.timed   # ticks counted over 2 s of wall time
def test_extreme_grasp_parameters_do_not_kill_the_physics_process(daemon, subscribe):
    sub = subscribe(daemon, (protocol.TOPIC_EVENT,))
    time.sleep(1.0)   # let the thread fall and swing first
    seq0 = daemon.status()["seq"]
    reply = daemon.request({"cmd": "grasp", "vertex": 50, "stiffness": 1e300, "max_force": 1e300})
    time.sleep(2.0)
    events = [protocol.decode(p, t)["kind"] for _, t, p in sub.collect(0.1) if t == protocol.TOPIC_EVENT]
    assert "fault" not in events, events
    assert not [ln for ln in daemon.stderr if "physics process died" in ln], daemon.output()
    st = daemon.status()
    assert st["seq"] > seq0 + 1500, (seq0, st["seq"])
    assert reply["ok"] is False or any(g["vertex"] == 50 for g in st["grasps"])


# ==================================================================================== signals and faults
@pytest.mark.timed   # the exit within 2 s
def test_sigterm_exits_zero_and_zeroes_the_forces(daemon, subscribe):
    link = find_link(daemon)
    try:
        sub = subscribe(daemon, (protocol.TOPIC_EVENT,))
        t0 = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.wait_exit(2.0)
        elapsed = time.monotonic() - t0
        assert code == 0, f"exit code {code} after {elapsed:.2f} s (want 0 within 2 s)\n{daemon.output()}"
        sub.event("shutdown", timeout=1.0)
        assert not daemon.children()
        if link is None:
            pytest.skip("the supervisor does not say which shared-memory link it made, and none named "
                        f"/dev/shm/suturesim_{daemon.pid}_* was found: cannot check the zeroed forces")
        force = np.full(3, np.nan)
        rec = link.read_force(0, force)
        assert rec is not None, "the force record was never written"
        _, _, axial, flags, _ = rec
        assert np.all(force == 0.0) and axial == 0.0, (force, rec)
        assert not glob.glob(f"/dev/shm/suturesim_{daemon.pid}_*"), "the device link was not unlinked"
    finally:
        if link is not None:
            link.close()


@pytest.mark.timed   # the forces zeroed within 2 s
def test_killed_physics_process_faults_and_restarts(daemon, subscribe):
    link = find_link(daemon)
    try:
        sub = subscribe(daemon, (protocol.TOPIC_EVENT,))
        old = daemon.physics_pid()
        os.kill(old, signal.SIGKILL)
        t0 = time.monotonic()
        zeroed = None
        if link is not None:   # between the death and the new process's first tick, the supervisor's zero
            force = np.zeros(3)
            while time.monotonic() - t0 < 2.0 and zeroed is None:
                rec = link.read_force(0, force)
                if rec is not None and rec[3] & protocol.FLAG_FAULT and np.all(force == 0.0) and rec[2] == 0.0:
                    zeroed = time.monotonic() - t0
                time.sleep(0.0005)
        ev, _ = sub.event("fault", timeout=30.0)
        assert "died" in ev["reason"] and "restarted" in ev["reason"], ev
        daemon.wait_serving(count=2, timeout=30.0)
        st = wait_for(lambda: _status_or_none(daemon), 30.0 - (time.monotonic() - t0), what="status answers")
        assert st["scenario"] == "default"
        assert daemon.physics_pid() != old and daemon.proc.poll() is None
        if link is None:
            pytest.skip("no /dev/shm/suturesim_<serve pid>_* link found: the forces after the kill are unchecked")
        assert zeroed is not None, "the forces were not zeroed with FLAG_FAULT after the physics process died"
    finally:
        if link is not None:
            link.close()


def _stop_timed(d: Daemon, within: float) -> float:
    """SIGTERM the supervisor; assert it exits 0 within ``within`` s, its children gone; the seconds taken."""
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    code = d.wait_exit(within)
    elapsed = time.monotonic() - t0
    assert code == 0, f"exit code {code} after {elapsed:.2f} s (want 0 within {within} s)\n{d.output()}"
    assert not d.spawn_children()
    return elapsed


@pytest.mark.timed   # the stop's duration, both bounds
def test_a_physics_process_that_does_not_stop_is_killed_and_the_server_exits_zero(daemon):
    """A physics process stuck anywhere (here stopped with SIGSTOP, holding whatever it held) delays the stop by
    server/supervisor.py's STOP_TIMEOUT_S (1.5 s), no more, and the supervisor says what it killed. The stop
    request is a lock-free shared byte (haptics/process.py): with the multiprocessing Event it was, a process
    stopped or killed inside the Event's is_set() left its lock held, and the supervisor's next is_set() waited
    for ever."""
    os.kill(daemon.physics_pid(), signal.SIGSTOP)
    elapsed = _stop_timed(daemon, 5.0)
    assert 1.4 < elapsed, elapsed
    assert any("the physics process did not stop within 1.5 s and was killed" in ln for ln in daemon.stderr), \
        daemon.output()


@pytest.mark.timed   # the stop's duration, both bounds
def test_a_recorder_that_does_not_finish_is_killed_and_said_so(tmp_path):
    """A recorder that writes nothing after the stop is killed after RECORDER_IDLE_S (5 s) and the supervisor
    names the file it left without a summary; the server still exits 0. (One that is still writing its queue
    gets up to RECORDER_STOP_S.)"""
    out = tmp_path / "stuck.mcap"
    d = Daemon("--record", str(out))
    try:
        d.wait_serving()
        recorder = d.spawn_children_named("suturesim-recorder")
        assert len(recorder) == 1, (d.spawn_children(), recorder)
        os.kill(recorder[0], signal.SIGSTOP)
        elapsed = _stop_timed(d, 12.0)
        assert 4.5 < elapsed, elapsed
        said = [ln for ln in d.stderr if "the recorder did not finish" in ln]
        assert said and str(out) in said[0] and "no summary" in said[0], d.output()
    finally:
        d.close()


def _status_or_none(d: Daemon):
    try:
        return d.request({"cmd": "status"}, timeout=1.0)
    except TimeoutError:
        return None


# ============================================================================================ security
def _listening_ports() -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A":   # TCP_LISTEN
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
        except FileNotFoundError:
            pass
    return ports


def test_non_loopback_bind_without_keys_is_refused():
    pub, control, stylus = free_ports(3)
    endpoint = f"tcp://0.0.0.0:{pub}"
    cmd = [sys.executable, "-m", "suturesim.server.cli", "serve", "--pub", endpoint,
           "--control", f"tcp://127.0.0.1:{control}", "--stylus", f"tcp://127.0.0.1:{stylus}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    listened = set()
    try:
        while proc.poll() is None and time.monotonic() - t0 < 30.0:
            listened |= _listening_ports() & {pub, control, stylus}
            time.sleep(0.01)
        out, err = proc.communicate(timeout=5.0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5.0)
    elapsed = time.monotonic() - t0
    assert proc.returncode not in (0, None), (proc.returncode, out, err)
    assert elapsed < 15.0, f"took {elapsed:.1f} s to refuse"
    assert "serving" not in out
    assert endpoint in err, err
    assert "--insecure" in err and "server_secret_key" in err and "client_keys_dir" in err, err
    assert "suturesim keys" in err and "127.0.0.1" in err, err
    assert not listened, f"ports {listened} were listening"
    for port in (pub, control, stylus):   # and nothing is left bound
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_port_in_use_fails_fast_with_one_clear_line():
    """A start-up error (here the PUB port is taken) is reported once, not restarted."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        ctl, sty, sco = free_ports(3)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "suturesim.server.cli", "serve",
                            "--pub", f"tcp://127.0.0.1:{taken}", "--control", f"tcp://127.0.0.1:{ctl}",
                            "--stylus", f"tcp://127.0.0.1:{sty}", "--score", f"tcp://127.0.0.1:{sco}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        assert time.monotonic() - t0 < 30
        assert "could not start" in r.stderr and "Address already in use" in r.stderr
        assert "Traceback" not in r.stderr and r.stderr.count("could not start") == 1
    finally:
        holder.close()


def test_the_loops_stats_read_their_percentiles_as_numpy_does():
    """LoopStats.summary sorts the second's series once and reads their percentiles itself (ten np.percentile
    calls cost 0.4 ms on the tick that publishes them): every figure equals np.percentile's, for full and
    partial seconds, on values with ties and without, the tick's stages included; the step's and the tick's
    histograms equal np.histogram's."""
    from suturesim.server.physics import LoopStats

    stats = LoopStats(1000)
    rng = np.random.default_rng(3)
    for case in range(300):
        n = 1000 if case % 3 else int(rng.integers(1, 1000))
        vals = rng.random((n, 7)) * 1000.0 * rng.random() * (3.0 if case % 7 == 0 else 1.0)
        if case % 5 == 0:
            vals = np.round(vals, int(rng.integers(0, 3)))
        for v in vals:
            stats.add(v[0], v[1], v[2], 4, v[3], v[4], v[5], v[6])
        got = stats.summary()
        for key, col, names in (("lateness_us", 0, ("p50", "p99", "p999")), ("period_us", 1, ("p50", "p99", "p999")),
                                ("step_us", 2, ("p50", "p99")), ("tick_us", 3, ("p50", "p99")),
                                ("inputs_us", 4, ("p50", "p99")), ("watch_us", 5, ("p50", "p99")),
                                ("outputs_us", 6, ("p50", "p99"))):
            for name, q in zip(names, (50.0, 99.0, 99.9)):
                assert got[key][name] == float(np.percentile(vals[:, col], q)), (case, key, name)
            assert got[key]["max"] == float(vals[:, col].max())
            assert "p999" in got[key] if col < 2 else "p999" not in got[key]
        for key, col in (("step_us", 2), ("tick_us", 3)):
            # 10 µs bins from 0, the last open above: a span's pooled counts give its percentiles to a bin
            edges = np.append(np.arange(200) * 10.0, np.inf)
            assert got[key]["hist"] == np.histogram(vals[:, col], edges)[0].tolist(), (case, key)
        assert got["ticks"] == stats.ticks and stats.count == 0


def test_the_stats_rounds_are_a_substeps_and_the_share_run_out():
    """`stats.rounds` (server/physics.py ROUNDS): the solver's rounds summed over the interval's ticks over its
    substeps; a tick not stepped counts nothing, and an interval with none stepped has no `rounds`."""
    from suturesim.server.physics import LoopStats
    from suturesim.solver.contact_response import CS_ROUNDS, CS_ROUNDS_OUT, CS_SIZE
    from suturesim.solver.integrator import STAT_TISSUE_OUT, STAT_TISSUE_ROUNDS
    from suturesim.solver.model import STAT_SLOTS

    stats = LoopStats(10)
    st, cs = np.zeros(STAT_SLOTS), np.zeros(CS_SIZE)
    for substeps, contact, out, tissue, tissue_out in ((4, 24, 4, 8, 0), (4, 8, 0, 4, 1), (0, 99, 99, 99, 99)):
        cs[CS_ROUNDS], cs[CS_ROUNDS_OUT], st[STAT_TISSUE_ROUNDS], st[STAT_TISSUE_OUT] = contact, out, tissue, tissue_out
        stats.add(0.0, 1000.0, 200.0, substeps, 300.0, stats=st, contact_stats=cs)
    assert stats.summary()["rounds"] == {"contact": 4.0, "contact_out": 0.5, "tissue": 1.5, "tissue_out": 0.125}
    stats.add(0.0, 1000.0, 0.0, 0, 10.0, stats=st, contact_stats=cs)
    assert "rounds" not in stats.summary()


def test_a_daemon_line_is_written_whole(monkeypatch):
    """server/console.say writes a line and its newline in one call: with PYTHONUNBUFFERED, print made two, and the
    physics process's line once split the supervisor's "serving" line from its start (a CI run)."""
    from suturesim.server import console

    class Pipe:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            pass

    out, err = Pipe(), Pipe()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    console.say("suturesim: serving 'default'")
    console.say("suturesim: a fault", err=True)
    assert out.writes == ["suturesim: serving 'default'\n"] and err.writes == ["suturesim: a fault\n"]

