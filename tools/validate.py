"""`suturesim validate`: the validation cases of Wang et al. 2017 Sec. 6.1 and the solver's own guarantees,
each printed as measured against expected. tests/test_validation.py runs the same functions.

Cases: energy conservation (Fig. 4), momentum conservation (Fig. 6), axial force against the static solution
(Fig. 8), hanging thread, inextensibility at every step of all of these, contraction mapping vs Newton, a
stability sweep of every thread preset dragged by a random smooth grasp motion, and the self-contact cases of
tools/validate_contact.py (square knot, plectoneme, Fig. 17 load, crumple, capstan, Choi's overhand knots, bends).
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..solver import diagnostics as dg
from ..solver.integrator import STAT_MAX_RESIDUAL, STAT_TOTAL_ITERS, Stepper, step
from ..solver.model import ThreadModel, ThreadState
from ..solver.presets import THREADS_DIR, preset_names
from ..solver.scenario import Scenario, build_scenario, load_scenario


@dataclass
class Case:
    """One validation result: what was measured, the bound it must meet, and whether it did."""
    name: str
    measured: float
    expected: str
    passed: bool
    detail: str = ""
    extra: dict = field(default_factory=dict)

    def row(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        return f"{mark:4}  {self.name:38} {self.measured:>12.3e}  {self.expected:24} {self.detail}"


def _sample(model: ThreadModel, state: ThreadState, duration: float, every: int, probe) -> tuple[list, float]:
    """Step ``duration`` s at the model's fixed substeps, calling probe(state) every ``every`` ticks.
    Returns the probe values and the largest constraint residual seen at any substep."""
    n_sub = model.solver.substeps
    h = model.solver.tick / n_sub
    ticks = int(round(duration / model.solver.tick))
    values = []
    worst = 0.0
    for _ in range(ticks // every):
        step(model, state, n_sub * every, h)
        worst = max(worst, float(state.stats[STAT_MAX_RESIDUAL]))
        values.append(probe(state))
    return values, worst


def total_energy(model: ThreadModel, state: ThreadState) -> float:
    """J: kinetic energy of the last half step plus the potentials averaged over its two ends."""
    pot = 0.5 * (dg.gravity_energy(model, state) + dg.gravity_energy(model, state, at_prev=True)
                 + dg.elastic_energy(model, state) + dg.elastic_energy(model, state, at_prev=True))
    return dg.kinetic_energy(model, state) + pot


def energy_case(duration: float = 1000.0, window: float = 100.0) -> tuple[Case, float]:
    """Fig. 4: relative change of the mean total energy between the first and the last ``window`` s."""
    sc = load_scenario("wang2017-energy")
    model, state = sc.model, sc.new_state()
    every = 7  # ticks between samples, off the swing period so the window means are not aliased
    values, worst = _sample(model, state, duration, every, lambda s: total_energy(model, s))
    e = np.array(values)
    k = max(1, int(window / (every * model.solver.tick)))
    first, last = e[:k].mean(), e[-k:].mean()
    scale = abs(first) if first != 0 else 1.0
    drift = abs(last - first) / scale
    return Case("energy drift (Fig. 4)", drift, "< 1e-4 relative", drift < 1e-4,
                f"{duration:.0f} s; E = {first:.6g} J; band {np.ptp(e) / scale:.1e}"), worst


def momentum_case(duration: float = 1000.0) -> tuple[list[Case], float]:
    """Fig. 6: linear momentum stays ~0 and angular momentum about the centre of mass stays constant."""
    sc = load_scenario("wang2017-momentum")
    model, state = sc.model, sc.new_state()
    values, worst = _sample(model, state, duration, 10,
                            lambda s: (dg.linear_momentum(model, s), dg.angular_momentum(model, s)))
    p = np.array([v[0] for v in values])
    ang = np.array([v[1] for v in values])
    p_max = float(np.max(np.linalg.norm(p, axis=1)))
    l0 = ang[0]
    l_rel = float(np.max(np.linalg.norm(ang - l0, axis=1)) / np.linalg.norm(l0))
    return [Case("linear momentum (Fig. 6)", p_max, "< 1e-12 kg m/s", p_max < 1e-12, f"{duration:.0f} s"),
            Case("angular momentum change (Fig. 6)", l_rel, "< 1e-7 relative", l_rel < 1e-7,
                 f"|L| = {np.linalg.norm(l0):.4g} kg m^2/s")], worst


def axial_force_case(duration: float = 100.0) -> tuple[Case, float]:
    """Fig. 8-9: tension along the thread against T(s) = sqrt(F^2 + (rho g (L - s))^2) at t = duration."""
    sc = load_scenario("wang2017-axial-force")
    model, state = sc.model, sc.new_state()
    _, worst = _sample(model, state, duration, 100, lambda s: None)
    force = float(np.linalg.norm(state.ext_force[-1]))
    rho = model.params.linear_density
    g = float(np.linalg.norm(model.gravity))
    s_edges = np.concatenate([[0.0], np.cumsum(model.rest_length)])
    s_mid = 0.5 * (s_edges[1:] + s_edges[:-1])
    # a segment's tension carries the lumped mass of every vertex beyond it, which is rho (L - s_mid)
    analytic = np.sqrt(force ** 2 + (rho * g * (s_edges[-1] - s_mid)) ** 2)
    err = float(np.max(np.abs(state.tension - analytic)))
    return Case("axial force vs static (Fig. 8)", err, "< 1e-3 N", err < 1e-3,
                f"t = {duration:.0f} s; T from {state.tension[-1]:.4f} to {state.tension[0]:.4f} N"), worst


def hanging_case(duration: float = 10.0) -> tuple[Case, float]:
    """A thread hanging at rest: each segment's tension equals the weight below it."""
    sc = load_scenario("wang2017-hanging")
    model, state = sc.model, sc.new_state()
    _, worst = _sample(model, state, duration, 100, lambda s: None)
    weight_below = np.cumsum(model.mass[::-1])[::-1][1:] * float(np.linalg.norm(model.gravity))
    err = float(np.max(np.abs(state.tension - weight_below) / weight_below))
    return Case("hanging: tension = weight below", err, "< 1e-6 relative", err < 1e-6, f"t = {duration:.0f} s"), worst


def methods_case(duration: float = 5.0) -> list[Case]:
    """Contraction mapping (Eq. 10) and Newton (Eq. 13) from the same state give the same multipliers;
    iterations per step over a run of the swinging thread."""
    from dataclasses import replace

    sc = load_scenario("wang2017-energy")
    base = sc.model
    runs = {}
    for method in ("contraction", "newton"):
        model = replace(base, solver=replace(base.solver, method=method))
        state = sc.new_state()
        ticks = int(duration / model.solver.tick)
        total = 0
        for _ in range(ticks):
            step(model, state, 1, model.solver.tick)
            total += int(state.stats[STAT_TOTAL_ITERS])
        runs[method] = (model, state, total / ticks)
    # one step of each method from the same (contraction-run) state
    probe = runs["contraction"][1]
    tensions = {}
    for method in ("contraction", "newton"):
        model = runs[method][0]
        s = probe.copy()
        s.tension[:] = 0.0  # cold start: both must reach the same multipliers on their own
        step(model, s, 1, model.solver.tick)
        tensions[method] = s.tension.copy()
    diff = float(np.max(np.abs(tensions["contraction"] - tensions["newton"])) / np.max(np.abs(tensions["newton"])))
    it_c, it_n = runs["contraction"][2], runs["newton"][2]
    return [Case("contraction vs Newton multipliers", diff, "< 1e-9 relative", diff < 1e-9, "cold start"),
            Case("iterations per step (contraction)", it_c, "paper: 3-5", it_c <= 5, "warm started"),
            Case("iterations per step (Newton)", it_n, "paper: 3-5", it_n <= 5, "warm started")]


# ---------------------------------------------------------------------------------------------------------------
# Stability sweep: every preset grasped at its free end and dragged by a random smooth stylus motion.

def random_path(seed: int, duration: float, centre: np.ndarray, reach: float, speed_max: float,
                dt: float = 0.02) -> np.ndarray:
    """Waypoints [t, x, y, z] of a smooth random path (sum of sinusoids) around ``centre`` within ``reach`` (m),
    scaled so its speed never exceeds ``speed_max`` (m/s); it starts at ``centre``."""
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, duration + dt / 2, dt)
    freqs = rng.uniform(0.1, 1.5, size=(6, 3))
    phases = rng.uniform(0, 2 * np.pi, size=(6, 3))
    amps = rng.uniform(0.3, 1.0, size=(6, 3))
    p = np.zeros((t.size, 3))
    for f, ph, a in zip(freqs, phases, amps):
        p += a * (np.sin(2 * np.pi * f * t[:, None] + ph) - np.sin(ph))
    p *= reach / max(np.max(np.linalg.norm(p, axis=1)), 1e-12)
    speed = np.linalg.norm(np.diff(p, axis=0), axis=1) / dt
    if speed.max() > speed_max:
        p *= speed_max / speed.max()
    return np.column_stack([t, centre + p])


def sweep_scenario(preset: str, seed: int, duration: float) -> Scenario:
    """The preset's thread pinned at vertex 0, grasped at its last vertex (1000 N/m, 10 N limit), the grasp
    dragged along a random path that sometimes pulls the thread taut past its reach."""
    from ..solver.presets import load_preset

    params = load_preset(preset)
    length = params.length
    start = np.array([length, 0.0, 0.0])
    # the path wanders 0.6 L around the free end's start, so it reaches up to 1.6 L from the pin: taut pulls
    path = random_path(seed, duration, start, 0.6 * length, 0.5)
    data = {
        "name": f"sweep-{preset}", "duration": duration,
        "thread": {"preset": preset},
        "shape": {"kind": "straight", "direction": [1.0, 0.0, 0.0]},
        "boundary": {"pinned": [0], "grasps": [{"id": "stylus", "vertex": -1, "stiffness": 1000.0,
                                                 "damping": 0.0, "max_force": 10.0}]},
        "timeline": [{"grasp": "stylus", "waypoints": path.tolist()}],
    }
    return build_scenario(data, str(THREADS_DIR / f"{preset}.yaml"))


def sweep_case(preset: str, seed: int = 1, duration: float = 10.0) -> Case:
    """Run the sweep scenario; passes if every tick stays finite, inextensible (or, if extensible, within the
    strain the limit force allows) and bounded (every vertex within 2 L of the pin). The 10 N pull is past every
    rated preset's strength: such a thread breaks (solver/breakage.py), and its pieces must stay so too."""
    sc = sweep_scenario(preset, seed, duration)
    model, state = sc.model, sc.new_state()
    length = model.params.length
    worst_res, worst_dist, sub_max = 0.0, 0.0, 0
    ticks = int(round(duration / model.solver.tick))
    finite = True
    stepper = Stepper(model, state)
    for _ in range(ticks):
        sub_max = max(sub_max, stepper.tick())
        r = float(state.stats[STAT_MAX_RESIDUAL])
        if not math.isfinite(r) or not np.all(np.isfinite(state.x)):
            finite = False
            break
        worst_res = max(worst_res, r)
        worst_dist = max(worst_dist, float(np.max(np.linalg.norm(state.x - state.x[0], axis=1))))
    strain = dg.max_strain(model, state)
    if model.params.extensible:
        # the coupling limits the pull to 10 N (plus dynamics): strain bounded by a few times 10 N / EA
        bound = 3.0 * 10.0 / model.params.stretch_stiffness
        stretch = float(np.max(np.linalg.norm(np.diff(state.x, axis=0), axis=1) / model.rest_length - 1.0,
                               where=state.parted == 0, initial=0.0))
        ok_ext = worst_res <= 1e-10 and stretch <= bound
        ext = f"stretch {stretch:.1e} <= {bound:.1e}"
    else:
        ok_ext = worst_res <= 1e-10 and strain <= 1e-10
        ext = f"|psi|/l^2 {worst_res:.1e}"
    ok = finite and ok_ext and worst_dist <= 2.0 * length
    return Case(f"stability sweep: {preset}", worst_dist / length, "<= 2 (max dist / L)", ok,
                f"{'finite' if finite else 'NOT FINITE'}; {ext}; substeps <= {sub_max}; "
                f"{stepper.retries} ticks redone")


def run_all(quick: bool = False, out=print, contact: bool = True, plots: Path | None = None) -> list[Case]:
    """Run every case (``quick``: shorter runs; ``contact``: with the self-contact cases, whose plots go to
    ``plots``) and print a table; returns the cases."""
    long_t = 50.0 if quick else 1000.0
    cases: list[Case] = []
    residuals: dict[str, float] = {}
    header = f"{'':4}  {'case':38} {'measured':>12}  {'expected':24} detail"
    out(header)
    out("-" * len(header))

    def add(c: Case) -> None:
        cases.append(c)
        out(c.row())

    t0 = time.perf_counter()
    c, residuals["energy"] = energy_case(long_t, window=min(100.0, long_t / 5))
    add(c)
    cs, residuals["momentum"] = momentum_case(long_t)
    for c in cs:
        add(c)
    c, residuals["axial force"] = axial_force_case(100.0)
    add(c)
    c, residuals["hanging"] = hanging_case(10.0)
    add(c)
    worst = max(residuals.values())
    add(Case("inextensibility, every step", worst, "<= 1e-10 max |psi|/l^2", worst <= 1e-10,
             "over all cases above"))
    for c in methods_case(2.0 if quick else 5.0):
        add(c)
    for name in preset_names():
        add(sweep_case(name, seed=1, duration=2.0 if quick else 10.0))
    if contact:
        from .validate_contact import run_contact

        run_contact(quick=quick, plots=plots, add=add)
    n_fail = sum(not c.passed for c in cases)
    out(f"{len(cases) - n_fail} passed, {n_fail} failed ({time.perf_counter() - t0:.0f} s)")
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="suturesim validate",
                                     description="Run the validation cases (Wang et al. 2017 Sec. 6.1 and 6.2, "
                                                 "the solver's guarantees, self-contact) and print measured "
                                                 "against expected.")
    parser.add_argument("--quick", action="store_true",
                        help="shorter runs (50 s instead of 1000 s for energy and momentum, 2 s sweeps, a 5 s "
                             "crumple instead of 30 s, Choi's trefoil at one speed at both scales, unchecked for crossings at "
                             "3-0 silk's, and not his n = 2-4 knots)")
    parser.add_argument("--plots", metavar="DIR", type=Path, default=None,
                        help="write the plots of the self-contact cases here (plectoneme-torque.png, audoly-law.png; "
                             "without --quick also choi-overhand-pulls.png)")
    parser.add_argument("--no-contact", action="store_true", help="skip the self-contact cases")
    args = parser.parse_args(argv)
    cases = run_all(quick=args.quick, contact=not args.no_contact, plots=args.plots)
    return 0 if all(c.passed for c in cases) else 1
