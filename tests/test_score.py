"""The suture attempt's score (server/assessment.py, tools/score.py): each metric on a constructed stream whose
answer is known, and `suturesim score` on a recording."""
from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest

from suturesim.server import protocol
from suturesim.server.recording import McapRecorder
from suturesim.server.assessment import (FLS_TIME_S, POINTS_EXTRA_PUNCTURE, POINTS_INSECURE_KNOT,
                                        POINTS_KNOT_SLIP, POINTS_NEEDLE_DROP, POINTS_TEAR, SCORE_CUTOFF, Scorer,
                                        Security, rescore)
from suturesim.tools.score import run_score, table

MARKS = [{"id": "in", "pad": "left", "pos": [-0.005, 0.0, 0.0], "kind": "entry"},
         {"id": "out", "pad": "right", "pos": [0.005, 0.0, 0.0], "kind": "exit"}]
PADS = [{"id": "left", "pos": [-0.012, 0.0, -0.005], "size": [0.02, 0.03, 0.01]},
        {"id": "right", "pos": [0.012, 0.0, -0.005], "size": [0.02, 0.03, 0.01]}]
# a needle upright in the x-z plane, its swage at the top of its circle (radius 8 mm, centre 6 mm above the
# face), its arc half the circle: body x -> -x, body y -> -z
NEEDLE = {"pos": [0.0, 0.0, 0.014], "quat": [0.0, 0.0, math.sqrt(0.5), -math.sqrt(0.5)], "radius": 0.008,
          "arc": math.pi, "tip": [0.0, 0.0, 0.0], "torque": [0.0, 0.0, 0.0]}


class Stream:
    """A suture's stream built by hand: states at 100 Hz with two tools, and events where a test puts them."""

    def __init__(self, marks=MARKS):
        self.msgs: list[tuple[str, dict]] = []
        self.t = 0.0
        self.marks = marks
        self.tool_pos = {"stylus0": np.zeros(3), "stylus1": np.array([-0.05, 0.0, 0.0])}
        self.punctures: list[dict] = []
        self.gap = 0.003
        self.tension = 0.1
        self.lateral = 0.0   # N, the needle's lateral force at each puncture it runs through
        self.grasps: list[dict] = []   # state.grasps

    def state(self, needle: dict | None = None) -> None:
        punctures = [dict(p, lateral=self.lateral) if p["on"] == "needle" else p for p in self.punctures]
        tissue = {"pads": PADS, "punctures": punctures, "gap": self.gap, "knot": "unknot", "throws": 0}
        if self.marks:
            tissue["targets"] = self.marks
        tools = [{"device": d, "pos": list(p), "quat": [1.0, 0.0, 0.0, 0.0]} for d, p in self.tool_pos.items()]
        self.msgs.append(("state", {"t": self.t, "tension": np.full(4, self.tension), "tissue": tissue,
                                    "tools": tools, "grasps": self.grasps,
                                    **({"needle": needle} if needle else {})}))

    def run(self, seconds: float, move: dict | None = None) -> None:
        """States for ``seconds``, each tool in ``move`` going at its velocity (m/s)."""
        for _ in range(int(round(seconds * 100))):
            self.t += 0.01
            for d, v in (move or {}).items():
                self.tool_pos[d] = self.tool_pos[d] + 0.01 * np.asarray(v, float)
            self.state()

    def event(self, kind: str, **details) -> None:
        self.msgs.append(("event", {"t": self.t, "kind": kind, **details}))

    def suture(self, entry=(-0.005, 0.0, 0.0), exit_=(0.005, 0.0, 0.0), second: str = "surgeon's knot",
               extra: int = 0, drop: bool = False, pause: float = 0.0) -> None:
        """A whole suture: the needle taken at 1 s, the bite through both edges, the thread drawn through, a
        double throw and ``second`` on it, the second throw at 38 s (and ``pause`` s), both hands let go."""
        self.state()
        self.run(1.0)
        self.event("grasp", id="grasp0", device="stylus0", holds="needle", vertex=0)
        if drop:
            self.run(1.0)
            self.event("release", id="grasp0", device="stylus0", holds="needle")
            self.run(1.0)
            self.event("grasp", id="grasp1", device="stylus0", holds="needle", vertex=0)
        self.run(4.0, {"stylus0": (0.01, 0.0, 0.0)})                  # 40 mm in 4 s
        for _ in range(extra):
            self.event("puncture", pad="left", side="entry", pos=[-0.003, 0.0, 0.0])
            self.event("needle_out", pad="left")
        self.punctures = [{"pad": "left", "pos": list(entry), "on": "needle", "drag": 0.0}]
        self.state(NEEDLE)
        self.event("puncture", pad="left", side="entry", pos=list(entry))
        self.run(1.0)
        self.event("puncture", pad="left", side="exit", pos=[-0.002, 0.0, -0.001])
        self.run(1.0)
        self.event("puncture", pad="right", side="entry", pos=[0.002, 0.0, -0.001])
        self.run(1.0)
        self.event("puncture", pad="right", side="exit", pos=list(exit_))
        self.punctures = [dict(p, on="thread") for p in self.punctures]
        self.run(5.0)
        self.event("thread_through", pad="left")
        self.event("thread_through", pad="right")
        self.run(10.0)
        self.event("knot", name="double throw", hand="left", throws=1)
        self.event("throw", throws=1, linking=1.0)
        self.gap = 0.0003
        self.event("gap_closed", gap=self.gap)
        self.tension = 3.2
        self.run(15.0 + pause)
        self.tension = 0.2
        self.event("knot", name=second, hand="", throws=2)
        self.event("throw", throws=2, linking=0.0)
        self.run(1.0)
        self.event("release", id="grasp1" if drop else "grasp0", device="stylus0", holds="needle")
        self.run(2.0)

    def scored(self):
        sc = Scorer("test")
        for topic, msg in self.msgs:
            sc.feed(topic, msg)
        return sc.attempt()


def test_a_clean_suture_has_its_phases_its_marks_and_the_fls_score():
    s = Stream()
    s.suture()
    a = s.scored()
    assert list(a.phases) == ["needle grasped", "bite 1", "bite 2", "pulled through", "throw 1", "throw 2",
                              "cinched"]
    assert a.phases["needle grasped"] == pytest.approx(1.0)
    assert a.phases["cinched"] == pytest.approx(38.0)
    assert [(p.target, round(p.offset_mm, 9)) for p in a.placements] == [("in", 0.0), ("out", 0.0)]
    assert a.knot == "surgeon's knot" and a.knot_secure and a.closed_at_end
    assert a.penalties == []
    assert a.score == pytest.approx(SCORE_CUTOFF - 38.0)
    assert a.passed, a.checks


def test_a_known_entry_offset_gives_that_distance_and_its_penalty():
    s = Stream()
    s.suture(entry=(-0.005 + 0.0012, 0.0009, 0.0))            # 1.5 mm off on the face
    a = s.scored()
    assert a.placements[0].offset_mm == pytest.approx(1.5)
    assert a.score == pytest.approx(SCORE_CUTOFF - 38.0 - 1.5)
    mark = [c for c in a.checks if c.what.startswith("worst mark")][0]
    assert not mark.passed and mark.value == pytest.approx(1.5)
    assert not a.passed


def test_the_entry_angle_and_the_bite_depth_come_from_the_needle():
    """The needle's circle (radius 8 mm, centre 6 mm above the face) meets the face at arc angle th0 with its
    tangent at asin(sqrt(8^2 - 6^2) / 8) = 41.4 degrees to it; drawn on to half the circle it reaches 2 mm
    below the face."""
    s = Stream()
    # the arc drawn to where it meets the face: the tip there
    th0 = math.pi - math.acos(6.0 / 8.0)
    s.suture()
    for topic, msg in s.msgs:
        if topic == "state" and "needle" in msg:
            msg["needle"] = dict(NEEDLE, arc=th0)
    a = s.scored()
    assert a.placements[0].angle_deg == pytest.approx(math.degrees(math.asin(math.sqrt(28.0) / 8.0)), abs=1e-6)
    assert a.bite_depth_mm == pytest.approx(0.0, abs=1e-6)         # the arc drawn only down to the face
    s = Stream()
    s.suture()
    assert s.scored().bite_depth_mm == pytest.approx(2.0, rel=0.01)   # half the circle: its lowest point


def test_a_granny_second_throw_is_named_and_penalised():
    s = Stream()
    s.suture(second="granny knot")
    a = s.scored()
    assert a.knot == "granny knot" and not a.knot_secure
    assert [p.what for p in a.penalties] == ["knot not square"]
    assert a.score == pytest.approx(SCORE_CUTOFF - 38.0 - POINTS_INSECURE_KNOT)
    assert not [c for c in a.checks if c.what == "square knot"][0].passed


def security(outcome: str, slip_mm: float | None) -> Security:
    return Security(tension_n=1.0, ends=(0, 80), outcome=outcome, slip_mm=slip_mm, creep_mm=0.1, taut_s=0.8,
                    hold_s=3.0, gap_mm=0.3, closed_under_load=True, knot_before="surgeon's knot",
                    knot_after="surgeon's knot")


def test_the_knot_security_test_penalises_a_slip_and_zeroes_a_knot_that_pulls_through():
    s = Stream()
    s.suture()
    held = s.scored()
    held.security = security("holds", 0.2)
    rescore(held)
    assert held.penalties == [] and held.score == pytest.approx(SCORE_CUTOFF - 38.0)
    assert [(c.what, c.passed) for c in held.checks][-1] == ("knot holds under tension", True) and held.passed
    assert held.security.line() == ("knot security at 1 N a side: holds, slip 0.20 mm in 3 s, 0.10 mm in its last "
                                    "2 s, gap under the load 0.30 mm (closed), knot surgeon's knot -> surgeon's knot")
    slipped = s.scored()
    slipped.security = security("slips", 4.0)
    rescore(slipped)
    assert [p.what for p in slipped.penalties] == ["knot slipped"]
    assert slipped.score == pytest.approx(SCORE_CUTOFF - 38.0 - POINTS_KNOT_SLIP) and not slipped.passed
    undone = s.scored()
    undone.security = security("undone", None)
    rescore(undone)
    assert [p.what for p in undone.penalties] == ["knot came apart"] and undone.score == 0.0
    # an attempt that never finished has no knot to test: no penalty beyond its zero
    unfinished = Stream()
    unfinished.run(5.0)
    u = unfinished.scored()
    u.security = security("undone", None)
    assert not [p for p in rescore(u).penalties if p.what.startswith("knot")] and u.score == 0.0
    # the JSON carries it
    assert json.loads(json.dumps(slipped.to_json()))["security"]["slip_mm"] == 4.0


def test_extra_holes_and_a_dropped_needle_are_counted_but_not_letting_go_at_the_end():
    s = Stream()
    s.suture(extra=2, drop=True)
    a = s.scored()
    assert (a.extra_punctures, a.withdrawals, a.needle_drops) == (2, 2, 1)
    # the first grasp after the drop is not a new phase, and the entry mark is scored on the first entry, 2 mm
    # from it
    assert a.phases["needle grasped"] == pytest.approx(1.0)
    assert a.placements[0].offset_mm == pytest.approx(2.0)
    assert a.score == pytest.approx(SCORE_CUTOFF - a.completed_s - 2.0 - 4 * POINTS_EXTRA_PUNCTURE
                                    - POINTS_NEEDLE_DROP)


def test_a_rollback_after_a_fault_takes_the_score_back_with_the_scene():
    """The entry made, then the solver faults 0.2 s later and the scene goes back 0.4 s, to before it (a
    `resume` with ``undone_s``; the jaw let go): the entry made again, 1 mm off the mark, is the entry, not an
    extra hole, and the score reads the stream as if the undone part had not been."""
    s = Stream()
    s.state()
    s.run(1.0)
    s.event("grasp", id="grasp0", device="stylus0", holds="needle", vertex=0)
    s.run(4.0, {"stylus0": (0.01, 0.0, 0.0)})
    s.punctures = [{"pad": "left", "pos": [-0.005, 0.0, 0.0], "on": "needle", "drag": 0.0}]
    s.state(NEEDLE)
    s.event("puncture", pad="left", side="entry", pos=[-0.005, 0.0, 0.0])
    s.run(0.2)
    s.event("fault", reason="the solver diverged")
    s.event("release", id="grasp0", device="stylus0", holds="needle")
    s.event("resume", reason="rolled back after a fault", scene_t=s.t, undone_s=0.4)
    s.punctures = []
    s.run(0.5)
    s.event("grasp", id="grasp1", device="stylus0", holds="needle", vertex=0)
    s.run(1.0)
    s.punctures = [{"pad": "left", "pos": [-0.004, 0.0, 0.0], "on": "needle", "drag": 0.0}]
    s.state(NEEDLE)
    s.event("puncture", pad="left", side="entry", pos=[-0.004, 0.0, 0.0])
    s.run(1.0)
    a = s.scored()
    assert (a.extra_punctures, a.needle_drops) == (0, 0)
    assert [(p.target, round(p.offset_mm, 6)) for p in a.placements] == [("in", 1.0)]
    assert a.phases["needle grasped"] == pytest.approx(1.0) and a.duration_s == pytest.approx(s.t)
    assert a.tools[0].grasps == 2     # the grasp before the fault stands: it was made before the scene's copy


def test_tool_paths_idle_time_clutches_and_peak_tension():
    s = Stream()
    s.suture()
    s.event("clutch", device="stylus1", on=True)
    s.event("clutch", device="stylus1", on=False)
    a = s.scored()
    right, left = a.tools
    assert right.path_m == pytest.approx(0.040)                   # 4 s at 10 mm/s
    assert left.path_m == 0.0 and left.clutches == 1
    assert left.idle_s == pytest.approx(a.duration_s, abs=0.02)
    assert right.idle_s == pytest.approx(a.duration_s - 4.0, abs=0.02)
    assert a.peak_tension_n == pytest.approx(3.2)


def test_the_force_on_a_tissue_edge_held_by_forceps_is_its_peak_per_pad():
    """Forceps hold the left pad's edge: the most their coupling pulled it with is that pad's peak; a grasp on
    the thread, pulling harder, is not the tissue's."""
    s = Stream()
    s.state()
    s.run(1.0)
    left = {"id": "grasp1", "vertex": -1, "pad": "left", "holds": "tissue", "device": "stylus1",
            "pos": [-0.012, 0.0, -0.005]}
    thread = {"id": "grasp0", "vertex": 40, "holds": "thread", "device": "stylus0", "pos": [0.0, 0.0, 0.01],
              "force": [0.0, 0.0, 2.5]}
    s.grasps = [dict(left, force=[0.3, 0.0, 0.0]), thread]
    s.run(1.0)
    s.grasps = [dict(left, force=[0.6, 0.0, 0.8]), thread]
    s.run(0.05)
    s.grasps = [dict(left, force=[0.2, 0.0, 0.0])]
    s.run(1.0)
    a = s.scored()
    assert a.edge_peaks_n == {"left": pytest.approx(1.0)}
    assert "edges held by forceps: left peak 1.00 N" in table(a)
    assert Stream().scored().edge_peaks_n == {}


def test_the_thread_drawn_through_each_pad_is_read_from_its_punctures_arc():
    """Two punctures of the left pad, the thread running through both, 2 mm further along it each state for
    20 states, then 1 mm back for 5: 45 mm drawn through the left pad. The right pad's one puncture, 1 mm a state
    for 10 states, is 10 mm; a puncture the needle runs through draws no thread, and a slot that closes and opens
    again on another pad does not count as a move."""
    s = Stream()
    s.state()

    def at(arc: float, k: int) -> None:
        s.punctures = [{"id": 0, "pad": "left", "pos": [-0.005, 0.0, 0.0], "on": "thread", "drag": 0.1, "arc": arc},
                       {"id": 1, "pad": "left", "pos": [-0.002, 0.0, -0.001], "on": "thread", "drag": 0.1,
                        "arc": arc + 0.004},
                       {"id": 2, "pad": "right", "pos": [0.002, 0.0, -0.001], "on": "needle", "drag": 0.0}]
        if k >= 25:
            s.punctures[2] = {"id": 2, "pad": "right", "pos": [0.002, 0.0, -0.001], "on": "thread", "drag": 0.1,
                              "arc": 0.001 * (k - 25)}
        s.state()

    for k in range(21):
        at(0.002 * k, k)
    for k in range(21, 26):
        at(0.040 - 0.001 * (k - 20), k)
    for k in range(26, 36):
        at(0.035, k)
    s.punctures = [{"id": 2, "pad": "left", "pos": [-0.003, 0.0, 0.0], "on": "thread", "drag": 0.1, "arc": 0.09}]
    s.state()
    a = s.scored()
    assert a.drawn_mm == {"left": pytest.approx(45.0), "right": pytest.approx(10.0)}
    assert "thread drawn through the tissue: left 45.0 mm, right 10.0 mm" in table(a)


def test_the_needle_levered_across_its_punctures_is_measured_and_a_tear_penalised():
    s = Stream()
    s.lateral = 0.5
    s.suture()            # the needle runs through the entry's puncture for 3 s, at 0.5 N across it
    clean = s.scored()
    assert clean.peak_lateral_n == pytest.approx(0.5)
    assert clean.lateral_impulse_ns == pytest.approx(0.5 * 3.0, abs=0.01)   # a state's interval at the ends
    assert clean.tears == 0 and clean.penalties == []
    s = Stream()
    s.lateral = 2.5
    s.suture()
    s.event("tear", pad="left", force=2.5, limit=2.0, pos=[-0.005, 0.0, 0.0])
    torn = s.scored()
    assert torn.peak_lateral_n == pytest.approx(2.5) and torn.tears == 1 and torn.tear_limit_n == 2.0
    assert [p.what for p in torn.penalties] == ["tissue torn"]
    assert torn.score == pytest.approx(clean.score - POINTS_TEAR)


def test_the_peak_tension_is_read_against_the_rating_and_a_broken_thread_scores_zero():
    s = Stream()
    s.event("start", scenario="test", strength=4.0)
    s.suture()
    a = s.scored()
    assert a.rated_n == 4.0 and a.tension_share == pytest.approx(3.2 / 4.0)
    assert a.breaks == 0 and a.score > 0.0
    s = Stream()
    s.suture()
    s.event("break", segment=12, arc=0.05, pos=[0.0, 0.0, 0.01], tension=2.1, strength=1.96)
    broken = s.scored()
    assert broken.rated_n == 1.96 and broken.breaks == 1 and broken.broke_at_s == pytest.approx(s.t)
    assert [p.what for p in broken.penalties] == ["thread broke"] and broken.score == 0.0
    assert [c.what for c in broken.checks if not c.passed] == ["thread not broken"]
    assert [c.what for c in a.checks][-1] == "thread not broken" and a.passed
    assert Stream().scored().tension_share is None      # an unrated thread


def test_an_unfinished_suture_scores_zero_and_a_wound_left_open_is_penalised():
    s = Stream()
    s.state()
    s.run(1.0)
    s.event("grasp", id="grasp0", device="stylus0", holds="needle", vertex=0)
    s.run(1.0)
    a = s.scored()
    assert a.completed_s is None and a.score == 0.0
    assert [p.what for p in a.penalties] == ["wound open"]
    assert a.penalties[0].points == pytest.approx(3.0)
    assert not [c for c in a.checks if c.what == "time (s)"][0].passed
    assert FLS_TIME_S == 112.0


def test_a_scene_without_marks_has_no_accuracy_check():
    s = Stream(marks=None)
    s.suture()
    a = s.scored()
    assert a.placements == [] and not a.marked
    assert [c.what for c in a.checks] == ["time (s)", "square knot", "wound closed at the end"]
    assert a.passed


START_NS = 1_795_000_000 * 10**9          # 2026-11-18T11:06:40Z


def encode(seq: int, topic: str, m: dict) -> bytes:
    """A Stream's message as the server publishes it."""
    t = m["t"]
    if topic == "state":
        return protocol.encode_state(seq, t, np.zeros((5, 3)), np.asarray(m["tension"]), 0.0, [], 0,
                                     {"kinetic": 0.0, "elastic": 0.0, "gravity": 0.0},
                                     {"iters": 1, "residual": 0.0, "substeps": 1}, tissue=m["tissue"],
                                     needle=m.get("needle"), tools=m["tools"])
    if topic == "force":
        return protocol.encode_force(seq, t, m["device"], [0.0, 0.0, 0.0], m["force"], 0.0, 0)
    return protocol.encode_event(seq, t, m["kind"], **{k: v for k, v in m.items() if k not in ("t", "kind")})


def _record(path, msgs, trainee: str | None = None) -> None:
    meta = {"scenario": {"name": "suture-practice", "file": "", "yaml": ""}}
    if trainee:
        meta["server"] = {"trainee": trainee}
    rec = McapRecorder(path, metadata=meta)
    for seq, (topic, m) in enumerate(msgs):
        rec.write(topic, encode(seq, topic, m), START_NS + int(m["t"] * 1e9))
    rec.close()


def test_score_reads_a_recording_and_a_course_of_them(tmp_path, capsys):
    good, bad = Stream(), Stream()
    good.suture()
    bad.suture(entry=(-0.003, 0.0, 0.0), second="granny knot")
    _record(tmp_path / "a.mcap", good.msgs, trainee="ana")
    _record(tmp_path / "b.mcap", bad.msgs)
    (tmp_path / "c.mcap").write_bytes(b"not a recording")
    assert run_score(str(tmp_path / "a.mcap"), as_json=True) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["trainee"] == "ana" and a["scenario"] == "suture-practice" and a["passed"]
    assert a["started"] == "2026-11-18T11:06:40+00:00"
    assert a["score"] == pytest.approx(SCORE_CUTOFF - 38.0)
    assert run_score(str(tmp_path / "a.mcap")) == 0
    assert "surgeon's knot" in capsys.readouterr().out
    out = io.StringIO()
    assert run_score(str(tmp_path), out=out) == 0
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [r["file"] for r in rows] == ["a.mcap", "b.mcap", "c.mcap"]
    assert rows[0]["passed"] == "True" and rows[1]["passed"] == "False"
    assert float(rows[1]["score"]) == pytest.approx(SCORE_CUTOFF - 38.0 - 2.0 - POINTS_INSECURE_KNOT)
    assert rows[2]["error"] and not rows[2]["score"]
    assert run_score(str(tmp_path / "c.mcap")) == 2
    assert "suturesim score:" in capsys.readouterr().err


def test_the_html_report_draws_the_attempt_and_escapes_what_the_recording_says(tmp_path, capsys):
    s = Stream()
    s.suture(exit_=(0.006, 0.0, 0.0))
    for topic, msg in s.msgs:
        if topic == "state":
            s.msgs.append(("force", {"t": msg["t"], "device": "stylus0", "force": [0.0, 0.0, 1.0]}))
    s.msgs.sort(key=lambda tm: tm[1]["t"])
    _record(tmp_path / "a.mcap", s.msgs, trainee="<script>x()</script>")
    out = tmp_path / "a.html"
    assert run_score(str(tmp_path / "a.mcap"), html=str(out)) == 0
    page = out.read_text()
    assert "<script>" not in page and "&lt;script&gt;x()&lt;/script&gt;" in page
    assert f"{SCORE_CUTOFF - 38.0 - 1.0:.1f}" in page                     # the exit 1 mm off its mark
    assert page.count("<svg") == 5 and page.count("<polyline") == 3      # the force, the tension, the gap
    assert "in mark" in page and "out mark" in page and page.count("<circle") >= 4 + 7
    assert run_score(str(tmp_path / "a.mcap"), html=str(tmp_path / "no" / "such" / "dir.html")) == 2
    assert "cannot write the report" in capsys.readouterr().err


def test_an_instructors_experts_set_the_benchmarks(tmp_path, capsys):
    """Two experts: one 1.5 mm off the exit mark at 38 s, one on it at 48 s. Each metric's benchmark is the
    least good expert's: 48 s, 1.5 mm, 1.5 penalty points. A trainee 1.2 mm off at 43 s passes them (and fails the
    FLS's 1 mm); one on the mark at 58 s fails on time alone; every expert passes their own benchmarks."""
    experts, course = tmp_path / "experts", tmp_path / "course"
    experts.mkdir()
    course.mkdir()
    for name, kw in (("a", {"exit_": (0.0065, 0.0, 0.0)}), ("b", {"pause": 10.0})):
        s = Stream()
        s.suture(**kw)
        _record(experts / f"{name}.mcap", s.msgs)
    for name, kw in (("close", {"exit_": (0.0062, 0.0, 0.0), "pause": 5.0}), ("slow", {"pause": 20.0})):
        s = Stream()
        s.suture(**kw)
        _record(course / f"{name}.mcap", s.msgs)
    assert run_score(str(course / "close.mcap"), as_json=True) == 0
    fls = json.loads(capsys.readouterr().out)
    assert not fls["passed"] and ["worst mark (mm)", pytest.approx(1.2), 1.0, False] in \
        [[c["what"], c["value"], c["limit"], c["passed"]] for c in fls["checks"]]
    assert run_score(str(course / "close.mcap"), as_json=True, benchmarks=str(experts)) == 0
    a = json.loads(capsys.readouterr().out)
    limits = {c["what"]: c["limit"] for c in a["checks"]}
    assert limits["time (s)"] == pytest.approx(48.0) and limits["worst mark (mm)"] == pytest.approx(1.5)
    assert limits["penalty points"] == pytest.approx(1.5) and a["passed"], a["checks"]
    assert "2 expert recordings" in a["benchmarks"]
    out = io.StringIO()
    assert run_score(str(course), out=out, benchmarks=str(experts)) == 0
    assert [(r["file"], r["passed"]) for r in csv.DictReader(io.StringIO(out.getvalue()))] == \
        [("close.mcap", "True"), ("slow.mcap", "False")]
    out = io.StringIO()
    assert run_score(str(experts), out=out, benchmarks=str(experts)) == 0
    assert {r["passed"] for r in csv.DictReader(io.StringIO(out.getvalue()))} == {"True"}
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    s = Stream()
    s.state()
    s.run(1.0)
    _record(unfinished / "u.mcap", s.msgs)
    assert run_score(str(course / "close.mcap"), benchmarks=str(unfinished)) == 2
    assert "no recording in it finished the task" in capsys.readouterr().err


# simple-interrupted-suture's second throw tied as its first was (docs/ASSESSMENT.md Sec. 3): the right hand holds
# the needle's strand up behind the wound, the tail goes round in front of it, behind, and through the loop under
# the crossing back to front, and the hands pull out to the sides they came from: a half knot of the first
# throw's hand, which makes the surgeon's knot's granny form
GRANNY_SECOND_THROW = [
    "timeline.5.waypoints=[[17.0, 0.034, 0.0, 0.017], [17.7, 0.018, 0.006, 0.026], [18.5, -0.004, 0.006, 0.028], "
    "[21.5, -0.004, 0.006, 0.028], [21.9, 0.0215, 0.004, 0.018], [22.9, 0.043, 0.0, 0.003], "
    "[24.0, 0.043, 0.0, 0.003], [24.7, 0.0344, 0.0, 0.003]]",
    "timeline.6.waypoints=[[17.0, -0.036, 0.0, 0.012], [17.7, -0.015, -0.010, 0.020], [18.5, 0.006, -0.010, 0.022], "
    "[19.1, 0.014, 0.0, 0.020], [19.7, 0.008, 0.016, 0.014], [20.3, 0.0, 0.014, 0.005], [20.9, 0.0, -0.012, 0.005], "
    "[21.5, -0.0215, -0.004, 0.010], [22.9, -0.043, 0.0, 0.003], [24.0, -0.043, 0.0, 0.003], "
    "[24.7, -0.0357, 0.0, 0.003]]"]


@pytest.mark.long(cost=40)
def test_the_scripted_suture_scores_and_a_sloppier_bite_or_a_granny_loses_only_on_what_it_spoils(tmp_path):
    """simple-interrupted-suture, run headless and recorded, then scored: its bite on the marks, a surgeon's knot,
    the wound closed, every benchmark passed. The same script with the needle set 1.5 mm to the right
    (`suturesim run --set shape.start=...`) bites 1.5 mm off both marks and loses exactly those millimetres: the
    same phases, done at the same time, the same knot and wound, and only the accuracy benchmark failed. With its
    second throw tied as the first was, the knot is the surgeon's granny: the same phases and marks, the knot's
    20 points lost and only the square knot's benchmark failed."""
    from suturesim.server.headless import run_scenario
    from suturesim.solver.scenario import load_scenario
    from suturesim.tools.score import score_recording

    scored = {}
    for name, sets in (("clean", []), ("sloppy", ["shape.start=[0.0015, 0.0, 0.0143908]"]),
                       ("granny", GRANNY_SECOND_THROW)):
        path = tmp_path / f"{name}.mcap"
        run_scenario(load_scenario("simple-interrupted-suture", assignments=sets), duration=21.5, record=str(path))
        scored[name] = score_recording(path)
    clean, sloppy = scored["clean"], scored["sloppy"]
    assert [p.target for p in clean.placements] == ["entry", "exit"]
    assert all(p.offset_mm < 0.1 for p in clean.placements), clean.placements
    assert clean.knot == "surgeon's knot" and clean.closed_at_end and clean.passed, clean.checks
    # a clean bite tears nothing, and the cinch stays well under the 3-0 silk's rating
    assert clean.tears == 0 and clean.breaks == 0 and clean.peak_lateral_n < 0.5
    assert clean.rated_n == 9.41 and clean.tension_share < 0.6
    # the thread is drawn through both pads, and no more of it than there is (the tail stays out)
    assert all(40.0 < clean.drawn_mm[pad] < 100.0 for pad in ("left", "right")), clean.drawn_mm
    assert [p.offset_mm for p in sloppy.placements] == [pytest.approx(1.5, abs=0.1)] * 2
    # the same phases; the shifted needle leaves the left pad 0.17 s sooner and draws the thread through sooner,
    # and the knot is done when the script is
    assert list(sloppy.phases) == list(clean.phases)
    assert all(sloppy.phases[k] == pytest.approx(clean.phases[k], abs=0.2) for k in clean.phases)
    assert sloppy.completed_s == pytest.approx(clean.completed_s, abs=0.01)
    assert (sloppy.knot, sloppy.closed_at_end) == (clean.knot, clean.closed_at_end)
    lost = sum(p.offset_mm for p in sloppy.placements) - sum(p.offset_mm for p in clean.placements)
    assert sloppy.score == pytest.approx(clean.score - lost, abs=0.05)
    assert [c.what for c in sloppy.checks if not c.passed] == ["worst mark (mm)"]
    granny = scored["granny"]
    assert granny.knot == "surgeon's granny" and granny.closed_at_end, granny.knot
    assert list(granny.phases) == list(clean.phases)
    assert all(granny.phases[k] == pytest.approx(clean.phases[k], abs=0.05) for k in clean.phases)
    assert [p.offset_mm for p in granny.placements] == [p.offset_mm for p in clean.placements]
    assert [(p.what, p.points) for p in granny.penalties if p.points >= 0.5] == [("knot not square", 20.0)]
    assert granny.score == pytest.approx(clean.score - 20.0, abs=0.05)
    assert [c.what for c in granny.checks if not c.passed] == ["square knot"]


@pytest.mark.long(cost=40)
def test_the_knot_security_test_holds_a_surgeons_knot_and_pulls_an_untied_thread_through(tmp_path):
    """`suturesim score --security`: the scripted suture resimulated to its end, both hands let go and the
    thread's ends pulled away from the knot with 1 N each. Its surgeon's knot reseats by a few millimetres and
    then holds (under 1 mm in the hold's last 2 s), and keeps the wound closed under the load; the same suture
    stopped before the first throw (the thread drawn through, no knot) leaves the wound open: nothing holds it."""
    from suturesim.server.headless import run_scenario
    from suturesim.solver.scenario import load_scenario

    tied, untied = tmp_path / "tied.mcap", tmp_path / "untied.mcap"
    run_scenario(load_scenario("simple-interrupted-suture"), duration=21.5, record=str(tied))
    run_scenario(load_scenario("simple-interrupted-suture"), duration=5.0, record=str(untied))
    out = io.StringIO()
    assert run_score(str(tied), as_json=True, out=out, security=1.0) == 0
    a = json.loads(out.getvalue())
    sec = a["security"]
    assert sec["outcome"] == "holds" and abs(sec["creep_mm"]) < 1.0 and 0.0 < sec["slip_mm"] < 10.0, sec
    assert sec["knot_before"] == sec["knot_after"] == "surgeon's knot"
    assert sec["closed_under_load"] and sec["gap_mm"] < 1.0      # the wound stays closed under the pull
    assert a["passed"] and ("knot holds under tension", True) in [(c["what"], c["passed"]) for c in a["checks"]]
    assert not [p for p in a["penalties"] if p["what"].startswith("knot")]
    out = io.StringIO()
    assert run_score(str(untied), as_json=True, out=out, security=1.0) == 0
    sec = json.loads(out.getvalue())["security"]
    assert sec["outcome"] == "opens" and sec["knot_after"] is None and sec["gap_mm"] > 2.0, sec


@pytest.mark.long(cost=40)
def test_the_knot_security_test_on_the_bends_keeps_the_reef_and_loses_the_granny_and_the_thief():
    """tools/security.py's pull on configs/scenarios/reef-knot.yaml's bends (its validation, docs/ASSESSMENT.md
    Sec. 5): at silk's friction, mu = 0.3, the reef knot (read a square knot) slips a few millimetres and stays
    tied, and the granny knot (read a granny) pulls out; the thief knot pulls out even at 0.9. (Held 2 s, for
    the suite's time; the ladder holds 5 s.)"""
    from suturesim.solver.knot_type import knot_type
    from suturesim.tools.security import bend_loop, bend_security

    for kind, name in (("reef", "square knot"), ("granny", "granny knot")):
        loop = bend_loop(kind, 0.3)[0]
        try:
            assert knot_type(loop.state.x).name == name
        finally:
            loop.close()
    reef = bend_security("reef", 0.3, hold_s=2.0)
    assert reef.outcome in ("holds", "slips") and 0.0 < reef.slip_mm < 30.0 and reef.taut_s < 2.0, reef
    granny = bend_security("granny", 0.3, hold_s=2.0)
    assert granny.outcome == "undone", granny
    thief = bend_security("thief", 0.9, hold_s=2.0)
    assert thief.outcome == "undone", thief
