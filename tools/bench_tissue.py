"""`suturesim bench tissue`: what the needle, the tissue and the scripted suture cost (section 7 of
docs/BENCHMARKS.md).

1. Tick time (1 ms of simulation, all its substeps, as the server's loop calls it) of the whole scripted simple
   interrupted suture (configs/scenarios/simple-interrupted-suture.yaml), p50 / p99 / max, over the whole scene
   and over each of its phases: the needle's bite, drawing the thread through, the double throw, cinching it,
   the second throw, cinching the surgeon's knot, the knot holding alone. A tick is what the server's loop
   runs: `Stepper.tick` and `SutureWatch.check` (the events and the knot read from the thread's topology),
   whose own share is reported too.
2. The same scene with the tissue and the needle left out of the step (the thread, its grasps and self-contact
   alone on the same states), which says what the tissue adds.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from ..server.config import LoopConfig
from ..server.scene import reads_on, state_period
from ..solver.integrator import Stepper, step, tension_floors, warm_up
from ..solver.scenario import load_scenario
from ..solver.suture import KNOT_BUDGET, KNOT_EVERY, KNOT_PHASE, LINK_BUDGET, SutureWatch

SCENE = "simple-interrupted-suture"
# the scene's phases, by its timeline (s)
PHASES = (("needle bite (tip in and out of both edges)", 0.0, 4.0), ("drawing the thread through", 4.0, 6.5),
          ("the double throw (the tail twice through the strands' loop)", 6.5, 13.6),
          ("cinching it (3 N in each hand)", 13.6, 17.0),
          ("the second throw (the tail through the crossed strands' loop the other way)", 17.0, 22.9),
          ("cinching the surgeon's knot (3 N in each hand)", 22.9, 24.9),
          ("the knot holding the wound, both hands let go", 24.9, 32.0))
TARGET_P99_US = 500.0


@dataclass
class TissueBench:
    ticks: np.ndarray = field(default_factory=lambda: np.zeros(0))        # us per tick, the whole scene
    substeps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    retries: int = 0
    watch: np.ndarray = field(default_factory=lambda: np.zeros(0))        # us of SutureWatch.check per tick
    bare: list[tuple[str, float, float]] = field(default_factory=list)   # phase, us with tissue, us without
    contact: tuple[float, int] = (0.0, 0)                                  # the scene's contact distance (m), rounds


def measure_tissue(quick: bool, log) -> TissueBench:
    sc = load_scenario(SCENE)
    model, state = sc.model, sc.new_state()
    warm_up(model, state)     # every kernel a tick can reach loaded before timing, as the server does
    watch = SutureWatch(model)
    watch.warm_up(state)
    state = sc.new_state()
    stepper = Stepper(model, state)
    watch.reset(state)
    seconds = 6.5 if quick else sc.duration
    n = int(round(seconds / model.solver.tick))
    times = np.empty(n)
    watch_us = np.empty(n)
    subs = np.empty(n)
    snaps = {}
    bare_model = dataclasses.replace(model, tissue_on=False, needle_on=False)
    # the server's `state` ticks, on which the watch slices no reading (server/scene.py)
    every = state_period(LoopConfig().state_hz, model.solver.tick)
    for k in range(n):
        t0 = time.perf_counter_ns()
        subs[k] = stepper.tick()
        t1 = time.perf_counter_ns()
        watch.check(state, _ignore, reads_on(k + 1, every))
        t2 = time.perf_counter_ns()
        times[k] = (t2 - t0) / 1e3
        watch_us[k] = (t2 - t1) / 1e3
        for label, a, b in PHASES:
            if abs((k + 1) * model.solver.tick - 0.5 * (a + b)) < 0.5 * model.solver.tick:
                snaps[label] = state.copy()
    out = TissueBench(ticks=times, substeps=subs, retries=stepper.retries, watch=watch_us,
                      contact=(model.contact.distance, model.contact.rounds))
    log(f"  {SCENE}: {seconds:g} s, tick p50 {np.percentile(times, 50):.0f} us, p99 {np.percentile(times, 99):.0f} us")
    # what the tissue adds: 200 ticks from each phase's middle, with and without it
    for label, _, _ in PHASES:
        if label not in snaps:
            continue
        per = []
        for m in (model, bare_model):
            s = snaps[label].copy()
            t0 = time.perf_counter_ns()
            for _ in range(200):
                # the scaling floor the Stepper would use: what the grasps can pull, and the punctures hold
                tension_floors(m, s)
                step(m, s, int(model.solver.max_substeps), model.solver.tick / model.solver.max_substeps,
                     scale=True)
            per.append((time.perf_counter_ns() - t0) / 1e3 / 200)
        out.bare.append((label, per[0], per[1]))
    return out


def _ignore(kind: str, **details) -> None:
    """The events' sink while timing: the server sends them; the bench only pays for finding them."""


def render_tissue(res: TissueBench) -> list[str]:
    t = res.ticks
    dt = 1e-3

    def row(label: str, seg: np.ndarray) -> list[str]:
        return [label, f"{np.percentile(seg, 50):.0f}", f"{np.percentile(seg, 99):.0f}", f"{seg.max():.0f}"]

    rows = [row(f"whole scene ({len(t) * dt:g} s)", t)]
    for label, a, b in PHASES:
        seg = t[int(a / dt):int(b / dt)]
        if len(seg):
            rows.append(row(f"{label}, {a:g}-{b:g} s", seg))
    lines = ["## 7. Tissue, needle and the scripted suture (`suturesim bench tissue`)", "",
             f"Tick time (µs, 1 ms of simulation with all its substeps, as the server's loop calls `Stepper.tick`) of "
             f"`configs/scenarios/{SCENE}.yaml`: 10 cm of 3-0 silk in 80 segments, "
             f"a 3/8-circle 19 mm needle, two spring-held pads, four punctures, self-contact "
             f"({res.contact[0] * 1e3:g} mm contact distance, {res.contact[1]} rounds), "
             f"{int(np.median(res.substeps))} substeps per tick (mass-scaled beyond). A tick includes "
             f"`SutureWatch.check` (the events, and the knot read from the thread's topology at 4 Hz), as in the "
             f"server. Target: p99 under {TARGET_P99_US:.0f} µs. Ticks run again: {res.retries}.", "",
             "| part of the scene | p50 | p99 | max |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if len(res.watch):
        w = res.watch
        reads = w[KNOT_PHASE - 1::KNOT_EVERY]
        lines += ["", f"`SutureWatch.check` alone: p50 {np.percentile(w, 50):.1f} µs, "
                      f"p99 {np.percentile(w, 99):.1f} µs, max {w.max():.0f} µs "
                      f"(a knot read begun every {KNOT_EVERY} ticks, the thread closed and reduced: "
                      f"{np.median(reads):.0f} µs median; its diagram, its state sum {KNOT_BUDGET} crossings x "
                      f"states at a time and its name on the ticks after; the linking {LINK_BUDGET} pairs of "
                      f"segments a tick)."]
    if res.bare:
        lines += ["", "What the tissue and needle add: 200 ticks from the middle of each phase, the same states "
                      "stepped with them and with `tissue_on` and `needle_on` off (µs per tick):", "",
                  "| phase | with tissue and needle | thread, grasps and contact alone |", "|---|---|---|"]
        lines += [f"| {label} | {a:.0f} | {b:.0f} |" for label, a, b in res.bare]
    lines.append("")
    return lines
