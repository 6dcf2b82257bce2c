"""`suturesim bench loop`: the real-time loop of `suturesim serve`, measured from outside.

Each condition starts ``suturesim serve`` (default configuration and scene) as a subprocess on free loopback
ports and collects the server's own ``stats`` messages (one a second: lateness, period and step-time percentiles
of that second, cumulative overruns and ticks) with a SUB socket subscribed to ``stats`` only. The first
``SKIP_S`` seconds are left out of the pooled figures (start-up: subscribers connecting, the load starting) and
reported apart. Conditions:

a. no other subscriber;
b. one subscriber receiving every topic;
c. eight subscribers receiving every topic;
d. as (b), with every CPU the server is not pinned to kept busy by a pinned busy loop.

Subscribers are separate processes (so their work does not starve this process's collector) that count what
they receive and the ``force`` ticks they missed (gaps in ``seq``) until the run ends.

Start-up: time to the first tick, as the server prints it ("first tick X s after start", measured from the
start of its physics process) and, as a cross-check, wall time from launching the command to the first
``force`` message received -- cold (``NUMBA_CACHE_DIR`` a fresh empty directory: every kernel compiles) and
warm (the default cache, after one priming run).

Every server subprocess is stopped in a ``finally``: SIGTERM, then SIGKILL to its process group after
``STOP_GRACE_S``. Entry points: ``measure_loop(quick, log)`` and ``render_loop(result)`` (used by tools/bench.py).
"""
from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import msgpack
import numpy as np
import zmq

from ..server import protocol
from ..server.recorder import receive_until
from .bench import _g, table

# -- what is measured ------------------------------------------------------------------------------------
LOOPBACK = "127.0.0.1"
SKIP_S = 2                      # leading stats seconds left out of the pooled figures
STOP_GRACE_S = 5.0              # SIGTERM, then SIGKILL after this long
READY_TIMEOUT_S = 60.0          # warm start: the server must print its "serving" line within this
COLD_READY_TIMEOUT_S = 240.0    # cold start compiles every kernel
SUB_RESULT_TIMEOUT_S = 10.0     # a subscriber process must report its counts within this after the run
SUB_READY_TIMEOUT_S = 30.0      # subscriber processes must have connected within this before the server starts
FIRST_TICK_RE = re.compile(r"first tick ([0-9.]+) s after start")

# targets (printed beside the measurements, not asserted)
TARGET_P99_US = 50.0
TARGET_P999_US = 200.0
TARGET_LATE_TICKS = 0           # ticks starting more than 1 ms late
TARGET_WARM_START_S = 3.0


@dataclass(frozen=True)
class LoopBudget:
    run_s: int                  # pooled seconds of stats per condition
    warm_repeats: int           # measured warm start-ups (after one priming run)


FULL_LOOP = LoopBudget(run_s=60, warm_repeats=3)
QUICK_LOOP = LoopBudget(run_s=10, warm_repeats=1)


@dataclass(frozen=True)
class Condition:
    key: str
    label: str
    subscribers: int
    busy: bool = False
    score: bool = True          # the server's live scorer (server/scoring.py) runs


BASELINE = Condition("0", "baseline: bare wait loop, no server", 0)
CONDITIONS = (
    Condition("a", "no extra subscriber", 0),
    Condition("b", "1 subscriber (all topics)", 1),
    Condition("c", "8 subscribers (all topics)", 8),
    Condition("d", "1 subscriber, other CPU(s) busy", 1, busy=True),
    Condition("e", "no extra subscriber, no live scorer (`--score off`)", 0, score=False),
)


# -- helper processes (spawned: module-level functions) ---------------------------------------------------
def _subscriber_main(endpoint: str, index: int, stop, ready, results) -> None:
    """Count every message from ``endpoint`` until ``stop`` is set; report counts per topic and the force
    ticks missed (gaps in seq; a seq going backwards, as after a reset, starts a new run)."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    ready.release()
    counts: dict[str, int] = {}
    first_seq = last_seq = None
    missed = 0
    t_first = t_last = None
    try:
        for topic, payload in receive_until(sub, stop):
            name = topic.decode("ascii", "replace")
            counts[name] = counts.get(name, 0) + 1
            now = time.monotonic()
            t_first = now if t_first is None else t_first
            t_last = now
            if topic == protocol.TOPIC_FORCE:
                seq = msgpack.unpackb(payload, raw=False)["seq"]
                if first_seq is None:
                    first_seq = seq
                elif seq > last_seq + 1:
                    missed += seq - last_seq - 1
                last_seq = seq
    finally:
        sub.close(0)
        ctx.term()
        results.put((index, counts, first_seq, last_seq, missed,
                     (t_last - t_first) if t_first is not None else 0.0))


def _busy_main(cpu: int, stop) -> None:
    """Spin on ``cpu`` until ``stop`` is set."""
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, {cpu})
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _baseline_main(seconds: int, tick_ns: int, spin_ns: int, priority: int, cpu: int, results) -> None:
    """The server's wait -- absolute deadlines, sleep to ``spin_ns`` before each, spin the rest -- with nothing
    else in the loop, same scheduling and CPU. One summary a second, shaped like the server's `stats`."""
    import gc

    from ..server.physics import CATCH_UP_TICKS, set_realtime, wait_until

    realtime, pinned, _ = set_realtime(priority, cpu) if priority > 0 else (False, -1, [])
    gc.disable()
    per_s = max(1, round(1e9 / tick_ns))
    late = np.zeros(per_s)
    out, overruns, ticks = [], 0, 0
    t0 = time.monotonic_ns() + tick_ns
    k = 0
    for _ in range(seconds):
        for i in range(per_s):
            deadline = t0 + k * tick_ns
            wait_until(deadline, spin_ns)
            lateness = time.monotonic_ns() - deadline
            if lateness > tick_ns:
                overruns += 1
                if lateness > CATCH_UP_TICKS * tick_ns:  # as the server: re-anchor when too far behind
                    t0 = time.monotonic_ns() - k * tick_ns
            late[i] = lateness / 1000.0
            k += 1
        ticks += per_s
        q = np.percentile
        out.append({"lateness_us": {"p50": float(q(late, 50)), "p99": float(q(late, 99)),
                                    "p999": float(q(late, 99.9)), "max": float(late.max())},
                    "overruns": overruns, "ticks": ticks, "realtime": realtime, "cpu": pinned})
    results.put(out)


# -- the server subprocess -------------------------------------------------------------------------------
def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux's ip_local_port_range; IANA's 49152
    elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on the loopback interface, bound together to check them, then released.

    They are drawn at random from below the kernel's ephemeral range: a port from inside it (what binding port 0
    gives) can be taken, between its release here and the server's bind, as the local end of any outgoing
    connection on the machine, such as another test's client."""
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    rng = random.Random(os.getpid() ^ time.perf_counter_ns())
    # a kernel whose ephemeral range starts near 1024 leaves no room below it: any free port then
    candidates = rng.sample(range(low, high), high - low) if high - low >= 1000 else [0] * count
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            if len(socks) == count:
                return [s.getsockname()[1] for s in socks]
        raise OSError(f"fewer than {count} free loopback ports below {high}")
    finally:
        for s in socks:
            s.close()


class Server:
    """``suturesim serve`` on free loopback ports, as a subprocess in its own process group; its output is
    read by a thread that notes when the "serving ... first tick X s" line arrives."""

    def __init__(self, env: dict | None = None, score: bool = True):
        pub, control, stylus, score_ep = (f"tcp://{LOOPBACK}:{p}" for p in free_ports(4))
        self.pub = pub
        self.cmd = [sys.executable, "-m", "suturesim.server.cli", "serve",
                    "--pub", pub, "--control", control, "--stylus", stylus, "--score", score_ep if score else "off"]
        self.env = env
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.first_tick_s: float | None = None     # as the server prints it
        self.ready_wall_s: float | None = None     # launch -> its "serving" line
        self.proc: subprocess.Popen | None = None
        self.t_launch = 0.0
        self.exit_code: int | None = None
        self.killed = False
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.t_launch = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=self.env, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            m = FIRST_TICK_RE.search(line)
            if m and not self.ready.is_set():
                self.ready_wall_s = time.monotonic() - self.t_launch
                self.first_tick_s = float(m.group(1))
                self.ready.set()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM; SIGKILL to its process group (the supervisor and its children) after STOP_GRACE_S."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.killed = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_GRACE_S)
        self.exit_code = self.proc.returncode
        if self._reader is not None:
            self._reader.join(2.0)

    def tail(self, n: int = 5) -> str:
        return " | ".join(self.lines[-n:])


# -- measurements ----------------------------------------------------------------------------------------
@dataclass
class StartupRun:
    label: str
    cache: str                       # "fresh empty NUMBA_CACHE_DIR" or "default"
    first_tick_s: float | None       # the server's own figure
    ready_wall_s: float | None       # launch -> "serving" line
    first_force_wall_s: float | None  # launch -> first `force` message received
    error: str | None = None


def measure_startup(label: str, cold: bool, log: Callable[[str], None]) -> StartupRun:
    """Start the server, wait for its first `force` message, stop it."""
    env = dict(os.environ)
    tmp = tempfile.TemporaryDirectory(prefix="suturesim-numba-cold-") if cold else None
    if tmp is not None:
        env["NUMBA_CACHE_DIR"] = tmp.name
    timeout = COLD_READY_TIMEOUT_S if cold else READY_TIMEOUT_S
    server = Server(env)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_FORCE)
    first_force = None
    error = None
    try:
        sub.connect(server.pub)
        server.start()
        deadline = server.t_launch + timeout
        while first_force is None:
            if time.monotonic() > deadline:
                error = f"no force message within {timeout:g} s"
                break
            if not server.alive():
                error = f"the server exited (code {server.proc.returncode}): {server.tail()}"
                break
            if sub.poll(50):
                sub.recv_multipart()
                first_force = time.monotonic() - server.t_launch
        server.ready.wait(2.0)  # the line and the first message arrive close together
    finally:
        sub.close(0)
        ctx.term()
        server.stop()
        if tmp is not None:
            tmp.cleanup()
    run = StartupRun(label, "fresh empty NUMBA_CACHE_DIR" if cold else "default", server.first_tick_s,
                     server.ready_wall_s, first_force, error)
    log(f"  start-up {label:<8} first tick {_fmt_s(run.first_tick_s)} s (server), serving line "
        f"{_fmt_s(run.ready_wall_s)} s, first force {_fmt_s(run.first_force_wall_s)} s after launch"
        + (f"  ERROR: {error}" if error else ""))
    return run


@dataclass
class SubscriberCount:
    counts: dict[str, int]
    first_seq: int | None
    last_seq: int | None
    missed_force_ticks: int
    span_s: float

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class ConditionResult:
    cond: Condition
    seconds: list[dict] = field(default_factory=list)   # pooled stats messages
    skipped: list[dict] = field(default_factory=list)   # the first SKIP_S stats messages
    first_tick_s: float | None = None
    busy_cpus: list[int] = field(default_factory=list)
    subscribers: list[SubscriberCount | None] = field(default_factory=list)
    server_exit: int | None = None
    server_killed: bool = False
    note: str | None = None
    error: str | None = None

    # pooled over the seconds: max over seconds of p99 / p99.9 / max, median of p50
    def _pct(self, key: str, p: str) -> list[float]:
        return [s[key][p] for s in self.seconds if key in s and p in s[key]]

    def worst(self, key: str, p: str) -> float:
        v = self._pct(key, p)
        return max(v) if v else math.nan

    def median(self, key: str, p: str) -> float:
        v = self._pct(key, p)
        return float(np.median(v)) if v else math.nan

    def _delta(self, key: str) -> int | None:
        if not self.seconds:
            return None
        base = self.skipped[-1][key] if self.skipped else 0
        return int(self.seconds[-1][key] - base)

    @property
    def ticks(self) -> int | None:
        return self._delta("ticks")

    @property
    def overruns(self) -> int | None:
        return self._delta("overruns")

    @property
    def startup_overruns(self) -> int | None:
        return int(self.skipped[-1]["overruns"]) if self.skipped else None

    @property
    def seconds_over(self) -> tuple[int, int]:
        """(seconds with a tick later than 1 ms, seconds)."""
        n = sum(1 for s in self.seconds if s.get("lateness_us", {}).get("max", 0.0) > 1000.0)
        return n, len(self.seconds)

    @property
    def max_substeps(self) -> int | str:
        v = [s["substeps"]["max"] for s in self.seconds if "substeps" in s]
        return max(v) if v else "n/a"

    @property
    def realtime(self) -> bool | None:
        s = (self.skipped + self.seconds)
        return s[-1].get("realtime") if s else None

    @property
    def cpu(self) -> int | None:
        s = (self.skipped + self.seconds)
        return s[-1].get("cpu") if s else None


def measure_condition(cond: Condition, budget: LoopBudget, log: Callable[[str], None]) -> ConditionResult:
    res = ConditionResult(cond)
    server = Server(score=cond.score)
    spawn = mp.get_context("spawn")
    sub_stop = spawn.Event()
    busy_stop = spawn.Event()
    results = spawn.Queue()
    sub_ready = spawn.Semaphore(0)
    subs, busy = [], []
    ctx = zmq.Context()
    coll = ctx.socket(zmq.SUB)
    coll.setsockopt(zmq.LINGER, 0)
    coll.setsockopt(zmq.SUBSCRIBE, protocol.TOPIC_STATS)
    want = SKIP_S + budget.run_s
    try:
        coll.connect(server.pub)
        # subscribers first: they connect (and reconnect) until the server binds, so they miss nothing
        for i in range(cond.subscribers):
            p = spawn.Process(target=_subscriber_main, args=(server.pub, i, sub_stop, sub_ready, results),
                              name=f"bench-sub-{i}", daemon=True)
            p.start()
            subs.append(p)
        for _ in subs:
            if not sub_ready.acquire(timeout=SUB_READY_TIMEOUT_S):
                res.note = "a subscriber was not connected when the server started"
                break
        server.start()
        deadline = server.t_launch + READY_TIMEOUT_S + want + 10.0
        stats: list[dict] = []
        while len(stats) < want:
            if time.monotonic() > deadline:
                res.error = f"{len(stats)} of {want} stats messages before the deadline"
                break
            if not server.alive():
                res.error = f"the server exited (code {server.proc.returncode}): {server.tail()}"
                break
            if not coll.poll(100):
                continue
            topic, payload = coll.recv_multipart()
            if topic != protocol.TOPIC_STATS:
                continue
            stats.append(protocol.decode_stats(payload))
            if cond.busy and len(stats) == 1:
                busy_cpus, res.note = _cpus_to_load(stats[0].get("cpu", -1))
                for cpu in busy_cpus:
                    p = spawn.Process(target=_busy_main, args=(cpu, busy_stop), name=f"bench-busy-{cpu}",
                                      daemon=True)
                    p.start()
                    busy.append(p)
                res.busy_cpus = busy_cpus
        res.skipped, res.seconds = stats[:SKIP_S], stats[SKIP_S:]
        res.first_tick_s = server.first_tick_s
    finally:
        busy_stop.set()
        sub_stop.set()
        coll.close(0)
        ctx.term()
        server.stop()
        res.server_exit, res.server_killed = server.exit_code, server.killed
        got: dict[int, SubscriberCount] = {}
        t_end = time.monotonic() + SUB_RESULT_TIMEOUT_S
        while len(got) < len(subs) and time.monotonic() < t_end:
            with contextlib.suppress(Exception):
                i, counts, first, last, missed, span = results.get(timeout=0.5)
                got[i] = SubscriberCount(counts, first, last, missed, span)
        for p in subs + busy:
            p.join(STOP_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        res.subscribers = [got.get(i) for i in range(len(subs))]
        results.close()
    log(_condition_line(res))
    return res


def _cpus_to_load(server_cpu: int) -> tuple[list[int], str | None]:
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    if server_cpu is not None and server_cpu >= 0:
        others = [c for c in allowed if c != server_cpu]
        if not others:
            return [], f"no CPU other than the server's CPU {server_cpu}: nothing loaded"
        return others, None
    return allowed[:1], f"the server is not pinned; loaded CPU {allowed[0]} only"


def _condition_line(r: ConditionResult) -> str:
    if not r.seconds:
        return f"  ({r.cond.key}) {r.cond.label}: no data ({r.error})"
    subs = ""
    if r.subscribers:
        subs = "  subscribers: " + ", ".join(
            "lost" if s is None else f"{s.total} msgs/{s.missed_force_ticks} missed" for s in r.subscribers)
    return (f"  ({r.cond.key}) {r.cond.label:<32} {len(r.seconds)} s: lateness p50 {_g(r.median('lateness_us', 'p50'))}"
            f"  p99 {_g(r.worst('lateness_us', 'p99'))}  p99.9 {_g(r.worst('lateness_us', 'p999'))}"
            f"  max {_g(r.worst('lateness_us', 'max'))} µs  >1 ms {r.overruns}/{r.ticks}"
            f" (start-up {r.startup_overruns})" + subs + (f"  ERROR: {r.error}" if r.error else ""))


def measure_baseline(budget: LoopBudget, log: Callable[[str], None]) -> ConditionResult:
    """The server's wait loop alone, in a spawned process with the server config's tick, spin, priority and
    CPU: the lateness the machine gives any such loop (what the server cannot do better than)."""
    from ..server.config import load_server_config

    loop = load_server_config().loop
    res = ConditionResult(BASELINE)
    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    seconds = SKIP_S + budget.run_s
    p = spawn.Process(target=_baseline_main, name="bench-baseline", daemon=True,
                      args=(seconds, int(round(loop.tick_s * 1e9)), int(loop.spin_us * 1000),
                            loop.priority if loop.realtime else 0, loop.cpu, results))
    try:
        p.start()
        stats = results.get(timeout=seconds * 3 + 30)
        res.skipped, res.seconds = stats[:SKIP_S], stats[SKIP_S:]
    except Exception as exc:  # noqa: BLE001 - reported in the table
        res.error = f"baseline loop failed ({exc.__class__.__name__}: {exc})"
    finally:
        p.join(STOP_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join(1.0)
        results.close()
    log(_condition_line(res))
    return res


@dataclass
class LoopResult:
    budget: LoopBudget
    startup: list[StartupRun]
    conditions: list[ConditionResult]


def measure_loop(quick: bool, log: Callable[[str], None]) -> LoopResult:
    budget = QUICK_LOOP if quick else FULL_LOOP
    startup = [measure_startup("cold", True, log), measure_startup("priming", False, log)]
    startup += [measure_startup(f"warm {i + 1}" if budget.warm_repeats > 1 else "warm", False, log)
                for i in range(budget.warm_repeats)]
    conditions = [measure_baseline(budget, log)] + [measure_condition(c, budget, log) for c in CONDITIONS]
    return LoopResult(budget, startup, conditions)


# -- rendering -------------------------------------------------------------------------------------------
def _fmt_s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _us(x: float) -> str:
    return _g(x) if math.isfinite(x) else "n/a"


def _meets(ok: bool) -> str:
    return "meets" if ok else "**misses**"


def render_loop(res: LoopResult) -> list[str]:
    b = res.budget
    ref = next((c for c in res.conditions if c.seconds and c.cond is not BASELINE), None)
    rt = "n/a" if ref is None else ("granted" if ref.realtime else "**not granted**")
    cpu = "n/a" if ref is None else (str(ref.cpu) if ref.cpu is not None and ref.cpu >= 0 else "not pinned")
    out = ["## 4. The real-time loop of `suturesim serve`", "",
           f"`suturesim serve` with its default configuration and scene, run as a subprocess on free loopback ports. "
           f"Figures are the server's own `stats` (one message a second, each with percentiles over that second), "
           f"collected by a SUB socket subscribed to `stats` only; {b.run_s} s per condition after {SKIP_S} s of "
           f"start-up, which are left out and reported apart. SCHED_FIFO: {rt}; physics loop pinned to CPU {cpu}.",
           "", "Lateness = how late a tick started against its absolute deadline; pooled as the **median** over "
           "seconds of each second's p50 and the **largest** over seconds of each second's p99, p99.9 and max. "
           "Ticks > 1 ms = the server's `overruns` counter over the pooled seconds. Row (0) is not the server: "
           "it is the server's wait alone (absolute deadlines, sleep until `spin_us` before each, then spin) in a "
           "bare Python process with the same scheduling, priority and CPU and nothing else in the loop -- the "
           "lateness this machine gives any such loop, which the server cannot beat.", ""]
    rows = []
    for r in res.conditions:
        if not r.seconds:
            rows.append([f"({r.cond.key}) {r.cond.label}", "0", *["n/a"] * 9, r.error or ""])
            continue
        n_over, n_s = r.seconds_over
        frac = r.overruns / r.ticks if r.ticks else math.nan
        note = []
        if r.cond is BASELINE:
            note.append(f"SCHED_FIFO {'granted' if r.realtime else 'not granted'}, CPU {r.cpu}")
        if r.busy_cpus:
            note.append(f"busy loop on CPU {', '.join(map(str, r.busy_cpus))}")
        if r.note:
            note.append(r.note)
        if r.error:
            note.append(f"**{r.error}**")
        if r.server_killed:
            note.append("**server had to be killed**")
        elif r.server_exit not in (0, None):
            note.append(f"**server exited with code {r.server_exit} on SIGTERM**")
        rows.append([f"({r.cond.key}) {r.cond.label}", str(len(r.seconds)),
                     _us(r.median("lateness_us", "p50")), _us(r.worst("lateness_us", "p99")),
                     _us(r.worst("lateness_us", "p999")), _us(r.worst("lateness_us", "max")),
                     f"{r.overruns} of {r.ticks} ({100 * frac:.3g} %)", f"{n_over} of {n_s}",
                     "n/a" if r.cond is BASELINE else
                     f"{_us(r.median('step_us', 'p50'))} / {_us(r.worst('step_us', 'p99'))} / "
                     f"{_us(r.worst('step_us', 'max'))} ({r.max_substeps})",
                     _us(r.worst("period_us", "max")), str(r.startup_overruns), "; ".join(note)])
    rows.append(["**target**", "", "", f"≤ {TARGET_P99_US:g}", f"≤ {TARGET_P999_US:g}", "", str(TARGET_LATE_TICKS),
                 "", "", "", "", ""])
    out += table(["condition", "s", "lateness p50 µs", "p99 µs", "p99.9 µs", "max µs", "ticks > 1 ms",
                  "seconds with a tick > 1 ms",
                  "step p50 / p99 / max µs (most substeps)", "period max µs",
                  f"ticks > 1 ms in the first {SKIP_S} s", "note"], rows)
    out.append("")
    for r in res.conditions:
        if r.seconds:
            p99, p999 = r.worst("lateness_us", "p99"), r.worst("lateness_us", "p999")
            out.append(f"- ({r.cond.key}): p99 {_meets(p99 <= TARGET_P99_US)} ≤ {TARGET_P99_US:g} µs, p99.9 "
                       f"{_meets(p999 <= TARGET_P999_US)} ≤ {TARGET_P999_US:g} µs, no tick later than 1 ms: "
                       f"{_meets(r.overruns == TARGET_LATE_TICKS)}.")
    out.append("")

    sub_rows = []
    for r in res.conditions:
        if not r.subscribers:
            continue
        msgs = ", ".join("lost" if s is None else str(s.total) for s in r.subscribers)
        missed = ", ".join("n/a" if s is None else str(s.missed_force_ticks) for s in r.subscribers)
        spans = [s.last_seq - s.first_seq + 1 for s in r.subscribers if s is not None and s.first_seq is not None]
        rates = [s.total / s.span_s for s in r.subscribers if s is not None and s.span_s > 0]
        sub_rows.append([f"({r.cond.key})", str(len(r.subscribers)), msgs,
                         f"{min(spans)}-{max(spans)}" if spans else "n/a", missed,
                         f"{_g(min(rates))}-{_g(max(rates))}" if rates else "n/a"])
    if sub_rows:
        out += ["Subscribers (separate processes, subscribed to everything, counting from connection to the end of "
                "the run, start-up included): messages each received, the span of `force` ticks seen (last − first "
                "seq + 1), the `force` ticks each missed (gaps in `seq`: dropped at a high-water mark) and messages "
                "per second.", "",
                *table(["condition", "subscribers", "messages each", "force ticks spanned", "force ticks missed",
                        "messages/s"], sub_rows), ""]

    st_rows = []
    for s in res.startup:
        target = f"≤ {TARGET_WARM_START_S:g} s" if s.label.startswith("warm") else ""
        verdict = "" if not target or s.first_tick_s is None else _meets(s.first_tick_s <= TARGET_WARM_START_S)
        st_rows.append([s.label, s.cache, _fmt_s(s.first_tick_s), _fmt_s(s.ready_wall_s),
                        _fmt_s(s.first_force_wall_s), target, verdict if not s.error else f"**{s.error}**"])
    for r in res.conditions:  # every condition also starts warm
        if r.first_tick_s is not None:
            verdict = _meets(r.first_tick_s <= TARGET_WARM_START_S)
            st_rows.append([f"warm ({r.cond.key})", "default", _fmt_s(r.first_tick_s), "", "",
                            f"≤ {TARGET_WARM_START_S:g} s", verdict])
    out += ["Start-up: time to the first tick as the server prints it (\"first tick X s after start\", from the "
            "start of its physics process: scene, kernels and warm-up tick), the wall time from launching "
            "`suturesim serve` to that line and to the first `force` message received (the cross-check, "
            "interpreter start and imports included). *cold*: `NUMBA_CACHE_DIR` a fresh empty directory, so every "
            "kernel compiles; *priming* fills the default cache, then *warm* is measured; the conditions above "
            "started warm too.", "",
            *table(["run", "numba cache", "first tick s (server)", "launch → serving line s",
                    "launch → first force s", "target", "verdict"], st_rows), ""]
    out += ["Notes: each second's p99.9 comes from its ~1000 ticks, so it is close to that second's max. A tick "
            "more than 1 ms late is an *overrun* (it still runs; the schedule keeps its absolute deadlines and "
            "catches up unless more than 50 ticks behind), so one stall of X ms counts about X late ticks, which "
            "then run back to back. A step longer than 1 ms (the *max* step column; the solver's substeps grow "
            "when the default scene pulls the thread taut) makes the next tick late by itself. Subscriber figures count every topic (`force` every "
            "tick, `state` at 100 Hz, `stats`, `event`); a missed `force` tick means ZeroMQ dropped messages for "
            "that subscriber, which by design never slows the loop. Condition (d) starts its busy loop(s) after the "
            "first `stats` message says which CPU the server is on.", ""]
    return out


# A line in a section of docs/BENCHMARKS.md after which its text is written by hand (earlier runs, other
# machines, what the figures mean): `bench ... --out` replaces the section's figures above it and keeps the rest.
KEEP_BELOW = "<!-- written by hand below: `suturesim bench --out` keeps it -->"


def splice_section(existing: str, section: list[str], command: str, date: str) -> str:
    """``existing`` (a document written by `suturesim bench`) with the numbered section that ``section``
    starts with ("## 4. ...") replaced by ``section`` -- or, if it has none, ``section`` inserted before
    "## Notes on method" (or at the end) -- and a line saying which command produced it. The other sections
    stay as they were, and so does whatever the old section holds from a KEEP_BELOW line on (keep_notes)."""
    lines = existing.rstrip("\n").split("\n")
    number = section[0].split()[1]            # "4."
    section = [section[0], "", f"*This section: `{command}`, {date}.*", *section[1:]]
    start = next((i for i, line in enumerate(lines) if line.startswith(f"## {number}")), None)
    if start is not None:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    else:
        start = end = next((i for i, line in enumerate(lines) if line.startswith("## Notes on method")), len(lines))
        if start == len(lines) and lines and lines[-1] != "":
            section = ["", *section]
    return keep_notes(existing, "\n".join(lines[:start] + section + lines[end:]))


def _section_number(line: str) -> str | None:
    """"4." for a numbered section's heading ("## 4. ..."), None for any other line."""
    words = line.split()
    if line.startswith("## ") and len(words) > 1 and words[1][:-1].isdigit():
        return words[1]
    return None


def _section_notes(lines: list[str]) -> dict[str, list[str]]:
    """Each numbered section's ("4.") lines from its KEEP_BELOW line to its end, for those that have one."""
    notes: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        number = _section_number(line)
        if number is not None:
            end = next((k for k in range(i + 1, len(lines)) if lines[k].startswith("## ")), len(lines))
            keep = next((k for k in range(i, end) if lines[k].strip() == KEEP_BELOW), None)
            if keep is not None:
                notes[number] = lines[keep:end]
    return notes


def keep_notes(existing: str, new: str) -> str:
    """``new`` (a document `bench --out` wrote anew, whole or one section) with the notes of ``existing``: each
    numbered section's lines from its KEEP_BELOW line to its end, appended to the section of the same number in
    ``new`` unless that one has notes of its own."""
    notes = _section_notes(existing.rstrip("\n").split("\n"))
    lines = new.rstrip("\n").split("\n")
    for number in _section_notes(lines):
        notes.pop(number, None)
    out: list[str] = []
    number = None
    for line in [*lines, "## end"]:
        if line.startswith("## "):
            if number in notes:
                while out and out[-1] == "":
                    out.pop()
                out += ["", *notes[number]]
                if out[-1] != "":
                    out.append("")
            number = _section_number(line)
        out.append(line)
    return "\n".join(out[:-1])
