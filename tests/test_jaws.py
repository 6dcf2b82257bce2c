"""A tool's jaw (server/jaws.py) and a device's workspace mapping and clutch (server/device.py), through the physics
loop as a live stylus drives it: the needle taken anywhere along its arc keeps its pose relative to the jaw,
released and taken again near its tip, handed over; the thread taken mid-segment; the clutch holding the tool
still with no force step on the hand; the needle preferred over the thread within reach."""
from __future__ import annotations

import math

import numpy as np
import pytest

from suturesim.server import protocol
from suturesim.server.config import DeviceConfig, ServerConfig
from suturesim.server.physics import PhysicsLoop
from suturesim.solver.instruments import TC_PUSHES, TC_SKIP0, TC_SKIP1, tool_clearance
from suturesim.solver.needle import NP_ARC, NP_RADIUS, NS_Q
from suturesim.solver.scenario import build_scenario

SCENE = {
    "name": "jaws", "duration": 10.0,
    "thread": {"preset": "silk-3-0", "length": 0.06, "segments": 24},
    "gravity": [0.0, 0.0, 0.0],
    "shape": {"kind": "straight", "start": [0.0, 0.0, 0.0], "direction": [-1.0, 0.0, 0.0]},
    "needle": {"preset": "3/8-19mm", "orientation": [1.0, 0.0, 0.0, 0.0]},
    "devices": {"left": {}, "right": {}},
}
NO_NEEDLE = {k: v for k, v in SCENE.items() if k != "needle"}
RIGHT, LEFT = "right", "left"
GRASP, CLUTCH = 1, 2


def make_loop(scene: dict | None = None, **device_settings) -> tuple[PhysicsLoop, list]:
    out: list[tuple[bytes, bytes]] = []
    device_settings.setdefault("frame", "device" if "devices" in (scene or {}) else "scene")
    devices = tuple(DeviceConfig(name=d, backend="remote", **device_settings) for d in (RIGHT, LEFT))
    cfg = ServerConfig(file="<test>", scenario=build_scenario(scene or SCENE, "<test>"), devices=devices)
    return PhysicsLoop(cfg, sink=lambda topic, payload: out.append((topic, bytes(payload)))), out


def send(loop: PhysicsLoop, device: str, pos, quat=(1.0, 0.0, 0.0, 0.0), buttons: int = 0) -> None:
    """A stylus sample as the remote backend takes it."""
    loop.stylus_sample(loop.devices[device], np.asarray(pos, float), np.asarray(quat, float), buttons)


def tick(loop: PhysicsLoop, n: int = 1) -> None:
    for _ in range(n):
        loop.seq += 1
        loop.tick_scene(0)


def events(out: list, kind: str) -> list[dict]:
    return [m for t, p in out if t == protocol.TOPIC_EVENT for m in [protocol.decode_event(p)] if m["kind"] == kind]


def forces(out: list, device: str) -> np.ndarray:
    return np.array([m["force"] for t, p in out if t == protocol.TOPIC_FORCE
                     for m in [protocol.decode_force(p)] if m["device"] == device])


def quat_of(axis, angle_deg: float) -> np.ndarray:
    a = np.asarray(axis, float) / np.linalg.norm(axis)
    h = math.radians(angle_deg) / 2.0
    return np.array([math.cos(h), *(math.sin(h) * a)])


def qmul(a, b) -> np.ndarray:
    a0, a1, a2, a3 = a
    b0, b1, b2, b3 = b
    return np.array([a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3, a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
                     a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1, a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0])


def rot(q, v) -> np.ndarray:
    w, x, y, z = q
    m = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                  [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                  [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
    return m @ np.asarray(v, float)


def arc_point(loop: PhysicsLoop, theta: float) -> np.ndarray:
    r = loop.model.needle_par[NP_RADIUS]
    q = loop.state.nst[NS_Q:NS_Q + 4]
    return loop.state.x[0] + rot(q, [r * math.sin(theta), r * (1 - math.cos(theta)), 0.0])


def angle_between(qa, qb) -> float:
    """Degrees between two orientations."""
    return math.degrees(2.0 * math.acos(min(1.0, abs(float(np.dot(qa, qb))))))


def test_a_jaw_takes_the_needle_at_mid_arc_and_carries_it_in_that_pose():
    loop, out = make_loop()
    arc = loop.model.needle_par[NP_ARC]
    jaw = arc_point(loop, arc / 3.0) + [0.0, 0.0, 0.002]     # 2 mm above a third of the way along
    q_jaw = quat_of([1.0, 2.0, 0.5], 40.0)
    send(loop, RIGHT, jaw, q_jaw)
    tick(loop)
    send(loop, RIGHT, jaw, q_jaw, GRASP)
    tick(loop)
    (g,) = events(out, "grasp")
    assert g["holds"] == "needle" and g["device"] == RIGHT and g["vertex"] == 0
    assert g["arc"] == pytest.approx(arc / 3.0, abs=1e-6) and g["distance"] == pytest.approx(0.002, abs=1e-6)
    # where the held point sits in the jaw's frame, and the needle's orientation in it, at the closing
    held_in_jaw = rot(qmul([q_jaw[0], *-q_jaw[1:]], [1, 0, 0, 0]), arc_point(loop, arc / 3.0) - jaw)
    q_rel = qmul([q_jaw[0], *-q_jaw[1:]], loop.state.nst[NS_Q:NS_Q + 4])
    # the hand moves 3 cm and turns 60 degrees about another axis over 0.3 s, then holds still
    turn = quat_of([0.0, 1.0, -1.0], 60.0)
    for k in range(1, 301):
        s = k / 300.0
        q = qmul(quat_of([0.0, 1.0, -1.0], 60.0 * s), q_jaw)
        send(loop, RIGHT, jaw + [0.03 * s, 0.0, 0.01 * s], q, GRASP)
        tick(loop)
    end_jaw, end_q = jaw + [0.03, 0.0, 0.01], qmul(turn, q_jaw)
    for _ in range(700):
        send(loop, RIGHT, end_jaw, end_q, GRASP)
        tick(loop)
    # the needle turned with the jaw, and the point it was held at is where the jaw carries it
    assert angle_between(loop.state.nst[NS_Q:NS_Q + 4], qmul(end_q, q_rel)) < 1.0
    expected = end_jaw + rot(end_q, held_in_jaw)
    assert np.linalg.norm(arc_point(loop, arc / 3.0) - expected) < 5e-4


def test_released_needle_is_taken_again_near_its_tip_and_handed_over():
    loop, out = make_loop()
    arc = loop.model.needle_par[NP_ARC]
    mid = arc_point(loop, arc / 2.0)
    send(loop, RIGHT, mid, buttons=GRASP)
    tick(loop, 50)
    send(loop, RIGHT, mid, buttons=0)                # the jaw opens: the needle stays where physics puts it
    tick(loop, 20)
    assert [e["holds"] for e in events(out, "release")] == ["needle"]
    assert not loop.grasps
    tip = arc_point(loop, arc * 0.95)
    send(loop, RIGHT, tip + [0.0, 0.0, 0.001], buttons=GRASP)   # retaken near the tip
    tick(loop, 20)
    g = events(out, "grasp")[-1]
    assert g["holds"] == "needle" and g["arc"] == pytest.approx(arc * 0.95, abs=0.02)
    # the other hand takes it from the first: the first lets go of it in the same tick
    send(loop, LEFT, arc_point(loop, arc * 0.2), buttons=GRASP)
    tick(loop)
    assert [(e["device"], e["holds"]) for e in events(out, "release")][-1] == (RIGHT, "needle")
    assert events(out, "grasp")[-1]["device"] == LEFT
    assert [(g.device, g.kind) for g in loop.grasps] == [(LEFT, "needle")]
    tick(loop, 10)   # a state message: each tool, and what it holds
    state = [protocol.decode_state(p) for t, p in out if t == protocol.TOPIC_STATE][-1]
    tools = {tl["device"]: tl for tl in state["tools"]}
    assert tools[LEFT]["holds"] == "needle" and tools[RIGHT]["holds"] is None and not tools[LEFT]["clutched"]
    assert [g["holds"] for g in state["grasps"]] == ["needle"]
    # each tool's body as the thread meets it: both needle drivers here (jaw 12 mm by 1 mm, shaft 10 cm by 2.5 mm)
    assert tools[LEFT]["body"] == tools[RIGHT]["body"] == pytest.approx([0.012, 0.001, 0.1, 0.0025])


def test_the_needle_wins_over_the_thread_in_reach_and_a_miss_says_so():
    loop, out = make_loop()
    # 2 mm from the swage: the thread's first vertex is the swage, and the needle's
    send(loop, RIGHT, loop.state.x[0] + [0.0, 0.002, 0.0], buttons=GRASP)
    tick(loop)
    assert events(out, "grasp")[-1]["holds"] == "needle"
    send(loop, LEFT, [0.5, 0.5, 0.5], buttons=GRASP)   # nothing within 10 mm
    tick(loop)
    assert events(out, "grasp_missed")[-1]["device"] == LEFT


def test_the_thread_is_taken_at_a_point_along_a_segment():
    loop, out = make_loop()
    x = loop.state.x
    point = 0.7 * x[12] + 0.3 * x[13]
    send(loop, LEFT, point + [0.0, 0.003, 0.0], buttons=GRASP)
    tick(loop)
    g = events(out, "grasp")[-1]
    assert g["holds"] == "thread" and g["vertex"] == 12 and g["frac"] == pytest.approx(0.3, abs=1e-9)
    assert np.allclose(g["pos"], point, atol=1e-12)
    # drawn 2 cm sideways, the held point follows the jaw
    for k in range(1, 201):
        send(loop, LEFT, point + [0.0, 0.003 + 0.02 * k / 200, 0.0], buttons=GRASP)
        tick(loop)
    tick(loop, 300)
    x = loop.state.x
    held = 0.7 * x[12] + 0.3 * x[13]
    assert np.linalg.norm(held - (point + [0.0, 0.023, 0.0])) < 5e-4


def test_a_tools_shaft_pressed_onto_the_thread_pushes_it_and_never_lets_it_through():
    """The right tool lying along +y (its shaft across the thread, which the left jaw holds at its free end) is
    lowered 15 mm through the thread's line at 20 mm/s: the thread is pushed down with it and is at no tick
    inside the jaw or the shaft (solver/instruments.py)."""
    loop, out = make_loop(NO_NEEDLE)
    x = loop.state.x
    send(loop, LEFT, x[-1], buttons=GRASP)
    tick(loop)
    assert events(out, "grasp")[-1]["holds"] == "thread"
    along_y = quat_of((1.0, 0.0, 0.0), -90.0)        # body z (the tool's axis) to +y
    mid = x[12].copy()
    scratch = np.zeros(3)
    start = mid + [0.0, -0.05, 0.005]                 # the jaw 5 cm to the side: the shaft crosses the thread
    pushes = 0.0
    for k in range(1001):
        send(loop, RIGHT, start + [0.0, 0.0, -0.02 * k / 1000.0], along_y)
        tick(loop)
        assert tool_clearance(loop.state.x, loop.state.tool_cap, scratch) > -2e-5, f"inside a tool at tick {k}"
        pushes += loop.state.tool_cap[:, TC_PUSHES].sum()
    assert pushes > 0
    assert loop.state.x[12, 2] < -0.01, "the shaft did not carry the thread down"


def test_the_thread_pressed_by_a_tools_shaft_pushes_back_on_the_hand():
    """The thread held at one end by a scenario coupling and at the other by the left jaw; the right tool's shaft
    presses it 15 mm down and holds it there: the right hand feels the thread push its shaft up, as much as the
    two couplings pull the thread's ends up (momentum: nothing else acts), though it holds nothing."""
    scene = {**NO_NEEDLE, "boundary": {"grasps": [{"id": "a", "vertex": 0, "stiffness": 200.0, "max_force": 3.0}]}}
    loop, out = make_loop(scene)
    end = loop.state.x[-1].copy()
    send(loop, LEFT, end, buttons=GRASP)
    tick(loop)
    along_y = quat_of((1.0, 0.0, 0.0), -90.0)
    start = loop.state.x[12] + [0.0, -0.05, 0.005]
    pull_z = []
    for k in range(1301):
        send(loop, LEFT, end, buttons=GRASP)
        send(loop, RIGHT, start + [0.0, 0.0, -0.015 * min(k, 1000) / 1000.0], along_y)
        tick(loop)
        pull_z.append(float(loop.state.grasp_force[:2, 2].sum()))
    assert not [g for g in events(out, "grasp") if g["device"] == RIGHT], "the right tool holds nothing"
    felt = forces(out, RIGHT)[-200:].mean(axis=0)
    held = float(np.mean(pull_z[-200:]))
    assert felt[2] > 0.3, felt
    assert abs(felt[2] - held) < 0.05 * held, (felt, held)


def test_the_thread_a_jaw_holds_is_not_pushed_out_of_it():
    """A jaw closed on the thread holds it at its tip, inside its own capsule: the held segments are left out
    of that tool's contact, and the held point follows the jaw while the jaw's shaft stands over the thread."""
    loop, out = make_loop(NO_NEEDLE)
    x = loop.state.x
    point = x[12].copy()
    send(loop, LEFT, point, buttons=GRASP)
    tick(loop)
    g = events(out, "grasp")[-1]
    assert g["holds"] == "thread"
    row = loop.devices[LEFT].tool_row
    caps = loop.state.tool_cap
    for c in (2 * row, 2 * row + 1):
        assert caps[c, TC_SKIP0] <= g["vertex"] <= caps[c, TC_SKIP1]
        assert caps[c, TC_SKIP1] - caps[c, TC_SKIP0] <= 6
    for k in range(1, 301):
        send(loop, LEFT, point + [0.0, 0.0, 0.01 * k / 300], buttons=GRASP)
        tick(loop)
    tick(loop, 200)
    held = loop.state.x[g["vertex"]] if "frac" not in g else (
        (1 - g["frac"]) * loop.state.x[g["vertex"]] + g["frac"] * loop.state.x[g["vertex"] + 1])
    assert np.linalg.norm(held - (point + [0.0, 0.0, 0.01])) < 5e-4


def test_a_hand_has_no_body_the_thread_meets():
    """`tool: hand` takes the thread as a jaw does, and the thread passes through where a needle driver's shaft
    would push it: no capsule is placed for it."""
    loop, out = make_loop({**NO_NEEDLE, "devices": {RIGHT: {"tool": "hand"}, LEFT: {}}})
    x = loop.state.x
    along_y = quat_of((1.0, 0.0, 0.0), -90.0)
    start = x[12] + [0.0, -0.05, 0.005]
    for k in range(301):
        send(loop, RIGHT, start + [0.0, 0.0, -0.02 * k / 300.0], along_y)
        tick(loop)
    assert loop.devices[RIGHT].tool_row < 0 and loop.devices[RIGHT].body is None
    assert not loop.state.tool_cap[:, TC_PUSHES].any()
    assert abs(loop.state.x[12, 2]) < 1e-3, "a hand pushed the thread"
    send(loop, RIGHT, loop.state.x[12], buttons=GRASP)
    tick(loop)
    assert events(out, "grasp")[-1]["holds"] == "thread"


def test_the_clutch_holds_the_tool_still_with_no_force_step_and_reengages_where_it_is():
    loop, out = make_loop(dict(SCENE, boundary={"pinned": [12]}))
    end = loop.state.x[-1].copy()
    send(loop, LEFT, end, buttons=GRASP)
    for k in range(1, 401):                          # draw the tail 3 cm away: the thread pulls back
        send(loop, LEFT, end + [-0.03 * k / 400, 0.0, 0.0], buttons=GRASP)
        tick(loop)
    tick(loop, 100)
    held_at = loop.devices[LEFT].stylus.copy()
    f_before = forces(out, LEFT)[-1]
    assert np.linalg.norm(f_before) > 0.05
    n_before = len(forces(out, LEFT))
    # clutched, the hand goes back 4 cm: the tool holds still, the grasp holds, the hand's force ramps to zero
    for k in range(1, 201):
        send(loop, LEFT, held_at + [0.04 * k / 200, 0.0, 0.0], buttons=GRASP | CLUTCH)
        tick(loop)
    assert [e["on"] for e in events(out, "clutch")] == [True]
    assert np.array_equal(loop.devices[LEFT].stylus, held_at) and [g.device for g in loop.grasps] == [LEFT]
    assert np.linalg.norm(forces(out, LEFT)[-1]) < 1e-9
    # released, the tool re-engages where it is: a 1 cm move of the hand moves it 1 cm from there
    here = held_at + [0.04, 0.0, 0.0]
    send(loop, LEFT, here, buttons=GRASP)
    tick(loop)
    assert np.allclose(loop.devices[LEFT].stylus, held_at, atol=1e-15)
    for k in range(1, 101):
        send(loop, LEFT, here + [0.0, 0.0, 0.01 * k / 100], buttons=GRASP)
        tick(loop)
    assert np.allclose(loop.devices[LEFT].stylus, held_at + [0.0, 0.0, 0.01], atol=1e-12)
    # the force stream never stepped by more than the slew limit allows in a tick
    f = forces(out, LEFT)[n_before - 1:]
    steps = np.linalg.norm(np.diff(f, axis=0), axis=1)
    slew = loop.cfg.safety.max_slew_n_per_s * loop.cfg.loop.tick_s
    assert steps.max() <= slew * 1.0001
    assert np.linalg.norm(f[-1]) > 0.05            # and the hand feels the thread again


def test_a_scene_places_and_scales_a_devices_workspace_and_the_config_wins():
    scene = dict(SCENE, devices={RIGHT: {"workspace_offset": [0.1, 0.0, -0.02], "motion_scale": 2.0}})
    loop, _ = make_loop(scene)
    origin = np.array(loop.cfg.device_config(RIGHT).transform.offset)
    p = origin + [0.01, -0.02, 0.03]
    send(loop, RIGHT, p)
    assert np.allclose(loop.devices[RIGHT].stylus, origin + [0.1, 0.0, -0.02] + 2.0 * (p - origin), atol=1e-15)
    loop, _ = make_loop(scene, motion_scale=1.0, workspace_offset=(0.0, 0.0, 0.0))
    send(loop, RIGHT, p)
    assert np.array_equal(loop.devices[RIGHT].stylus, p)


TOUCH_BOX = np.array([0.160, 0.120, 0.070])   # m: a Touch's usable workspace (x, y, z in its own frame), about
                                              # its origin


def scripted_paths(scenario) -> dict[str, np.ndarray]:
    """Each grasp device's scripted target path (m, every 10 ms) from the scene's timeline alone."""
    from suturesim.solver.motion import apply_motions

    m, st = scenario.model, scenario.new_state()
    h = 0.01
    paths: dict[str, list] = {g.device: [] for g in scenario.grasps}
    for k in range(int(scenario.duration / h)):
        apply_motions(k * h, h, m.mot_kind, m.mot_index, m.mot_t0, m.mot_t1, m.mot_vel, st.kin_target,
                      st.grasp_target, st.twist, st.nst, st.grasp_k, st.grasp_c, st.grasp_fmax)
        for g in scenario.grasps:
            if st.grasp_k[g.slot] > 0.0:
                paths[g.device].append(st.grasp_target[g.slot].copy())
    return {d: np.array(p) for d, p in paths.items() if p}


@pytest.mark.parametrize("name", ["two-hand-knot", "reef-knot-suture", "simple-interrupted-suture",
                                  "needle-tie-surgeons-knot"])
def test_a_touch_reaches_every_scripted_move_of_its_hand_in_each_haptic_scene(name):
    """Each hand's scripted path in the scene lies inside a Touch's workspace as the scene maps it, so a person
    makes the same moves without clutching."""
    from suturesim.server.config import OPENHAPTICS_TRANSFORM
    from suturesim.solver.scenario import load_scenario

    sc = load_scenario(name)
    r = OPENHAPTICS_TRANSFORM.matrix
    origin = np.array(OPENHAPTICS_TRANSFORM.offset)
    for device, ws in sc.workspaces.items():
        path = scripted_paths(sc)[device]
        # the hand's stylus for each point: p = origin + offset + s (stylus - origin), the stylus in device mm
        stylus = origin + (path - origin - ws.offset) / ws.scale
        in_device = (stylus - origin) @ r   # R^T (stylus - origin): the device's axes, in m
        assert np.all(np.abs(in_device) <= TOUCH_BOX / 2.0), (device, np.abs(in_device).max(axis=0))


def test_in_the_default_scene_a_touch_lifts_the_thread_and_pulls_it_to_the_couplings_limit():
    """The thread's end (0.45 m from its pinned start) pulled straight out to the coupling's 3 N at 1000 N/m is
    at 0.453 m; a lift of 5 cm above it; both inside the Touch's workspace as the default scene maps it."""
    from suturesim.server.config import OPENHAPTICS_TRANSFORM
    from suturesim.solver.scenario import load_scenario

    sc = load_scenario("default")
    ws = sc.workspaces["stylus0"]
    origin = np.array(OPENHAPTICS_TRANSFORM.offset)
    g = sc.grasps[0]
    length = float(np.linalg.norm(sc.initial.x[-1] - sc.initial.x[0]))
    taut = np.array([length + g.max_force / g.stiffness + 0.005, 0.0, 0.0])   # 5 mm past the limit
    for point in (taut, np.array([0.40, 0.0, 0.05])):
        stylus = origin + (point - origin - ws.offset) / ws.scale
        in_device = (stylus - origin) @ OPENHAPTICS_TRANSFORM.matrix
        assert np.all(np.abs(in_device) <= TOUCH_BOX / 2.0), (point, in_device)


@pytest.mark.parametrize("devices, key, reason", [
    ({"s0": {"motion_scale": 0.0}}, "devices.s0.motion_scale", "must be > 0"),
    ({"s0": {"workspace_offset": [0.0, 2000.0, 0.0]}}, "devices.s0.workspace_offset", "within 1000 m"),
    ({"s0": {"scale": 2.0}}, "devices.s0.scale", ""),
])
def test_a_scenes_device_section_is_checked_where_it_enters(devices, key, reason):
    from suturesim.solver.config import ConfigError

    with pytest.raises(ConfigError) as info:
        build_scenario(dict(SCENE, devices=devices), "scene.yaml")
    assert info.value.file == "scene.yaml" and info.value.key == key and reason in info.value.reason


def test_forceps_hold_a_tissue_edge_and_the_pad_follows_them():
    """In suture-practice, forceps closing on the left pad's wound edge (nothing else within reach) hold the pad:
    drawn up and away, it follows through the coupling against its own springs, and the hand feels the pad's
    springs; a needle driver closing there takes nothing; let go, the pad springs back."""
    from suturesim.solver.scenario import load_scenario
    from suturesim.solver.tissue import PD_K, PD_REST, PS_X

    out: list = []
    devices = (DeviceConfig(name="stylus0", backend="remote"),
               DeviceConfig(name="stylus1", backend="remote", tool="forceps"))
    cfg = ServerConfig(file="<test>", scenario=load_scenario("suture-practice"), devices=devices)
    loop = PhysicsLoop(cfg, sink=lambda topic, payload: out.append((topic, bytes(payload))))
    edge = np.array([-0.0025, 0.015, 0.0])                   # on the left pad's wound face, 15 mm from the midline
    send(loop, "stylus0", edge, buttons=GRASP)                # a needle driver: not tissue
    tick(loop)
    assert events(out, "grasp_missed")[-1]["device"] == "stylus0" and not loop.grasps
    send(loop, "stylus1", edge, buttons=GRASP)
    tick(loop)
    g = events(out, "grasp")[-1]
    assert g["holds"] == "tissue" and g["pad"] == "left" and g["vertex"] == -1 and g["device"] == "stylus1"
    rest = loop.model.pads[0, PD_REST:PD_REST + 3].copy()
    for k in range(1, 301):                                   # up 4 mm and away from the wound 3 mm
        send(loop, "stylus1", edge + np.array([-0.003, 0.0, 0.004]) * k / 300, buttons=GRASP)
        tick(loop)
    tick(loop, 700)
    moved = loop.state.pst[0, PS_X:PS_X + 3] - rest
    k_pad = loop.model.pads[0, PD_K:PD_K + 3]
    k_grasp = loop.grasps[0].stiffness
    # the pad's centre where the coupling and its springs balance: kg (target - x) = k_pad (x - rest)
    expected = np.array([-0.003, 0.0, 0.004]) * k_grasp / (k_grasp + k_pad)
    np.testing.assert_allclose(moved, expected, atol=2e-4)
    f = forces(out, "stylus1")[-1]
    np.testing.assert_allclose(f, -k_pad * moved, rtol=0.05, atol=0.01)   # the hand holds the springs back
    state = [protocol.decode_state(p) for t, p in out if t == protocol.TOPIC_STATE][-1]
    assert [(s["holds"], s.get("pad")) for s in state["grasps"]] == [("tissue", "left")]
    send(loop, "stylus1", edge + [-0.003, 0.0, 0.004], buttons=0)
    tick(loop, 1500)
    assert events(out, "release")[-1]["holds"] == "tissue"
    assert np.linalg.norm(loop.state.pst[0, PS_X:PS_X + 3] - rest) < 2e-4


def test_a_device_frame_sample_is_mapped_then_bounded_in_the_scene():
    """A remote device with `frame: device` sends millimetres in its own axes: mapped by its transform into the
    scene (a pose 13 mm from its origin is taken), and only then held to the 10 m bound."""
    from suturesim.server.protocol import StylusSample

    loop, _ = make_loop(frame="device")
    dc = loop.cfg.device_config(RIGHT)
    quat = loop.sample_in_scene(dc, StylusSample(RIGHT, (-13.0, 4.2, 10.5), (1.0, 0.0, 0.0, 0.0), 0, 0, 0.0))
    expected = np.zeros(3)
    dc.transform.pose_to_scene(-13.0, 4.2, 10.5, None, expected, np.zeros(4))
    np.testing.assert_array_equal(loop._pose, expected)
    np.testing.assert_allclose(quat, dc.transform.quat, atol=1e-15)
    assert loop.sample_in_scene(dc, StylusSample(RIGHT, (9000.0, 9000.0, 0.0), None, 0, 0, 0.0)) is False
    scene_dc = DeviceConfig(name=LEFT, backend="remote")
    assert loop.sample_in_scene(scene_dc, StylusSample(LEFT, (11.0, 0.0, 0.0), None, 0, 0, 0.0)) is False
    assert loop.sample_in_scene(scene_dc, StylusSample(LEFT, (0.1, 0.0, 0.0), None, 0, 0, 0.0)) is None
