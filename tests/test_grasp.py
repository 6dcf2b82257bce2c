"""A grasp (virtual coupling) pulling a suture past its reach: a large, finite, smooth force within the
substep budget, equal at rest to the thread's axial force at the grasp."""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.solver.forces import constraint_force_at
from suturesim.solver import integrator
from suturesim.solver.integrator import STAT_MASS_FACTOR, STAT_OMEGA_END, Stepper
from suturesim.solver.scenario import build_scenario, load_scenario


def pulled(preset: str, max_force: float, speed: float = 0.05, pull_time: float = 0.5):
    data = {"name": "pull", "duration": 3.0, "thread": {"preset": preset},
            "shape": {"kind": "straight", "direction": [1.0, 0.0, 0.0]},
            "boundary": {"pinned": [0], "grasps": [{"id": "s", "vertex": -1, "stiffness": 1000.0,
                                                     "max_force": max_force}]},
            # the stylus starts at the free end and moves 2.5 cm straight out, past the thread's reach
            "timeline": [{"grasp": "s", "velocity": [speed, 0.0, 0.0], "from": 0.5, "to": 0.5 + pull_time}]}
    sc = build_scenario(data, "pull.yaml")
    return sc.model, sc.new_state()


@pytest.mark.parametrize("preset", ["silk-3-0", "nylon-4-0", "polypropylene-5-0", "wang2017-fig4"])
def test_taut_pull_force_is_large_finite_and_smooth(preset):
    model, state = pulled(preset, max_force=5.0)
    stepper = Stepper(model, state)
    force = np.zeros(3000)
    for k in range(force.size):
        n = stepper.tick()
        assert n <= model.solver.max_substeps
        force[k] = np.linalg.norm(state.grasp_force[0])
    assert np.all(np.isfinite(force))
    assert force.max() <= 5.0 + 1e-9                      # the coupling limit holds
    assert force[-1] > 1.0                                 # large: the thread is taut
    # smooth: the force's slope never jumps by more than the spring's own ramp k*v*dt (the corners where the
    # stylus starts and stops); a spike or a tick-to-tick oscillation would
    assert np.max(np.abs(np.diff(force, 2))) <= 1000.0 * 0.05 * 1e-3 * 1.2
    if model.params.air_drag_linear == 0.0:
        return  # the paper's thread has no damping: it keeps swinging and never comes to rest
    # at rest, no jitter, and the rendered force equals the thread's axial force at the grasp
    assert np.max(np.abs(np.diff(force[2500:]))) < 1e-3
    axial = np.zeros(3)
    magnitude = constraint_force_at(state.x, state.tension, model.n_vertices - 1, axial)
    assert magnitude == pytest.approx(force[-1], rel=1e-4)
    assert np.allclose(state.grasp_force[0], -axial, rtol=1e-4, atol=1e-4)  # + the end vertex weight, settling


def test_saturated_silk_is_inextensible_and_mass_scaled():
    model, state = pulled("silk-3-0", max_force=5.0)
    stepper = Stepper(model, state)
    for _ in range(2000):
        stepper.tick()
    lengths = np.linalg.norm(np.diff(state.x, axis=0), axis=1)
    assert np.max(np.abs(lengths ** 2 - model.rest_length ** 2) / model.rest_length ** 2) <= 1e-10
    assert state.tension[-1] == pytest.approx(5.0, rel=1e-4)
    # 5 N on a 3-0 silk needs far more than 32 substeps explicitly; the budget holds by scaling masses
    assert state.stats[STAT_MASS_FACTOR] > 1.0


def hanging(max_substeps: int):
    """10 cm of 3-0 silk (80 segments) held by two grasps 90 mm apart, 10 mm of slack, under gravity."""
    data = {"name": "hang", "duration": 5.0,
            "thread": {"preset": "silk-3-0", "length": 0.10, "segments": 80},
            "shape": {"kind": "straight", "direction": [1.0, 0.0, 0.0]},
            "boundary": {"grasps": [{"id": "a", "vertex": 0, "stiffness": 1000.0, "damping": 0.5, "max_force": 3.0},
                                    {"id": "b", "vertex": -1, "stiffness": 1000.0, "damping": 0.5,
                                     "max_force": 3.0}]},
            "contact": {"enabled": False},
            "solver": {"max_substeps": max_substeps},
            "timeline": [{"grasp": "b", "move_to": [0.09, 0.0, 0.0], "from": 0.0, "to": 0.5}]}
    sc = build_scenario(data, "hang.yaml")
    return sc.model, sc.new_state()


def _median_speed_after(max_substeps: int, seconds: float) -> float:
    """The median vertex speed |x - x_prev| / h (m/s) after ``seconds`` of hanging()."""
    model, state = hanging(max_substeps)
    stepper = Stepper(model, state)
    for _ in range(int(round(seconds / model.solver.tick))):
        stepper.tick()
    return float(np.median(np.linalg.norm(state.x - state.x_prev, axis=1)) / state.h[0])


def test_a_slack_thread_comes_to_rest_with_the_substeps_it_needs():
    """The reference for the scaled thread below: unscaled (37 substeps), the hanging thread settles."""
    assert _median_speed_after(64, 3.0) < 2e-3      # m/s (0.74 mm/s measured; 13.6 mm/s at 1 s)


@pytest.mark.parametrize("substeps, bound", [(16, 5e-3), (4, 2e-2)])
def test_a_slack_thread_comes_to_rest_under_mass_scaling(substeps, bound):
    """The same thread within a budget of 16 substeps (every vertex mass-scaled, by 3.7 at most) or 4 (by up to
    918): it settles too, only slower. Measured: 1.2 and 4.3 mm/s at 5 s; with the velocity kept when a mass grew
    (docs/PHYSICS.md Sec. 6) it kept moving at 84 and 664 mm/s."""
    assert _median_speed_after(substeps, 5.0) < bound      # m/s


def _taut_string_energy_ratio(max_substeps: int) -> tuple[float, float]:
    """4 cm of 3-0 silk (32 segments) pinned at one end and pulled along itself with 0.1 N at the other, set
    vibrating across itself; no quadratic drag or bending dissipation, so only the linear air drag c damps it.
    Returns the ratio of its kinetic energy (vertices' own masses, mean over a 0.25 s window) between two windows
    0.25 s apart, from 1 s on, and the air's damping rate c/m (1/s) of its inner vertices."""
    n, l = 32, 1.25e-3
    data = {"name": "taut", "duration": 3.0,
            "thread": {"preset": "silk-3-0", "length": n * l, "segments": n, "air_drag": 0.0,
                       "bending_dissipation": 0.0},
            "gravity": [0.0, 0.0, 0.0], "shape": {"kind": "straight", "direction": [1.0, 0.0, 0.0]},
            "boundary": {"pinned": [0], "forces": [{"vertex": -1, "force": [0.1, 0.0, 0.0]}]},
            "solver": {"max_substeps": max_substeps}}
    sc = build_scenario(data, "taut.yaml")
    model, state = sc.model, sc.new_state()
    stepper = Stepper(model, state)
    for _ in range(3):
        stepper.tick()
    # 5 mm/s at the free end across the string, in its quarter-wave shape
    s = np.arange(n + 1) / n
    state.x_prev[:, 1] = state.x[:, 1] - state.h[0] * 5e-3 * np.sin(0.5 * np.pi * s)
    windows = []
    for _ in range(6):
        ke = 0.0
        for _ in range(250):
            stepper.tick()
            v = (state.x - state.x_prev) / state.h[0]
            ke += 0.5 * float(np.sum(model.mass[:, None] * v * v))
        windows.append(ke)
    assert state.stats[STAT_MASS_FACTOR] > 2.0      # scaled: 698-fold within 4 substeps, 2.7-fold within 64
    return windows[5] / windows[4], float(model.drag_lin[1] / model.mass[1])


@pytest.mark.parametrize("substeps", [4, 64])
def test_a_mass_scaled_taut_string_is_damped_at_the_airs_rate(substeps):
    """The string's tension (its geometric stiffness, docs/PHYSICS.md Sec. 6) has its masses scaled 2.7-fold within
    64 substeps and 698-fold within 4. The drag of a vertex made heavier grows with it, so the mode's
    energy still decays at c/m (3.03 /s for silk): a ratio exp(-3.03 * 0.25) = 0.469 over 0.25 s. Measured 0.46-0.48
    at 4 substeps and 0.469 at 64; with the drag left as it was, 0.98-1.02 (undamped) and 0.757."""
    ratio, rate = _taut_string_energy_ratio(substeps)
    assert rate == pytest.approx(3.03, abs=0.01)      # silk-3-0: air_drag_linear / linear_density
    assert ratio == pytest.approx(np.exp(-rate * 0.25), abs=0.03)


def test_the_default_scene_whips_taut_without_a_tick_run_again():
    """The default scene's stylus pulls the suture past its reach at 6 s and the end whips round (13-18 m/s).
    With a heavier vertex keeping its energy, the grasp's pull across the end's segment must count in the
    scaling's tension floor: counted 0 (as it still is for `scaled_mass_keeps: velocity`), the scaled masses fell
    51-fold in one substep under the 3 N pull and the tick at 6.13 s diverged, was run three times again and
    took 290 ms (docs/PHYSICS.md Sec. 6)."""
    sc = load_scenario("default", {"duration": 7.0})
    state = sc.new_state()
    stepper = Stepper(sc.model, state)
    factor = 1.0
    for _ in range(7000):
        stepper.tick()
        factor = max(factor, float(state.stats[STAT_MASS_FACTOR]))
    assert factor > 10.0          # the taut thread was scaled (93-fold measured)
    assert stepper.retries == 0


def test_a_runaway_ticks_tensions_are_not_counted_as_static(monkeypatch):
    """A tick whose solve converged but ran far past its stability bound is run again without its tensions in
    the mass scaling's floor. A free tail snapped taut under mass scaling read 1.4e8 N at h omega = 3,340;
    counted as static, that scaled the masses a trillionfold and the next tick diverged (docs/PHYSICS.md Sec.
    6). Here the first run of the tick is made to end like that."""
    model, state = pulled("silk-3-0", 3.0)
    stepper = Stepper(model, state)
    real = integrator.step
    runs = []

    def runaway_once(model, state, n, h, scale=False, trace=None, margs=None):
        real(model, state, n, h, scale=scale, trace=trace, margs=margs)
        runs.append(n)
        if len(runs) == 1:
            state.tension[:] = 1.4e8
            state.stats[STAT_OMEGA_END] = 3340.0 / h

    monkeypatch.setattr(integrator, "step", runaway_once)
    stepper.tick()
    assert len(runs) == 2 and stepper.retries == 1
    assert state.tension_floor.max() < 1.0          # N: a few times the grasp's floor, not 1.4e8
    assert state.stats[STAT_MASS_FACTOR] < 10.0
    # the rule itself: with every converged run's tensions counted, the floor takes the runaway's
    runs.clear()
    model, state = pulled("silk-3-0", 3.0)
    stepper = Stepper(model, state)
    monkeypatch.setattr(Stepper, "RUNAWAY", float("inf"))
    stepper.tick()
    assert state.tension_floor.max() == 1.4e8
