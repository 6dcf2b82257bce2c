"""Energies and momenta of a thread state, in the discrete form the integrator conserves.

The variational integrator's velocities live between steps: v^{k+1/2} = (x^{k+1} - x^k)/h. The state holds
x = x^{k+1}, x_prev = x^k, so kinetic energy and momenta here are those of the last half step, and the
conserved discrete angular momentum is sum m x^k x (x^{k+1} - x^k)/h (Marsden & West 2001: Noether's theorem
for the discrete Lagrangian; exact because the constraint, bending and drag forces are central or rotation
invariant). A held twist (theta != 0) is not: it needs end frames held in space, whose torque changes the
angular momentum by -twist_k theta (t_first - t_last) per second (tests/test_constraints.py).
"""
from __future__ import annotations

import numpy as np

from .forces import bending_energy
from .model import ThreadModel, ThreadState


def kinetic_energy(model: ThreadModel, state: ThreadState) -> float:
    """J, from the last half-step velocities."""
    v = (state.x - state.x_prev) / state.h[0]
    return 0.5 * float(np.sum(model.mass[:, None] * v * v))


def gravity_energy(model: ThreadModel, state: ThreadState, at_prev: bool = False) -> float:
    """J, -sum m g.x (zero at the origin)."""
    x = state.x_prev if at_prev else state.x
    return -float(np.sum(model.mass * (x @ model.gravity)))


def elastic_energy(model: ThreadModel, state: ThreadState, at_prev: bool = False) -> float:
    """J: bending + uniform twist (+ stretch for extensible threads)."""
    x = state.x_prev if at_prev else state.x
    e = bending_energy(x, model.hinge_k) + 0.5 * model.twist_k * state.twist[0] ** 2
    if model.params.extensible:
        lengths = np.linalg.norm(np.diff(x, axis=0), axis=1)
        e += 0.5 * float(np.sum((lengths - model.rest_length) ** 2 / (model.compliance * model.rest_length)))
    return e


def energies(model: ThreadModel, state: ThreadState) -> dict[str, float]:
    """{'kinetic', 'elastic', 'gravity'} in J (the state topic's `energy`)."""
    return {"kinetic": kinetic_energy(model, state), "elastic": elastic_energy(model, state),
            "gravity": gravity_energy(model, state)}


def linear_momentum(model: ThreadModel, state: ThreadState) -> np.ndarray:
    """kg*m/s, sum m (x^{k+1} - x^k)/h."""
    return (model.mass[:, None] * (state.x - state.x_prev)).sum(axis=0) / state.h[0]


def angular_momentum(model: ThreadModel, state: ThreadState) -> np.ndarray:
    """kg*m^2/s about the centre of mass at x^k: sum m (x^k - c) x (x^{k+1} - x^k)/h."""
    m = model.mass[:, None]
    c = (m * state.x_prev).sum(axis=0) / m.sum()
    return (m * np.cross(state.x_prev - c, state.x - state.x_prev)).sum(axis=0) / state.h[0]


def max_strain(model: ThreadModel, state: ThreadState) -> float:
    """max_j |psi_j| / l_j^2 with psi_j = |x_{j+1} - x_j|^2 - l_j^2 (Wang 2017 Eq. 2)."""
    sq = np.sum(np.diff(state.x, axis=0) ** 2, axis=1)
    return float(np.max(np.abs(sq - model.rest_length ** 2) / model.rest_length ** 2))
