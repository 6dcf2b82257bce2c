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
    """One row a size of fixed work, in the order measured, under the loop's scheduling as the probe ran it."""
    floors = tuple(MachineFloor(work_us=w, seconds=20.0, ticks=20000, p50_us=w + 1.0, p99_us=640.0 + w,
                                p999_us=2600.0, max_us=9000.0, slowed=1100, over_tick=120, realtime=True, cpu=1)
                   for w in PROBE_WORK_US)
    run = BotRun(0, report={"done": []}, stats=[])
    table = render_bot(BotBench([run], floors))
    rows = [line for line in table if line.startswith("| about ")]
    assert rows[-1] == (f"| about {PROBE_WORK_US[-1]:.0f} µs | 20000 | {PROBE_WORK_US[-1] + 1:.0f} "
                        f"| {640 + PROBE_WORK_US[-1]:.0f} | 2600 | 9000 | "
                        f"{(640 + PROBE_WORK_US[-1]) / (PROBE_WORK_US[-1] + 1):.2f} | 1100 (5.50 %) | 120 (0.60 %) |")
    assert [r.split(" | ")[0] for r in rows] == [f"| about {w:.0f} µs" for w in PROBE_WORK_US]
    assert any("SCHED_FIFO, CPU 1" in line for line in table)
    assert not any("fixed work a tick" in line for line in render_bot(BotBench([run])))
