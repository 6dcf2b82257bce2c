"""Forces on the thread's vertices (solver/forces.py) checked against independent computations.

Bending against finite differences of bending_energy; twist against a numpy discrete parallel transport of a
frame vector along the edges; dissipation against the Rayleigh form -k_d beta_dot grad beta with beta = cos phi
from numpy; drag and the constraint force at a vertex against their closed forms. Fast: no time stepping.
"""
from __future__ import annotations

import numpy as np
import pytest

from suturesim.solver.forces import accumulate_forces, bending_energy, constraint_force_at, edge_vectors

SEEDS = range(7)  # with n = 6 + seed vertices: 6..12


def random_thread(rng: np.random.Generator, n: int, l0: float = 0.01, spread: float = 0.6,
                  offset=(0.3, -0.2, 0.1)) -> np.ndarray:
    """A bent polyline (m) with n vertices, non-uniform edge lengths around l0, hinges well away from folding,
    away from the origin (so torques about the origin are not trivially small)."""
    x = np.zeros((n, 3))
    t = rng.normal(size=3)
    t /= np.linalg.norm(t)
    x[0] = offset
    for j in range(n - 1):
        t = t + spread * rng.normal(size=3)
        t /= np.linalg.norm(t)
        x[j + 1] = x[j] + l0 * rng.uniform(0.6, 1.4) * t
    return x


def random_hinge_k(rng: np.random.Generator, n: int, scale: float = 2e-4) -> np.ndarray:
    hk = scale * rng.uniform(0.3, 3.0, n)
    hk[0] = hk[-1] = 0.0
    return hk


def compute(x, hinge_k, *, x_prev=None, h=1e-4, mass=None, k_d=0.0, drag_quad=None, drag_lin=None,
            gravity=(0.0, 0.0, 0.0), ext=None, twist_k=0.0, theta=0.0, twist_grad=None):
    """accumulate_forces with everything off unless given, plus the uniform-twist force -twist_k theta dTheta/dx
    that the integrator adds (integrator.add_forces). Returns (force, twist_grad)."""
    n = x.shape[0]
    x = np.ascontiguousarray(x, dtype=np.float64)
    edges = np.zeros((n - 1, 3))
    elen = np.zeros(n - 1)
    edge_vectors(x, edges, elen)
    force = np.full((n, 3), np.nan)
    tg = np.full((n, 3), np.nan) if twist_grad is None else twist_grad
    z = np.zeros(n)
    accumulate_forces(x, x.copy() if x_prev is None else np.ascontiguousarray(x_prev, dtype=np.float64),
                      edges, elen, h, np.ones(n) if mass is None else mass,
                      np.ones(n) if mass is None else 1.0 / mass, hinge_k, k_d,
                      z if drag_quad is None else drag_quad, z if drag_lin is None else drag_lin,
                      np.asarray(gravity, dtype=np.float64), np.zeros((n, 3)) if ext is None else ext,
                      twist_k, force, tg, np.zeros(n - 1, np.int8))
    if twist_k != 0.0:
        force -= twist_k * theta * tg
    return force, tg


def numeric_gradient(fun, x: np.ndarray, eps: float) -> np.ndarray:
    g = np.zeros_like(x)
    for i in range(x.shape[0]):
        for d in range(3):
            xp = x.copy()
            xm = x.copy()
            xp[i, d] += eps
            xm[i, d] -= eps
            g[i, d] = (fun(xp) - fun(xm)) / (2.0 * eps)
    return g


# ---------------------------------------------------------------------------------------------- bending

@pytest.mark.parametrize("seed", SEEDS)
def test_bending_force_is_minus_gradient_of_bending_energy(seed):
    rng = np.random.default_rng(seed)
    n = 6 + seed
    x = random_thread(rng, n)
    hk = random_hinge_k(rng, n)
    f, _ = compute(x, hk)
    g = numeric_gradient(lambda y: bending_energy(y, hk, np.zeros(y.shape[0] - 1, np.int8)), x, 1e-8)
    assert np.abs(g).max() > 1e-3  # the configuration is really bent
    err = np.linalg.norm(f + g) / np.linalg.norm(g)
    assert err < 1e-6, err


@pytest.mark.parametrize("seed", SEEDS)
def test_bending_forces_have_no_net_force_or_torque(seed):
    rng = np.random.default_rng(100 + seed)
    n = 6 + seed
    x = random_thread(rng, n, spread=1.0)
    hk = random_hinge_k(rng, n)
    f, _ = compute(x, hk)
    scale_f = np.abs(f).sum()
    scale_t = (np.linalg.norm(x, axis=1) * np.linalg.norm(f, axis=1)).sum()
    assert scale_f > 0.0
    assert np.abs(f.sum(axis=0)).max() <= 1e-12 * scale_f
    assert np.abs(np.cross(x, f).sum(axis=0)).max() <= 1e-12 * scale_t


def test_straight_thread_with_unequal_edges_has_no_bending_force_or_energy():
    rng = np.random.default_rng(7)
    n = 11
    t = rng.normal(size=3)
    t /= np.linalg.norm(t)
    s = np.concatenate([[0.0], np.cumsum(0.01 * rng.uniform(0.3, 2.0, n - 1))])
    x = np.array([0.1, 0.2, -0.3]) + s[:, None] * t
    hk = random_hinge_k(rng, n)
    f, _ = compute(x, hk)
    assert bending_energy(x, hk, np.zeros(x.shape[0] - 1, np.int8)) == pytest.approx(0.0, abs=1e-15 * hk.sum())
    assert np.abs(f).max() <= 1e-12 * hk.max() / 0.01


@pytest.mark.parametrize("seed", SEEDS)
def test_bending_energy_and_force_ignore_edge_lengths(seed):
    """The bending energy depends on the turning angles only: stretching edges (directions kept) leaves it
    unchanged, and the bending force does no work on any edge-stretch motion (it never loads a constraint)."""
    rng = np.random.default_rng(200 + seed)
    n = 6 + seed
    x = random_thread(rng, n)
    hk = random_hinge_k(rng, n)
    e = np.diff(x, axis=0)
    stretched = np.vstack([x[:1], x[0] + np.cumsum(e * rng.uniform(0.5, 2.0, (n - 1, 1)), axis=0)])
    e0 = bending_energy(x, hk, np.zeros(x.shape[0] - 1, np.int8))
    assert e0 > 0.0
    assert bending_energy(stretched, hk, np.zeros(stretched.shape[0] - 1, np.int8)) == pytest.approx(e0, rel=1e-12)

    f, _ = compute(x, hk)
    t = e / np.linalg.norm(e, axis=1)[:, None]
    fscale = np.linalg.norm(f, axis=1).sum()
    for j in range(n - 1):
        # virtual motion lengthening edge j only: every vertex after it moves along t_j
        work = float(np.sum(f[j + 1:] @ t[j]))
        assert abs(work) <= 1e-12 * fscale, (j, work)


# ---------------------------------------------------------------------------------------------- twist

def _rotate(axis: np.ndarray, angle: float, v: np.ndarray) -> np.ndarray:
    """Rodrigues rotation of v about the unit axis."""
    return v * np.cos(angle) + np.cross(axis, v) * np.sin(angle) + axis * (axis @ v) * (1.0 - np.cos(angle))


def _transport(t0: np.ndarray, t1: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Parallel transport of v from unit tangent t0 to t1: rotation about t0 x t1 by the turning angle."""
    c = np.cross(t0, t1)
    s = np.linalg.norm(c)
    if s == 0.0:
        return v.copy()
    return _rotate(c / s, float(np.arctan2(s, t0 @ t1)), v)


def transported_angle(x: np.ndarray, x_ref: np.ndarray) -> float:
    """Angle (rad, right-handed about the last tangent) of a frame vector carried by discrete parallel
    transport from the first edge to the last, measured against a reference vector on the last edge.

    Both end vectors are fixed on x_ref; if x moves an end edge they follow it by time-parallel transport
    (the minimal rotation, i.e. end frames that do not spin about their tangents). When x keeps both end
    edges of x_ref, this is the plain transport between fixed end frames."""
    t = np.diff(x, axis=0)
    t /= np.linalg.norm(t, axis=1)[:, None]
    tr = np.diff(x_ref, axis=0)
    tr /= np.linalg.norm(tr, axis=1)[:, None]
    u = np.cross(tr[0], [0.3, 0.5, 0.7])
    u = _transport(tr[0], t[0], u / np.linalg.norm(u))
    for j in range(1, t.shape[0]):
        u = _transport(t[j - 1], t[j], u)
    r1 = np.cross(tr[-1], [0.1, -0.6, 0.2])
    r1 = _transport(tr[-1], t[-1], r1 / np.linalg.norm(r1))
    r2 = np.cross(t[-1], r1)
    return float(np.arctan2(u @ r2, u @ r1))


@pytest.mark.parametrize("seed", SEEDS)
def test_twist_gradient_matches_parallel_transport_between_fixed_end_edges(seed):
    """d(transported angle)/dx_i = -dTheta/dx_i for the vertices that keep both end edges fixed (2..n-3): the
    twist between fixed end frames falls as the transported frame turns."""
    rng = np.random.default_rng(300 + seed)
    n = 6 + seed
    x = random_thread(rng, n, spread=0.8)
    _, tg = compute(x, random_hinge_k(rng, n), twist_k=1.0)
    g = numeric_gradient(lambda y: transported_angle(y, x), x, 1e-7)
    inner = slice(2, n - 2)
    assert np.abs(tg[inner]).max() > 1.0  # a few rad/m: the test is not comparing zeros
    err = np.linalg.norm(g[inner] + tg[inner]) / np.linalg.norm(tg[inner])
    assert err < 1e-6, err


@pytest.mark.parametrize("seed", SEEDS)
def test_twist_gradient_at_end_vertices_matches_time_parallel_transported_end_frames(seed):
    """At the four end vertices the gradient is that of the twist against end frames carried along by
    time-parallel transport (Bergou et al. 2008's holonomy); the whole gradient then matches."""
    rng = np.random.default_rng(400 + seed)
    n = 6 + seed
    x = random_thread(rng, n, spread=0.8)
    _, tg = compute(x, random_hinge_k(rng, n), twist_k=2.0, theta=0.7)
    g = numeric_gradient(lambda y: transported_angle(y, x), x, 1e-7)
    err = np.linalg.norm(g + tg) / np.linalg.norm(tg)
    assert err < 1e-6, err


@pytest.mark.parametrize("seed", SEEDS)
def test_twist_force_is_minus_gradient_of_twist_energy(seed):
    """F_twist = -d/dx [twist_k Theta(x)^2 / 2] with Theta(x) = theta - (change of the transported angle)."""
    rng = np.random.default_rng(500 + seed)
    n = 6 + seed
    x = random_thread(rng, n, spread=0.8)
    hk = random_hinge_k(rng, n)
    twist_k, theta = 3e-5, 1.3
    f_bend, tg0 = compute(x, hk, twist_k=0.0, theta=theta)
    f_all, tg = compute(x, hk, twist_k=twist_k, theta=theta)
    phi0 = transported_angle(x, x)

    def energy(y):
        return 0.5 * twist_k * (theta - (transported_angle(y, x) - phi0)) ** 2

    g = numeric_gradient(energy, x, 1e-7)
    f_twist = f_all - f_bend
    assert np.abs(f_twist).max() > 1e-5
    assert np.linalg.norm(f_twist + g) / np.linalg.norm(g) < 1e-6
    # the force is exactly -twist_k theta dTheta/dx, and dTheta/dx does not depend on theta
    np.testing.assert_allclose(f_twist, -twist_k * theta * tg, rtol=0, atol=1e-12 * np.abs(f_twist).max())
    _, tg_zero_theta = compute(x, hk, twist_k=twist_k, theta=0.0)
    np.testing.assert_array_equal(tg_zero_theta, tg)
    # with twist_k = 0 the gradient is left at zero (overwriting whatever the buffer held)
    np.testing.assert_array_equal(tg0, np.zeros((n, 3)))


@pytest.mark.parametrize("seed", SEEDS)
def test_twist_gradient_translation_and_rotation_behaviour(seed):
    """Theta is translation invariant (sum of dTheta/dx = 0) but, measured against end frames that do not spin,
    not rotation invariant: sum x_i x dTheta/dx_i = t_first - t_last exactly (the twist moment of a bent,
    twisted thread is carried by whatever holds its end frames)."""
    rng = np.random.default_rng(600 + seed)
    n = 6 + seed
    x = random_thread(rng, n, spread=0.8)
    _, tg = compute(x, random_hinge_k(rng, n), twist_k=1.0)
    t = np.diff(x, axis=0)
    t /= np.linalg.norm(t, axis=1)[:, None]
    scale = np.abs(tg).sum()
    assert np.abs(tg.sum(axis=0)).max() <= 1e-12 * scale
    np.testing.assert_allclose(np.cross(x, tg).sum(axis=0), t[0] - t[-1], rtol=0,
                               atol=1e-12 * (np.linalg.norm(x, axis=1) * np.linalg.norm(tg, axis=1)).sum())


# ---------------------------------------------------------------------------------------------- dissipation

def _cosines(x: np.ndarray) -> np.ndarray:
    e = np.diff(x, axis=0)
    return np.einsum("ij,ij->i", e[:-1], e[1:]) / (np.linalg.norm(e[:-1], axis=1) * np.linalg.norm(e[1:], axis=1))


@pytest.mark.parametrize("seed", SEEDS)
def test_dissipation_vanishes_without_motion(seed):
    rng = np.random.default_rng(700 + seed)
    n = 6 + seed
    x = random_thread(rng, n)
    hk = random_hinge_k(rng, n)
    h = 1e-5
    f0, _ = compute(x, hk, h=h)
    f1, _ = compute(x, hk, h=h, k_d=1e-4)
    # round-off only: k_d * eps / h * |grad cos| ~ 1e-4 * 1e-16 / 1e-5 * 1e2 = 1e-13 N
    np.testing.assert_allclose(f1, f0, rtol=0, atol=1e-10 * np.abs(f0).max())


@pytest.mark.parametrize("seed", SEEDS)
def test_dissipation_is_rayleigh_force_and_removes_energy(seed):
    """F_d = -k_d sum_i beta_dot_i grad beta_i with beta_i = cos phi_i, beta_dot = (beta(x) - beta(x_prev))/h,
    and its power F_d . v is negative (to first order -k_d sum beta_dot^2)."""
    rng = np.random.default_rng(800 + seed)
    n = 6 + seed
    x = random_thread(rng, n)
    hk = random_hinge_k(rng, n)
    h = 1e-4
    k_d = 3e-5
    v = 0.002 * rng.normal(size=(n, 3))  # m/s: a displacement of ~2e-7 m per step on 1e-2 m edges
    x_prev = x - v * h
    f0, _ = compute(x, hk, x_prev=x_prev, h=h)
    f1, _ = compute(x, hk, x_prev=x_prev, h=h, k_d=k_d)
    fd = f1 - f0

    beta_dot = (_cosines(x) - _cosines(x_prev)) / h
    expected = np.zeros_like(x)
    k_eff = np.zeros(n - 2)
    for i in range(n - 2):
        grad = numeric_gradient(lambda y: _cosines(y)[i], x, 1e-8)
        # the kernel caps k_d at 1 / (3 h S_i) (forces.py), S_i = (1 - c^2)(1/(m l_a^2) + 1/(m l_b^2) +
        # (1/l_a + 1/l_b)^2 / m), unit masses here: 3 h k_d S ~ 1e-4, far below the cap, so k_d is exact
        la, lb = np.linalg.norm(x[i + 1] - x[i]), np.linalg.norm(x[i + 2] - x[i + 1])
        c = _cosines(x)[i]
        assert 3.0 * h * k_d * (1 - c * c) * (1 / la**2 + 1 / lb**2 + (1 / la + 1 / lb) ** 2) < 1e-2
        k_eff[i] = k_d
        expected -= k_eff[i] * beta_dot[i] * grad
    assert np.linalg.norm(fd - expected) <= 1e-6 * np.linalg.norm(expected)

    power = float(np.sum(fd * v))
    assert power < 0.0
    assert power == pytest.approx(-float(np.sum(k_eff * beta_dot ** 2)), rel=1e-3)


def test_dissipation_rings_a_hinge_down_even_where_the_step_does_not_resolve_it():
    # one hinge of two 5 mm segments with 0.1 mg vertices, bent 60 degrees and opening: h k_d S ~ 10, where the
    # plain explicit force would reverse the rate nine times over (1 - 10) and the hinge would ring up
    h, k_d, l, m = 2e-4, 1e-8, 0.005, 1e-7
    a = np.deg2rad(60.0)
    x = np.array([[-l, 0.0, 0.0], [0.0, 0.0, 0.0], [l * np.cos(a), l * np.sin(a), 0.0]])
    x_prev = x.copy()
    x_prev[2] = [l * np.cos(a + 1e-3), l * np.sin(a + 1e-3), 0.0]
    mass = np.full(3, m)
    rates = []
    for _ in range(20):
        f, _ = compute(x, np.zeros(3), x_prev=x_prev, h=h, mass=mass, k_d=k_d)
        x_next = 2 * x - x_prev + h * h * f / m
        rates.append((_cosines(x_next)[0] - _cosines(x)[0]) / h)
        x_prev, x = x, x_next
    c = np.cos(a)
    assert 3 * h * k_d * (1 - c * c) * 6 / (m * l * l) > 10
    rates = np.abs(rates)
    assert np.all(np.diff(rates) < 0.0)          # every step damps the rate, none amplifies it
    assert rates[-1] < 0.5 * rates[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_dissipation_power_is_negative_for_random_motions(seed):
    rng = np.random.default_rng(900 + seed)
    n = 6 + seed
    x = random_thread(rng, n, spread=1.0)
    hk = random_hinge_k(rng, n)
    h = 1e-4
    for trial in range(20):
        v = rng.uniform(0.001, 0.1) * rng.normal(size=(n, 3))
        x_prev = x - v * h
        f0, _ = compute(x, hk, x_prev=x_prev, h=h)
        f1, _ = compute(x, hk, x_prev=x_prev, h=h, k_d=1e-4)
        assert float(np.sum((f1 - f0) * v)) < 0.0, trial


# ---------------------------------------------------------------------------------------------- drag, loads

@pytest.mark.parametrize("speed", [0.0, 1e-3, 0.3, 5.0])
def test_drag_on_a_single_moving_vertex(speed):
    rng = np.random.default_rng(11)
    n = 5
    x = np.array([0.1, 0.0, 0.0]) + np.arange(n)[:, None] * np.array([0.01, 0.0, 0.0])
    hk = np.zeros(n)
    drag_quad = rng.uniform(1e-4, 1e-3, n)
    drag_lin = rng.uniform(1e-4, 1e-3, n)
    h = 1e-4
    vdir = rng.normal(size=3)
    v = speed * vdir / np.linalg.norm(vdir)
    x_prev = x.copy()
    x_prev[2] -= v * h
    f, _ = compute(x, hk, x_prev=x_prev, h=h, drag_quad=drag_quad, drag_lin=drag_lin)
    vh = (x[2] - x_prev[2]) / h  # the velocity the kernel sees
    np.testing.assert_allclose(f[2], -(drag_lin[2] + drag_quad[2] * np.linalg.norm(vh)) * vh, rtol=1e-12,
                               atol=1e-300)
    np.testing.assert_array_equal(np.delete(f, 2, axis=0), 0.0)


def test_gravity_and_external_loads_at_rest():
    rng = np.random.default_rng(12)
    n = 7
    x = random_thread(rng, n)
    mass = rng.uniform(1e-6, 1e-5, n)
    ext = rng.normal(size=(n, 3)) * 1e-3
    g = np.array([0.3, -1.0, -9.81])
    f, _ = compute(x, np.zeros(n), mass=mass, gravity=g, ext=ext)
    np.testing.assert_allclose(f, mass[:, None] * g + ext, rtol=1e-15, atol=0)


# ---------------------------------------------------------------------------------------------- constraint force

def test_constraint_force_at_on_a_straight_thread():
    rng = np.random.default_rng(13)
    n = 8
    t = rng.normal(size=3)
    t /= np.linalg.norm(t)
    s = np.concatenate([[0.0], np.cumsum(0.01 * rng.uniform(0.5, 1.5, n - 1))])
    x = np.array([0.2, -0.1, 0.05]) + s[:, None] * t
    tension = rng.uniform(-1.0, 5.0, n - 1)
    out = np.full(3, np.nan)
    total = np.zeros(3)
    for v in range(n):
        mag = constraint_force_at(x, tension, v, out)
        right = tension[v] if v < n - 1 else 0.0
        left = tension[v - 1] if v > 0 else 0.0
        np.testing.assert_allclose(out, (right - left) * t, rtol=0, atol=1e-14 * np.abs(tension).max())
        assert mag == pytest.approx(abs(right - left), rel=1e-12, abs=1e-14)
        total += out
    # internal forces: the segments pull their two vertices equally and oppositely
    assert np.abs(total).max() <= 1e-14 * np.abs(tension).max()


def test_constraint_force_at_on_a_bent_thread():
    rng = np.random.default_rng(14)
    n = 9
    x = random_thread(rng, n, spread=1.0)
    tension = rng.uniform(0.1, 2.0, n - 1)
    e = np.diff(x, axis=0)
    t = e / np.linalg.norm(e, axis=1)[:, None]
    out = np.zeros(3)
    for v in range(n):
        expected = np.zeros(3)
        if v < n - 1:
            expected += tension[v] * t[v]
        if v > 0:
            expected -= tension[v - 1] * t[v - 1]
        mag = constraint_force_at(x, tension, v, out)
        np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-15)
        assert mag == pytest.approx(np.linalg.norm(expected), rel=1e-13)
