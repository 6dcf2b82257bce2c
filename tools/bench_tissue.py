"""`suturesim bench tissue`: what the needle, the tissue and the scripted suture cost (section 7 of
docs/BENCHMARKS.md).

1. Tick time (1 ms of simulation, all its substeps, as the server's loop calls it) of the whole scripted simple
   interrupted suture (configs/scenarios/simple-interrupted-suture.yaml), p50 / p99 / max, over the whole scene
   and over each of its phases: the needle's bite, drawing the thread through, the double throw, cinching it,
   the second throw, cinching the surgeon's knot, the knot holding alone. A tick is what the server's loop
   runs: `Stepper.tick` and `SutureWatch.check` (the events and the knot read from the thread's topology),
   whose own share is reported too; and where the step's time goes, stage by stage (solver/timers.py).
2. The same scene with the tissue and the needle left out of the step (the thread, its grasps and self-contact
   alone on the same states), which says what the tissue adds.
3. How the scripted sutures end (simple-interrupted-suture and needle-tie-surgeons-knot) as scripted and with
   every vertex moved by a tiny random draw at one tick of the script: the knots the watch read and whether the
   wound was closed at the end. The scripts are open-loop: this says whether their ending is a property of
   the physics or of one run's exact bits.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..server.config import LoopConfig
from ..server.messages import MessageBuilder
from ..server.scene import SceneRunner, reads_on, state_period
from ..solver.contact_response import CS_ROUNDS, CS_ROUNDS_OUT, CS_ROUNDS_RAISED, CS_ROUNDS_SLID
from ..solver.integrator import (STAT_TIMERS, STAT_TISSUE_NEEDLE, STAT_TISSUE_OUT, STAT_TISSUE_PADS,
                                 STAT_TISSUE_ROUNDS, STAT_TISSUE_THREAD, Stepper, step, tension_floors, warm_up)
from ..solver.knot_type import knot_type
from ..solver.needle import NP_ARC, NP_RADIUS, NS_Q, arc_point
from ..solver.scenario import load_scenario
from ..solver.suture import KNOT_BUDGET, KNOT_EVERY, KNOT_PHASE, LINK_BUDGET, SutureWatch
from ..solver.timers import N_TIMERS, STAGES, seconds_per_cycle

SCENE = "simple-interrupted-suture"
# the scene's phases, by its timeline (s)
PHASES = (("needle bite (tip in and out of both edges)", 0.0, 4.0), ("drawing the thread through", 4.0, 6.5),
          ("the double throw (the tail twice through the strands' loop)", 6.5, 13.6),
          ("cinching it (3 N in each hand)", 13.6, 17.0),
          ("the second throw (the tail through the crossed strands' loop the other way)", 17.0, 22.9),
          ("cinching the surgeon's knot (3 N in each hand)", 22.9, 24.9),
          ("the knot holding the wound, both hands let go", 24.9, 32.0))
TARGET_P99_US = 500.0
ROUND_SLOTS = [CS_ROUNDS, CS_ROUNDS_RAISED, CS_ROUNDS_SLID, CS_ROUNDS_OUT]           # in state.contact_stats
TISSUE_ROUND_SLOTS = [STAT_TISSUE_ROUNDS, STAT_TISSUE_PADS, STAT_TISSUE_NEEDLE, STAT_TISSUE_THREAD,
                      STAT_TISSUE_OUT]                                                  # in state.stats

# 3. the scripted sutures' endings: the scenes, and the times (s) of the script at which a run is perturbed (the
# bite, the thread drawn through, the double throw being wound, cinched, and the cinch eased: both scripts move
# alike to 13.6 s), taken in turn by the runs
ENDING_SCENES = ("simple-interrupted-suture", "needle-tie-surgeons-knot")
ENDING_TIMES = (3.0, 5.0, 7.0, 9.0, 11.0, 12.0, 16.0, 16.5)
# s: in the needle tie, the tail wound round the wire and the needle not yet driven (its drive begins at 20.9 s):
# the thread with the needle's arc drawn through before its swage reads the knot the drive will make
WIND_CHECK_S = {"needle-tie-surgeons-knot": 20.85}
WIND_ARC_POINTS = 12     # points along the arc, tip to swage, put before the thread for that reading
# s: both scripts' double throw cinched and seated on the wound, both hands still, the second throw not begun;
# where it sits is the mean x of the thread's vertices over the wound (|x| under SEAT_HALF_WIDTH_M) and low on it
# (under SEAT_HEIGHT_M above the pads' top face, z = 0)
SEAT_CHECK_S = 17.0
SEAT_HALF_WIDTH_M = 0.004
SEAT_HEIGHT_M = 0.0025
# m, the draw's standard deviation: about one unit in the last place of a coordinate 1 cm from the origin, and
# a picometre
ENDING_SIGMAS = (2e-18, 1e-12)
ENDING_RUNS, ENDING_RUNS_QUICK = 8, 1
ENDING_KNOTS = ["half knot", "double throw", "surgeon's knot"]   # what both scripts tie, in order


@dataclass
class TissueBench:
    ticks: np.ndarray = field(default_factory=lambda: np.zeros(0))        # us per tick, the whole scene
    substeps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    retries: int = 0
    watch: np.ndarray = field(default_factory=lambda: np.zeros(0))        # us of SutureWatch.check per tick
    stages: np.ndarray = field(default_factory=lambda: np.zeros((0, N_TIMERS)))   # us per tick in each stage
    # per tick: self-contact's rounds run, those whose floor raised a gap, those whose friction had not settled,
    # and the substeps that ran out of rounds (contact_response.CS_ROUNDS..CS_ROUNDS_OUT)
    rounds: np.ndarray = field(default_factory=lambda: np.zeros((0, len(ROUND_SLOTS))))
    # per tick: the tissue's rounds run, those in which the pads, the needle's hold and the needle against its
    # thread pushed, and the substeps that ran out (integrator.STAT_TISSUE_ROUNDS..STAT_TISSUE_OUT)
    tissue_rounds: np.ndarray = field(default_factory=lambda: np.zeros((0, len(TISSUE_ROUND_SLOTS))))
    bare: list[tuple[str, float, float]] = field(default_factory=list)   # phase, us with tissue, us without
    contact: tuple[float, int] = (0.0, 0)                                  # the scene's contact distance (m), rounds
    endings: list[Ending] = field(default_factory=list)                   # 3: as scripted, and perturbed


def _rounds_table(intro: str, columns: list[str], rounds: np.ndarray, substeps: np.ndarray,
                  spans: list[tuple[str, float, float]], dt: float) -> list[str]:
    """A rounds table under ``intro``, a row for each span (label, from s, to s; ticks of ``dt`` s) with ticks.
    ``rounds`` (ticks, k) holds per tick the rounds run, k - 2 counts of rounds in which something acted
    (``columns``, their headers) and the substeps that ran out of rounds; ``substeps`` (ticks,). Each row: the
    rounds a substep, each count's share of the rounds and the share of substeps that ran out. Nothing where no
    round ran."""
    if not (len(rounds) and rounds[:, 0].any()):
        return []
    lines = ["", intro, "", "| part of the scene | rounds a substep | " + " | ".join(columns)
             + " | substeps out of rounds |", "|---|" + "---|" * (len(columns) + 2)]
    for label, a, b in spans:
        i, j = int(a / dt), int(b / dt)
        if len(rounds[i:j]):
            lines.append(_rounds_row(label, rounds[i:j], substeps[i:j]))
    return lines


def _rounds_row(label: str, rounds: np.ndarray, substeps: np.ndarray) -> str:
    """A row of a rounds table: ``rounds`` (ticks, k): per tick the rounds run, k - 2 counts of rounds in which
    something acted, and the substeps that ran out of rounds; ``substeps`` (ticks,), of one part of the scene.
    The rounds a substep, each count's share of the rounds, and the share of substeps that ran out."""
    sums = rounds.sum(axis=0)
    run, acted, out = sums[0], sums[1:-1], sums[-1]
    subs = float(substeps.sum())
    if run == 0.0 or subs == 0.0:
        return f"| {label} | 0 |" + " |" * (len(sums) - 1)
    return (f"| {label} | {run / subs:.2f} | " + " | ".join(f"{100.0 * a / run:.0f} %" for a in acted)
            + f" | {100.0 * out / subs:.0f} % |")


@dataclass
class Ending:
    """How one run of a scripted suture ended: the knots the watch read, in order, and the wound's last event."""
    scene: str
    sigma: float          # m: the perturbation's standard deviation (0: as scripted)
    seed: int
    at_s: float           # s: the script's time of the perturbation
    knots: list[str]
    wound: str | None     # "gap_closed", "gap_opened" or None (no event)
    wind: str | None = None   # at WIND_CHECK_S, the knot the needle's drive would make (None: no such check)
    seat: float = float("nan")   # m: at SEAT_CHECK_S, where the double throw sits across the wound (x)

    @property
    def done(self) -> bool:
        """What the scene's tests ask: the three knots in order, and the wound closed at the end."""
        return self.knots == ENDING_KNOTS and self.wound == "gap_closed"


def scripted_ending(scene: str, sigma: float = 0.0, seed: int = 0, at_s: float = 0.0) -> Ending:
    """Play ``scene`` through, tick by tick as the server does (SceneRunner, publishing nothing). With ``sigma``
    > 0 (m), at ``at_s`` (s) every vertex but the first (the needle's swage) is moved by a normal draw of that
    standard deviation (numpy's generator seeded with ``seed``), its previous position by the same draw, so no
    velocity is added."""
    sc = load_scenario(scene)
    state = sc.new_state()
    events: list[tuple[str, dict]] = []
    runner = SceneRunner(Stepper(sc.model, state), MessageBuilder(sc), None, 1,
                         event=lambda kind, **details: events.append((kind, details)))
    tick_s = sc.model.solver.tick
    at = int(round(at_s / tick_s))
    check = int(round(WIND_CHECK_S[scene] / tick_s)) if scene in WIND_CHECK_S else -1
    seat_tick = int(round(SEAT_CHECK_S / tick_s))
    wind, seat = None, float("nan")
    for tick in range(1, int(round(sc.duration / tick_s)) + 1):
        if tick == at and sigma > 0.0:
            noise = np.random.default_rng(seed).normal(scale=sigma, size=state.x[1:].shape)
            state.x[1:] += noise
            state.x_prev[1:] += noise
        runner.tick(tick)
        if tick == check:
            wind = drawn_through(sc.model.needle_par, state)
        if tick == seat_tick:
            x = state.x
            low = (np.abs(x[:, 0]) < SEAT_HALF_WIDTH_M) & (x[:, 2] < SEAT_HEIGHT_M)
            seat = float(x[low, 0].mean()) if low.any() else float("nan")
    wound = [k for k, _ in events if k in ("gap_closed", "gap_opened")]
    return Ending(scene, sigma, seed, at_s, [d["name"] for k, d in events if k == "knot"],
                  wound[-1] if wound else None, wind, seat)


def drawn_through(needle_par: np.ndarray, state) -> str:
    """The knot's name for the thread with the needle's arc put before its swage, tip first: the knot a drive of
    the needle through whatever is wound round it makes (docs/PHYSICS.md Sec. 9)."""
    r, arc = float(needle_par[NP_RADIUS]), float(needle_par[NP_ARC])
    tip_to_swage = [arc_point(state.x, state.nst, NS_Q, r, theta)
                    for theta in np.linspace(arc, 0.0, WIND_ARC_POINTS)[:-1]]
    return knot_type(np.vstack([np.array(tip_to_swage), state.x])).name


def measure_endings(quick: bool, log) -> list[Ending]:
    """Each scene as scripted, and ENDING_RUNS perturbed runs per sigma (``quick``: ENDING_RUNS_QUICK at the first), on
    as many processes as there are CPUs, two at most: only outcomes are measured here, not time."""
    runs = ENDING_RUNS_QUICK if quick else ENDING_RUNS
    sigmas = ENDING_SIGMAS[:1] if quick else ENDING_SIGMAS
    jobs = [(scene, 0.0, 0, 0.0) for scene in ENDING_SCENES]
    jobs += [(scene, sigma, k + 1, ENDING_TIMES[k % len(ENDING_TIMES)]) for scene in ENDING_SCENES
             for sigma in sigmas for k in range(runs)]
    workers = max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        out = list(pool.map(scripted_ending, *zip(*jobs)))
    for scene in ENDING_SCENES:
        done = {sigma: sum(e.done for e in out if e.scene == scene and e.sigma == sigma)
                for sigma in (0.0,) + sigmas}
        log(f"  {scene}: " + ", ".join(f"sigma {s:g} m: {d} done" for s, d in done.items()))
    return out


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
    stages = np.empty((n, N_TIMERS))
    rounds = np.empty((n, len(ROUND_SLOTS)))
    tissue_rounds = np.empty((n, len(TISSUE_ROUND_SLOTS)))
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
        stages[k] = state.stats[STAT_TIMERS:]
        rounds[k] = state.contact_stats[ROUND_SLOTS]
        tissue_rounds[k] = state.stats[TISSUE_ROUND_SLOTS]
        for label, a, b in PHASES:
            if abs((k + 1) * model.solver.tick - 0.5 * (a + b)) < 0.5 * model.solver.tick:
                snaps[label] = state.copy()
    out = TissueBench(ticks=times, substeps=subs, retries=stepper.retries, watch=watch_us,
                      stages=stages * (seconds_per_cycle() * 1e6), rounds=rounds,
                      tissue_rounds=tissue_rounds,
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
    out.endings = measure_endings(quick, log)
    return out


def _ignore(kind: str, **details) -> None:
    """The events' sink while timing: the server sends them; the bench only pays for finding them."""


def _span(xs: list[float]) -> str:
    """The range of positions ``xs`` (m) in mm, '-' for none."""
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    lo, hi = min(xs) * 1e3, max(xs) * 1e3
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f} to {hi:.2f}"


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
    spans = [(f"whole scene ({len(t) * dt:g} s)", 0.0, len(t) * dt)] + [(f"{lab}, {a:g}-{b:g} s", a, b)
                                                                      for lab, a, b in PHASES]
    if len(res.stages) and res.stages.any():
        lines += ["", "Where the step goes: each stage's time summed over a tick's substeps (the solver's stage "
                      "timers, solver/timers.py: the CPU's time-stamp counter read between the stages), its mean "
                      "over each phase's ticks, µs. *Drive*: the timeline and the pads moved; *forces*: bending, "
                      "drag, gravity and self-contact's penalty; *predict*: the prediction and the grasps' "
                      "couplings; *solve*: friction on the prediction and the multipliers; *contact*: the rounds of "
                      "the no-crossing floor, friction and the constraints solved again; *tools*: the thread kept "
                      "out of the tools (none in this scene); *tissue*: the needle's pierce, the thread out of the "
                      "pads and off the needle, each followed by a solve, and the punctures' forces; *commit*: the "
                      "tensions and the grasps' forces; *neighbours*: the self-contact list kept fresh; *masses*: "
                      "the mass scaling.", "",
                  "| part of the scene | " + " | ".join(STAGES) + " | all |",
                  "|---|" + "---|" * (len(STAGES) + 1)]
        for label, a, b in spans:
            seg = res.stages[int(a / dt):int(b / dt)]
            if len(seg):
                mean = seg.mean(axis=0)
                lines.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in mean) + f" | {mean.sum():.0f} |")
    lines += _rounds_table(
        "Self-contact's rounds (the *contact* stage: the no-crossing floor, friction, and the constraints solved "
        f"again if either acted, at most {res.contact[1]} a substep of 0.25 ms; contact_response.CS_ROUNDS and "
        "after), over each phase's substeps: rounds run a substep; of the rounds, the share in which the floor "
        "raised a gap and the share in which friction moved a contact point by more than it settles within (either "
        "keeps the rounds going); and the share of substeps that ran out of rounds with the floor or friction still "
        "acting.", ["rounds whose floor raised a gap", "rounds whose friction had not settled"],
        res.rounds, res.substeps, spans, dt)
    lines += _rounds_table(
        "The tissue's rounds (the *tissue* stage: the thread put back out of the pads, the needle held by the tissue "
        "and the pads, the thread kept off its needle, and the constraints solved again if any of them pushed, at "
        "most the tissue's `rounds` a substep; integrator.STAT_TISSUE_ROUNDS and after), over each phase's "
        "substeps: rounds run a substep; of the rounds, the share in which each pushed (any keeps the rounds going); "
        "and the share of substeps that ran out of rounds with a push still made.",
        ["rounds the pads pushed in", "rounds the needle's hold pushed in",
         "rounds the needle and its thread pushed in"], res.tissue_rounds, res.substeps, spans, dt)
    if res.bare:
        lines += ["", "What the tissue and needle add: 200 ticks from the middle of each phase, the same states "
                      "stepped with them and with `tissue_on` and `needle_on` off (µs per tick):", "",
                  "| phase | with tissue and needle | thread, grasps and contact alone |", "|---|---|---|"]
        lines += [f"| {label} | {a:.0f} | {b:.0f} |" for label, a, b in res.bare]
    if res.endings:
        lines += ["", "How the scripted sutures end: each scene as scripted, and runs in which, at one tick of the "
                      "script, every vertex but the needle's swage was moved by a normal draw of standard deviation "
                      "sigma (its previous position by the same draw: no velocity added), the run k at the k-th of "
                      f"{', '.join(f'{t:g}' for t in ENDING_TIMES)} s in turn. *Done*: the knots read "
                      f"{', '.join(ENDING_KNOTS)}, in that order, and the wound closed at the end (what the scenes' "
                      "tests in tests/test_suture.py ask). *The wind caught*: in the needle tie, at "
                      f"{WIND_CHECK_S['needle-tie-surgeons-knot']:g} s (the tail wound round the wire, the needle "
                      "not yet driven through), the thread with the needle's arc put before its swage, tip first, "
                      f"reads {ENDING_KNOTS[-1]}: the knot the drive will make. *The seat*: at {SEAT_CHECK_S:g} s, "
                      "the double throw cinched and both hands still, the mean x of the thread's vertices within "
                      f"{SEAT_HALF_WIDTH_M * 1e3:g} mm of the wound's middle and {SEAT_HEIGHT_M * 1e3:g} mm of the "
                      "pads' top: where the knot sits across the wound, for the runs done and the others.", "",
                  "| scene | sigma (m) | done | the wind round the wire caught | the double throw's seat at "
                  f"{SEAT_CHECK_S:g} s (x, mm): runs done / not | endings (runs × the knots read; the wound at the "
                  "end) |",
                  "|---|---|---|---|---|---|"]
        for scene in ENDING_SCENES:
            for sigma in (0.0,) + ENDING_SIGMAS:
                runs = [e for e in res.endings if e.scene == scene and e.sigma == sigma]
                if not runs:
                    continue
                endings = Counter(f"{', '.join(e.knots) or 'no knot'}; "
                                  f"{'closed' if e.wound == 'gap_closed' else 'open'}" for e in runs)
                what = " / ".join(f"{n} × {ending}" for ending, n in endings.most_common())
                label = "as scripted" if sigma == 0.0 else f"{sigma:g}"
                caught = "-" if runs[0].wind is None else \
                    f"{sum(e.wind == ENDING_KNOTS[-1] for e in runs)} of {len(runs)}"
                seats = " / ".join(_span([e.seat for e in runs if e.done == d]) for d in (True, False))
                lines.append(f"| {scene} | {label} | {sum(e.done for e in runs)} of {len(runs)} | {caught} | "
                             f"{seats} | {what} |")
    lines.append("")
    return lines
