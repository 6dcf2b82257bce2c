"""Inextensibility constraints (solver/constraints.py) and the integrator built on them (solver/integrator.py).

Kernel level: the tridiagonal solver against numpy, the multipliers of both methods against the constraint
they must satisfy (checked on positions rebuilt from Eq. D.3 here, not on the kernel's own edges), the
compliant constraint of an extensible thread. Integrator level: momenta and energy of a free thread, and a
grasped thread pulled taut by a stiff and by a saturating coupling.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from suturesim.solver import diagnostics
from suturesim.solver.constraints import METHOD_CONTRACTION, METHOD_NEWTON, solve_multipliers, thomas_solve
from suturesim.solver.forces import bending_energy, constraint_force_at
from suturesim.solver.integrator import SolverDivergence, Stepper, solve_again, step
from suturesim.solver.model import SolverSettings, ThreadParams, build_model, make_state
from suturesim.solver.stability import omega_bound

# ---------------------------------------------------------------------------------------------- Thomas


@pytest.mark.parametrize("seed", range(8))
def test_thomas_solve_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    size = [1, 2, 3, 7, 20, 33, 64, 5][seed]
    lo = rng.normal(size=size)
    up = rng.normal(size=size)
    di = (np.abs(lo) + np.abs(up) + rng.uniform(0.1, 2.0, size)) * rng.choice([-1.0, 1.0], size)
    lo[0] = 0.0
    up[-1] = 0.0
    rhs = rng.normal(size=size)
    a = np.diag(di) + np.diag(lo[1:], -1) + np.diag(up[:-1], 1)
    expected = np.linalg.solve(a, rhs)
    # arrays longer than the system: only the first m entries are used
    pad = 3
    lo_p, di_p, up_p, rhs_p = (np.concatenate([v, rng.normal(size=pad)]) for v in (lo, di, up, rhs))
    out = np.full(size + pad, 7.0)
    cp = np.zeros(size + pad)
    thomas_solve(lo_p, di_p, up_p, rhs_p, cp, out, size)
    np.testing.assert_allclose(out[:size], expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
    np.testing.assert_array_equal(out[size:], 7.0)


# ---------------------------------------------------------------------------------------------- multipliers

def _chain(rng, n, l0=0.01, spread=0.5):
    x = np.zeros((n, 3))
    t = np.array([1.0, 0.0, 0.0])
    rest = l0 * rng.uniform(0.7, 1.3, n - 1)
    for j in range(n - 1):
        t = t + spread * rng.normal(size=3)
        t /= np.linalg.norm(t)
        x[j + 1] = x[j] + rest[j] * t
    return x, rest


def _solve(xbar, x, w, rest, compliance, h, method, alpha0=None, tol=1e-12, max_iters=200):
    n = x.shape[0]
    m = n - 1
    e = np.ascontiguousarray(np.diff(x, axis=0))
    elen = np.linalg.norm(e, axis=1)
    alpha = np.zeros(m) if alpha0 is None else alpha0.copy()
    E = np.zeros((m, 3))
    scratch = [np.zeros(m) for _ in range(3)]     # di, rhs, cp
    iters, residual = solve_multipliers(xbar, e, elen, w, rest, compliance, h, method, tol, max_iters, alpha, E,
                                        *scratch, np.zeros(m, np.int8))
    # Eq. D.3, rebuilt here: x_i^{k+1} = xbar_i + w_i (alpha_i e_i - alpha_{i-1} e_{i-1})
    xn = xbar.copy()
    xn[:-1] += (w[:-1] * alpha)[:, None] * e
    xn[1:] -= (w[1:] * alpha)[:, None] * e
    return iters, residual, alpha, E, xn, elen


BOUNDARIES = ["free", "pin_first", "pin_both", "pin_both_grasp_middle", "pin_first_grasp_last"]


def _setup(seed, boundary, n=15, h=1e-4, disp=2e-4):
    rng = np.random.default_rng(seed)
    x, rest = _chain(rng, n)
    mass = 1e-6 * rng.uniform(0.5, 2.0, n)
    w = 1.0 / mass
    if boundary.startswith("pin_first") or boundary.startswith("pin_both"):
        w[0] = 0.0
    if boundary.startswith("pin_both"):
        w[-1] = 0.0
    if boundary.endswith("grasp_middle"):
        g = n // 2
        w[g] = 1.0 / (mass[g] + h * h * 1e4)  # implicit coupling of stiffness 1e4 N/m
    if boundary.endswith("grasp_last"):
        w[-1] = 1.0 / (mass[-1] + h * h * 1e4)
    # a predicted position near the valid configuration x: kinematic vertices stay where they are
    xbar = x + disp * rng.normal(size=x.shape) * (w > 0)[:, None]
    return x, xbar, w, rest, h


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("seed", range(4))
def test_multipliers_restore_rest_lengths_newton_and_contraction_agree(seed, boundary):
    x, xbar, w, rest, h = _setup(seed, boundary)
    comp = np.zeros(rest.shape[0])
    it_n, res_n, a_n, E_n, xn_n, _ = _solve(xbar, x, w, rest, comp, h, METHOD_NEWTON)
    it_c, res_c, a_c, E_c, xn_c, _ = _solve(xbar, x, w, rest, comp, h, METHOD_CONTRACTION)
    assert np.abs(a_n).max() > 0.0
    for res, E, xn in ((res_n, E_n, xn_n), (res_c, E_c, xn_c)):
        assert res <= 1e-12
        lengths2 = np.sum(np.diff(xn, axis=0) ** 2, axis=1)
        assert np.max(np.abs(lengths2 - rest ** 2) / rest ** 2) <= 1e-12
        np.testing.assert_allclose(E, np.diff(xn, axis=0), rtol=0, atol=1e-15)
        # kinematic vertices do not move
        np.testing.assert_array_equal(xn[w == 0], xbar[w == 0])
    assert it_n <= 5, it_n
    assert it_c > it_n  # linear vs quadratic convergence: a real difference between the methods
    np.testing.assert_allclose(a_c, a_n, rtol=0, atol=1e-9 * np.abs(a_n).max())


@pytest.mark.parametrize("seed", range(3))
def test_multipliers_warm_start_at_solution_returns_at_once(seed):
    x, xbar, w, rest, h = _setup(seed, "pin_first_grasp_last")
    comp = np.zeros(rest.shape[0])
    _, _, a, _, _, _ = _solve(xbar, x, w, rest, comp, h, METHOD_NEWTON)
    for method in (METHOD_NEWTON, METHOD_CONTRACTION):
        it, res, a2, _, _, _ = _solve(xbar, x, w, rest, comp, h, method, alpha0=a)
        assert it == 0 and res <= 1e-12
        np.testing.assert_array_equal(a2, a)


EXTENSIBLE = [
    # (h s, EA N, end pull as a fraction of the chord); m l / (EA h^2) = 1e-8 / (EA h^2)
    pytest.param(1e-4, 1e3, 1e-4, METHOD_NEWTON, id="stiff-newton"),
    pytest.param(1e-4, 1e3, 1e-4, METHOD_CONTRACTION, id="stiff-contraction"),
    pytest.param(1e-5, 1e4, 1e-5, METHOD_NEWTON, id="stiff-small-h-newton"),
    pytest.param(1e-5, 1e4, 1e-5, METHOD_CONTRACTION, id="stiff-small-h-contraction"),
    pytest.param(1e-5, 1e2, 1e-4, METHOD_NEWTON, id="soft-newton"),
    pytest.param(1e-5, 1e2, 1e-4, METHOD_CONTRACTION, id="soft-contraction"),
]


@pytest.mark.parametrize("h, ea, pull, method", EXTENSIBLE)
@pytest.mark.parametrize("seed", range(4))
def test_extensible_thread_stretches_by_tension_over_ea(seed, h, ea, pull, method):
    """Compliant constraint: |E_j| = l_j (1 + T_j / EA) with T_j = alpha_j |e_j| / h^2."""
    rng = np.random.default_rng(50 + seed)
    n = 12
    x, rest = _chain(rng, n, spread=0.2)
    mass = 1e-6 * np.ones(n)
    w = 1.0 / mass
    w[0] = w[-1] = 0.0
    # both ends pulled apart along the chord, interior vertices jostled
    chord = x[-1] - x[0]
    xbar = x + 1e-3 * pull * rng.normal(size=x.shape)
    xbar[0] = x[0] - pull * chord
    xbar[-1] = x[-1] + pull * chord
    comp = np.full(n - 1, 1.0 / ea)
    it, res, alpha, E, xn, elen = _solve(xbar, x, w, rest, comp, h, method, max_iters=500)
    assert res <= 1e-12
    tension = alpha * elen / h ** 2
    assert tension.min() > 1e-4  # the thread is really pulled
    length = np.linalg.norm(np.diff(xn, axis=0), axis=1)
    np.testing.assert_allclose(length, rest * (1.0 + tension / ea), rtol=1e-11, atol=0)
    assert np.max(length / rest - 1.0) > 1e-7  # and really stretched
    if method == METHOD_NEWTON:
        assert it <= 5


@pytest.mark.parametrize("method", [METHOD_NEWTON, METHOD_CONTRACTION])
def test_solving_a_stretched_extensible_thread_again_keeps_its_tension(method):
    # integrator.solve_again after a floor or pad moved nothing: the constraints already hold, so it must add no
    # multiplier. Solved from zero with the rest lengths, it pulled each stretched segment back to its rest
    # length and read twice the tension (the Choi rod's end force doubled in a fifth of its ticks); a small
    # push then changes the tension by a small amount
    rng = np.random.default_rng(7)
    n, h, ea = 12, 1e-4, 50.0
    x, rest = _chain(rng, n, spread=0.2)
    w = np.full(n, 1e6)
    w[0] = w[-1] = 0.0
    chord = x[-1] - x[0]
    xbar = x.copy()
    xbar[0] -= 0.02 * chord
    xbar[-1] += 0.02 * chord
    comp = np.full(n - 1, 1.0 / ea)
    _, res, alpha, _, xn, elen = _solve(xbar, x, w, rest, comp, h, method, max_iters=500)
    assert res <= 1e-12
    tension = alpha * elen / h ** 2
    assert tension.min() > 0.1    # really pulled: stretched by over 0.2 %
    e = np.ascontiguousarray(np.diff(x, axis=0))
    scratch = [np.zeros(n - 1) for _ in range(5)]   # again_len, again_compliance, di, rhs, cp
    extra, new_edges = np.zeros(n - 1), np.zeros((n - 1, 3))
    a2 = alpha.copy()
    solve_again(xn, e, elen, w, rest, comp, h, method, 1e-12, 500, a2, extra, new_edges, *scratch,
                np.zeros(n - 1, np.int8))
    np.testing.assert_allclose(a2 * elen / h ** 2, tension, rtol=1e-6)
    xn[5] += 1e-6 * rng.normal(size=3)    # a micrometre's push on one vertex
    solve_again(xn, e, elen, w, rest, comp, h, method, 1e-12, 500, a2, extra, new_edges, *scratch,
                np.zeros(n - 1, np.int8))
    np.testing.assert_allclose(a2 * elen / h ** 2, tension, rtol=0.05)
    length = np.linalg.norm(np.diff(xn, axis=0), axis=1)
    np.testing.assert_allclose(length, rest * (1.0 + a2 * elen / h ** 2 / ea), rtol=1e-9)


# ---------------------------------------------------------------------------------------------- free thread

def _free_thread(twist_k_gj: float, twist0: float, spin: float = 20.0):
    """A bent, twisted 0.2 m thread in zero gravity with a rigid spin (rad/s) plus smooth and random velocities,
    centred on the origin."""
    p = ThreadParams(name="free", length=0.2, segments=20, linear_density=1e-4, bending_stiffness=1e-6,
                     twisting_stiffness=twist_k_gj)
    model = build_model(p, SolverSettings(substeps=1, tick=1e-5), gravity=(0.0, 0.0, 0.0))
    n = model.n_vertices
    u = np.linspace(0.0, 1.0, n)
    r = 0.2 / 1.5
    x0 = np.c_[r * np.sin(1.5 * u), r * (1.0 - np.cos(1.5 * u)), 0.02 * np.sin(np.pi * u)]
    e = np.diff(x0, axis=0)
    e *= (model.rest_length / np.linalg.norm(e, axis=1))[:, None]
    x0 = np.vstack([np.zeros(3), np.cumsum(e, axis=0)])
    x0 -= x0.mean(axis=0)
    rng = np.random.default_rng(0)
    v0 = (0.05 * np.c_[np.sin(2 * np.pi * u), np.cos(np.pi * u), np.sin(3 * u)] + 0.01 * rng.normal(size=(n, 3))
          + np.cross(spin * np.array([0.3, 0.5, 1.0]), x0))
    state = make_state(model, x0, v0, twist0)
    omega = omega_bound(state.x, model.inv_mass, model.bend_gersh, model.rest_length, state.tension, 1.0,
                        state.contact_k, state.fold, state.parted)
    return model, state, omega


def _twist_torque(model, state):
    """Torque (N*m) of the twist force the next step applies at x: -twist_k Theta sum x_i x dTheta/dx_i =
    -twist_k Theta (t_0 - t_L), with Theta as that step uses it: the integrator first completes the trapezoidal
    twist update of the last step, Theta += 1/2 (g(x) - g(x_prev)) . (x - x_prev)."""
    from suturesim.solver.forces import accumulate_forces, edge_vectors

    n = state.x.shape[0]
    edges, elen = np.zeros((n - 1, 3)), np.zeros(n - 1)
    edge_vectors(state.x, edges, elen)
    g_new = np.zeros((n, 3))
    accumulate_forces(state.x, state.x_prev, edges, elen, state.h[0], model.mass, model.inv_mass,
                      model.hinge_k, 0.0,
                      np.zeros(n), np.zeros(n), np.zeros(3), np.zeros((n, 3)), model.twist_k, np.zeros((n, 3)),
                      g_new, state.parted)
    dx = state.x - state.x_prev
    theta = state.twist[0] + 0.5 * float(np.sum((g_new - state.twist_grad) * dx))
    t = edges / elen[:, None]
    return -model.twist_k * theta * (t[0] - t[-1])


def test_free_twisted_thread_conserves_linear_momentum():
    model, state, omega = _free_thread(1e-6, 2.0)
    h = 0.5 / omega
    step(model, state, 1, h)
    p0 = diagnostics.linear_momentum(model, state)
    p = p0
    worst = 0.0
    for _ in range(1000):
        step(model, state, 1, h)
        p1 = diagnostics.linear_momentum(model, state)
        worst = max(worst, float(np.abs(p1 - p).max()))
        p = p1
    assert state.twist[0] > 1.0 and abs(state.twist[0] - 2.0) > 1e-6  # twist present, and it evolved
    assert worst <= 1e-15, worst
    assert np.abs(p - p0).max() <= 1e-10 * np.linalg.norm(p0)


def test_free_bent_thread_conserves_angular_momentum():
    """No twist: every force is central (constraints) or rotation invariant (bending)."""
    model, state, omega = _free_thread(0.0, 0.0)
    h = 0.5 / omega
    step(model, state, 1, h)
    l0 = diagnostics.angular_momentum(model, state)
    e0 = bending_energy(state.x, model.hinge_k, state.parted)
    step(model, state, 1000, h)
    l1 = diagnostics.angular_momentum(model, state)
    assert abs(bending_energy(state.x, model.hinge_k, state.parted) - e0) > 1e-3 * e0  # the thread really deformed
    assert np.linalg.norm(l1 - l0) <= 1e-12 * np.linalg.norm(l0)


def test_free_twisted_thread_angular_momentum_changes_only_by_the_twist_end_torque():
    """With twist, L^{k+1/2} - L^{k-1/2} = h * torque of the twist force, and that torque is exactly
    -twist_k Theta (t_0 - t_L): all other forces keep the discrete angular momentum."""
    model, state, omega = _free_thread(1e-6, 2.0)
    h = 0.5 / omega
    step(model, state, 1, h)
    l0 = diagnostics.angular_momentum(model, state)
    impulse = np.zeros(3)
    for _ in range(1000):
        impulse += h * _twist_torque(model, state)
        step(model, state, 1, h)
    l1 = diagnostics.angular_momentum(model, state)
    assert np.linalg.norm(impulse) > 1e-3 * np.linalg.norm(l0)  # the end torque matters
    assert np.linalg.norm(l1 - l0 - impulse) <= 1e-12 * np.linalg.norm(l0)


def _energy_series(model, state, h, steps, every):
    """Total energy kinetic + (V(x^k) + V(x^{k+1}))/2 every ``every`` steps: the half-step kinetic energy
    pairs with the mean potential of the two ends of the step (error O((h omega)^2), not O(h omega))."""
    def potential(x, theta):
        return bending_energy(x, model.hinge_k, np.zeros(x.shape[0] - 1, np.int8)) + 0.5 * model.twist_k * theta ** 2

    out = []
    for _ in range(steps // every):
        step(model, state, every - 1, h)
        xa = state.x.copy()
        tha = state.twist[0]
        step(model, state, 1, h)
        out.append(diagnostics.kinetic_energy(model, state)
                   + 0.5 * (potential(state.x, state.twist[0]) + potential(xa, tha)))
    assert diagnostics.gravity_energy(model, state) == 0.0
    return np.array(out)


@pytest.mark.parametrize("gj, twist0, h_omega", [(0.0, 0.0, 0.1), (1e-6, 2.0, 0.02)])
def test_free_thread_energy_is_conserved(gj, twist0, h_omega):
    model, state, omega = _free_thread(gj, twist0, spin=0.0)
    h = h_omega / omega
    step(model, state, 1, h)
    e = _energy_series(model, state, h, 5000, 10)
    assert np.all(np.isfinite(e))
    assert np.ptp(e) <= 1e-4 * e[0], np.ptp(e) / e[0]
    if gj > 0.0:
        assert 0.5 * model.twist_k * state.twist[0] ** 2 > 0.5 * e[0]  # twist energy dominates


def test_free_twisted_thread_energy_has_no_secular_drift():
    model, state, omega = _free_thread(1e-6, 2.0, spin=0.0)
    h = 0.1 / omega
    step(model, state, 1, h)
    e = _energy_series(model, state, h, 20000, 2000)
    assert np.max(np.abs(e - e[0])) <= 1e-4 * e[0], (e[-1] - e[0]) / e[0]


# ---------------------------------------------------------------------------------------------- grasp

L_GRASP = 0.2


def _grasped_thread(fmax: float, reach_excess: float, bend: float, substeps: int = 0):
    """Light thread (0.2 m, 20 segments, 1e-4 kg/m, EI 1e-6), vertex 0 pinned at the origin, the last vertex
    grasped by a 1e4 N/m coupling whose target lies reach_excess (m) beyond the thread's length along +x.
    Starts bent in the x-y plane (tangent angle bend * sin(pi s / L)), at rest, zero gravity; linear drag
    settles it."""
    p = ThreadParams(name="grasp", length=L_GRASP, segments=20, linear_density=1e-4, bending_stiffness=1e-6,
                     twisting_stiffness=0.0, air_drag_linear=0.5)
    model = build_model(p, SolverSettings(substeps=substeps), gravity=(0.0, 0.0, 0.0), kinematic_vertices=(0,))
    n = model.n_vertices
    u = np.linspace(0.0, 1.0, n)
    ang = bend * np.sin(np.pi * u[:-1])
    e = np.c_[np.cos(ang), np.sin(ang), np.zeros(n - 1)] * model.rest_length[:, None]
    x0 = np.vstack([np.zeros(3), np.cumsum(e, axis=0)])
    state = make_state(model, x0)
    state.grasp_vertex[0] = n - 1
    state.grasp_k[0] = 1e4
    state.grasp_c[0] = 0.0
    state.grasp_fmax[0] = fmax
    state.grasp_target[0] = [L_GRASP + reach_excess, 0.0, 0.0]
    state.grasp_target_prev[0] = state.grasp_target[0]
    return model, state, Stepper(model, state)


def _grasp_balance(state):
    v = int(state.grasp_vertex[0])
    cf = np.zeros(3)
    constraint_force_at(state.x, state.tension, v, cf)
    return state.grasp_force[0].copy(), cf


def test_stiff_grasp_pulls_thread_taut_and_balances_tension():
    k = 1e4
    model, state, stepper = _grasped_thread(math.inf, 1e-3, 0.03)
    for _ in range(300):
        stepper.tick()
    assert np.all(np.isfinite(state.x))
    n = model.n_vertices
    # straight along +x at full length
    assert np.abs(state.x[:, 1:]).max() <= 1e-9
    assert state.x[-1, 0] == pytest.approx(L_GRASP, rel=1e-11)
    assert np.all(state.tension > 0.0)
    f, cf = _grasp_balance(state)
    assert np.linalg.norm(f + cf) <= 1e-6 * np.linalg.norm(cf)
    dist = np.linalg.norm(state.grasp_target[0] - state.x[n - 1])
    assert np.linalg.norm(f) == pytest.approx(k * dist, rel=1e-9)
    assert np.linalg.norm(f) == pytest.approx(k * 1e-3, rel=1e-6)
    assert state.grasp_sat[0] == 0

    # move the target 1 mm further, 0.1 mm per tick: the force follows k * excess tick by tick
    for i in range(1, 11):
        state.grasp_target[0, 0] += 1e-4
        stepper.tick()
        f, cf = _grasp_balance(state)
        assert f[0] == pytest.approx(k * (1e-3 + i * 1e-4), rel=1e-6), i
        assert np.linalg.norm(f + cf) <= 1e-6 * np.linalg.norm(cf)
    assert np.linalg.norm(f) == pytest.approx(k * 2e-3, rel=1e-6)


def test_stiff_grasp_snapping_a_bent_thread_taut_stays_finite():
    """A 1e4 N/m coupling with no force limit snapping a bent thread taut (50-110 N at first): the violent
    ticks are run again past the real-time budget (retry_substeps) and the thread settles at k * excess."""
    k = 1e4
    model, state, stepper = _grasped_thread(math.inf, 1e-3, 0.3)
    for _ in range(300):
        stepper.tick()
    assert np.abs(state.x[:, 1:]).max() <= 1e-9
    assert np.linalg.norm(state.grasp_force[0]) == pytest.approx(k * 1e-3, rel=1e-6)


@pytest.mark.parametrize("substeps", [0, 64])
def test_a_diverged_substep_ends_its_tick_and_the_tick_faults(substeps):
    """A substep whose multipliers diverge (here a vertex gone NaN) ends the run of its tick there: the substeps
    after it are not run (each would take its solve to the iteration limit, and a tick's retries run up to 1024
    substeps), and the tick faults (SolverDivergence), after every retry with
    automatic substeps, at once with fixed ones."""
    model, state, stepper = _grasped_thread(math.inf, 1e-3, 0.0, substeps)
    for _ in range(5):
        stepper.tick()
    n = max(model.solver.retry_substeps, model.solver.max_substeps, substeps)
    stepper.trace = np.zeros((n + 1, state.x.shape[0], 3))
    state.x[5, 0] = np.nan
    with pytest.raises(SolverDivergence):
        stepper.tick()
    assert np.isnan(stepper.trace[0]).any()                 # the first substep ran, and diverged
    assert not stepper.trace[1:].any()                      # no other did, in any attempt
    assert stepper.retries == (0 if substeps else Stepper.MAX_RETRIES)


def test_saturated_grasp_pulls_with_its_limit():
    fmax = 2.0
    model, state, stepper = _grasped_thread(fmax, 1e-3, 0.3)  # unsaturated it would pull with 10 N
    worst = 0.0
    for _ in range(300):
        stepper.tick()
        assert np.all(np.isfinite(state.x)) and np.all(np.isfinite(state.tension))
        worst = max(worst, float(np.linalg.norm(state.grasp_force[0])))
    assert worst <= fmax + 1e-9
    assert state.grasp_sat[0] == 1
    assert np.abs(state.x[:, 1:]).max() <= 1e-9
    f, cf = _grasp_balance(state)
    assert np.linalg.norm(f) == pytest.approx(fmax, rel=1e-12)
    assert np.linalg.norm(cf) == pytest.approx(fmax, rel=1e-6)
    assert np.linalg.norm(f + cf) <= 1e-6 * fmax
    # the whole thread carries the pull (zero gravity, at rest)
    np.testing.assert_allclose(state.tension, fmax, rtol=1e-6)
