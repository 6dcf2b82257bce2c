"""The trainee bot (tools/trainee_bot.py) sutures `suture-practice` by hand on `suturesim serve --device remote`:
a client of the public protocol alone, in its own process, the needle's start pose and the bot's own start poses,
grasp point and pace perturbed by each run's seed. It takes the needle, bites through both edges, hands the
needle over at its tip, draws the thread through, ties a surgeon's knot by hand and lets go, and watches 10 s.

Timed (it needs the machine's two cores: the server's loop and the bot's own 1 kHz loop). Three seeds run here:
in every one the server's events must show the steps up to the double throw seated (the grasps, four punctures
in order, the thread through, a double throw read and the wound closed); in at least one, the whole suture (a
surgeon's knot read, the wound still closed 10 s after both hands let go). How often the whole suture succeeds
is measured over ten seeds by `suturesim bench bot` (docs/BENCHMARKS.md Sec. 9), not here: three runs cannot
tell 80 % from 60 %, and ten take the suite past its time."""
from __future__ import annotations

import pytest

from suturesim.tools.bench_bot import run_bot

SEEDS = (0, 1, 2)


@pytest.mark.long(cost=160)
@pytest.mark.timed
def test_the_trainee_bot_sutures_and_ties_a_surgeons_knot_that_holds():
    runs = [run_bot(seed, print) for seed in SEEDS]
    for r in runs:
        assert r.error is None, (r.seed, r.error)                       # the bot ran to its end and reported
        rep = r.report
        assert not (rep["failure"] or "").startswith("the bot broke"), rep
        assert "double throw" in rep["done"], rep                      # its own check of the server's events
        assert rep["grasps"][:3] == [["stylus0", "needle"], ["stylus1", "needle"], ["stylus0", "thread"]], rep
        assert rep["punctures"] == [["left", "entry"], ["left", "exit"], ["right", "entry"], ["right", "exit"]], rep
        assert "double throw" in rep["knots"] and rep["gap_closed"], rep
    done = [r for r in runs if r.ok]
    assert done, [(r.seed, r.report["failure"], r.report["knots"], r.report["knot_at_end"],
                   r.report["gap_opened_after_release"]) for r in runs]
    for r in done:
        assert r.report["knots"][-1] == "surgeon's knot" and not r.report["knot_changed_after_release"], r.report
