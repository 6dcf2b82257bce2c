"""How many substeps a 1 ms tick needs.

The scheme is explicit in the bending forces and in the direction of the constraint forces, so it is stable
while h * omega_max < 2 (Wang 2017 Sec. 3 (1), after Skeel et al. 1997). omega_max^2 is bounded by Gershgorin's
theorem on M^-1 K: per vertex, its inverse mass times the absolute row sum of the stiffness. Two stiffnesses
count:
- bending, K_i tan^2(phi/2) per hinge: its straight-thread row sums are precomputed in the model
  (model.bend_gersh) and scaled by the current hinge's stiffening factor (E'' + |E'|)/E''(0) of
  E(phi) = tan^2(phi/2), which grows as a hinge folds;
- the geometric stiffness of tension: a segment under tension T acts transversally as a spring T / l, so a
  vertex gets 2 (|T_{j-1}| / l_{j-1} + |T_j| / l_j) (the string mode of a taut thread).
Grasp couplings are integrated implicitly and the stretch of extensible threads is a compliant constraint, so
neither limits the step. Light, stiff sutures need many substeps (bench-suture: docs/BENCHMARKS.md).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def omega_bound(x: np.ndarray, inv_mass: np.ndarray, bend_gersh: np.ndarray, rest: np.ndarray,
                tension: np.ndarray, tension_margin: float) -> float:
    """Upper bound (rad/s) of the highest natural frequency at configuration x (m) with tensions (N)
    multiplied by ``tension_margin`` (tension can grow within a tick)."""
    n = x.shape[0]
    fac_max = 1.0
    for i in range(1, n - 1):
        ax = x[i, 0] - x[i - 1, 0]
        ay = x[i, 1] - x[i - 1, 1]
        az = x[i, 2] - x[i - 1, 2]
        bx = x[i + 1, 0] - x[i, 0]
        by = x[i + 1, 1] - x[i, 1]
        bz = x[i + 1, 2] - x[i, 2]
        c = (ax * bx + ay * by + az * bz) / math.sqrt((ax * ax + ay * ay + az * az) * (bx * bx + by * by + bz * bz))
        c = max(c, -0.999)
        # with u = tan^2(phi/2) = (1-c)/(1+c) and sec^2 = 1 + u: E' = tan sec^2, E'' = sec^4/2 + tan^2 sec^2,
        # E''(0) = 1/2. The largest factor anywhere scales every row (conservative, one pass, no scratch).
        u = (1.0 - c) / (1.0 + c)
        sec2 = 1.0 + u
        fac = (0.5 * sec2 * sec2 + u * sec2 + math.sqrt(u) * sec2) / 0.5
        if fac > fac_max:
            fac_max = fac
    worst = 0.0
    for i in range(n):
        k = bend_gersh[i] * fac_max
        if i > 0:
            k += 2.0 * abs(tension[i - 1]) * tension_margin / rest[i - 1]
        if i < n - 1:
            k += 2.0 * abs(tension[i]) * tension_margin / rest[i]
        w2 = inv_mass[i] * k
        if w2 > worst:
            worst = w2
    return math.sqrt(worst)


def substeps_for(omega: float, tick: float, target: float, max_substeps: int) -> int:
    """Substeps so that h * omega <= target (dimensionless), capped at max_substeps."""
    if not math.isfinite(omega):
        return max_substeps
    return int(min(max(1, math.ceil(tick * omega / target)), max_substeps))
