"""A suture attempt scored from the published stream, FLS-style (docs/ASSESSMENT.md): the code that
`suturesim score` runs on a recording (tools/score.py), the scorer process on the live stream
(server/scoring.py) and `suturesim view` on what it watches.

:class:`Scorer` reads the published stream, one decoded message at a time (``state`` and ``event``;
``force`` and ``stats`` are ignored: the state carries what the score needs at a tenth of the rate), and :meth:`Scorer.attempt` says what it saw as one :class:`Attempt`: the time of each
phase, where the needle went in and came out against the scene's marks, how the tissue, the thread and the
tools were handled, the knot and the wound, penalties and an FLS-style score, and a pass/fail table against
proficiency benchmarks. It keeps running sums only (a few numbers a message), and copies of itself a rollback
can go back to (MARK_S, KEEP_S), so it can follow a live stream as well as a recording; :func:`score_recording`
feeds it a recording's messages in log order.

What it reads, all from the public protocol (docs/PROTOCOL.md Sec. 3):

* phases, from events: the needle grasped by a tool (`grasp` with ``holds`` needle), each bite done (the
  first `puncture` exit in each pad), the thread pulled through (`thread_through` in every pad punctured),
  each throw (`throw`), cinched (the first moment the knot has its two throws and the wound is closed: the
  task done, whatever the knot; a knot that is not square is a penalty);
* placement, from `puncture` events against the `state`'s ``tissue.targets`` of the same pad and kind (the
  mark's position in the newest state before the puncture: marks move with their pad), the needle's angle to
  the face at an entry (from the newest state's ``needle``: the tangent at the tip), the bite's depth (the
  deepest point of the needle's arc below the marks' face while it is in the tissue), extra punctures of a
  pad's side and `needle_out` withdrawals;
* the thread's peak tension (``state.tension``) and the peak force each device's grasps pulled with
  (``state.grasps[].force``, summed per device: the couplings' force, before the safety pipeline's clamp,
  which would hide how hard a hand pulled), and each tissue pad's edge held by forceps, the most its coupling
  pulled it with (the grasps that hold ``tissue``);
* the thread drawn through each pad, from its punctures' ``arc`` (where along the thread it runs through them);
* the knot (the last `knot` event) and the wound (``tissue.gap`` in the last state; `gap_opened` after the
  first `gap_closed`);
* economy of motion, from ``state.tools`` (a scripted hand, which has no tool there, from its grasps'
  ``state.grasps[].pos``): each tool's path length, idle time (moving slower than ``IDLE_SPEED``), clutch
  presses, grasps, missed grasps; needle drops (a `release` of the needle that leaves
  no tool holding it while it runs through no puncture).

The clock starts at the first state that shows a tool (a stylus sent a pose), else it is the scene's own (a
scripted scene's phases at its timeline's times).
Units: SI inside; the report gives mm, s and N.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from . import protocol

IDLE_SPEED = 0.005          # m/s: a tool moving slower than this is idle
ARC_SAMPLES = 17            # points along the needle's arc when the bite's depth is measured
# an FLS-style score: SCORE_CUTOFF s less the completion time and the penalties, floored at 0 (docs/ASSESSMENT.md)
SCORE_CUTOFF = 600.0
SECURE_KNOTS = ("square knot", "surgeon's knot")
TASK_THROWS = 2             # the task's knot: a throw (a surgeon's double throw) and the opposite one on it
# penalty points, each with its reason (docs/ASSESSMENT.md Sec. 2)
POINTS_PER_MM_OFF_MARK = 1.0      # the FLS suturing task's accuracy error is counted in mm from each mark
POINTS_PER_MM_GAP = 1.0           # and the gap left in the slit in mm
POINTS_INSECURE_KNOT = 20.0       # a knot that is not square (a granny, a half knot, a lone throw) can slip
POINTS_EXTRA_PUNCTURE = 5.0       # every extra hole, and every needle backed out, is a wound of its own
POINTS_NEEDLE_DROP = 5.0          # a needle dropped outside the tissue must be found and picked up again
POINTS_KNOT_SLIP = 20.0           # a knot that slips under the security test's pull loosens as a granny does
POINTS_TEAR = 10.0                # a needle levered across its puncture tears the edge: a wound of its own, larger
#                                   than a hole's
# a thread pulled past its rated strength breaks (solver/breakage.py): the suture must be cut out and placed
# again with a new one, so the attempt scores as one not done (SCORE_CUTOFF)
SECURITY_CREEP_S = 2.0            # s: the security test's last stretch, over which a knot still moving slips
# proficiency benchmarks by default: the FLS intracorporeal suturing task's (112 s, no mark missed by more than
# 1 mm, a knot that does not slip)
FLS_TIME_S = 112.0
FLS_DEVIATION_MM = 1.0
# a server's solver fault takes the scene back up to half a second (a `resume` with ``undone_s``), and the score
# goes back with it: the scorer copies itself every MARK_S s of scene time and keeps KEEP_S s of copies and of
# the messages after the oldest, so that it can go back to where the scene did and read again what came before
MARK_S = 0.25
KEEP_S = 1.5


@dataclass
class Placement:
    """A marked point and the puncture that came nearest it: the first of that pad's side."""
    target: str
    pad: str
    side: str                     # "entry" or "exit"
    t: float                      # s from the start
    offset_mm: float              # from the mark, on the face
    angle_deg: float | None       # the needle's tip to the face at the puncture: 90 is square to it


@dataclass
class ToolUse:
    """One device's tool over the attempt."""
    device: str
    path_m: float = 0.0
    idle_s: float = 0.0
    clutches: int = 0
    grasps: int = 0
    missed_grasps: int = 0
    peak_force_n: float = 0.0         # N: the most its grasps pulled with (their couplings, summed)


@dataclass
class Penalty:
    what: str
    points: float
    reason: str


@dataclass
class Check:
    """A proficiency benchmark: ``value`` against ``limit`` (pass when at most it, or when true)."""
    what: str
    value: float | bool | None
    limit: float | bool
    passed: bool


@dataclass
class Security:
    """The knot security test's outcome (tools/security.py; lengths in mm, times in s from the pull's start)."""
    tension_n: float
    ends: tuple[int, int]            # the vertices pulled apart
    outcome: str                     # "holds" (settled, the wound closed), "slips" (still moving at the end),
    #                                  "opens" (the wound not closed under the load), "undone" (pulled
    #                                  through), or "slack" (the ends' slack was never taken up)
    slip_mm: float | None            # the ends' separation's growth over the hold
    creep_mm: float | None           # its growth over the hold's last SECURITY_CREEP_S (still moving: slips)
    taut_s: float | None             # when both ends first pulled with the tension
    hold_s: float                    # how long the hold was measured over (s; shorter when pulled through)
    gap_mm: float | None             # the wound's gap at the end of the hold (None: no tissue)
    closed_under_load: bool | None   # the scene's reading of the wound at the end of the hold (None: no wound)
    knot_before: str | None          # the knot the scene read before the pull and after it
    knot_after: str | None

    @property
    def held(self) -> bool:
        return self.outcome == "holds"

    def line(self) -> str:
        if self.slip_mm is None:
            slip = "-"
        elif self.hold_s < SECURITY_CREEP_S:     # pulled through before its hold's end: one figure says it
            slip = f"{self.slip_mm:.2f} mm in {self.hold_s:.2f} s"
        else:
            slip = (f"{self.slip_mm:.2f} mm in {self.hold_s:.3g} s, {self.creep_mm:.2f} mm in its last "
                    f"{SECURITY_CREEP_S:g} s")
        gap = "" if self.gap_mm is None else (f", gap under the load {self.gap_mm:.2f} mm" + (
            "" if self.closed_under_load is None else " (closed)" if self.closed_under_load else " (open)"))
        return (f"knot security at {self.tension_n:g} N a side: {self.outcome}, slip {slip}{gap}, knot "
                f"{self.knot_before or 'none'} -> {self.knot_after or 'none'}")


@dataclass
class Attempt:
    """An attempt as :class:`Scorer` read it (times in s from the start, lengths in mm unless named _m)."""
    scenario: str = ""
    trainee: str = ""             # `serve --trainee NAME`, from the recording's metadata
    started: str = ""             # when the recording began (ISO 8601, UTC): which attempt it is
    clock_start_s: float = 0.0    # the scene time (s) the attempt's clock starts at
    duration_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    marked: bool = False          # the scene marks where the needle should go in and come out
    completed_s: float | None = None
    placements: list[Placement] = field(default_factory=list)
    bite_depth_mm: float | None = None
    extra_punctures: int = 0
    withdrawals: int = 0
    peak_lateral_n: float = 0.0   # N: the needle's largest lateral force at a puncture (tissue handling)
    lateral_impulse_ns: float = 0.0   # N*s: that force summed over the punctures, integrated over time
    tears: int = 0                # `tear` events
    drawn_mm: dict[str, float] = field(default_factory=dict)   # each pad: the thread drawn through it (either way)
    edge_peaks_n: dict[str, float] = field(default_factory=dict)   # N: each pad held by forceps, the most its
    #                                                                 coupling pulled the pad's edge with
    tear_limit_n: float | None = None   # N, the scene's tear force (from the `tear` events)
    peak_tension_n: float = 0.0
    peak_tension_at_s: float | None = None
    rated_n: float | None = None  # N, the thread's rated knot-pull strength (None: unrated, never breaks)
    broke_at_s: float | None = None   # when the thread first broke (a `break` event)
    breaks: int = 0
    knot: str | None = None
    throws: int | None = None
    knot_secure: bool = False
    gap_end_mm: float | None = None
    closed_at_end: bool = False
    reopened: int = 0
    tools: list[ToolUse] = field(default_factory=list)
    needle_drops: int = 0
    security: Security | None = None   # the knot security test, when it was run (`suturesim score --security`)
    penalties: list[Penalty] = field(default_factory=list)
    score: float = 0.0
    checks: list[Check] = field(default_factory=list)
    benchmarks: str = "the FLS's"  # whose benchmarks the checks are

    @property
    def tension_share(self) -> float | None:
        """The peak tension as a fraction of the thread's rated strength (None: an unrated thread)."""
        return None if not self.rated_n else self.peak_tension_n / self.rated_n

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_json(self) -> dict:
        out = asdict(self)
        out["passed"] = self.passed
        return out


def _z_row(q) -> np.ndarray:
    """The third row of the rotation matrix of the unit quaternion ``q`` (w, x, y, z): a body vector's world z."""
    w, x, y, z = (float(c) for c in q)
    return np.array([2.0 * (x * z - w * y), 2.0 * (y * z + w * x), 1.0 - 2.0 * (x * x + y * y)])


class Scorer:
    """Follows one attempt's stream: :meth:`feed` each message in order, :meth:`attempt` at any time."""

    def __init__(self, scenario: str = "", trainee: str = ""):
        self.a = Attempt(scenario=scenario, trainee=trainee)
        self.t0: float | None = None
        self.t_last = 0.0
        self.state: dict | None = None          # the newest state
        self.tools: dict[str, ToolUse] = {}
        # device -> (t s, position m, path m, idle s): its tool's jaw from the state's tools, and the point its
        # grasp holds (a scripted hand has no tool in the state), at the state's rate
        self.tool_paths: dict[str, tuple] = {}
        self.hand_paths: dict[str, tuple] = {}
        self.seen_side: dict[tuple[str, str], int] = {}
        self.exits: list[str] = []              # pads in the order their first exit came
        self.through: set[str] = set()
        self.needle_grips: set[str] = set()     # grasp ids holding the needle
        self.lateral_prev = 0.0                 # N: the needle's lateral forces summed, at the state before
        self.t_lateral: float | None = None     # s: that state's time
        self.pun_arc: dict[tuple, float] = {}   # (id, pad) -> m: where along the thread each puncture was
        self.closed_once = False
        self.last_gap_kind: str | None = None
        self.throws_at: dict[int, float] = {}
        self.face_z: float | None = None
        # (scene time, the scorer as it was then, where in _log the messages after it start): what a rollback
        # goes back to
        self._marks: list[tuple[float, dict, int]] = []
        self._log: list[tuple[str, dict]] = []

    # -- reading -----------------------------------------------------------------------------------------
    def feed_payload(self, topic: str | bytes, payload: bytes) -> None:
        """One published message as it came off the wire (``topic``, its msgpack payload)."""
        name = topic.decode() if isinstance(topic, bytes) else topic
        if name in ("state", "event"):
            self.feed(name, protocol.decode(payload, name))

    def feed(self, topic: str, msg: dict) -> None:
        """One decoded message of ``topic`` (``state`` or ``event``; any other is ignored). A `resume` that says
        the scene went back (``undone_s``) takes the score back with it (:meth:`_roll_back`)."""
        t = float(msg.get("t", self.t_last))
        if topic == "event" and msg.get("kind") == "resume" and isinstance(msg.get("undone_s"), (int, float)):
            self._roll_back(t - float(msg["undone_s"]))
            return
        if topic in ("state", "event"):
            self._mark()
            self._log.append((topic, msg))
        self.t_last = max(self.t_last, t)
        if topic == "state":
            self._state(t, msg)
        elif topic == "event":
            self._event(t, msg)

    def _mark(self) -> None:
        """A copy of the scorer as it is (before the message about to be read) every MARK_S s of scene time; the
        copies and messages older than KEEP_S dropped, the oldest copy kept."""
        marks = self._marks
        if marks and self.t_last < marks[-1][0] + MARK_S:
            return
        marks.append((self.t_last, copy.deepcopy({k: v for k, v in vars(self).items()
                                                  if k not in ("_marks", "_log")}), len(self._log)))
        while len(marks) > 1 and marks[1][0] <= self.t_last - KEEP_S:
            marks.pop(0)
        cut = marks[0][2]
        if cut:
            del self._log[:cut]
            self._marks[:] = [(t, state, at - cut) for t, state, at in marks]

    def _roll_back(self, t_back: float) -> None:
        """The scene went back to scene time ``t_back``: the scorer as it was at its newest copy no later than
        that, and the messages after the copy up to ``t_back`` read again. Nothing if no copy is that old (a
        scorer that joined later)."""
        k = next((i for i in range(len(self._marks) - 1, -1, -1) if self._marks[i][0] <= t_back), None)
        if k is None:
            return
        _, state, at = self._marks[k]
        again = [(topic, msg) for topic, msg in self._log[at:] if float(msg.get("t", t_back)) <= t_back]
        marks, log = self._marks[:k], self._log[:at]
        vars(self).update(copy.deepcopy(state))
        self._marks, self._log = marks, log
        for topic, msg in again:
            self.feed(topic, msg)

    def _since(self, t: float) -> float:
        return t - (self.t0 if self.t0 is not None else 0.0)

    @staticmethod
    def _moved(paths: dict, device: str, t: float, pos) -> None:
        """``device`` is at ``pos`` (m) at ``t``: its path (m) and idle time (s) so far in ``paths``."""
        p = (float(pos[0]), float(pos[1]), float(pos[2]))      # plain floats: numpy costs more for three
        t_before, p_before, length, idle = paths.get(device, (t, p, 0.0, 0.0))
        if t > t_before:
            step = math.dist(p, p_before)
            length += step
            if step < IDLE_SPEED * (t - t_before):
                idle += t - t_before
        paths[device] = (max(t, t_before), p, length, idle)

    def _tool(self, device: str) -> ToolUse:
        if device not in self.tools:
            self.tools[device] = ToolUse(device)
        return self.tools[device]

    def _state(self, t: float, st: dict) -> None:
        self.state = st
        tools = st.get("tools") or []
        if tools and self.t0 is None:
            self.t0 = t
        for tool in tools:
            self._tool(tool["device"])
            self._moved(self.tool_paths, tool["device"], t, tool["pos"])
        pulls: dict[str, list[float]] = {}
        for g in st.get("grasps") or []:
            if g.get("holds") == "tissue" and g.get("pad"):
                pull = math.hypot(*(float(c) for c in g["force"]))
                self.a.edge_peaks_n[g["pad"]] = max(self.a.edge_peaks_n.get(g["pad"], 0.0), pull)
            dev = g.get("device")
            if not dev:
                continue
            f = pulls.setdefault(dev, [0.0, 0.0, 0.0])
            for i in range(3):
                f[i] += float(g["force"][i])
            self._moved(self.hand_paths, dev, t, g["pos"])
        for dev, f in pulls.items():
            use = self._tool(dev)
            use.peak_force_n = max(use.peak_force_n, math.hypot(*f))
        tension = st.get("tension")
        if tension is not None and len(tension):
            peak = float(np.max(tension))
            if peak > self.a.peak_tension_n:
                self.a.peak_tension_n, self.a.peak_tension_at_s = peak, self._since(t)
        tissue = st.get("tissue") or {}
        targets = tissue.get("targets") or []
        if targets:
            self.a.marked = True
            self.face_z = float(np.mean([tg["pos"][2] for tg in targets]))
        elif tissue.get("pads"):
            self.face_z = max(float(p["pos"][2]) + 0.5 * float(p["size"][2]) for p in tissue["pads"])
        if tissue.get("gap") is not None:
            self.a.gap_end_mm = 1e3 * float(tissue["gap"])
        each = [float(p.get("lateral") or 0.0) for p in tissue.get("punctures") or []]
        lateral = sum(each)
        if lateral > 0.0 or self.lateral_prev > 0.0:
            self.a.peak_lateral_n = max([self.a.peak_lateral_n] + each)
            if self.t_lateral is not None:   # the trapezoid between this state and the one before
                self.a.lateral_impulse_ns += 0.5 * (lateral + self.lateral_prev) * max(0.0, t - self.t_lateral)
        self.lateral_prev, self.t_lateral = lateral, t
        self._drawn(tissue.get("punctures") or [])
        needle = st.get("needle")
        if needle is not None and self.face_z is not None and \
                any(p.get("on") == "needle" for p in tissue.get("punctures") or []):
            theta = np.linspace(0.0, needle["arc"], ARC_SAMPLES)
            r = needle["radius"]
            local = np.stack([r * np.sin(theta), r * (1.0 - np.cos(theta)), np.zeros_like(theta)], axis=1)
            z = float(np.min(local @ _z_row(needle["quat"]))) + needle["pos"][2]
            depth = 1e3 * (self.face_z - z)
            if self.a.bite_depth_mm is None or depth > self.a.bite_depth_mm:
                self.a.bite_depth_mm = depth

    def _drawn(self, punctures: list) -> None:
        """The thread drawn through each pad since the state before: its punctures' ``arc`` moved, the mean of
        their moves (the thread runs in at one and out at the other). A puncture is followed by its ``id`` and
        pad, from one state to the next while the thread runs through it."""
        now: dict[tuple, float] = {}
        moved: dict[str, list[float]] = {}
        for p in punctures:
            if p.get("on") != "thread" or p.get("arc") is None or p.get("id") is None:
                continue
            key = (p["id"], p["pad"])
            now[key] = float(p["arc"])
            if key in self.pun_arc:
                moved.setdefault(p["pad"], []).append(abs(now[key] - self.pun_arc[key]))
        for pad, d in moved.items():
            self.a.drawn_mm[pad] = self.a.drawn_mm.get(pad, 0.0) + 1e3 * sum(d) / len(d)
        self.pun_arc = now

    def _tip_angle(self) -> float | None:
        """The needle's tip to the horizontal face, degrees (90: square to it), from the newest state."""
        needle = (self.state or {}).get("needle")
        if needle is None:
            return None
        th = needle["arc"]
        tz = float(_z_row(needle["quat"]) @ [math.cos(th), math.sin(th), 0.0])     # the unit tangent's z
        return math.degrees(math.asin(min(1.0, abs(tz))))

    def _event(self, t: float, ev: dict) -> None:
        kind, a, since = ev.get("kind"), self.a, self._since(t)
        if kind in ("start", "load", "break") and isinstance(ev.get("strength"), (int, float)):
            a.rated_n = float(ev["strength"])
        if kind == "tear":
            a.tears += 1
            if isinstance(ev.get("limit"), (int, float)):
                a.tear_limit_n = float(ev["limit"])
        elif kind == "break":
            a.breaks += 1
            if a.broke_at_s is None:
                a.broke_at_s = since
        elif kind == "grasp":
            if ev.get("device"):
                self._tool(ev["device"]).grasps += 1
            if ev.get("holds") == "needle":
                self.needle_grips.add(ev.get("id"))
                if ev.get("device"):
                    a.phases.setdefault("needle grasped", since)
        elif kind == "release":
            if ev.get("id") in self.needle_grips:
                self.needle_grips.discard(ev.get("id"))
                in_tissue = any(p.get("on") == "needle"
                                for p in ((self.state or {}).get("tissue") or {}).get("punctures") or [])
                # letting go of the needle once the task is done is no drop
                if not self.needle_grips and not in_tissue and "cinched" not in a.phases:
                    a.needle_drops += 1
        elif kind == "grasp_missed" and ev.get("device"):
            self._tool(ev["device"]).missed_grasps += 1
        elif kind == "clutch" and ev.get("on") and ev.get("device"):
            self._tool(ev["device"]).clutches += 1
        elif kind == "puncture":
            self._puncture(since, ev)
        elif kind == "needle_out":
            a.withdrawals += 1
        elif kind == "thread_through":
            self.through.add(ev.get("pad"))
            if self.exits and set(self.exits) <= self.through:
                a.phases.setdefault("pulled through", since)
        elif kind == "throw":
            self._throws(int(ev.get("throws") or 0), since)
            self._cinched(since)
        elif kind == "knot":
            a.knot = ev.get("name")
            if ev.get("throws") is not None:
                self._throws(int(ev["throws"]), since)
            self._cinched(since)
        elif kind == "gap_closed":
            self.closed_once = True
            self.last_gap_kind = kind
            self._cinched(since)
        elif kind == "gap_opened":
            if self.closed_once:
                a.reopened += 1
            self.last_gap_kind = kind

    def _throws(self, n: int, since: float) -> None:
        """The knot has ``n`` throws now (a `throw` event, or a `knot` event that names its throws)."""
        for k in range(1, n + 1):
            if k not in self.throws_at:
                self.throws_at[k] = since
                self.a.phases.setdefault(f"throw {k}", since)
        self.a.throws = n

    def _puncture(self, since: float, ev: dict) -> None:
        a, key = self.a, (ev.get("pad"), ev.get("side"))
        self.seen_side[key] = self.seen_side.get(key, 0) + 1
        if self.seen_side[key] > 1:
            a.extra_punctures += 1
            return
        if ev.get("side") == "exit" and ev.get("pad") not in self.exits:
            self.exits.append(ev.get("pad"))
            a.phases.setdefault(f"bite {len(self.exits)}", since)
        targets = ((self.state or {}).get("tissue") or {}).get("targets") or []
        for tg in targets:
            if tg["pad"] == ev.get("pad") and tg["kind"] == ev.get("side"):
                off = np.asarray(ev["pos"], float) - np.asarray(tg["pos"], float)
                a.placements.append(Placement(
                    target=tg["id"], pad=tg["pad"], side=tg["kind"], t=since,
                    offset_mm=1e3 * float(np.hypot(off[0], off[1])),
                    angle_deg=self._tip_angle() if ev.get("side") == "entry" else None))

    def _cinched(self, since: float) -> None:
        """The knot has its throws and the wound is closed: the task is done (the first time both hold)."""
        a = self.a
        if "cinched" not in a.phases and self.last_gap_kind == "gap_closed" and (a.throws or 0) >= TASK_THROWS:
            a.phases["cinched"] = since

    # -- the result --------------------------------------------------------------------------------------
    def attempt(self) -> Attempt:
        """The attempt as read so far, its penalties, score and benchmark checks computed."""
        a = self.a
        a.clock_start_s = self.t0 if self.t0 is not None else 0.0
        a.duration_s = self._since(self.t_last)
        for d, use in self.tools.items():
            path = self.tool_paths.get(d) or self.hand_paths.get(d)
            if path is not None:
                use.path_m, use.idle_s = path[2], path[3]
        a.tools = [self.tools[d] for d in sorted(self.tools)]
        a.knot_secure = a.knot in SECURE_KNOTS
        a.closed_at_end = self.last_gap_kind == "gap_closed"
        a.completed_s = a.phases.get("cinched")
        return rescore(a)


def rescore(a: Attempt) -> Attempt:
    """``a``'s penalties, score and FLS checks from its metrics (again, after the security test is added)."""
    a.penalties = penalties(a)
    lost = sum(p.points for p in a.penalties)
    a.score = 0.0 if a.completed_s is None else max(0.0, SCORE_CUTOFF - a.completed_s - lost)
    a.checks = fls_checks(a)
    return a


def penalties(a: Attempt) -> list[Penalty]:
    """The penalties of ``a`` (docs/ASSESSMENT.md Sec. 2)."""
    out = []
    for p in a.placements:
        if p.offset_mm > 0.0:
            out.append(Penalty(f"{p.target} off its mark", POINTS_PER_MM_OFF_MARK * p.offset_mm,
                               f"{p.offset_mm:.2f} mm from the mark, a point a mm"))
    if not a.closed_at_end and a.gap_end_mm is not None:
        out.append(Penalty("wound open", POINTS_PER_MM_GAP * a.gap_end_mm,
                           f"a gap of {a.gap_end_mm:.2f} mm at the end, a point a mm"))
    if a.completed_s is not None and not a.knot_secure:
        out.append(Penalty("knot not square", POINTS_INSECURE_KNOT, f"{a.knot} can slip"))
    if a.extra_punctures or a.withdrawals:
        n = a.extra_punctures + a.withdrawals
        out.append(Penalty("extra holes", POINTS_EXTRA_PUNCTURE * n,
                           f"{a.extra_punctures} extra punctures, {a.withdrawals} withdrawals"))
    if a.needle_drops:
        out.append(Penalty("needle dropped", POINTS_NEEDLE_DROP * a.needle_drops, f"{a.needle_drops} times"))
    if a.tears:
        out.append(Penalty("tissue torn", POINTS_TEAR * a.tears,
                           f"{a.tears} punctures levered past {a.tear_limit_n or 0.0:g} N across the needle"))
    if a.breaks and a.completed_s is not None:
        out.append(Penalty("thread broke", SCORE_CUTOFF,
                           f"pulled past its rated {a.rated_n or 0.0:g} N at {a.broke_at_s:.2f} s: a new suture"))
    sec = a.security
    if sec is not None and a.completed_s is not None:
        if sec.outcome == "slips":
            out.append(Penalty("knot slipped", POINTS_KNOT_SLIP,
                               f"still slipping at {sec.tension_n:g} N a side: {sec.creep_mm:.1f} mm in the "
                               f"hold's last {SECURITY_CREEP_S:g} s"))
        elif sec.outcome in ("undone", "slack", "opens"):
            # a knot that pulls through, or lets the wound open under the load, holds nothing: the task undone
            out.append(Penalty("knot came apart", SCORE_CUTOFF,
                               f"{'the wound opened' if sec.outcome == 'opens' else 'pulled through'} at "
                               f"{sec.tension_n:g} N a side"))
    return out


def fls_checks(a: Attempt) -> list[Check]:
    """The FLS intracorporeal suturing task's proficiency benchmarks against ``a``."""
    worst = max((p.offset_mm for p in a.placements), default=None)
    checks = [Check("time (s)", a.completed_s, FLS_TIME_S,
                    a.completed_s is not None and a.completed_s <= FLS_TIME_S)]
    if a.marked:            # a scene without marks has no accuracy to check
        checks.append(Check("worst mark (mm)", worst, FLS_DEVIATION_MM,
                            worst is not None and worst <= FLS_DEVIATION_MM))
    checks += [Check("square knot", a.knot_secure, True, a.knot_secure),
               Check("wound closed at the end", a.closed_at_end, True, a.closed_at_end)]
    if a.security is not None:   # the FLS: no knot slippage
        checks.append(Check("knot holds under tension", a.security.held, True, a.security.held))
    if a.rated_n is not None or a.breaks:   # a rated thread, pulled past its rating, breaks
        checks.append(Check("thread not broken", a.breaks == 0, True, a.breaks == 0))
    return checks
