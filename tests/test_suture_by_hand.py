"""The start of a suture by hand in `suture-practice`, through the physics loop as two live styluses drive it: the
right tool picks the needle up a quarter of the way from its swage, sets it over the entry mark and drives it
tip first through both edges by turning the stylus; the left tool takes it near the tip where it came out (the
right lets go) and draws it on along its curve. Each hand computes its poses from what the server says: the
needle's pose in the `state`, and the pose the jaw holds it in from the `grasp` event."""
from __future__ import annotations

import math

import numpy as np
import pytest

from suturesim.server import protocol
from suturesim.server.config import DeviceConfig, ServerConfig
from suturesim.server.physics import PhysicsLoop
from suturesim.solver.needle import NP_ARC, NP_RADIUS, NP_WIRE
from suturesim.solver.scenario import load_scenario

RIGHT, LEFT = "stylus0", "stylus1"
GRASP = 1
C45 = math.sqrt(0.5)
# the needle set for the bite, as simple-interrupted-suture sets it: its circle upright in the x-z plane, its
# centre 6.327 mm above the pads' top face, so that it meets the face 5 mm either side of the wound
Q_BITE = np.array([0.0, 0.0, C45, -C45])
CENTRE = np.array([0.0, 0.0, 0.0143908 - 0.0080643])


def qmul(a, b) -> np.ndarray:
    a0, a1, a2, a3 = a
    b0, b1, b2, b3 = b
    return np.array([a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3, a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
                     a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1, a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0])


def qconj(q) -> np.ndarray:
    return np.array([q[0], -q[1], -q[2], -q[3]])


def rot(q, v) -> np.ndarray:
    return qmul(qmul(q, [0.0, *v]), qconj(q))[1:]


def slerp(a, b, s: float) -> np.ndarray:
    d = float(np.dot(a, b))
    if d < 0.0:
        b, d = -np.asarray(b), -d
    if d > 0.9995:
        q = a + s * (b - a)
        return q / np.linalg.norm(q)
    th = math.acos(d)
    return (math.sin((1 - s) * th) * np.asarray(a) + math.sin(s * th) * np.asarray(b)) / math.sin(th)


class Scene:
    """The loop as the hands see it: what it published, and samples sent as the remote backend takes them."""

    def __init__(self, overrides: dict | None = None):
        self.out: list[tuple[bytes, bytes]] = []
        devices = tuple(DeviceConfig(name=d, backend="remote") for d in (RIGHT, LEFT))
        cfg = ServerConfig(file="<test>", scenario=load_scenario("suture-practice", overrides), devices=devices)
        self.loop = PhysicsLoop(cfg, sink=lambda topic, payload: self.out.append((topic, bytes(payload))))
        self.radius = float(self.loop.model.needle_par[NP_RADIUS])
        self.arc = float(self.loop.model.needle_par[NP_ARC])
        self.poses = {RIGHT: (np.zeros(3), np.array([1.0, 0, 0, 0]), 0), LEFT: (np.zeros(3), np.array([1.0, 0, 0, 0]), 0)}

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            for device, (pos, quat, buttons) in self.poses.items():
                self.loop.stylus_sample(self.loop.devices[device], pos, quat, buttons)
            self.loop.seq += 1
            self.loop.tick_scene(0)

    def events(self, kind: str) -> list[dict]:
        return [m for t, p in self.out if t == protocol.TOPIC_EVENT
                for m in [protocol.decode_event(p)] if m["kind"] == kind]

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


def suture_start(scene: Scene, theta: float = 0.0, approach=(0.0, 0.0, 0.0)) -> None:
    """The start of a suture by hand in ``scene``, asserting each step: the right hand comes from ``approach``
    (m, from the needle's point it takes) to the needle, takes it at ``theta`` (rad, a quarter of the arc if 0)
    from the swage, sets it over the entry mark and bites through both edges; the left takes it near the tip and
    draws it out. Each hand reads the needle from the `state` and its pose in the jaw from the `grasp` event."""
    scene.tick(300)                                      # the needle lies on the left pad
    right, left = Hand(scene, RIGHT), Hand(scene, LEFT)
    theta = theta or scene.arc / 4.0                     # 101 degrees behind the tip: room for the bite
    swage, q = scene.needle()
    at = scene.arc_point(swage, q, theta)
    for k in range(300):                                 # the jaw comes to the needle, open
        right.set(at + np.asarray(approach) * (1.0 - (k + 1) / 300.0), (1.0, 0.0, 0.0, 0.0), 0)
        scene.tick()
    g = right.take_needle_at(theta)
    assert g["arc"] == pytest.approx(theta, abs=1e-3)    # the state it aimed by is up to 10 ms old
    swage, q = scene.needle()
    right.move_needle(swage + [0.0, 0.0, 0.02], q, 400)                           # lift it 2 cm
    start = CENTRE + rot(Q_BITE, [0.0, -scene.radius, 0.0])
    right.move_needle(start + [0.0, 0.0, 0.01], Q_BITE, 1200)                     # over the entry mark, upright
    right.move_needle(start, Q_BITE, 400)                                         # down: the tip 0.6 mm above it
    scene.tick(200)
    assert not scene.events("puncture")
    right.drive(0.0, math.radians(100.0), 2500)                                   # through both edges
    scene.tick(300)
    punctures = [(e["pad"], e["side"]) for e in scene.events("puncture")]
    assert punctures == [("left", "entry"), ("left", "exit"), ("right", "entry"), ("right", "exit")], punctures
    entry = np.array(scene.events("puncture")[0]["pos"])
    assert np.linalg.norm(entry[:2] - [-0.005, 0.0]) < 1.5e-3                     # at the entry mark
    # the left hand takes the needle halfway between where it comes out of the tissue and its tip, as it sees
    # it: the right lets go of it
    swage, q = scene.needle()
    thetas = np.linspace(scene.arc, 0.0, 400)
    out = next(k for k, th in enumerate(thetas) if scene.arc_point(swage, q, th)[2] < 0.0)
    tip_theta = 0.5 * (scene.arc + thetas[out])
    assert scene.arc - tip_theta > math.radians(3.0)                               # a few mm of it are out
    left.take_needle_at(tip_theta, qmul(Q_BITE, [math.cos(0.75), 0.0, 0.0, math.sin(0.75)]))
    assert [(e["device"], e["holds"]) for e in scene.events("release")][-1] == (RIGHT, "needle")
    right.set(scene.poses[RIGHT][0] + [0.03, 0.0, 0.03], scene.poses[RIGHT][1], 0)   # the right hand withdraws
    # and draws the needle on along its curve, out of both edges
    swage, q = scene.needle()
    rel = qmul(qconj(Q_BITE), q)                                                   # rotz(phi), or its negative
    phi = math.remainder(2.0 * math.atan2(rel[3], rel[0]), 2.0 * math.pi)
    left.drive(phi, math.radians(235.0), 3000)
    swage, q = scene.needle()
    left.move_needle(swage + [0.03, 0.0, 0.03], q, 1000)                          # up and out to the right
    scene.tick(300)
    swage, q = scene.needle()
    assert swage[2] > 0.01 and swage[0] > 0.01                                      # the swage is out, right side
    through = [e for e in scene.events("thread_through")]
    assert through, "the thread follows the needle through the punctures"
    # the forces on both hands stayed bounded and continuous
    for device in (RIGHT, LEFT):
        f = np.array([m["force"] for t, p in scene.out if t == protocol.TOPIC_FORCE
                      for m in [protocol.decode_force(p)] if m["device"] == device])
        slew = scene.loop.cfg.safety.max_slew_n_per_s * scene.loop.cfg.loop.tick_s
        assert np.linalg.norm(f, axis=1).max() <= scene.loop.cfg.safety.max_force_n + 1e-9
        assert np.linalg.norm(np.diff(f, axis=0), axis=1).max() <= slew * 1.0001




@pytest.mark.long(cost=10)
def test_a_hand_picks_up_the_needle_drives_it_through_both_edges_and_the_other_hand_takes_it_at_the_tip():
    suture_start(Scene())


@pytest.mark.long(cost=10)
@pytest.mark.parametrize("seed", range(4))
def test_the_suture_start_from_a_perturbed_needle_and_hands(seed):
    """The needle lies elsewhere on the pad, turned; the right hand comes from elsewhere and takes the needle
    at another point of its arc: the hands, reading where it is, bite through both edges and draw it out."""
    rng = np.random.default_rng(seed)
    yaw = math.radians(rng.uniform(-25.0, 25.0))
    start = [-0.016 + rng.uniform(-0.004, 0.004), -0.012 + rng.uniform(-0.004, 0.004), 0.0004]
    scene = Scene({"shape": {"start": start},
                   "needle": {"orientation": [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]}})
    suture_start(scene, scene.arc * rng.uniform(0.2, 0.3), rng.uniform(-0.03, 0.03, 3) + [0.0, 0.0, 0.03])


def _sample(device: str, seq: int, pos, quat, buttons: int) -> bytes:
    import msgpack
    return msgpack.packb({"device": device, "seq": seq, "t": seq * 1e-3, "pos": [float(v) for v in pos],
                          "quat": [float(v) for v in quat], "buttons": int(buttons)}, use_bin_type=True)


@pytest.mark.long(cost=30)
def test_a_session_by_hand_on_the_server_resimulates_exactly(tmp_path, subscribe):
    """`serve` of suture-practice with two remote styluses, recorded: the right jaw takes the needle a third of
    the way along its arc and turns it, clutches, moves on; the left takes the thread mid-segment and pulls; both
    let go. The recording resimulates exactly: the needle's pose in the jaw (from the `grasp` event), the
    point along the segment and the clutch are followed, and every force and state is the same."""
    import subprocess
    import sys
    import time

    from conftest import Daemon, push_socket

    out = tmp_path / "by-hand.mcap"
    d = Daemon("--scenario", "suture-practice", "--device", "remote", "--record", str(out))
    try:
        d.wait_serving()
        sub = subscribe(d, (protocol.TOPIC_STATE, protocol.TOPIC_EVENT))
        time.sleep(0.5)
        st = sub.next_state()
        swage, q = np.array(st["needle"]["pos"]), np.array(st["needle"]["quat"])
        r, arc = st["needle"]["radius"], st["needle"]["arc"]
        th = arc / 3.0
        jaw = swage + rot(q, [r * math.sin(th), r * (1 - math.cos(th)), 0.0])
        x = np.asarray(st["x"], float).reshape(-1, 3)
        point = 0.5 * (x[40] + x[41])
        push = push_socket(d, linger_ms=1000)
        turn = [math.cos(0.25), 0.0, math.sin(0.25), 0.0]          # 30 degrees about y
        one = np.array([1.0, 0.0, 0.0, 0.0])
        plan = []                                         # (right pos, right quat, right buttons, left pos, left buttons)
        for k in range(2400):
            s = min(1.0, max(0.0, (k - 400) / 600.0))         # 0.4-1.0 s: lift 2 cm and turn
            rq = slerp(one, turn, s)
            rp = jaw + [0.0, 0.0, 0.02 * s]
            rb = 0 if k < 200 else (1 if k < 1200 or k >= 1500 else 3)   # 1.2-1.5 s: clutched
            if k >= 1200:
                rp = rp + [0.01 * min(1.0, (k - 1200) / 300.0), 0.0, 0.0]   # moved while clutched, then on
            if k >= 2100:
                rb = 0
            lp = point + [0.0, 0.01 * min(1.0, max(0.0, (k - 600) / 600.0)), 0.001]
            lb = 1 if 300 <= k < 2000 else 0
            plan.append((rp, rq, rb, lp, lb))
        t0 = time.monotonic()
        for k, (rp, rq, rb, lp, lb) in enumerate(plan):
            push.send(_sample(RIGHT, k, rp, rq, rb))
            push.send(_sample(LEFT, k, lp, one, lb))
            wait = t0 + (k + 1) * 1e-3 - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        time.sleep(0.5)
        push.close()
    finally:
        d.close()
    cli = [sys.executable, "-m", "suturesim.server.cli"]
    done = subprocess.run([*cli, "export", str(out), "--csv", str(tmp_path / "csv"), "--topics", "event"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    events = (tmp_path / "csv" / "events.csv").read_text()
    for what in ('""holds"":""needle""', '""holds"":""thread""', '""frac""', "clutch", "release"):
        assert what in events, (what, events)
    done = subprocess.run([*cli, "replay", str(out), "--to", "resimulate"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "EXACT" in done.stdout, done.stdout


@pytest.mark.long(cost=8)
def test_a_needle_let_go_in_the_air_falls_and_rests_on_the_tissue():
    scene = Scene()
    scene.tick(300)
    right = Hand(scene, RIGHT)
    right.take_needle_at(scene.arc / 4.0)
    swage, q = scene.needle()
    right.move_needle(swage + [0.0, 0.0, 0.02], q, 400)
    right.set(scene.poses[RIGHT][0], scene.poses[RIGHT][1], 0)        # opened 2 cm above the pad
    scene.tick(1500)
    assert [e["holds"] for e in scene.events("release")] == ["needle"]
    swage, q = scene.needle()
    wire = float(scene.loop.model.needle_par[NP_WIRE])
    # flat on the pad's top face: its swage and its tip a wire's radius above it
    assert abs(swage[2] - wire) < 1e-4 and abs(scene.arc_point(swage, q, scene.arc)[2] - wire) < 1e-4, swage
