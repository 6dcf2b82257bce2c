"""The needle (solver/needle.py): driven by its stylus's pose, it makes the punctures the thread then runs
through; nothing else makes one, and neither needle nor thread enters a pad except through them (issue 7)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from suturesim.solver.config import ConfigError
from suturesim.solver.integrator import Stepper
from suturesim.solver.needle import NP_ARC, NP_RADIUS, NP_WIRE, NS_Q, NS_TORQUE, NS_W, arc_point, needle_inside
from suturesim.solver.scenario import build_scenario
from suturesim.solver.tissue import PI_MATE, PI_STATE, PUN_ACTIVE, PUN_FREE, PUN_NEEDLE, TP_RADIUS, count_inside

R = 0.012 / (2.0 * math.pi * 3.0 / 8.0)   # the 3/8-circle 12 mm needle's radius (m)
TOP = 0.005                                # the pad's top face (m)


def qmul(a, b):
    a0, a1, a2, a3 = a
    b0, b1, b2, b3 = b
    return np.array([a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3, a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
                     a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1, a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0])


def needle_above(height: float = 0.5, back: float = 30.0):
    """The needle's pose for a bite: its arc in the x-z plane curving down, its centre ``height`` R above the
    pad's top face, turned back by ``back`` degrees about y so the tip is just above the face. Returns
    (swage position, orientation quaternion)."""
    base = np.array([math.cos(-math.pi / 4), math.sin(-math.pi / 4), 0.0, 0.0])   # body y -> world -z
    psi = math.radians(-back)
    qy = np.array([math.cos(psi / 2), 0.0, math.sin(psi / 2), 0.0])
    centre = np.array([0.0, 0.0, TOP + height * R])
    rot = np.array([[math.cos(psi), 0.0, math.sin(psi)], [0.0, 1.0, 0.0], [-math.sin(psi), 0.0, math.cos(psi)]])
    return centre + rot @ np.array([0.0, 0.0, R]), qmul(qy, base)


def bite(angle: float = 300.0, height: float = 0.5, duration: float = 2.0, extra=None):
    swage, q = needle_above(height)
    data = {
        "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 40},
        "shape": {"kind": "straight", "start": swage.tolist(), "direction": [-1.0, 0.0, 0.3]},
        "tissue": {"pads": [{"id": "pad", "center": [0.0, 0.0, 0.0], "size": [0.03, 0.03, 0.01], "fixed": True}]},
        "needle": {"preset": "3/8-12mm", "grasp": "needle", "orientation": q.tolist()},
        "boundary": {"grasps": [{"id": "needle", "vertex": 0, "stiffness": 1000.0, "max_force": 3.0}]},
        "timeline": [{"needle": "drive", "angle": angle, "from": 0.2, "to": 0.2 + duration}],
    }
    for key, value in (extra or {}).items():
        data[key] = value
    sc = build_scenario(data, "bite.yaml")
    return sc.model, sc.new_state()


def trespass(model, state) -> int:
    """Needle points and thread vertices inside a pad other than through its punctures."""
    return (needle_inside(state.x, model.rest_length, model.needle_par, state.nst, model.tissue_par, model.pads, state.pst,
                          state.pun_i, state.pun_f, 0.0, 48)
            + count_inside(state.x, model.rest_length, model.pads, state.pst, state.pun_i, state.pun_f, 0.0,
                           model.tissue_par[TP_RADIUS], 1))


def test_a_needle_bite_makes_two_punctures_that_pass_to_the_thread():
    model, state = bite()
    assert model.solver.scaled_mass_keeps == "energy"       # the default, with a needle too (docs/SCENARIOS.md)
    stepper = Stepper(model, state)
    history = []
    for _ in range(3000):
        stepper.tick()
        assert trespass(model, state) == 0
        history.append(tuple(state.pun_i[:3, PI_STATE]))
    # the tip went in (one needle-held puncture), came out (two), the swage followed through both
    assert (PUN_NEEDLE, PUN_FREE, PUN_FREE) in history
    assert (PUN_NEEDLE, PUN_NEEDLE, PUN_FREE) in history
    assert (PUN_ACTIVE, PUN_NEEDLE, PUN_FREE) in history
    assert history[-1] == (PUN_ACTIVE, PUN_ACTIVE, PUN_FREE)
    # entry and exit lie on the top face, about the chord of the circle's dip below it apart
    pts = state.pun_f[:2, :3]
    assert np.allclose(pts[:, 2], TOP, atol=1e-6)
    assert abs(pts[0, 0] - pts[1, 0]) == pytest.approx(2.0 * R * math.sqrt(1.0 - 0.25), rel=0.1)
    # the thread now runs through the tissue: vertices lie below the top face, between the punctures
    assert np.any(state.x[:, 2] < TOP - 1e-3)
    assert stepper.retries == 0


def test_the_tip_alone_pierces():
    # the needle driven backwards (swage first) into the pad: no puncture, the needle is held out
    model, state = bite(angle=-200.0)
    stepper = Stepper(model, state)
    for _ in range(2000):
        stepper.tick()
        assert trespass(model, state) == 0
    assert np.all(state.pun_i[:, PI_STATE] == PUN_FREE)


def test_a_tip_that_backs_out_the_way_it_went_in_makes_no_exit():
    """A tip that has just gone in and comes back out over the face within one substep (the tissue's pushes on
    a needle held across a face can take it there) leaves through the hole it made: needle_pierce makes no exit
    there, which would read the needle as through the tissue where it never went (a bite by hand, driven on,
    then missed both edges). A tip that comes out a bite's chord away makes the exit, as before."""
    from suturesim.solver.needle import NS_TIP0, needle_pierce

    model, state = bite()
    stepper = Stepper(model, state)
    before = None
    while not (state.pun_i[:, PI_STATE] == PUN_NEEDLE).any():
        before = (state.x.copy(), state.nst.copy())
        stepper.tick()
    r, arc = model.needle_par[NP_RADIUS], model.needle_par[NP_ARC]
    tip_in = np.array(arc_point(state.x, state.nst, NS_Q, r, arc))
    hole = state.pun_f[0, :3].copy()
    assert tip_in[2] < TOP < arc_point(before[0], before[1], NS_Q, r, arc)[2]

    def out_again(x, nst, tip0) -> int:
        """needle_pierce for a substep that took the tip from ``tip0`` (inside) to where x, nst put it."""
        nst = nst.copy()
        nst[NS_TIP0:NS_TIP0 + 3] = tip0
        pun_i, pun_f = state.pun_i.copy(), state.pun_f.copy()
        made = needle_pierce(x, model.needle_par, nst, model.pads, state.pst, pun_i, pun_f, True)
        assert made == int((pun_i[:, PI_MATE] >= 0).sum()) // 2
        return made

    # back out where it went in: the tip where it was before it entered, a fraction of a mm from the hole
    assert np.linalg.norm(np.array(arc_point(before[0], before[1], NS_Q, r, arc)) - hole) < 1e-3
    assert out_again(*before, tip_in) == 0
    # out a chord away, from 1 mm deep under where it comes out: an exit
    chord = 2.0 * R * math.sqrt(1.0 - 0.25)
    x = state.x.copy()
    x[0] += [chord, 0.0, TOP + 2e-4 - tip_in[2]]
    assert arc_point(x, state.nst, NS_Q, r, arc)[2] == pytest.approx(TOP + 2e-4)
    assert out_again(x, state.nst, tip_in + [chord, 0.0, -1e-3]) == 1


def test_a_thread_never_punctures():
    # a thread whipped down onto the pad and dragged across it by a grasp: no puncture, no vertex inside
    data = {
        "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 40},
        "shape": {"kind": "straight", "start": [-0.05, 0.0, 0.01], "direction": [1.0, 0.0, 0.0]},
        "tissue": {"pads": [{"id": "pad", "center": [0.0, 0.0, 0.0], "size": [0.03, 0.03, 0.01]}]},
        "boundary": {"grasps": [{"id": "hand", "vertex": 20, "stiffness": 1000.0, "max_force": 3.0}]},
        "timeline": [{"grasp": "hand", "velocity": [0.0, 0.0, -0.5], "from": 0.0, "to": 0.1},
                     {"grasp": "hand", "velocity": [0.3, 0.1, 0.0], "from": 0.1, "to": 0.5}],
    }
    sc = build_scenario(data, "drag.yaml")
    model, state = sc.model, sc.new_state()
    stepper = Stepper(model, state)
    for _ in range(800):
        stepper.tick()
        assert count_inside(state.x, model.rest_length, model.pads, state.pst, state.pun_i, state.pun_f, 0.0,
                            0.0, 0) == 0
    assert np.all(state.pun_i[:, PI_STATE] == PUN_FREE)


def test_the_needle_follows_its_stylus_and_the_torque_is_felt():
    # no tissue in the way (centre far above the pad): the needle turns with its stylus; the coupling's torque
    # is what keeps it turning against its inertia and is small once it follows
    model, state = bite(height=3.0)
    stepper = Stepper(model, state)
    torque = []
    for _ in range(2500):
        stepper.tick()
        torque.append(np.linalg.norm(state.nst[NS_TORQUE:NS_TORQUE + 3]))
    assert np.all(state.pun_i[:, PI_STATE] == PUN_FREE)
    # turned by 300 degrees about y: the tip is where the drive's rotation takes it
    swage0, q0 = needle_above(3.0)
    centre = np.array([0.0, 0.0, TOP + 3.0 * R])
    phi = math.radians(300.0)
    rot = np.array([[math.cos(phi), 0.0, math.sin(phi)], [0.0, 1.0, 0.0], [-math.sin(phi), 0.0, math.cos(phi)]])
    tip = np.array(arc_point(state.x, state.nst, NS_Q, model.needle_par[NP_RADIUS], model.needle_par[NP_ARC]))
    x0 = state.x.copy()
    x0[0] = swage0
    nst0 = state.nst.copy()
    nst0[NS_Q:NS_Q + 4] = q0
    tip0 = np.array(arc_point(x0, nst0, NS_Q, model.needle_par[NP_RADIUS], model.needle_par[NP_ARC]))
    assert np.linalg.norm(tip - (centre + rot @ (tip0 - centre))) < 5e-4
    assert max(torque) < 0.01


def test_needle_config_errors():
    def fails(needle, match, grasps=None):
        swage, q = needle_above()
        data = {
            "thread": {"preset": "silk-3-0", "length": 0.1, "segments": 40},
            "shape": {"kind": "straight", "start": swage.tolist(), "direction": [-1.0, 0.0, 0.3]},
            "needle": needle,
            "boundary": {"grasps": grasps if grasps is not None else
                         [{"id": "needle", "vertex": 0}, {"id": "other", "vertex": 10}]},
        }
        with pytest.raises(ConfigError, match=match):
            build_scenario(data, "n.yaml")

    fails({"preset": "3/8-12mm", "radius": 0.005}, r"n.yaml: needle.radius: the preset '3/8-12mm' gives")
    fails({"preset": "5/8-9mm"}, r"needle.preset: must be one of")
    fails({"preset": "3/8-12mm", "grasp": "nobody"}, r"needle.grasp: no grasp 'nobody'")
    fails({"preset": "3/8-12mm", "grasp": "other"}, r"needle.grasp: grasp 'other' holds vertex 10")
    fails({"preset": "3/8-12mm", "orientation": [0, 0, 0, 0]}, r"needle.orientation: must be a nonzero")
    fails({"length": 0.012, "circle": 0.9}, r"needle.circle: must be <= 0.75")
    fails({"preset": "3/8-12mm", "colour": "steel"}, r"needle.colour: unknown key")


def test_a_needle_may_not_start_inside_a_pad():
    with pytest.raises(ConfigError, match=r"bite.yaml: needle.orientation: the needle starts inside pad 'pad'"):
        bite(height=-0.2)


def seg_seg_distance(p0, p1, q0, q1) -> float:
    """The smallest distance (m) between any segment p0[i]p1[i] and any segment q0[k]q1[k], both sampled at 21
    points (0.05 of a segment apart; an independent check, not the kernels' closest-point code); pairs whose
    midpoints are more than 4 mm apart are left out (their segments are shorter than 3 mm)."""
    mid = np.linalg.norm((p0 + p1)[:, None, :] / 2 - (q0 + q1)[None, :, :] / 2, axis=-1)
    ii, kk = np.nonzero(mid < 0.004)
    if ii.size == 0:
        return math.inf
    u = np.linspace(0.0, 1.0, 21)[None, :, None]
    ps = p0[ii][:, None, :] + u * (p1 - p0)[ii][:, None, :]      # (pairs, 21, 3)
    qs = q0[kk][:, None, :] + u * (q1 - q0)[kk][:, None, :]
    return float(np.linalg.norm(ps[:, :, None, :] - qs[:, None, :, :], axis=-1).min())


def test_the_needle_pushes_its_thread_and_never_passes_through_it():
    """The thread is laid across the needle's circle just ahead of its tip; the needle is driven on round its
    circle (no tissue in the way, no gravity). The tip meets the thread and pushes it along: the centre lines
    of thread and wire never come closer than the wire's radius plus the thread's (without the needle-thread
    contact the wire passes through the thread, to 5 um of its centre line)."""
    swage, q = needle_above(3.0)
    centre = np.array([0.0, 0.0, TOP + 3.0 * R])
    data = {"thread": {"preset": "silk-3-0", "length": 0.1, "segments": 80},
            "shape": {"kind": "straight", "start": swage.tolist(), "direction": [0.0, -1.0, 0.0]},
            "tissue": {"pads": [{"id": "pad", "center": [0.0, 0.0, 0.0], "size": [0.03, 0.03, 0.01], "fixed": True}]},
            "needle": {"preset": "3/8-12mm", "grasp": "needle", "orientation": q.tolist()},
            "boundary": {"grasps": [{"id": "needle", "vertex": 0, "stiffness": 1000.0, "max_force": 3.0}]},
            "timeline": [{"needle": "drive", "angle": 120.0, "from": 0.1, "to": 1.1}],
            "gravity": [0.0, 0.0, 0.0]}
    sc = build_scenario(data, "needle-thread.yaml")
    tip0 = np.array(arc_point(sc.initial.x, sc.initial.nst, NS_Q, sc.model.needle_par[NP_RADIUS],
                              sc.model.needle_par[NP_ARC]))
    # the point of the circle 60 degrees on from the tip, the way the drive turns it (about -y)
    a = math.radians(-60.0)
    turn = np.array([[math.cos(a), 0.0, math.sin(a)], [0.0, 1.0, 0.0], [-math.sin(a), 0.0, math.cos(a)]])
    ahead = centre + turn @ (tip0 - centre)
    data["shape"] = {"kind": "polyline", "points": [swage.tolist(), (swage + [0.0, -0.008, 0.0]).tolist(),
                                                    (ahead + [0.0, -0.008, 0.0]).tolist(),
                                                    (ahead + [0.0, 0.008, 0.0]).tolist(),
                                                    (ahead + [0.0, 0.03, 0.0]).tolist()]}
    sc = build_scenario(data, "needle-thread.yaml")
    model, state = sc.model, sc.new_state()
    stepper = Stepper(model, state)
    touch = model.needle_par[NP_WIRE] + model.tissue_par[TP_RADIUS]
    x0 = state.x.copy()
    theta = np.linspace(0.0, model.needle_par[NP_ARC], 13)
    closest = math.inf
    for _ in range(1300):
        stepper.tick()
        wire = np.array([arc_point(state.x, state.nst, NS_Q, model.needle_par[NP_RADIUS], th) for th in theta])
        # thread segments from the third on (the first two leave the swage, on the wire by construction)
        closest = min(closest, seg_seg_distance(state.x[2:-1], state.x[3:], wire[:-1], wire[1:]))
    assert closest > 0.95 * touch, (closest, touch)
    assert closest < 1.2 * touch                    # they did touch: the tip met the thread ...
    assert np.abs(state.x - x0).max() > 0.005       # ... and pushed it along, by more than 5 mm
    assert stepper.retries == 0


def lying_needle(pull: float, seconds: float, mu: float = 0.3, size: float = 0.06):
    """A 3/8-circle 19 mm needle (30 mg) let go flat on a fixed pad with 2 cm of silk lying straight behind its
    swage, pulled along x at its swage from 0.3 s on with ``pull`` times its weight. Returns the swage's travel
    along x from 0.3 s (m), the arc points' heights above the pad's top face at the end (m) and the state."""
    data = {
        "thread": {"preset": "silk-3-0", "length": 0.02, "segments": 16},
        "gravity": [0.0, 0.0, -9.81],
        "shape": {"kind": "straight", "start": [0.0, 0.0, TOP + 3e-4], "direction": [-1.0, 0.0, 0.0]},
        "tissue": {"friction": mu, "pads": [{"id": "pad", "center": [0.0, 0.0, 0.0], "size": [size, size, 0.01],
                                             "fixed": True}]},
        "needle": {"preset": "3/8-19mm", "orientation": [1.0, 0.0, 0.0, 0.0]},   # its arc in the x-y plane
    }
    sc = build_scenario(data, "lying.yaml")
    model, state = sc.model, sc.new_state()
    stepper = Stepper(model, state)
    weight = model.needle_par[2] * 9.81
    x0 = None
    for k in range(int(round(seconds * 1000))):
        if k == 300:
            x0 = state.x[0, 0]
            state.ext_force[0] = (pull * weight, 0.0, 0.0)
        stepper.tick()
        assert trespass(model, state) == 0
    arc = [arc_point(state.x, state.nst, NS_Q, model.needle_par[NP_RADIUS], model.needle_par[NP_ARC] * k / 12)[2]
           for k in range(13)]
    return state.x[0, 0] - x0, np.array(arc) - TOP, state


def test_a_needle_lying_on_tissue_holds_by_friction_and_slides_past_it():
    """Coulomb friction of the needle let go on a pad (mu = 0.3). Its points are pushed out and held one at a
    time while its weight turns it about the swage (its mass sits there, its weight acts at the arc's centroid),
    so the friction it shows is approximate: a pull of 0.1 and 0.2 of its weight moved it by 3 and 27 um in
    0.5 s, 0.29 slid it; a pull of 0.5 slid it 23 mm in 0.2 s, against 39 mm at (0.5 - 0.3) g (an effective
    kinetic coefficient of 0.38). Frictionless, as it was until 2026-11-27, 0.1 of its weight slid it 0.37 m
    in 1 s."""
    held, heights, _ = lying_needle(0.2, 0.8)
    assert abs(held) < 1e-4
    assert np.all(np.abs(heights - 2e-4) < 2e-5)          # resting on its wire's radius (0.2 mm)
    slid, _, _ = lying_needle(0.5, 0.5)
    expected = 0.5 * (0.5 - 0.3) * 9.81 * 0.2 ** 2        # 39 mm in the 0.2 s of the pull
    assert 0.5 * expected < slid < expected


def test_a_needle_let_go_neither_pierces_nor_keeps_its_hands_orientation():
    """Let go tip down 3 mm above a pad, the needle falls on its tip: no puncture (only a held needle pierces;
    its weight is 0.3 mN, a bite's drive is newtons), the tip is held out as the rest of it, and the stylus's
    orientation no longer holds it: its weight, at the arc's centroid, topples it until its arc lies on the pad.
    Until 2026-11-27 a released needle kept the stylus's last orientation and pierced whatever its tip fell
    on."""
    swage, q = needle_above(1.0)
    drop = 3e-3 + swage[2] - TOP - R * (1.0 - math.cos(math.radians(30.0)))   # the tip 3 mm above the face
    data = {
        "thread": {"preset": "silk-3-0", "length": 0.03, "segments": 24},
        "gravity": [0.0, 0.0, -9.81],
        "shape": {"kind": "straight", "start": [swage[0], swage[1], swage[2] + drop - (swage[2] - TOP)],
                  "direction": [-1.0, 0.0, 0.0]},
        "tissue": {"pads": [{"id": "pad", "center": [0.0, 0.0, 0.0], "size": [0.06, 0.06, 0.01], "fixed": True}]},
        "needle": {"preset": "3/8-12mm", "grasp": "needle", "orientation": q.tolist()},
        "boundary": {"grasps": [{"id": "needle", "vertex": 0, "stiffness": 1000.0, "max_force": 3.0}]},
        "timeline": [{"grasp": "needle", "release": 0.2}],
    }
    sc = build_scenario(data, "drop.yaml")
    model, state = sc.model, sc.new_state()
    stepper = Stepper(model, state)
    q_held = None
    for k in range(2500):
        stepper.tick()
        if k == 199:
            q_held = state.nst[NS_Q:NS_Q + 4].copy()
        assert trespass(model, state) == 0
        assert np.all(state.pun_i[:, PI_STATE] == PUN_FREE)
    heights = np.array([arc_point(state.x, state.nst, NS_Q, R, model.needle_par[NP_ARC] * k / 12)[2]
                        for k in range(13)]) - TOP
    assert abs(float(np.dot(q_held, state.nst[NS_Q:NS_Q + 4]))) < 0.95     # it turned by more than 36 degrees
    assert np.all(heights < 1.5e-3) and np.all(heights > 1.9e-4), heights  # it lies on the pad, not in it
    assert np.linalg.norm(state.nst[NS_W:NS_W + 3]) < 1e-2 and np.linalg.norm(state.x[0] - state.x_prev[0]) < 1e-8


def test_the_needle_pushed_across_its_punctures_tears_the_tissue_once_each_past_its_tear_force():
    """The lateral force the tissue puts across the needle where it runs through a puncture (PF_FORCE while the
    needle holds it) is what `tear` reads: a clean bite pushes a tenth of a newton or so across its punctures,
    under the default tear force; with the tissue's tear_force below that, a puncture pushed past it tears, once."""
    from suturesim.solver.suture import SutureWatch, lateral_force
    from suturesim.solver.tissue_config import TEAR_FORCE

    for tear in (None, 0.1):
        pad = {"id": "pad", "center": [0.0, 0.0, 0.0], "size": [0.03, 0.03, 0.01], "fixed": True}
        tissue = {"pads": [pad], **({"puncture": {"tear_force": tear}} if tear else {})}
        model, state = bite(extra={"tissue": tissue})
        stepper = Stepper(model, state)
        watch = SutureWatch(model)
        watch.reset(state)
        events, peak = [], 0.0
        for _ in range(2500):
            stepper.tick()
            watch.check(state, lambda kind, **d: events.append((kind, d)))
            for q in np.flatnonzero(state.pun_i[:, PI_STATE] == PUN_NEEDLE):
                peak = max(peak, lateral_force(state.pun_f, q))
        tears = [d for kind, d in events if kind == "tear"]
        assert [kind for kind, _ in events if kind == "puncture"] == ["puncture", "puncture"]
        if tear is None:
            assert 0.05 < peak < TEAR_FORCE and tears == []
        else:
            # once per puncture at most, each past the limit
            assert 1 <= len(tears) == len({tuple(d["pos"]) for d in tears}) <= 2
            assert all(d["force"] > tear and d["limit"] == tear and d["pad"] == "pad" for d in tears)


def test_a_needle_levered_sideways_until_its_tip_leaves_the_exit_stays_in_its_blind_pass():
    """Halfway through a bite, with the thread already in through the entry, the hand drags the needle 7 mm
    sideways: the tip draws back out of its exit, which closes (needle_out), and the needle stays in the blind
    pass the thread runs into. Pushed out of the pad instead, it was put through the pad's side within one
    substep and the solver diverged."""
    timeline = [{"needle": "drive", "angle": 180.0, "from": 0.2, "to": 0.8},
                {"grasp": "needle", "velocity": [0.0, 0.02, 0.0], "from": 0.85, "to": 1.2}]
    model, state = bite(extra={"timeline": timeline})
    stepper = Stepper(model, state)
    jump = 0.0
    for _ in range(1600):
        swage = state.x[0].copy()
        stepper.tick()      # it diverged at 1.203 s
        jump = max(jump, float(np.linalg.norm(state.x[0] - swage)))
    assert tuple(state.pun_i[:2, PI_STATE]) == (PUN_ACTIVE, PUN_FREE)    # the exit closed, the entry holds
    assert state.pun_i[0, PI_MATE] == -1
    assert jump < 2e-3      # m in a tick: the swage follows the hand, no jump to the pad's side
    assert trespass(model, state) == 0
