"""`suturesim bench`: what the solver costs and how it compares with PyElastica.

The measurements (docs/BENCHMARKS.md shows a full run and explains the method):

1. ``solver``: step time against segment count N for both multiplier methods, on a 1 m, 10 g thread pinned
   at the top and swinging under gravity. Kernel cost per substep (many substeps in one kernel call), cost
   of a one-substep call (adds the Python/numba dispatch), cost of a whole 1 ms tick, multiplier
   iterations, a linear fit of cost against N and the largest N that keeps up with a 1 kHz loop.
2. ``suture``: real-time factor of whole scenarios run tick by tick with ``integrator.Stepper``: the
   bench-suture scenario and the thread of Wang 2017 Fig. 17(a) -- and, unless ``--no-elastica``,
3. PyElastica (tools/bench_elastica.py) on the same physical suture as bench-suture, at its own stable
   time step, and the ratio of the two real-time factors.
4. ``loop``: the 1 kHz loop of ``suturesim serve`` run as a subprocess (tools/bench_loop.py): tick lateness
   from the server's own ``stats`` with 0, 1 and 8 subscribers and with the other CPU busy, and the time to the
   first tick with a cold and a warm numba cache.
5. ``haptics``: ``suturesim serve --device openhaptics`` through the libHD emulator (tools/bench_haptics.py):
   pose-to-force latency, the servo callback's time, and what the motors were given.
6. ``contact``: self-contact (tools/bench_contact.py): tick time of a tightening 200-segment square knot, the
   contact cost against segment count and against the number of contacts, and the smoothness of the force.
7. ``tissue``: tick time of the scripted simple interrupted suture, and how both scripted sutures end when
   their state is moved by a unit of round-off (tools/bench_tissue.py).
8. ``inbound``: what validating a control request or a stylus sample costs (tools/bench_inbound.py).
9. ``bot``: the trainee bot's suture by hand on ``suturesim serve`` (tools/bench_bot.py): whether it was done,
   the server's tick through it (and by step of the suture) and the bot's share of a core; before the runs, a
   fixed computation once a tick in the loop's wait, priority and CPU at three sizes, from less than the tick's
   Python stages to the step's median (tools/machine_probe.py): the machine's own spread under a tick.
10. ``knot``: an overhand knot in 3-0 silk pulled to 3 N by two styluses and held, at the thread's own diameter
    as shipped and at 3 mm, friction started warm and cold (tools/bench_knot.py): tick time, frozen ticks,
    crossings, whether the thread broke, tension against the pull, the force's content above 50 Hz and the knot's
    core.
11. ``bot-rate``: how often the trainee bot's suture is done over 60 perturbed runs through the server's own
    tick in process, each hand's sample now and then a tick late (tools/bench_bot_rate.py), with the rate's 95 %
    interval and where the runs not done went wrong.

Every timing is repeated; tables give the best (min) and the median of the repeats. The garbage collector
is off inside timed regions (as in ``timeit``). Entry point: ``main(argv) -> int``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import importlib
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np

from ..solver import integrator
from ..solver.model import SolverSettings, ThreadModel, ThreadParams, ThreadState, build_model, make_state
from ..solver.scenario import Scenario, build_scenario, load_scenario

# -- what is measured ------------------------------------------------------------------------------------
SWEEP_N = (50, 100, 200, 500, 1000, 2000, 5000)
QUICK_SWEEP_N = (100, 500, 2000)
METHODS = ("newton", "contraction")
TICK = 1e-3                       # s, the 1 kHz loop
REAL_TIME_US = TICK * 1e6         # a tick must cost less than this (µs) to keep up

# The sweep thread: Wang 2017's Fig. 4 thread (L = 1 m, M = 0.01 kg, EI = 5e-6 N m^2, GJ = 1e-3 N m^2, no
# drag), pinned at the top, straight at phi = 0.45 pi to the horizontal (as scenarios/wang2017-energy.yaml).
SWEEP_LENGTH = 1.0                # m
SWEEP_MASS = 0.01                 # kg
SWEEP_EI = 5e-6                   # N m^2 at N <= SWEEP_EI_REF_N
SWEEP_EI_REF_N = 100
SWEEP_GJ = 1e-3                   # N m^2
SWEEP_PHI = 0.45 * math.pi        # rad below the horizontal
SWEEP_MAX_SUBSTEPS = 100_000

# Fig. 17(a) of Wang 2017 as a scenario: preset thread, pinned at vertex 0, released straight and horizontal.
FIG17A_SCENARIO = {
    "name": "wang2017-fig17a",
    "description": "Wang 2017 Fig. 17(a) thread, pinned, released horizontal",
    "duration": 2.0,
    "thread": {"preset": "wang2017-fig17a"},
    "gravity": [0.0, 0.0, -9.81],
    "shape": {"kind": "straight", "start": [0.0, 0.0, 0.0], "direction": [1.0, 0.0, 0.0]},
    "boundary": {"pinned": [0]},
    "solver": {"substeps": 1},
}

DIVERGED_RESIDUAL = 1e-6          # max |G_j|/l_j^2 after a tick above which the run counts as diverged
ELASTICA_DAMPING = 0.1            # 1/s, PyElastica's AnalyticalLinearDamper (our suture has air drag instead)
RATIO_TARGET = 400.0              # ours / PyElastica real-time factor aimed for


@dataclass(frozen=True)
class Budget:
    """How long each measurement runs."""
    sweep_n: tuple[int, ...]
    repeats: int                  # timed repeats of every solver measurement
    block_s: float                # s of wall time one timed repeat aims for
    warmup_s: float               # s of simulated time before the solver timings
    scenario_s: float             # s of simulated time per scenario run
    scenario_repeats: int
    elastica_sim_s: float         # s of simulated time per PyElastica run
    elastica_repeats: int


FULL = Budget(sweep_n=SWEEP_N, repeats=9, block_s=0.03, warmup_s=0.2, scenario_s=2.0, scenario_repeats=5,
              elastica_sim_s=0.01, elastica_repeats=3)
QUICK = Budget(sweep_n=QUICK_SWEEP_N, repeats=3, block_s=0.005, warmup_s=0.02, scenario_s=0.2,
               scenario_repeats=2, elastica_sim_s=2e-4, elastica_repeats=1)


# -- timing helpers --------------------------------------------------------------------------------------
@dataclass
class Timing:
    """Repeated timings of one thing, in seconds per unit (per substep, per call, per tick...)."""
    samples: list[float]

    @property
    def best_us(self) -> float:
        """Fastest repeat, µs per unit."""
        return 1e6 * min(self.samples)

    @property
    def median_us(self) -> float:
        """Median repeat, µs per unit."""
        return 1e6 * float(np.median(self.samples))


@contextlib.contextmanager
def _gc_off():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def repeat_timed(run: Callable[[int], None], units: int, repeats: int) -> Timing:
    """Call ``run(units)`` ``repeats`` times; each call does ``units`` units of work. Seconds per unit."""
    samples = []
    with _gc_off():
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(units)
            samples.append((time.perf_counter() - t0) / units)
    return Timing(samples)


def units_for(run: Callable[[int], None], target_s: float) -> int:
    """How many units make one call of ``run`` last about ``target_s`` seconds (at least 1). Probes with
    1, 4, 16, ... units until a probe lasts a tenth of the target (the probes double as warm-up)."""
    units = 1
    while True:
        t0 = time.perf_counter()
        run(units)
        elapsed = time.perf_counter() - t0
        if elapsed >= 0.1 * target_s:
            return max(1, round(target_s * units / elapsed))
        units *= 4


def diverged(state: ThreadState) -> bool:
    """True once the multipliers of the last tick did not converge or the positions are not finite."""
    res = state.stats[integrator.STAT_MAX_RESIDUAL]
    return not (math.isfinite(res) and res <= DIVERGED_RESIDUAL and np.all(np.isfinite(state.x)))


# -- 1. solver step time against N -----------------------------------------------------------------------
def sweep_bending_stiffness(n_seg: int) -> float:
    """EI (N m^2) of the sweep thread with n_seg segments: 5e-6 up to N = 100, then scaled by (100/N)^4 so
    that the bending frequency of one segment, (4/l^2) sqrt(EI/rhoA), stays at its N = 100 value."""
    return SWEEP_EI * min(1.0, (SWEEP_EI_REF_N / n_seg) ** 4)


def sweep_thread(n_seg: int, method: str) -> tuple[ThreadModel, ThreadState]:
    """The sweep thread with n_seg segments (automatic substeps, pinned vertex 0) and its initial state."""
    params = ThreadParams(name=f"sweep-{n_seg}", length=SWEEP_LENGTH, segments=n_seg,
                          linear_density=SWEEP_MASS / SWEEP_LENGTH,
                          bending_stiffness=sweep_bending_stiffness(n_seg), twisting_stiffness=SWEEP_GJ)
    settings = SolverSettings(method=method, tick=TICK, substeps=0, max_substeps=SWEEP_MAX_SUBSTEPS)
    model = build_model(params, settings, kinematic_vertices=[0])
    direction = np.array([math.cos(SWEEP_PHI), 0.0, -math.sin(SWEEP_PHI)])
    x0 = np.outer(np.linspace(0.0, SWEEP_LENGTH, n_seg + 1), direction)
    return model, make_state(model, x0)


@dataclass
class SweepPoint:
    """One (N, method) of the sweep. Times in µs."""
    n_seg: int
    method: str
    bending_stiffness: float      # N m^2
    substeps: int                 # per 1 ms tick, as the stability bound asks (max over the warm-up)
    kernel: Timing                # per substep, K substeps inside one integrator.step call
    dispatch: Timing              # per integrator.step(model, state, 0, h) call: Python + numba dispatch only
    call: Timing                  # per integrator.step(model, state, 1, h) call: kernel + dispatch
    tick: Timing                  # per 1 ms tick: integrator.step(model, state, substeps, h)
    iters_per_substep: float
    stable: bool

    @property
    def h_us(self) -> float:
        return 1e6 * TICK / self.substeps

    @property
    def ns_per_segment(self) -> float:
        """Best kernel time per substep and segment, ns."""
        return 1e3 * self.kernel.best_us / self.n_seg


def measure_sweep_point(n_seg: int, method: str, budget: Budget) -> SweepPoint:
    """Warm the thread up with automatic substeps, then, at the substep h = 1 ms / (the most substeps the
    warm-up needed), time: many substeps per kernel call; calls of no substep (dispatch alone); calls of one
    substep; calls of one 1 ms tick."""
    model, state = sweep_thread(n_seg, method)
    substeps = 1
    for _ in range(max(1, round(budget.warmup_s / TICK))):
        substeps = max(substeps, integrator.tick(model, state))
    h = TICK / substeps

    def run(n_sub: int) -> Callable[[int], None]:
        def calls(count: int) -> None:
            for _ in range(count):
                integrator.step(model, state, n_sub, h)
        return calls

    iters = []

    def kernel(k: int) -> None:
        integrator.step(model, state, k, h)
        iters.append(state.stats[integrator.STAT_TOTAL_ITERS] / k)

    kernel_t = repeat_timed(kernel, units_for(kernel, budget.block_s), budget.repeats)
    iters = iters[-budget.repeats:]  # the timed calls only
    per_call = {n: repeat_timed(run(n), units_for(run(n), budget.block_s), budget.repeats)
                for n in (0, 1, substeps)}
    return SweepPoint(n_seg=n_seg, method=method, bending_stiffness=model.params.bending_stiffness,
                      substeps=substeps, kernel=kernel_t, dispatch=per_call[0], call=per_call[1],
                      tick=per_call[substeps],
                      iters_per_substep=float(np.mean(iters)), stable=not diverged(state))


@dataclass
class LinearFit:
    """t = slope * N + intercept (µs), fitted to relative error; max_dev = largest |t - fit| / t."""
    slope_us: float
    intercept_us: float
    max_dev: float


def linear_fit(ns: list[int], times_us: list[float]) -> LinearFit:
    """Least squares on relative residuals (weights 1/t), so small N count as much as large N."""
    x = np.asarray(ns, float)
    t = np.asarray(times_us, float)
    slope, intercept = np.polyfit(x, t, 1, w=1.0 / t)
    dev = np.abs(t - (slope * x + intercept)) / t
    return LinearFit(float(slope), float(intercept), float(dev.max()))


def real_time_n(ns: list[int], times_us: list[float], fit: LinearFit | None = None,
                offset_us: float = 0.0) -> tuple[float, str]:
    """Largest N whose cost stays under 1 ms, interpolated linearly between the measured points around the
    crossing. Returns (N, how it was found). With no crossing in range: extrapolated from ``fit`` (+
    ``offset_us``) if given."""
    for (n0, t0), (n1, t1) in zip(zip(ns, times_us), zip(ns[1:], times_us[1:])):
        if t0 < REAL_TIME_US <= t1:
            return n0 + (REAL_TIME_US - t0) * (n1 - n0) / (t1 - t0), f"interpolated between N = {n0} and {n1}"
    if times_us[0] >= REAL_TIME_US:
        return float("nan"), f"none: N = {ns[0]} already takes {times_us[0]:.0f} µs"
    if fit is not None:
        return (REAL_TIME_US - offset_us - fit.intercept_us) / fit.slope_us, \
            "extrapolated from the linear fit; every measured N is under 1 ms"
    return float("nan"), f"> {ns[-1]}: every measured N is under 1 ms"


@dataclass
class SweepResult:
    points: dict[str, list[SweepPoint]] = field(default_factory=dict)   # by method


def measure_sweep(budget: Budget, log: Callable[[str], None]) -> SweepResult:
    result = SweepResult()
    for method in METHODS:
        result.points[method] = []
        for n_seg in budget.sweep_n:
            p = measure_sweep_point(n_seg, method, budget)
            log(f"  {method:<11} N={n_seg:<5} {p.substeps:>3} substeps/ms  kernel {p.kernel.best_us:8.2f} µs/substep"
                f"  dispatch {p.dispatch.best_us:5.2f} µs  call {p.call.best_us:8.2f} µs  tick {p.tick.median_us:9.1f} µs"
                f"  iters {p.iters_per_substep:.2f}")
            result.points[method].append(p)
    return result


# -- 2. real-time factor of scenarios --------------------------------------------------------------------
def fig17a_scenario(substeps: int | str = 1) -> Scenario:
    """Wang 2017 Fig. 17(a): preset thread (N = 100, L = 1 m, M = 0.01 kg), pinned at vertex 0, straight and
    horizontal under gravity; ``substeps`` per 1 ms tick (1 = the paper's h = 1 ms, or "auto")."""
    data = {**FIG17A_SCENARIO, "solver": {"substeps": substeps}}
    return build_scenario(data, "<tools/bench.py: wang2017-fig17a>")


@dataclass
class ScenarioResult:
    """Repeated runs of one scenario tick by tick. Tick times in µs, pooled over the repeats."""
    label: str
    n_seg: int
    sim_s: list[float]            # simulated seconds of each run (shorter if it diverged)
    wall_s: list[float]           # wall seconds of each run (sum of its ticks)
    tick_us: np.ndarray
    substeps: np.ndarray          # per tick
    iters_per_substep: float
    diverged_at: float | None     # s of simulated time, first run only

    @property
    def rtf_best(self) -> float:
        """Simulated seconds per wall second, fastest run."""
        return max(s / w for s, w in zip(self.sim_s, self.wall_s))

    @property
    def rtf_median(self) -> float:
        return float(np.median([s / w for s, w in zip(self.sim_s, self.wall_s)]))


def measure_scenario(label: str, scenario: Scenario, sim_s: float, repeats: int) -> ScenarioResult:
    """Run ``sim_s`` seconds of ``scenario`` with integrator.Stepper, ``repeats`` times from its initial state,
    timing every tick. A run stops at the first tick whose multipliers diverge (see ``diverged``)."""
    model = scenario.model
    ticks = max(1, round(sim_s / model.solver.tick))
    integrator.warm_up(model, scenario.new_state())  # load every kernel a tick can reach, as the server does
    runs_sim, runs_wall, tick_us, subs, iters = [], [], [], [], []
    diverged_at = None
    for r in range(repeats):
        state = scenario.new_state()
        stepper = integrator.Stepper(model, state)  # the production path: budget, mass scaling, retries
        times = np.empty(ticks)
        n_sub = np.empty(ticks, np.int64)
        total_iters = 0.0
        done = ticks
        with _gc_off():
            for k in range(ticks):
                t0 = time.perf_counter()
                try:
                    n_sub[k] = stepper.tick()
                    failed = diverged(state)
                except integrator.SolverDivergence:
                    failed = True
                times[k] = time.perf_counter() - t0
                if failed:
                    done = k  # this tick failed: keep only the ticks before it
                    if r == 0:
                        diverged_at = float(state.time[0])
                    break
                total_iters += state.stats[integrator.STAT_TOTAL_ITERS]
        done = max(done, 1)
        runs_sim.append(done * model.solver.tick)
        runs_wall.append(float(times[:done].sum()))
        tick_us.append(1e6 * times[:done])
        subs.append(n_sub[:done])
        iters.append(total_iters / max(1, n_sub[:done].sum()))
    return ScenarioResult(label=label, n_seg=model.n_segments, sim_s=runs_sim, wall_s=runs_wall,
                          tick_us=np.concatenate(tick_us), substeps=np.concatenate(subs),
                          iters_per_substep=float(np.mean(iters)), diverged_at=diverged_at)


def measure_scenarios(budget: Budget, log: Callable[[str], None]) -> list[ScenarioResult]:
    cases = [
        ("bench-suture (auto substeps)", load_scenario("bench-suture")),
        ("wang2017-fig17a, 1 substep (h = 1 ms)", fig17a_scenario(1)),
        ("wang2017-fig17a, auto substeps", fig17a_scenario("auto")),
    ]
    out = []
    for label, sc in cases:
        res = measure_scenario(label, sc, budget.scenario_s, budget.scenario_repeats)
        log(f"  {label:<40} rtf {res.rtf_best:8.2f}  tick p50 {np.percentile(res.tick_us, 50):8.1f} µs"
            + (f"  DIVERGED at t = {res.diverged_at:.3f} s" if res.diverged_at is not None else ""))
        out.append(res)
    return out


# -- 3. PyElastica side by side --------------------------------------------------------------------------
def elastica_suture(scenario: Scenario):
    """bench-suture's physical thread as a tools.bench_elastica.Rod (SI), with our PyElastica damping."""
    from .bench_elastica import Rod

    t = scenario.source["thread"]
    return Rod(length_m=float(t["length"]), segments=int(t["segments"]), diameter_m=float(t["diameter"]),
               density_kg_m3=float(t["density"]), youngs_modulus_pa=float(t["youngs_modulus"]),
               poisson_ratio=float(t["poisson_ratio"]), gravity_m_s2=float(-scenario.model.gravity[2]),
               damping=ELASTICA_DAMPING)


@dataclass
class ElasticaResult:
    runs: list[dict]              # run_pyelastica results
    suture: object                # tools.bench_elastica.Rod
    skipped: str | None = None

    @property
    def rtf_best(self) -> float:
        return max(r["rtf"] for r in self.runs)

    @property
    def rtf_median(self) -> float:
        return float(np.median([r["rtf"] for r in self.runs]))


def measure_elastica(budget: Budget, log: Callable[[str], None]) -> ElasticaResult:
    """PyElastica on bench-suture's thread at its stable dt (tools/bench_elastica.stable_dt)."""
    suture = elastica_suture(load_scenario("bench-suture"))
    try:
        import elastica  # noqa: F401
    except ImportError:
        return ElasticaResult([], suture, skipped="PyElastica is not installed: pip install 'suturesim[bench]'")
    from .bench_elastica import run_pyelastica

    runs = []
    for _ in range(budget.elastica_repeats):
        r = run_pyelastica(suture, sim_time_s=budget.elastica_sim_s)
        log(f"  pyelastica {r['steps']} steps of {r['dt_s']:.3g} s in {r['wall_s']:.2f} s: rtf {r['rtf']:.3g}"
            + ("" if r["finite"] else "  (UNSTABLE)"))
        runs.append(r)
    return ElasticaResult(runs, suture)


# -- machine ---------------------------------------------------------------------------------------------
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info() -> dict[str, str]:
    """CPU, cores, versions and date of this run."""
    cpu, mhz = "", ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and not cpu:
                cpu = value
            elif key == "cpu MHz" and not mhz:
                mhz = f", {float(value):.0f} MHz"
    cpu = (cpu or platform.processor() or "unknown CPU") + mhz
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return {
        "CPU": cpu,
        "cores": f"{os.cpu_count()} logical, {usable} usable",
        "load average at start (1/5/15 min)": load,
        "OS": platform.platform(),
        "Python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "pyelastica": _version("pyelastica"),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# -- rendering -------------------------------------------------------------------------------------------
def _g(x: float, digits: int = 3) -> str:
    """x to ``digits`` significant figures, without exponent for ordinary magnitudes."""
    if not math.isfinite(x):
        return "n/a"
    if x == 0.0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    if -3 <= mag < 6:
        return f"{x:.{max(0, digits - 1 - mag)}f}"
    return f"{x:.{digits - 1}e}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table, columns padded so it also reads as plain text."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]


def render_machine(info: dict[str, str]) -> list[str]:
    return ["## Machine", "", *table(["", ""], [[f"**{k}**", v] for k, v in info.items()]), ""]


def _pair(t: Timing) -> str:
    return f"{_g(t.best_us)} / {_g(t.median_us)}"


def render_sweep(res: SweepResult) -> list[str]:
    out = ["## 1. Solver step time against segment count", "",
           f"Thread: L = {SWEEP_LENGTH} m, M = {SWEEP_MASS} kg, GJ = {SWEEP_GJ} N m², no drag, pinned at the top, "
           f"released straight at 0.45π below the horizontal, gravity. EI = {SWEEP_EI} N m² up to N = "
           f"{SWEEP_EI_REF_N}, then × ({SWEEP_EI_REF_N}/N)⁴ (see the notes). h = 1 ms / (substeps per tick the "
           "stability bound asks for). Times in µs, **best / median** of the repeats.", ""]
    header = ["N", "EI (N m²)", "substeps per 1 ms", "h (µs)", "kernel µs/substep", "ns/segment",
              "iters/substep", "dispatch µs", "1-substep call µs", "1 ms tick µs", "stable"]
    for method, pts in res.points.items():
        rows = [[str(p.n_seg), _g(p.bending_stiffness), str(p.substeps), _g(p.h_us), _pair(p.kernel),
                 _g(p.ns_per_segment), f"{p.iters_per_substep:.2f}", _pair(p.dispatch), _pair(p.call),
                 _pair(p.tick), "yes" if p.stable else "**no**"] for p in pts]
        ns = [p.n_seg for p in pts]
        fit = linear_fit(ns, [p.kernel.best_us for p in pts])
        dispatch = float(np.median([p.dispatch.median_us for p in pts]))
        n_call, how_call = real_time_n(ns, [p.call.median_us for p in pts], fit, dispatch)
        n_tick, how_tick = real_time_n(ns, [p.tick.median_us for p in pts])
        iters = [p.iters_per_substep for p in pts]
        out += [f"### {method}", "", *table(header, rows), "",
                f"- Linear fit of the kernel cost (best): **{_g(fit.slope_us * 1e3)} ns per segment** + "
                f"{_g(fit.intercept_us)} µs per substep; largest deviation from the line "
                f"{100 * fit.max_dev:.1f} % (iterations per substep ranged {min(iters):.2f}-{max(iters):.2f}).",
                f"- Largest N whose one-substep step (kernel + dispatch, median) fits in 1 ms, i.e. real time at "
                f"h = 1 ms with 1 substep as far as cost goes: **N ≈ {_g(n_call)}** ({how_call}).",
                f"- Largest N whose whole 1 ms tick, with the substeps stability needs, fits in 1 ms: "
                f"**N ≈ {_g(n_tick)}** ({how_tick}).", ""]
    return out


def render_scenarios(results: list[ScenarioResult], budget: Budget) -> list[str]:
    rows = []
    for r in results:
        note = "" if r.diverged_at is None else \
            f"diverged at t = {r.diverged_at:.3f} s; figures cover the ticks before"
        rows.append([r.label, str(r.n_seg), f"{r.substeps.mean():.1f} ({r.substeps.min()}-{r.substeps.max()})",
                     _g(float(np.percentile(r.tick_us, 50))), _g(float(np.percentile(r.tick_us, 99))),
                     _g(float(r.tick_us.max())), f"{r.iters_per_substep:.2f}",
                     f"{_g(r.rtf_best)} / {_g(r.rtf_median)}", note])
    notes = []
    for r in results:
        if r.diverged_at is not None:
            auto = next((a for a in results if a.label.startswith(r.label.split(",")[0]) and a is not r
                         and a.diverged_at is None), None)
            notes.append(f"**{r.label} diverged at t = {r.diverged_at:.3f} s** (multipliers no longer converge, then "
                         "NaN). For the horizontal release of Fig. 17(a) this is where the falling thread whips: the "
                         "hinges near the free end fold past ~140° within a few ms, the tan²(φ/2) bending term "
                         "stiffens and the explicit step at h = 1 ms is no longer stable."
                         + (f" With automatic substeps (up to {auto.substeps.max()} per tick) the same thread runs "
                            "through." if auto is not None else ""))
    return ["## 2. Real-time factor of scenarios", "",
            f"{budget.scenario_s:g} s of simulated time with `integrator.Stepper` (1 ms ticks), "
            f"{budget.scenario_repeats} runs from the initial state. Real-time factor = simulated s / wall s "
            "(the summed tick times, substeps included), **best / median** run; tick times pooled over the runs.", "",
            *table(["scenario", "N", "substeps per tick mean (min-max)", "tick p50 µs", "tick p99 µs",
                    "tick max µs", "iters/substep", "real-time factor", "note"], rows), "",
            *[line for n in notes for line in (n, "")]]


def render_elastica(el: ElasticaResult, suture: ScenarioResult | None) -> list[str]:
    out = ["## 3. PyElastica side by side", ""]
    s = el.suture
    out.append(f"Same physical suture as bench-suture: L = {s.length_m} m, {s.segments} segments, "
               f"d = {s.diameter_m * 1e3:g} mm, ρ = {s.density_kg_m3:g} kg/m³, "
               f"E = {s.youngs_modulus_pa / 1e9:g} GPa, ν = {s.poisson_ratio}, g = {s.gravity_m_s2} m/s², "
               "pinned at one end, released horizontal.")
    out.append("")
    if el.skipped:
        return out + [f"Skipped: {el.skipped}", ""]
    best = max(el.runs, key=lambda r: r["rtf"])
    rows = [["PyElastica " + best["pyelastica_version"], f"{best['dt_s']:.3g}", f"{best['steps_per_s']:.3g}",
             f"{_g(el.rtf_best)} / {_g(el.rtf_median)}", f"{best['sim_time_s']:g} s × {len(el.runs)}",
             "yes" if all(r["finite"] for r in el.runs) else "**no**"]]
    if suture is not None:
        sub_per_s = float(suture.substeps.sum()) / sum(suture.wall_s)
        rows.insert(0, ["suturesim (bench-suture)", f"{TICK / suture.substeps.mean():.3g} (mean)",
                        f"{sub_per_s:.3g}", f"{_g(suture.rtf_best)} / {_g(suture.rtf_median)}",
                        f"{sum(suture.sim_s) / len(suture.sim_s):g} s × {len(suture.sim_s)}",
                        "yes" if suture.diverged_at is None else "**no**"])
    out += table(["code", "dt (s)", "steps per wall s", "real-time factor (best / median)", "simulated", "stable"],
                 rows)
    out.append("")
    if suture is not None:
        ratio_best = suture.rtf_best / el.rtf_best
        ratio_med = suture.rtf_median / el.rtf_median
        verdict = "meets" if ratio_best >= RATIO_TARGET else "**misses**"
        out.append(f"Ratio of real-time factors, suturesim / PyElastica: **{_g(ratio_best)}×** best, "
                   f"{_g(ratio_med)}× median ({verdict} the {RATIO_TARGET:g}× target).")
        out.append("")
    return out


NOTES = [
    "## Notes on method",
    "",
    "- **Timing.** `time.perf_counter` around calls, garbage collector off inside timed regions. Every figure is "
    "repeated; *best* is the fastest repeat (the least disturbed by the other processes on the machine), "
    "*median* the typical one. Numba kernels are compiled (or loaded from the cache) and the thread warmed up "
    "before anything is timed.",
    "- **Re-running.** `suturesim bench <part> --out FILE` rewrites that part's section and leaves the others; "
    "`bench all --out FILE` rewrites them all. Either keeps what a section holds below its line "
    "`<!-- written by hand below: ... -->` (notes on earlier runs and other machines).",
    "- **Kernel µs/substep**: one `integrator.step(model, state, K, h)` call running K substeps inside one "
    "kernel call (K chosen so one call lasts ~30 ms), divided by K: the per-substep cost without Python dispatch. "
    "**dispatch**: `integrator.step(model, state, 0, h)` (no substep) called in a loop: the Python wrapper and "
    "numba's unboxing of its arguments (the model's arrays and the state's five packed buffers, "
    "`ThreadState.packed`; 26 arrays), and the stability bound at the end, paid once per call. **1-substep call**: "
    "`integrator.step(model, state, 1, h)` called in a loop, per call: kernel plus dispatch. **1 ms tick**: "
    "`integrator.step(model, state, substeps, 1 ms / substeps)` per call, i.e. what the 1 kHz loop pays. "
    "**iters/substep** = `state.stats[5]` / substeps of the kernel calls.",
    "- **Why h is not always 1 ms in the sweep.** The scheme is explicit in bending and in the direction of the "
    "constraint forces, so a substep is stable only while h·ω_max < 2. Bending alone gives ω = (4/l²)√(EI/ρA), "
    "which with EI = 5e-6 N m², ρA = 0.01 kg/m fails at 1 ms beyond N ≈ 150; scaling EI by (100/N)⁴ keeps this "
    "term at its N = 100 value. But a hanging thread also has the string mode of its tension, "
    "ω ≈ 2√(T/ρA)/l with T ≈ Mg ≈ 0.1 N at the pin, which grows like N whatever EI is: with EI scaled, a 1 ms substep "
    "is stable for N = 200 (3 s tried) but diverges for N = 300 within 0.02 s and for N = 500 within 0.004 s. So each N runs at the substep the solver's own stability "
    "bound picks (`integrator.tick` with automatic substeps during the warm-up; the most substeps it asked for "
    "are then fixed for the timing), and the tables say which h that is. The per-substep cost does not depend "
    "on h except through the iteration count, which is given; it depends more on the motion than on h (Newton: 1 "
    "per substep on this small swing even at h = 1 ms for N = 50, about 2 on the violent horizontal release of "
    "Fig. 17(a) at h = 1 ms, table 2). The *1-substep* real-time N is therefore a compute ceiling; the *whole "
    "tick* real-time N is what a stable simulation of this thread reaches: its cost grows like N² because the "
    "substeps needed grow like N.",
    "- **Linear fit**: least squares of best kernel time against N on relative residuals (weights 1/t), so "
    "N = 50 counts as much as N = 5000; the deviation is the largest |t − fit| / t over the points. Points off "
    "the line come with a different iteration count (the contraction method's varies with the phase of the "
    "swing); the ns/segment column shows the cost per segment at each N.",
    "- **Scenarios** run tick by tick exactly as the server does (`integrator.Stepper`: substeps from the stability "
    "bound up to the budget `max_substeps`, selective mass scaling past it, a tick that fails its check run again; "
    "fixed substeps run as given). A run stops at the first tick whose multipliers do not converge "
    f"(residual > {DIVERGED_RESIDUAL:g}) or whose positions are not finite, and the table says when.",
    "- **PyElastica** (`tools/bench_elastica.run_pyelastica`): Cosserat rod, PositionVerlet, pinned position "
    f"(free rotation), gravity −z, AnalyticalLinearDamper {ELASTICA_DAMPING:g} 1/s (it has no air-drag model; "
    "bench-suture has air drag). Its time step is `stable_dt`: 0.7 × the analytical PositionVerlet limit "
    "r√(ρ/(α_c G)) of the stiffest mode of a thin rod -- one element rotating against its shear stiffness, "
    "independent of the segment length -- which bisection runs confirmed to 0.2 % (see "
    "tools/bench_elastica.py). Only its `integrate` call is timed, after a warm-up run on a throw-away copy.",
    "",
]


# the parts measured by a module of their own (tools/<module>.py with measure_<part>(quick, log) and
# render_<part>(result)), in the document's order: (part, module, what the log says, whether it runs the server
# loop or a device, which `all --no-loop` skips)
PARTS = (("loop", "bench_loop", "server loop", True), ("haptics", "bench_haptics", "haptics", True),
         ("contact", "bench_contact", "self-contact", False),
         ("tissue", "bench_tissue", "tissue and the scripted suture", False),
         ("inbound", "bench_inbound", "inbound validation", False),
         ("bot", "bench_bot", "the trainee bot's suture by hand", True),
         ("knot", "bench_knot", "a knot at the thread's true diameter", False),
         ("bot-rate", "bench_bot_rate", "the trainee bot's rate over many runs in process", True))


# -- entry point -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="suturesim bench",
        description="Time the solver against segment count, scenarios' real-time factors, PyElastica, the "
                    "1 kHz loop of `suturesim serve`, the haptic device path, self-contact, the scripted "
                    "suture with its needle and tissue, a suture by hand by the trainee bot, and a knot held at "
                    "the thread's true diameter.")
    parser.add_argument("what", nargs="?",
                        choices=("solver", "suture", "loop", "haptics", "contact", "tissue", "inbound", "bot",
                                 "bot-rate", "knot", "all"),
                        default="all",
                        help="solver: step time against N; suture: scenarios and PyElastica; loop: the 1 kHz "
                             "loop of `suturesim serve` (lateness, subscribers, start-up); haptics: pose-to-force "
                             "latency and servo callback time through the OpenHaptics emulator; contact: "
                             "self-contact cost and force smoothness; tissue: tick time of the scripted simple "
                             "interrupted suture (needle, pads, punctures), whole and by phase, and how both "
                             "scripted sutures end when perturbed by a unit of round-off; inbound: what "
                             "validating a control request or stylus sample costs the tick, ordinary and hostile; "
                             "bot: the trainee bot's suture by hand on `suturesim serve` (10 perturbed runs), "
                             "beside a fixed computation a tick in the loop's wait at three sizes (the "
                             "machine's own spread); bot-rate: how often the same bot's suture is done over "
                             "60 perturbed runs through the server's tick in process, a sample now and then a "
                             "tick late; "
                             "knot: an overhand knot in 3-0 silk pulled to 3 N by two styluses and held, as "
                             "shipped and at the thread's own diameter, and the reef knot at a suture's scale "
                             "under the suture scenes' contact and at the diameter; all: every one")
    parser.add_argument("--quick", action="store_true", help="short measurements (a smoke test)")
    parser.add_argument("--out", metavar="FILE", help="(re)write this markdown file, e.g. docs/BENCHMARKS.md")
    parser.add_argument("--no-elastica", action="store_true", help="skip the PyElastica comparison")
    parser.add_argument("--no-loop", action="store_true",
                        help="with `all`: skip the server loop, haptics and both bot measurements")
    args = parser.parse_args(argv)
    budget = QUICK if args.quick else FULL

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def emit(lines: list[str]) -> None:
        print("\n".join(lines), flush=True)
        doc.extend(lines)

    info = machine_info()
    doc: list[str] = []
    command = "suturesim bench " + " ".join(argv if argv is not None else sys.argv[1:])
    emit(["# Benchmarks", "",
          f"Produced by `{command.strip()}` on {info['CPU']} ({info['cores']} cores), Python {info['Python']}, "
          f"numpy {info['numpy']}, numba {info['numba']}, {info['date']}"
          + (" (**--quick**: shortened measurements)." if args.quick else "."), ""])
    emit(render_machine(info))

    t_start = time.perf_counter()
    measured: list[list[str]] = []   # the sections measured, for a `--out` of one part

    def section(lines: list[str]) -> None:
        emit(lines)
        measured.append(lines)

    if args.what in ("solver", "all"):
        log("solver sweep ...")
        section(render_sweep(measure_sweep(budget, log)))
    if args.what in ("suture", "all"):
        log("scenarios ...")
        scen = measure_scenarios(budget, log)
        section(render_scenarios(scen, budget))
        if args.no_elastica:
            log("PyElastica skipped (--no-elastica)")
        else:
            log("PyElastica ...")
            el = measure_elastica(budget, log)
            if el.skipped:   # a run without PyElastica leaves a document's comparison as it was
                log(f"PyElastica skipped: {el.skipped}")
                emit(render_elastica(el, scen[0]))
            else:
                section(render_elastica(el, scen[0]))
    for name, module, what, live in PARTS:
        if args.what == name or (args.what == "all" and not (live and args.no_loop)):
            mod = importlib.import_module(f".{module}", __package__)
            log(f"{what} ...")
            fn = name.replace("-", "_")
            section(getattr(mod, f"render_{fn}")(getattr(mod, f"measure_{fn}")(args.quick, log)))
        elif args.what == "all" and name == "loop":
            log("server loop skipped (--no-loop)")
    emit(NOTES)
    log(f"done in {time.perf_counter() - t_start:.0f} s")

    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(doc)
        if args.what != "all" and out.exists():
            # `bench <part> --out` updates its own sections of an existing document and keeps the others (a
            # `bench solver --out` wrote a document of Sec. 1 alone, and took Sec. 2-7 with it)
            from .bench_loop import splice_section

            text = out.read_text()
            for section in measured:
                text = splice_section(text, section, f"{command.strip()}", info["date"])
        elif out.exists():
            # a whole new document keeps the notes written by hand below each section's KEEP_BELOW line
            from .bench_loop import keep_notes

            text = keep_notes(out.read_text(), text)
        out.write_text(text.rstrip() + "\n")
        log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
