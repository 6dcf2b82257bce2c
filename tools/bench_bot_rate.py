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

from .bench_bot import suture_done
from .trainee_bot import LEFT, RIGHT, UNIT, BotFailed, Sight, Trainee, broke, perturbation

SEEDS_FULL = 60
SEEDS_QUICK = 2
JITTER = 0.2           # a hand's sample held back for a tick with this probability
START_TICKS = 20       # ticks the scene runs before the bot first looks, its hands resting at the origin
WILSON_Z = 1.96        # the rate's 95 % interval


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

    def tick(self, n: int = 1) -> None:
        """``n`` of the server's ticks, each taking every stylus's sample first as the remote backend does."""
        loop = self.loop
        for _ in range(n):
            for device, (pos, quat, buttons) in self.poses.items():
                loop.stylus_sample(loop.devices[device], pos, quat, buttons)
            loop.seq += 1
            loop.tick_scene(0)
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
    return {**report, "ok": suture_done(report), "ticks": scene.ticks, "held": scene.held}


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
    return out
