"""The trainee bot (tools/trainee_bot.py) sutures `suture-practice` by hand on `suturesim serve --device remote`:
a client of the public protocol alone, in its own process, the needle's start pose and the bot's own start poses,
grasp point and pace perturbed by each run's seed. It takes the needle, bites through both edges, hands the
needle over at its tip, draws the thread through, ties an instrument tie with the scene's needle driver and
forceps (a surgeon's double throw and the opposite single throw on it), lets go and watches 10 s.

Timed (it needs the machine's two cores: the server's loop and the bot's own 1 kHz loop). Two seeds run here:
in both the server's events must show the needle's steps (the grasps, four punctures in order, the thread drawn
through); in one at least, the whole suture (the instrument's double throw read as one, a surgeon's knot read, the
wound closed and still closed 10 s after both hands let go). A wound throw that does not catch is the closed
loop's failure to expect now and then, not a broken bot: `suturesim bench bot` has seen a throw fail in 2 of 10
runs, and `suturesim bench bot-rate` does the whole suture in 78 % of its runs, so two runs both failing is about
one try in 20 and the suite's second try (tests/conftest.py) makes it about one in 400. The bot ties
looking at what the server reads, so a throw that failed is followed by the one the knot then read calls for; a
throw that leaves a half knot or another knot ends the run. The whole suture in process, bit for bit, is
tests/test_suture_by_hand.py's; how often it succeeds is measured over ten seeds by `suturesim bench bot`
(docs/BENCHMARKS.md Sec. 9) and over sixty in process by `suturesim bench bot-rate` (Sec. 11), not here: two
runs cannot tell 80 % from 60 %, and ten take the suite past its time."""
from __future__ import annotations

import math

import numpy as np
import pytest

from suturesim.solver.timers import STAGES
from suturesim.tools.bench_bot import (BotBench, BotRun, render_bot, render_phases, render_step_stages,
                                       run_bot)

SEEDS = (0, 1)


@pytest.mark.long(cost=110)
@pytest.mark.timed
def test_the_trainee_bot_sutures_and_ties_a_surgeons_knot_that_holds():
    runs = [run_bot(seed, print) for seed in SEEDS]
    for r in runs:
        assert r.error is None, (r.seed, r.error)                       # the bot ran to its end and reported
        rep = r.report
        assert not (rep["failure"] or "").startswith("the bot broke"), rep
        assert "drawn through" in rep["done"], rep                     # its own check of the server's events
        assert rep["grasps"][:3] == [["stylus0", "needle"], ["stylus1", "needle"], ["stylus0", "thread"]], rep
        assert rep["punctures"] == [["left", "entry"], ["left", "exit"], ["right", "entry"], ["right", "exit"]], rep
    for r in runs:
        if "double throw" in r.report["done"]:   # the bot's own look agrees with what the server read
            assert "double throw" in r.report["knots"], r.report
    done = [r for r in runs if r.ok]
    assert done, [(r.seed, r.report["failure"], r.report["knots"], r.report["knot_at_end"],
                   r.report["gap_opened_after_release"]) for r in runs]
    for r in done:
        assert "double throw" in r.report["done"] and "double throw" in r.report["knots"], r.report
        assert r.report["knots"][-1] == "surgeon's knot" and not r.report["knot_changed_after_release"], r.report


def _second(t: float, step_p50: float, tick_p99: float) -> dict:
    """One second of the server's `stats` as `suturesim bench bot` reads it: its histograms 989 ticks at the p50
    and 11 at the p99 (10 µs bins)."""
    stage = {"p50": 10.0, "p99": 20.0, "max": 30.0}

    def hist(p50: float, p99: float) -> list[int]:
        h = [0] * 200
        h[min(int(p50 // 10), 199)] += 989
        h[min(int(p99 // 10), 199)] += 11
        return h
    return {"t": t, "ticks": 1000, "overruns": 0,
            "step_us": {"p50": step_p50, "p99": 2 * step_p50, "max": 0.0, "hist": hist(step_p50, 2 * step_p50)},
            "tick_us": {"p50": step_p50 + 100.0, "p99": tick_p99, "max": 0.0,
                        "hist": hist(step_p50 + 100.0, tick_p99)},
            "inputs_us": stage, "watch_us": stage, "outputs_us": stage}


def test_bench_bot_splits_the_servers_seconds_by_the_step_the_bot_was_working_toward():
    run = BotRun(0, report={"done": ["needle taken", "bite", "watched"], "done_t": [1.5, 3.0, 6.0]},
                 stats=[_second(1.0, 100.0, 300.0), _second(2.0, 200.0, 400.0), _second(3.0, 300.0, 500.0),
                        _second(4.0, 400.0, 900.0), _second(5.0, 420.0, 950.0), _second(7.0, 999.0, 9999.0)])
    # a second counts toward the step the bot had not yet marked when it ended; one after the last mark, none
    assert [(name, [m["t"] for m in seconds]) for name, seconds in run.phases()] == [
        ("needle taken", [1.0]), ("bite", [2.0, 3.0]), ("watched", [4.0, 5.0])]
    # two runs pooled: the medians of the seconds' p50; the p99 over their ticks, the top of its 10 µs bin (of
    # 4000 ticks, the 3960th: past the 3956 at the seconds' p50, among the slow ones of the faster second); the
    # largest p99 of a second
    rows = render_phases([run, run])
    assert rows == [["needle taken", "2", "100 / 210 / 200", "200 / 310 / 300", "10 / 100 / 10 / 10"],
                    ["bite", "4", "250 / 410 / 600", "350 / 410 / 500", "10 / 250 / 10 / 10"],
                    ["watched", "4", "410 / 810 / 840", "510 / 910 / 950", "10 / 410 / 10 / 10"]]
    table = render_bot(BotBench([run]))
    assert "| watched | 2 | 410 / 810 / 840 | 510 / 910 / 950 | 10 / 410 / 10 / 10 |" in table
    # the run's own row, all six seconds: the p99 over their 6000 ticks is the 5940th, past the 5000 under 1 ms,
    # among the last second's 989 at 1099 µs (its bin's top: 1100 µs)
    assert any(line.startswith("| 0 | **no** |") and "| 450 / 1100 / 9999 / 0 |" in line for line in table), table
    # a run whose bot reported no step times (it failed before the first) adds no row
    assert render_phases([BotRun(1, report={"done": []}, stats=[_second(1.0, 1.0, 1.0)])]) == []


def test_bench_bot_says_where_the_step_goes_by_the_step_the_bot_was_working_toward():
    """The server's `step_stages_us` (each stage's mean µs a tick over a second), averaged over the seconds of each
    step of the suture, every run pooled; no table from a server that reported none."""
    def second(t: float, contact: float, rounds: float | None = None) -> dict:
        m = _second(t, 100.0, 300.0)
        m["step_stages_us"] = {name: (contact if name == "contact" else 1.0) for name in STAGES}
        if rounds is not None:
            m["rounds"] = {"contact": rounds, "contact_out": rounds / 6.0, "tissue": 1.0, "tissue_out": 0.0}
        return m
    run = BotRun(0, report={"done": ["bite", "watched"], "done_t": [2.5, 6.0]},
                 stats=[second(1.0, 10.0), second(2.0, 30.0), second(4.0, 100.0, 3.0), second(5.0, 200.0, 6.0)])
    rows = render_step_stages([run, run])
    ones = ["1"] * (len(STAGES) - 1)
    at = STAGES.index("contact")
    # the rounds: the mean over the seconds that reported them (4.5 a substep, 75 % run out), - if none did
    assert rows == [["bite"] + ones[:at] + ["20"] + ones[at:] + ["29", "-", "-"],
                    ["watched"] + ones[:at] + ["150"] + ones[at:] + ["159", "4.5 (75 %)", "1.0 (0 %)"]]
    assert "| watched | " + " | ".join(ones[:at] + ["150"] + ones[at:]) + " | 159 | 4.5 (75 %) | 1.0 (0 %) |" in \
        render_bot(BotBench([run]))
    bare = BotRun(0, report=run.report, stats=[_second(1.0, 100.0, 300.0)])
    assert render_step_stages([bare]) == []
    assert not any("step_stages_us" in line for line in render_bot(BotBench([bare])))


class _Still:
    """A sight whose `state` reads ``knot`` (what the server would say) and never changes by itself."""

    def __init__(self, knot: str):
        self.state, self.events = {"t": 0.0, "tissue": {"knot": knot}}, []

    def look(self) -> None:
        pass


def _tie(outcomes: list[str | None]):
    """Run Trainee.instrument_tie against a sight whose knot each throw sets, from ``outcomes`` in turn (the knot
    read once the throw's cinch is held; None: its jaw missed, the knot unchanged). A throw fails (BotFailed, as
    the bot's own checks do) unless the knot read is the one it makes. Returns (the bot, the throws in order, the
    run's failure or None, whether the hands let go and watched, the driver's heights as each throw began)."""
    from suturesim.tools.trainee_bot import BotFailed, Trainee

    bot = Trainee.with_eyes(_Still("unknot"), 0)
    right = bot.hands["stylus0"]
    thrown, heights, watched = [], [], []
    makes = {"double throw": "double throw", "opposite throw": "surgeon's knot"}

    def throw_of(step):
        def throw():
            thrown.append(step)
            heights.append(float(right.pos[2]))
            right.buttons = 1   # the jaw holds the tail
            yield
            out = outcomes[len(thrown) - 1]
            if out is not None:
                bot.eyes.state["tissue"]["knot"] = out
            if out != makes[step]:
                raise BotFailed(f"reads {bot.knot_now()}")
        return throw

    def watch():
        watched.append(True)
        yield

    bot.instrument_double_throw = throw_of("double throw")
    bot.instrument_opposite_throw = throw_of("opposite throw")
    bot.let_go_and_watch = watch
    failure = None
    try:
        for _ in bot.instrument_tie():
            pass
    except BotFailed as exc:
        failure = str(exc)
    return bot, thrown, failure, bool(watched), heights


def test_the_instrument_tie_throws_what_the_knot_read_calls_for():
    from suturesim.tools.trainee_bot import REDO_RISE, TIE_THROWS

    bot, thrown, failure, watched, _ = _tie(["double throw", "surgeon's knot"])
    assert thrown == ["double throw", "opposite throw"] and failure is None and watched and not bot.redone
    # the opposite throw missed, the double throw still read: the opposite throw again, the driver having let go
    # of the tail and risen clear first
    bot, thrown, failure, watched, heights = _tie(["double throw", None, "surgeon's knot"])
    assert thrown == ["double throw", "opposite throw", "opposite throw"] and failure is None and watched
    assert bot.redone == ["opposite throw: reads double throw"]
    assert heights[2] - heights[1] == pytest.approx(REDO_RISE) and bot.hands["stylus0"].buttons == 1
    # the opposite throw's cinch undid the double throw too: the tie from the start
    bot, thrown, failure, watched, _ = _tie(["double throw", "unknot", "double throw", "surgeon's knot"])
    assert thrown == ["double throw", "opposite throw", "double throw", "opposite throw"] and watched
    assert bot.redone == ["opposite throw: reads unknot"]
    # a half knot no throw mends: the run ends, saying so, and the hands do not let go to watch
    bot, thrown, failure, watched, _ = _tie(["double throw", "half knot"])
    assert thrown == ["double throw", "opposite throw"] and not watched and not bot.redone
    assert failure == "opposite throw: reads half knot; let go, it reads half knot"
    # never caught: TIE_THROWS throws, then the run ends
    bot, thrown, failure, watched, _ = _tie(["unknot"] * TIE_THROWS)
    assert thrown == ["double throw"] * TIE_THROWS and not watched and len(bot.redone) == TIE_THROWS - 1
    assert failure == f"double throw: reads unknot: {TIE_THROWS} throws, and the server reads unknot"


def _thread_through(knot_u: float) -> list[float]:
    """A thread along x at 1 mm spacing, 3 mm up, with a loop whose strand crosses the thread at x = ``knot_u``
    (m): what the bot sees as a knot there."""
    pts = [[-0.030 + 0.001 * k, 0.0, 0.003] for k in range(61)]
    loop = [[knot_u + 0.004 * math.sin(a), 0.004 * (1.0 - math.cos(a)), 0.003 + 0.0005 * math.sin(a / 2)]
            for a in np.linspace(0.5, 2 * math.pi - 0.5, 20)]
    x = pts[:31 + int(round(knot_u * 1000))] + loop + pts[31 + int(round(knot_u * 1000)):]
    return [c for p in x for c in p]


def test_the_bot_sees_the_knot_where_strands_cross_and_keeps_a_crossed_cinch_over_the_wound():
    """Trainee.knot_at: the middle of the vertices within KNOT_NEAR of a vertex more than KNOT_APART along the
    thread; none on a thread that crosses nothing. A centred cinch (the opposite throw's) shifts both hands along
    the pull against the knot's drift from the wound's centre, at most CINCH_SHIFT_MAX; an uncentred one (the
    double throw's) pulls to where it was told."""
    from suturesim.tools.trainee_bot import CINCH_SHIFT_MAX, IT_CINCH_TICKS, Trainee

    sight = _Still("surgeon's knot")
    sight.state.update(x=[c for k in range(40) for c in (0.001 * k, 0.0, 0.003)],
                       needle={"pos": [0.0, 0.0, 0.02], "quat": [1.0, 0.0, 0.0, 0.0]})
    bot = Trainee.with_eyes(sight, 0)
    assert bot.knot_at() is None
    sight.state["x"] = _thread_through(0.005)
    assert bot.knot_at()[0] == pytest.approx(0.005, abs=1.5e-3)

    def pulled(centred: bool) -> tuple[np.ndarray, np.ndarray]:
        right, left = bot.hands["stylus0"], bot.hands["stylus1"]
        right.pos = np.array([0.0, 0.0, 0.02])
        left.pos, left.offset, left.q_rel = np.zeros(3), np.zeros(3), np.array([1.0, 0.0, 0.0, 0.0])
        plan = bot.cinch(np.array([0.047, 0.0, 0.003]), np.array([-0.047, 0.0, 0.003]), "surgeon's knot", 0,
                         centred=centred)
        for k, _ in enumerate(plan):
            if k == IT_CINCH_TICKS - 1:
                return right.pos.copy(), left.pos.copy()
            sight.state["t"] = k * 1e-3     # a new look every tick
        raise AssertionError("the cinch ended early")

    plain_r, plain_l = pulled(False)
    assert plain_r == pytest.approx([0.047, 0.0, 0.003]) and plain_l == pytest.approx([-0.047, 0.0, 0.003])
    # the knot 5 mm toward the tail's hand, and staying there: both hands shift the other way, to the bound
    centred_r, centred_l = pulled(True)
    assert centred_r == pytest.approx([0.047 - CINCH_SHIFT_MAX, 0.0, 0.003])
    assert centred_l == pytest.approx([-0.047 - CINCH_SHIFT_MAX, 0.0, 0.003])


def test_a_suture_is_done_only_with_the_wound_closed_at_the_end():
    """A wound that closed under the cinch and opened again before the hands let go is not a suture done."""
    done = {"failure": None, "punctures": [["left", "entry"], ["left", "exit"], ["right", "entry"],
                                           ["right", "exit"]],
            "knot_at_end": "surgeon's knot", "gap_closed": True, "closed_at_end": True,
            "gap_opened_after_release": False, "done": ["let go", "watched"]}
    assert BotRun(0, report=done).ok
    assert not BotRun(0, report={**done, "closed_at_end": False}).ok
    assert not BotRun(0, report={**done, "knot_at_end": "half knot"}).ok
    row = render_bot(BotBench([BotRun(0, report={**done, "closed_at_end": False}, stats=[])]))
    assert any("surgeon's knot; wound closed, open at the end" in line for line in row)


# -- `suturesim bench bot-rate`: the bot in process -------------------------------------------------------------
def test_the_bot_in_process_is_the_tests_harness_bit_for_bit_and_holds_back_the_share_of_samples_asked():
    """tools/bench_bot_rate.run_in_process with no sample held back runs what the tests' own harness runs
    (tests/suture_by_hand.py, whose hands are the bot's own poses each tick): the same report up to the needle
    taken. With 30 % of the samples held back, about 30 % are, and the hands still take the needle."""
    from suture_by_hand import trainee_in_process
    from suturesim.tools.bench_bot_rate import START_TICKS, drive, run_in_process
    from suturesim.tools.trainee_bot import perturbation

    plain = run_in_process(2, jitter=0.0, until="needle taken")
    scene, bot = trainee_in_process(2, perturbation(2))
    drive(scene, bot, bot.plan(), until="needle taken")
    theirs = bot.report(None, 0.0, 0.0)
    skip = ("cpu_s", "wall_s")
    assert {k: v for k, v in plain.items() if k not in skip + ("ok", "ticks", "held", "timing")} == \
        {k: v for k, v in theirs.items() if k not in skip}
    assert plain["done"] == ["needle taken"] and not plain["ok"] and plain["failure"] is None
    assert plain["ticks"] == scene.ticks > START_TICKS and plain["held"] == 0
    late = run_in_process(2, jitter=0.3, until="needle taken")
    assert late["done"] == ["needle taken"] and late["failure"] is None and late["grasps"] == plain["grasps"]
    plan = 2 * (late["ticks"] - START_TICKS)   # both hands' samples
    assert 0.25 * plan < late["held"] < 0.35 * plan, (late["held"], plan)


def test_bench_bot_rate_gives_the_rate_its_interval_and_where_the_runs_went_wrong():
    from suturesim.tools.bench_bot_rate import RateBench, render_bot_rate, wilson

    lo, hi = wilson(8, 10)
    assert abs(lo - 0.4902) < 1e-3 and abs(hi - 0.9433) < 1e-3
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    done = {"failure": None, "punctures": [["left", "entry"], ["left", "exit"], ["right", "entry"],
                                           ["right", "exit"]],
            "knot_at_end": "surgeon's knot", "closed_at_end": True, "gap_opened_after_release": False,
            "done": ["let go", "watched"], "ticks": 50000}
    reports = [{**done, "seed": s, "ok": True} for s in range(7)]
    reports += [{**done, "seed": 7, "ok": False, "failure": "opposite throw: the jaw drawn through the wraps, the "
                 "server reads other, not surgeon's knot"},
                {**done, "seed": 8, "ok": False, "knot_at_end": "half knot"},
                {**done, "seed": 9, "ok": False, "failure": "double throw: the jaw drawn through the wraps, ...: "
                 "4 throws, and the server reads unknot",
                 "redone": ["opposite throw: the surgeon's knot cinched, the server reads unknot", "double throw: ..."]}]
    text = "\n".join(render_bot_rate(RateBench(0.2, reports, 300.0, 2)))
    assert "| 10 | 0.2 | 7 | 70 % | 40-89 % | 500 s | 300 s on 2 cores |" in text
    # seed 9's run went wrong at the opposite throw, whose cinch undid the knot, not at the double throw after it
    assert "- the opposite throw failed its look: 2 (7, 9)" in text
    assert "- the knot loosened to half knot after the tie: 1 (8)" in text


def test_bench_bot_rate_times_the_ticks_and_says_where_the_slowest_steps_go():
    """Timing counts each tick in the `stats` histograms' 10 µs bins and keeps the stages of its slowest 1 % of
    steps apart; the table pools the runs: percentiles from the histograms summed, the means over the ticks."""
    from suturesim.solver.timers import STAGES
    from suturesim.tools.bench_bot_rate import ROUND_KEYS, Timing, render_timing

    timing = Timing(capacity=64)   # grown past its capacity on the way
    timers = np.zeros(len(STAGES))
    stats, contact = np.zeros(32), np.zeros(16)
    tissue = STAGES.index("tissue")
    for k in range(1000):
        slow = k % 100 == 0                      # 10 ticks of 1000: the slowest 1 %
        timers[:] = 0.0
        timers[tissue] = (300.0 if slow else 50.0) / timing.us_per_cycle
        timing.add((400_000 if slow else 150_000) + k, 200_000 + k, timers, stats, contact)
    got = timing.summary()
    assert sum(got["step_hist"]) == 1000 and got["step_hist"][15] == 990 and got["step_hist"][40] == 10
    assert got["slowest"]["ticks"] == 10 and abs(got["slowest"]["tissue"] - 3000.0) < 1e-6
    assert got["all"]["ticks"] == 1000 and abs(got["all"]["tissue"] - (3000.0 + 990 * 50.0)) < 1e-6
    lines = render_timing([got, got])
    # of 2000 steps the 1980th is the last of the 1980 in the 150-160 µs bin: its top, 160 µs
    assert any(line.startswith("| step | 160 | 160 | 160 |") for line in lines), lines
    slowest = next(line for line in lines if line.startswith("| slowest 1 % | 20 |"))
    assert slowest.split(" | ")[2 + tissue] == "300"
    assert len(slowest.split(" | ")) == 3 + len(STAGES) + len(ROUND_KEYS)
