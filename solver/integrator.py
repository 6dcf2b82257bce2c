"""The explicit discrete variational integrator with exact inextensibility (Wang 2017 Eq. 7, 9; App. B, D).

One substep of length h:
  1. the timeline moves kinematic vertices, grasp targets and the input twist over [t, t+h];
  2. forces at x^k (solver/forces.py);
  3. prediction xbar = 2 x^k - x^{k-1} + h^2 M^-1 F (Eq. 9 without the constraint term, Eq. D.1); a grasped
     vertex takes its virtual-coupling spring-damper implicitly (backward Euler on the spring), which only
     changes its xbar and its effective inverse mass, so any coupling stiffness is stable;
  4. multipliers (solver/constraints.py) and x^{k+1} = xbar + constraint displacement (Eq. D.3);
  5. tensions T_j = alpha_j |e_j| / h^2 (N; Eq. 8), the accumulated twist (Eq. C.5 written as the change of
     the twist along the actual displacement, so that twist force and twist energy stay consistent), and the
     force each grasp applies to the thread.

`advance` runs n substeps in one call (one dispatch per tick); `tick` picks n from the stability bound.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .constraints import solve_multipliers
from .forces import accumulate_forces, edge_vectors
from .model import ThreadModel, ThreadState
from .motion import apply_motions
from .stability import omega_bound, substeps_for

# state.stats slots
STAT_ITERS = 0          # multiplier iterations of the last substep
STAT_RESIDUAL = 1       # max |psi_j|/l_j^2 after the last substep
STAT_SUBSTEPS = 2       # substeps in the last tick
STAT_MAX_ITERS = 3      # most iterations any substep of the last tick needed
STAT_MAX_RESIDUAL = 4   # largest residual of any substep of the last tick
STAT_TOTAL_ITERS = 5    # iterations summed over the last tick
STAT_OMEGA = 6          # stability bound (rad/s) used for the last tick


@njit(cache=True, error_model="numpy")
def substep(h: float, t: float,
            rest, mass, inv_mass, kinematic, hinge_k, k_d, drag_quad, drag_lin, compliance, gravity, twist_k,
            mot_kind, mot_index, mot_t0, mot_t1, mot_vel, method, tol, max_iters,
            x, x_prev, tension, twist, kin_target, ext_force,
            grasp_vertex, grasp_k, grasp_c, grasp_fmax, grasp_target, grasp_target_prev, grasp_force,
            grasp_sat, force, twist_grad, xbar, w_eff, edges, elen, new_edges, alpha,
            lo, di, up, rhs, cp, delta):
    """Advance the state by one substep h (s) starting at time t (s). Returns (iterations, residual)."""
    n = x.shape[0]
    m = n - 1
    g_count = grasp_vertex.shape[0]
    for g in range(g_count):
        for d in range(3):
            grasp_target_prev[g, d] = grasp_target[g, d]
    apply_motions(t, h, mot_kind, mot_index, mot_t0, mot_t1, mot_vel, kin_target, grasp_target, twist)

    edge_vectors(x, edges, elen)
    accumulate_forces(x, x_prev, edges, elen, h, mass, hinge_k, k_d, drag_quad, drag_lin, gravity, ext_force,
                      twist_k, twist[0], force, twist_grad)

    h2 = h * h
    # Eq. D.1 with lumped masses; the numerator N_i and mass D_i let grasps add their implicit terms
    for i in range(n):
        if kinematic[i] == 1:
            for d in range(3):
                xbar[i, d] = kin_target[i, d]
            w_eff[i] = 0.0
        else:
            for d in range(3):
                xbar[i, d] = mass[i] * (2.0 * x[i, d] - x_prev[i, d]) + h2 * force[i, d]
            w_eff[i] = mass[i]
    for g in range(g_count):
        v = grasp_vertex[g]
        if v < 0 or kinematic[v] == 1:
            continue
        k = grasp_k[g]
        c = grasp_c[g]
        # spring-damper force if the vertex did not move this substep: decides whether the coupling saturates
        fx = k * (grasp_target[g, 0] - x[v, 0]) + c * ((grasp_target[g, 0] - grasp_target_prev[g, 0]) - (x[v, 0] - x_prev[v, 0])) / h
        fy = k * (grasp_target[g, 1] - x[v, 1]) + c * ((grasp_target[g, 1] - grasp_target_prev[g, 1]) - (x[v, 1] - x_prev[v, 1])) / h
        fz = k * (grasp_target[g, 2] - x[v, 2]) + c * ((grasp_target[g, 2] - grasp_target_prev[g, 2]) - (x[v, 2] - x_prev[v, 2])) / h
        fmag = math.sqrt(fx * fx + fy * fy + fz * fz)
        if fmag > grasp_fmax[g]:
            # saturated: a constant pull of fmax toward the target (explicit, no stiffness left to destabilise)
            s = grasp_fmax[g] / fmag
            grasp_force[g, 0] = fx * s
            grasp_force[g, 1] = fy * s
            grasp_force[g, 2] = fz * s
            for d in range(3):
                xbar[v, d] += h2 * grasp_force[g, d]
            grasp_sat[g] = 1
        else:
            # m (x1 - 2x + x0)/h^2 = F + k (p1 - x1) + c ((p1 - p0) - (x1 - x))/h, solved for x1
            for d in range(3):
                xbar[v, d] += h2 * k * grasp_target[g, d] + h * c * (grasp_target[g, d] - grasp_target_prev[g, d]) + h * c * x[v, d]
            w_eff[v] += h2 * k + h * c
            grasp_sat[g] = 0
    for i in range(n):
        if kinematic[i] == 0:
            inv = 1.0 / w_eff[i]
            for d in range(3):
                xbar[i, d] *= inv
            w_eff[i] = inv

    # warm start from the previous tensions (alpha = h^2 T / |e|)
    for j in range(m):
        alpha[j] = h2 * tension[j] / elen[j] if w_eff[j] + w_eff[j + 1] > 0.0 else 0.0

    iters, residual = solve_multipliers(xbar, edges, elen, w_eff, rest, compliance, h, method, tol, max_iters,
                                        alpha, new_edges, lo, di, up, rhs, cp, delta)

    # x^{k+1} (Eq. D.3), the twist change along the displacement, and the shift of the history
    dtheta = 0.0
    for i in range(n):
        for d in range(3):
            xn = xbar[i, d]
            if i < m:
                xn += w_eff[i] * alpha[i] * edges[i, d]
            if i > 0:
                xn -= w_eff[i] * alpha[i - 1] * edges[i - 1, d]
            dtheta += twist_grad[i, d] * (xn - x[i, d])
            x_prev[i, d] = x[i, d]
            x[i, d] = xn
    twist[0] += dtheta
    for j in range(m):
        tension[j] = alpha[j] * elen[j] / h2

    for g in range(g_count):
        v = grasp_vertex[g]
        if v < 0:
            continue
        if grasp_sat[g] == 1:
            continue  # grasp_force already holds the applied pull
        for d in range(3):
            grasp_force[g, d] = grasp_k[g] * (grasp_target[g, d] - x[v, d]) + grasp_c[g] * (
                (grasp_target[g, d] - grasp_target_prev[g, d]) - (x[v, d] - x_prev[v, d])) / h
    return iters, residual


@njit(cache=True, error_model="numpy")
def advance(n_sub: int, h: float, t: float,
            rest, mass, inv_mass, kinematic, hinge_k, k_d, drag_quad, drag_lin, compliance, gravity, twist_k,
            mot_kind, mot_index, mot_t0, mot_t1, mot_vel, method, tol, max_iters,
            x, x_prev, tension, twist, kin_target, ext_force,
            grasp_vertex, grasp_k, grasp_c, grasp_fmax, grasp_target, grasp_target_prev, grasp_force,
            grasp_sat, force, twist_grad, xbar, w_eff, edges, elen, new_edges, alpha,
            lo, di, up, rhs, cp, delta, stats):
    """Run n_sub substeps of h (s) from time t (s); write iteration statistics into ``stats``."""
    max_it = 0
    max_res = 0.0
    total = 0
    it = 0
    res = 0.0
    for s in range(n_sub):
        it, res = substep(h, t + s * h, rest, mass, inv_mass, kinematic, hinge_k, k_d, drag_quad, drag_lin,
                          compliance, gravity, twist_k, mot_kind, mot_index, mot_t0, mot_t1, mot_vel, method, tol,
                          max_iters, x, x_prev, tension, twist, kin_target, ext_force,
                          grasp_vertex, grasp_k, grasp_c, grasp_fmax, grasp_target, grasp_target_prev,
                          grasp_force, grasp_sat, force, twist_grad, xbar, w_eff, edges, elen, new_edges, alpha,
                          lo, di, up, rhs, cp, delta)
        total += it
        if it > max_it:
            max_it = it
        if res > max_res or not math.isfinite(res):
            max_res = res
    stats[0] = it
    stats[1] = res
    stats[2] = n_sub
    stats[3] = max_it
    stats[4] = max_res
    stats[5] = total


@njit(cache=True, error_model="numpy")
def rescale_history(x: np.ndarray, x_prev: np.ndarray, ratio: float) -> None:
    """Change the substep from h to ratio*h keeping the velocity (x - x_prev)/h."""
    for i in range(x.shape[0]):
        for d in range(3):
            x_prev[i, d] = x[i, d] - ratio * (x[i, d] - x_prev[i, d])


def step(model: ThreadModel, state: ThreadState, n_sub: int, h: float) -> None:
    """Advance ``state`` by n_sub substeps of h seconds (one kernel call)."""
    if h != state.h[0]:
        rescale_history(state.x, state.x_prev, h / state.h[0])
        state.h[0] = h
    s = model.solver
    advance(n_sub, h, state.time[0],
            model.rest_length, model.mass, model.inv_mass, model.kinematic, model.hinge_k,
            model.bending_dissipation, model.drag_quad, model.drag_lin, model.compliance, model.gravity,
            model.twist_k, model.mot_kind, model.mot_index, model.mot_t0, model.mot_t1, model.mot_vel,
            model.method_code, s.tol, s.max_iters,
            state.x, state.x_prev, state.tension, state.twist, state.kin_target, state.ext_force,
            state.grasp_vertex, state.grasp_k, state.grasp_c, state.grasp_fmax, state.grasp_target,
            state.grasp_target_prev, state.grasp_force, state.grasp_sat, state.force, state.twist_grad, state.xbar, state.w_eff,
            state.edges, state.elen, state.new_edges, state.alpha, state.tri_lo, state.tri_di, state.tri_up,
            state.tri_rhs, state.tri_cp, state.tri_delta, state.stats)
    state.time[0] += n_sub * h


def choose_substeps(model: ThreadModel, state: ThreadState) -> int:
    """Substeps for the next tick: fixed if the model says so, else from the stability bound."""
    s = model.solver
    if s.substeps > 0:
        return s.substeps
    omega = omega_bound(state.x, model.inv_mass, model.bend_gersh, model.rest_length, state.tension, 1.5)
    state.stats[STAT_OMEGA] = omega
    n = substeps_for(omega, s.tick, s.stability_target, s.max_substeps)
    prev = int(state.stats[STAT_SUBSTEPS])
    # hysteresis: only drop the substep count once the bound is clearly lower, so h does not flicker
    if 0 < n < prev and n > 0.75 * prev:
        n = prev
    return n


def tick(model: ThreadModel, state: ThreadState) -> int:
    """Advance one tick (model.solver.tick seconds); returns the substeps used."""
    n = choose_substeps(model, state)
    step(model, state, n, model.solver.tick / n)
    return n
