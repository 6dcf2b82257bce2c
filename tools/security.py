"""The knot security test (docs/ASSESSMENT.md Sec. 5): after the task, the thread's two ends are pulled apart
with a set tension and the knot's slip measured, as the FLS's examiner pulls a knot's tails to see whether it
slips.

The test runs on a :class:`~suturesim.server.physics.PhysicsLoop` whose state is where the task left it: a
recording resimulated to its end (:func:`security_of_recording`, ``suturesim score F.mcap --security``), or a
scene built to be tested (the four bends of :func:`bend_security`, the test's validation). Every hand lets go,
the instruments leave the field and whatever is left of a scripted scene's timeline is ended. Two couplings take
the thread's ends, each with ``tension`` as its force limit, and their targets run at ``PULL_SPEED`` straight away
from the knot (the mean of the vertices pressed against another strand; a bend's standing parts: along the line
they leave it on), so each coupling pulls with exactly ``tension`` once its strand is taut (the couplings
saturate). The slip is how much
further from the knot the two ends are at the end of the hold than ``SETTLE_S`` after both couplings first
reached the tension: the thread that ran through the knot, and the knot reseating under the new load. The verdict
is the bend test's at a suture's scale (docs/PHYSICS.md): a knot still moving by more than ``HOLDS_MM`` over the
hold's last ``CREEP_S`` slips; one whose ends ran ``UNDONE_MM`` apart came undone. The wound's gap under that
load, and whether the scene reads it closed, come from the scene's own `state` and events: a knot that does not
keep the wound closed under the load holds nothing ("opens").
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Callable

import numpy as np

from ..server import protocol
from ..server.assessment import SECURITY_CREEP_S as CREEP_S, Security
from ..solver.instruments import TC_TOUCH

PULL_SPEED = 0.05         # m/s: the targets' run-away speed, far above any slip: the couplings stay saturated
STIFFNESS = 1000.0        # N/m, a stylus's coupling (as the scenes' grasps)
DAMPING = 0.5             # N s/m
SETTLE_S = 0.5            # s after both ends first reach the tension, from which the slip is counted
HOLD_S = 5.0              # s of the hold: a knot reseats under a new load for a few seconds (the scripted
                          # suture's surgeon's knot: 2-3 mm over 3 s at 1 N, then under 0.2 mm a second)
TAUT_WITHIN_S = 4.0       # s: the ends' slack must be taken up by then (40 cm in all at PULL_SPEED)
TAUT_FRACTION = 0.95      # a coupling at 95 % of its limit has reached the tension
HOLDS_MM = 1.0            # mm over the last CREEP_S: more and the knot is slipping (docs/PHYSICS.md's bend test)
UNDONE_MM = 20.0          # mm: the ends that much further apart than at the tension: a suture's 2 cm tail pulled out
SECURITY_TENSION_N = 1.0  # N a side by default, as the thesis's bend test pulls each standing part


class _Watch:
    """What the loop publishes during the pull: the newest gap and knot (a sink for PhysicsLoop)."""

    def __init__(self, knot: str | None, gap: float | None, closed: bool | None = None):
        self.knot, self.gap, self.closed = knot, gap, closed

    def __call__(self, topic: bytes, payload: bytes) -> None:
        if topic == protocol.TOPIC_EVENT:
            ev = protocol.decode_event(payload)
            kind = ev.get("kind")
            if kind == "knot":
                self.knot = ev.get("name")
            elif kind in ("gap_closed", "gap_opened"):    # the scene's own reading, with its hysteresis
                self.closed = kind == "gap_closed"
        elif topic == protocol.TOPIC_STATE:
            gap = (protocol.decode_state(payload).get("tissue") or {}).get("gap")
            if gap is not None:
                self.gap = float(gap)


def pull_apart(loop, a: int, b: int, tension: float = SECURITY_TENSION_N, hold_s: float = HOLD_S,
               knot: str | None = None, gap: float | None = None, closed: bool | None = None,
               undone_mm: float = UNDONE_MM, directions: tuple | None = None) -> Security:
    """The security test on ``loop``'s scene as it stands: every grasp let go, vertices ``a`` and ``b`` pulled
    away from the knot with ``tension`` (N) each, held ``hold_s`` s after the knot has settled at it. ``knot``,
    ``gap`` (m), ``closed``: the scene's last reading of the knot and the wound before the pull, if known;
    ``undone_mm``: how far the ends may run apart before a tail has pulled out (its length); ``directions``: the
    unit vectors to pull ``a`` and ``b`` along, if not away from the knot. Returns the outcome (module
    docstring)."""
    check_tension(tension)
    st = loop.state
    n = st.x.shape[0] - 1
    if not (0 <= a <= n and 0 <= b <= n and a != b):
        raise ValueError(f"ends must be two vertices in 0..{n}, got {a}, {b}")
    watch = _Watch(knot, gap, closed)
    before = watch.knot
    sink = loop.sink
    loop.sink = _chain(sink, watch)
    try:
        for g in list(loop.grasps):
            loop.remove_grasp(g.id)
        # the scenario's script is over: what is left of its timeline (a hand's move, a release by grasp slot,
        # which would let go of the test's couplings in the slots the hands had) is ended, in place (the
        # stepper holds these arrays)
        loop.model.mot_t0[:] = -1.0
        loop.model.mot_t1[:] = -1.0
        # the instruments leave the field, as an examiner's hands take the ends: no stylus input any more, and no
        # tool body for the strands to catch on
        loop.replay = None
        for dev in loop.devices:
            dev.has_quat = False
        st.tool_cap[:, TC_TOUCH] = 0.0
        c = knot_centre(st.x, loop.model.contact.distance, loop.model.contact.exclude)
        ua, ub = (_away(st.x[a], c), _away(st.x[b], c)) if directions is None else \
            (_unit(np.asarray(directions[0], float)), _unit(np.asarray(directions[1], float)))
        ga = loop.add_grasp(a, None, "security_a", STIFFNESS, DAMPING, tension)
        gb = loop.add_grasp(b, None, "security_b", STIFFNESS, DAMPING, tension)
        tick = loop.model.solver.tick
        t0 = float(st.time[0])
        taut_at: float | None = None
        sep0: float | None = None
        rows: list[tuple[float, float]] = []
        end = t0 + TAUT_WITHIN_S
        while float(st.time[0]) < end - 0.5 * tick:
            # the targets' motion for this tick (the scene's tick clears it after each, as for a stylus)
            st.grasp_vel[ga.slot] = PULL_SPEED * ua
            st.grasp_vel[gb.slot] = PULL_SPEED * ub
            loop.seq += 1
            loop.tick_scene(0)
            t = float(st.time[0]) - t0
            sep = float(np.linalg.norm(st.x[a] - c) + np.linalg.norm(st.x[b] - c))
            if taut_at is None:
                fa = float(np.linalg.norm(st.grasp_force[ga.slot]))
                fb = float(np.linalg.norm(st.grasp_force[gb.slot]))
                if min(fa, fb) >= TAUT_FRACTION * tension:
                    taut_at, sep0 = t, sep
                    end = t0 + t + SETTLE_S + hold_s
            elif sep - sep0 > undone_mm * 1e-3:
                rows.append((t, sep))
                break
            rows.append((t, sep))
        r = np.array(rows)
        if taut_at is None:
            # never taut: either slack left at the end of the window, or the ends still running apart in its last
            # second, nothing resisting: the knot pulling through
            last_s = float(np.interp(r[-1, 0] - 1.0, r[:, 0], r[:, 1]))
            outcome = "undone" if float(r[-1, 1]) - last_s > undone_mm * 1e-3 else "slack"
            return Security(tension, (a, b), outcome, None, None, None, hold_s, _mm(watch.gap), watch.closed,
                            before, watch.knot)
        # the hold runs from SETTLE_S after both ends first pulled the tension; a knot pulled through before then
        # is measured from that moment instead, over the time it took
        start = taut_at + SETTLE_S if float(r[-1, 0]) >= taut_at + SETTLE_S else taut_at
        settled = float(np.interp(start, r[:, 0], r[:, 1]))
        slip = float(r[-1, 1]) - settled
        held = float(r[-1, 0]) - start
        creep = float(r[-1, 1]) - float(np.interp(r[-1, 0] - min(CREEP_S, held), r[:, 0], r[:, 1]))
        undone = float(r[:, 1].max()) - sep0 > undone_mm * 1e-3
        # a wound that is not closed under the load (opened by it, or never closed) is not held by this knot
        opened = watch.gap is not None and watch.closed is not True
        outcome = "undone" if undone else "opens" if opened else "slips" if creep * 1e3 > HOLDS_MM else "holds"
        return Security(tension, (a, b), outcome, 1e3 * slip, 1e3 * creep, taut_at, held, _mm(watch.gap),
                        watch.closed, before, watch.knot)
    finally:
        loop.sink = sink


def check_tension(tension: float) -> None:
    """Raise ValueError unless ``tension`` (N) is one a stylus's coupling can pull with: in (0, 3]."""
    if not 0.0 < tension <= 3.0:
        raise ValueError(f"the pull must be in (0, 3] N a side (a stylus's coupling), got {tension:g}")


def knot_centre(x: np.ndarray, distance: float, exclude: int) -> np.ndarray:
    """Where the knot is (m): the mean of the vertices of ``x`` (n+1, 3) within two contact ``distance`` of a
    vertex more than ``exclude`` + 2 along the thread from them (strands pressed together), or of every
    vertex if none is."""
    d = np.linalg.norm(x[:, None, :] - x[None, :, :], axis=2)
    i, j = np.indices(d.shape)
    d[np.abs(i - j) <= exclude + 2] = np.inf
    close = d.min(axis=1) < 2.0 * distance
    return x[close].mean(axis=0) if close.any() else x.mean(axis=0)


def _unit(u: np.ndarray) -> np.ndarray:
    """``u`` made a unit vector (up, +z, if it is too short to have a direction)."""
    n = float(np.linalg.norm(u))
    return u / n if n > 1e-9 else np.array([0.0, 0.0, 1.0])


def _away(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The unit vector from ``c`` to ``p``."""
    return _unit(p - c)


def _mm(gap: float | None) -> float | None:
    return None if gap is None else 1e3 * gap


def _chain(first, second) -> Callable[[bytes, bytes], None]:
    def sink(topic: bytes, payload: bytes) -> None:
        if first is not None:
            first(topic, payload)
        second(topic, payload)
    return sink


# -- on a recording ---------------------------------------------------------------------------------------
def security_of_recording(path: str, tension: float = SECURITY_TENSION_N, hold_s: float = HOLD_S,
                          progress: bool = False) -> Security:
    """The security test at the end of the recording ``path``: its session resimulated to the last tick
    (tools/replay.py), then the thread's two ends (vertex 0, the needle's swage or the first end, and the last
    vertex, the tail) pulled apart. Raises RecordingError when the recording cannot be resimulated."""
    from ..server.recording import RecordingError
    from .replay import resimulate

    check_tension(tension)          # before the resimulation, which may be long
    seen = _Watch(None, None)
    report = resimulate(path, progress=progress, watch=seen,
                        after=lambda loop: pull_apart(loop, 0, loop.state.x.shape[0] - 1, tension, hold_s,
                                                      knot=seen.knot, gap=seen.gap, closed=seen.closed))
    if report.stopped:
        raise RecordingError(f"{path}: cannot resimulate to its end ({report.stopped})")
    return report.after


# -- validated on the four bends -------------------------------------------------------------------------
BEND_KINDS = ("reef", "granny", "grief", "thief")


def bend_loop(kind: str, mu: float, scene: str = "reef-knot"):
    """A PhysicsLoop on configs/scenarios/``scene``.yaml's bend ``kind`` at friction ``mu`` (static = kinetic),
    its hands and timeline taken out: the knot as tied, for :func:`pull_apart` to pull by the standing parts.
    Returns (loop, (a, b), (ua, ub)): the standing parts' vertices and the directions the scene's own hands pull
    them along (the line the standing parts leave the knot on, as the thesis's test pulls them)."""
    from ..server.config import ServerConfig
    from ..server.physics import PhysicsLoop
    from ..solver.scenario import build_scenario
    from .validate_contact import bend_scenario

    sc, corners = bend_scenario(kind, mu, scene=scene)
    pulls = {e["grasp"]: e["velocity"] for e in sc.source["timeline"] if "velocity" in e}
    held_by = {g.vertex: g.id for g in sc.grasps}
    dirs = tuple(_unit(np.asarray(pulls[held_by[v]], float)) for v in corners)
    src = dict(sc.source)
    src["timeline"] = []
    src["boundary"] = {**(src.get("boundary") or {}), "grasps": []}
    src.pop("devices", None)
    scenario = build_scenario(src, f"{scene}.yaml ({kind}, mu {mu:g})")
    cfg = replace(ServerConfig(file="<security>"), scenario=scenario, device="simulated")
    return PhysicsLoop(cfg, sink=lambda topic, payload: None), corners, dirs


def bend_security(kind: str, mu: float, tension: float = SECURITY_TENSION_N, hold_s: float = HOLD_S,
                  scene: str = "reef-knot") -> Security:
    """The security test on a bend of ``kind`` at friction ``mu``: its standing parts pulled apart."""
    loop, (a, b), dirs = bend_loop(kind, mu, scene)
    try:   # undone once the ends have run apart by the bend's tail: a tail has pulled out of the knot
        return pull_apart(loop, a, b, tension, hold_s, knot=kind, directions=dirs,
                          undone_mm=1e3 * float(loop.scenario.source["shape"]["tail"]))
    finally:
        loop.close()


def critical_mu(kind: str, start: float = 0.9, step: float = 0.05, tension: float = SECURITY_TENSION_N,
                log: Callable[[str], None] | None = None, scene: str = "reef-knot"
                ) -> tuple[float | None, list[tuple[float, Security]]]:
    """The thesis's ladder: friction lowered from ``start`` in ``step`` until the bend dissolves (the test's
    "undone": its ends pulled through); the lowest mu at which it did not (None: not even at ``start``) and
    every rung. A bend that slips a few millimetres and holds has not dissolved."""
    rungs, held = [], None
    k = 0
    while True:
        mu = round(start - k * step, 4)
        if mu < -1e-9:
            break
        s = bend_security(kind, mu, tension, scene=scene)
        rungs.append((mu, s))
        if log:
            log(f"{kind} mu {mu:.2f}: {s.line()}")
        if s.outcome in ("undone", "slack"):
            break
        held = mu
        k += 1
    return held, rungs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suturesim.tools.security",
                                description="The knot security test's validation: each bend's critical friction "
                                            "(1 N a side, friction lowered in steps until the knot fails) and its "
                                            "slip at a suture's friction.")
    p.add_argument("--kinds", default=",".join(BEND_KINDS), help="bends, comma-separated (default: all four)")
    p.add_argument("--start", type=float, default=0.9, help="the ladder's first friction (default 0.9)")
    p.add_argument("--step", type=float, default=0.05, help="the ladder's step (default 0.05)")
    p.add_argument("--suture-mu", type=float, default=0.3, help="a suture's friction for the slip column "
                                                                "(default 0.3, silk-3-0's static)")
    p.add_argument("--scene", default="reef-knot", choices=("reef-knot", "reef-knot-suture"),
                   help="the bends' scene: the thesis's 1 m thread (default) or 3-0 silk at a suture's scale")
    args = p.parse_args(argv)
    rows = []
    for kind in args.kinds.split(","):
        held, rungs = critical_mu(kind, args.start, args.step, scene=args.scene,
                                  log=lambda s: print(s, file=sys.stderr, flush=True))
        at = next((s for mu, s in rungs if abs(mu - args.suture_mu) < 1e-9), None) or \
            bend_security(kind, args.suture_mu, scene=args.scene)
        rows.append((kind, held, at))
    print(f"| bend | lowest mu not undone (1 N a side, steps of {args.step:g}) | at mu {args.suture_mu:g}: outcome, "
          "slip (mm) |")
    print("|---|---|---|")
    for kind, held, at in rows:
        slip = "n/a" if at.slip_mm is None else f"{at.slip_mm:.2f}"
        print(f"| {kind} | {'none' if held is None else f'{held:.2f}'} | {at.outcome}, {slip} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
