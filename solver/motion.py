"""The scripted timeline: piecewise-constant velocities of kinematic vertices, grasp targets and the input
twist. A scenario's waypoints and "move to" segments are compiled to these at load time (solver/scenario.py),
so a step only integrates velocities over the part of each segment that overlaps it: exact for piecewise
linear paths, whatever the substep.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .needle import NS_QT, turn

MOTION_VERTEX = 0   # index: vertex; vel: m/s
MOTION_GRASP = 1    # index: grasp slot; vel: m/s
MOTION_TWIST = 2    # index unused; vel[0]: rad/s of input twist at the thread's end (Wang 2017 Eq. C.5 theta_in)
MOTION_SPIN = 3     # index unused; vel: rad/s (world), the turn of the needle's stylus (solver/needle.py)
MOTION_RELEASE = 4  # index: grasp slot; at t0 the hand lets go: the coupling's stiffness, damping and force go to 0


@njit(cache=True, error_model="numpy")
def apply_motions(t: float, h: float, kind: np.ndarray, index: np.ndarray, t0: np.ndarray, t1: np.ndarray,
                  vel: np.ndarray, kin_target: np.ndarray, grasp_target: np.ndarray, twist: np.ndarray,
                  nst: np.ndarray, grasp_k: np.ndarray, grasp_c: np.ndarray, grasp_fmax: np.ndarray) -> None:
    """Advance the driven quantities over [t, t + h] (s): kinematic vertex targets (m), grasp targets (m),
    the twist (rad; twist[0] total, twist[1] accumulated input), the needle stylus's orientation (nst), and
    let go of grasps whose release falls in [t, t + h)."""
    for k in range(kind.shape[0]):
        if kind[k] == MOTION_RELEASE:
            if t <= t0[k] < t + h:
                grasp_k[index[k]] = 0.0
                grasp_c[index[k]] = 0.0
                grasp_fmax[index[k]] = 0.0
            continue
        a = t0[k] if t0[k] > t else t
        b = t1[k] if t1[k] < t + h else t + h
        if b <= a:
            continue
        dt = b - a
        if kind[k] == MOTION_VERTEX:
            for d in range(3):
                kin_target[index[k], d] += vel[k, d] * dt
        elif kind[k] == MOTION_GRASP:
            for d in range(3):
                grasp_target[index[k], d] += vel[k, d] * dt
        elif kind[k] == MOTION_SPIN:
            turn(nst, NS_QT, vel[k, 0] * dt, vel[k, 1] * dt, vel[k, 2] * dt)
        else:
            twist[0] += vel[k, 0] * dt
            twist[1] += vel[k, 0] * dt
