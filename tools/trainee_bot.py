"""A trainee bot: a client of the public protocol alone that sutures `suture-practice` by hand on a running
`suturesim serve --device remote`.

It reads the `state` and `event` topics as a person watches the screen, and sends two styluses' poses,
orientations and buttons on the stylus socket at 1 kHz, in the scene frame (docs/PROTOCOL.md Sec. 4). No step
is scheduled on a clock: each motion starts when the one before it ends and is computed, as it starts, from what
the bot has read (the needle's pose, the marks, where the thread's tail lies, the pose the jaw holds the needle
in from the `grasp` event); a step that waits for the server (a jaw closing) waits for its event, and one whose
outcome the server's events do not show (four punctures, the thread through) ends the run. Its motions keep pace
with the scene it sees: its plan runs at most LEAD_S ahead of the newest `state`'s scene time, so a server running
late finds the hands holding still for it (counted in the report's ``waited_ticks``), as a person waits for a
screen that has stopped. The bot's own start poses, the point of the arc it takes the needle at, its approach
and the pace of each motion are drawn from ``--seed``.

The suture, hand by hand (stylus0 the right hand's needle driver, stylus1 the left hand's forceps):

1. the right hand comes to the needle lying on the pad and takes it a fifth to three tenths of the way from the
   swage;
   lifts it, sets it upright over the entry mark and drives it tip first through both edges by turning the
   stylus about the needle's axis;
2. the left hand takes the needle halfway between where it comes out and its tip, the right lets go; the left
   turns it on along its curve and draws it up and out, pulling the thread through both edges;
3. the tie, one of two:

   a. an instrument tie (``--tie instrument``, the default; the scene's tools). The left hand draws the needle's
      strand out until 30 mm of tail is left. A surgeon's double throw: the left hand winds the needle's strand
      2.5 times round the needle driver's jaw, laid over the exit side; the jaw reaches for the tail's very end
      and takes it; the needle hand holds the swage just past the jaw's tip while the jaw is drawn back along its
      axis, so the wraps slide off one at a time onto the tail; each end is pulled to its own side, and the
      driver lets go. Then the opposite single throw, grab first: the jaw takes the tail's end where it has come
      to rest, lined up along the tail, and carries it up, over by the far side (+v) to the tail's side and down
      to where it lay for the first throw, and holds it there while the tail stops swinging; the needle's strand
      is wound 1.5 times round it the other way; the jaw is drawn back through the wrap, and the ends are pulled
      crossed (the tail to the exit side), the knot kept over the wound by eye, held and eased (a surgeon's knot);
   b. a hand tie (``--tie hand``; serve the scene with both devices ``tool: hand`` and ``contact.warm_friction``
      false, as :func:`perturbed_practice` writes it): the right hand takes the
      thread near its tail and brings it across; a surgeon's double throw (the tail carried round the needle's
      strand and through the loop twice), pulled along the tissue until the wound closes; then the opposite
      single throw, pulled with the hands crossed;
4. both hands let go, and the bot watches the knot for ``--watch`` seconds.

The instrument tie is tied as a person ties it looking at the screen: each throw is the one the knot the server
reads calls for (no knot: the double throw; the double throw: the opposite throw; a surgeon's knot: let go).
Each throw is looked at twice: drawn through, the hands hold still until the server reads the knot the throw
makes, and pull only then (a throw that missed, pulled tight, can undo the one before it); cinched and held, it
must still read so. A throw that fails either look (it slipped off the jaw, or undid the throw before it) is
followed by the driver letting go of the tail and rising clear and the thread settling, and then by the throw
the knot now read calls for, from where the thread lies: TIE_THROWS throws in all. A surgeon's knot read only
once a throw that failed was let go was tied but never pulled tight: the jaw takes the tail's end again and the
ends are pulled crossed. A half knot or another knot no throw mends ends the run. The report's ``redone`` lists
each throw that failed and was followed by another.

The throws' paths are those a person makes, set from the wound's centre (the marks' midpoint, as read) when each
throw starts, and from where the tail's end lies when the jaw reaches for it. A hand tie needs hands (no body
the thread meets: the tail is carried through a loop in the hand that holds it, and a needle driver's shaft would
stay in the loop); an instrument tie needs the needle driver's jaw for the thread to be wound round
(docs/HAPTICS.md Sec. 8).

Run: ``python -m suturesim.tools.trainee_bot --pub tcp://127.0.0.1:5555 --stylus tcp://127.0.0.1:5557 --seed 3``;
it prints one JSON line: what the server's events said (punctures, knots, the wound), whether each step was
done, and the bot's own CPU time over its wall time (its share of a core).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import msgpack
import numpy as np
import zmq

from ..server import protocol

RIGHT, LEFT = "stylus0", "stylus1"
GRASP = 1                          # the grasp button (first Touch button); both hands leave the clutch alone
TICK = 1e-3                        # s: the bot sends both styluses' samples every tick
# s: how far its plan may run ahead of the scene time it last read: states come every 10 ms, so on time it seldom
# waits; a server running late (ticks over 1 ms that it does not catch up) finds the hands holding still for it.
# Allowed 50 ms, the hands of seed 0 ran that far ahead of a server behind real time through the instrument's
# wind on `serve`, and its double throw came out a half knot; at 15 ms it was done
LEAD_S = 0.015
UNIT = np.array([1.0, 0.0, 0.0, 0.0])
C45 = math.sqrt(0.5)
# the needle set for the bite: its circle upright in the plane of the bite (x-z for a bite along +x), the swage at
# the circle's top, the arc curving down toward the entry mark; body x -> -x, body y -> -z, body z -> -y
Q_BITE = np.array([0.0, 0.0, C45, -C45])
# the circle's centre above the tissue's top face (m) for a 3/8-circle 19 mm needle (radius 8.064 mm) that meets the
# face at the marks, 5 mm either side of the wound: sqrt(R^2 - (5 mm)^2)
BITE_DEPTH = 0.0063265
# the needle as the hand holds it through the tie: its arc rising straight up from the swage and curving to the
# right (body x -> world z, body y -> x, body z -> y), the strand leaving the swage downward: the tail's loops
# round the strand below the hand pass clear of the needle
Q_TIE = np.array([0.5, -0.5, -0.5, -0.5])
TIES = ("instrument", "hand")    # the knot tied: an instrument tie (the scene's tools) or a hand tie (two hands)
GRASP_WAIT = 300                   # ticks a hand waits for its `grasp` event before it gives up
# the tie (step 4): (t s, x, y, z m) from the tie's start, relative to the wound's centre, for the point the needle
# hand holds the strand at (the swage) and the point the tail hand holds (near the tail's end). The double throw,
# its cinch along the tissue 4 mm above it, the hands easing off; the strands slack while the throw settles; the
# opposite throw (its mirror image, front and back swapped) pulled with the hands crossed, 3 mm above the tissue,
# and held there 2.6 s while the knot seats before the hands ease off
NEEDLE_TIE = [(0.0, 0.045, 0.0, 0.030), (0.7, 0.025, 0.008, 0.040), (1.5, -0.006, 0.008, 0.045),
              (7.1, -0.006, 0.008, 0.045), (7.5, 0.020, 0.005, 0.030), (8.5, 0.043, 0.0, 0.004),
              (9.3, 0.034, 0.0, 0.017), (10.5, 0.034, 0.0, 0.017), (11.2, 0.018, -0.006, 0.026),
              (12.0, -0.004, -0.006, 0.028), (15.0, -0.004, -0.006, 0.028), (15.4, -0.0215, -0.004, 0.018),
              (16.4, -0.043, 0.0, 0.003), (19.0, -0.043, 0.0, 0.003), (19.7, -0.0344, 0.0, 0.003),
              (20.5, -0.026, 0.0, 0.003)]
TAIL_TIE = [(0.0, -0.040, 0.0, 0.020), (0.7, -0.020, -0.008, 0.030), (1.5, 0.006, -0.008, 0.035),
            (2.1, 0.012, 0.0, 0.030), (2.7, 0.008, 0.014, 0.020), (3.3, 0.0, 0.012, 0.006),
            (3.9, 0.0, -0.012, 0.006), (4.4, 0.008, -0.010, 0.024), (4.9, 0.012, 0.0, 0.026),
            (5.4, 0.008, 0.014, 0.018), (5.9, 0.0, 0.012, 0.006), (6.5, 0.0, -0.012, 0.006),
            (7.1, -0.030, -0.010, 0.015), (8.5, -0.043, 0.0, 0.004), (9.3, -0.036, 0.0, 0.012),
            (10.5, -0.036, 0.0, 0.012), (11.2, -0.015, 0.006, 0.020), (12.0, 0.004, 0.006, 0.022),
            (12.6, 0.010, 0.0, 0.020), (13.2, 0.006, -0.010, 0.014), (13.8, 0.0, -0.009, 0.005),
            (14.4, 0.0, 0.009, 0.005), (15.0, 0.0215, 0.004, 0.010), (16.4, 0.043, 0.0, 0.003),
            (19.0, 0.043, 0.0, 0.003), (19.7, 0.0357, 0.0, 0.003), (20.5, 0.028, 0.0, 0.003)]
SECOND_THROW_S = 10.5              # s into the tie: the second throw starts, the first one's cinch eased off
# The instrument tie's first throw, a surgeon's double throw wound on the right tool's jaw (a needle driver), in the
# frame of the wound's centre on the face: u toward the exit mark, v = z x u, z up (m, rad, ticks).
IT_TAIL = 0.030                    # the tail left beyond the entry mark; a longer one pulls the wind's strand
                                   # straight as the jaw reaches the tail's end, and a wrap cuts through the jaw
IT_AXIS = math.radians(35.0)       # the driver's axis, in the u-z plane, rises this much toward the hand; its tip
                                   # points toward the tail
IT_JAW_MID = 0.012                 # the jaw's middle from the exit mark, square to the axis
IT_WIND_R = 0.010                  # the needle hand circles the jaw's middle at this radius ...
IT_TURNS = 2.5                     # ... this many turns, from +v, turning +n toward +v
IT_TURN_TICKS = 1200
IT_FOLLOW = 0.6                    # the needle hand follows this share of the jaw's reach to the tail
IT_ASIDE = 0.008                   # it steps this far to -v as the jaw closes: no point of the needle within the
                                   # jaw's reach (the needle would win the grasp)
IT_PAST_TIP = 0.005                # then it carries the swage this far past the jaw's tip, along the axis, so the
                                   # wraps slide off the tip one at a time instead of snapping off together
IT_BACK = 0.040                    # the jaw drawn back along its axis, the tail's end through the wraps
IT_CINCH = 0.047                   # each end pulled to its own side, this far from the centre, 3 mm up, over 4 s
IT_CINCH_TICKS, IT_CINCH_HOLD = 4000, 1000
# A crossed cinch keeps the knot over the wound, as a person watching it does: at each look both hands shift along
# the pull by this share of how far the knot has drifted along it from the wound's centre (a knot dragged toward
# one hand: that hand eases, the other pulls on), CINCH_SHIFT_MAX at most. Pulled by the hands' positions alone, the
# hand whose strand held more drew the whole knot after it, through the double throw, and the wound opened or the
# knot came undone.
CINCH_GAIN = 0.1                   # of the drift, a look (the server's `state`, 100 a second)
CINCH_SHIFT_MAX = 0.015            # m
KNOT_NEAR, KNOT_APART = 0.0015, 4  # the knot, as seen: vertices this near (m) one more than this many vertices away
DRAWN_LOOK = 2000                  # ticks (eight of the server's knot readings: a loose throw's may go unresolved)
                                   # the hands wait, drawn through, for the knot the throw makes before they pull
# The opposite throw on it, grab first: the jaw takes the tail's very end and carries it to where the first
# throw's jaw lay; the needle's strand is wound round the jaw the other way; the jaw is drawn back through the wrap;
# the ends are pulled crossed, the tail toward the exit mark and the needle's strand toward the entry mark. Wound
# the first throw's way, the server reads a surgeon's granny; pulled uncrossed, the wound opens in the watch.
IT2_LIFT = 0.030                   # the driver first rises this far, clear of the thread
IT2_REST_MM, IT2_REST_TRIES = 1.0, 20   # the tail's end at rest (moves under 1 mm in 0.1 s), 2 s at most: the
                                        # driver's let-go leaves it standing up, and it may fall over
IT2_APPROACH = 0.025               # the jaw lines up this far beyond the tail's end, along the tail, its axis too
IT2_BEYOND = 0.004                 # ... and closes with its tip this far beyond the end: within its reach and
                                   # clear of the thread (a jaw that touches the end pushes it away)
IT2_HIGH, IT2_SIDE = 0.035, 0.015   # the end carried up this high, then over to this far on the tail's side
IT2_OVER = 0.030                   # ... by way of this far to +v: a tail that came from -v lay in a loop on that
                                   # side, where the wind's wrap caught it too (the server read `other`)
IT2_FOLLOW = 1e-4                  # m a tick (0.1 m/s): the jaw follows the end onto it if it still moves
IT2_SETTLE = 500                   # ticks the jaw holds still there, the tail swinging from the carry, before the
                                   # wind: a wrap wound round a swinging tail catches it
IT2_WIND_R = 0.006                 # the needle hand circles the jaw's middle at this radius ...
IT2_TURNS = 1.5                    # ... this many turns, from +v, turning +v toward +n: the first throw's other way
IT2_EASE = 0.030                   # the ends eased to this far either side of the centre before both let go
# The instrument tie as a loop over the knot the server reads (Trainee.instrument_tie, the module's docstring).
TIE_THROWS = 4                     # throws in all: the two of the tie and two thrown again
REDO_RISE = 0.030                  # the driver rises this far after letting go of the tail ...
REDO_SETTLE = 500                  # ... and the thread is left this many ticks to come to rest


def tie_overrides(tie: str) -> dict:
    """The scenario overrides `suture-practice` needs for ``tie``: none for an instrument tie (the scene's own
    tools, friction started warm); for a hand tie both devices hands (``tool: hand``: a hand tie carries the tail,
    in the tool that holds it, through a loop, which a needle driver's shaft would stay inside, docs/HAPTICS.md
    Sec. 1) and the self-contact's friction started from nothing each substep, as the hand tie's timeline
    (NEEDLE_TIE, TAIL_TIE) was made, like the scripted suture scenes' (docs/PHYSICS.md Sec. 7)."""
    if tie != "hand":
        return {}
    return {"devices": {RIGHT: {"tool": "hand"}, LEFT: {"tool": "hand"}}, "contact": {"warm_friction": False}}


def perturbation(seed: int) -> dict:
    """The world the bot of ``seed`` finds: `suture-practice` with its needle moved and turned on the pad as
    ``seed`` draws them (up to 4 mm each way, up to 25 degrees about the vertical), as scenario overrides."""
    from ..solver.scenario import scenario_path
    import yaml

    rng = np.random.default_rng(10_000 + seed)
    doc = yaml.safe_load(scenario_path("suture-practice").read_text())
    yaw = math.radians(rng.uniform(-25.0, 25.0))
    start = doc["shape"]["start"]
    return {"shape": {"start": [start[0] + rng.uniform(-0.004, 0.004), start[1] + rng.uniform(-0.004, 0.004),
                                start[2]]},
            "needle": {"orientation": [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]}}


def perturbed_practice(seed: int, out, tie: str = "instrument") -> None:
    """Write `suture-practice` with the perturbation of ``seed`` to the YAML file ``out``: the world the bot
    finds, with what ``tie`` needs (:func:`tie_overrides`): for an instrument tie the scene's tools (a needle
    driver right, forceps left), for a hand tie both devices hands and friction started cold."""
    import yaml

    from ..solver.scenario import _merge, scenario_path

    doc = _merge(yaml.safe_load(scenario_path("suture-practice").read_text()), perturbation(seed))
    doc = _merge(doc, tie_overrides(tie))
    with open(out, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


class BotFailed(RuntimeError):
    """A step the bot could not do (what it waited for never came): the run ends there."""


def broke(exc: Exception) -> str:
    """A fault of the bot's own (not a BotFailed), as its report's ``failure`` says it: the exception and where
    it was raised, innermost frame first."""
    return f"the bot broke: {type(exc).__name__}: {exc} at " + \
        " < ".join(f"{f.name}:{f.lineno}" for f in reversed(traceback.extract_tb(exc.__traceback__)))


# -- quaternions (w, x, y, z) ------------------------------------------------------------------------------
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
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = float(np.dot(a, b))
    if d < 0.0:
        b, d = -b, -d
    if d > 0.9995:
        q = a + s * (b - a)
        return q / np.linalg.norm(q)
    th = math.acos(d)
    return (math.sin((1 - s) * th) * a + math.sin(s * th) * b) / math.sin(th)


def about_z(angle: float) -> np.ndarray:
    return np.array([math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)])


# -- what the bot sees and sends ---------------------------------------------------------------------------
def toward(d) -> np.ndarray:
    """A unit quaternion (w, x, y, z) turning a tool's axis (its body +z) onto the direction ``d``."""
    d = np.asarray(d, float) / np.linalg.norm(d)
    axis = np.cross([0.0, 0.0, 1.0], d)
    s = float(np.linalg.norm(axis))
    if s < 1e-9:
        return UNIT.copy() if d[2] > 0.0 else np.array([0.0, 1.0, 0.0, 0.0])
    half = 0.5 * math.atan2(s, float(d[2]))
    return np.array([math.cos(half), *(math.sin(half) * axis / s)])


class Sight:
    """What the bot has seen of the `state` and `event` topics: the newest state, and every event in order."""

    def __init__(self):
        self.state: dict | None = None
        self.events: list[dict] = []

    def see(self, messages: Iterable[tuple[bytes, bytes]]) -> None:
        """Take (topic, payload) messages in the order published (states are decoded only for the newest)."""
        newest = None
        for topic, payload in messages:
            if topic == protocol.TOPIC_STATE:
                newest = payload
            elif topic == protocol.TOPIC_EVENT:
                self.events.append(protocol.decode_event(payload))
        if newest is not None:
            self.state = protocol.decode_state(newest)

    def close(self) -> None:
        pass


class Eyes(Sight):
    """The bot's sight of a server: the `state` and `event` topics of its PUB endpoint."""

    def __init__(self, ctx: zmq.Context, endpoint: str):
        super().__init__()
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        for topic in (protocol.TOPIC_STATE, protocol.TOPIC_EVENT):
            self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)

    def look(self) -> None:
        """Everything published since the last look."""
        self.see(self._received())

    def _received(self) -> Iterator[tuple[bytes, bytes]]:
        while True:
            try:
                topic, payload = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            yield topic, payload

    def close(self) -> None:
        self.sock.close(0)


@dataclass
class Hand:
    """One stylus as the bot moves it: its jaw's pose and buttons, and how it holds the needle if it does
    (``offset``, ``q_rel``: the swage's position and the needle's orientation in the jaw's frame, from the
    `grasp` event)."""
    device: str
    pos: np.ndarray
    quat: np.ndarray = field(default_factory=lambda: UNIT.copy())
    buttons: int = 0
    offset: np.ndarray | None = None
    q_rel: np.ndarray | None = None

    def sample(self, seq: int) -> bytes:
        return msgpack.packb({"device": self.device, "seq": seq, "t": seq * TICK,
                              "pos": [float(v) for v in self.pos], "quat": [float(v) for v in self.quat],
                              "buttons": self.buttons}, use_bin_type=True)

    def jaw_for_needle(self, swage, q) -> tuple[np.ndarray, np.ndarray]:
        """The jaw's pose that puts the needle it holds at ``swage`` turned ``q``: q_jaw = q q_rel^-1,
        p_jaw = swage - q_jaw offset."""
        q_jaw = qmul(q, qconj(self.q_rel))
        return np.asarray(swage, float) - rot(q_jaw, self.offset), q_jaw


# -- the trainee ---------------------------------------------------------------------------------------------
class Trainee:
    """The bot: ``plan`` is the suture as a generator that yields once a tick; ``run`` drives it at 1 kHz."""

    def __init__(self, pub: str, stylus: str, seed: int, watch_s: float = 10.0, tie: str = "instrument"):
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 500)
        self.push.setsockopt(zmq.SNDHWM, 100)
        self.push.connect(stylus)
        self._start(Eyes(self.ctx, pub), seed, watch_s, tie)

    @classmethod
    def with_eyes(cls, eyes, seed: int, watch_s: float = 10.0, tie: str = "instrument") -> "Trainee":
        """A bot without sockets: it reads ``eyes`` (a Sight with a ``look()`` of its own) and its caller drives
        ``plan`` a tick at a time and takes the hands' poses (tests run it so against the physics loop in
        process)."""
        bot = cls.__new__(cls)
        bot.ctx = bot.push = None
        bot._start(eyes, seed, watch_s, tie)
        return bot

    def _start(self, eyes, seed: int, watch_s: float, tie: str) -> None:
        if tie not in TIES:
            raise ValueError(f"tie must be one of {', '.join(TIES)}, got {tie!r}")
        self.tie = tie
        self.eyes = eyes
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.watch_s = watch_s
        self.hands = {d: Hand(d, np.zeros(3)) for d in (RIGHT, LEFT)}
        self.seq = 0
        self.done: list[str] = []         # the steps done, in order
        self.done_t: list[float] = []     # the scene time (s) of the newest state seen when each was done
        self.late_ticks = 0               # ticks the bot sent more than a tick late
        self.waited_ticks = 0             # ticks its hands held still for a scene running late (LEAD_S)
        self.released_at: int | None = None
        self.redone: list[str] = []       # the throws that failed and were followed by another, and why

    def mark(self, step: str) -> None:
        """``step`` done, at the scene time the bot last saw (`suturesim bench bot` splits the server's stats by
        it)."""
        self.done.append(step)
        self.done_t.append(float(self.st["t"]) if self.st is not None else 0.0)

    # -- reading ---------------------------------------------------------------------------------------
    @property
    def st(self) -> dict:
        return self.eyes.state

    def needle(self) -> tuple[np.ndarray, np.ndarray]:
        n = self.st["needle"]
        return np.array(n["pos"], float), np.array(n["quat"], float)

    def arc_point(self, swage, q, theta: float) -> np.ndarray:
        r = self.st["needle"]["radius"]
        return np.asarray(swage) + rot(q, [r * math.sin(theta), r * (1 - math.cos(theta)), 0.0])

    def thread(self) -> np.ndarray:
        return np.asarray(self.st["x"], float).reshape(-1, 3)

    def marks(self) -> tuple[np.ndarray, np.ndarray]:
        t = {m["kind"]: np.array(m["pos"], float) for m in self.st["tissue"]["targets"]}
        return t["entry"], t["exit"]

    def bite_frame(self) -> tuple[np.ndarray, np.ndarray]:
        """The circle's centre and the needle's orientation for the bite, from the marks as read: the circle
        upright in the vertical plane through both marks, meeting the face at them."""
        centre, _, _, yaw = self.wound_frame()
        return centre + [0.0, 0.0, BITE_DEPTH], qmul(about_z(yaw), Q_BITE)

    def knots(self, since: int = 0) -> list[str]:
        """The knots the server has read, in order, from its ``since``-th event on."""
        return [e["name"] for e in self.eyes.events[since:] if e["kind"] == "knot"]

    def events(self, kind: str, **details) -> list[dict]:
        """The server's ``kind`` events whose fields match ``details``."""
        return [e for e in self.eyes.events if e["kind"] == kind and all(e.get(k) == v for k, v in details.items())]

    # -- moving ------------------------------------------------------------------------------------------
    def pace(self, ticks: float) -> int:
        """A motion's length in ticks, the bot's pace drawn about it (+-15 %)."""
        return max(1, int(round(ticks * self.rng.uniform(0.85, 1.15))))

    def wait(self, ticks: int) -> Iterator[None]:
        for _ in range(ticks):
            yield

    def move_jaw(self, hand: Hand, pos, quat, ticks: int, buttons: int | None = None) -> Iterator[None]:
        p0, q0 = hand.pos.copy(), hand.quat.copy()
        if buttons is not None:
            hand.buttons = buttons
        for k in range(1, ticks + 1):
            s = k / ticks
            hand.pos = p0 + s * (np.asarray(pos, float) - p0)
            hand.quat = slerp(q0, quat, s)
            yield

    def move_needle(self, hand: Hand, swage, q, ticks: int) -> Iterator[None]:
        """Carry the needle ``hand`` holds from where it is now (as read) to ``swage`` turned ``q``."""
        s0, q0 = self.needle()
        for k in range(1, ticks + 1):
            s = k / ticks
            hand.pos, hand.quat = hand.jaw_for_needle(s0 + s * (np.asarray(swage) - s0), slerp(q0, q, s))
            yield

    def drive(self, hand: Hand, phi0: float, phi1: float, ticks: int) -> Iterator[None]:
        """Turn the needle set for the bite about its circle's axis through its centre, tip first, from phi0 to
        phi1 (rad): the needle at q_bite rotz(phi), its swage at centre + q (0, -R, 0)."""
        centre, q_bite = self.bite_frame()
        r = self.st["needle"]["radius"]
        for k in range(1, ticks + 1):
            phi = phi0 + (phi1 - phi0) * k / ticks
            q = qmul(q_bite, about_z(phi))
            hand.pos, hand.quat = hand.jaw_for_needle(centre + rot(q, [0.0, -r, 0.0]), q)
            yield

    def close_on(self, hand: Hand, holds: str) -> Iterator[None]:
        """Press ``hand``'s grasp button where its jaw is and wait for the server's `grasp` event; it must say
        the jaw holds ``holds``."""
        seen = len(self.eyes.events)
        hand.buttons = GRASP
        for _ in range(GRASP_WAIT):
            yield
            new = [e for e in self.eyes.events[seen:] if e["kind"] in ("grasp", "grasp_missed")
                   and e.get("device") == hand.device]
            if new:
                e = new[0]
                if e["kind"] == "grasp_missed":
                    why = e.get("reason") or f"nothing within {1e3 * float(e.get('radius', 0.0)):.1f} mm of its jaw"
                    raise BotFailed(f"{hand.device} closed on nothing, wanted {holds}: {why}")
                if e.get("holds") != holds:
                    raise BotFailed(f"{hand.device} closed on the {e.get('holds')} "
                                    f"{1e3 * float(e.get('distance', 0.0)):.1f} mm from its jaw, wanted {holds}")
                if holds == "needle":
                    hand.offset, hand.q_rel = np.array(e["offset"], float), np.array(e["q_rel"], float)
                return
        raise BotFailed(f"{hand.device}: no grasp event within {GRASP_WAIT} ticks")

    def let_go(self, hand: Hand) -> None:
        hand.buttons = 0
        hand.offset = hand.q_rel = None

    def take_needle_at(self, hand: Hand, theta: float, quat) -> Iterator[None]:
        swage, q = self.needle()
        yield from self.move_jaw(hand, self.arc_point(swage, q, theta), quat, self.pace(150), buttons=0)
        yield from self.close_on(hand, "needle")

    # -- the instrument tie ---------------------------------------------------------------------------------
    def wound_frame(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """The wound's centre (the marks' midpoint), u (toward the exit mark, horizontal), v = z x u, and u's
        yaw (rad), from the marks as read."""
        entry, exit_ = self.marks()
        d = exit_ - entry
        u = np.array([d[0], d[1], 0.0])
        u /= np.linalg.norm(u)
        return 0.5 * (entry + exit_), u, np.cross([0.0, 0.0, 1.0], u), math.atan2(d[1], d[0])

    @staticmethod
    def frame_point(frame: tuple) -> Callable[[float, float, float], np.ndarray]:
        """In the wound's ``frame`` (:meth:`wound_frame`): the point (m) ``du`` along u, ``dv`` along v and ``dz``
        up from its centre."""
        c, u, v, _ = frame

        def at(du: float, dv: float, dz: float) -> np.ndarray:
            return c + du * u + dv * v + dz * np.array([0.0, 0.0, 1.0])
        return at

    def tail_length(self) -> float:
        """The thread's length (m) from the vertex nearest the entry mark to the tail's end."""
        x = self.thread()
        k = int(np.argmin(np.linalg.norm(x - self.marks()[0], axis=1)))
        return float(np.linalg.norm(np.diff(x[k:], axis=0), axis=1).sum())

    def knot_at(self) -> np.ndarray | None:
        """Where the knot is, as a person sees it: the middle (m) of the thread's vertices that lie within
        KNOT_NEAR of a vertex more than KNOT_APART along the thread from them (strands crossing or wound round each
        other); None if none do."""
        x = self.thread()
        d = np.linalg.norm(x[:, None, :] - x[None, :, :], axis=2)
        k = np.arange(len(x))
        near = (d < KNOT_NEAR) & (np.abs(k[:, None] - k[None, :]) > KNOT_APART)
        crossed = near.any(axis=1)
        return x[crossed].mean(axis=0) if crossed.any() else None

    def knot_now(self) -> str:
        """The knot the server reads now (`state`'s ``tissue.knot``; "unknot" before it reads one)."""
        return (self.st.get("tissue") or {}).get("knot") or "unknot"

    def step_back(self) -> Iterator[None]:
        """After a throw that failed: the driver lets go of what it holds and rises clear, and the thread settles,
        as a person steps back to look."""
        right = self.hands[RIGHT]
        self.let_go(right)
        yield from self.move_jaw(right, right.pos + [0.0, 0.0, REDO_RISE], right.quat, 400)
        yield from self.wait(REDO_SETTLE)

    def instrument_double_throw(self) -> Iterator[None]:
        """After step 2, with the right tool a needle driver: a surgeon's double throw tied on it. The left hand
        leaves a 30 mm tail and winds the needle's strand round the driver's jaw 2.5 times; the jaw takes the
        tail's very end and is drawn back through the wraps; each end is pulled to its own side, the pull eased,
        the jaw lets go and the driver moves clear."""
        right, left = self.hands[RIGHT], self.hands[LEFT]
        frame = self.wound_frame()
        c, u, v, _ = frame
        at = self.frame_point(frame)
        seen = len(self.eyes.events)

        yield from self.move_jaw(right, at(0.0, 0.03, 0.05), right.quat, 800)
        yield from self.move_needle(left, at(0.045, 0.0, 0.030), Q_TIE, 2500)
        for _ in range(3):                               # the tail: draw the needle's strand out till it is 30 mm
            tail = self.tail_length()
            if tail <= IT_TAIL + 0.002:
                break
            swage, _ = self.needle()
            yield from self.move_needle(left, swage + (tail - IT_TAIL) * u, Q_TIE, 600)
            yield from self.wait(200)
        q, a, n, mid, tip = self.driver_pose(frame)
        yield from self.move_jaw(right, tip + 0.02 * n, q, 800)
        yield from self.move_jaw(right, tip, q, 400)
        yield from self.wind(mid, n, v, IT_WIND_R, IT_TURNS, 1.0, 1000)
        # the jaw reaches tip first over the tail's end, the needle hand following part of the way
        target = self.thread()[-1] + [0.0, 0.0, 0.003]
        p0, l0 = right.pos.copy(), left.pos.copy()
        for k in range(1, 2001):
            s = k / 2000
            right.pos = p0 + s * (target - p0)
            left.pos = l0 + IT_FOLLOW * s * (target - p0)
            yield
        end = self.thread()[-1]
        p0, l0, aside = right.pos.copy(), left.pos.copy(), at(0.0, -IT_ASIDE, 0.0) - c
        for k in range(1, 301):                          # down onto the tail's last vertex, the needle aside
            right.pos = p0 + k / 300 * (end - p0)
            left.pos = l0 + k / 300 * aside
            yield
        yield from self.close_on(right, "thread")
        yield from self.wait(50)
        # the wraps onto the tail, and each end pulled to its own side
        yield from self.draw_through(a, -IT_ASIDE * v, "double throw", seen)
        yield from self.cinch(at(-IT_CINCH, 0.0, 0.003), at(IT_CINCH, 0.0, 0.003), "double throw", seen)
        self.mark("double throw")
        swage, _ = self.needle()
        p0 = right.pos.copy()
        for k in range(1, 1001):                         # eased, the jaw lets go and the driver moves clear
            right.pos = p0 + k / 1000 * (at(-0.015, 0.0, 0.010) - p0)
            left.pos, left.quat = left.jaw_for_needle(swage + k / 1000 * (at(0.034, 0.0, 0.017) - swage), Q_TIE)
            yield
        yield from self.wait(300)
        self.let_go(right)
        yield from self.wait(300)
        yield from self.move_jaw(right, right.pos + at(0.0, 0.025, 0.003) - c, right.quat, 500)
        self.mark("driver clear")

    @staticmethod
    def driver_pose(frame: tuple) -> tuple:
        """The needle driver laid over the exit side for an instrument throw, in the wound's ``frame``
        (:meth:`wound_frame`): (its orientation, its axis a (tip to hinge) rising IT_AXIS toward the hand, n square
        to it and up, its jaw's middle IT_JAW_MID from the face, its tip (m))."""
        c, u, v, yaw = frame
        z = np.array([0.0, 0.0, 1.0])
        q = qmul(about_z(yaw), [math.cos((math.pi / 2 - IT_AXIS) / 2), 0.0, math.sin((math.pi / 2 - IT_AXIS) / 2),
                                0.0])
        a = math.cos(IT_AXIS) * u + math.sin(IT_AXIS) * z
        n = -math.sin(IT_AXIS) * u + math.cos(IT_AXIS) * z
        mid = c + 0.005 * u + 0.0 * v + 0.0 * z + IT_JAW_MID * n
        return q, a, n, mid, mid - 0.006 * a             # the tip: half the needle driver's 12 mm jaw (server/jaws.py)

    def wind(self, mid: np.ndarray, n: np.ndarray, v: np.ndarray, radius: float, turns: float, sense: float,
             ticks: int) -> Iterator[None]:
        """The needle hand brings the swage over ``ticks`` to ``radius`` (m) from the jaw's middle ``mid`` on its
        +v side, then circles it ``turns`` times in the n-v plane, IT_TURN_TICKS a turn, from +v toward -n
        (``sense`` 1) or toward +n (-1): the needle's strand wound round the jaw."""
        left = self.hands[LEFT]

        def circle(phi):
            return mid + radius * (math.cos(phi) * n + math.sin(phi) * v)

        yield from self.move_needle(left, circle(0.5 * math.pi), Q_TIE, ticks)
        count = int(turns * IT_TURN_TICKS)
        for k in range(1, count + 1):
            phi = 0.5 * math.pi + sense * (2.0 * math.pi * turns * k / count)
            left.pos, left.quat = left.jaw_for_needle(circle(phi), Q_TIE)
            yield

    def draw_through(self, a: np.ndarray, aside: np.ndarray, throw: str, seen: int) -> Iterator[None]:
        """An instrument throw drawn through: the needle hand holds the swage just past the jaw's tip (and
        ``aside``, m), the jaw is drawn back along its axis ``a`` (tip to hinge), the tail's end in it through the
        wraps, so they slide off its tip onto the tail one at a time; the hands hold still until the server reads
        the knot ``throw`` makes, DRAWN_LOOK ticks at most (else BotFailed: a throw that missed is not pulled).
        ``seen``: the events before the throw began."""
        right, left = self.hands[RIGHT], self.hands[LEFT]
        swage, _ = self.needle()
        goal, l0 = right.pos - IT_PAST_TIP * a + aside, left.pos.copy()
        for k in range(1, 501):                          # the swage past the jaw's tip
            left.pos = l0 + k / 500 * (goal - swage)
            yield
        for _ in range(4):                               # the jaw drawn back
            yield from self.move_jaw(right, right.pos + IT_BACK * a / 4, right.quat, 200)
        for _ in range(DRAWN_LOOK):                      # a look before the pull
            if self.knot_now() == throw:
                return
            yield
        raise BotFailed(f"the jaw drawn through the wraps, the server reads {self.knot_now()}, not {throw} "
                        f"(it read {self.knots(seen)})")

    def cinch(self, tail_to: np.ndarray, needle_to: np.ndarray, throw: str, seen: int,
              centred: bool = False) -> Iterator[None]:
        """The jaw, holding the tail, pulls it to ``tail_to`` and the needle hand its strand to ``needle_to`` (m)
        over IT_CINCH_TICKS; both hold IT_CINCH_HOLD, and the server must then read ``throw`` (else BotFailed:
        what it reads with the cinch held, not what it read on the way). ``centred``: the knot kept over the wound
        (CINCH_GAIN), both hands shifted along the pull against its drift at each look."""
        right, left = self.hands[RIGHT], self.hands[LEFT]
        swage, _ = self.needle()
        p0 = right.pos.copy()
        centre = 0.5 * (tail_to + needle_to)
        along = (tail_to - needle_to) / np.linalg.norm(tail_to - needle_to)
        shift = 0.0            # m along the pull, both hands: keeps the knot over the wound
        seen_t = None
        for k in range(1, IT_CINCH_TICKS + 1):
            s = k / IT_CINCH_TICKS
            if centred and self.st["t"] != seen_t:   # a new look: how far the knot has drifted along the pull
                seen_t = self.st["t"]
                knot = self.knot_at()
                if knot is not None:
                    off = float(np.dot(knot - centre, along))
                    shift = min(CINCH_SHIFT_MAX, max(-CINCH_SHIFT_MAX, shift - CINCH_GAIN * off))
            right.pos = p0 + s * (tail_to - p0) + s * shift * along
            left.pos, left.quat = left.jaw_for_needle(swage + s * (needle_to - swage) + s * shift * along, Q_TIE)
            yield
        yield from self.wait(IT_CINCH_HOLD)
        if self.knot_now() != throw:
            raise BotFailed(f"the {throw} cinched, the server reads {self.knot_now()} (it read {self.knots(seen)})")

    def take_tail_end(self) -> Iterator[None]:
        """The driver rises clear, waits for the tail's end to come to rest, lines up beyond it along the tail
        (its axis too) and closes on it, tip first, following it if it still moves."""
        right = self.hands[RIGHT]
        z = np.array([0.0, 0.0, 1.0])
        yield from self.move_jaw(right, right.pos + IT2_LIFT * z, right.quat, 400)
        for _ in range(IT2_REST_TRIES):
            end = self.thread()[-1].copy()
            yield from self.wait(100)
            if np.linalg.norm(self.thread()[-1] - end) < 1e-3 * IT2_REST_MM:
                break
        x = self.thread()
        d = x[-1] - x[-3]
        d /= np.linalg.norm(d)                           # the tail's direction at its end, outward
        q_end = toward(d)
        lined = x[-1] + IT2_APPROACH * d
        yield from self.move_jaw(right, lined + 0.02 * z, q_end, 800)
        yield from self.move_jaw(right, lined, q_end, 300)
        for _ in range(400):                             # onto the end, following it if it still moves
            goal = self.thread()[-1] + IT2_BEYOND * d
            step = goal - right.pos
            dist = float(np.linalg.norm(step))
            right.pos = goal if dist < IT2_FOLLOW else right.pos + step * (IT2_FOLLOW / dist)
            yield
        yield from self.close_on(right, "thread")
        yield from self.wait(50)

    def cinch_crossed(self, at: Callable[[float, float, float], np.ndarray], seen: int) -> Iterator[None]:
        """The surgeon's knot's cinch, the jaw holding the tail: the ends pulled with the hands crossed (the tail
        to the exit side, the needle's strand to the entry side, :meth:`cinch`, the knot kept over the wound),
        then both eased to IT2_EASE either
        side of the wound. ``at``: a point in the wound's frame (:meth:`frame_point`); ``seen``: the events before
        the throw began."""
        right, left = self.hands[RIGHT], self.hands[LEFT]
        yield from self.cinch(at(IT_CINCH, 0.0, 0.003), at(-IT_CINCH, 0.0, 0.003), "surgeon's knot", seen,
                              centred=True)
        self.mark("second throw")
        swage, _ = self.needle()
        p0 = right.pos.copy()
        for k in range(1, 1001):
            right.pos = p0 + k / 1000 * (at(IT2_EASE, 0.0, 0.006) - p0)
            left.pos, left.quat = left.jaw_for_needle(swage + k / 1000 * (at(-IT2_EASE, 0.0, 0.008) - swage),
                                                      Q_TIE)
            yield

    def instrument_opposite_throw(self) -> Iterator[None]:
        """After the instrument's double throw, the opposite single throw on it, grab first: the driver's jaw takes
        the tail's very end (lined up along the tail, tip first) and carries it up, over by the +v side to the
        tail's side of the wound and down to where the first throw's jaw lay; the needle hand winds its strand 1.5
        times round the jaw, the other way from the first throw; the needle hand holds the swage past the jaw's tip
        and the jaw is drawn back along its axis, the tail's end through the wrap; the ends are pulled crossed along the tissue
        (the tail to the exit side, the needle's strand to the entry side) with the knot kept over the wound, held
        and eased. The server must read a surgeon's knot."""
        right = self.hands[RIGHT]
        frame = self.wound_frame()
        c, _, v, _ = frame
        at = self.frame_point(frame)
        seen = len(self.eyes.events)

        yield from self.take_tail_end()
        q, a, n, mid, tip = self.driver_pose(frame)
        # up, over the +v side, over to the tail's side of the wound and down onto the pose: wherever the end came
        # to rest, the tail comes to the jaw's pose the same way round the needle's strand
        yield from self.move_jaw(right, np.array([right.pos[0], right.pos[1], c[2] + IT2_HIGH]), right.quat, 500)
        yield from self.move_jaw(right, at(-IT2_SIDE, IT2_OVER, IT2_HIGH), q, 600)
        yield from self.move_jaw(right, at(-IT2_SIDE, 0.0, IT2_HIGH), q, 800)
        yield from self.move_jaw(right, tip + 0.01 * n, q, 600)
        yield from self.move_jaw(right, tip, q, 300)
        yield from self.wait(IT2_SETTLE)
        yield from self.wind(mid, n, v, IT2_WIND_R, IT2_TURNS, -1.0, 800)
        # the wrap onto the tail, and the ends pulled crossed
        yield from self.draw_through(a, np.zeros(3), "surgeon's knot", seen)
        yield from self.cinch_crossed(at, seen)

    def cinch_again(self) -> Iterator[None]:
        """A surgeon's knot the server reads only once a throw that missed its look was let go: tied, but never
        pulled tight. The driver takes the tail's end again, and the ends are pulled crossed, held and eased as
        the opposite throw's are."""
        seen = len(self.eyes.events)
        at = self.frame_point(self.wound_frame())
        yield from self.take_tail_end()
        yield from self.cinch_crossed(at, seen)

    # -- the suture ----------------------------------------------------------------------------------------
    def plan(self) -> Iterator[None]:
        yield from self.suture()
        if self.tie == "hand":
            yield from self.hand_tie()
        else:
            yield from self.instrument_tie()

    def instrument_tie(self) -> Iterator[None]:
        """Steps 3a and 4, an instrument tie, with the right tool a needle driver: the throw the knot the server
        reads calls for (no knot: the surgeon's double throw wound on its jaw; the double throw: the opposite
        single throw on it; a surgeon's knot read only once a throw that failed was let go: :meth:`cinch_again`),
        TIE_THROWS at most, a throw that failed followed by :meth:`step_back` and noted in ``redone`` if another
        throw follows; once a throw has made a surgeon's knot, both hands let go and the knot is watched."""
        failure = None
        for _ in range(TIE_THROWS):
            knot = self.knot_now()
            if knot == "surgeon's knot" and failure is None:
                break
            if knot == "surgeon's knot":     # read only once a throw that failed was let go: never pulled tight
                step, throw = "cinch", self.cinch_again
            elif knot == "unknot":
                step, throw = "double throw", self.instrument_double_throw
            elif knot == "double throw":
                step, throw = "opposite throw", self.instrument_opposite_throw
            else:
                raise BotFailed(f"{failure}; let go, it reads {knot}" if failure else
                                f"the server reads {knot}: no throw makes it a surgeon's knot")
            if failure is not None:
                self.redone.append(failure)
            try:
                yield from throw()
                failure = None
            except BotFailed as exc:
                failure = f"{step}: {exc}"
                yield from self.step_back()
        else:
            if self.knot_now() != "surgeon's knot":
                raise BotFailed(f"{failure or 'the tie'}: {TIE_THROWS} throws, and the server reads "
                                f"{self.knot_now()}")
        yield from self.let_go_and_watch()

    def suture(self) -> Iterator[None]:
        """Steps 1 and 2: the needle taken, driven through both edges, handed over and the thread drawn
        through."""
        right, left = self.hands[RIGHT], self.hands[LEFT]
        rng = self.rng
        centre, _ = self.bite_frame()
        # the hands start open, somewhere above the tissue
        right.pos = centre + [0.02, 0.0, 0.04] + rng.uniform(-0.015, 0.015, 3)
        left.pos = centre + [-0.04, 0.0, 0.04] + rng.uniform(-0.015, 0.015, 3)
        yield from self.wait(self.pace(300))
        # 1. the right hand comes to the needle, open, and takes it a fifth to three tenths of the way from its
        # swage
        swage, q = self.needle()
        arc = self.st["needle"]["arc"]
        theta = arc * rng.uniform(0.2, 0.3)
        above = self.arc_point(swage, q, theta) + [0.0, 0.0, 0.02] + rng.uniform(-0.01, 0.01, 3)
        yield from self.move_jaw(right, above, UNIT, self.pace(500), buttons=0)
        yield from self.take_needle_at(right, theta, UNIT)
        self.mark("needle taken")
        yield from self.wait(50)
        swage, q = self.needle()
        yield from self.move_needle(right, swage + [0.0, 0.0, 0.02], q, self.pace(400))        # lifted 2 cm
        centre, q_bite = self.bite_frame()
        r = self.st["needle"]["radius"]
        start = centre + rot(q_bite, [0.0, -r, 0.0])
        yield from self.move_needle(right, start + [0.0, 0.0, 0.01], q_bite, self.pace(1200))   # upright, over
        yield from self.move_needle(right, start, q_bite, self.pace(400))      # the tip 0.6 mm above the mark
        yield from self.wait(200)
        yield from self.drive(right, 0.0, math.radians(100.0), self.pace(2500))   # through both edges
        yield from self.wait(300)
        if len(self.events("puncture")) < 4:
            raise BotFailed(f"the bite made {len(self.events('puncture'))} punctures, not 4")
        self.mark("bite")
        # 2. the left hand takes the needle halfway between where it comes out and its tip; the right lets go
        swage, q = self.needle()
        thetas = np.linspace(arc, 0.0, 400)
        out = next((k for k, th in enumerate(thetas) if self.arc_point(swage, q, th)[2] < 0.0), None)
        if out is None or arc - thetas[out] < math.radians(6.0):
            raise BotFailed("the needle's tip is not out of the tissue")
        tip_theta = 0.5 * (arc + thetas[out])
        yield from self.move_jaw(left, self.arc_point(swage, q, tip_theta) + [0.0, 0.0, 0.02], left.quat,
                                 self.pace(600))
        yield from self.take_needle_at(left, tip_theta, qmul(self.bite_frame()[1], about_z(1.5)))
        yield from self.wait(50)
        self.let_go(right)
        yield from self.move_jaw(right, right.pos + [0.03, 0.0, 0.03], right.quat, self.pace(300))
        self.mark("handover")
        # ... and turns it on along its curve and up and out to the right, drawing the thread through
        swage, q = self.needle()
        rel = qmul(qconj(self.bite_frame()[1]), q)                  # rotz(phi), or its negative
        phi = math.remainder(2.0 * math.atan2(rel[3], rel[0]), 2.0 * math.pi)
        yield from self.drive(left, phi, math.radians(235.0), self.pace(3000))
        swage, q = self.needle()
        yield from self.move_needle(left, swage + [0.03, 0.0, 0.03], q, self.pace(1000))
        yield from self.wait(300)
        if not self.events("thread_through"):
            raise BotFailed("the thread did not follow the needle through")
        self.mark("drawn through")

    def hand_tie(self) -> Iterator[None]:
        """Steps 3b and 4: the tail taken, a surgeon's knot tied by hand, both hands let go and the knot
        watched."""
        right, left = self.hands[RIGHT], self.hands[LEFT]
        # the right hand takes the thread 2 mm from its tail's end; the left turns the needle's arc up (Q_TIE) and
        # draws its strand out to the right, leaving a tail, while the right brings the tail across
        x = self.thread()
        tail = x[-1] + 2e-3 * (x[-2] - x[-1]) / np.linalg.norm(x[-2] - x[-1])
        yield from self.move_jaw(right, tail + [0.0, 0.0, 0.02], UNIT, self.pace(1500))
        yield from self.move_jaw(right, tail, UNIT, self.pace(300))
        yield from self.close_on(right, "thread")
        yield from self.wait(50)
        centre, _ = self.bite_frame()
        centre = centre - [0.0, 0.0, BITE_DEPTH]                    # the wound's centre on the tissue's face
        q_hold = Q_TIE
        n0, t0 = np.array(NEEDLE_TIE[0][1:]), np.array(TAIL_TIE[0][1:])
        n_ticks = self.pace(2500)
        s0, q0 = self.needle()
        p0 = right.pos.copy()
        for k in range(1, n_ticks + 1):
            s = k / n_ticks
            left.pos, left.quat = left.jaw_for_needle(s0 + s * (centre + n0 - s0), slerp(q0, q_hold, s))
            right.pos = p0 + s * (centre + t0 - p0)
            yield
        self.mark("tail taken")
        # the tie, both hands along their paths from the wound's centre; the needle hand keeps the needle as
        # it turned it (Q_TIE)
        total = NEEDLE_TIE[-1][0]
        ticks = int(round(total / TICK))
        tn, pn = np.array([w[0] for w in NEEDLE_TIE]), np.array([w[1:] for w in NEEDLE_TIE])
        tt, pt = np.array([w[0] for w in TAIL_TIE]), np.array([w[1:] for w in TAIL_TIE])
        second = int(round(SECOND_THROW_S / TICK))
        for k in range(1, ticks + 1):
            t = k * TICK
            swage = centre + [np.interp(t, tn, pn[:, i]) for i in range(3)]
            left.pos, left.quat = left.jaw_for_needle(swage, q_hold)
            right.pos = centre + [np.interp(t, tt, pt[:, i]) for i in range(3)]
            yield
            if k == second:
                # the first throw seated before the second: the server has read a double throw and the wound
                # closed, or the tie is not going to hold
                if not self.events("knot", name="double throw") or not self.events("gap_closed"):
                    raise BotFailed(f"after the double throw the server read {self.knots()} and the wound is "
                                    f"{'closed' if self.events('gap_closed') else 'open'}")
                self.mark("double throw")
        if not self.events("knot", name="surgeon's knot"):
            raise BotFailed(f"after the second throw the server read {self.knots()}")
        self.mark("second throw")
        yield from self.let_go_and_watch()

    def let_go_and_watch(self) -> Iterator[None]:
        """Step 4: both hands let go, the tail's first, and step back; the knot watched ``watch_s``."""
        right, left = self.hands[RIGHT], self.hands[LEFT]
        self.let_go(right)
        yield from self.wait(200)
        self.let_go(left)
        yield from self.move_jaw(right, right.pos + [0.02, 0.0, 0.03], right.quat, 300)
        yield from self.move_jaw(left, left.pos + [-0.02, 0.0, 0.03], left.quat, 300)
        self.mark("let go")
        self.released_at = len(self.eyes.events)
        yield from self.wait(int(round(self.watch_s / TICK)))
        self.mark("watched")

    def run(self, timeout_s: float = 20.0) -> dict:
        """Wait for the first state, then run the plan at 1 kHz; returns the report."""
        deadline = time.monotonic() + timeout_s
        while self.eyes.state is None:
            if time.monotonic() > deadline:
                raise BotFailed(f"no state within {timeout_s} s")
            self.eyes.sock.poll(50)
            self.eyes.look()
        failure = None
        cpu0, wall0 = time.process_time(), time.monotonic()
        plan = self.plan()
        t_next = time.perf_counter()
        scene0, steps = float(self.eyes.state["t"]), 0
        try:
            while True:
                self.eyes.look()
                # a person waits for a scene that has stopped moving: the plan keeps pace with the scene time
                # read, and the hands hold still (their samples still sent) while it lags LEAD_S behind
                if steps * TICK > float(self.eyes.state["t"]) - scene0 + LEAD_S:
                    self.waited_ticks += 1
                else:
                    try:
                        next(plan)
                    except StopIteration:
                        break
                    steps += 1
                for hand in self.hands.values():
                    self.push.send(hand.sample(self.seq))
                self.seq += 1
                t_next += TICK
                wait = t_next - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                elif wait < -TICK:
                    self.late_ticks += 1
                    t_next = time.perf_counter()      # no burst to catch up: a hand does not jump
        except BotFailed as exc:
            failure = str(exc)
        except Exception as exc:   # a fault of the bot's own: reported with the suture so far, not swallowed
            failure = broke(exc)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        for hand in self.hands.values():             # the jaws open on the way out
            hand.buttons = 0
            self.push.send(hand.sample(self.seq))
        self.eyes.look()
        return self.report(failure, cpu, wall)

    def report(self, failure: str | None, cpu: float, wall: float) -> dict:
        ev = self.eyes.events
        after = ev[self.released_at:] if self.released_at is not None else []
        knots = [e["name"] for e in ev if e["kind"] == "knot"]
        tissue = self.st.get("tissue") or {}
        return {
            "seed": self.seed, "failure": failure, "done": self.done, "done_t": self.done_t,
            "punctures": [[e["pad"], e["side"]] for e in ev if e["kind"] == "puncture"],
            "knots": knots, "knot_at_end": tissue.get("knot"), "gap_at_end": tissue.get("gap"),
            "gap_closed": any(e["kind"] == "gap_closed" for e in ev),
            # the wound as the server last said: closed if its last gap event was `gap_closed`
            "closed_at_end": [e["kind"] for e in ev
                              if e["kind"] in ("gap_closed", "gap_opened")][-1:] == ["gap_closed"],
            "gap_opened_after_release": any(e["kind"] == "gap_opened" for e in after),
            "knot_changed_after_release": [e["name"] for e in after if e["kind"] == "knot"],
            "grasps": [[e["device"], e.get("holds")] for e in ev if e["kind"] == "grasp"],
            "cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "late_ticks": self.late_ticks,
            "waited_ticks": self.waited_ticks, "redone": self.redone,
        }

    def close(self) -> None:
        self.eyes.close()
        if self.ctx is not None:      # a bot with_eyes has no sockets of its own
            self.push.close()
            self.ctx.term()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m suturesim.tools.trainee_bot", description=__doc__.split("\n")[0])
    p.add_argument("--pub", default="tcp://127.0.0.1:5555", help="the server's PUB endpoint")
    p.add_argument("--stylus", default="tcp://127.0.0.1:5557", help="the server's stylus (PULL) endpoint")
    p.add_argument("--seed", type=int, default=0, help="draws the bot's start poses, grasp point and pace")
    p.add_argument("--watch", type=float, default=10.0, help="seconds the bot watches the knot after letting go")
    p.add_argument("--tie", choices=TIES, default="instrument",
                   help="instrument (default): an instrument tie with the scene's needle driver and forceps; "
                        "hand: a hand tie (serve the scene with both devices `tool: hand` and "
                        "`contact.warm_friction` false, as perturbed_practice writes it)")
    args = p.parse_args(argv)
    bot = Trainee(args.pub, args.stylus, args.seed, args.watch, args.tie)
    try:
        report = bot.run()
    finally:
        bot.close()
    print(json.dumps(report), flush=True)
    return 0 if report["failure"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
