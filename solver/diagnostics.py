"""Energies and momenta of a thread state, in the discrete form the integrator conserves.

The variational integrator's velocities live between steps: v^{k+1/2} = (x^{k+1} - x^k)/h. The state holds
x = x^{k+1}, x_prev = x^k, so kinetic energy and momenta here are those of the last half step, and the
conserved discrete angular momentum is sum m x^k x (x^{k+1} - x^k)/h (Marsden & West 2001: Noether's theorem
for the discrete Lagrangian; exact because the constraint, bending and drag forces are central or rotation
invariant). A held twist (theta != 0) is not: it needs end frames held in space, whose torque changes the
angular momentum by -twist_k theta (t_first - t_last) per second (tests/test_constraints.py).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .forces import bending_energy
from .model import ThreadModel, ThreadState


@njit(cache=True, error_model="numpy")
def energy_terms(x: np.ndarray, x_prev: np.ndarray, h: float, mass: np.ndarray, hinge_k: np.ndarray,
                 gravity: np.ndarray, twist_energy: float, extensible: bool, rest: np.ndarray,
                 compliance: np.ndarray, parted: np.ndarray) -> tuple:
    """(kinetic, elastic, gravity) in J at positions x (m), the kinetic from the half-step velocities
    (x - x_prev) / h: in one pass and with no array made, since the `state` topic sends them at 100 Hz from the
    loop's process. Elastic: bending + uniform twist (``twist_energy``, J) + stretch for an extensible thread;
    gravity: -sum m g.x (zero at the origin). A parted segment (``parted``, solver/breakage.py) stores nothing."""
    kin = 0.0
    grav = 0.0
    for i in range(x.shape[0]):
        v2 = 0.0
        for d in range(3):
            v = x[i, d] - x_prev[i, d]
            v2 += v * v
            grav -= mass[i] * x[i, d] * gravity[d]
        kin += mass[i] * v2
    elastic = bending_energy(x, hinge_k, parted) + twist_energy
    if extensible:
        for j in range(x.shape[0] - 1):
            if parted[j] != 0:
                continue
            ex = x[j + 1, 0] - x[j, 0]
            ey = x[j + 1, 1] - x[j, 1]
            ez = x[j + 1, 2] - x[j, 2]
            s = math.sqrt(ex * ex + ey * ey + ez * ez) - rest[j]
            elastic += 0.5 * s * s / (compliance[j] * rest[j])
    return 0.5 * kin / (h * h), elastic, grav


def _terms(model: ThreadModel, state: ThreadState, at_prev: bool = False) -> tuple:
    x = state.x_prev if at_prev else state.x
    return energy_terms(x, state.x_prev, float(state.h[0]), model.mass, model.hinge_k, model.gravity,
                        0.5 * model.twist_k * float(state.twist[0]) ** 2, bool(model.params.extensible),
                        model.rest_length, model.compliance, state.parted)


def kinetic_energy(model: ThreadModel, state: ThreadState) -> float:
    """J, from the last half-step velocities."""
    return _terms(model, state)[0]


def gravity_energy(model: ThreadModel, state: ThreadState, at_prev: bool = False) -> float:
    """J, -sum m g.x (zero at the origin), at x or (``at_prev``) at x_prev."""
    return _terms(model, state, at_prev)[2]


def elastic_energy(model: ThreadModel, state: ThreadState, at_prev: bool = False) -> float:
    """J: bending + uniform twist (+ stretch for extensible threads), at x or (``at_prev``) at x_prev."""
    return _terms(model, state, at_prev)[1]


def energies(model: ThreadModel, state: ThreadState) -> dict[str, float]:
    """{'kinetic', 'elastic', 'gravity'} in J (the state topic's `energy`)."""
    kin, elastic, grav = _terms(model, state)
    return {"kinetic": kin, "elastic": elastic, "gravity": grav}


def linear_momentum(model: ThreadModel, state: ThreadState) -> np.ndarray:
    """kg*m/s, sum m (x^{k+1} - x^k)/h."""
    return (model.mass[:, None] * (state.x - state.x_prev)).sum(axis=0) / state.h[0]


def angular_momentum(model: ThreadModel, state: ThreadState) -> np.ndarray:
    """kg*m^2/s about the centre of mass at x^k: sum m (x^k - c) x (x^{k+1} - x^k)/h."""
    m = model.mass[:, None]
    c = (m * state.x_prev).sum(axis=0) / m.sum()
    return (m * np.cross(state.x_prev - c, state.x - state.x_prev)).sum(axis=0) / state.h[0]


def max_strain(model: ThreadModel, state: ThreadState) -> float:
    """max_j |psi_j| / l_j^2 with psi_j = |x_{j+1} - x_j|^2 - l_j^2 (Wang 2017 Eq. 2), over the segments that hold
    (a parted one, solver/breakage.py, has no constraint)."""
    sq = np.sum(np.diff(state.x, axis=0) ** 2, axis=1)
    psi = np.abs(sq - model.rest_length ** 2) / model.rest_length ** 2
    return float(np.max(psi, where=state.parted == 0, initial=0.0))
