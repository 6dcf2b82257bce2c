"""The step's stage timers, as MuJoCo's mjData.timer: how long each stage of a tick took, summed over its
substeps into ``state.stats`` from STAT_TIMERS on (solver/integrator.py), in the CPU's time-stamp counter's
cycles, read inside the kernels without leaving machine code (one instruction, no call, no allocation: about
twenty reads a substep cost well under a microsecond a tick). :func:`seconds_per_cycle` turns them into seconds.

The counter is x86's (RDTSC, constant-rate on every x86 CPU this project targets; other machines read zero:
the timers then say nothing, the step is unchanged). It counts wall time, so a stage the OS preempted counts
the preemption too, as the loop's own tick times do."""
from __future__ import annotations

import platform
import time

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# the stages, in the order their timers follow STAT_TIMERS in state.stats
STAGES = ("drive", "forces", "predict", "solve", "contact", "tools", "tissue", "commit", "neighbours", "masses")
TM_DRIVE, TM_FORCES, TM_PREDICT, TM_SOLVE, TM_CONTACT, TM_TOOLS, TM_TISSUE, TM_COMMIT, TM_NEIGHBOURS, \
    TM_MASSES = range(len(STAGES))
N_TIMERS = len(STAGES)

HAS_COUNTER = platform.machine().lower() in ("x86_64", "amd64")

if HAS_COUNTER:
    @intrinsic
    def _counter(typingctx):
        def codegen(context, builder, signature, args):
            fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(ir.IntType(64), []))
            return builder.call(fn, [])
        return types.int64(), codegen

    @njit(cache=True, inline="always")
    def cycles() -> int:
        """The time-stamp counter (cycles)."""
        return _counter()
else:
    @njit(cache=True, inline="always")
    def cycles() -> int:
        """No counter on this machine: 0."""
        return 0


_SECONDS_PER_CYCLE: float | None = None


def seconds_per_cycle() -> float:
    """Seconds per counter cycle, measured once (20 ms against the monotonic clock); 0 without a counter."""
    global _SECONDS_PER_CYCLE
    if _SECONDS_PER_CYCLE is None:
        _SECONDS_PER_CYCLE = 0.0
        if HAS_COUNTER:
            cycles()
            c0, t0 = cycles(), time.perf_counter_ns()
            while time.perf_counter_ns() - t0 < 20_000_000:
                pass
            c1, t1 = cycles(), time.perf_counter_ns()
            if c1 > c0:
                _SECONDS_PER_CYCLE = (t1 - t0) * 1e-9 / (c1 - c0)
    return _SECONDS_PER_CYCLE
