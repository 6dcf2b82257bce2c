"""The thread against the tools' jaws and shafts (solver/instruments.py): it does not pass through them, and a
thread wound round a jaw is carried by it through friction, so an instrument tie's wraps stay on the needle
driver while its jaw moves (issue 31)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from suturesim.solver.instruments import (TC_A, TC_A0, TC_B, TC_IMPULSE, TC_MU_K, TC_MU_S, TC_PUSHES, TC_TOUCH, TC_VA,
                                          TC_VB, tool_clearance)
from suturesim.solver.integrator import Stepper
from suturesim.solver.scenario import build_scenario

JAW_R = 0.001        # m: a needle driver's jaw
THREAD_R = 1e-4      # m: silk 3-0's contact radius
TOL = 2e-5           # m: how far the thread may be found inside a capsule at a tick's end


def place(state, row: int, a, b, radius: float, mu: float) -> None:
    c = state.tool_cap
    c[row, TC_A:TC_A + 3] = a
    c[row, TC_B:TC_B + 3] = b
    c[row, TC_A0:TC_A0 + 6] = c[row, TC_A:TC_B + 3]
    c[row, TC_TOUCH] = radius + THREAD_R
    c[row, TC_MU_S] = mu
    c[row, TC_MU_K] = 0.8 * mu


def wound(mu: float):
    """Silk wound twice round a jaw along y (a helix 1.2 touch distances from its axis, 0.6 mm a turn), its
    two ends held by couplings pulled 2 mm apart along x."""
    touch = JAW_R + THREAD_R
    pitch = 6e-4
    th = np.linspace(0.0, 4.0 * math.pi, 25)
    helix = [[1.2 * touch * math.sin(a), pitch * a / (2 * math.pi), 1.2 * touch * math.cos(a)] for a in th]
    data = {"thread": {"preset": "silk-3-0", "length": 0.1, "segments": 80},
            "shape": {"kind": "polyline", "points": [[-0.04, 0.0, 1.2 * touch]] + helix
                      + [[0.04, 2 * pitch, 1.2 * touch]]},
            "gravity": [0.0, 0.0, -9.81], "contact": {"distance": 2 * THREAD_R},
            "boundary": {"grasps": [{"id": "a", "vertex": 0, "stiffness": 100.0, "max_force": 2.0},
                                    {"id": "b", "vertex": -1, "stiffness": 100.0, "max_force": 2.0}]}}
    sc = build_scenario(data, "wound.yaml")
    state = sc.new_state()
    place(state, 0, [0.0, -0.006, 0.0], [0.0, 0.008, 0.0], JAW_R, mu)
    return sc.model, state


def carry(mu: float) -> tuple[float, float, float, float]:
    """Pull the ends apart over 0.2 s, then move the jaw 3 mm along its axis over 0.3 s and hold it 0.2 s.
    Returns (how far the wraps moved along the axis (m), the least clearance seen (m), the two ends' pulls (N))."""
    model, state = wound(mu)
    stepper = Stepper(model, state)
    ends = state.grasp_target[:2].copy()

    def wraps_y() -> float:
        near = np.hypot(state.x[:, 0], state.x[:, 2]) < 2.5 * (JAW_R + THREAD_R)
        return float(state.x[near, 1].mean())

    caps = state.tool_cap
    scratch = np.zeros(3)
    least = math.inf
    y0 = None
    for i in range(900):
        k = min(i / 200.0, 1.0)
        state.grasp_target[0] = ends[0] + [-0.002 * k, 0.0, 0.0]
        state.grasp_target[1] = ends[1] + [0.002 * k, 0.0, 0.0]
        state.grasp_target_prev[:2] = state.grasp_target[:2]
        v = 0.01 if 400 <= i < 700 else 0.0   # m/s along the jaw's axis
        caps[0, TC_VA + 1] = caps[0, TC_VB + 1] = v
        if i == 400:
            y0 = wraps_y()
        stepper.tick()
        least = min(least, tool_clearance(state.x, caps, scratch))
    assert caps[0, TC_PUSHES] > 0
    pulls = np.linalg.norm(state.grasp_force[:2], axis=1)
    moved = wraps_y() - y0
    print(f"mu {mu:.2f}: the wraps moved {moved * 1e3:.2f} mm with the jaw's 3 mm; the thread at least "
          f"{least * 1e6:.1f} um from the jaw's surface; the ends pull {pulls[0]:.3f} N and {pulls[1]:.3f} N")
    return moved, least, float(pulls[0]), float(pulls[1])


def test_wraps_round_a_jaw_go_with_it_by_friction_and_stay_without_it():
    moved, least, f_a, f_b = carry(0.3)
    assert moved > 2.5e-3, f"wraps carried {moved * 1e3:.2f} mm of the jaw's 3 mm"
    assert least > -TOL, f"the thread was {-least * 1e3:.3f} mm inside the jaw"
    # the capstan: the ends' pulls differ by far more than without friction (e^(0.3 * 4 pi) = 43 at most)
    assert max(f_a, f_b) > 4.0 * min(f_a, f_b)
    moved0, least0, g_a, g_b = carry(0.0)
    assert abs(moved0) < 0.5e-3, f"frictionless wraps moved {moved0 * 1e3:.2f} mm"
    assert least0 > -TOL
    assert abs(g_a - g_b) < 0.1 * max(g_a, g_b)


def across_a_held_thread():
    """Silk held straight along x at both ends by 200 N/m couplings, and a needle driver's shaft (2.5 mm, in row
    1) across it along y, 4 mm above it. Returns the model and the state."""
    data = {"thread": {"preset": "silk-3-0", "length": 0.1, "segments": 80},
            "shape": {"kind": "straight", "start": [-0.05, 0.0, 0.0], "direction": [1.0, 0.0, 0.0]},
            "gravity": [0.0, 0.0, -9.81], "contact": {"distance": 2 * THREAD_R},
            "boundary": {"grasps": [{"id": "a", "vertex": 0, "stiffness": 200.0, "max_force": 3.0},
                                    {"id": "b", "vertex": -1, "stiffness": 200.0, "max_force": 3.0}]}}
    sc = build_scenario(data, "shaft.yaml")
    state = sc.new_state()
    place(state, 1, [0.01, -0.05, 0.004], [0.01, 0.05, 0.004], 0.0025, 0.3)
    return sc.model, state


@pytest.mark.parametrize("speed", [0.05, 0.5])
def test_a_shaft_pressed_down_through_a_held_thread_carries_it_and_never_lets_it_through(speed):
    """A shaft (2.5 mm) across a thread held at both ends is pushed 15 mm down through it at ``speed`` (m/s):
    the thread bends round it and is at no tick inside it."""
    model, state = across_a_held_thread()
    stepper = Stepper(model, state)
    caps = state.tool_cap
    scratch = np.zeros(3)
    ticks = int(round(0.019 / speed / 1e-3))
    for i in range(ticks + 100):
        caps[1, TC_VA + 2] = caps[1, TC_VB + 2] = -speed if i < ticks else 0.0
        stepper.tick()
        assert tool_clearance(state.x, caps, scratch) > -TOL, f"inside the shaft at tick {i}"
    low = float(state.x[:, 2].min())
    # the shaft's axis went from 4 mm above the thread to 15 mm below it: the thread lies under the shaft
    assert low < -0.015 + 0.0025 - 0.0005 and low > -0.015 - 0.0025 - THREAD_R - 1e-3
    assert np.linalg.norm(state.grasp_force[:2], axis=1).min() > 0.01


def balance(model, state, stepper, rows, ticks: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Over ``ticks`` more ticks with everything held still: the mean force (N) the capsules ``rows`` gave the
    thread (their impulse over each tick, TC_IMPULSE) and the mean of everything else on it (the couplings'
    forces and its weight)."""
    tick = model.solver.tick
    weight = float(model.mass.sum()) * np.asarray(model.gravity, dtype=float)
    tool, rest = np.zeros(3), np.zeros(3)
    for _ in range(ticks):
        stepper.tick()
        tool += state.tool_cap[rows, TC_IMPULSE:TC_IMPULSE + 3].sum(axis=0) / tick
        rest += state.grasp_force[:2].sum(axis=0) + weight
    return tool / ticks, rest / ticks


def test_what_a_tool_gives_the_thread_balances_what_holds_it_there():
    """The thread pressed round a shaft, and wound round a jaw, all held still: the force the tool gives the
    thread (what the server makes its hand feel, reversed) balances the couplings' pulls and the thread's
    weight, as momentum says with nothing else acting."""
    model, state = across_a_held_thread()
    stepper = Stepper(model, state)
    caps = state.tool_cap
    for i in range(600):
        caps[1, TC_VA + 2] = caps[1, TC_VB + 2] = -0.05 if i < 300 else 0.0   # 15 mm down, then still
        stepper.tick()
    tool, rest = balance(model, state, stepper, [1])
    print(f"shaft: the tool gives the thread {tool} N, the couplings and weight {rest} N")
    assert tool[2] < -0.05                             # it presses the thread down against the couplings' pull
    assert np.linalg.norm(tool + rest) < 0.02 * np.linalg.norm(tool), (tool, rest)

    model, state = wound(0.3)
    stepper = Stepper(model, state)
    ends = state.grasp_target[:2].copy()
    for i in range(300):
        k = min(i / 200.0, 1.0)
        state.grasp_target[0] = ends[0] + [-0.002 * k, 0.0, 0.0]
        state.grasp_target[1] = ends[1] + [0.002 * k, 0.0, 0.0]
        state.grasp_target_prev[:2] = state.grasp_target[:2]
        stepper.tick()
    tool, rest = balance(model, state, stepper, [0])
    print(f"wraps: the jaw gives the thread {tool} N, the couplings and weight {rest} N")
    assert np.linalg.norm(tool) > 0.02
    assert np.linalg.norm(tool + rest) < 0.05 * np.linalg.norm(tool), (tool, rest)
