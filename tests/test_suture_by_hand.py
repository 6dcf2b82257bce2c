"""A suture by hand in `suture-practice`, through the physics loop as two live styluses drive it (the hands in
tests/suture_by_hand.py): the right tool picks the needle up, sets it over the entry mark and drives it tip first
through both edges by turning the stylus; the left tool takes it near the tip where it came out (the right lets
go) and draws it through. Each hand computes its poses from what the server says: the needle's pose in the
`state`, and the pose the jaw holds it in from the `grasp` event. Also: a needle let go in the air, and a session
by hand on the server resimulated exactly."""
from __future__ import annotations

import math

import numpy as np
import pytest

from suture_by_hand import (CENTRE, HOLD_TICKS, LEFT, Q_BITE, RIGHT, SETTLE_TICKS, Hand, Scene, qconj, qmul, rot,
                            set_for_bite, slerp, start_of_suture, trainee_in_process)
from suturesim.server import protocol
from suturesim.solver.needle import NP_WIRE
from suturesim.tools.bench_bot_rate import drive


def suture_start(scene: Scene, theta: float = 0.0, approach=None) -> None:
    """The start of a suture by hand in ``scene`` (suture_by_hand.start_of_suture), asserting each step, then
    the left hand draws the needle on along its curve and out: the thread follows it through the punctures, and
    both hands' forces stay within the clamp and the slew limit."""
    got = start_of_suture(scene, theta=theta, approach=approach)
    assert got["grasp"]["arc"] == pytest.approx(theta or scene.arc / 4.0, abs=1e-3)   # aimed by a 10 ms old state
    assert not got["early"]
    punctures = [(e["pad"], e["side"]) for e in scene.events("puncture")]
    assert punctures == [("left", "entry"), ("left", "exit"), ("right", "entry"), ("right", "exit")], punctures
    entry = np.array(scene.events("puncture")[0]["pos"])
    assert np.linalg.norm(entry[:2] - [-0.005, 0.0]) < 1.5e-3                     # at the entry mark
    assert [(e["device"], e["holds"]) for e in scene.events("release")][-1] == (RIGHT, "needle")
    left = got["left"]
    swage, q = scene.needle()
    rel = qmul(qconj(Q_BITE), q)                                                   # rotz(phi), or its negative
    phi = math.remainder(2.0 * math.atan2(rel[3], rel[0]), 2.0 * math.pi)
    left.drive(phi, math.radians(235.0), 3000)
    swage, q = scene.needle()
    left.move_needle(swage + [0.03, 0.0, 0.03], q, 1000)                          # up and out to the right
    scene.tick(300)
    swage, q = scene.needle()
    assert swage[2] > 0.01 and swage[0] > 0.01                                      # the swage is out, right side
    assert scene.events("thread_through"), "the thread follows the needle through the punctures"
    slew = scene.loop.cfg.safety.max_slew_n_per_s * scene.loop.cfg.loop.tick_s
    for device in (RIGHT, LEFT):
        f = scene.forces(device)
        assert np.linalg.norm(f, axis=1).max() <= scene.loop.cfg.safety.max_force_n + 1e-9
        assert np.linalg.norm(np.diff(f, axis=0), axis=1).max() <= slew * 1.0001


@pytest.mark.long(cost=10)
def test_a_hand_picks_up_the_needle_drives_it_through_both_edges_and_the_other_hand_takes_it_at_the_tip():
    suture_start(Scene(), approach=(0.0, 0.0, 0.03))


@pytest.mark.long(cost=10)
@pytest.mark.parametrize("seed", range(4))
def test_the_suture_start_from_a_perturbed_needle_and_hands(seed):
    """The needle lies elsewhere on the pad, turned; the right hand comes from elsewhere and takes the needle
    at another point of its arc: the hands, reading where it is, bite through both edges and draw it out."""
    rng = np.random.default_rng(seed)
    yaw = math.radians(rng.uniform(-25.0, 25.0))
    start = [-0.016 + rng.uniform(-0.004, 0.004), -0.012 + rng.uniform(-0.004, 0.004), 0.0004]
    scene = Scene(overrides={"shape": {"start": start},
                             "needle": {"orientation": [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]}})
    suture_start(scene, scene.arc * rng.uniform(0.2, 0.3), rng.uniform(-0.03, 0.03, 3) + [0.0, 0.0, 0.03])


def _sample(device: str, seq: int, pos, quat, buttons: int) -> bytes:
    import msgpack
    return msgpack.packb({"device": device, "seq": seq, "t": seq * 1e-3, "pos": [float(v) for v in pos],
                          "quat": [float(v) for v in quat], "buttons": int(buttons)}, use_bin_type=True)


@pytest.mark.long(cost=30)
def test_a_session_by_hand_on_the_server_resimulates_exactly(tmp_path, subscribe):
    """`serve` of suture-practice with two remote styluses, recorded: the right jaw takes the needle a third of
    the way along its arc and turns it, clutches, moves on; the left takes the thread mid-segment and pulls; both
    let go. The recording resimulates exactly: the needle's pose in the jaw (from the `grasp` event), the
    point along the segment and the clutch are followed, and every force and state is the same."""
    import subprocess
    import sys
    import time

    from conftest import Daemon, push_socket

    out = tmp_path / "by-hand.mcap"
    d = Daemon("--scenario", "suture-practice", "--device", "remote", "--record", str(out))
    try:
        d.wait_serving()
        sub = subscribe(d, (protocol.TOPIC_STATE, protocol.TOPIC_EVENT))
        time.sleep(0.5)
        st = sub.next_state()
        swage, q = np.array(st["needle"]["pos"]), np.array(st["needle"]["quat"])
        r, arc = st["needle"]["radius"], st["needle"]["arc"]
        th = arc / 3.0
        jaw = swage + rot(q, [r * math.sin(th), r * (1 - math.cos(th)), 0.0])
        x = np.asarray(st["x"], float).reshape(-1, 3)
        point = 0.5 * (x[40] + x[41])
        push = push_socket(d, linger_ms=1000)
        turn = [math.cos(0.25), 0.0, math.sin(0.25), 0.0]          # 30 degrees about y
        one = np.array([1.0, 0.0, 0.0, 0.0])
        plan = []                                         # (right pos, right quat, right buttons, left pos, left buttons)
        for k in range(2400):
            s = min(1.0, max(0.0, (k - 400) / 600.0))         # 0.4-1.0 s: lift 2 cm and turn
            rq = slerp(one, turn, s)
            rp = jaw + [0.0, 0.0, 0.02 * s]
            rb = 0 if k < 200 else (1 if k < 1200 or k >= 1500 else 3)   # 1.2-1.5 s: clutched
            if k >= 1200:
                rp = rp + [0.01 * min(1.0, (k - 1200) / 300.0), 0.0, 0.0]   # moved while clutched, then on
            if k >= 2100:
                rb = 0
            lp = point + [0.0, 0.01 * min(1.0, max(0.0, (k - 600) / 600.0)), 0.001]
            lb = 1 if 300 <= k < 2000 else 0
            plan.append((rp, rq, rb, lp, lb))
        t0 = time.monotonic()
        for k, (rp, rq, rb, lp, lb) in enumerate(plan):
            push.send(_sample(RIGHT, k, rp, rq, rb))
            push.send(_sample(LEFT, k, lp, one, lb))
            wait = t0 + (k + 1) * 1e-3 - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        time.sleep(0.5)
        push.close()
    finally:
        d.close()
    cli = [sys.executable, "-m", "suturesim.server.cli"]
    done = subprocess.run([*cli, "export", str(out), "--csv", str(tmp_path / "csv"), "--topics", "event"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    events = (tmp_path / "csv" / "events.csv").read_text()
    for what in ('""holds"":""needle""', '""holds"":""thread""', '""frac""', "clutch", "release"):
        assert what in events, (what, events)
    done = subprocess.run([*cli, "replay", str(out), "--to", "resimulate"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "EXACT" in done.stdout, done.stdout


@pytest.mark.long(cost=8)
def test_a_needle_let_go_in_the_air_falls_and_rests_on_the_tissue():
    scene = Scene()
    scene.tick(300)
    right = Hand(scene, RIGHT)
    right.take_needle_at(scene.arc / 4.0)
    swage, q = scene.needle()
    right.move_needle(swage + [0.0, 0.0, 0.02], q, 400)
    right.set(scene.poses[RIGHT][0], scene.poses[RIGHT][1], 0)        # opened 2 cm above the pad
    scene.tick(1500)
    assert [e["holds"] for e in scene.events("release")] == ["needle"]
    swage, q = scene.needle()
    wire = float(scene.loop.model.needle_par[NP_WIRE])
    # flat on the pad's top face: its swage and its tip a wire's radius above it
    assert abs(swage[2] - wire) < 1e-4 and abs(scene.arc_point(swage, q, scene.arc)[2] - wire) < 1e-4, swage


@pytest.mark.long(cost=12)
def test_a_needle_let_go_halfway_through_a_bite_stays_in_its_holes_and_is_taken_again():
    """The right hand drives the needle through the left edge and lets go of it there: the tissue holds it
    (its punctures keep it where they hold it, its tunnel keeps its direction), so it neither slides back out
    nor falls over; the hand takes it again where it held it and drives it on through the right edge."""
    scene = Scene()
    scene.tick(SETTLE_TICKS)
    right = Hand(scene, RIGHT)
    set_for_bite(scene, right, scene.arc / 4.0)
    right.drive(0.0, math.radians(60.0), 1500)                   # through the left edge, not yet the right
    scene.tick(100)
    assert [(e["pad"], e["side"]) for e in scene.events("puncture")] == [("left", "entry"), ("left", "exit")]
    s0, q0 = scene.needle()
    right.set(scene.poses[RIGHT][0], scene.poses[RIGHT][1], 0)    # let go
    scene.tick(1500)
    assert [e["holds"] for e in scene.events("release")] == ["needle"]
    assert not scene.events("needle_out"), "the needle slid out of its holes"
    swage, q = scene.needle()
    turned = math.degrees(2.0 * math.acos(min(1.0, abs(float(np.dot(q0, q))))))
    # it settles where the tissue's give lets it (about 3-5 mm and 20 degrees); let go in the air it falls 14 mm
    # and turns 90 degrees onto the pad
    assert np.linalg.norm(swage - s0) < 0.008 and turned < 35.0, (swage - s0, turned)
    assert scene.needle()[0][2] > 0.008                           # still standing in the tissue, swage up
    right.take_needle_at(scene.arc / 4.0)                         # where it held it
    scene.tick(HOLD_TICKS)
    swage, q = scene.needle()
    rel = qmul(qconj(Q_BITE), q)
    phi = math.remainder(2.0 * math.atan2(rel[3], rel[0]), 2.0 * math.pi)
    right.move_needle(CENTRE + rot(qmul(Q_BITE, [math.cos(phi / 2), 0.0, 0.0, math.sin(phi / 2)]),
                                   [0.0, -scene.radius, 0.0]),
                      qmul(Q_BITE, [math.cos(phi / 2), 0.0, 0.0, math.sin(phi / 2)]), 300)   # set back in the bite
    right.drive(phi, math.radians(100.0), 2000)
    scene.tick(200)
    punctures = [(e["pad"], e["side"]) for e in scene.events("puncture")]
    assert punctures == [("left", "entry"), ("left", "exit"), ("right", "entry"), ("right", "exit")], punctures


@pytest.mark.long(cost=30)
@pytest.mark.parametrize("tie", ["instrument", "hand"])
def test_the_trainee_bots_suture_by_hand_scored_from_what_the_loop_published(tie):
    """The trainee bot sutures suture-practice by hand and ties the knot with the instruments (the scene's needle
    driver and forceps; seed 1) or by hand (both devices hands; seed 0); server/assessment.py's Scorer reads what
    the loop published: every phase in its order, both marks hit within the FLS's 1 mm, a surgeon's knot, the
    wound closed and the needle let go only once the knot was tied, a score of 600 s less the time and the marks'
    millimetres, and every FLS benchmark passed."""
    from suturesim.server.assessment import SCORE_CUTOFF, Scorer

    # a seed whose suture is done: the bot's rate over many is `suturesim bench bot-rate`'s to measure
    scene, bot = trainee_in_process({"instrument": 1, "hand": 0}[tie], tie=tie)
    bot.watch_s = 2.0
    drive(scene, bot, bot.plan())
    assert bot.done[-1] == "watched", bot.done
    scorer = Scorer("suture-practice")
    for topic, payload in scene.out:
        scorer.feed_payload(topic, payload)
    a = scorer.attempt()
    assert list(a.phases) == ["needle grasped", "bite 1", "bite 2", "pulled through", "throw 1", "throw 2",
                              "cinched"]
    assert list(a.phases.values()) == sorted(a.phases.values())
    assert [(p.target, p.side) for p in a.placements] == [("entry", "entry"), ("exit", "exit")]
    assert all(p.offset_mm < 1.0 for p in a.placements), a.placements
    assert a.knot == "surgeon's knot" and a.closed_at_end and a.needle_drops == 0
    assert (a.extra_punctures, a.withdrawals) == (0, 0)
    assert all(u.path_m > 0.1 for u in a.tools), a.tools
    assert a.score == pytest.approx(SCORE_CUTOFF - a.completed_s - sum(p.offset_mm for p in a.placements))
    assert a.passed, a.checks


@pytest.mark.long(cost=30)
def test_an_instrument_tie_holds_the_wound_closed_10_s_after_both_hands_let_go():
    """The trainee bot of seed 1 (its needle moved and turned on the pad) with suture-practice's own tools, a needle
    driver right and forceps left: after its suture, the instrument tie. The double throw: the needle's strand
    wound 2.5 times round the driver's jaw, the jaw taking the tail's very end and drawn back through the wraps,
    each end pulled to its own side; the driver lets go. The opposite throw: the jaw takes the tail's end again,
    lined up along it, brings it back over the wound, the strand wound 1.5 times round the jaw the other way, the
    jaw drawn back through the wrap, the ends pulled crossed. The server reads a double throw, then a surgeon's
    knot; the wound closes, and 10 s after both hands let go the knot and the wound are as they were. While the
    knot lies alone, its friction and solve no longer converging toward the scene's `contact.settle`, the
    scene's `contact.stall` ends each substep's contact rounds after about two of its six (without it every
    substep ran all six: 24 a tick)."""
    from suturesim.solver.timers import STAGES
    from suturesim.tools.bench_bot_rate import ROUND_KEYS
    from suturesim.tools.trainee_bot import perturbation

    scene, bot = trainee_in_process(1, perturbation(1))
    drive(scene, bot, bot.plan())
    assert bot.done[-5:] == ["double throw", "driver clear", "second throw", "let go", "watched"], bot.done
    # Timing's rows: the step's µs, the stages, then ROUND_KEYS; the watch's last 9 s
    column = 1 + len(STAGES) + ROUND_KEYS.index("contact rounds")
    rounds = scene.timing.rows[scene.timing.n - 9000:scene.timing.n, column]
    assert rounds.mean() < 12.0, rounds.mean()
    rep = bot.report(None, 0.0, 0.0)
    assert rep["knots"][-2:] == ["double throw", "surgeon's knot"] and rep["gap_closed"], rep
    assert not rep["gap_opened_after_release"] and not rep["knot_changed_after_release"], rep
    assert rep["gap_at_end"] < 1e-3 and not [g for g in bot.st["grasps"]], rep


def test_the_loops_state_is_the_bytes_encode_state_makes_of_the_same_values():
    """The loop builds its `state` in the wire's own form and packs it unchecked (protocol.encode_canonical_state);
    mid-suture (the needle held, punctures on the thread, two tools) those are the bytes the checked
    encoder makes of the same values given in any order and type."""
    import msgpack

    from suturesim.tools.bench_bot_rate import watching
    from suturesim.tools.trainee_bot import perturbation

    scene = Scene(perturbation(1))
    bot = watching(scene, 1)
    drive(scene, bot, bot.plan(), until="drawn through")
    st = scene.loop.state
    payload = scene.loop.builder.state(scene.loop.seq, st)
    m = msgpack.unpackb(payload)

    def loose(v):   # maps with their keys reversed, lists of numbers as arrays
        if isinstance(v, dict):
            return {k: loose(v[k]) for k in reversed(list(v))}
        if isinstance(v, list):
            return np.array(v) if v and all(type(c) is float for c in v) else [loose(c) for c in v]
        return v
    assert m["tissue"]["punctures"] and len(m["tools"]) == 2 and [g["holds"] for g in m["grasps"]] == ["needle"]
    again = protocol.encode_state(np.int64(m["seq"]), np.float64(m["t"]), st.x, list(st.tension), m["twist"],
                                  loose(m["grasps"]), m["contacts"], loose(m["energy"]), loose(m["solver"]),
                                  tissue=loose(m["tissue"]), needle=loose(m["needle"]), tools=loose(m["tools"]),
                                  parted=m.get("parted"))
    assert again == payload
