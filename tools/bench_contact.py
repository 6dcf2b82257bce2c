"""`suturesim bench contact`: what self-contact costs and how smooth the force it makes is (section 6 of
docs/BENCHMARKS.md).

1. Tick time (1 ms of simulation, all its substeps, as the server's loop calls it) of the square knot of
   Wang 2017 Fig. 15 with 200 segments while it is pulled tight: p50, p99 and max.
2. Contact cost against segment count: the same knot with N segments, the time of one neighbour-list rebuild
   and of one substep's contact response (penalty, friction and floor over the list), per call.
3. Contact cost against the number of contacts: two parallel strands pressed together over k segments.
4. Force smoothness: the force at the pulled end of the tightening knot, its content above 50 Hz (the RMS of
   the force minus its 20 ms moving average), for Wang's plain penalty (linear onset, no floor) and for the
   response as built (rounded onset, floor, friction as configured).
5. A knot held at the styluses: an overhand knot laid loose in the haptic scene two-hand-knot's thread (3-0
   silk, 45 cm, 100 segments), pulled tight by both hands and held still: tick times while it tightens and
   while it is held, the hand's force and how much it changes from tick to tick, how far the knot slips while
   held and the largest tension in the thread; as shipped, under the old budget, and with strands touching at
   the thread's diameter as the scene had them before.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..solver.config import load_yaml
from ..solver.contact_response import (CP_MIN_GAP, CP_ROUNDS, CP_SETTLE, CS_CONTACTS, CS_COUNT, CS_REVERTED, CS_ROUNDS,
                                       apply_friction, enforce_min_gap, floor_pairs, floor_reach, largest_step,
                                       penalty_forces, rebuild_neighbours)
from ..solver.integrator import STAT_MASS_FACTOR, STAT_SUBSTEPS, SolverDivergence, Stepper, friction_rounds
from ..solver.model import TickCopy
from ..solver.scenario import Scenario, build_scenario, load_scenario, scenario_path


# A real-time budget for the 200-segment knot: at most 2 substeps a tick (past that the stiff vertices are
# mass-scaled, docs/PHYSICS.md Sec. 6) and 2 rounds of floor and constraints per substep (the suture scenes
# budget 4 and 6). The scenario as shipped lets the substeps rise to 32 and the rounds to 32. Under 2 and under 3
# substeps the knot ends the same (0.9656 L end to end from 11 s on, over 30 s; docs/BENCHMARKS.md Sec. 6), so the
# cheaper one is the budget; the bench runs 3 beside it.
REALTIME = {"solver": {"max_substeps": 2}, "contact": {"rounds": 2}}


def knot(segments: int, contact: dict | None = None, duration: float | None = None,
         solver: dict | None = None) -> Scenario:
    """The square knot of Fig. 15 with ``segments`` segments and a contact distance of L / N."""
    over: dict = {"thread": {"segments": segments}, "contact": {"distance": 1.0 / segments}}
    if contact:
        over["contact"].update(contact)
    if solver:
        over["solver"] = dict(solver)
    if duration:
        over["duration"] = duration
    return load_scenario("wang2017-square-knot", over)


def knot_run(label: str, sc: Scenario, seconds: float) -> KnotRun:
    """Pull the knot for ``seconds`` and time every tick; the last second gives its force, speed and scaling."""
    tick = sc.model.solver.tick
    ticks = int(round(seconds / tick))
    last = min(ticks, int(round(1.0 / tick)))
    prev = np.empty((sc.model.n_vertices, 3))
    speed: list[float] = []
    factor = [1.0]

    def after(k: int, st) -> None:
        if k >= ticks - last and k > 0:
            speed.append(float(np.median(np.linalg.norm(st.x - prev, axis=1))) / tick)
            factor[0] = max(factor[0], float(st.stats[STAT_MASS_FACTOR]))
        np.copyto(prev, st.x)

    times, force, subs, stepper = tick_times(sc, seconds, after)
    st = stepper.state
    length = float(sc.model.rest_length.sum())
    return KnotRun(label, times, subs, int(st.contact_stats[CS_CONTACTS]), stepper.retries, factor[0],
                   float(force[-last:].mean()), float(np.linalg.norm(st.x[-1] - st.x[0]) / length),
                   float(np.median(speed)), same_tick(stepper, SAME_TICK_REPEATS))


SAME_TICK_REPEATS = 2000


def same_tick(stepper: Stepper, repeats: int) -> np.ndarray:
    """Wall time (us) of the stepper's next tick, run ``repeats`` times from the same state (put back, untimed,
    before each): the same work every time, so its spread is the machine's, not the knot's."""
    st = stepper.state
    start = TickCopy(st.copy(), st)
    times = np.empty(repeats)
    for k in range(repeats):
        start()
        t0 = time.perf_counter_ns()
        stepper.tick()
        times[k] = (time.perf_counter_ns() - t0) / 1e3
    start()
    return times


def tick_times(sc: Scenario, seconds: float, after=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, Stepper]:
    """Wall time of every tick (us), the end force (N) and the substeps of the run kept after it; ``after(k,
    state)``, if given, is called after tick k, outside the timing."""
    st = sc.new_state()
    stepper = Stepper(sc.model, st)
    ticks = int(round(seconds / sc.model.solver.tick))
    times = np.empty(ticks)
    force = np.empty(ticks)
    subs = np.empty(ticks)
    stepper.tick()
    for k in range(ticks):
        t0 = time.perf_counter_ns()
        subs[k] = stepper.tick()
        times[k] = (time.perf_counter_ns() - t0) / 1e3
        force[k] = np.linalg.norm(st.grasp_force[0])
        if after is not None:
            after(k, st)
    return times, force, subs, stepper


@dataclass
class KnotRun:
    """The 200-segment knot pulled tight under one budget: tick times (us), substeps, and where it ended."""
    label: str
    ticks: np.ndarray
    substeps: np.ndarray
    contacts: int           # pairs closer than the contact distance at the end
    retries: int            # ticks run again
    mass_factor: float      # largest mass scale factor of the last second
    force: float            # N, the hand's pull over the last second
    e2e: float              # end-to-end distance / L at the end
    speed: float            # m/s, median vertex speed over the last second
    again: np.ndarray       # us, the last tick run again from its state (same_tick)


@dataclass
class ContactBench:
    knots: list[KnotRun] = field(default_factory=list)
    by_n: list[tuple[int, int, float, float]] = field(default_factory=list)      # N, pairs, rebuild us, response us
    by_contacts: list[tuple[int, float]] = field(default_factory=list)            # contacts, response us
    smooth: list[tuple[str, float, float, float]] = field(default_factory=list)   # label, RMS > 50 Hz, mean, max
    held: list[HeldRun] = field(default_factory=list)


HELD_PULL = 0.05   # m/s, each hand's speed apart while the knot tightens
HELD_UNTIL = 1.7   # s: the hands stop where the knot is tight at about 2 N (the scene's contact, the diameter)
# the haptic scenes' contact before they took the thread's diameter (docs/PHYSICS.md Sec. 7, "A knot smaller than
# a segment"): strands touching at 3 mm, two thirds of a segment, with half that as the list's skin. Its knot is
# larger and comes taut sooner: the hands stop at HELD_UNTIL_3MM for the same pull of about 2 N
CONTACT_3MM = {"distance": 0.003, "skin": 0.0015}
HELD_UNTIL_3MM = 1.55


def held_knot(scene: str = "two-hand-knot", contact: dict | None = None, solver: dict | None = None,
              seconds: float = 6.0, until: float = HELD_UNTIL) -> Scenario:
    """``scene`` (a two-hand haptic scene) with its thread laid as a loose overhand knot (torus radii 12 and 6
    mm) and its two grasps, at the thread's ends, moving apart at HELD_PULL until ``until`` (s), then still.
    ``contact`` and ``solver`` override entries of the scene's sections of those names."""
    path = scenario_path(scene)
    data = load_yaml(path)
    grasps = data["boundary"]["grasps"]
    ends = sorted(grasps, key=lambda g: g["vertex"])    # vertex -1 (the far end) first, then 0
    data["shape"] = {"kind": "knot", "knot": "overhand", "n": 1, "radius": 0.012, "tube": 0.006}
    data["timeline"] = [{"grasp": g["id"], "velocity": [sign * HELD_PULL, 0.0, 0.0], "from": 0.0, "to": until}
                        for g, sign in zip(ends, (1.0, -1.0))]
    data["duration"] = seconds
    if contact:
        data["contact"] = {**data.get("contact", {}), **contact}
    if solver:
        data["solver"] = {**data.get("solver", {}), **solver}
    return build_scenario(data, str(path))


@dataclass
class HeldRun:
    """A knot pulled tight and held in a haptic scene's thread (held_knot): tick times (us) by phase and how
    still the knot and the force are while held."""
    label: str
    tightening: np.ndarray   # us, the ticks until the hands stop and 0.3 s after
    held: np.ndarray         # us, the ticks after that
    substeps: float          # median substeps while held
    rounds: int              # contact rounds a substep may take while held (friction_rounds)
    ran: float               # contact rounds a held substep ran, on average
    force: float             # N, the hand's force while held (mean)
    jitter: float            # N, rms of its change from one tick to the next while held
    slip: float              # m, change of the end-to-end distance over the hold
    tension: float           # N, the largest segment tension at the end of the hold
    undone: int              # held ticks in which the last-resort guard put the thread back (froze it)
    retries: int
    diverged: float | None = None   # s, when the solver diverged (the run stops there), if it did


def held_run(label: str, sc: Scenario) -> HeldRun:
    """Run ``sc`` (held_knot) to its end, timing every tick, and read what HeldRun holds."""
    e2e: list[float] = []
    tension = [0.0]
    until = sc.source["timeline"][0]["to"]    # s, when the hands stop
    split = int(round((until + 0.3) / sc.model.solver.tick))
    undone = [0]
    ran = np.zeros(2)    # rounds and substeps over the hold

    def after(k: int, st) -> None:
        e2e.append(float(np.linalg.norm(st.x[-1] - st.x[0])))
        tension[0] = float(np.abs(st.tension).max())
        if k >= split:
            undone[0] += st.contact_stats[CS_REVERTED] > 0
            ran[0] += st.contact_stats[CS_ROUNDS]
            ran[1] += st.stats[STAT_SUBSTEPS]

    try:
        times, force, subs, stepper = tick_times(sc, sc.duration, after)
    except SolverDivergence:
        # a runaway (docs/PHYSICS.md Sec. 7): report how far it ran
        return HeldRun(label, np.full(1, np.nan), np.full(1, np.nan), math.nan, 0, math.nan, math.nan, math.nan,
                       math.nan, tension[0], undone[0], 0, len(e2e) * sc.model.solver.tick)
    n = float(np.median(subs[split:]))
    rounds, _ = friction_rounds(int(sc.model.contact_par[CP_ROUNDS]), sc.model.contact_par[CP_MIN_GAP],
                                sc.model.contact_par[CP_SETTLE], sc.model.solver.tick / n)
    return HeldRun(label, times[:split], times[split:], n, rounds, float(ran[0] / ran[1]),
                   float(force[split:].mean()),
                   float(np.sqrt(np.mean(np.diff(force[split:]) ** 2))), e2e[-1] - e2e[split], tension[0],
                   undone[0], stepper.retries)


def _per_call_us(fn, repeats: int) -> float:
    fn()
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / 1e3 / repeats)
    return float(best)


def response_cost(sc: Scenario, st) -> tuple[int, float, float]:
    """(pairs in the list, us per rebuild, us per substep of penalty + friction + floor) at state ``st``."""
    m = sc.model
    par = m.contact_par
    force = np.zeros_like(st.x)
    xbar = st.x.copy()

    def rebuild():
        st.contact_stats[CS_COUNT] = 0
        rebuild_neighbours(st.x, par, m.contact.skin, m.contact.exclude, st.grid_head, st.grid_next, st.grid_cells,
                           st.grid_scratch, st.cand_i, st.cand_j, st.cand_s, st.cand_t, st.cand_d, st.cand_n,
                           st.cand_fp, st.cand_ff, st.old_j, st.old_n, st.old_fp, st.old_ff, st.old_next, st.seg_head,
                           st.x_ref, st.contact_stats, st.parted)

    rebuild()
    n = int(st.contact_stats[CS_COUNT])
    h = m.solver.tick

    def respond():
        penalty_forces(st.x, st.x_prev, par, n, st.cand_i, st.cand_j, st.cand_s, st.cand_t, st.cand_d, st.cand_n,
                       st.cand_f, st.cand_fp, st.grid_scratch, force, st.contact_k,
                       st.contact_k_act, st.turn)
        apply_friction(st.x, xbar, m.inv_mass, h, par, n, st.cand_i, st.cand_j, st.cand_s, st.cand_t, st.cand_n,
                       st.cand_f, st.cand_fa)
        # the pairs the floor visits, listed as the substep lists them (integrator.contact_rounds)
        near = floor_pairs(par, n, st.cand_d, st.cand_fp, floor_reach(largest_step(xbar, st.x), par[CP_MIN_GAP]),
                           st.cand_near)
        enforce_min_gap(xbar, m.inv_mass, h, par, st.cand_near, near, st.cand_i, st.cand_j, st.cand_s, st.cand_t,
                        st.cand_d, st.cand_n, st.cand_fp)

    return n, _per_call_us(rebuild, 200), _per_call_us(respond, 500)


def pressed_strands(k: int) -> tuple[Scenario, object]:
    """Two parallel strands of k segments each, at 0.8 contact distances apart: k to 3k touching pairs."""
    n_seg = 2 * k + 1
    l = 0.01
    lower = [[i * l, 0.0, 0.0] for i in range(k + 1)]
    upper = [[(k - i) * l, 0.0, 0.008] for i in range(k + 1)]
    pts = np.array(lower + upper)
    sc = build_scenario({"name": "strands", "thread": {"preset": "wang2017-square-knot", "length":
                                                      float(np.linalg.norm(np.diff(pts, axis=0), axis=1).sum()),
                                                      "segments": n_seg},
                         "gravity": [0, 0, 0], "shape": {"kind": "points", "points": pts.tolist()},
                         "contact": {"stiffness": 50.0, "distance": 0.01, "exclude": 1}}, "strands")
    return sc, sc.new_state()


def high_frequency_rms(force: np.ndarray, tick: float, window_s: float = 0.02) -> float:
    """RMS (N) of the force minus its moving average over ``window_s``: its content above ~1/window_s Hz."""
    w = max(1, int(round(window_s / tick)))
    smooth = np.convolve(force, np.ones(w) / w, mode="same")
    core = slice(w, len(force) - w)
    return float(np.sqrt(np.mean((force[core] - smooth[core]) ** 2)))


def measure_contact(quick: bool, log) -> ContactBench:
    out = ContactBench()
    sim = 2.0 if quick else 10.0
    for label, solver, contact in (("as shipped (up to 32 substeps, 32 rounds)", None, None),
                                   ("real-time budget (2 substeps, 2 rounds)", REALTIME["solver"],
                                    REALTIME["contact"]),
                                   ("3 substeps, 2 rounds", {"max_substeps": 3}, REALTIME["contact"])):
        log(f"contact: square knot, 200 segments, {label} ...")
        out.knots.append(knot_run(label, knot(200, contact=contact, solver=solver), sim))
    log("contact: cost against segments ...")
    for n in ((100, 200, 400) if quick else (100, 200, 400, 800, 1600)):
        s = knot(n)
        st = s.new_state()
        Stepper(s.model, st)   # (warm) the knot as laid: every strand near its neighbours
        pairs, reb, resp = response_cost(s, st)
        out.by_n.append((n, pairs, reb, resp))
    log("contact: cost against contacts ...")
    for k in ((10, 100) if quick else (10, 30, 100, 300, 1000)):
        s, st = pressed_strands(k)
        pairs, _, resp = response_cost(s, st)
        out.by_contacts.append((pairs, resp))
    log("contact: force smoothness ...")
    for label, contact in (("Wang's penalty (linear onset, no floor)", {"smooth": 0.0, "min_gap": 1e-9}),
                           ("as built (rounded onset, floor)", None)):
        s40 = load_scenario("wang2017-square-knot", {"contact": contact} if contact else None)
        _, force, _, _ = tick_times(s40, sim)
        out.smooth.append((label, high_frequency_rms(force, s40.model.solver.tick), float(force.mean()),
                           float(force.max())))
    cold = {"warm_friction": False}
    for label, contact, until in (
            ("as shipped (0.225 mm, friction started warm)", None, HELD_UNTIL),
            ("0.225 mm, friction started cold", cold, HELD_UNTIL),
            ("3 mm, friction started warm", CONTACT_3MM, HELD_UNTIL_3MM),
            ("3 mm, friction started cold (the scene before)", {**CONTACT_3MM, **cold}, HELD_UNTIL_3MM)):
        log(f"contact: a knot held at the styluses, {label} ...")
        out.held.append(held_run(label, held_knot(contact=contact, seconds=3.0 if quick else 6.0, until=until)))
    return out


def render_contact(res: ContactBench) -> list[str]:
    n_ticks = len(res.knots[0].ticks) if res.knots else 0
    lines = ["## 6. Self-contact", "",
             "Tick time (one 1 ms tick, all its substeps, `Stepper.tick`) of the square knot of Wang 2017 Fig. 15 "
             "with 200 segments (contact distance L/N = 5 mm, 50 N/m) pulled tight at 0.1 m/s by a 1 N hand, "
             f"{n_ticks} ticks, under the scenario's budget, the real-time one and 3 substeps; mass factor, force and "
             "speed are the last second's (the knot tight), contacts and end-to-end distance the last tick's:",
             "",
             "| budget | p50 (µs) | p99 (µs) | max (µs) | substeps p50 / p99 | contacts at the end | ticks redone "
             "| largest mass factor | hand's force (N) | end-to-end / L | median vertex speed (mm/s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.knots:
        t = r.ticks
        lines.append(f"| {r.label} | {np.percentile(t, 50):.0f} | {np.percentile(t, 99):.0f} | {t.max():.0f} "
                     f"| {np.percentile(r.substeps, 50):.0f} / {np.percentile(r.substeps, 99):.0f} "
                     f"| {r.contacts} | {r.retries} | {r.mass_factor:.1f} | {r.force:.3f} | {r.e2e:.3f} "
                     f"| {1e3 * r.speed:.1f} |")
    lines += ["", f"The same tick run again: each run's last tick (the knot tight) run {SAME_TICK_REPEATS} times "
              "from the same state, put back untimed before each (`same_tick`). The work is the same every time, so "
              "its spread is the machine's (other processes, the virtual machine's neighbours, caches), not the "
              "knot's: a ratio p99 / p50 above no larger than this one says nothing of the knot.", "",
              "| budget | p50 (µs) | p99 (µs) | max (µs) | p99 / p50 |", "|---|---|---|---|---|"]
    for r in res.knots:
        a = r.again
        lines.append(f"| {r.label} | {np.percentile(a, 50):.0f} | {np.percentile(a, 99):.0f} | {a.max():.0f} "
                     f"| {np.percentile(a, 99) / np.percentile(a, 50):.2f} |")
    lines += ["",
              "Once the knot is tight its hinges fold to the segment scale: bending alone then asks for ~14 "
              "substeps (h ω < 1 with ω ≈ 12 000 rad/s), and the p99 of the shipped budget is those ticks. The "
              "real-time budget runs 2 and scales the masses of the folded vertices instead (docs/PHYSICS.md "
              "Sec. 6): the hand's force is the same, and the frictionless knot jams tighter, its shape depending "
              "on how it got there. Run on to 30 s, the knot under 2 substeps and under 3 ends the same, 0.9656 L "
              "end to end from 11 s on (each slips into it between 9 and 11 s, which the last second of a 10 s "
              "run catches or not: end-to-end distance and vertex speed above), where the shipped budget's holds "
              "at 0.941-0.943 L. No two segments crossed between any two substeps of any of the runs "
              "(`tools/crossings.py`, checked outside the benchmark).", "",
             "Contact cost against segment count (the knot as laid, every strand near others; best of 3 runs of "
             "many calls):", "",
             "| N | pairs in the list | rebuild (µs) | response per substep (µs) | response per pair (ns) |",
             "|---|---|---|---|---|"]
    for n, pairs, reb, resp in res.by_n:
        lines.append(f"| {n} | {pairs} | {reb:.1f} | {resp:.1f} | {1e3 * resp / max(pairs, 1):.0f} |")
    lines += ["", "Contact cost against the number of contacts (two parallel strands pressed together):", "",
              "| pairs in the list | response per substep (µs) | per pair (ns) |", "|---|---|---|"]
    for pairs, resp in res.by_contacts:
        lines.append(f"| {pairs} | {resp:.1f} | {1e3 * resp / max(pairs, 1):.0f} |")
    lines += ["", "Force smoothness at the pulled end of the 40-segment square knot (Fig. 15) while it tightens: "
              "the RMS of the force minus its 20 ms moving average (content above ~50 Hz, what a stylus would "
              "buzz with):", "",
              "| response | RMS above 50 Hz (N) | mean force (N) | max force (N) |", "|---|---|---|---|"]
    for label, rms, mean, mx in res.smooth:
        lines.append(f"| {label} | {rms:.4f} | {mean:.3f} | {mx:.3f} |")
    if res.held:
        lines += ["", "A knot held at the styluses (`tools/bench_contact.held_knot`): the haptic scene two-hand-knot "
                  "(3-0 silk, 45 cm in 100 segments of 4.5 mm, gravity; strands touch at the thread's 0.225 mm "
                  "diameter, up to 4 substeps and 6 contact rounds, friction started warm) with its thread laid as "
                  f"a loose overhand knot, both hands moving apart at {1e3 * HELD_PULL:.0f} mm/s until the knot is "
                  f"tight at about 2 N ({HELD_UNTIL} s; {HELD_UNTIL_3MM} s where strands touch at 3 mm, as the "
                  "scene had it before) and then held still; the same with friction started cold "
                  "(`contact.warm_friction` false, as the scene had it before). Tick times while it tightens (to "
                  "0.3 s after the hands stop) and while it is held; the contact rounds a held substep ran (of "
                  "those it may); the hand's force while held, the rms of its change from one tick to "
                  "the next (what the stylus would buzz with), how far the knot slipped (change of the "
                  "end-to-end distance over the hold), the largest segment tension at the end, and in how many "
                  "held ticks the last-resort guard put the whole thread back (froze it):", "",
                  "| budget | tightening p50 / p99 / max (µs) | held p50 / p99 / max (µs) | substeps | rounds per "
                  "substep (of) | hand's force (N) | its change per tick, rms (mN) | slip while held (mm) | largest "
                  "tension (N) | held ticks frozen | ticks redone |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res.held:
            a, b = r.tightening, r.held
            if r.diverged is not None:
                lines.append(f"| {r.label} | diverged at {r.diverged:.3f} s (largest tension {r.tension:.3g} N "
                             "before it) | | | | | | | | | |")
                continue
            lines.append(f"| {r.label} | {np.percentile(a, 50):.0f} / {np.percentile(a, 99):.0f} / {a.max():.0f} "
                         f"| {np.percentile(b, 50):.0f} / {np.percentile(b, 99):.0f} / {b.max():.0f} "
                         f"| {r.substeps:.0f} | {r.ran:.1f} ({r.rounds}) | {r.force:.3f} | {1e3 * r.jitter:.2f} "
                         f"| {1e3 * r.slip:+.3f} | {r.tension:.3g} | {r.undone} of {len(b)} | {r.retries} |")
        lines += ["", "Where strands touch at the thread's diameter, a knot pulled tight is smaller than a segment: "
                  "its loop closes on segments 3-5 apart pressed together at a toggle, and the rounds of floor, "
                  "friction and solve run out. Friction started cold leaves the floor unmet when they do, the guard "
                  "puts the thread back every substep, and the thread stands frozen while the hands hold it; "
                  "started warm, what the rounds leave is met and the knot is held live within the tick. At 3 mm "
                  "the knot is a clump a few segments across, and warm its rounds settle in one or two "
                  "(docs/PHYSICS.md Sec. 7, \"Friction started warm\")."]
    lines.append("")
    return lines
