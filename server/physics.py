"""The physics process: a fixed-rate loop on absolute deadlines that steps the thread, publishes it and answers
control requests (docs/ARCHITECTURE.md Sec. 3).

Each tick, top to bottom: wait for the deadline (sleep to `spin_us` before it, spin the rest), read the newest
stylus poses (shared-memory link and remote PULL socket), advance the solver by one tick, write each device's
force to the link, publish `force` (every tick), `state` (at its rate) and `stats` (each second), answer at most
one control request, and account lateness and step time. Everything the loop touches is allocated before the
first tick, and the garbage collector is frozen and disabled once start-up is done.
"""
from __future__ import annotations

import gc
import math
import os
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np
import zmq

from ..haptics.link import DeviceLink
from ..solver.breakage import rating
from ..solver.contact_response import CS_ROUNDS, CS_ROUNDS_OUT
from ..solver.integrator import STAT_TIMERS, STAT_TISSUE_OUT, STAT_TISSUE_ROUNDS, SolverDivergence, Stepper, warm_up
from ..solver.instruments import CAPSULES_PER_TOOL, MAX_TOOLS, place_capsules
from ..solver.motion import MOTION_GRASP, MOTION_SPIN
from ..solver.needle import NS_Q, NS_QT, NS_WT
from ..solver.timers import N_TIMERS, STAGES, seconds_per_cycle
from ..solver.tissue import PS_X
from ..solver.model import MAX_GRASPS
from ..solver.scenario import (MAX_GRASP_DAMPING, MAX_GRASP_FORCE, MAX_GRASP_STIFFNESS, GraspSpec, Scenario,
                               build_scenario, load_scenario)
from . import protocol
from .config import ServerConfig
from .console import say
from .device import Device, DeviceTable, quat_mul_into, unit_quat_or_none
from .jaws import (KIND_NEEDLE, KIND_THREAD, KIND_TISSUE, SHAPES, Hold, held_segments, needle_hold,
                   needle_in_reach, pad_in_reach, thread_in_reach, tissue_hold)
from .messages import MessageBuilder
from .rollback import ROLLBACK_TICKS, Rollback
from .scene import SceneRunner, state_period
from .security import SocketSecurity
from .snapshot import Snapshot, SnapshotScene

STYLUS_MAX_POS_M = protocol.STYLUS_MAX_POS_M   # m: a remote or linked pose farther from the origin is rejected
STYLUS_DRAIN_PER_TICK = 32     # remote stylus messages read per tick at most
STYLUS_INTAKE_GUARD_NS = 60_000   # the wait takes no sample this close to a deadline: the tick takes it
CATCH_UP_TICKS = 50            # further behind than this, the schedule is re-anchored (and an event says so)
# Phase lock to a device's servo clock: start each tick this long after the device's newest pose, so the force
# is ready for the servo's next callback (pose-to-force = one servo period) instead of, at an unlucky phase,
# the one after it. The loop takes the phase at once when a device links, then follows its drift by at most
# PHASE_STEP_NS per tick (0.5 % of a 1 ms tick).
# A pose's time is its callback's start, and the pose is on the link only once the callback has read the device
# and mapped it (tens of µs, over 100 µs when the driver's CPU is busy): a tick that starts before that reads the
# pose of the period before, and its force is two periods after the pose it answers. The force must in turn be
# on the link before the next callback reads it, so the tick (step, forces, link) has the period less this
# target: 0.2 ms leaves the pose's callback 0.2 ms and the tick 0.8 ms (a tick's p99 is 0.2 to 0.4 ms in the
# shipped scenes, docs/BENCHMARKS.md).
PHASE_TARGET_NS = 200_000
PHASE_STEP_NS = 5_000
# A SCHED_FIFO task that runs more than sched_rt_runtime_us of every sched_rt_period_us is stopped for the rest
# of the period (950 of 1000 ms by default): a loop whose ticks take 0.6 ms and which spins 0.3 ms before each
# keeps its CPU 90 % busy, passes the limit in any second its ticks run long, and stops for 50 ms; its catch-up
# then runs tick after tick with no wait and brings the next stop nearer (the trainee bot's suture: 4 to 17 %
# of its ticks over 1 ms late, docs/BENCHMARKS.md Sec. 9). So the spin before a deadline is cut to what keeps the
# loop's busy time (tick and spin) DUTY_MARGIN under the limit, from an average of its recent ticks.
DUTY_MARGIN = 0.05
BUSY_AVERAGE_SHIFT = 6         # the ticks' busy time is averaged over about 2^6 ticks
SNAPSHOT_TICKS = 500           # the scene's state is copied to its snapshot this often (twice a second at 1 kHz)
SUPERVISOR_POLL_TICKS = 16     # what the supervisor says unasked (a failed recording) is read this often
FAULTS_TO_PAUSE = 3            # divergences within FAULT_WINDOW_TICKS that pause the scene instead of resetting it
FAULT_WINDOW_TICKS = 2000
# whether a socket has a message waiting, asked with plain ints: the option as zmq.EVENTS makes pyzmq return a
# zmq.PollEvent flag, and the flag's & is a call into enum (about 0.5 us a test, three or four tests a tick), and
# Socket.poll builds a Poller at each call
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


# the `stats` message's `rounds` (docs/PROTOCOL.md Sec. 3.3), each over the substeps of the interval: the
# self-contact's rounds of floor, friction and solve a substep ran (solver/integrator.py contact_rounds), the share
# of substeps whose rounds ended before the floor and friction settled (ran out, or stalled: contact.stall), and
# the same for the tissue's rounds (tissue_rounds). Rounds that always run out put a step's cost at its ceiling.
ROUNDS = ("contact", "contact_out", "tissue", "tissue_out")
# the `stats` message's histograms of the step and the tick (docs/PROTOCOL.md Sec. 3.3): the interval's ticks
# counted in HIST_BINS bins HIST_BIN_US wide from 0, the last also counting every longer one. A client pools them
# over any span (a whole suture) and reads its percentiles to the bin's width, which the seconds' own percentiles
# cannot give
HIST_BIN_US = 10.0
HIST_BINS = 200
_HIST_EDGES = np.arange(1, HIST_BINS) * HIST_BIN_US


@dataclass(slots=True)
class InboxSample:
    """One remote stylus sample received and checked while the loop waited (PhysicsLoop.intake_stylus), for the
    next tick to apply: its device, position (m) and orientation (w x y z) in the scene, buttons. Preallocated,
    written in place."""
    pos: np.ndarray = field(default_factory=lambda: np.zeros(3))
    quat: np.ndarray = field(default_factory=lambda: np.zeros(4))
    has_quat: bool = False
    buttons: int = 0
    dev: Device | None = None


@dataclass
class LoopStats:
    """Per-tick timings of the last second (µs), in preallocated ring buffers, and counters."""
    capacity: int

    def __post_init__(self):
        self.lateness = np.zeros(self.capacity)
        self.period = np.zeros(self.capacity)
        self.step = np.zeros(self.capacity)
        self.tick = np.zeros(self.capacity)
        self.inputs = np.zeros(self.capacity)
        self.watch = np.zeros(self.capacity)
        self.outputs = np.zeros(self.capacity)
        self.substeps = np.zeros(self.capacity)
        self.stages = np.zeros((self.capacity, N_TIMERS))   # the step's stage timers (solver/timers.py), cycles
        self.rounds = np.zeros((self.capacity, len(ROUNDS)))  # the step's rounds, as ROUNDS reads them
        self._us_per_cycle = seconds_per_cycle() * 1e6      # measured here, before any tick: 0 if no counter
        self.count = 0
        self.overruns = 0
        self.ticks = 0
        self.stylus_rejected = 0
        self.stylus_accepted = 0
        self.control_errors = 0

    def add(self, lateness_us: float, period_us: float, step_us: float, substeps: int, tick_us: float,
            inputs_us: float = 0.0, watch_us: float = 0.0, outputs_us: float = 0.0,
            stages: np.ndarray | None = None, stats: np.ndarray | None = None,
            contact_stats: np.ndarray | None = None) -> None:
        """One tick: how late it started and since the last one (µs), its solver step (µs) and substeps, all of
        it (µs), and its stages besides the step (µs): the inputs (the devices' poses read, the remote samples
        taken, the grasps and tools moved toward them), the suture's watch, the outputs (the forces, the state,
        what was published); ``stages``, the step's own stage timers (state.stats from STAT_TIMERS, cycles), and
        ``stats`` and ``contact_stats`` (the state's), its rounds, if it stepped."""
        i = self.count % self.capacity
        if stages is not None and substeps > 0:
            self.stages[i] = stages
        else:
            self.stages[i] = 0.0
        rounds = self.rounds   # written element by element: a row view would be an object made every tick
        if stats is not None and contact_stats is not None and substeps > 0:
            rounds[i, 0] = contact_stats[CS_ROUNDS]
            rounds[i, 1] = contact_stats[CS_ROUNDS_OUT]
            rounds[i, 2] = stats[STAT_TISSUE_ROUNDS]
            rounds[i, 3] = stats[STAT_TISSUE_OUT]
        else:
            rounds[i] = 0.0
        self.lateness[i] = lateness_us
        self.period[i] = period_us
        self.step[i] = step_us
        self.tick[i] = tick_us
        self.inputs[i] = inputs_us
        self.watch[i] = watch_us
        self.outputs[i] = outputs_us
        self.substeps[i] = substeps
        self.count += 1
        self.ticks += 1

    def summary_counters(self) -> dict:
        """The counters only (no percentiles, no reset): for `status` replies."""
        return {"ticks": self.ticks, "overruns": self.overruns, "stylus_accepted": self.stylus_accepted,
                "stylus_rejected": self.stylus_rejected, "control_errors": self.control_errors}

    def summary(self) -> dict:
        """Percentiles over the ticks since the last summary (once a second: this allocates, off the tick path)."""
        n = min(self.count, self.capacity)
        out = self.summary_counters()
        if n == 0:
            return out
        sub = self.substeps[:n]
        # the series sorted at once and read as np.percentile reads them (_percentiles): ten np.percentile
        # calls took 370-470 us, on the tick that publishes the stats (2-core VM of docs/BENCHMARKS.md, 2026-11-28)
        series = np.sort(np.stack((self.lateness[:n], self.period[:n], self.step[:n], self.tick[:n],
                                   self.inputs[:n], self.watch[:n], self.outputs[:n])), axis=1)
        pct = _percentiles(series, (50.0, 99.0, 99.9))
        top = series[:, -1].tolist()
        for k, key in enumerate(("lateness_us", "period_us", "step_us", "tick_us", "inputs_us", "watch_us",
                                 "outputs_us")):
            out[key] = {"p50": pct[k][0], "p99": pct[k][1], **({"p999": pct[k][2]} if k < 2 else {}),
                        "max": top[k]}
        for k, key in ((2, "step_us"), (3, "tick_us")):
            # the sorted series counted below each edge: the bins' counts are the differences
            below = np.searchsorted(series[k], _HIST_EDGES, side="left")
            out[key]["hist"] = np.diff(below, prepend=0, append=n).tolist()
        out["substeps"] = {"mean": float(sub.mean()), "max": int(sub.max())}
        stepped = float(sub.sum())
        if stepped > 0.0:
            # a substep's rounds, and the share of substeps whose rounds ended before they settled
            per = (self.rounds[:n].sum(axis=0) / stepped).tolist()
            out["rounds"] = {key: per[k] for k, key in enumerate(ROUNDS)}
        if self._us_per_cycle > 0.0:
            mean = (self.stages[:n].mean(axis=0) * self._us_per_cycle).tolist()
            out["step_stages_us"] = {name: mean[k] for k, name in enumerate(STAGES)}
        self.count = 0
        return out


def _percentiles(rows: np.ndarray, qs: tuple) -> list[list[float]]:
    """Each row's percentiles ``qs`` (%) of the sorted ``rows``, by np.percentile's default rule (linear between
    the two nearest ranks, the lerp taken from the nearer end) and equal to it (tests/test_daemon.py)."""
    n = rows.shape[1]
    out = [[0.0] * len(qs) for _ in range(rows.shape[0])]
    for k, q in enumerate(qs):
        pos = (q / 100.0) * (n - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, n - 1)
        t = pos - lo
        for r in range(rows.shape[0]):
            a, b = float(rows[r, lo]), float(rows[r, hi])
            out[r][k] = b - (b - a) * (1.0 - t) if t >= 0.5 else a + (b - a) * t
    return out


def _user_id(frame: zmq.Frame) -> str | None:
    """The ZAP user id of the peer that sent ``frame`` (for CURVE: its public key, z85), or None."""
    try:
        return frame.get("User-Id")
    except (zmq.ZMQError, TypeError, ValueError):
        return None


def free_grasp_slot(state, slot: int) -> None:
    """Grasp slot ``slot`` of ``state`` holds nothing: no vertex, point or pad, no force."""
    state.grasp_vertex[slot] = -1
    state.grasp_frac[slot] = 0.0
    state.grasp_pad[slot] = -1
    state.grasp_force[slot] = 0.0


def free_grasp_slots(state, kept: set[int]) -> None:
    """Every grasp slot of ``state`` but those in ``kept`` holds nothing (a state restored from a copy)."""
    for slot in range(state.grasp_vertex.shape[0]):
        if slot not in kept:
            free_grasp_slot(state, slot)


def wait_until(deadline_ns: int, spin_ns: int) -> None:
    """Return at ``deadline_ns`` (time.monotonic_ns): sleep until ``spin_ns`` before it (the OS wakes us late
    by tens of µs), then spin the rest."""
    now = time.monotonic_ns()
    if deadline_ns - now > spin_ns:
        time.sleep((deadline_ns - now - spin_ns) * 1e-9)
    while time.monotonic_ns() < deadline_ns:
        pass


def rt_duty_limit() -> float:
    """The share of each period the kernel lets a SCHED_FIFO task run (sched_rt_runtime_us over
    sched_rt_period_us; 1.0 where it sets no limit or does not say)."""
    try:
        with open("/proc/sys/kernel/sched_rt_runtime_us") as f:
            runtime = int(f.read())
        with open("/proc/sys/kernel/sched_rt_period_us") as f:
            period = int(f.read())
    except (OSError, ValueError):
        return 1.0
    if runtime < 0 or period <= 0:
        return 1.0
    return min(1.0, runtime / period)


def spin_allowed(spin_ns: int, tick_ns: int, busy_ns: int, duty: float) -> int:
    """The spin (ns) before the next deadline: ``spin_ns`` as configured, less what would take the loop's busy
    share of a tick past ``duty`` less DUTY_MARGIN, with its ticks taking ``busy_ns`` (ns, their recent average);
    never below zero. A loop that is not real time (``duty`` 1) spins as configured while its ticks leave room."""
    budget = int((duty - DUTY_MARGIN) * tick_ns) if duty < 1.0 else tick_ns
    return max(0, min(spin_ns, budget - busy_ns))


def place_helper_threads(priority: int | None, loop_cpu: int = -1) -> list[str]:
    """Every other Python thread of this process (the scene builder's thread, server/builder.py) to SCHED_FIFO at
    ``priority`` (below the loop's; None: left as it is) and off the loop's CPU ``loop_cpu`` (-1: not pinned).
    A helper holding the GIL must not be preempted by an ordinary process on its CPU while the loop waits for the
    GIL (a priority inversion: the loop then stalls for the other process's time slice, milliseconds); and one
    sharing the loop's CPU stalled it by 5 to 40 ms around each scene build (60 rejected `set`s: 25 to 160
    overruns; off its CPU: none, tests/test_daemon.py). A thread the loop starts inherits its CPU and priority,
    so the loop calls this again after starting one (a new scene builder). Returns notes."""
    notes = []
    me = threading.current_thread()
    # every CPU but the loop's (the process's own affinity is the loop's CPU alone once it is pinned)
    others = set(range(os.cpu_count() or 1)) - {loop_cpu} if loop_cpu >= 0 else set()
    for t in threading.enumerate():
        if t is me or t.native_id is None:
            continue
        try:
            if others:
                os.sched_setaffinity(t.native_id, others)
        except (OSError, AttributeError, ValueError) as exc:
            notes.append(f"helper thread {t.name} not kept off the loop's CPU ({exc.__class__.__name__}: {exc})")
        if priority is None:
            continue
        try:
            os.sched_setscheduler(t.native_id, os.SCHED_FIFO, os.sched_param(priority))
        except (PermissionError, OSError, AttributeError) as exc:
            notes.append(f"helper thread {t.name} not raised to SCHED_FIFO ({exc.__class__.__name__}: {exc})")
    return notes


def set_realtime(priority: int, cpu: int) -> tuple[bool, int, list[str]]:
    """Ask for SCHED_FIFO at ``priority`` and pin to ``cpu`` (-1: the last CPU this process may use, if it may
    use more than one). Returns (realtime granted, cpu pinned or -1, messages saying what was not granted)."""
    notes = []
    realtime = False
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        realtime = True
    except (PermissionError, OSError, AttributeError) as exc:
        notes.append(f"SCHED_FIFO not granted ({exc.__class__.__name__}: {exc}); running at normal priority "
                     "(give the process CAP_SYS_NICE or an rtprio limit for tighter timing)")
    pinned = -1
    try:
        allowed = sorted(os.sched_getaffinity(0))
        target = allowed[-1] if cpu < 0 and len(allowed) > 1 else (cpu if cpu >= 0 else -1)
        if target >= 0:
            os.sched_setaffinity(0, {target})
            pinned = target
    except (OSError, AttributeError, ValueError) as exc:
        notes.append(f"CPU affinity not set ({exc})")
    return realtime, pinned, notes


class PhysicsLoop:
    """The loop and everything it owns: scenario, stepper, sockets, link. Built in the physics process."""

    def __init__(self, cfg: ServerConfig, link_name: str | None = None, supervisor=None, sink=None,
                 heartbeat=None, restore: str | None = None):
        """``sink``: None to bind the configured sockets (the daemon); or a callable ``sink(topic, payload)``
        that receives every published message instead, with no socket at all (a resimulation).
        ``heartbeat``: the supervisor's shared [ticks, armed] array; ``restore``: the snapshot (server/snapshot.py)
        of a physics process that died or hung, whose scene and state this one resumes."""
        self.cfg = cfg
        self.supervisor = supervisor      # a multiprocessing Connection to the supervisor (recording), or None
        self.heartbeat = heartbeat
        self.snapshot: Snapshot | None = None   # the running scene's, written at least once a second
        self.resumed_at: float | None = None    # the scene time a restarted process resumed at
        self.recording: dict = {}               # the recording a client asked for: path, state, error
        self.faults: list[int] = []             # the ticks of the latest divergences (fault_reset)
        self.rollback: Rollback | None = None   # the running scene's state of up to ROLLBACK_TICKS ago
        self.tick_t0 = 0.0                      # the scene time (s) this tick started at
        self.tick_ns = int(round(cfg.loop.tick_s * 1e9))
        self._tick_start_ns = 0                 # the tick's start (link forces answer it)
        self.inputs_end_ns = 0                  # when this tick's inputs were in (tick_scene)
        self.sink = sink
        self.ctx = self.security = self.pub = self.ctl = self.stylus = None
        if sink is None:
            self.ctx = zmq.Context()
            self.security = SocketSecurity(self.ctx, cfg.security,
                                           [cfg.endpoints.pub, cfg.endpoints.control, cfg.endpoints.stylus],
                                           require_curve=cfg.security.curve_on_loopback)
            self.pub = self._bind(zmq.PUB, cfg.endpoints.pub)
            self.pub.setsockopt(zmq.SNDHWM, cfg.loop.sndhwm)
            # a request over max_message_bytes must get an error reply (control.py), so ZeroMQ itself only drops
            # (and disconnects) what is far beyond it
            self.ctl = self._bind(zmq.REP, cfg.endpoints.control, max_bytes=16 * cfg.security.max_message_bytes)
            self.stylus = self._bind(zmq.PULL, cfg.endpoints.stylus)
            self.stylus.setsockopt(zmq.RCVHWM, 64)
        self.link = DeviceLink.attach(link_name) if link_name else None
        self.seq = 0
        self.paused = False
        self.running = True
        self.realtime = False
        self.cpu = -1
        self.stats = LoopStats(capacity=max(1, int(round(1.0 / cfg.loop.stats_hz / cfg.loop.tick_s))))
        self._pose = np.zeros(3)
        self._quat = np.zeros(4)
        self._tool = np.zeros(3)                # a stylus's pose through its device's mapping (Device.to_tool)
        self._tool_quat = np.zeros(4)
        self._quat2 = np.zeros(4)
        # the inbox: remote samples received and checked while the loop waits, applied by the next tick
        self._inbox = [InboxSample() for _ in range(STYLUS_DRAIN_PER_TICK)]
        self._inbox_n = 0                       # how many of them hold a sample
        self.holds: dict[str, Hold] = {}        # grasp id -> what a tool's jaw holds by it (server/jaws.py)
        self.last_stats: dict = {}
        self.link_devices = list(cfg.link_devices)   # link slot i carries device link_devices[i], for the run
        #: every device the loop knows, one record each (server/device.py): stylus, buttons, driver, force
        self.devices = DeviceTable(cfg.safety, dict(cfg.device_limits), self._device_settings)
        self.linked: list[Device] = [self.devices[d] for d in self.link_devices]   # in link slot order
        self.phase_device: Device | None = None      # the live linked device whose servo clock the loop follows
        self.phase_locked = False                    # whether the loop has taken that clock's phase yet
        self.stiffness_limit = dict(cfg.device_stiffness)   # device -> its nominal max stiffness (N/m)
        self.coupling_limited: list[tuple] = []      # (device, asked, applied N/m), reported at start
        self.replay = None                           # device -> haptics.replay.PoseTrack (backend replay)
        if cfg.replay:
            from .replay_poses import load_pose_tracks
            self.replay = load_pose_tracks(cfg.replay)
        self.resume_error: str | None = None
        if restore is not None:
            try:
                self.resume(restore)
            except Exception as exc:  # noqa: BLE001 - a snapshot that cannot be read: start the scene afresh
                self.resume_error = f"could not resume from the snapshot ({exc.__class__.__name__}); the server's " \
                                    "scenario starts afresh"
        if restore is None or self.resume_error is not None:
            self.install(load_scenario(cfg.scenario) if isinstance(cfg.scenario, str) else cfg.scenario)

    def set_workspace(self, dev: Device) -> None:
        """``dev``'s workspace mapping in the running scene (ServerConfig.workspace_of), about the device's origin
        in the scene (its transform's offset); what clutching added starts again from nothing."""
        offset, scale = self.cfg.workspace_of(dev.name, self.scenario)
        t = self.cfg.device_config(dev.name).transform
        dev.set_workspace(t.offset, offset, scale, t.quat)

    def _device_settings(self, name: str) -> tuple[float, int]:
        """A new device record's settings (DeviceTable): the most its grasps move per tick (m), its link slot."""
        max_step = self.cfg.device_config(name).max_speed * self.cfg.loop.tick_s
        return max_step, self.link_devices.index(name) if name in self.link_devices else -1

    def _bind(self, kind: int, endpoint: str, max_bytes: int | None = None) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self.security.apply(sock, endpoint)
        if max_bytes is not None:
            sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
        sock.bind(endpoint)
        return sock

    # -- scene ------------------------------------------------------------------------------------------
    def install(self, scenario: Scenario, state=None) -> None:
        """Make ``scenario`` the running scene (its initial state, or ``state`` if given): new state arrays,
        stepper, builder and snapshot (a `load`, a `set`, a start or a restart; a `reset` is :meth:`reset`). Not
        on the tick path."""
        self.scenario = scenario
        self.model = scenario.model
        self.state = scenario.new_state() if state is None else state
        self.timers = self.state.stats[STAT_TIMERS:]   # the step's stage timers, read by the loop's stats each tick
        stepper = Stepper(self.model, self.state)
        self.grasps: list[GraspSpec] = list(scenario.grasps)
        self.holds = {}
        self.limit_couplings()
        devices = self.all_devices([g.device for g in self.grasps])
        builder = MessageBuilder(scenario, self.grasps, devices=devices, table=self.devices)
        # the scene's part of every tick (server/scene.py), the one sequence `suturesim run` runs too
        self.runner = SceneRunner(stepper, builder, self.publish,
                                  state_period(self.cfg.loop.state_hz, self.model.solver.tick),
                                  event=self.event, on_divergence=self._diverged,
                                  before_publish=None if self.link is None else self._write_tick_forces)
        self.start_scene()
        self.rollback = Rollback(self.state)
        self.initial_model = self.model   # what a reset goes back to (timeline motions of live devices removed)
        if self.supervisor is not None:
            self.new_snapshot()

    def reset(self) -> None:
        """The running scene back to its start, in place (a control `reset`, a fault with no rollback): the
        scenario's initial state copied into the live state's arrays (ThreadState.copy_into), the grasps made by
        hand let go (no `release` event, as when the scene is installed), the model as it was installed (the
        timeline motions of the grasps a live device drives removed, and only those), the stepper's, the
        builder's and the watch's state as new ones start, the rollback's copy cleared, and the reset state
        written into the scene's snapshot at once (the same segment). Computes and publishes exactly what
        installing the scene afresh did; allocates no state array. Not on the tick path."""
        self.scenario.initial.copy_into(self.state)
        self.grasps[:] = self.scenario.grasps      # the builder's list too: one list
        self.holds.clear()
        self.limit_couplings()
        if self.model is not self.initial_model:
            self.model = self.initial_model
            self.stepper.use_model(self.model)
        self.stepper.reset()
        self.builder.reset(self.state, self.all_devices([g.device for g in self.grasps]))
        self.start_scene()
        self.rollback.clear()
        if self.snapshot is not None:
            self.snapshot.write(self.state)

    def limit_couplings(self) -> None:
        """Each of the scenario's grasps no stiffer than its device renders (``stiffness_limit``), in ``grasps``
        and in the state; noted in ``coupling_limited``."""
        self.coupling_limited = []
        for k, g in enumerate(self.grasps):
            k_max = self.coupling_limit(g.device)
            if k_max is not None and g.stiffness > k_max:
                # a coupling stiffer than the device renders makes it buzz: the device's own limit applies
                self.grasps[k] = replace(g, stiffness=k_max)
                self.state.grasp_k[g.slot] = k_max
                self.coupling_limited.append((g.device, g.stiffness, k_max))

    def coupling_limit(self, device: str) -> float | None:
        """The stiffest coupling (N/m) ``device`` renders in this scene, or None if its driver gave no limit:
        its nominal max stiffness over its motion scale (a tool moving s times the hand makes a coupling of k
        feel k s at the hand)."""
        k_max = self.stiffness_limit.get(device)
        return None if k_max is None else k_max / self.cfg.workspace_of(device, self.scenario)[1]

    def start_scene(self) -> None:
        """What a scene's start sets beside its state: the watch read from the state, no device live in it yet,
        and every grasp of a device on a backend other than simulated waiting for its poses (its timeline
        motions removed, :meth:`drive_with_device`)."""
        self.builder.watch.reset(self.state)
        # the tools' capsules in the state: a row pair per device (Device.tool_row), taken the first tick its
        # tool is placed
        self.thread_radius = self.model.params.radius
        self.segment_length = float(self.model.rest_length.mean())
        for dev in self.devices:
            dev.live_at = None
            dev.body, dev.tool_row = None, -1
            self.set_workspace(dev)
        for g in self.grasps:
            if self.cfg.backend_of(g.device) != "simulated":  # no scripted stylus: the grasp waits for poses
                self.drive_with_device(g)

    # the scene runner's parts, read where the loop always read them
    @property
    def stepper(self) -> Stepper:
        return self.runner.stepper

    @property
    def builder(self) -> MessageBuilder:
        return self.runner.builder

    @property
    def state_every(self) -> int:
        return self.runner.state_every

    def new_snapshot(self) -> None:
        """A snapshot segment for the scene just installed, its state written at once; the supervisor is told its
        name (what it restarts a dead or hung process from) and the previous one is removed."""
        sc = self.scenario
        old = self.snapshot
        self.snapshot = Snapshot.create(SnapshotScene(sc.name, sc.file, sc.source, sc.base_dir), self.state)
        self.snapshot.write(self.state)
        self.supervisor.send(("snapshot", self.snapshot.name))
        if old is not None:
            old.close()
            old.unlink()

    def resume(self, name: str) -> None:
        """Install the scene of snapshot ``name`` with its newest state (a restart after a fault). The scene was
        validated when it was first installed; it is rebuilt from the source it was built from. A grasp that a
        device had made by hand is not resumed: the device grasps again."""
        snap = Snapshot.attach(name)
        try:
            scene = snap.scene()
            scenario = build_scenario(scene.source, scene.file,
                                      base_dir=scene.base_dir)
            state = scenario.new_state()
            restored = snap.restore(state)
        finally:
            snap.close()
        if restored:
            state.x_ref[:] = np.inf           # the neighbour list is rebuilt before the next substep
            state.grasp_vel[:] = 0.0
            free_grasp_slots(state, {g.slot for g in scenario.grasps})   # a pad held by hand is let go too
            self.resumed_at = float(state.time[0])
        self.install(scenario, state if restored else None)

    def all_devices(self, grasp_devices: list[str]) -> list[str]:
        """Every device with a `force` stream, in order: the grasps' and every stylus that exists without a
        grasp (a device on a backend other than simulated, linked, placed by the scene's `devices` section or
        configured: it gets zero force while it holds nothing)."""
        others = [d for d in (*self.link_devices, *self.scenario.workspaces, *(d.name for d in self.cfg.devices))
                  if self.cfg.backend_of(d) != "simulated"]
        return list(dict.fromkeys([*grasp_devices, *others]))

    def warm_up(self) -> None:
        """Run every kernel the loop can reach once, on copies, so that no tick loads or compiles one."""
        warm_up(self.model, self.state)
        backup = self.state.copy()
        self.builder.watch.warm_up(backup)
        self.builder.state(0, backup)
        self.builder.forces(0, backup)

    def place_helper_threads(self) -> list[str]:
        """The process's other threads off the loop's CPU, at SCHED_FIFO just below it if the loop has it
        (place_helper_threads); at start and whenever the loop starts a thread. Returns notes."""
        return place_helper_threads(max(1, self.cfg.loop.priority - 1) if self.realtime else None, self.cpu)

    def drive_with_device(self, grasp: GraspSpec) -> None:
        """A live device now drives ``grasp``: its scripted timeline motions stop (the model is rebuilt
        without them, once)."""
        keep = ~((self.model.mot_kind == MOTION_GRASP) & (self.model.mot_index == grasp.slot))
        if grasp.id == self.scenario.needle_grasp:   # the stylus's own orientation now turns the needle
            keep &= self.model.mot_kind != MOTION_SPIN
        if keep.all():
            return
        self.model = replace(self.model, mot_kind=self.model.mot_kind[keep], mot_index=self.model.mot_index[keep],
                             mot_t0=self.model.mot_t0[keep], mot_t1=self.model.mot_t1[keep],
                             mot_vel=self.model.mot_vel[keep])
        self.stepper.use_model(self.model)

    def set_device_pose(self, device: str, pos: np.ndarray, quat: np.ndarray | None = None) -> bool:
        """The stylus of ``device`` is at ``pos`` (m): its grasps follow (:meth:`follow_styluses`); if it holds
        the needle, its orientation ``quat`` (w, x, y, z, scene frame) is what the needle's rotational coupling
        turns it toward. False if the device holds no grasp."""
        dev = self.devices[device]
        dev.set_stylus(pos)
        unit = None if quat is None else unit_quat_or_none(quat)
        if unit is not None:
            dev.tool_quat[0], dev.tool_quat[1], dev.tool_quat[2], dev.tool_quat[3] = unit
            # kept as it came and recorded with the force: the tool's body lies along it (place_tool) and a
            # needle turns toward it, so a resimulation applying the recorded value normalises the same numbers
            # and moves both bit for bit alike
            dev.quat[:] = quat
            dev.has_quat = True
        hit = False
        for g in self.grasps:
            if g.device == device:
                if dev.live_at is None:
                    self.drive_with_device(g)
                hit = True
                hold = self.holds.get(g.id)
                if hold is not None and hold.kind == KIND_NEEDLE:
                    # the jaw carries the needle in the pose it took it in (follow_styluses, server/jaws.py)
                    if unit is not None:
                        hold.jaw_quat[:] = unit
                elif quat is not None and g.id == self.scenario.needle_grasp:
                    qn = math.sqrt(float(quat[0] ** 2 + quat[1] ** 2 + quat[2] ** 2 + quat[3] ** 2))
                    if qn > 1e-6 and math.isfinite(qn):
                        nst = self.state.nst
                        for i in range(4):
                            nst[NS_QT + i] = quat[i] / qn
                        nst[NS_WT] = nst[NS_WT + 1] = nst[NS_WT + 2] = 0.0
        if hit:
            dev.live_at = time.monotonic()
        return hit

    def follow_styluses(self) -> None:
        """Move every device-driven grasp target toward its stylus over this tick, at most at the device's
        ``max_speed``: a stylus that jumps (a device coming live far from its grasp, a grasp taken at a vertex
        away from the stylus, a reset) drags its grasp there at that speed instead of teleporting it, which
        would whip the thread."""
        tick = self.cfg.loop.tick_s
        for g in self.grasps:
            dev = self.devices.get(g.device)
            if dev is None or not dev.has_stylus:
                continue
            hold = self.holds.get(g.id)
            goal = dev.stylus
            if hold is not None:
                # the needle's swage (and its orientation toward the jaw's), or the pad's centre, where the jaw
                # carries it
                hold.follow(dev.stylus, self.state.nst, NS_QT)
                if hold.kind == KIND_NEEDLE:
                    nst = self.state.nst
                    nst[NS_WT] = nst[NS_WT + 1] = nst[NS_WT + 2] = 0.0
                goal = hold.goal
            step_max = dev.max_step
            vel = self.state.grasp_vel[g.slot]
            target = self.state.grasp_target[g.slot]
            dx, dy, dz = goal[0] - target[0], goal[1] - target[1], goal[2] - target[2]
            d = math.sqrt(dx * dx + dy * dy + dz * dz)
            s = 1.0 / tick if d <= step_max else step_max / (d * tick)
            vel[0], vel[1], vel[2] = dx * s, dy * s, dz * s
        for dev in self.devices:
            if dev.has_quat:   # a tool's body lies along its orientation: none until one has come
                self.place_tool(dev)

    def place_tool(self, dev: Device) -> None:
        """``dev``'s tool, jaw and shaft, where its stylus puts it by the end of this tick, in the state's
        capsules (solver/instruments.py place_capsules): the thread cannot pass through it, except
        the part its jaw holds. The first MAX_TOOLS devices whose styluses have sent an orientation in a scene
        have a tool body, from the tick the first one came (a resimulation applies the recorded orientations
        from the same tick); a hand has none."""
        fresh = dev.body is None
        if fresh:
            row = sum(1 for d in self.devices if d.tool_row >= 0)
            shape = SHAPES.get(self.cfg.tool_of(dev.name, self.scenario))
            if row >= MAX_TOOLS or shape is None:   # no row left, or a hand: no body
                return
            dev.body, dev.tool_row = shape, row
        shape = dev.body
        skip = (-1, -1)
        for g in self.grasps:
            if g.device == dev.name and g.kind != KIND_TISSUE:
                hold = self.holds.get(g.id)
                offset = 0.0 if hold is None or g.kind != KIND_NEEDLE else math.sqrt(
                    float(hold.offset[0] ** 2 + hold.offset[1] ** 2 + hold.offset[2] ** 2))
                skip = held_segments(g.kind, int(self.state.grasp_vertex[g.slot]), offset, self.segment_length,
                                     self.model.n_segments, shape)
        place_capsules(self.state.tool_cap, CAPSULES_PER_TOOL * dev.tool_row, dev.stylus, dev.tool_quat, shape.par,
                       self.thread_radius, skip[0], skip[1], self.cfg.loop.tick_s, dev.max_step, fresh)

    # -- inputs -----------------------------------------------------------------------------------------
    def read_link_poses(self) -> None:
        """Take every driver's newest pose: move its grasps, act on its buttons, note its safety flags."""
        if self.link is None:
            return
        for dev in self.linked:
            got = self.link.read_pose(dev.link_slot, self._pose, self._quat)
            if got is None:
                if dev.link_live:
                    dev.link_live = False
                    if self.phase_device is dev:
                        self.phase_device = None
                        self.phase_locked = False
                    self.event("device_lost", device=dev.name)   # its grasps hold still where they are
                continue
            _seq, t_ns, buttons = got
            if not dev.link_live:
                dev.link_live = True
                if self.phase_device is None:
                    self.phase_device = dev
                    self.phase_locked = False
                self.event("device", device=dev.name, state="live")
            dev.pose_t_ns = t_ns
            p, q = self._pose, self._quat
            # a driver's pose is checked as a remote sample is (protocol.decode_stylus): a non-finite one, or
            # one beyond STYLUS_MAX_POS_M, is counted and dropped, and the device's grasps hold still.
            # x - x is 0 for a finite x and nan otherwise: one test for nan and inf, no call, no allocation
            # beyond numpy's scalars
            if (p[0] - p[0] + p[1] - p[1] + p[2] - p[2] + q[0] - q[0] + q[1] - q[1] + q[2] - q[2] + q[3] - q[3]
                    != 0.0) or p[0] * p[0] + p[1] * p[1] + p[2] * p[2] > STYLUS_MAX_POS_M * STYLUS_MAX_POS_M:
                self.stats.stylus_rejected += 1
            else:
                self.stylus_sample(dev, p, q, buttons)
            dflags = self.link.driver_flags(dev.link_slot)
            dev.driver_flags = dflags & 0xFFFF
            code = dflags >> 16
            if code != dev.driver_error:
                dev.driver_error = code
                if code:
                    self.event("device_error", device=dev.name, code=code)

    def read_replay_poses(self) -> None:
        """The replay backend: each replayed device's recorded pose (and orientation, if it sent one) at the end
        of this tick."""
        t_end = float(self.state.time[0]) + self.cfg.loop.tick_s
        for device, track in self.replay.items():
            if self.cfg.backend_of(device) == "replay" and track.pose_at(t_end, self._pose):
                self.set_device_pose(device, self._pose, self._quat if track.quat_at(self._quat) else None)

    def stylus_sample(self, dev: Device, pos: np.ndarray, quat: np.ndarray | None, buttons: int) -> bool:
        """A live stylus sample of ``dev`` (m and w x y z, scene frame; ``quat`` None if it sent none): its tool
        moved through the device's workspace mapping and clutch (Device.to_tool), then its buttons acted on.
        Returns whether the tool drives a grasp."""
        held = False
        self.on_clutch(dev, buttons)   # first: a sample that presses the clutch does not move the tool
        if dev.to_tool(pos, quat, self._tool, self._tool_quat):   # else clutched: the tool holds still
            held = self.set_device_pose(dev.name, self._tool, self._tool_quat if quat is not None else None)
        self.on_buttons(dev.name, buttons)
        return held

    def on_clutch(self, dev: Device, buttons: int) -> None:
        """The clutch button held freezes ``dev``'s tool where it is; released, the tool re-engages there
        (Device.clutch). A `clutch` event each way."""
        on = bool(buttons & self.cfg.device_config(dev.name).clutch_button)
        if on != dev.clutched:
            dev.clutch(on, dev.stylus, dev.tool_quat)
            self.event("clutch", device=dev.name, on=on)

    def on_buttons(self, device: str, buttons: int) -> None:
        """A device's grasp button: it closes the tool's jaw on what is in reach and opens it (``grasp_mode``
        hold: pressed and released; toggle: each press). While clutched it does nothing: what the jaw holds
        stays held."""
        dev = self.devices[device]
        prev = dev.buttons
        if buttons == prev:
            return
        dev.buttons = buttons
        if dev.clutched:
            return
        dc = self.cfg.device_config(device)
        mask = dc.grasp_button
        holding = any(g.device == device for g in self.grasps)
        if buttons & mask and not prev & mask:
            if not holding:
                self.close_jaw(device)
            elif dc.grasp_mode == "toggle":
                self.open_jaw(device)
        elif prev & mask and not buttons & mask and dc.grasp_mode == "hold":
            self.open_jaw(device)

    def open_jaw(self, device: str) -> None:
        """``device``'s jaw lets go of whatever it holds; it stays where physics puts it."""
        for g in [g for g in self.grasps if g.device == device]:
            self.remove_grasp(g.id)

    def close_jaw(self, device: str) -> None:
        """``device``'s jaw closes on what lies within its reach (``grasp_radius``): the needle anywhere along
        its arc, taken from the other hand if it holds it, else the thread's closest point, else (forceps) a
        tissue pad, taken from the other hand if it holds it (server/jaws.py). A `grasp_missed` event if nothing
        is in reach."""
        dev = self.devices[device]
        dc = self.cfg.device_config(device)
        st, model = self.state, self.model
        if not dev.has_stylus:
            self.event("grasp_missed", device=device, reason="no pose from the device yet")
            return
        jaw = dev.stylus
        try:
            if model.needle_on:
                dist, theta = needle_in_reach(st.x[0], st.nst, model.needle_par, jaw)
                if dist <= dc.grasp_radius:
                    for g in [g for g in self.grasps if g.vertex == 0]:   # a handover: the other hand lets go
                        self.remove_grasp(g.id)
                    hold = needle_hold(jaw, dev.tool_quat, st.x[0], st.nst[NS_Q:NS_Q + 4])
                    self.add_grasp(0, device, None, dc.stiffness, dc.damping, dc.max_force, hold=hold,
                                   point={"arc": theta, "distance": dist})
                    return
            dist, v, frac = thread_in_reach(st.x, model.kinematic, jaw)
            if v >= 0 and dist <= dc.grasp_radius and not (model.needle_on and v == 0 and frac == 0.0):
                self.add_grasp(v, device, None, dc.stiffness, dc.damping, dc.max_force, frac=frac,
                               point={"distance": dist})
                return
            if model.tissue_on and self.cfg.tool_of(device, self.scenario) == "forceps":
                dist, p = pad_in_reach(model.pads, st.pst, jaw)
                if dist <= dc.grasp_radius:
                    for g in [g for g in self.grasps if g.pad == p]:    # a handover: the other hand lets go
                        self.remove_grasp(g.id)
                    hold = tissue_hold(jaw, st.pst[p, PS_X:PS_X + 3])
                    self.add_grasp(-1, device, None, dc.stiffness, dc.damping, dc.max_force, pad=p, hold=hold,
                                   point={"distance": dist})
                    return
            self.event("grasp_missed", device=device, radius=dc.grasp_radius)
        except ValueError as exc:
            self.event("grasp_missed", device=device, reason=str(exc))

    # -- grasps -----------------------------------------------------------------------------------------
    def _grasp_point(self, vertex: int, frac: float, pad: int) -> tuple[int, float]:
        """A grasp's point checked: (vertex, frac) of a thread point, or (-1, 0) for tissue pad ``pad`` >= 0.
        Raises ValueError saying why not."""
        if pad >= 0:
            if not self.model.tissue_on or not 0 <= pad < self.model.pads.shape[0]:
                raise ValueError(f"no tissue pad {pad}")
            return -1, 0.0
        n = self.model.n_vertices
        if not -n <= vertex < n:
            raise ValueError(f"vertex must be in [{-n}, {n - 1}]")
        vertex %= n
        frac = float(frac)
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"frac must be in [0, 1), got {frac:g}")
        if frac > 0.0 and vertex >= n - 1:
            raise ValueError(f"frac > 0 needs a segment after vertex {vertex}: the vertex must be below {n - 1}")
        if self.model.kinematic[vertex] and (frac == 0.0 or self.model.kinematic[vertex + 1]):
            raise ValueError(f"vertex {vertex} is pinned or driven" if frac == 0.0 else
                             f"vertices {vertex} and {vertex + 1} are pinned or driven")
        return vertex, frac

    def add_grasp(self, vertex: int, device: str | None, gid: str | None, stiffness: float, damping: float,
                  max_force: float, *, frac: float = 0.0, pad: int = -1, hold: Hold | None = None,
                  point: dict | None = None) -> GraspSpec:
        """Couple ``device`` to ``vertex`` (a virtual coupling: N/m, N s/m, N), or to the point ``frac`` of the
        way along segment ``vertex``, or (``pad`` >= 0, ``vertex`` -1) to tissue pad ``pad``'s centre;
        ``hold``: what a tool's jaw holds by it (server/jaws.py). Publishes a
        `grasp` event saying what is held (``kind``, the point, and ``point``'s details). Raises ValueError
        saying why not."""
        vertex, frac = self._grasp_point(vertex, frac, pad)
        used = {g.slot for g in self.grasps}
        free = [s for s in range(MAX_GRASPS) if s not in used]
        if not free:
            raise ValueError(f"at most {MAX_GRASPS} grasps")
        gid = gid if gid is not None else f"grasp{free[0]}"
        device = device if device else gid
        if any(g.id == gid for g in self.grasps):
            raise ValueError(f"a grasp {gid!r} exists already")
        # the bounds a scenario file has too (solver/scenario.py): beyond them the coupling is not a stylus
        if not 0.0 < stiffness <= MAX_GRASP_STIFFNESS or not 0.0 <= damping <= MAX_GRASP_DAMPING or \
                not 0.0 < max_force <= MAX_GRASP_FORCE:
            raise ValueError(f"stiffness must be in (0, {MAX_GRASP_STIFFNESS:g}] N/m, damping in [0, "
                             f"{MAX_GRASP_DAMPING:g}] N s/m, max_force in (0, {MAX_GRASP_FORCE:g}] N")
        k_max = self.coupling_limit(device)   # what the device can render
        stiffness = stiffness if k_max is None else min(stiffness, k_max)
        kind = KIND_TISSUE if pad >= 0 else hold.kind if hold is not None else (
            KIND_NEEDLE if self.model.needle_on and vertex == 0 and frac == 0.0 else KIND_THREAD)
        spec = GraspSpec(id=gid, slot=free[0], vertex=vertex, device=device, stiffness=stiffness,
                         damping=damping, max_force=max_force, kind=kind, frac=frac, pad=pad)
        st = self.state
        st.grasp_vertex[spec.slot] = vertex
        st.grasp_frac[spec.slot] = frac
        st.grasp_pad[spec.slot] = pad
        st.grasp_k[spec.slot] = spec.stiffness
        st.grasp_c[spec.slot] = spec.damping
        st.grasp_fmax[spec.slot] = spec.max_force
        # the target starts on the held point: no pull until the device moves
        held = (st.pst[pad, PS_X:PS_X + 3].copy() if pad >= 0 else st.x[vertex] if frac == 0.0 else
                (1.0 - frac) * st.x[vertex] + frac * st.x[vertex + 1])
        st.grasp_target[spec.slot] = held
        st.grasp_target_prev[spec.slot] = held
        st.grasp_force[spec.slot] = 0.0
        self.grasps.append(spec)
        self.builder.add_device(device)
        details = {} if hold is None else hold.details()
        if hold is not None:
            self.holds[spec.id] = hold
        self.event("grasp", id=spec.id, vertex=vertex, device=spec.device, stiffness=stiffness, damping=damping,
                   max_force=max_force, **{"holds": kind, **({"frac": frac} if frac else {}),
                                           **({"pad": self.model.pad_ids[pad]} if pad >= 0 else {}), **details,
                                           **(point or {}),
                                           "pos": [float(v) for v in held]})
        return spec

    def grasp_as_recorded(self, e: dict) -> GraspSpec:
        """Make again the grasp a recorded `grasp` event ``e`` says was made (a resimulation), with what a
        tool's jaw held by it (the needle's pose in the jaw's frame)."""
        pad = list(self.model.pad_ids).index(e["pad"]) if e.get("holds") == KIND_TISSUE else -1
        hold = Hold.recorded(e, self.state.pst[pad, PS_X:PS_X + 3] if pad >= 0 else self.state.x[0])
        return self.add_grasp(e["vertex"], e["device"], e["id"], e.get("stiffness", 1000.0), e.get("damping", 0.0),
                              e.get("max_force", 3.0), frac=e.get("frac", 0.0), pad=pad, hold=hold,
                              point={k: e[k] for k in ("arc", "distance") if k in e})

    def remove_grasp(self, gid: str) -> bool:
        """Let go of grasp ``gid``; publishes a `release` event. False if there is no such grasp."""
        for g in self.grasps:
            if g.id == gid:
                st = self.state
                free_grasp_slot(st, g.slot)
                st.grasp_vel[g.slot] = 0.0
                self.holds.pop(g.id, None)
                self.grasps.remove(g)
                if g.device not in self.all_devices([h.device for h in self.grasps]):
                    self.builder.remove_device(g.device)   # a scripted hand: no stream, no stylus, no record
                    self.devices.drop(g.device)
                self.event("release", id=gid, device=g.device, holds=g.kind)
                return True
        return False

    def intake_stylus(self, until_ns: int | None = None, max_frames: int | None = None) -> None:
        """Receive and check remote stylus samples into the inbox, to be applied by the next tick's
        :meth:`drain_stylus`, until the socket is empty, the inbox holds STYLUS_DRAIN_PER_TICK, (``until_ns``,
        time.monotonic_ns) that time has come, or (``max_frames``) that many messages were read, taken or not.
        The loop calls this while it waits for a tick, so that a tick seldom decodes a sample. Each is checked by
        protocol.decode_stylus (its size before it is decoded) and taken only for a device whose backend is
        `remote`, from the one CURVE client the device may be bound to
        (`devices.<name>.client_key`), and only for a device the server knows (a grasp's device, or one configured
        under `devices`); any other is counted in ``stats.stylus_rejected`` and dropped: no sample steers an
        OpenHaptics, simulated, replayed or unknown device, nor fills grasp slots through one. Changes nothing
        the scene reads: a sample taken here acts only when a tick applies it."""
        sock = self.stylus
        if sock is None:
            return
        cfg = self.cfg
        read = 0
        while self._inbox_n < STYLUS_DRAIN_PER_TICK:
            if until_ns is not None and time.monotonic_ns() >= until_ns:
                return
            # a flood of refused messages fills no inbox: the tick's read is bounded by messages, not samples
            if max_frames is not None and read >= max_frames:
                return
            read += 1
            # asked first: a recv that finds nothing raises zmq.Again, which costs the tick about 3 us more
            if not sock.get(_EVENTS) & _POLLIN:
                return
            try:
                frame = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                sample = protocol.decode_stylus(frame.buffer)
            except protocol.ProtocolError:
                self.stats.stylus_rejected += 1
                continue
            dc = cfg.device_config(sample.device)
            # a device the server knows (a grasp's, or configured: it has a force stream), on the remote backend,
            # from its bound client if it has one: a made-up name cannot take free grasp slots with its button
            dev = self.devices.get(sample.device)
            if dev is None or dev not in self.builder.streams or (dc.backend or cfg.device) != "remote" or (
                    dc.client_key is not None and _user_id(frame) != dc.client_key):
                self.stats.stylus_rejected += 1
                continue
            slot = self._inbox[self._inbox_n]
            quat = self.sample_in_scene(dc, sample, slot.pos, slot.quat)
            if quat is False:
                self.stats.stylus_rejected += 1
                continue
            slot.dev, slot.has_quat, slot.buttons = dev, quat is not None, sample.buttons
            self._inbox_n += 1

    def drain_stylus(self) -> None:
        """Apply the remote stylus samples the inbox holds, and any the socket still has (:meth:`intake_stylus`),
        in the order they came: each moves its device's tool and acts on its buttons (:meth:`stylus_sample`).
        One that drives no grasp and presses no button, or whose device's stream ended since it was taken, is
        counted in ``stats.stylus_rejected``. The tick reads at most STYLUS_DRAIN_PER_TICK messages from the
        socket, whatever they are."""
        self.intake_stylus(max_frames=STYLUS_DRAIN_PER_TICK)
        streams = self.builder.streams
        for i in range(self._inbox_n):
            slot = self._inbox[i]
            dev, slot.dev = slot.dev, None
            if dev not in streams:   # its stream ended (a scene loaded) since the sample was taken
                self.stats.stylus_rejected += 1
            elif self.stylus_sample(dev, slot.pos, slot.quat if slot.has_quat else None, slot.buttons) \
                    or slot.buttons:
                self.stats.stylus_accepted += 1
            else:
                self.stats.stylus_rejected += 1
        self._inbox_n = 0

    def wait_taking_samples(self, deadline_ns: int, spin_ns: int) -> None:
        """:func:`wait_until` ``deadline_ns`` (sleep, then spin the last ``spin_ns``), taking the remote stylus
        samples that came (:meth:`intake_stylus`) when the wait starts and as they come while it spins, but none
        later than STYLUS_INTAKE_GUARD_NS before the deadline: one being decoded then would make the tick late.
        A sample that comes later is taken by the tick itself."""
        if self.stylus is None:
            wait_until(deadline_ns, spin_ns)
            return
        last = deadline_ns - STYLUS_INTAKE_GUARD_NS
        self.intake_stylus(last)
        now = time.monotonic_ns()
        if deadline_ns - now > spin_ns:
            time.sleep((deadline_ns - now - spin_ns) * 1e-9)
        sock = self.stylus
        while True:
            now = time.monotonic_ns()
            if now >= deadline_ns:
                return
            if now < last and sock.get(_EVENTS) & _POLLIN:
                self.intake_stylus(last)

    def sample_in_scene(self, dc, sample: protocol.StylusSample, pos_out: np.ndarray | None = None,
                        quat_out: np.ndarray | None = None):
        """A remote sample's position into ``pos_out`` (m, scene frame; default ``self._pose``): as it came, or
        with ``frame: device`` mapped by the device's transform as a driver maps its own (device units, so the
        decoder's bound on the raw position is looser); then no farther than STYLUS_MAX_POS_M from the origin.
        Returns its orientation in the scene (``quat_out``, default ``self._quat``; None if it sent none), or
        False to reject it. Allocates nothing."""
        pos = self._pose if pos_out is None else pos_out
        quat = None
        if sample.quat is not None:   # optional; it turns a needle the device holds
            quat = self._quat if quat_out is None else quat_out
            quat[0], quat[1], quat[2], quat[3] = sample.quat
        if dc.frame == "device":      # in the device's own frame and units
            dc.transform.pose_to_scene(*sample.pos, None, pos, self._quat2)
            if quat is not None:
                quat_mul_into(dc.transform.quat, quat, quat)
        else:
            pos[0], pos[1], pos[2] = sample.pos
        if pos[0] * pos[0] + pos[1] * pos[1] + pos[2] * pos[2] > STYLUS_MAX_POS_M * STYLUS_MAX_POS_M:
            return False
        return quat

    # -- outputs ----------------------------------------------------------------------------------------
    def publish(self, topic: bytes, payload: bytes) -> None:
        if self.sink is not None:
            self.sink(topic, payload)
            return
        try:
            self.pub.send_multipart((topic, payload), zmq.NOBLOCK)
        except zmq.Again:  # a slow subscriber at its high-water mark: the loop never waits for it
            pass

    def event(self, kind: str, **details) -> None:
        self.publish(protocol.TOPIC_EVENT, protocol.encode_event(self.seq, float(self.state.time[0]), kind,
                                                                 **details))

    def write_forces(self, t_ns: int) -> None:
        """Each linked device's force as published (after its safety pipeline) to the link."""
        if self.link is None:
            return
        streams = self.builder.streams
        for dev in self.linked:
            if dev not in streams:
                continue
            axial = dev.axial
            if not math.isfinite(axial):  # the force itself is finite (the pipeline's NaN guard)
                axial = 0.0
            self.link.write_force(dev.link_slot, dev.force, axial, dev.flags, self.seq, t_ns, dev.pose_t_ns)

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self, stop=None, on_ready=None) -> None:
        """Run until a shutdown request or ``stop`` (anything with ``is_set()``; the daemon's is a
        haptics.process.StopRequest) is set."""
        from .control import ControlHandler
        from .warmup import CompileProgress

        control = ControlHandler(self)
        with CompileProgress(say, "suturesim physics"):   # a line while numba compiles (a first start)
            self.warm_up()
        self.realtime, self.cpu, notes = set_realtime(self.cfg.loop.priority if self.cfg.loop.realtime else 0,
                                                      self.cfg.loop.cpu) if self.cfg.loop.realtime else (
            False, -1, ["realtime disabled in the config"])
        notes += self.place_helper_threads()
        for note in notes:
            say(f"suturesim physics: {note}")
        gc.collect()
        gc.freeze()
        gc.disable()
        if on_ready is not None:
            on_ready()
        heartbeat = self.heartbeat
        if heartbeat is not None:
            heartbeat[1] = 1   # armed: from here on a tick is due every tick_s
        self.event("start", scenario=self.scenario.name, realtime=self.realtime, cpu=self.cpu,
                   strength=rating(self.scenario.model))
        if self.resumed_at is not None:
            self.event("resume", reason="restarted after a fault", scene_t=self.resumed_at)
        elif self.resume_error is not None:
            self.event("reset", reason=self.resume_error)
        for device, asked, applied in self.coupling_limited:
            self.event("coupling_limited", device=device, stiffness=asked, applied=applied)
            say(f"suturesim physics: {device}: coupling stiffness {asked:g} N/m is above what the device renders "
                f"({applied:g} N/m): limited to it")
        tick_ns = self.tick_ns
        spin_ns = int(self.cfg.loop.spin_us * 1000)
        duty = rt_duty_limit() if self.realtime else 1.0
        busy_ns = 0      # the ticks' recent busy time (ns): an average over about 2^BUSY_AVERAGE_SHIFT ticks
        stats_every = self.stats.capacity
        t0 = time.monotonic_ns() + tick_ns
        k = 0
        last_start = t0
        pending_overruns, worst_late, last_overrun_event = 0, 0, 0
        while self.running and (stop is None or not stop.is_set()):
            deadline = t0 + k * tick_ns
            self.wait_taking_samples(deadline, spin_allowed(spin_ns, tick_ns, busy_ns, duty))
            start = time.monotonic_ns()
            late = start - deadline
            if late > tick_ns:
                # an overrun: the tick still runs (none is dropped); an event reports it, at most every 100 ms
                # with the count since the last one
                self.stats.overruns += 1
                pending_overruns += 1
                worst_late = max(worst_late, late)
                if late > CATCH_UP_TICKS * tick_ns:  # too far behind to catch up: re-anchor the schedule
                    t0 = start - k * tick_ns
            if pending_overruns and start - last_overrun_event > 100 * tick_ns:
                self.event("overrun", late_us=worst_late / 1000.0, ticks=pending_overruns)
                pending_overruns, worst_late, last_overrun_event = 0, 0, start
            self.seq += 1
            self.read_link_poses()
            if self.phase_device is not None:
                lag = start - self.phase_device.pose_t_ns
                if 0 <= lag < 4 * tick_ns:   # a fresh pose; a stale one says nothing about the servo's phase
                    # positive: this tick started too long after the pose (wrapped into half a tick either way)
                    err = (lag - PHASE_TARGET_NS + tick_ns // 2) % tick_ns - tick_ns // 2
                    if self.phase_locked:
                        t0 -= max(-PHASE_STEP_NS, min(PHASE_STEP_NS, err // 4))
                    else:
                        # take the phase at once, by delaying the schedule (0 to 1 tick, once: no tick is made
                        # late). Slewed at PHASE_STEP_NS from the start, the lock took up to 100 ticks, in which
                        # a force came two servo periods after its pose: over 1 % of a short session's forces
                        t0 += (-err) % tick_ns
                        self.phase_locked = True
            substeps, step_ns = self.tick_scene(start)
            scene_end = time.monotonic_ns()
            if control.busy() or k % SUPERVISOR_POLL_TICKS == 0:   # an answer awaited, or one said unasked
                control.poll_supervisor()
            if control.busy():
                control.finish_pending()
            elif self.ctl.get(_EVENTS) & _POLLIN:
                control.handle_one()
            if heartbeat is not None:
                heartbeat[0] = k
            if self.snapshot is not None and k % SNAPSHOT_TICKS == 0:
                self.snapshot.write(self.state)
            inputs_ns, watch_ns = self.inputs_end_ns - start, self.runner.watch_ns
            end = time.monotonic_ns()
            self.stats.add(late / 1000.0, (start - last_start) / 1000.0, step_ns / 1000.0, substeps,
                           (end - start) / 1000.0, inputs_ns / 1000.0, watch_ns / 1000.0,
                           (scene_end - self.inputs_end_ns - step_ns - watch_ns) / 1000.0, self.timers,
                           self.state.stats, self.state.contact_stats)
            busy_ns += (end - start - busy_ns) >> BUSY_AVERAGE_SHIFT
            last_start = start
            if self.stats.count >= stats_every:
                self.publish_stats()
            k += 1
        self.event("shutdown")
        self.zero_forces()
        control.close()   # after the forces are zero: stopping its scene builder must not delay them
        time.sleep(0.05)  # let the last messages leave before the sockets close

    def tick_scene(self, start_ns: int) -> tuple[int, int]:
        """The scene's part of one tick, after the link's poses are read and ``seq`` counted: replayed and
        remote poses, grasps following their styluses, the solver step, each device's force (to the link and
        published) and the `state` at its rate. Returns (substeps, step time ns). A resimulation runs exactly
        this, so it computes exactly what the daemon did, the rollback's copies too (server/rollback.py): one is
        taken after every tick before one whose number is a multiple of ROLLBACK_TICKS, unless it faulted, before
        any input of the next (a linked device's pose is read before this is called)."""
        self.tick_t0 = float(self.state.time[0])
        if self.replay is not None:
            self.read_replay_poses()
        self.drain_stylus()
        self.follow_styluses()
        self._tick_start_ns = start_ns
        self.inputs_end_ns = time.monotonic_ns()   # the tick's inputs are in: the loop's stats split the tick
        done = self.runner.tick(self.seq, self.paused)
        if (self.seq + 1) % ROLLBACK_TICKS == 0 and not (self.faults and self.faults[-1] == self.seq):
            self.rollback.take(self.state, self.seq + 1)
        return done

    def _diverged(self, exc: SolverDivergence) -> None:
        self.fault_reset(str(exc))

    def _write_tick_forces(self) -> None:
        self.write_forces(self._tick_start_ns)

    def publish_stats(self) -> None:
        s = self.stats.summary()
        s.update({"realtime": self.realtime, "cpu": self.cpu, "retries": self.stepper.retries,
                  "retries_past_budget": self.stepper.past_budget, "paused": self.paused})
        self.last_stats = s
        self.publish(protocol.TOPIC_STATS, protocol.encode_stats(self.seq, float(self.state.time[0]), s))

    def fault_reset(self, reason: str) -> None:
        """The solver diverged: forces to zero and a `fault` event; then the scene goes back to its state of up to
        ROLLBACK_TICKS ago, the hands' grasps let go (:meth:`roll_back`), or, where it has no such state (its
        first half second) or it diverged within FAULT_WINDOW_TICKS before, to its initial state. A scene that
        diverges again and again (FAULTS_TO_PAUSE within FAULT_WINDOW_TICKS) is paused instead of reset for ever;
        a `load`, `set` or `reset` and `resume` go on from there."""
        self.zero_forces()
        self.event("fault", reason=reason)
        self.faults = [k for k in self.faults if self.seq - k < FAULT_WINDOW_TICKS] + [self.seq]
        if len(self.faults) == 1 and self.roll_back():
            return
        self.reset()
        if len(self.faults) >= FAULTS_TO_PAUSE:
            self.paused = True
            self.faults = []
            self.event("pause", reason=f"the scene diverged {FAULTS_TO_PAUSE} times within {FAULT_WINDOW_TICKS} "
                                       "ticks, each time from its start: paused (load or set another scene, or "
                                       "reset and resume)")
        else:
            self.event("reset", reason="fault")

    def roll_back(self) -> bool:
        """The scene back to the rollback's copy (taken up to ROLLBACK_TICKS ago), in place: what a trainee has
        done before it is kept. Every grasp made by hand is let go (a `release` event each; the jaws open, the
        buttons must be pressed again), as the motion the hands were making is what diverged; the scenario's own
        grasps stay. The scene's clock runs on from the end of the failed tick, so the time of every message
        still rises and recorded poses are read at the same times on resimulation. A `resume` event says how much
        was undone. False if there is no copy in this scene (nothing done): the caller resets. Not on the tick
        path."""
        rb = self.rollback
        state = self.state
        if rb is None or not rb.restore(state):
            return False
        state.time[0] = self.tick_t0 + self.model.solver.tick
        state.x_ref[:] = np.inf          # the neighbour list is not in the copy: rebuilt before the next substep
        state.grasp_vel[:] = 0.0
        scripted = {g.id for g in self.scenario.grasps}
        for g in [g for g in self.grasps if g.id not in scripted]:
            self.remove_grasp(g.id)      # its slot cleared in the restored state, its hold dropped
        free_grasp_slots(state, {g.slot for g in self.grasps})   # a grasp of the copy's time that has gone since
        self.stepper.reset()
        self.builder.reset(state, self.all_devices([g.device for g in self.grasps]))
        for dev in self.devices:         # each tool placed afresh where its stylus is, as at a scene's start
            dev.body, dev.tool_row = None, -1
        if self.snapshot is not None:
            self.snapshot.write(state)
        self.event("resume", reason="rolled back after a fault", scene_t=float(state.time[0]),
                   undone_s=float(state.time[0]) - rb.t)
        return True

    def zero_forces(self) -> None:
        if self.link is not None:
            self.link.zero_forces(protocol.FLAG_FAULT, time.monotonic_ns())

    def close(self, keep_snapshot: bool = False) -> None:
        """Release the sockets and the link; the snapshot too unless ``keep_snapshot`` (a loop that failed: the
        supervisor restarts from it, then removes it)."""
        if self.snapshot is not None:
            self.snapshot.close()
            if not keep_snapshot:
                self.snapshot.unlink()
            self.snapshot = None
        if self.sink is None:
            for sock in (self.pub, self.ctl, self.stylus):
                sock.close(0)
            self.security.close()
            self.ctx.term()
        if self.link is not None:
            self.link.close()


def physics_main(cfg: ServerConfig, link_name: str | None, ready, stop, conn=None,
                 fault_note: str | None = None, heartbeat=None, restore: str | None = None) -> None:
    """Entry point of the physics process (multiprocessing, spawn)."""
    import signal

    import sys

    from ..haptics.process import StopRequest, dump_stacks_on_signal

    # started through haptics/process.py child_main, which armed die-with-parent: a killed supervisor stops the
    # loop too (SIGTERM: the request below)
    dump_stacks_on_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when to stop
    stop = StopRequest(stop)
    # the scene builder's thread (server/builder.py) that is running may hold the GIL at most this long before the
    # loop gets it back; one that is not running cannot drop it at all, hence place_helper_threads
    sys.setswitchinterval(5e-5)
    try:
        loop = PhysicsLoop(cfg, link_name, supervisor=conn, heartbeat=heartbeat, restore=restore)
    except (zmq.ZMQError, OSError, ValueError) as exc:  # a port in use, a bad address, a missing link
        if conn is not None:
            conn.send(("startup_error", f"{exc.__class__.__name__}: {exc}"))
        sys.exit(3)
    try:
        def announce():
            if fault_note:
                loop.event("fault", reason=fault_note)
            ready.set()
        loop.run(stop=stop, on_ready=announce)
    except BaseException:
        loop.close(keep_snapshot=True)
        raise
    loop.close()
