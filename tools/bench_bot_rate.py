"""`suturesim bench bot-rate`: how often the trainee bot's suture by hand is done, over many perturbed runs in
process (section 11 of docs/BENCHMARKS.md).

`suturesim bench bot` runs the bot against `suturesim serve`, ten runs in about eleven minutes, and ten runs cannot
tell a rate of 80 % from one of 60 %. Here the same bot (tools/trainee_bot.py: its plan, its reading of what the
server publishes, its report) sutures the same perturbed `suture-practice` through the server's own tick
(server/physics.py ``PhysicsLoop.tick_scene``, what the daemon runs each tick), the messages it publishes handed
to the bot as the bot would read them, with no sockets and no clock: a run takes a fraction of its scene time
and two run at once, one a core. The physics is the daemon's, bit for bit.

What a live run has and this does not is the timing of the samples. In a live run the bot's 1 kHz clock and the
server's drift apart, so a hand's sample now and then comes a tick late and the next two in one tick (the server
takes the newest). Here each hand's sample for a tick is held back with probability ``jitter`` (drawn from the
run's seed): the server keeps that hand's last pose for the tick and takes the newer one the tick after. Without
it the runs are the bot's plan on exactly the ticks it was made for, which a live run never is.

*Done* is `suturesim bench bot`'s (tools/bench_bot.py ``suture_done``): four punctures, a surgeon's knot read at the
end, the wound closed at the end and not opened after the hands let go.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..server.physics import HIST_BIN_US, HIST_BINS
from ..solver.contact_response import CS_ROUNDS
from ..solver.integrator import STAT_TISSUE_NEEDLE, STAT_TISSUE_PADS, STAT_TISSUE_ROUNDS, STAT_TISSUE_THREAD
from ..solver.timers import STAGES, seconds_per_cycle
from .bench_bot import hist_percentile, suture_done
from .trainee_bot import LEFT, RIGHT, UNIT, BotFailed, Sight, Trainee, broke, perturbation

SEEDS_FULL = 60
SEEDS_QUICK = 2
JITTER = 0.2           # a hand's sample held back for a tick with this probability
START_TICKS = 20       # ticks the scene runs before the bot first looks, its hands resting at the origin
WILSON_Z = 1.96        # the rate's 95 % interval
SLOWEST = 1.0          # % of a run's ticks, its slowest steps, whose stages Timing keeps apart
# what Timing keeps of each tick besides its stages' times: the self-contact's rounds, the tissue's rounds and
# of them those in which the pads, the needle's hold in the tissue or the thread kept off its needle pushed
ROUND_KEYS = ("contact rounds", "tissue rounds", "pads", "needle in tissue", "needle on thread")


class Timing:
    """Each tick of a run in process: the step's time and the scene's part of the tick (the styluses' samples
    taken, the step, the watch, the forces, the state built, no sockets), µs, in 10 µs bins as the server's
    `stats` count them (server/physics.py HIST_BIN_US), and the step's stage timers and rounds, kept per tick
    (preallocated, grown by doubling off the step) to read where the slowest steps go."""

    def __init__(self, capacity: int = 1 << 16):
        self.step_hist = np.zeros(HIST_BINS, np.int64)
        self.tick_hist = np.zeros(HIST_BINS, np.int64)
        self.rows = np.zeros((capacity, 1 + len(STAGES) + len(ROUND_KEYS)))
        self.n = 0
        self.us_per_cycle = seconds_per_cycle() * 1e6

    def add(self, step_ns: int, tick_ns: int, timers: np.ndarray, stats: np.ndarray, contact: np.ndarray) -> None:
        self.step_hist[min(int(step_ns / (HIST_BIN_US * 1e3)), HIST_BINS - 1)] += 1
        self.tick_hist[min(int(tick_ns / (HIST_BIN_US * 1e3)), HIST_BINS - 1)] += 1
        if self.n == self.rows.shape[0]:
            self.rows = np.concatenate((self.rows, np.zeros_like(self.rows)))
        row = self.rows[self.n]
        row[0] = step_ns * 1e-3
        row[1:1 + len(STAGES)] = timers[:len(STAGES)]
        k = 1 + len(STAGES)
        row[k] = contact[CS_ROUNDS]
        row[k + 1:k + 5] = stats[[STAT_TISSUE_ROUNDS, STAT_TISSUE_PADS, STAT_TISSUE_NEEDLE, STAT_TISSUE_THREAD]]
        self.n += 1

    def summary(self) -> dict:
        """The histograms, and the mean a tick of each stage (µs) and each of ROUND_KEYS over the run's slowest
        SLOWEST % of steps and over all its ticks, with the count of each."""
        rows = self.rows[:self.n].copy()
        rows[:, 1:1 + len(STAGES)] *= self.us_per_cycle
        slow = rows[:, 0] >= np.percentile(rows[:, 0], 100.0 - SLOWEST) if self.n else np.zeros(0, bool)
        keys = STAGES + ROUND_KEYS
        return {"step_hist": self.step_hist.tolist(), "tick_hist": self.tick_hist.tolist(),
                "slowest": {"ticks": int(slow.sum()), **{k: float(rows[slow, 1 + i].sum()) for i, k in enumerate(keys)}},
                "all": {"ticks": self.n, **{k: float(rows[:, 1 + i].sum()) for i, k in enumerate(keys)}}}


class Published(Sight):
    """What the bot sees of a loop run in process: the (topic, payload) messages it published, in order, handed
    to the bot's sight at each look."""

    def __init__(self, out: list[tuple[bytes, bytes]]):
        super().__init__()
        self.out, self.seen = out, 0

    def look(self) -> None:
        self.see(self.out[self.seen:])
        self.seen = len(self.out)


class InProcess:
    """`suture-practice` with ``overrides`` merged over it, run by the server's own tick with two remote styluses,
    as `suturesim serve --device remote` runs it; ``poses`` holds each stylus's sample (position m, quaternion
    w x y z, buttons), taken by the loop at each :meth:`tick`; ``out`` every message published; ``ticks`` the
    ticks run and ``held`` the samples :meth:`take` held back."""

    def __init__(self, overrides: dict | None = None):
        from ..server.config import DeviceConfig, ServerConfig
        from ..server.physics import PhysicsLoop
        from ..solver.scenario import load_scenario

        self.out: list[tuple[bytes, bytes]] = []
        devices = tuple(DeviceConfig(name=d, backend="remote") for d in (RIGHT, LEFT))
        cfg = ServerConfig(file="<in process>", scenario=load_scenario("suture-practice", overrides),
                           devices=devices)
        self.loop = PhysicsLoop(cfg, sink=lambda topic, payload: self.out.append((topic, bytes(payload))))
        self.poses = {d: (np.zeros(3), UNIT.copy(), 0) for d in (RIGHT, LEFT)}
        self.ticks = 0
        self.held = 0
        self.timing = Timing()

    def tick(self, n: int = 1) -> None:
        """``n`` of the server's ticks, each taking every stylus's sample first as the remote backend does."""
        loop = self.loop
        for _ in range(n):
            t0 = time.perf_counter_ns()
            for device, (pos, quat, buttons) in self.poses.items():
                loop.stylus_sample(loop.devices[device], pos, quat, buttons)
            loop.seq += 1
            _, step_ns = loop.tick_scene(0)
            self.timing.add(step_ns, time.perf_counter_ns() - t0, loop.timers, loop.state.stats,
                            loop.state.contact_stats)
            self.ticks += 1

    def take(self, hands: dict, jitter: float = 0.0, rng: np.random.Generator | None = None) -> None:
        """Each of ``hands``' (device -> trainee_bot.Hand) pose and buttons as its stylus's sample for the next
        tick; with probability ``jitter`` (drawn from ``rng``) held back instead and counted in ``held``, so that
        the loop keeps the stylus's last sample for that tick."""
        for device, hand in hands.items():
            if jitter > 0.0 and rng.random() < jitter:
                self.held += 1
            else:
                self.poses[device] = (hand.pos.copy(), hand.quat.copy(), hand.buttons)


def watching(scene: InProcess, seed: int, tie: str = "instrument") -> Trainee:
    """The trainee bot of ``seed`` (and ``tie``) looking at ``scene``, once the scene has run START_TICKS ticks
    with the hands at rest: drive its ``plan`` with :func:`drive`."""
    bot = Trainee.with_eyes(Published(scene.out), seed, tie=tie)
    scene.tick(START_TICKS)
    bot.eyes.look()
    return bot


def drive(scene: InProcess, bot: Trainee, plan: Iterator[None], until: str | None = None, jitter: float = 0.0,
          rng: np.random.Generator | None = None) -> None:
    """Drive ``plan`` (a generator that yields once a tick) a tick at a time: the bot's hands to the styluses'
    samples (:meth:`InProcess.take`, ``jitter`` and ``rng`` as there), a tick, and the bot looks; until the plan
    ends or the bot has done the step ``until``."""
    for _ in plan:
        scene.take(bot.hands, jitter, rng)
        scene.tick()
        bot.eyes.look()
        if until is not None and until in bot.done:
            return


def run_in_process(seed: int, jitter: float = JITTER, until: str | None = None) -> dict:
    """The bot of ``seed`` sutures `suture-practice` perturbed by ``seed`` in process, each hand's sample held back
    a tick with probability ``jitter``; until its plan ends, or it has done the step ``until``. Returns the bot's
    report (trainee_bot.Trainee.report) with ``ok`` (:func:`suture_done`), ``ticks`` (the server's) and ``held``
    (the samples held back)."""
    scene = InProcess(perturbation(seed))
    bot = watching(scene, seed)
    rng = np.random.default_rng([seed, 1])   # its own stream: the bot's draws from ``seed`` stay as they are
    failure = None
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        drive(scene, bot, bot.plan(), until, jitter, rng)
    except BotFailed as exc:
        failure = str(exc)
    except Exception as exc:   # a fault of the bot's own: reported with the suture so far
        failure = broke(exc)
    report = bot.report(failure, time.process_time() - cpu0, time.monotonic() - wall0)
    return {**report, "ok": suture_done(report), "ticks": scene.ticks, "held": scene.held,
            "timing": scene.timing.summary()}


def _run(args: tuple[int, float]) -> dict:
    return run_in_process(*args)


def wilson(done: int, runs: int, z: float = WILSON_Z) -> tuple[float, float]:
    """The Wilson score interval of a rate ``done`` of ``runs`` (fractions): its 95 % interval for z = 1.96."""
    if runs == 0:
        return 0.0, 1.0
    p = done / runs
    centre = (p + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs)) / (1 + z * z / runs)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class RateBench:
    jitter: float
    reports: list[dict]
    seconds: float        # wall time of all the runs
    workers: int


def measure_bot_rate(quick: bool, log: Callable[[str], None]) -> RateBench:
    seeds = range(SEEDS_QUICK if quick else SEEDS_FULL)
    workers = max(1, min(len(seeds), os.cpu_count() or 1))
    t0 = time.monotonic()
    reports = []
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for r in pool.imap(_run, [(seed, JITTER) for seed in seeds]):
            log(f"  seed {r['seed']}: {'done' if r['ok'] else 'NOT done'} ({r['failure'] or r['knot_at_end']})")
            reports.append(r)
    return RateBench(JITTER, reports, time.monotonic() - t0, workers)


def failed_at(report: dict) -> str:
    """Where a run that was not done went wrong, in a few words: the throw or step that failed first (a run that
    ended on a failed throw: the first of the throws that failed and were followed by another, ``redone``, if
    any; a surgeon's knot undone by the opposite throw's cinch went wrong there, not at the double throw thrown
    after it), or how the knot or the wound ended."""
    failure = report.get("failure")
    if failure:
        failure = (report.get("redone") or [failure])[0]
        head = failure.split(":")[0]
        if head in ("double throw", "opposite throw", "cinch"):
            return f"the {head} failed its look" if head != "cinch" else "the cinch again failed"
        return "the tie ended on a knot no throw mends" if "no throw makes it" in failure else failure[:60]
    if report.get("knot_at_end") != "surgeon's knot":
        return f"the knot loosened to {report.get('knot_at_end')} after the tie"
    if report.get("gap_opened_after_release"):
        return "the wound opened after the hands let go"
    if not report.get("closed_at_end"):
        return "the wound not closed at the end"
    return "an earlier step failed"


def render_bot_rate(bench: RateBench) -> list[str]:
    reports = bench.reports
    runs, done = len(reports), sum(r["ok"] for r in reports)
    lo, hi = wilson(done, runs)
    causes: dict[str, list[int]] = {}
    for r in reports:
        if not r["ok"]:
            causes.setdefault(failed_at(r), []).append(r["seed"])
    scene_s = sum(r["ticks"] for r in reports) * 1e-3
    out = ["## 11. The trainee bot's rate over many runs, in process (`suturesim bench bot-rate`)", "",
           "The trainee bot of `suturesim bench bot` (Sec. 9), seeds 0 up, each run's needle moved and turned "
           "by its seed, suturing `suture-practice` through the server's own tick in process "
           "(tools/bench_bot_rate.py: the same bot, plan and physics, bit for bit, without sockets or a clock). "
           f"Each hand's sample is held back a tick with probability {bench.jitter:g}, as a live run's samples "
           "now and then come a tick late. *Done* as in Sec. 9. The interval is the rate's 95 % Wilson score "
           "interval.", "",
           "| runs | a sample held back | done | rate | 95 % interval | scene time | wall time |",
           "|---|---|---|---|---|---|---|",
           f"| {runs} | {bench.jitter:g} | {done} | {100.0 * done / max(runs, 1):.0f} % "
           f"| {100.0 * lo:.0f}-{100.0 * hi:.0f} % | {scene_s:.0f} s | {bench.seconds:.0f} s on {bench.workers} "
           f"core{'s' if bench.workers > 1 else ''} |", ""]
    if causes:
        out += ["Runs not done, by where they went wrong (seeds):", ""]
        out += [f"- {cause}: {len(seeds)} ({', '.join(map(str, seeds))})"
                for cause, seeds in sorted(causes.items(), key=lambda kv: -len(kv[1]))]
        out.append("")
    timed = [r["timing"] for r in reports if r.get("timing", {}).get("all", {}).get("ticks")]
    if timed:
        out += render_timing(timed)
    return out


def render_timing(timed: list[dict]) -> list[str]:
    """The step's and the in-process tick's percentiles over every run's ticks, and where the runs' slowest steps
    go (Timing.summary of each run)."""
    def pct(key: str, q: float) -> float:
        return hist_percentile(np.sum([t[key] for t in timed], axis=0), q)

    def row(name: str, part: str) -> str:
        ticks = sum(t[part]["ticks"] for t in timed)
        cells = [f"{sum(t[part][k] for t in timed) / ticks:.0f}" for k in STAGES]
        cells.append(f"{sum(sum(t[part][k] for k in STAGES) for t in timed) / ticks:.0f}")
        cells += [f"{sum(t[part][k] for t in timed) / ticks:.1f}" for k in ROUND_KEYS]
        return f"| {name} | {ticks} | " + " | ".join(cells) + " |"
    largest = max(hist_percentile(t["tick_hist"], 99.0) for t in timed)
    return ["The same runs' timing, in process (two at once, one a core; µs, to the 10 µs of the histograms "
            "the server's `stats` count in): the step (`Stepper.tick` with its substeps) and the scene's part of "
            "a tick (the styluses' samples taken, the step, the watch, the forces and the state built, without "
            "the sockets of Sec. 9, whose tick is the target's): p50 / p99 over every run's ticks, and the "
            "largest of a run's own p99.", "",
            "| | p50 | p99 | a run's p99 at most |", "|---|---|---|---|",
            f"| step | {pct('step_hist', 50.0):.0f} | {pct('step_hist', 99.0):.0f} "
            f"| {max(hist_percentile(t['step_hist'], 99.0) for t in timed):.0f} |",
            f"| tick in process | {pct('tick_hist', 50.0):.0f} | {pct('tick_hist', 99.0):.0f} | {largest:.0f} |",
            "",
            f"Where the slowest steps go: each run's slowest {SLOWEST:g} % of steps (at or above its own p99) "
            "against all its ticks, every run pooled; each stage's mean µs a tick (solver/timers.py, the stages "
            "of Sec. 9's table), then the mean a tick of the self-contact's rounds and the tissue's, and of the "
            "tissue's those in which the pads, the needle held by the tissue or the needle against its own thread "
            "still pushed (a tick has up to 4 substeps).", "",
            "| ticks | count | " + " | ".join(STAGES) + " | all | " + " | ".join(ROUND_KEYS) + " |",
            "|---|---|" + "---|" * (len(STAGES) + 1 + len(ROUND_KEYS)),
            row(f"slowest {SLOWEST:g} %", "slowest"), row("all", "all"), ""]
