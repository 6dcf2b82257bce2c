"""The solver's stage timers (solver/timers.py): each stage of a tick timed inside the kernels, as MuJoCo's
mjData.timer, and what `suturesim serve` and `suturesim bench tissue` make of them."""
from __future__ import annotations

import time

import numpy as np
import pytest

from suturesim.solver.integrator import STAT_SLOTS, STAT_TIMERS, Stepper, warm_up
from suturesim.solver.scenario import load_scenario
from suturesim.solver.timers import HAS_COUNTER, N_TIMERS, STAGES, TM_TOOLS, seconds_per_cycle

needs_counter = pytest.mark.skipif(not HAS_COUNTER, reason="no time-stamp counter on this machine")


@needs_counter
def test_the_counter_runs_at_a_cpu_clock_rate():
    ns = seconds_per_cycle() * 1e9
    assert 0.1 < ns < 10.0, ns     # 0.1-10 GHz
    assert seconds_per_cycle() == seconds_per_cycle()   # measured once


@needs_counter
def test_a_tick_times_every_stage_it_runs_within_its_own_time():
    """The scripted suture with its needle through the tissue: every stage runs and takes time, tools aside (the
    scene has none); the stages, inside the tick, add up to no more than the tick's own time."""
    sc = load_scenario("simple-interrupted-suture")
    state = sc.new_state()
    warm_up(sc.model, sc.new_state())
    stepper = Stepper(sc.model, state)
    assert state.stats.shape == (STAT_SLOTS + N_TIMERS,) and STAT_TIMERS == STAT_SLOTS
    us = seconds_per_cycle() * 1e6
    sums = []
    for k in range(2500):    # to 2.5 s: the needle's tip is through the first pad
        t0 = time.perf_counter_ns()
        stepper.tick()
        wall = (time.perf_counter_ns() - t0) / 1e3
        stages = state.stats[STAT_TIMERS:] * us
        assert stages.sum() <= 1.01 * wall, (k, stages, wall)
        sums.append(stages)
    last = np.array(sums[-100:]).mean(axis=0)
    ran = [name for k, name in enumerate(STAGES) if last[k] > 0.0]
    assert set(STAGES) - set(ran) <= {STAGES[TM_TOOLS]}, dict(zip(STAGES, last))
    assert last.sum() > 0.0


def test_the_timers_are_zeroed_at_each_tick_and_change_nothing_else():
    """A tick's timers are its own, not summed across ticks; and the state the step leaves is the same whatever the
    timers read: two steppers of the same scene agree bit for bit on everything but the timers."""
    sc = load_scenario("simple-interrupted-suture")
    a, b = sc.new_state(), sc.new_state()
    sa, sb = Stepper(sc.model, a), Stepper(sc.model, b)
    for _ in range(300):
        sa.tick()
        sb.tick()
    b.stats[STAT_TIMERS:] = 1e15   # what a tick finds there does not matter
    sa.tick()
    sb.tick()
    assert (b.stats[STAT_TIMERS:] < 1e14).all()
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.stats[:STAT_TIMERS], b.stats[:STAT_TIMERS])
