"""The hands of a suture by hand in `suture-practice`, as two live styluses drive them through the physics loop:
the right tool picks the needle up a quarter of the way from its swage, sets it over the entry mark and drives it
tip first through both edges by turning the stylus; the left tool takes it near the tip where it came out (the
right lets go). Each hand computes its poses from what the server says: the needle's pose in the `state`, and the
pose the jaw holds it in from the `grasp` event.

Shared by tests/test_suture_by_hand.py (the whole suture in process) and tests/test_suture_by_hand_devices.py
(the start of it rehearsed here, every tick's tool poses recorded, then played by two emulated Touch devices)."""
from __future__ import annotations

import math

import numpy as np

from suturesim.server import protocol
from suturesim.solver.needle import NP_ARC, NP_RADIUS
from suturesim.tools.bench_bot_rate import InProcess, watching
# the tests' own too
from suturesim.tools.trainee_bot import (Q_BITE, UNIT, Trainee, qconj, qmul, rot, slerp,  # noqa: F401
                                         tie_overrides)

RIGHT, LEFT = "stylus0", "stylus1"
GRASP = 1
SETTLE_TICKS = 300       # the needle lies on the left pad
# a hand that has closed its jaw holds still this long before it moves on: a press that a loop running late sees
# late finds the jaw where it was pressed, and a handover is made before the other hand lets go
HOLD_TICKS = 50
# the needle set for the bite (Q_BITE), as simple-interrupted-suture sets it: its circle upright in the x-z plane,
# its centre 6.327 mm above the pads' top face, so that it meets the face 5 mm either side of the wound
CENTRE = np.array([0.0, 0.0, 0.0143908 - 0.0080643])


class Scene(InProcess):
    """The loop as the hands see it: what it published, and samples sent as the remote backend takes them
    (tools/bench_bot_rate.py InProcess).

    :param rest: device -> the tool's position (m) before its hand moves it (default: the scene's origin).
    :param overrides: merged over suture-practice (a perturbed needle).
    :param record: keep, for every tick, the pose each device was sent (``poses_sent``: one dict a tick, device
        -> (position m, quaternion w x y z, buttons), scene frame).
    """

    def __init__(self, rest: dict | None = None, record: bool = False, overrides: dict | None = None):
        super().__init__(overrides)
        self.radius = float(self.loop.model.needle_par[NP_RADIUS])
        self.arc = float(self.loop.model.needle_par[NP_ARC])
        rest = rest or {}
        self.poses = {d: (np.array(rest.get(d, (0.0, 0.0, 0.0)), float), UNIT.copy(), 0) for d in (RIGHT, LEFT)}
        self.poses_sent: list[dict] | None = [] if record else None

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            if self.poses_sent is not None:
                self.poses_sent.append({d: (p.copy(), q.copy(), b) for d, (p, q, b) in self.poses.items()})
            super().tick()

    def events(self, kind: str) -> list[dict]:
        return [m for t, p in self.out if t == protocol.TOPIC_EVENT
                for m in [protocol.decode_event(p)] if m["kind"] == kind]

    def forces(self, device: str) -> np.ndarray:
        """Every force published to ``device`` (N, scene frame), one row a tick."""
        return np.array([m["force"] for t, p in self.out if t == protocol.TOPIC_FORCE
                         for m in [protocol.decode_force(p)] if m["device"] == device])

    def needle(self) -> tuple[np.ndarray, np.ndarray]:
        """The needle's swage (m) and orientation, as the newest `state` says."""
        st = [protocol.decode_state(p) for t, p in self.out if t == protocol.TOPIC_STATE][-1]
        return np.array(st["needle"]["pos"]), np.array(st["needle"]["quat"])

    def arc_point(self, swage, q, theta: float) -> np.ndarray:
        return swage + rot(q, [self.radius * math.sin(theta), self.radius * (1 - math.cos(theta)), 0.0])


class Hand:
    """A hand that holds the needle and moves it where it wants it: the jaw's pose for a needle pose, from the
    pose in the jaw the `grasp` event gave."""

    def __init__(self, scene: Scene, device: str):
        self.scene, self.device = scene, device
        self.offset = self.q_rel = None

    def set(self, pos, quat, buttons: int = GRASP) -> None:
        self.scene.poses[self.device] = (np.asarray(pos, float), np.asarray(quat, float), buttons)

    def take_needle_at(self, theta: float, quat=(1.0, 0.0, 0.0, 0.0)) -> dict:
        swage, q = self.scene.needle()
        self.set(self.scene.arc_point(swage, q, theta), quat, 0)
        self.scene.tick()
        self.set(self.scene.arc_point(swage, q, theta), quat, GRASP)
        self.scene.tick()
        g = [e for e in self.scene.events("grasp") if e["device"] == self.device][-1]
        assert g["holds"] == "needle", g
        self.offset, self.q_rel = np.array(g["offset"]), np.array(g["q_rel"])
        return g

    def hold_needle_at(self, swage, q) -> None:
        """Put the jaw where the needle held in it is at ``swage`` turned ``q``: q_jaw = q q_rel^-1,
        p_jaw = swage - q_jaw r."""
        q_jaw = qmul(q, qconj(self.q_rel))
        self.set(np.asarray(swage) - rot(q_jaw, self.offset), q_jaw)

    def move_needle(self, swage, q, ticks: int) -> None:
        s0, q0 = self.scene.needle()
        for k in range(1, ticks + 1):
            s = k / ticks
            self.hold_needle_at(s0 + s * (np.asarray(swage) - s0), slerp(q0, q, s))
            self.scene.tick()

    def drive(self, phi0: float, phi1: float, ticks: int) -> None:
        """Turn the needle set for the bite about its circle's axis through its centre, tip first, from phi0 to
        phi1 (rad): the needle at q_bite rotz(phi), its swage at centre + q (0, -R, 0)."""
        for k in range(1, ticks + 1):
            phi = phi0 + (phi1 - phi0) * k / ticks
            q = qmul(Q_BITE, [math.cos(phi / 2), 0.0, 0.0, math.sin(phi / 2)])
            self.hold_needle_at(CENTRE + rot(q, [0.0, -self.scene.radius, 0.0]), q)
            self.scene.tick()


def set_for_bite(scene: Scene, right: Hand, theta: float) -> dict:
    """``right`` takes the needle at ``theta`` (rad from the swage), lifts it 2 cm, stands it upright over the
    entry mark and sets it down, its tip 0.6 mm above the mark; returns the `grasp` event."""
    g = right.take_needle_at(theta)
    scene.tick(HOLD_TICKS)
    swage, q = scene.needle()
    right.move_needle(swage + [0.0, 0.0, 0.02], q, 400)                           # lift it 2 cm
    start = CENTRE + rot(Q_BITE, [0.0, -scene.radius, 0.0])
    right.move_needle(start + [0.0, 0.0, 0.01], Q_BITE, 1200)                     # over the entry mark, upright
    right.move_needle(start, Q_BITE, 400)                                         # down: the tip 0.6 mm above it
    scene.tick(200)
    return g


def start_of_suture(scene: Scene, settle: int = SETTLE_TICKS, theta: float = 0.0, approach=None) -> dict:
    """The start of a suture: after ``settle`` ticks, the right hand (coming from ``approach``, m from the
    needle's point it takes, over 300 ticks, if given) picks the needle up at ``theta`` (rad from the swage, a
    quarter of the arc if 0), lifts it, sets it upright over the entry mark and drives it through both edges; the left hand takes it
    halfway between where it comes out of the tissue and its tip (the right lets go of it) and, HOLD_TICKS later,
    the right hand withdraws.
    Returns the hands, the right hand's `grasp` event, the tick its hand first moved (``start_tick``), the
    punctures before the drive (``early``) and the arc angle the left hand took the needle at."""
    scene.tick(settle)
    right, left = Hand(scene, RIGHT), Hand(scene, LEFT)
    start_tick = scene.ticks
    theta = theta or scene.arc / 4.0              # 101 degrees behind the tip: room for the bite
    if approach is not None:
        swage, q = scene.needle()
        at = scene.arc_point(swage, q, theta)
        for k in range(300):                      # the jaw comes to the needle, open
            right.set(at + np.asarray(approach) * (1.0 - (k + 1) / 300.0), UNIT, 0)
            scene.tick()
    g = set_for_bite(scene, right, theta)
    early = scene.events("puncture")
    right.drive(0.0, math.radians(100.0), 2500)                                   # through both edges
    scene.tick(300)
    # the left hand takes the needle halfway between where it comes out of the tissue and its tip, as it sees
    # it: the right lets go of it
    swage, q = scene.needle()
    thetas = np.linspace(scene.arc, 0.0, 400)
    out = next(k for k, th in enumerate(thetas) if scene.arc_point(swage, q, th)[2] < 0.0)
    tip_theta = 0.5 * (scene.arc + thetas[out])
    assert scene.arc - tip_theta > math.radians(3.0)                               # a few mm of it are out
    left.take_needle_at(tip_theta, qmul(Q_BITE, [math.cos(0.75), 0.0, 0.0, math.sin(0.75)]))
    scene.tick(HOLD_TICKS)
    right.set(scene.poses[RIGHT][0] + [0.03, 0.0, 0.03], scene.poses[RIGHT][1], 0)   # the right hand withdraws
    return {"right": right, "left": left, "grasp": g, "start_tick": start_tick, "early": early,
            "tip_theta": tip_theta}


def trainee_in_process(seed: int = 0, overrides: dict | None = None,
                       tie: str = "instrument") -> tuple[Scene, Trainee]:
    """`suture-practice` (``overrides`` merged over it) as `suturesim bench bot` runs it (its own tools for an
    instrument tie, both devices hands and friction started cold for a hand ``tie``: trainee_bot.tie_overrides),
    and the trainee bot of ``seed`` looking at it: drive its ``plan`` with tools/bench_bot_rate.py :func:`drive`."""
    scene = Scene(overrides={**(overrides or {}), **tie_overrides(tie)} or None)
    return scene, watching(scene, seed, tie)
