"""What this machine alone does to a tick of fixed work: the floor under a tick-time percentile.

A tick's p99 is the solver's work and the machine's interruptions together: a shared VM's host takes its CPU away,
or runs it slow, for milliseconds at a time, and a tick caught in one is late by that much whatever it computes.
This probe tells the two apart on the machine and in the run the benchmark measures: one spawned process with
the server loop's scheduling (SCHED_FIFO at its priority, pinned to its CPU) runs the server's wait
(server/physics.py wait_until, spin_allowed) and, once a tick, the same computation of about ``work_us`` (a
numba kernel over a flat array, its repetitions calibrated first), and times each. The computation never changes,
so its spread is the machine's. `suturesim bench bot` prints it beside the server's tick (docs/BENCHMARKS.md
Sec. 9).
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..server.config import LoopConfig

PROBE_CELLS = 1024          # the kernel's array: 8 KB, in L1 like a thread's positions
CALIBRATION_RUNS = 200      # runs timed to size the work
SLOW_FACTOR = 2.0           # a tick whose work took more than this times its median was slowed by the machine


@njit(cache=True)
def fixed_work(a: np.ndarray, repeats: int, out: np.ndarray) -> None:
    """The same arithmetic every call: ``repeats`` passes of a multiply-add over ``a``, the sum into out[0]
    (kept so the passes are not optimised away). About 1 µs a pass over PROBE_CELLS cells."""
    s = 0.0
    for _ in range(repeats):
        for i in range(a.shape[0]):
            s = s * 0.999999 + a[i]
    out[0] = s


@dataclass(frozen=True)
class MachineFloor:
    """The probe's result for a fixed work of about ``work_us``: its time per tick (µs) over ``ticks`` ticks, and
    the ticks it took more than SLOW_FACTOR times its median (``slowed``) or more than a whole tick
    (``over_tick``)."""
    work_us: float       # the work asked for (µs)
    seconds: float
    ticks: int
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    slowed: int
    over_tick: int
    realtime: bool
    cpu: int

    @property
    def p99_over_p50(self) -> float:
        return self.p99_us / self.p50_us if self.p50_us > 0.0 else float("nan")


def _repeats_for(work_us: float, a: np.ndarray, out: np.ndarray) -> int:
    """Repetitions of fixed_work that take about ``work_us`` (µs): the median of CALIBRATION_RUNS timed runs of a
    known count, scaled."""
    trial = 64
    times = np.empty(CALIBRATION_RUNS)
    for k in range(CALIBRATION_RUNS):
        t0 = time.perf_counter_ns()
        fixed_work(a, trial, out)
        times[k] = time.perf_counter_ns() - t0
    per = float(np.median(times)) / 1000.0 / trial
    return max(1, int(round(work_us / per)))


def _probe_main(seconds: float, work_us: float, tick_ns: int, spin_ns: int, priority: int, cpu: int,
                results) -> None:
    from ..server.physics import (BUSY_AVERAGE_SHIFT, CATCH_UP_TICKS, rt_duty_limit, set_realtime, spin_allowed,
                                  wait_until)

    realtime, pinned, _ = set_realtime(priority, cpu) if priority > 0 else (False, -1, [])
    a = np.linspace(0.0, 1.0, PROBE_CELLS)
    out = np.zeros(1)
    fixed_work(a, 1, out)   # compiled (or loaded) before anything is timed
    repeats = _repeats_for(work_us, a, out)
    duty = rt_duty_limit() if realtime else 1.0
    n = max(1, int(seconds * 1e9 / tick_ns))
    work = np.empty(n)
    gc.collect()
    gc.disable()
    busy_ns = 0
    t0 = time.monotonic_ns() + tick_ns
    for k in range(n):
        deadline = t0 + k * tick_ns
        wait_until(deadline, spin_allowed(spin_ns, tick_ns, busy_ns, duty))
        start = time.monotonic_ns()
        if start - deadline > CATCH_UP_TICKS * tick_ns:   # as the server: re-anchor a schedule too far behind
            t0 = start - k * tick_ns
        fixed_work(a, repeats, out)
        end = time.monotonic_ns()
        work[k] = (end - start) / 1000.0
        busy_ns += (end - start - busy_ns) >> BUSY_AVERAGE_SHIFT
    gc.enable()
    p50 = float(np.median(work))
    results.put(dict(work_us=float(work_us), seconds=float(seconds), ticks=n, p50_us=p50,
                     p99_us=float(np.percentile(work, 99)), p999_us=float(np.percentile(work, 99.9)),
                     max_us=float(work.max()),
                     slowed=int((work > SLOW_FACTOR * p50).sum()), over_tick=int((work > tick_ns / 1000.0).sum()),
                     realtime=realtime, cpu=pinned))


def measure_floor(seconds: float, work_us: float, loop: LoopConfig) -> MachineFloor:
    """Run the probe for ``seconds`` (s) with a fixed work of about ``work_us`` (µs) a tick, in a process of its
    own scheduled as ``loop`` schedules the server's loop: its tick and spin, SCHED_FIFO at its priority if it is
    real time (else normal scheduling), pinned to its CPU (-1: the last, as the loop picks). Blocks until it
    reports."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    args = (seconds, work_us, int(round(loop.tick_s * 1e9)), int(round(loop.spin_us * 1000)),
            loop.priority if loop.realtime else 0, loop.cpu, results)
    proc = ctx.Process(target=_probe_main, args=args, name="machine-probe", daemon=True)
    proc.start()
    try:
        return MachineFloor(**results.get(timeout=seconds + 120.0))
    finally:
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
