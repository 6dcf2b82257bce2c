"""`suturesim bench knot`: an overhand knot in the shipped 3-0 silk pulled tight by two styluses and held, measured
against what a knot at the thread's true diameter must show (docs/PHYSICS.md Sec. 7, "A knot smaller than a
segment").

The scene is the haptic scene two-hand-knot's thread (the `silk-3-0` preset, 45 cm in the 100 segments the user
gives it) laid as a loose overhand knot (`tools/bench_contact.held_knot`'s shape), its two ends held by stylus
couplings (1000 N/m; their limit raised to COUPLING_LIMIT, so that the held force is the coupling's and not the
clamp's constant). Both hands move apart along the line of the ends at PULL_SPEED until both couplings pull
PULL_FORCE, and then hold that pull as a hand does: each eases out or in, slowly (HOLD_GAIN), as its force
falls short of PULL_FORCE or passes it. Every tick is timed (`Stepper.tick`, the solver's whole tick), and
outside the timing:

- **frozen**: ticks in which the last-resort guard put the thread back to where a substep began
  (`contact_stats[CS_REVERTED]`): the thread stood still however the hands pulled;
- **crossings**: pairs of segments that passed through each other between two substeps, by the independent
  check of tools/crossings.py on every substep's positions (`Stepper.trace`);
- **largest tension / pull**: the largest segment tension over the hold against the hands' mean pull (N);
- **force above 50 Hz**: the rms of each hand's coupling force (N, what the safety pipeline then clamps and
  slew-limits, before a device's own low-pass) less its 20 ms moving average, over the hold, the larger hand's;
- **knot core**: at the end of the hold, the thread within 3 diameters (2 x 3 x the preset's contact_radius) of a
  strand more than the contact's excluded neighbours away along it (mm of thread, sampled at CORE_SAMPLES points
  a segment). The same with the contact distance for the diameter says how small the contact lets the knot be.

Rows: the scene as shipped (strands touch at the thread's own diameter, friction started warm), the same with
friction started cold, strands touching at 3 mm (the scene's contact before) either way, and the thread refined to
2 mm segments under 16 substeps and 32 rounds (not under --quick). The targets are those of a knot held at the
styluses at the true diameter: tick p99 <= 500 us, nothing frozen, no crossing, no tension above 1.2 x the pull,
<= 5 mN above 50 Hz, a core of <= 10 mm of thread.

Then (not under --quick) Choi's n = 1 knot laid at 3-0 silk's diameter is pulled tight as `suturesim validate`
pulls it (tools/validate_contact.choi_n1_silk_case, 6 mm/s, without the crossing checks): its computing time per
simulated second and the median of its pull force over Audoly's law (target 0.5-2). And the reef knot at a
suture's scale (reef-knot-suture, 1.25 mm segments) held by its standing parts at silk's friction, under the
suture scenes' 1 mm contact and at the thread's diameter, friction started warm and cold: whether it holds.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..solver.contact_response import CS_REVERTED
from ..solver.integrator import SolverDivergence, Stepper
from ..solver.scenario import Scenario, build_scenario
from .bench_contact import CONTACT_3MM, held_knot, high_frequency_rms
from .crossings import segment_distance, substep_crossings

PULL_SPEED = 0.05      # m/s, each hand's speed apart while the knot tightens
PULL_FORCE = 3.0       # N: the hands stop once both pull this (a Touch's continuous force)
COUPLING_LIMIT = 4.5   # N: the couplings' limit here, above the pull: a coupling at its limit pulls a constant
HOLD_GAIN = 0.02       # m/s per N: a holding hand's speed out (in) for a pull short of (over) PULL_FORCE: the
                       # hold follows the knot at 1000 N/m x 0.02 = 20 1/s (3 Hz), far below the 50 Hz measured
PULL_MAX_S = 4.0       # s: a knot that has not reached PULL_FORCE by then is held where it is
SETTLE_S = 0.3         # s after the hands stop before the hold's figures are taken
HOLD_S = 3.0           # s held (--quick: 1 s)
CORE_DIAMETERS = 3.0   # the knot's core: thread within this many diameters of a non-neighbouring strand
CORE_SAMPLES = 16      # points a segment is sampled at for the core
TRACE_ROWS = 64        # substeps of a tick whose positions are kept for the crossing check (more: unchecked)

TICK_P99_US = 500.0
TENSION_RATIO = 1.2
FORCE_RMS_N = 0.005
CORE_MM = 10.0


@dataclass
class KnotHold:
    """One row: the knot pulled to PULL_FORCE and held under one contact distance and budget."""
    label: str
    distance_mm: float       # strands touch at this centre-line distance
    pulled_s: float          # s, when both couplings first pulled PULL_FORCE (nan: never)
    ticks: np.ndarray        # us, every tick
    held: np.ndarray         # us, the hold's ticks
    substeps: float          # median substeps a held tick
    frozen: int              # ticks the guard put the thread back in (all of the run)
    frozen_held: int         # of them, in the hold
    crossings: int           # segment pairs that passed through each other between two substeps
    unchecked: int           # ticks with more substeps than TRACE_ROWS (their crossings not checked)
    pull: float              # N, the hands' mean pull over the hold
    tension: float           # N, the largest segment tension over the hold
    force_rms: float         # N, the larger hand's force content above ~50 Hz over the hold
    core_mm: float           # mm of thread in the knot's core at the end
    core_contact_mm: float   # the same with the contact distance in place of the diameter (the knot's size as
    #                          the contact lets it be)
    diameter_mm: float       # the thread's diameter
    diverged: float | None = None   # s, when the solver diverged (the run stops there)
    broke: tuple[float, int, float] | None = None   # (s, segment, N): when and where the thread broke (its rated
    #                                                 strength, solver/breakage.py) and the tension it broke under

    def verdicts(self) -> list[tuple[str, bool]]:
        held_p99 = float(np.percentile(self.held, 99)) if self.held.size else math.nan
        run_p99 = float(np.percentile(self.ticks, 99))
        out = [("tick p99 <= 500 us", run_p99 <= TICK_P99_US and (not self.held.size or held_p99 <= TICK_P99_US)),
               ("nothing frozen", self.frozen == 0),
               ("no crossing", self.crossings == 0 and self.unchecked == 0),
               ("the thread whole", self.broke is None)]
        if not self.held.size:   # the pull's tension and smoothness are read over a hold this run never reached
            return out + [("a hold", False)]
        return out + [("tension <= 1.2 x pull", self.tension <= TENSION_RATIO * self.pull),
                      ("<= 5 mN above 50 Hz", self.force_rms <= FORCE_RMS_N),
                      # a knot whose strands the contact keeps further apart than the diameter is as large as that
                      # lets it be
                      ("core <= 10 mm", max(self.core_mm, self.core_contact_mm) <= CORE_MM)]


@dataclass
class AudolyPull:
    """Choi's n = 1 knot pulled tight at 3-0 silk's diameter (tools/validate_contact.choi_n1_silk_case): what it
    cost and how its force reads against Audoly's law."""
    sim_s: float          # s simulated
    wall_s: float         # s of computing
    median: float         # median F / F_Audoly over eps 0.2-0.55
    largest_mn: float     # the largest pull force, mN


@dataclass
class KnotBench:
    rows: list[KnotHold] = field(default_factory=list)
    hold_s: float = HOLD_S
    audoly: AudolyPull | None = None
    reef: list["SutureReef"] = field(default_factory=list)


@dataclass
class SutureReef:
    """The reef knot at a suture's scale (reef-knot-suture: 3-0 silk in 1.25 mm segments, set by four ends, then
    held by its standing parts at 0.37 N each; tools/validate_contact.suture_bend_pull) at silk's friction under
    one contact: whether it holds."""
    label: str
    outcome: str          # holds / slips / undone (suture_bend_pull's)
    slip_mm: float        # how much further apart the standing parts are at the end than 0.5 s after the let-go
    creep_mm: float       # over the last 2 s
    contacts: int         # the most contact pairs at any tick
    crossings: int        # between substeps, every substep checked
    wall_s: float         # s of computing


REEF_S = 20.0   # s: the reef knot's pull, as suturesim validate's suture_reef_silk_case
REEF_ROWS = (("as shipped (1 mm, friction started warm)", {}),
             ("the diameter, friction started warm", {"diameter": True}),
             ("the diameter, friction started cold", {"diameter": True, "warm_friction": False}),
             # the same thread cut into segments of about a diameter (0.25 mm): what a knot at the diameter holds in
             ("the diameter, friction started warm, 2000 segments of 0.25 mm", {"diameter": True, "segments": 2000}))


def knot_core(x: np.ndarray, diameter: float, exclude: int, samples: int = CORE_SAMPLES) -> float:
    """The length (m) of the thread x (n, 3) that lies within CORE_DIAMETERS x ``diameter`` (m; or any other
    scale, such as the contact distance) of another strand of it: of a segment more than ``exclude`` segments
    away along it and, from the point's own place, more than twice that reach away along the thread (a thread
    bent no tighter than that reach does not come back within it). Each segment is sampled at ``samples``
    points (the midpoints of equal parts), each counting its part's length."""
    n_seg = x.shape[0] - 1
    reach = CORE_DIAMETERS * diameter
    seg_len = np.linalg.norm(np.diff(x, axis=0), axis=1)
    start = np.concatenate(([0.0], np.cumsum(seg_len)))       # arc length (m) where each segment begins
    total = 0.0
    u = (np.arange(samples) + 0.5) / samples
    idx = np.arange(n_seg)
    for i in range(n_seg):
        a, b = x[i], x[i + 1]
        part = float(seg_len[i]) / samples
        for s in u:
            arc = start[i] + s * seg_len[i]
            # how far along the thread each other segment's nearest end is from this point
            along = np.where(idx > i, start[idx] - arc, arc - start[idx + 1])
            others = idx[(np.abs(idx - i) > exclude) & (along > 2.0 * reach)]
            if not len(others):
                continue
            p = np.repeat((a + s * (b - a))[None], len(others), 0)
            # a point is a degenerate segment: the segment-segment distance of (p, p) to each other segment
            if float(segment_distance(p, p, x[others], x[others + 1]).min()) < reach:
                total += part
    return total


def _scene(contact: dict | None, solver: dict | None, seconds: float, segments: int | None = None) -> Scenario:
    """two-hand-knot's thread as held_knot lays it, the hands' timeline taken out (run_hold drives them); in
    ``segments`` equal segments instead of the scene's 100 if given (the same knot, laid along the same curve)."""
    sc = held_knot(contact=contact, solver=solver, seconds=seconds)
    src = dict(sc.source)
    if segments is not None:
        src["thread"] = {**src["thread"], "segments": segments}
    src["timeline"] = []
    # the couplings' limit above the pull, so that the held force is the coupling's and not a constant clamp
    src["boundary"] = {**src["boundary"], "grasps": [{**g, "max_force": COUPLING_LIMIT}
                                                     for g in src["boundary"]["grasps"]]}
    return build_scenario(src, sc.file, base_dir=sc.base_dir)


def run_hold(label: str, contact: dict | None = None, solver: dict | None = None,
             hold_s: float = HOLD_S, segments: int | None = None) -> KnotHold:
    """Pull the knot to PULL_FORCE at both hands and hold it ``hold_s`` s (module docstring), timing every tick;
    the run stops where the thread breaks (the hands then pull nothing)."""
    sc = _scene(contact, solver, PULL_MAX_S + SETTLE_S + hold_s, segments)
    m = sc.model
    st = sc.new_state()
    stepper = Stepper(m, st)
    n = st.x.shape[0]
    trace = np.zeros((TRACE_ROWS, n, 3))
    stepper.trace = trace
    ends = sorted(sc.grasps, key=lambda g: g.vertex)    # vertex 0 first, then the far end
    slots = [g.slot for g in ends]
    away = [np.array([-1.0, 0.0, 0.0]), np.array([1.0, 0.0, 0.0])]
    tick = m.solver.tick
    diameter = 2.0 * m.params.contact_radius
    times: list[float] = []
    forces: list[tuple[float, float]] = []
    tensions: list[float] = []
    held_subs: list[int] = []
    frozen = frozen_held = found = unchecked = 0
    pulled: float | None = None
    stop_at = PULL_MAX_S
    hold_from: int | None = None
    end_tick = int(round((PULL_MAX_S + SETTLE_S + hold_s) / tick))
    diverged = None
    broke: tuple[float, int, float] | None = None
    stepper.tick()   # compiled and warm before the first timed tick
    f = (0.0, 0.0)
    for k in range(end_tick):
        t = k * tick
        moving = t < stop_at
        for h, (slot, a) in enumerate(zip(slots, away)):
            # pulling apart; then holding the pull as a hand does, easing in or out slowly with the force's error
            speed = PULL_SPEED if moving else max(-PULL_SPEED, min(PULL_SPEED, HOLD_GAIN * (PULL_FORCE - f[h])))
            st.grasp_vel[slot] = speed * a
        x_start = st.x.copy()
        parted = st.parted.copy()
        t0 = time.perf_counter_ns()
        try:
            subs = stepper.tick()
        except SolverDivergence:
            diverged = t
            break
        times.append((time.perf_counter_ns() - t0) / 1e3)
        st.grasp_vel.fill(0.0)
        if stepper.broke >= 0:
            broke = (t + tick, stepper.broke, stepper.broke_tension)   # the run ends with this tick
        f = (float(np.linalg.norm(st.grasp_force[slots[0]])), float(np.linalg.norm(st.grasp_force[slots[1]])))
        if pulled is None and min(f) >= 0.99 * PULL_FORCE:
            pulled = t + tick
            stop_at = min(stop_at, pulled)
        if hold_from is None and not moving and t >= stop_at + SETTLE_S:
            hold_from = len(times) - 1
            end_tick = min(end_tick, k + int(round(hold_s / tick)))
        if st.contact_stats[CS_REVERTED] > 0:
            frozen += 1
            if hold_from is not None:
                frozen_held += 1
        if subs > TRACE_ROWS:
            unchecked += 1
        else:
            # the trace's rows stay as they are until the next tick
            found += len(substep_crossings(x_start, trace, subs, m.contact.exclude, parted))
        if hold_from is not None:
            held_subs.append(subs)
            forces.append(f)
            tensions.append(float(np.max(np.abs(st.tension))))
        if k + 1 >= end_tick or broke is not None:
            break
    ticks = np.array(times)
    held = ticks[hold_from:] if hold_from is not None else np.zeros(0)
    fa = np.array(forces) if forces else np.zeros((0, 2))
    rms = max(high_frequency_rms(fa[:, 0], tick), high_frequency_rms(fa[:, 1], tick)) if len(fa) > 60 else math.nan
    return KnotHold(label=label, distance_mm=1e3 * m.contact.distance, pulled_s=math.nan if pulled is None else pulled,
                    ticks=ticks, held=held, substeps=float(np.median(held_subs)) if held_subs else math.nan,
                    frozen=frozen, frozen_held=frozen_held,
                    crossings=found, unchecked=unchecked, pull=float(fa.mean()) if len(fa) else math.nan,
                    tension=max(tensions) if tensions else math.nan, force_rms=rms,
                    core_mm=1e3 * knot_core(st.x, diameter, m.contact.exclude),
                    core_contact_mm=1e3 * knot_core(st.x, m.contact.distance, m.contact.exclude),
                    diameter_mm=1e3 * diameter,
                    diverged=diverged, broke=broke)


COLD = {"warm_friction": False}
ROWS = [("as shipped (the diameter, up to 4 substeps, 6 rounds, friction started warm)", None, None, None),
        ("the diameter, friction started cold", COLD, None, None),
        ("3 mm (the scene's contact before), friction started warm", CONTACT_3MM, None, None),
        ("3 mm, friction started cold (the scene before)", {**CONTACT_3MM, **COLD}, None, None),
        # the thread refined uniformly, segments of 2 mm: what a knot at the diameter does where every segment
        # is shorter
        ("the diameter, 225 segments of 2 mm, up to 16 substeps, 32 rounds", {"rounds": 32}, {"max_substeps": 16},
         225)]


def measure_knot(quick: bool, log) -> KnotBench:
    out = KnotBench(hold_s=1.0 if quick else HOLD_S)
    for label, contact, solver, segments in ROWS:
        if quick and segments is not None:   # the refined thread's ticks take milliseconds: not in a smoke test
            continue
        log(f"knot: {label} ...")
        out.rows.append(run_hold(label, contact, solver, out.hold_s, segments))
    if not quick:
        log("knot: Choi's n = 1 in 3-0 silk against Audoly's law ...")
        out.audoly = audoly_pull()
        for label, contact in REEF_ROWS:
            log(f"knot: the reef knot at a suture's scale, {label} ...")
            out.reef.append(suture_reef(label, contact))
    return out


def suture_reef(label: str, contact: dict) -> SutureReef:
    """The reef knot at a suture's scale at silk's friction for REEF_S, ``contact`` over the scene's (its key
    ``diameter``: strands touching at the preset's diameter, 2 x its contact_radius, for the scene's 1 mm;
    ``segments``: the thread cut into that many)."""
    from ..solver.presets import load_preset
    from .validate_contact import suture_bend_pull
    silk = load_preset("silk-3-0")
    over = {k: v for k, v in contact.items() if k not in ("diameter", "segments")}
    if contact.get("diameter"):
        over["distance"] = 2.0 * silk.contact_radius
    t0 = time.perf_counter()
    outcome, slip, creep, run = suture_bend_pull("reef", silk.friction_static, silk.friction_kinetic, REEF_S,
                                                 check=True, contact=over, segments=contact.get("segments"))
    return SutureReef(label, outcome, 1e3 * slip, 1e3 * creep, run.max_contacts, len(run.crossings),
                      time.perf_counter() - t0)


def audoly_pull() -> AudolyPull:
    """Pull choi2021-overhand-n1-silk as choi_n1_silk_case does at 6 mm/s, timed, without the crossing checks."""
    from .validate_contact import CHOI_SILK, CHOI_SPEED, audoly_median, choi_pull
    t0 = time.perf_counter()
    sc, rows, run = choi_pull(1, CHOI_SPEED, scene=CHOI_SILK)
    wall = time.perf_counter() - t0
    return AudolyPull(sim_s=float(run.state.time[0]), wall_s=wall, median=audoly_median(sc, rows),
                      largest_mn=1e3 * rows[:, 1].max())


def render_knot(res: KnotBench) -> list[str]:
    lines = ["## 10. A knot at the thread's true diameter (`suturesim bench knot`)", "",
             "An overhand knot in two-hand-knot's thread (the shipped `silk-3-0`, 0.225 mm across, 45 cm in its "
             f"100 segments of 4.5 mm) pulled apart by both styluses' couplings (1000 N/m, {COUPLING_LIMIT:g} N "
             f"limit) at {1e3 * PULL_SPEED:g} mm/s until both pull {PULL_FORCE:g} N, then held at that pull "
             f"(each hand easing out or in at {1e3 * HOLD_GAIN:g} mm/s per newton short or over) for "
             f"{res.hold_s:g} s from {SETTLE_S:g} s after the pull (`tools/bench_knot.py`). Tick: the "
             "solver's whole tick (`Stepper.tick`), µs, over the run and over the hold; frozen: ticks the "
             "last-resort guard put the thread back in (over the run; of them in the hold); crossings: segment "
             "pairs that passed through each other between two substeps (tools/crossings.py, every substep; a "
             "segment the thread broke at pairs with nothing, and the row says when it broke); the "
             "largest segment tension over the hold against the hands' mean pull; the larger hand's coupling force "
             "above ~50 Hz over the hold (rms of the force less its 20 ms moving average); the knot's core at the "
             "end: thread within 3 diameters of a strand more than the excluded neighbours away, mm, and within 3 "
             "contact distances (how small the contact lets the knot be). A run ends where the thread breaks; "
             "what it did not reach is -.", "",
             "| contact and budget | pulled 3 N at (s) | tick p50 / p99 / max (µs) | held p50 / p99 / max (µs) "
             "| substeps held | frozen (held) | crossings | pull (N) | largest tension (N, × pull) | above 50 Hz "
             "(mN) | knot core (mm) | core at the contact distance (mm) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ppp(a: np.ndarray) -> str:
        if not a.size:
            return "-"
        return " / ".join(f"{v:.0f}" for v in (np.percentile(a, 50), np.percentile(a, 99), a.max()))

    def num(v: float, fmt: str) -> str:
        return format(v, fmt) if math.isfinite(v) else "-"   # not measured: the run never reached it

    for r in res.rows:
        cross = f"{r.crossings}" + (f" ({r.unchecked} ticks unchecked)" if r.unchecked else "")
        ratio = r.tension / r.pull if r.pull and math.isfinite(r.pull) else math.nan
        tension = f"{r.tension:.2f} ({num(ratio, '.2f')})" if math.isfinite(r.tension) else "-"
        broke = (f"; the thread broke at segment {r.broke[1]} under {r.broke[2]:.1f} N at {r.broke[0]:.3f} s"
                 if r.broke is not None else "")
        lines.append(f"| {r.label}{'; diverged at %.2f s' % r.diverged if r.diverged is not None else ''}{broke} "
                     f"| {num(r.pulled_s, '.2f')} | {ppp(r.ticks)} | {ppp(r.held)} | {num(r.substeps, '.0f')} "
                     f"| {r.frozen} ({r.frozen_held}) | {cross} | {num(r.pull, '.3f')} | {tension} "
                     f"| {num(1e3 * r.force_rms, '.2f')} | {r.core_mm:.1f} | {r.core_contact_mm:.1f} |")
    lines.append("")
    for r in res.rows:
        v = r.verdicts()
        missed = [what for what, ok in v if not ok]
        lines.append(f"- {r.label}: " + ("meets every target." if not missed else
                                          "**misses** " + ", ".join(missed) + "."))
    a = res.audoly
    if a is not None:
        from .validate_contact import AUDOLY_BAND, AUDOLY_MEDIAN, audoly_median_meets
        lines += ["", "Choi's n = 1 knot laid at 3-0 silk's diameter, in 3-0 silk (300 segments of 0.234 mm), strands "
                      "touching at 0.225 mm, pulled tight at 6 mm/s (`choi2021-overhand-n1-silk`, docs/PHYSICS.md Sec. "
                      "7: Audoly's law at a suture's diameter; target: the median of F / F_Audoly over eps "
                      f"{AUDOLY_BAND[0]:g}-{AUDOLY_BAND[1]:g} within {AUDOLY_MEDIAN[0]:g}-{AUDOLY_MEDIAN[1]:g}): "
                      f"{a.sim_s:.1f} s simulated in {a.wall_s:.1f} s of computing "
                      f"({a.wall_s / a.sim_s:.2f} s a simulated second), median F / F_Audoly {a.median:.2f} "
                      f"({'meets' if audoly_median_meets(a.median) else '**misses**'}), largest pull {a.largest_mn:.0f} mN."]
    if res.reef:
        lines += ["", "The reef knot at a suture's scale (`reef-knot-suture`: 50 cm of 3-0 silk in 400 segments of "
                      "1.25 mm, the suture scenes' segments, unless the row says otherwise, tied loose, set by all "
                      "four ends at 0.37 N, then held by its standing parts alone at 0.37 N each, what each leg of "
                      "the suture scenes' loop carries) at "
                      f"silk's own friction (0.30 / 0.25), {REEF_S:g} s, under the suture scenes' 1 mm contact and at "
                      "the thread's diameter (tools/validate_contact.suture_bend_pull; slip: how much further apart "
                      "the standing parts are at the end than 0.5 s after the tails were let go; undone past 20 mm; "
                      "creep over the last 2 s; crossings between substeps, every substep checked):", "",
                  "| contact and thread | outcome | slip (mm) | creep, last 2 s (mm) | most contact pairs | "
                  "crossings | computing (s) |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r.label} | {r.outcome} | {r.slip_mm:.2f} | {r.creep_mm:.3f} | {r.contacts} | {r.crossings} | "
                  f"{r.wall_s:.0f} |" for r in res.reef]
    lines += ["", "The targets, for a knot held at the styluses at the thread's own diameter: tick p99 ≤ 500 µs "
                  "(over the run and the hold), nothing frozen, no crossing, no segment's tension above 1.2 × the "
                  "pull, ≤ 5 mN above 50 Hz, a core of ≤ 10 mm of thread (a tight overhand knot of 3-0 takes "
                  "about 3.7 mm: 16.4 diameters).", ""]
    return lines
