"""The machine probe (tools/machine_probe.py): a fixed computation a tick in the server loop's wait, whose spread is
the machine's, and its row beside the trainee bot's tick in `suturesim bench bot`."""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.server.config import LoopConfig
from suturesim.tools.bench_bot import PROBE_WORK_US, BotBench, BotRun, render_bot
from suturesim.tools.machine_probe import MachineFloor, fixed_work, measure_floor


def test_the_fixed_work_is_the_same_arithmetic_every_call():
    a = np.linspace(0.0, 1.0, 64)
    out1, out2 = np.zeros(1), np.zeros(1)
    fixed_work(a, 3, out1)
    fixed_work(a, 3, out2)
    s = 0.0
    for _ in range(3):
        for v in a:
            s = s * 0.999999 + v
    assert out1[0] == out2[0] == s


@pytest.mark.timed   # the work is sized by timing it, on a machine running nothing else
def test_the_probe_sizes_its_work_and_counts_every_tick():
    m = measure_floor(1.0, 200.0, LoopConfig(realtime=False))
    assert m.ticks == 1000 and not m.realtime and m.cpu == -1
    # sized from the median of its own timed runs: the ticks' median lands near the work asked for
    assert 100.0 <= m.p50_us <= 400.0, m
    assert m.p50_us <= m.p99_us <= m.p999_us <= m.max_us
    # the counts agree with the percentiles: fewer ticks than 1 % past 2 x p50 if the p99 is below it, and the
    # ticks over a whole tick are among them
    assert m.over_tick <= m.slowed or m.p50_us > 500.0
    if m.p99_us < 2.0 * m.p50_us:
        assert m.slowed <= 0.01 * m.ticks


def test_bench_bot_prints_the_machines_floor_beside_the_servers_tick():
    machine = MachineFloor(seconds=60.0, ticks=60000, p50_us=301.0, p99_us=640.0, p999_us=2600.0, max_us=9000.0,
                           slowed=1100, over_tick=120, realtime=True, cpu=1)
    run = BotRun(0, report={"done": []}, stats=[])
    table = render_bot(BotBench([run], machine))
    assert (f"| about {PROBE_WORK_US:.0f} µs | 60000 | 301 | 640 | 2600 | 9000 | 2.13 | 1100 (1.83 %) "
            "| 120 (0.20 %) |") in table
    assert any("SCHED_FIFO, CPU 1" in line for line in table)
    assert not any("fixed work a tick" in line for line in render_bot(BotBench([run])))
