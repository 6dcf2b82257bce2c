"""`suturesim bench bot`: the trainee bot's suture by hand on `suturesim serve` (section 9 of docs/BENCHMARKS.md).

Each run starts `suturesim serve --device remote` on `suture-practice` with the needle moved and turned as the
run's seed draws it (trainee_bot.perturbed_practice), then the trainee bot (tools/trainee_bot.py) in its own
process with the same seed: it picks the needle up, bites through both edges, hands it over, draws the thread
through, ties an instrument tie with the scene's needle driver and forceps (a surgeon's double throw wound on the
driver's jaw, the opposite single throw on it), lets go and watches it 10 s. What is measured:

- whether the suture was done, as the server's own events say: four punctures, the knot the server read last
  (`knot` events) a surgeon's knot, the wound closed (`gap_closed`) and not opened again once both hands let go;
- the server's tick over the whole run, from its `stats` topic (one message a second: that second's p50, p99
  and max): the solver step (`step_us`: `Stepper.tick` with its substeps) and the whole tick (`tick_us`: the
  step, the watch's events and knot reading, the styluses, the forces and the `state` published), pooled as
  the median of the seconds' p50, the p99 over every tick of the run (the seconds' histograms of 10 µs bins
  pooled: the budget, TARGET_P99_US, is the tick's p99 through the whole suture), the largest of the seconds'
  p99 and their max; the medians of the tick's other stages (`inputs_us`, `watch_us`, `outputs_us`); the ticks
  more than 1 ms late;
- the bot's own CPU time over its wall time: its share of one of the machine's cores, taken from the server's;
- the same seconds split by the step of the suture the bot was working toward when each ended (the bot marks
  each step with the scene time of the newest `state` it saw), every run pooled: where the tick's budget goes;
- before the runs, the machine alone (tools/machine_probe.py): a fixed computation once a tick in the server
  loop's wait, priority and CPU, nothing else running, sized in turn from a small tick's work to the step's median
  (PROBE_WORK_US): the spread this machine gives a tick whatever it computes, and so the smallest p99 a tick of
  that work can have here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import zmq

from ..server import protocol
from ..server.config import LoopConfig
from ..server.physics import HIST_BIN_US
from .bench_loop import Server
from .machine_probe import SLOW_FACTOR, MachineFloor, measure_floor
from ..solver.timers import STAGES
from .trainee_bot import LEAD_S, perturbed_practice

TARGET_P99_US = 500.0
SEEDS_FULL = 10
SEEDS_QUICK = 2
BOT_TIMEOUT_S = 150.0
# the probe's fixed work a tick (µs), each for a third of its time: a tick of the loop's Python stages alone, about
# half the step's median, and about the solver step's median through the bot's suture
PROBE_WORK_US = (50.0, 150.0, 300.0)
PROBE_S_FULL = 60.0
PROBE_S_QUICK = 6.0


def pool(seconds: list[dict], key: str) -> tuple[float, float, float]:
    """(median of the seconds' p50, largest p99, largest max) of ``key`` (µs) over the server's `stats`
    ``seconds`` that counted ticks; nan if none did."""
    s = [m[key] for m in seconds if m.get("ticks")]
    if not s:
        return (float("nan"),) * 3
    return (float(np.median([v["p50"] for v in s])), max(v["p99"] for v in s), max(v["max"] for v in s))


def spanned(seconds: list[dict], key: str, q: float = 99.0) -> float:
    """The ``q``-th percentile (µs) of ``key`` over every tick of the ``seconds`` (the server's `stats`), from their
    histograms pooled (`hist`: ticks counted in 10 µs bins): the top of the bin that holds it, so at most 10 µs
    above the exact figure; nan if no second carried a histogram."""
    hists = [m[key]["hist"] for m in seconds if m.get("ticks") and "hist" in m.get(key, {})]
    return hist_percentile(np.sum(hists, axis=0), q) if hists else float("nan")


def hist_percentile(counts, q: float) -> float:
    """The ``q``-th percentile (µs) of the ticks ``counts`` counts in 10 µs bins from 0 (`stats` `hist`): the top of
    the bin that holds it; nan if it counts none."""
    counts = np.asarray(counts)
    if counts.sum() == 0:
        return float("nan")
    k = int(np.searchsorted(np.cumsum(counts), q / 100.0 * counts.sum()))
    return (min(k, len(counts) - 1) + 1) * HIST_BIN_US


def suture_done(report: dict) -> bool:
    """The suture done, by the server's events as the bot's ``report`` gives them: four punctures, a surgeon's knot
    read at the end, the wound closed at the end (its last gap event `gap_closed`) and not opened after the hands
    let go."""
    r = report
    return bool(r) and r.get("failure") is None and len(r.get("punctures", [])) == 4 and \
        r.get("knot_at_end") == "surgeon's knot" and bool(r.get("closed_at_end")) and \
        not r.get("gap_opened_after_release") and "watched" in r.get("done", [])


@dataclass
class BotRun:
    seed: int
    report: dict = field(default_factory=dict)        # the bot's JSON report
    stats: list[dict] = field(default_factory=list)   # the server's `stats`, one a second
    error: str | None = None

    @property
    def ok(self) -> bool:
        return suture_done(self.report)

    def pooled(self, key: str) -> tuple[float, float, float]:
        """(median of the seconds' p50, largest p99, largest max) of ``key`` (µs)."""
        return pool(self.stats, key)

    def whole(self, key: str) -> float:
        """The p99 of ``key`` (µs) over every tick of the run (its seconds' histograms pooled)."""
        return spanned(self.stats, key)

    def phases(self) -> list[tuple[str, list[dict]]]:
        """The server's seconds by what the bot was doing: (the step it was working toward, the `stats` of the
        seconds that ended before the bot marked it and after the step before), in the bot's order; a second
        that spans two steps counts toward the one it ended in."""
        names, times = self.report.get("done", []), self.report.get("done_t", [])
        out: list[tuple[str, list[dict]]] = [(name, []) for name in names]
        for m in self.stats:
            if not m.get("ticks"):
                continue
            k = next((i for i, t in enumerate(times) if m["t"] <= t), None)
            if k is not None:
                out[k][1].append(m)
        return out

    @property
    def overruns(self) -> int:
        return int(self.stats[-1]["overruns"] - self.stats[0]["overruns"]) if len(self.stats) > 1 else 0

    @property
    def ticks(self) -> int:
        return int(self.stats[-1]["ticks"] - self.stats[0]["ticks"]) if len(self.stats) > 1 else 0


def run_bot(seed: int, log: Callable[[str], None]) -> BotRun:
    """One perturbed suture by hand: serve, the bot, the server's stats while the bot runs."""
    run = BotRun(seed)
    with tempfile.TemporaryDirectory(prefix="suturesim-bot-") as tmp:
        scene = Path(tmp) / "practice.yaml"
        perturbed_practice(seed, scene)
        server = Server(env=dict(os.environ, XDG_DATA_HOME=tmp))
        server.cmd += ["--scenario", str(scene), "--device", "remote"]
        stylus = server.cmd[server.cmd.index("--stylus") + 1]
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_STATS)
        sub.setsockopt(zmq.LINGER, 0)
        server.start()
        try:
            if not server.ready.wait(120.0):
                run.error = f"the server did not start: {server.tail()}"
                return run
            sub.connect(server.pub)
            bot = subprocess.Popen([sys.executable, "-m", "suturesim.tools.trainee_bot", "--pub", server.pub,
                                    "--stylus", stylus, "--seed", str(seed)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + BOT_TIMEOUT_S
            while bot.poll() is None and time.monotonic() < deadline:
                while sub.poll(100):
                    run.stats.append(protocol.decode_stats(sub.recv_multipart()[1]))
            if bot.poll() is None:
                bot.kill()
                run.error = f"the bot did not finish within {BOT_TIMEOUT_S:g} s"
            out, err = bot.communicate()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if lines:
                run.report = json.loads(lines[-1])
            elif run.error is None:
                run.error = f"the bot reported nothing: {err.strip()[-300:]}"
        finally:
            server.stop()
            sub.close()
            ctx.term()
    log(f"  seed {seed}: {'done' if run.ok else 'NOT done'} "
        f"({run.error or run.report.get('failure') or run.report.get('knot_at_end')}), "
        f"step p99 {run.whole('step_us'):.0f} µs, tick p99 {run.whole('tick_us'):.0f} µs over the run "
        f"(a second's at most {run.pooled('tick_us')[1]:.0f} µs)")
    return run


@dataclass
class BotBench:
    runs: list[BotRun]
    machine: tuple[MachineFloor, ...] = ()   # the probe's fixed work, one a size (PROBE_WORK_US), before the runs


def measure_bot(quick: bool, log: Callable[[str], None]) -> BotBench:
    seconds = (PROBE_S_QUICK if quick else PROBE_S_FULL) / len(PROBE_WORK_US)
    machine = []
    for work in PROBE_WORK_US:
        log(f"  the machine alone: {work:.0f} µs of fixed work a tick for {seconds:.0f} s")
        m = measure_floor(seconds, work, LoopConfig())
        log(f"  fixed work p50 {m.p50_us:.0f} µs, p99 {m.p99_us:.0f} µs, p99.9 {m.p999_us:.0f} µs")
        machine.append(m)
    return BotBench([run_bot(seed, log) for seed in range(SEEDS_QUICK if quick else SEEDS_FULL)], tuple(machine))


def render_machine(floors: tuple[MachineFloor, ...]) -> list[str]:
    """The probe's paragraph and rows: what this machine gives a tick of fixed work, one row a size."""
    m = floors[0]
    rows = [f"| about {f.work_us:.0f} µs | {f.ticks} | {f.p50_us:.0f} | {f.p99_us:.0f} | {f.p999_us:.0f} "
            f"| {f.max_us:.0f} | {f.p99_over_p50:.2f} | {f.slowed} ({100.0 * f.slowed / f.ticks:.2f} %) "
            f"| {f.over_tick} ({100.0 * f.over_tick / f.ticks:.2f} %) |" for f in floors]
    return ["The machine alone, before the runs (tools/machine_probe.py): one process with the server loop's "
            f"wait, priority and CPU ({'SCHED_FIFO' if m.realtime else 'normal scheduling'}, CPU {m.cpu}) ran "
            f"the same computation once a tick, {m.seconds:.0f} s at each size, nothing else running: the smallest "
            f"about {floors[0].work_us:.0f} µs (the loop's own Python stages, no step), the largest about "
            f"{floors[-1].work_us:.0f} µs (the step's median here). The computation never changes, so its spread is "
            "the machine's: the host taking the CPU away or running it slow. A tick of that work cannot have "
            "a p99 below its row's on this machine.", "",
            "| fixed work a tick | ticks | p50 µs | p99 µs | p99.9 µs | max µs | p99 over p50 "
            f"| ticks over {SLOW_FACTOR:g} × p50 | ticks over 1 ms |",
            "|---|---|---|---|---|---|---|---|---|"] + rows + [""]


def render_bot(bench: BotBench) -> list[str]:
    runs = bench.runs
    rows = []
    for r in runs:
        rep = r.report
        step, tick = r.pooled("step_us"), r.pooled("tick_us")
        share = rep.get("cpu_s", float("nan")) / rep["wall_s"] if rep.get("wall_s") else float("nan")
        wound = "closed" if rep.get("closed_at_end") else "closed, open at the end" if rep.get("gap_closed") else "open"
        what = r.error or rep.get("failure") or (
            f"{rep.get('knot_at_end')}; wound {wound}"
            f"{', opened after the hands let go' if rep.get('gap_opened_after_release') else ''}")
        redone = rep.get("redone") or []
        if redone:   # throws that failed and were followed by another (tools/trainee_bot.py instrument_tie)
            what += "; followed by another throw: " + "; ".join(redone)
        stages = " / ".join(f"{r.pooled(k)[0]:.0f}" for k in ("inputs_us", "step_us", "watch_us", "outputs_us"))
        rows.append([str(r.seed), "yes" if r.ok else "**no**", what,
                     f"{step[0]:.0f} / {r.whole('step_us'):.0f} / {step[1]:.0f} / {step[2]:.0f}",
                     f"{tick[0]:.0f} / {r.whole('tick_us'):.0f} / {tick[1]:.0f} / {tick[2]:.0f}",
                     stages,
                     f"{r.overruns} of {r.ticks}", f"{share:.2f}",
                     f"{rep.get('late_ticks', '')} / {rep.get('waited_ticks', '')}"])
    done = sum(r.ok for r in runs)
    phase_rows = render_phases(runs)
    step99 = [r.whole("step_us") for r in runs if r.stats]
    tick99 = [r.whole("tick_us") for r in runs if r.stats]
    second99 = [r.pooled("tick_us")[1] for r in runs if r.stats]
    every = [m for r in runs for m in r.stats]
    out = ["## 9. A suture by hand: the trainee bot (`suturesim bench bot`)", "",
           "`suturesim serve --device remote` of `suture-practice`, its needle moved and turned on the pad by each "
           "run's seed, sutured by the trainee bot (tools/trainee_bot.py: a client of the public protocol alone, "
           "in its own process, two styluses at 1 kHz) with the same seed: it takes the needle, bites through both "
           "edges, hands the needle over at its tip, draws the thread through, ties an instrument tie with the "
           "scene's tools (a needle driver right, forceps left; the thread collides with both): a surgeon's double "
           "throw wound on the driver's jaw and the opposite single throw on it, each throw the one the knot the "
           "server reads calls for (a throw not read as the knot it makes once drawn through, or once its cinch is "
           "held, is followed by the driver letting go and the throw the knot then read calls for, four throws at "
           "most), lets go and watches the knot "
           "10 s. *Done*: four punctures, the knot the server read last a surgeon's knot, the wound closed at "
           "the end (its last gap event `gap_closed`) and not opened after the hands let go, all by the server's "
           "events. Step: the "
           "solver's `Stepper.tick` with its substeps; tick: all of the server's tick (the step, the watch's "
           "events and knot reading, the styluses, the forces and the state published); both µs, from the "
           "server's `stats`: the median of the seconds' p50 / the p99 over every tick of the run (the seconds' "
           "histograms pooled, to 10 µs) / the largest p99 of a second / the largest max. The tick's stages: "
           "the medians of the seconds' p50 (µs) of its inputs (the remote samples applied, those the wait "
           "before the tick did not take received and checked, the grasps and tools moved toward them), the "
           "step, the suture's watch and its outputs (the forces, the state, the messages published), from the "
           "same `stats`. Bot's share: its "
           "CPU time over its wall time, of one of the machine's cores (the server's physics process has the "
           "other to itself only if nothing else runs). Bot's late ticks: samples it sent more than a tick late; "
           "waits: ticks its hands held still because the scene time it read lagged its plan by more than "
           f"{LEAD_S * 1e3:.0f} ms (the server running late).", "",
           "| seed | done | what the server said | step p50 / p99 / a second's p99 / max µs "
           "| tick p50 / p99 / a second's p99 / max µs "
           "| tick's stages p50 µs: inputs / step / watch / outputs "
           "| ticks > 1 ms late | bot's share of a core | bot's late ticks / waits |",
           "|---|---|---|---|---|---|---|---|---|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    redone = sum(bool(r.report.get("redone")) for r in runs)
    out += ["", f"- Done in **{done} of {len(runs)}** runs; a throw failed and another followed in {redone} of them.",
            f"- The p99 over a run's whole suture, the largest of the runs: step {max(step99):.0f} µs, tick "
            f"{max(tick99):.0f} µs (target: tick p99 ≤ {TARGET_P99_US:.0f} µs through the whole suture): "
            f"{'meets' if max(tick99, default=1e9) <= TARGET_P99_US else '**misses**'}; every run's ticks pooled: "
            f"step {spanned(every, 'step_us'):.0f} µs, tick {spanned(every, 'tick_us'):.0f} µs. The largest p99 of "
            f"one second: step {max(r.pooled('step_us')[1] for r in runs if r.stats):.0f} µs, tick "
            f"{max(second99):.0f} µs." if step99 else "- No stats were received.", ""]
    if bench.machine:
        out += render_machine(bench.machine)
    if phase_rows:
        out += ["Where the tick goes, step by step of the suture (every run pooled): the server's seconds split by "
                "the step the bot was working toward when each second ended (the bot marks each step with the "
                "scene time of the newest `state` it saw), µs as above: the median of the seconds' p50 / the "
                "p99 over their ticks / the largest p99 of a second. *watched*: the knot alone, both hands off it.",
                "",
                "| the bot working toward | seconds | step p50 / p99 / a second's p99 µs "
                "| tick p50 / p99 / a second's p99 µs "
                "| tick's stages p50 µs: inputs / step / watch / outputs |",
                "|---|---|---|---|---|"]
        out += ["| " + " | ".join(row) + " |" for row in phase_rows]
        out.append("")
    stage_rows = render_step_stages(runs)
    if stage_rows:
        out += ["Where the step goes, by the same steps of the suture: the solver's stage timers (solver/timers.py) "
                "as the server's `stats` report them (`step_stages_us`: each stage's time in a tick, its mean over "
                "a second's ticks), the mean over the seconds, µs. *Drive*: the pads, tools and needle moved; "
                "*forces*: bending, drag, gravity and self-contact's penalty; *predict*: the prediction and the "
                "grasps' couplings; *solve*: friction on the prediction and the multipliers; *contact*: the rounds "
                "of the no-crossing floor, friction and the constraints solved again; *tools*: the thread kept out "
                "of the jaws and shafts, each round followed by a solve; *tissue*: the needle's pierce, the thread "
                "out of the pads and off the needle, each round followed by a solve, and the punctures' forces; "
                "*commit*: the tensions and the grasps' forces; *neighbours*: the self-contact list kept fresh; "
                "*masses*: the mass scaling. *Rounds*: the contact's and the tissue's rounds a substep ran, and "
                "the share of substeps whose rounds ended before they settled, out of rounds or, for the "
                "contact's, stalled (`contact.stall`) (`stats` `rounds`, the mean over the seconds): a stage whose "
                "rounds run out in every substep costs all its rounds allow.", "",
                "| the bot working toward | " + " | ".join(STAGES) + " | all | contact rounds (run out) "
                "| tissue rounds (run out) |",
                "|---|" + "---|" * (len(STAGES) + 3)]
        out += ["| " + " | ".join(row) + " |" for row in stage_rows]
        out.append("")
    return out


def render_step_stages(runs: list[BotRun]) -> list[list[str]]:
    """One row per step of the bot's plan: the mean over its seconds (every run pooled) of each stage's mean µs
    a tick, and of the rounds a substep and the share ended unsettled (`stats` `rounds`; - if none came); no rows if the
    server reported no stage timers."""
    pooled: dict[str, list[dict]] = {}
    for r in runs:
        for name, seconds in r.phases():
            pooled.setdefault(name, []).extend(m for m in seconds if "step_stages_us" in m)
    rows = []
    for name, seconds in pooled.items():
        if seconds:
            mean = [float(np.mean([m["step_stages_us"].get(k, 0.0) for m in seconds])) for k in STAGES]
            rounds = [m["rounds"] for m in seconds if "rounds" in m]
            cells = []
            for key in ("contact", "tissue"):
                if rounds:
                    n, out = (float(np.mean([r.get(k, 0.0) for r in rounds])) for k in (key, key + "_out"))
                    cells.append(f"{n:.1f} ({100.0 * out:.0f} %)")
                else:
                    cells.append("-")
            rows.append([name] + [f"{v:.0f}" for v in mean] + [f"{sum(mean):.0f}"] + cells)
    return rows


def render_phases(runs: list[BotRun]) -> list[list[str]]:
    """One row per step of the bot's plan, in its order, with every run's seconds toward that step pooled."""
    pooled: dict[str, list[dict]] = {}
    for r in runs:
        for name, seconds in r.phases():
            pooled.setdefault(name, []).extend(seconds)
    rows = []
    for name, seconds in pooled.items():
        if not seconds:
            continue
        step, tick = pool(seconds, "step_us"), pool(seconds, "tick_us")
        stages = " / ".join(f"{pool(seconds, k)[0]:.0f}" for k in ("inputs_us", "step_us", "watch_us", "outputs_us"))
        rows.append([name, str(len(seconds)), f"{step[0]:.0f} / {spanned(seconds, 'step_us'):.0f} / {step[1]:.0f}",
                     f"{tick[0]:.0f} / {spanned(seconds, 'tick_us'):.0f} / {tick[1]:.0f}", stages])
    return rows
