"""The self-contact validation cases of `suturesim validate` (issue 3): Wang 2017's plectoneme (Fig. 11-13),
its stiffness series (Fig. 17) and square knot (Fig. 15-16), a thread crumpled by fast random grasp motions,
Coulomb friction by the capstan equation, Choi et al. 2021's trefoil pulled tight (Audoly's law, speed
independence) and their overhand knots of n = 2 ... 4 (the snap-through of n = 3 and 4), and the thesis's knot
test: reef, granny, grief and thief knots under 1 N as friction is lowered.
The Wang cases and the crumple check tunnelling with tools/crossings.py, which shares no code with the solver's
contact, between every two consecutive substeps the integrator went through (Choi's 300-segment rods are not
checked: 45 000 pairs per substep would take hours).
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from ..solver.contact_response import CS_CONTACTS, CS_PENETRATION
from ..solver.integrator import Stepper
from ..solver.scenario import Scenario, build_scenario, load_scenario
from .crossings import substep_crossings, writhe
from .validate import Case


class TracedRun:
    """Runs a scenario tick by tick with a Stepper that records every substep, counting crossings between
    consecutive substeps (``check``), and calls ``probe(state)`` every ``every`` ticks."""

    def __init__(self, sc: Scenario, check: bool = True):
        self.sc = sc
        self.state = sc.new_state()
        self.stepper = Stepper(sc.model, self.state)
        s = sc.model.solver
        self.check = check
        if check:
            self.stepper.trace = np.zeros((max(s.max_substeps, s.retry_substeps) + 1, self.state.x.shape[0], 3))
        self.crossings: list[tuple[int, int, float, float]] = []   # (i, j, tau, t)
        self.max_penetration = 0.0
        self.max_contacts = 0

    def run(self, seconds: float, probe=None, every: int = 10) -> list:
        st, exclude = self.state, self.sc.model.contact.exclude
        out = []
        for k in range(int(round(seconds / self.sc.model.solver.tick))):
            x0, parted = st.x.copy(), st.parted.copy()
            n = self.stepper.tick()
            if self.check:
                for i, j, tau in substep_crossings(x0, self.stepper.trace, n, exclude, parted):
                    self.crossings.append((i, j, tau, float(st.time[0])))
            self.max_penetration = max(self.max_penetration, float(st.contact_stats[CS_PENETRATION]))
            self.max_contacts = max(self.max_contacts, int(st.contact_stats[CS_CONTACTS]))
            if probe is not None and k % every == 0:
                out.append(probe(st))
        return out

    def tunnelling(self) -> str:
        if not self.crossings:
            return "no crossings"
        i, j, _, t = self.crossings[0]
        return f"{len(self.crossings)} CROSSINGS (first: segments {i}, {j} at t = {t:.3f} s)"


def _smooth(v: np.ndarray, width: int) -> np.ndarray:
    k = np.ones(width) / width
    return np.convolve(np.pad(v, (width // 2, width - 1 - width // 2), mode="edge"), k, mode="valid")


def plectoneme_case(plots: Path | None = None, duration: float | None = None) -> list[Case]:
    """Fig. 11-13: the end torque against the input twist drops when a loop forms and rises again once the
    loop's strands press on each other. The torque is smoothed over 0.5 s (the paper's curve oscillates too);
    after its first peak it must fall by half or more, then recover at least a quarter of that fall while
    strands are in contact, and the thread must end coiled (|writhe| >= 1)."""
    sc = load_scenario("wang2017-plectoneme")
    run = TracedRun(sc)
    twist_k = sc.model.twist_k
    rows = np.array(run.run(duration or sc.duration, lambda st: (st.time[0], st.twist[1], twist_k * st.twist[0],
                                                                  st.contact_stats[CS_CONTACTS]), every=10))
    t, tw_in, torque, contacts = rows.T
    sm = _smooth(torque, 50)
    live = tw_in > 0.5
    idx = np.nonzero(live)[0]
    peak = idx[np.argmax(sm[idx])]
    after = np.arange(peak, len(sm))
    trough = after[np.argmin(sm[after])]
    later = np.arange(trough, len(sm))
    rise_at = later[np.argmax(sm[later])]
    drop = (sm[peak] - sm[trough]) / sm[peak] if sm[peak] > 0 else 0.0
    rise = (sm[rise_at] - sm[trough]) / max(sm[peak] - sm[trough], 1e-300)
    touching = float(np.median(contacts[trough:rise_at + 1])) if rise_at > trough else 0.0
    wr = writhe(run.state.x)
    ok = drop >= 0.5 and rise >= 0.25 and touching >= 1 and abs(wr) >= 1.0 and not run.crossings
    if plots is not None:
        _plot_plectoneme(Path(plots), tw_in, torque, sm, contacts, peak, trough, rise_at)
    return [Case("plectoneme: torque drop then rise", drop, ">= 0.5 drop, >= 0.25 rise", ok,
                 f"peak {sm[peak] * 1e3:.2f} mN m at {tw_in[peak]:.1f} rad, trough {sm[trough] * 1e3:.2f} at "
                 f"{tw_in[trough]:.1f} rad, rise {rise:.2f} of the drop to {tw_in[rise_at]:.1f} rad with "
                 f"{touching:.0f} contacts; writhe {wr:.2f}; {run.tunnelling()}")]


def _plot_plectoneme(plots: Path, tw_in, torque, sm, contacts, peak, trough, rise_at) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plots.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a.plot(tw_in, torque * 1e3, lw=0.6, color="0.6", label="end torque")
    a.plot(tw_in, sm * 1e3, lw=1.5, label="smoothed over 0.5 s")
    for k, name in ((peak, "peak"), (trough, "A: loop formed"), (rise_at, "B: after self-contact")):
        a.annotate(name, (tw_in[k], sm[k] * 1e3), textcoords="offset points", xytext=(5, 8))
        a.plot(tw_in[k], sm[k] * 1e3, "o", color="C3")
    a.set_ylabel("torque (mN m)")
    a.legend(loc="upper left")
    a.set_title("Plectoneme (Wang 2017 Fig. 12): end torque against input twist")
    b.plot(tw_in, contacts, drawstyle="steps-post")
    b.set_ylabel("contacts")
    b.set_xlabel("input twist (rad)")
    fig.tight_layout()
    fig.savefig(plots / "plectoneme-torque.png", dpi=100)
    plt.close(fig)


def fig17_case(duration: float | None = None) -> list[Case]:
    """Fig. 17: three bending stiffnesses under the same twist load (50 pi): no tunnelling, and the softer
    thread forms more loops (|writhe|). EI = k_b / 2, Appendix C's reading (the scenario file says why)."""
    wr = {}
    notes = []
    total = 0
    for variant, k_b in (("a", 0.001), ("b", 0.0005), ("c", 0.00025)):
        sc = load_scenario("wang2017-plectoneme-stiffness",
                           {"thread": {"preset": f"wang2017-fig17{variant}", "bending_stiffness": 0.5 * k_b}})
        run = TracedRun(sc)
        run.run(duration or sc.duration)
        wr[variant] = abs(writhe(run.state.x))
        total += len(run.crossings)
        notes.append(f"{variant}: EI = {sc.model.params.bending_stiffness:.3g} N m^2, |writhe| {wr[variant]:.2f}, "
                     f"{run.tunnelling()}")
    # (b) and (c) end within a few per cent of the 25 turns of input, so they are only required not to invert
    ordered = wr["a"] + 1.0 < min(wr["b"], wr["c"]) and wr["b"] < wr["c"] + 0.5
    return [Case("Fig. 17 twist load: no tunnelling", total, "0 crossings", total == 0, "; ".join(notes)),
            Case("Fig. 17: softer, more loops", wr["c"] - wr["a"], "|Wr| a < b ~< c", ordered,
                 ", ".join(f"{k} {v:.2f}" for k, v in wr.items()))]


def square_knot_case(duration: float | None = None) -> list[Case]:
    """Fig. 15-16: the axial force at the pulled end rises while the knot tightens and then stays level; the
    end-to-end distance rises and levels off below the thread's length (the knot is still there)."""
    sc = load_scenario("wang2017-square-knot")
    run = TracedRun(sc)
    L = sc.model.params.length
    rows = np.array(run.run(duration or sc.duration,
                            lambda st: (st.time[0], float(np.linalg.norm(st.grasp_force[0])),
                                        float(np.linalg.norm(st.x[-1] - st.x[0])) / L,
                                        st.contact_stats[CS_CONTACTS]), every=10))
    t, force, ratio, contacts = rows.T
    last = t >= t[-1] - 2.0
    before = (t >= t[-1] - 4.0) & ~last
    f_level = float(np.mean(force[last]))
    f_change = abs(f_level - float(np.mean(force[before]))) / max(f_level, 1e-300)
    r_change = float(np.ptp(ratio[last]))
    rose = force[last].mean() > 5.0 * max(force[: max(1, len(force) // 10)].mean(), 1e-6)
    held = ratio[-1] < 0.95 and contacts[-1] >= 5
    ok = rose and f_change < 0.1 and r_change < 0.01 and ratio[-1] > ratio[0] and held and not run.crossings
    return [Case("square knot: force plateau, knot holds", f_level, "rise, level +-10 %, e2e level", ok,
                 f"force {force[:len(force) // 10].mean():.3f} -> {f_level:.3f} N (last 2 s vs 2 s before: "
                 f"{f_change * 100:.1f} %); e2e/L {ratio[0]:.3f} -> {ratio[-1]:.3f} (last 2 s range "
                 f"{r_change:.4f}); {contacts[-1]:.0f} contacts at the end; max penetration "
                 f"{run.max_penetration * 1e3:.2f} mm of {sc.model.contact.distance * 1e3:.1f}; {run.tunnelling()}")]


def crumple_scenario(seed: int, duration: float, speed: float = 0.5, hands: tuple = (0, 60),
                     max_force: float = 2.0) -> Scenario:
    """A weightless 3-0 silk suture (60 segments, 0.27 m) held at the vertices ``hands`` (default: both ends,
    two styluses); each grasp makes random straight moves inside one 2 cm box at 0.2 to 1 times ``speed`` m/s,
    pulling with at most ``max_force`` N, so the thread, thirteen times longer than the box, is crumpled into
    itself again and again."""
    rng = np.random.default_rng(seed)
    n_seg, l = 60, 0.0045
    centre = np.array([n_seg * l / 2, 0.0, 0.0])
    timeline, grasps = [], []
    for k, vertex in enumerate(hands):
        p = np.array([vertex * l, 0.0, 0.0])
        t = 0.0
        wps = [[0.0, *p]]
        while t < duration:
            q = centre + rng.uniform(-0.01, 0.01, 3)
            t += max(float(np.linalg.norm(q - p)) / (rng.uniform(0.2, 1.0) * speed), 0.005)
            wps.append([t, *q])
            p = q
        gid = f"hand{k}"
        grasps.append({"id": gid, "vertex": vertex, "stiffness": 500.0, "damping": 0.5, "max_force": max_force})
        timeline.append({"grasp": gid, "waypoints": wps})
    data = {
        "name": f"crumple-{seed}", "duration": duration,
        "thread": {"preset": "silk-3-0", "length": n_seg * l, "segments": n_seg},
        "gravity": [0.0, 0.0, 0.0],
        "shape": {"kind": "straight", "start": [0.0, 0.0, 0.0], "direction": [1.0, 0.0, 0.0]},
        "boundary": {"grasps": grasps},
        "timeline": timeline,
        "contact": {},                   # the preset's: k_s, friction
    }
    return build_scenario(data, f"crumple-{seed}")


def crumple_case(duration: float = 30.0, seed: int = 1, hands: tuple = (0, 60)) -> list[Case]:
    """The randomized stress test: a suture crumpled by hands grasping ``hands`` (default: both ends; four
    hands squeeze it from both ends and two inner points), no crossing between any two consecutive substeps."""
    sc = crumple_scenario(seed, duration, hands=hands)
    run = TracedRun(sc)
    run.run(duration)
    ok = not run.crossings and math.isfinite(float(run.state.x.sum()))
    return [Case(f"crumple {duration:.0f} s: no tunnelling", len(run.crossings), "0 crossings", ok,
                 f"silk 3-0, 60 segments, {len(sc.grasps)} grasps at up to 0.5 m/s in a 2 cm box; most contacts {run.max_contacts}, max "
                 f"penetration {run.max_penetration * 1e6:.0f} um of {sc.model.contact.distance * 1e6:.0f}; "
                 f"{run.stepper.retries} ticks redone; {run.tunnelling()}")]


def run_contact(quick: bool = False, plots: Path | None = None, add=print) -> None:
    """Every contact case, each passed to ``add``."""
    for c in square_knot_case():
        add(c)
    for c in plectoneme_case(plots):
        add(c)
    for c in fig17_case():
        add(c)
    for c in crumple_case(5.0 if quick else 30.0):
        add(c)
    for c in capstan_case():
        add(c)
    for c in capstan_polygon_case():
        add(c)
    curves: dict = {}
    for c in choi_n1_case((6e-3,) if quick else (3e-3, 6e-3, 9e-3), curves=curves):
        add(c)
    for c in choi_n1_silk_case((6e-3,) if quick else (3e-3, 6e-3), check=not quick, curves=curves):
        add(c)
    if plots is not None:
        plot_audoly(Path(plots), curves)
    if not quick:
        for c in choi_inversion_case(plots=plots):
            add(c)
    for c in (bend_case(("reef", "granny"), start=0.5) if quick else bend_case()):
        add(c)
    for c in (suture_bend_case(("reef", "granny"), start=0.4) if quick else suture_bend_case()):
        add(c)


SUTURE_CREEP = 1e-3     # m: a knot whose standing parts draw apart by more than this over the last 2 s still slips
SUTURE_UNDONE = 0.02    # m: by more than its 2 cm tails from 0.5 s after the let-go, it is undone


def suture_bend_pull(kind: str, mu: float, mu_kinetic: float | None = None, duration: float = 10.0,
                     check: bool = False, solver: dict | None = None,
                     contact: dict | None = None,
                     segments: int | None = None) -> tuple[str, float, float, "TracedRun"]:
    """configs/scenarios/reef-knot-suture.yaml with the bend ``kind`` and friction ``mu`` (static; kinetic
    ``mu_kinetic``, by default the same): the knot set by all four ends, the tails let go at 1.5 s, the
    standing parts pulled on with 0.37 N each; ``solver``, ``contact`` and ``segments`` as bend_scenario's. Returns
    (outcome, slip (m): how much further apart the standing parts are at the end than 0.5 s after the let-go,
    creep (m) over the last 2 s, the run). "undone" once the slip passes SUTURE_UNDONE (at any time), "slips"
    while the creep is over SUTURE_CREEP, else "holds"."""
    sc, (ga, gb) = bend_scenario(kind, mu, duration, scene="reef-knot-suture", mu_kinetic=mu_kinetic,
                                 solver=solver, contact=contact, segments=segments)
    run = TracedRun(sc, check=check)
    rows = np.array(run.run(duration, probe=lambda s: (float(s.time[0]), float(np.linalg.norm(s.x[ga] - s.x[gb]))),
                            every=50))
    settled = float(np.interp(_let_go(sc) + 0.5, rows[:, 0], rows[:, 1]))
    slip = float(rows[-1, 1]) - settled
    creep = float(rows[-1, 1]) - float(np.interp(duration - 2.0, rows[:, 0], rows[:, 1]))
    if slip > SUTURE_UNDONE or float(rows[:, 1].max()) - settled > SUTURE_UNDONE:
        return "undone", slip, creep, run
    return ("slips" if creep > SUTURE_CREEP else "holds"), slip, creep, run


def _let_go(sc: Scenario) -> float:
    """When (s) the scenario's hands let go of the tails: its timeline's last release."""
    return max(float(e["release"]) for e in sc.source["timeline"] if "release" in e)


def suture_reef_silk_case(duration: float = 20.0) -> list[Case]:
    """The reef knot at a suture's scale (reef-knot-suture.yaml) at the silk preset's own friction (0.30
    static, 0.25 kinetic): it must hold, with no crossing."""
    from ..solver.presets import load_preset
    silk = load_preset("silk-3-0")
    mu_s, mu_k = silk.friction_static, silk.friction_kinetic
    outcome, slip, creep, run = suture_bend_pull("reef", mu_s, mu_k, duration)
    let_go = _let_go(run.sc)
    return [Case(f"reef knot at a suture's scale, silk's friction {mu_s:g}/{mu_k:g}: slip over "
                 f"{duration - let_go - 0.5:g} s (mm)", slip * 1e3, "holds (creep < 1 mm in 2 s)",
                 outcome == "holds" and not run.crossings,
                 f"{outcome}, {creep * 1e3:.2f} mm in the last 2 s; 3-0 silk, 1 mm contact, 400 x 1.25 mm, set by "
                 f"four ends at 0.37 N, tails let go at {let_go:g} s; {run.tunnelling()}")]


def suture_bend_case(kinds=("reef", "granny", "grief", "thief"), start: float = 0.5, step: float = 0.1,
                     duration: float = 20.0) -> list[Case]:
    """The knot test at a suture's scale (reef-knot-suture.yaml): first the reef knot at the silk preset's own
    friction (suture_reef_silk_case), which must hold; then each bend with friction (static = kinetic)
    lowered from ``start`` in ``step`` until it comes undone (a knot may slip a few millimetres and settle: the
    lowest mu "held" is the lowest at which it had settled by the end). The reef knot must hold at silk's 0.3,
    come undone when friction is lowered far enough, and be the most secure of the four."""
    pull = functools.partial(_suture_bend_outcome, duration=duration)
    return suture_reef_silk_case(duration) + _ladder_cases(kinds, start, step, pull, "at a suture's scale, 0.37 N")


def _suture_bend_outcome(kind: str, mu: float, duration: float) -> tuple[str, str]:
    """suture_bend_pull's outcome of ``kind`` at ``mu`` for ``duration`` s, and a note of it for a ladder's row."""
    outcome, slip, creep, _ = suture_bend_pull(kind, mu, duration=duration)
    return outcome, f"{outcome} ({slip * 1e3:.1f} mm, {creep * 1e3:.1f} in the last 2 s)"


def _bend_outcome(kind: str, mu: float, duration: float) -> tuple[str, str]:
    """bend_pull's outcome of ``kind`` at ``mu`` for ``duration`` s, and a note of it for a ladder's row."""
    outcome, slip, _, _ = bend_pull(kind, mu, duration)
    return outcome, f"{'held' if outcome == 'holds' else 'undone'} ({slip * 1e3:.0f} mm)"


def _ladder_cases(kinds, start: float, step: float, pull, label: str) -> list[Case]:
    """The thesis's friction ladder: for each bend, friction lowered from ``start`` in ``step`` until
    ``pull(kind, mu)`` -> (outcome, note) says "undone"; a row per kind with the lowest mu whose outcome was
    "holds". The reef knot must hold at 0.3 or below (the silk preset's value), come undone when friction is
    lowered far enough, and be the most secure of the four (the thesis: reef > granny > thief ~ grief)."""
    held: dict[str, float] = {}
    notes: dict[str, str] = {}
    for kind in kinds:
        lowest = math.inf
        mu = start
        trail = []
        while mu > -1e-9:
            outcome, note = pull(kind, round(mu, 3))
            trail.append(f"{mu:.2f} {note}")
            if outcome == "undone":
                break
            if outcome == "holds":
                lowest = mu
            mu -= step
        held[kind] = lowest
        notes[kind] = ", ".join(trail)
    reef = held.get("reef", math.inf)
    cases = []
    for kind in kinds:
        ok = True
        if kind == "reef":
            ok = 0.0 < reef <= 0.3 + 1e-9 and all(reef <= v for v in held.values())
        cases.append(Case(f"{kind} knot {label}: lowest mu held", held[kind] if math.isfinite(held[kind])
                          else float("nan"), "reef lowest, <= 0.3" if kind == "reef" else "(reported)", ok,
                          notes[kind]))
    return cases


def _boundary_cases(kinds, held_mu: float, undone_mu: float, pull, label: str) -> list[Case]:
    """What _ladder_cases asserts, from the runs at its boundary only: the reef knot holds at ``held_mu`` (0.3,
    the silk preset's) and not at ``undone_mu`` (``held_mu`` less the ladder's step), and no other bend holds
    at ``undone_mu``. Friction only ever resists the slip (a bend that holds at mu holds at any higher mu, as
    every ladder run has shown), so this is the ladder's verdict: the reef's lowest mu held is ``held_mu``,
    above 0, and no other bend's is lower. ``pull(kind, mu)`` -> (outcome, note) as for _ladder_cases."""
    reef_held, note_held = pull("reef", held_mu)
    outcomes = {kind: pull(kind, undone_mu) for kind in kinds}
    reef_below, note_below = outcomes["reef"]
    cases = [Case(f"reef knot {label}: holds at mu = {held_mu:g}, not at {undone_mu:g}", held_mu,
                  f"holds at {held_mu:g}, not at {undone_mu:g}", reef_held == "holds" and reef_below != "holds",
                  f"{held_mu:.2f} {note_held}, {undone_mu:.2f} {note_below}")]
    for kind in kinds:
        if kind != "reef":
            outcome, note = outcomes[kind]
            cases.append(Case(f"{kind} knot {label}: not more secure than the reef", undone_mu,
                              f"does not hold at {undone_mu:g}", outcome != "holds", f"{undone_mu:.2f} {note}"))
    return cases


def bend_boundary_case(kinds=("reef", "granny", "grief", "thief"), held_mu: float = 0.3, undone_mu: float = 0.2,
                       duration: float = 5.0) -> list[Case]:
    """bend_case's verdict from the runs at its boundary (_boundary_cases): 5 runs where the ladder takes 19."""
    pull = functools.partial(_bend_outcome, duration=duration)
    return _boundary_cases(kinds, held_mu, undone_mu, pull, "1 N")


def suture_bend_boundary_case(kinds=("reef", "granny", "grief", "thief"), held_mu: float = 0.3,
                              undone_mu: float = 0.2, duration: float = 20.0) -> list[Case]:
    """suture_bend_case's ladder verdict from the runs at its boundary (_boundary_cases): 5 runs where the
    ladder takes 10 (the reef at silk's own friction is suture_reef_silk_case)."""
    pull = functools.partial(_suture_bend_outcome, duration=duration)
    return _boundary_cases(kinds, held_mu, undone_mu, pull, "at a suture's scale, 0.37 N")


AUDOLY_SIGMA = 0.492   # Audoly et al. 2007's constant for the trefoil (Choi 2021 Eq. 25)


CHOI_SPEED = 6e-3   # m/s: the scenes' pull speed u, the rate the end-to-end distance grows at


CHOI_SILK = "choi2021-overhand-n1-silk"   # Choi's n = 1 knot laid at 3-0 silk's diameter, in 3-0 silk


def choi_pull(n: int, speed: float = CHOI_SPEED, check: bool = False,
              scene: str | None = None) -> tuple[Scenario, np.ndarray, "TracedRun"]:
    """Pull Choi's overhand knot of unknotting number n (in ``scene``, default choi2021-overhand-n<n>) from both
    ends, the end-to-end distance growing at ``speed`` (m/s), as far as the scene does. Returns the scenario and
    rows (t, pull force F (N) = mean axial force of the first segments past the driven ends, end-to-end
    shortening e = L - x (m)) every 10 ms, and the run."""
    name = scene or f"choi2021-overhand-n{n}"
    sc = load_scenario(name)
    if speed != CHOI_SPEED:
        # the same pull distance at another speed: every driven end's velocity scaled, from the same start
        k = speed / CHOI_SPEED
        timeline = [{**e, "velocity": [v * k for v in e["velocity"]], "to": e["from"] + (e["to"] - e["from"]) / k}
                    for e in sc.source["timeline"]]
        sc = load_scenario(name, {"timeline": timeline, "duration": max(e["to"] for e in timeline)})
    run = TracedRun(sc, check=check)
    L = sc.model.params.length
    free = np.flatnonzero(sc.model.kinematic == 0)
    first, last = int(free[0]) - 1, int(free[-1])    # the segments from the last driven vertex at each end
    rows = np.array(run.run(sc.duration, lambda st: (st.time[0], 0.5 * (st.tension[first] + st.tension[last]),
                                                     L - float(np.linalg.norm(st.x[-1] - st.x[0]))), every=10))
    return sc, rows, run


CHOI_SMOOTH = 51       # rows (0.51 s) of the running median the pull force is smoothed by
CHOI_FALL = 0.8        # a snap-through: the smoothed pull force falls below this fraction of itself ...
CHOI_FALL_WINDOW = 50  # ... within this many rows (0.5 s) ...
CHOI_FALL_FLOOR = 3e-3  # ... from above this force (N)


def force_falls(rows: np.ndarray) -> list[tuple[float, float, float, float]]:
    """The sudden drops of the pull force in choi_pull's rows (t, F, e): the force smoothed by a running
    median over CHOI_SMOOTH rows (which takes out the stick-slip sawtooth of 10-30 %), falling below CHOI_FALL of
    itself within 0.5 s from above CHOI_FALL_FLOOR, after the first 3 s (the relaxed knot's tails coming taut).
    Returns (t (s), e (m), smoothed force before, after (N)) for each, 2 s apart at least."""
    from numpy.lib.stride_tricks import sliding_window_view
    t, F, e = rows[rows[:, 0] > 3.0].T
    w = CHOI_FALL_WINDOW
    if len(F) < 2 * w:
        return []
    S = np.median(sliding_window_view(np.pad(F, CHOI_SMOOTH // 2, mode="edge"), CHOI_SMOOTH), axis=1)
    ratio = S[w:] / np.maximum(S[:-w], 1e-300)
    out: list[tuple[float, float, float, float]] = []
    k = 0
    while k < len(ratio):
        if S[k] > CHOI_FALL_FLOOR and ratio[k] < CHOI_FALL:
            j = k + int(np.argmin(ratio[k:k + w]))      # the steepest 0.5 s of this drop
            out.append((float(t[j]), float(e[j]), float(S[j]), float(S[j + w])))
            k = j + 200
        else:
            k += 1
    return out


def choi_inversion_case(ns=(2, 3, 4), plots: Path | None = None) -> list[Case]:
    """Choi 2021 Fig. 6: pulled tight from their own initial knots, the knots of n = 3 and n = 4 snap through
    (in Choi's words the loop turns from near-circular to distorted; here a sudden drop of the pull force), n = 2
    does not, as far as Choi's pulls went (the scenes end there). One row per n: the number of drops
    (force_falls)."""
    expect = {1: 0, 2: 0, 3: 1, 4: 1}
    cases, curves = [], {}
    for n in ns:
        sc, rows, _ = choi_pull(n)
        falls = force_falls(rows)
        curves[n] = (rows, falls)
        ok = (len(falls) >= 1) if expect[n] else not falls
        what = "; ".join(f"e = {e * 1e3:.0f} mm, {a * 1e3:.1f} -> {b * 1e3:.1f} mN" for _, e, a, b in falls)
        cases.append(Case(f"Choi n={n}: inversion", float(len(falls)), ">= 1 drop" if expect[n] else "no drop", ok,
                          f"{what or 'no drop'}; largest force {rows[:, 1].max() * 1e3:.0f} mN, pulled to "
                          f"e = {rows[-1, 2] * 1e3:.0f} mm"))
    if plots is not None:
        _plot_choi(Path(plots), curves)
    return cases


def _plot_choi(plots: Path, curves: dict) -> None:
    """The pull force against e for each n, ``curves`` {n: (choi_pull's rows, their force_falls)}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plots.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 5))
    for n, (rows, falls) in curves.items():
        t, F, e = rows[rows[:, 0] > 1.5].T
        ax.semilogy(e * 1e3, np.maximum(F, 1e-5) * 1e3, lw=0.7, label=f"n = {n}")
        for _, ef, a, _ in falls:
            ax.annotate("", (ef * 1e3, a * 1e3), xytext=(ef * 1e3, a * 2e3),
                        arrowprops={"arrowstyle": "->", "color": "k"})
    ax.invert_xaxis()
    ax.set_xlabel("end-to-end shortening e (mm)")
    ax.set_ylabel("pull force (mN)")
    ax.set_title("Choi 2021's overhand knots pulled tight (their initial knots); arrows: snap-through")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(plots / "choi-overhand-pulls.png", dpi=100)
    plt.close(fig)


def audoly_force(sc: Scenario, e: np.ndarray, mu: float) -> np.ndarray:
    """Choi 2021 Eq. 25 (Audoly et al. 2007), tightening branch: F = EI / h^2 (eps^4 / 2 + mu sigma eps^3), with
    h the rod's radius and eps = sqrt(h / R), R = e / 2 pi (N)."""
    p = sc.model.params
    h = p.diameter / 2.0
    eps = np.sqrt(h * 2.0 * np.pi / e)
    return p.bending_stiffness / h ** 2 * (eps ** 4 / 2.0 + mu * AUDOLY_SIGMA * eps ** 3)


AUDOLY_BAND = (0.2, 0.55)     # eps = sqrt(h / R) over which a pull is read against Audoly's law
AUDOLY_MEDIAN = (0.5, 2.0)    # where the median of F / F_Audoly over the band must lie at a suture's diameter


def audoly_median(sc: Scenario, rows: np.ndarray) -> float:
    """The median of F / F_Audoly over AUDOLY_BAND of choi_pull's ``rows`` (nan if the pull never reached it)."""
    return _median(_band_ratio(sc, rows, *AUDOLY_BAND))


def _median(ratio: np.ndarray) -> float:
    return float(np.median(ratio)) if len(ratio) else math.nan


def audoly_median_meets(median: float) -> bool:
    return AUDOLY_MEDIAN[0] <= median <= AUDOLY_MEDIAN[1]


def _band_ratio(sc: Scenario, rows: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """F / F_Audoly over the samples taken while pulling whose eps = sqrt(h / R) lies in [lo, hi]."""
    h = sc.model.params.diameter / 2.0
    t, F, e = rows[rows[:, 0] > 1.5].T
    eps = np.sqrt(h * 2.0 * np.pi / np.maximum(e, 1e-9))
    band = (eps >= lo) & (eps <= hi)
    return F[band] / audoly_force(sc, e[band], sc.model.contact.friction_kinetic)


def choi_n1_case(speeds=(3e-3, 6e-3, 9e-3), curves: dict | None = None) -> list[Case]:
    """n = 1: the pull force against eps = sqrt(h / R) follows Audoly's law while the knot tightens
    (0.2 <= eps <= 0.55), within a factor of 0.4 ... 2.5 (Choi's own curve 'roughly follows' it and drifts off
    when tight), and does not depend on the pull speed (Coulomb friction does not): the median of F / F_Audoly
    over the band differs by at most 15 % between the speeds."""
    ratios = {}
    sc = None
    for u in speeds:
        sc, rows, _ = choi_pull(1, u)
        ratios[u] = _band_ratio(sc, rows, *AUDOLY_BAND)
        if curves is not None and u == CHOI_SPEED:
            curves["Choi's rod, 3.2 mm"] = (sc, rows)
    mu = sc.model.contact.friction_kinetic
    h = sc.model.params.diameter / 2.0
    ratio = ratios[6e-3] if 6e-3 in ratios else ratios[speeds[0]]
    ok_law = len(ratio) > 10 and 0.4 <= ratio.min() and ratio.max() <= 2.5
    cases = [Case("Choi n=1: Audoly's law", float(np.median(ratio)) if len(ratio) else math.nan,
                  "F / F_Audoly in [0.4, 2.5]", ok_law,
                  f"eps 0.2..0.55 at 6 mm/s: ratio {ratio.min():.2f} .. {ratio.max():.2f} (median "
                  f"{np.median(ratio):.2f}), mu_k = {mu}, EI / h^2 = {sc.model.params.bending_stiffness / h ** 2:.3f} N")]
    if len(speeds) > 1:
        med = np.array([np.median(r) for r in ratios.values()])
        spread = float(np.ptp(med) / np.mean(med))
        cases.append(Case("Choi n=1: force independent of speed", spread, "<= 0.15 spread", spread <= 0.15,
                          "median F / F_Audoly: " + ", ".join(f"{u * 1e3:g} mm/s {m:.2f}"
                                                              for u, m in zip(ratios, med))))
    return cases


AUDOLY_BANDS = ((0.2, 0.3), (0.3, 0.4), (0.4, 0.55))   # eps = sqrt(h / R): loose, tighter, tight


def choi_n1_silk_case(speeds=(6e-3,), check: bool = True, curves: dict | None = None) -> list[Case]:
    """Audoly's law at a suture's scale: Choi's n = 1 knot laid at 3-0 silk's diameter, in 3-0 silk, strands
    touching at the thread's own 0.225 mm (choi2021-overhand-n1-silk), pulled tight. The median of F / F_Audoly
    over the band 0.2 <= eps <= 0.55 lies within 0.5 ... 2, as at Choi's scale (choi_n1_case); the detail gives
    the median in each of AUDOLY_BANDS, the largest pull force, and the crossings between substeps (``check``,
    tools/crossings.py on every substep). With two speeds or more, the medians differ by at most 15 %."""
    medians, cases = {}, []
    for u in speeds:
        sc, rows, run = choi_pull(1, u, check=check, scene=CHOI_SILK)
        ratio = _band_ratio(sc, rows, *AUDOLY_BAND)
        med = _median(ratio)   # audoly_median's, from the band already taken
        medians[u] = med
        if curves is not None and u == speeds[0]:
            curves["3-0 silk, 0.225 mm"] = (sc, rows)
        bands = ", ".join(f"{lo:g}-{hi:g} {np.median(b):.2f}" for lo, hi in AUDOLY_BANDS
                          if len(b := _band_ratio(sc, rows, lo, hi)))
        ok = len(ratio) > 10 and audoly_median_meets(med) and (not check or not run.crossings)
        cases.append(Case(f"Choi n=1 in 3-0 silk: Audoly ({u * 1e3:g} mm/s)", med,
                          f"median F / F_Audoly in [{AUDOLY_MEDIAN[0]:g}, {AUDOLY_MEDIAN[1]:g}]",
                          ok, f"median by eps band: {bands}; largest force {rows[:, 1].max() * 1e3:.0f} mN at "
                              f"e = {rows[-1, 2] * 1e3:.1f} mm; "
                              f"{run.tunnelling() if check else 'crossings not checked'}"))
    if len(speeds) > 1:
        med = np.array(list(medians.values()))
        spread = float(np.ptp(med) / np.mean(med))
        cases.append(Case("Choi n=1 in 3-0 silk: speed", spread, "<= 0.15 spread", spread <= 0.15,
                          "median F / F_Audoly: " + ", ".join(f"{u * 1e3:g} mm/s {m:.2f}" for u, m in medians.items())))
    return cases


def plot_audoly(plots: Path, curves: dict) -> None:
    """audoly-law.png: each of ``curves`` {label: (scenario, choi_pull's rows)}: (left) the tightening force
    against the end-to-end shortening e with Audoly's law for its rod (Choi 2021 Eq. 25); (right) both made
    dimensionless, F h^2 / EI against eps = sqrt(h / R), R = e / 2 pi, where the law is one curve for every rod,
    the band it is read over shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plots.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.6))
    mu = None
    for (label, (sc, rows)), colour in zip(curves.items(), ("tab:blue", "tab:red")):
        p, mu = sc.model.params, sc.model.contact.friction_kinetic
        h = p.diameter / 2.0
        t, F, e = rows[rows[:, 0] > 1.5].T
        keep = F > 0.0
        a.loglog(e[keep] * 1e3, F[keep] * 1e3, lw=0.8, color=colour, label=f"{label}: measured")
        a.loglog(e * 1e3, audoly_force(sc, e, mu) * 1e3, "--", lw=1, color=colour, label=f"{label}: Audoly")
        eps = np.sqrt(h * 2.0 * np.pi / np.maximum(e, 1e-12))
        b.loglog(eps[keep], F[keep] * h ** 2 / p.bending_stiffness, lw=0.8, color=colour, label=label)
    eps = np.linspace(0.08, 0.6, 200)
    b.loglog(eps, eps ** 4 / 2.0 + mu * AUDOLY_SIGMA * eps ** 3, "k--", lw=1.2,
             label=f"Audoly: eps^4 / 2 + mu sigma eps^3 (mu = {mu:g})")
    b.axvspan(*AUDOLY_BAND, color="0.9", zorder=0)
    a.invert_xaxis()
    a.set_xlabel("end-to-end shortening e (mm)")
    a.set_ylabel("pull force (mN)")
    b.set_xlabel("eps = sqrt(h / R), R = e / 2 pi")
    b.set_ylabel("F h^2 / EI")
    a.set_title("Choi's n = 1 overhand knot pulled tight")
    b.set_title("dimensionless: one law for both rods (band shaded)")
    for ax in (a, b):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plots / "audoly-law.png", dpi=100)
    plt.close(fig)


def capstan_scenario(mu: float, load: float = 0.1, speed: float = 0.005, duration: float = 4.0,
                     radius: float = 0.03, polygon: bool | None = None) -> Scenario:
    """A limp thread of 5 mm segments draped over a stretch of itself: a post of 40 pinned segments along x;
    the strand goes up at y = -radius, over the post in a half circle (contact distance = radius, so with the
    default 3 cm the strand wraps its neighbour in 19 segments) and down at y = +radius. The left leg's foot
    carries ``load`` (N, pulling down); a grasp pulls the right leg's foot down at ``speed`` (m/s) from t = 0.5 s,
    so the strand slides over the post. The post and the left foot are joined by a slack loop of thread that
    carries nothing. Weightless, friction mu (static = kinetic); ``polygon`` sets contact.polygon_friction (None:
    its default)."""
    l, R, leg = 0.005, radius, 0.1
    post = [[-0.1 + l * i, 0.0, 0.0] for i in range(41)]
    # the slack loop from the post's end down and round to the left foot, 0.4 m for a 0.18 m span
    loop = [[0.1, -0.02 * k, -0.03 * k] for k in range(1, 6)]
    loop += [[0.1 - 0.02 * k, -0.1, -0.15 - 0.02 * math.sin(math.pi * k / 5)] for k in range(1, 6)]
    foot_l = [0.0, -R, -leg]
    up = [[0.0, -R, -leg + l * k] for k in range(int(round(leg / l)) + 1)]
    n_arc = max(3, int(round(math.pi * R / l)))
    arc = [[0.0, -R * math.cos(a), R * math.sin(a)] for a in np.linspace(0.0, math.pi, n_arc + 1)[1:]]
    down = [[0.0, R, -l * k] for k in range(1, int(round(leg / l)) + 1)]
    pts = np.array(post + loop + up + arc + down)
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    n_seg = len(pts) - 1
    foot = len(post) + len(loop)
    assert np.allclose(pts[foot], foot_l)
    data = {
        "name": f"capstan-mu{mu:g}", "duration": duration,
        "thread": {"preset": "wang2017-square-knot", "length": float(seg.sum()), "segments": n_seg,
                   "mass": 0.01 * float(seg.sum()), "bending_stiffness": 1e-7,
                   # drag settles the step of the load within ~0.2 s (rate c / rho A = 20 /s) and costs
                   # 0.3 mN (0.3 % of the load) at the sliding speed
                   "twisting_stiffness": 0.0, "air_drag_linear": 0.2},
        "gravity": [0.0, 0.0, 0.0],
        "shape": {"kind": "points", "points": pts.tolist()},
        "boundary": {"pinned": list(range(len(post))),
                     "forces": [{"vertex": foot, "force": [0.0, 0.0, -load]}],
                     "grasps": [{"id": "pull", "vertex": n_seg, "stiffness": 1000.0, "damping": 1.0,
                                 "max_force": 10.0}]},
        "timeline": [{"grasp": "pull", "velocity": [0.0, 0.0, -speed], "from": 0.5, "to": duration}],
        # exclude: the strand bent over the post at radius R = distance meets itself within an arc of pi R / 3
        "contact": {"distance": R, "stiffness": 1000.0, "exclude": int(math.ceil(math.pi * R / 3.0 / l)) + 1,
                    "min_gap": 0.9 * R, "friction_static": mu, "friction_kinetic": mu},
    }
    if polygon is not None:
        data["contact"]["polygon_friction"] = polygon
    return build_scenario(data, f"capstan-mu{mu:g}")


def capstan_pull(mu: float, load: float = 0.1, radius: float = 0.03,
                 polygon: bool | None = None) -> tuple[float, "TracedRun"]:
    """The mean pull (N) over the last 2 s of capstan_scenario's 4 s, and the run."""
    sc = capstan_scenario(mu, load, radius=radius, polygon=polygon)
    run = TracedRun(sc)
    rows = np.array(run.run(sc.duration, lambda st: (st.time[0], float(np.linalg.norm(st.grasp_force[0]))),
                            every=10))
    return float(np.mean(rows[rows[:, 0] >= sc.duration - 2.0, 1])), run


def capstan_case(mus=(0.0, 0.1, 0.3), load: float = 0.1) -> list[Case]:
    """Coulomb friction, measured the way a rope engineer would: the pull needed to slide a strand over a post
    it wraps by pi is load * exp(mu pi) (the capstan equation). Mean pull over the last 2 s of sliding, within
    10 % of it, for each mu; tunnelling checked throughout."""
    cases = []
    for mu in mus:
        pull, run = capstan_pull(mu, load)
        expected = load * math.exp(mu * math.pi)
        err = pull / expected - 1.0
        cases.append(Case(f"capstan mu = {mu:g}: pull / load", pull / load, f"exp(mu pi) = {expected / load:.3f}",
                          abs(err) <= 0.1 and not run.crossings,
                          f"pull {pull:.4f} N for a {load} N load ({err * 100:+.1f} %), most contacts "
                          f"{run.max_contacts}; {run.tunnelling()}"))
    return cases


def capstan_polygon_case(mu: float = 0.3, load: float = 0.1) -> list[Case]:
    """The capstan over a radius of one segment: the strand wraps the post in three chords turning 60 degrees
    each. With contact.polygon_friction (the default) the pull is within 5 % of load * exp(mu pi); without it, the
    polygon's own lower gain, about exp(pi / theta * asinh(mu sin theta)) (docs/PHYSICS.md Sec. 7), reported
    beside it."""
    th = math.pi / 3.0
    expected = load * math.exp(mu * math.pi)
    plain, _ = capstan_pull(mu, load, radius=0.005)
    pull, run = capstan_pull(mu, load, radius=0.005, polygon=True)
    err = pull / expected - 1.0
    own = math.exp(math.pi / th * math.asinh(mu * math.sin(th)))
    return [Case(f"capstan over a 1-segment radius, mu = {mu:g}, polygon friction: pull / load", pull / load,
                 f"exp(mu pi) = {expected / load:.3f}", abs(err) <= 0.05 and not run.crossings,
                 f"{err * 100:+.1f} %; without polygon_friction {plain / load:.3f} "
                 f"({(plain / expected - 1.0) * 100:+.1f} %; a 60-degree polygon's own gain {own:.3f}); "
                 f"{run.tunnelling()}")]


def bend_scenario(kind: str, mu: float, duration: float = 3.0, scene: str = "reef-knot",
                  mu_kinetic: float | None = None, solver: dict | None = None,
                  contact: dict | None = None, segments: int | None = None) -> tuple[Scenario, tuple[int, int]]:
    """configs/scenarios/``scene``.yaml (reef-knot or reef-knot-suture) with the bend ``kind``
    (solver/knots.py BEND_KINDS), friction ``mu`` (static; kinetic ``mu_kinetic``, by default the same),
    ``duration`` s and ``solver`` and ``contact`` overrides of those sections; ``segments``: the thread cut into
    that many, the grasps moved with it (the scene's first two on the standing parts, the others on the tails'
    ends). Returns the scenario and the two grasped vertices of the standing parts (checked to be where they
    leave the knot)."""
    from ..solver.knots import bend_thread
    mu_k = mu if mu_kinetic is None else mu_kinetic
    over = {"duration": duration, "shape": {"knot": kind},
            "contact": {**(contact or {}), "friction_static": mu, "friction_kinetic": mu_k}}
    if solver:
        over["solver"] = dict(solver)
    if segments is not None:
        source = load_scenario(scene).source
        _, corners = bend_thread(kind, segments, float(source["thread"]["length"]),
                                 float(source["shape"]["spacing"]), float(source["shape"]["tail"]))
        grasps = [dict(g) for g in source["boundary"]["grasps"]]
        for g, vertex in zip(grasps, (*corners, 0, segments)):
            g["vertex"] = vertex
        over["thread"] = {"segments": segments}
        over["boundary"] = {**source["boundary"], "grasps": grasps}
    sc = load_scenario(scene, over)
    grasps = tuple(int(v) for v in sc.initial.grasp_vertex[:2])
    p = sc.model.params
    shape = sc.source["shape"]
    _, corners = bend_thread(kind, p.segments, p.length, float(shape["spacing"]), float(shape["tail"]))
    if grasps != corners:
        raise ValueError(f"{scene}.yaml grasps vertices {list(grasps)}, but the {kind} knot's standing parts leave "
                         f"it at {corners}")
    return sc, corners


UNDONE_SLIP = 0.1   # m: the hands 10 cm further apart than when the knot set means both tails came out


def bend_pull(kind: str, mu: float, duration: float = 5.0, check: bool = False) -> tuple[str, float, float, "TracedRun"]:
    """Pull a bend of ``kind`` at friction ``mu`` (bend_scenario) for ``duration`` s. Returns (outcome, slip
    (m) from t = 1 s, when the knot has set, to the end; creep (m) over the last second; the run). The outcome
    is "undone" once the hands are UNDONE_SLIP further apart than at 1 s (the tails have pulled out: a 3 cm
    tail and its 9 cm of weave give way in under a second), else "holds"."""
    sc, (ga, gb) = bend_scenario(kind, mu, duration)
    run = TracedRun(sc, check=check)
    rows = np.array(run.run(duration, probe=lambda s: (float(s.time[0]), float(np.linalg.norm(s.x[ga] - s.x[gb]))),
                            every=50))
    at1 = float(np.interp(1.0, rows[:, 0], rows[:, 1]))
    last = float(np.interp(duration - 1.0, rows[:, 0], rows[:, 1]))
    slip = float(rows[-1, 1]) - at1
    undone = slip > UNDONE_SLIP or float(rows[:, 1].max()) - at1 > UNDONE_SLIP
    return ("undone" if undone else "holds"), slip, float(rows[-1, 1]) - last, run


def bend_case(kinds=("reef", "granny", "grief", "thief"), start: float = 0.9, step: float = 0.1,
              duration: float = 5.0) -> list[Case]:
    """The thesis's knot test (001, Sec. 4.2.2): each bend pulled with 1 N on both standing parts, friction
    lowered from ``start`` in ``step`` until the knot comes undone. Reports the lowest mu at which it held; the
    reef knot must hold at the silk preset's 0.3 and come undone when friction is lowered far enough, and must
    be the most secure of the four (the thesis: reef > granny > thief ~ grief)."""
    pull = functools.partial(_bend_outcome, duration=duration)
    return _ladder_cases(kinds, start, step, pull, "1 N")
