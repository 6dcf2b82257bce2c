"""The scene's part of one tick, written once (docs/ARCHITECTURE.md Sec. 3, step 3.3-3.7): the solver step, the
suture's watch, each device's force through its safety pipeline, `force` every tick and `state` at its rate.

`suturesim serve` runs it from ``PhysicsLoop.tick_scene`` (server/physics.py), after the replayed and remote
poses and the grasps following their styluses; a resimulation (tools/replay.py) runs that same ``tick_scene``;
`suturesim run` (server/headless.py) runs it with a publish callback that writes to MCAP; a test steps a scenario
with it the way the server does. So every one of them computes, and publishes, the same bytes for the same
inputs.
"""
from __future__ import annotations

import time
from typing import Callable

from ..solver.breakage import rating
from ..solver.integrator import SolverDivergence, Stepper
from . import protocol
from .messages import MessageBuilder


def state_period(rate_hz: float, tick_s: float) -> int:
    """The ticks between two `state` messages at ``rate_hz`` (Hz) for a tick of ``tick_s`` (s): at least 1."""
    return max(1, int(round(1.0 / (rate_hz * tick_s))))


def reads_on(seq: int, every: int) -> bool:
    """Whether tick ``seq``, with a `state` message every ``every`` ticks, has room for a slice of the watch's
    knot or linking read (SutureWatch.check's ``spare``): a tick without `state`, or every tick when every tick
    has one."""
    return every == 1 or seq % every != 0


class SceneRunner:
    """One scene's tick: ``stepper`` (its model and state), ``builder`` (the messages, the safety pipelines and
    the suture's watch) and ``publish(topic, payload)`` (a socket, a sink, a recorder; None: build no message,
    and run the watch only if ``event`` is given: a headless run that records nothing, a test that follows the
    suture's events).

    :param state_every: `state` is published on the ticks whose seq is a multiple of it.
    :param event: ``event(kind, **details)`` for what the watch sees; default: an `event` message of this tick's
        seq and scene time, published.
    :param on_divergence: called with the SolverDivergence of a tick that diverged (the daemon zeroes the forces
        and resets the scene, and the tick goes on with the reset state); None: the exception propagates.
    :param before_publish: called once the tick's forces are computed and before any is published (the daemon
        writes them to the device link first).

    The daemon swaps ``stepper`` (a live device took over a scripted grasp) and resets ``builder`` in place; the
    runner reads them afresh each tick.
    """

    def __init__(self, stepper: Stepper, builder: MessageBuilder,
                 publish: Callable[[bytes, bytes], None] | None, state_every: int,
                 event: Callable[..., None] | None = None,
                 on_divergence: Callable[[SolverDivergence], None] | None = None,
                 before_publish: Callable[[], None] | None = None):
        self.stepper = stepper
        self.builder = builder
        self.publish = publish
        self.state_every = max(1, int(state_every))
        self.event = self._event if event is None else event
        self.watching = publish is not None or event is not None
        self.on_divergence = on_divergence
        self.before_publish = before_publish
        self.seq = 0
        self.watch_ns = 0   # the last tick's suture watch (ns): the loop's stats split the tick by stage

    @property
    def state(self):
        return self.stepper.state

    def _event(self, kind: str, **details) -> None:
        self.publish(protocol.TOPIC_EVENT, protocol.encode_event(self.seq, float(self.stepper.state.time[0]), kind,
                                                                 **details))

    def _broke(self, state) -> None:
        """The `break` event of the segment the tick parted (docs/PROTOCOL.md Sec. 3.4)."""
        stepper = self.stepper
        j = stepper.broke
        self.event("break", segment=j, arc=self.builder.thread_arc(j + 0.5),
                   pos=[float(v) for v in 0.5 * (state.x[j] + state.x[j + 1])], tension=stepper.broke_tension,
                   strength=rating(stepper.model))

    def tick(self, seq: int, paused: bool = False) -> tuple[int, int]:
        """Tick ``seq``: the solver step (none while ``paused``), the grasps' motion for the tick cleared, the
        watch's events, and unless ``publish`` is None each device's `force` (its flags OR its driver's) and,
        on its ticks, `state`. Returns (substeps, step time ns)."""
        self.seq = seq
        t_step = time.monotonic_ns()
        substeps = 0
        if not paused:
            try:
                substeps = self.stepper.tick()
            except SolverDivergence as exc:
                if self.on_divergence is None:
                    raise
                self.on_divergence(exc)
        step_ns = time.monotonic_ns() - t_step
        state = self.stepper.state
        state.grasp_vel.fill(0.0)  # the daemon's follow_styluses sets the grasps' motion for each tick afresh
        builder = self.builder
        if self.watching:
            t_watch = time.monotonic_ns()
            if self.stepper.broke >= 0:
                self._broke(state)
            # punctures, the wound's gap, throws; a slice of a knot or linking read on a tick that builds no
            # `state` message, when there are such ticks
            builder.watch.check(state, self.event, self.publish is None or reads_on(seq, self.state_every))
            self.watch_ns = time.monotonic_ns() - t_watch
        publish = self.publish
        if publish is None:
            return substeps, step_ns
        payloads = builder.forces(seq, state)
        if self.before_publish is not None:
            self.before_publish()
        for payload in payloads:
            publish(protocol.TOPIC_FORCE, payload)
        if seq % self.state_every == 0:
            publish(protocol.TOPIC_STATE, builder.state(seq, state))
        return substeps, step_ns
