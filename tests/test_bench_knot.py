"""tools/bench_knot.py, the measure of a knot held at the styluses: its knot core on constructed threads, and the
pull-and-hold run on the scene as shipped."""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.tools.bench_knot import (PULL_FORCE, REEF_ROWS, AudolyPull, KnotBench, KnotHold, SutureReef, knot_core,
                                         render_knot, run_hold)


def _hairpin(gap: float) -> np.ndarray:
    """Two parallel strands 20 mm long, ``gap`` (m) apart, in 1 mm segments, joined by one segment across."""
    a = np.stack([np.linspace(0.0, 0.02, 21), np.zeros(21), np.zeros(21)], axis=1)
    b = np.stack([np.linspace(0.02, 0.0, 21), np.full(21, gap), np.zeros(21)], axis=1)
    return np.concatenate([a, b])


def test_the_knot_core_is_the_thread_near_a_strand_that_is_not_its_neighbour():
    straight = np.stack([np.linspace(0.0, 0.02, 21), np.zeros(21), np.zeros(21)], axis=1)
    assert knot_core(straight, 2.25e-4, exclude=1) == 0.0
    # 0.5 mm apart, within 3 diameters of 0.225 mm (0.675 mm): both strands, not the segment joining them
    # (but the last 0.7 mm of each before the turn, whose nearest strand across is the turn itself)
    assert knot_core(_hairpin(5e-4), 2.25e-4, exclude=1) == pytest.approx(0.040, abs=0.002)
    assert knot_core(_hairpin(1e-3), 2.25e-4, exclude=1) == 0.0


def test_the_knot_as_shipped_is_pulled_to_the_force_limit_and_held_the_size_of_a_real_knot():
    """The scene's own contact (strands touching at the thread's diameter, friction started warm): both hands
    reach their 3 N pull, and over a short hold the thread neither freezes nor passes through itself, no segment's
    tension runs past 1.2 times the pull, and the knot's core is at most 10 mm of thread (a tight overhand knot of
    3-0 takes about 3.7 mm; strands touching at 3 mm, 49 mm). Friction started cold, the same hold freezes."""
    r = run_hold("as shipped", hold_s=0.3)
    assert r.diverged is None and np.isfinite(r.pulled_s), r
    assert r.pull == pytest.approx(PULL_FORCE, rel=0.05)
    assert r.frozen == 0 and r.crossings == 0 and r.unchecked == 0 and r.broke is None
    assert r.tension < 1.2 * r.pull
    assert r.held.size == 300 and 3.0 < r.core_mm <= 10.0 and r.core_mm == r.core_contact_mm
    cold = run_hold("cold", contact={"warm_friction": False}, hold_s=0.3)
    assert cold.frozen_held > 250


def test_the_audoly_pull_at_the_sutures_diameter_is_rendered_with_its_verdict():
    """The section's Audoly line says what the pull cost and whether its median ratio meets 0.5-2."""
    line = render_knot(KnotBench(audoly=AudolyPull(sim_s=9.0, wall_s=18.0, median=1.9, largest_mn=212.0)))
    text = "\n".join(line)
    assert "9.0 s simulated in 18.0 s of computing (2.00 s a simulated second)" in text
    assert "median F / F_Audoly 1.90 (meets)" in text and "largest pull 212 mN" in text
    off = "\n".join(render_knot(KnotBench(audoly=AudolyPull(sim_s=9.0, wall_s=18.0, median=2.4, largest_mn=1.0))))
    assert "(**misses**)" in off



def test_the_reef_knot_at_a_sutures_scale_is_a_row_per_contact():
    """The reef knot's table: one row per contact, in REEF_ROWS' order (the suture scenes' 1 mm first, then the
    diameter), saying whether it held; none without the pulls (--quick)."""
    assert [label for label, _ in REEF_ROWS][0].startswith("as shipped (1 mm") and REEF_ROWS[1][1]["diameter"]
    rows = [SutureReef(REEF_ROWS[0][0], "holds", 0.07, 0.011, 41, 0, 24.0),
            SutureReef(REEF_ROWS[1][0], "undone", 28.05, 0.006, 25, 0, 22.0)]
    text = "\n".join(render_knot(KnotBench(reef=rows)))
    assert f"| {REEF_ROWS[0][0]} | holds | 0.07 | 0.011 | 41 | 0 | 24 |" in text
    assert f"| {REEF_ROWS[1][0]} | undone | 28.05 | 0.006 | 25 | 0 | 22 |" in text
    assert text.index("holds |") < text.index("undone |")
    assert "reef-knot-suture" not in "\n".join(render_knot(KnotBench()))

def test_a_row_whose_thread_broke_says_where_and_when_and_misses():
    """A knot pulled past the thread's rated strength parts (solver/breakage.py); its loose ends are not counted as
    crossings, and the row says the thread broke instead."""
    ticks = np.full(100, 300.0)
    row = KnotHold(label="refined", distance_mm=0.225, pulled_s=1.7, ticks=ticks, held=ticks, substeps=16.0,
                   frozen=0, frozen_held=0, crossings=0, unchecked=0, pull=3.0, tension=3.3, force_rms=0.001,
                   core_mm=5.0, core_contact_mm=5.0, diameter_mm=0.225, broke=(1.882, 120, 21.72))
    text = "\n".join(render_knot(KnotBench(rows=[row])))
    assert "| refined; the thread broke at segment 120 under 21.7 N at 1.882 s |" in text
    assert "- refined: **misses** the thread whole." in text
    whole = KnotHold(**{**row.__dict__, "broke": None})
    assert "- refined: meets every target." in "\n".join(render_knot(KnotBench(rows=[whole])))
    # broken before the hold: what only a hold measures is not judged, the missing hold is
    early = KnotHold(**{**row.__dict__, "held": np.zeros(0), "pull": float("nan"), "tension": float("nan")})
    early_text = "\n".join(render_knot(KnotBench(rows=[early])))
    assert "- refined: **misses** the thread whole, a hold." in early_text
    # what it never measured is a dash, not nan
    assert "nan" not in early_text and "| 0 (0) | 0 | - | - | 1.00 | 5.0 | 5.0 |" in early_text
