"""Lagrange multipliers of the inextensibility constraints (Wang 2017 Sec. 5.2-5.3, App. D).

After the unconstrained prediction xbar (Eq. D.1), the constraint forces move vertex i by
    x_i^{k+1} = xbar_i + w_i (alpha_i e_i - alpha_{i-1} e_{i-1}),      e_j = x_{j+1}^k - x_j^k      (Eq. D.3)
where w_i is the (effective) inverse mass and alpha_j = h^2 T_j / |e_j| carries the tension T_j (N) of
segment j: Wang's alpha_i = -2 h lambda_i / m_i with the mass moved into w_i so that pinned, kinematic and
grasped vertices need no special case. The new edges are
    E_j = ebar_j + w_{j+1} alpha_{j+1} e_{j+1} - (w_j + w_{j+1}) alpha_j e_j + w_j alpha_{j-1} e_{j-1}   (Eq. D.4)
and the constraints G_j = |E_j|^2 - s_j^2 = 0 (Eq. 2, D.6), with s_j = l_j for an inextensible thread and
s_j = l_j (1 + T_j / EA) for an extensible one (a compliant constraint: the stretch is solved implicitly, so
a stiff EA costs no extra substeps). Writing E_j = ebar_j + (C alpha)_j with the tridiagonal C:
- contraction mapping (Eq. 10, D.8): (A + B(alpha_n)) alpha_{n+1} = R, with A_jk = 2 ebar_j . C_jk,
  B(alpha)_jk = (C alpha)_j . C_jk, R_j = s_j^2 - |ebar_j|^2, i.e. the matrix row is (E_j + ebar_j) . C_jk.
  (The extracted text of Eq. D.8 lost the factor 2 in A; it follows from expanding Eq. D.6.)
- Newton (Eq. 12-13): the Jacobian is A + 2 B(alpha_n) = 2 E_j . C_jk (minus the compliance term).
Both are tridiagonal and solved by the Thomas algorithm in O(N) per iteration.
"""
from __future__ import annotations


import numpy as np
from numba import njit

METHOD_CONTRACTION = 0
METHOD_NEWTON = 1


@njit(cache=True, error_model="numpy")
def thomas_solve(lo: np.ndarray, di: np.ndarray, up: np.ndarray, rhs: np.ndarray, cp: np.ndarray,
                 out: np.ndarray, m: int) -> None:
    """Solve the tridiagonal system (lo: sub-, di: main, up: super-diagonal) of size m into ``out``.
    ``cp`` is scratch. The constraint matrix is (weakly) diagonally dominant, so no pivoting is needed."""
    beta = di[0]
    cp[0] = up[0] / beta
    out[0] = rhs[0] / beta
    for j in range(1, m):
        beta = di[j] - lo[j] * cp[j - 1]
        cp[j] = up[j] / beta
        out[j] = (rhs[j] - lo[j] * out[j - 1]) / beta
    for j in range(m - 2, -1, -1):
        out[j] -= cp[j] * out[j + 1]


@njit(cache=True, error_model="numpy", inline="always")
def _matrix_row(j: int, m: int, px: float, py: float, pz: float, e: np.ndarray, wl: float, wr: float,
                dcomp: float) -> tuple:
    """(sub-, main, super-diagonal) of row j of the multipliers' tridiagonal matrix, p . C_jk with the row's
    vector p (2 E_j for Newton, E_j + ebar_j for the contraction mapping) and C of Eq. D.4, less the compliant
    target's dcomp on the diagonal."""
    d_j = -(wl + wr) * (px * e[j, 0] + py * e[j, 1] + pz * e[j, 2]) - dcomp
    l_j = wl * (px * e[j - 1, 0] + py * e[j - 1, 1] + pz * e[j - 1, 2]) if j > 0 else 0.0
    u_j = wr * (px * e[j + 1, 0] + py * e[j + 1, 1] + pz * e[j + 1, 2]) if j < m - 1 else 0.0
    return l_j, d_j, u_j


@njit(cache=True, error_model="numpy")
def inertial_tension(x: np.ndarray, x_prev: np.ndarray, inv_mass: np.ndarray, w: np.ndarray, e: np.ndarray,
                     elen: np.ndarray, E: np.ndarray, rest: np.ndarray, compliance: np.ndarray, alpha: np.ndarray,
                     h: float, lo: np.ndarray, di: np.ndarray, up: np.ndarray, rhs: np.ndarray, cp: np.ndarray,
                     out: np.ndarray, parted: np.ndarray) -> None:
    """The part of the solved tensions (N) that the vertices' velocities make, into ``out``: the change of the
    multipliers if the prediction's inertial term, (x - x_prev) as the couplings left it (w / inv_mass of it),
    were taken out. At a solution (E the new edges of ``alpha``) G_j = |E_j|^2 - s_j^2 = 0; moving the predicted
    edges by delta_j changes alpha by d with J d = -2 E_j . delta_j, J the Newton matrix of solve_multipliers
    (linear in delta: exact for small velocities, a first-order split otherwise). Under mass scaling this part
    grows with the added mass and the rest (loads, couplings, contact) does not (stability.scale_masses).
    Kinematic vertices (w = 0) count as driven, not inertial; a parted segment (``parted``, solver/breakage.py)
    carries nothing."""
    m = e.shape[0]
    inv_h2 = 1.0 / (h * h)
    for j in range(m):
        wl = w[j]
        wr = w[j + 1]
        if wl + wr == 0.0 or parted[j] != 0:
            lo[j] = 0.0
            di[j] = 1.0
            up[j] = 0.0
            rhs[j] = 0.0
            continue
        fl = wl / inv_mass[j] if inv_mass[j] > 0.0 else 0.0
        fr = wr / inv_mass[j + 1] if inv_mass[j + 1] > 0.0 else 0.0
        px = 2.0 * E[j, 0]
        py = 2.0 * E[j, 1]
        pz = 2.0 * E[j, 2]
        dv = 0.0
        for d in range(3):
            p = px if d == 0 else (py if d == 1 else pz)
            dv += p * (fr * (x[j + 1, d] - x_prev[j + 1, d]) - fl * (x[j, d] - x_prev[j, d]))
        s = rest[j] * (1.0 + compliance[j] * alpha[j] * elen[j] * inv_h2)
        dcomp = 2.0 * s * rest[j] * compliance[j] * elen[j] * inv_h2
        lo[j], di[j], up[j] = _matrix_row(j, m, px, py, pz, e, wl, wr, dcomp)
        rhs[j] = -dv
    thomas_solve(lo, di, up, rhs, cp, out, m)
    for j in range(m):
        out[j] *= elen[j] * inv_h2


@njit(cache=True, error_model="numpy")
def _new_edges(xbar: np.ndarray, e: np.ndarray, w: np.ndarray, alpha: np.ndarray, E: np.ndarray) -> None:
    # Eq. D.4 with per-vertex inverse masses
    m = e.shape[0]
    for j in range(m):
        wl = w[j]
        wr = w[j + 1]
        for d in range(3):
            v = xbar[j + 1, d] - xbar[j, d] - (wl + wr) * alpha[j] * e[j, d]
            if j > 0:
                v += wl * alpha[j - 1] * e[j - 1, d]
            if j < m - 1:
                v += wr * alpha[j + 1] * e[j + 1, d]
            E[j, d] = v


@njit(cache=True, error_model="numpy")
def solve_multipliers(xbar: np.ndarray, e: np.ndarray, elen: np.ndarray, w: np.ndarray, rest: np.ndarray,
                      compliance: np.ndarray, h: float, method: int, tol: float, max_iters: int,
                      alpha: np.ndarray, E: np.ndarray, di: np.ndarray, rhs: np.ndarray, cp: np.ndarray,
                      parted: np.ndarray) -> tuple:
    """Solve for ``alpha`` (warm start: its value on entry) so that the new edges E have their rest lengths.

    xbar (n,3) predicted positions (m); e (n-1,3) edges at x^k (m), elen their lengths (m); w (n,) effective
    inverse masses (1/kg, 0 = kinematic); rest (n-1,) rest lengths (m); compliance (n-1,) 1/EA (1/N, 0 =
    inextensible); h the step (s). On return ``E`` holds the new edges for the returned alpha.
    Returns (iterations, residual): each iteration is one tridiagonal solve, residual = max_j |G_j| / l_j^2.
    Segments whose both vertices are kinematic carry no constraint, nor does a parted one (``parted`` (n-1,)
    int8, solver/breakage.py): the caller sets their alpha to 0.

    Each iteration is two sweeps: the first computes E_j, G_j and row j of the matrix and eliminates forward
    (Thomas), the second substitutes back and updates alpha. ``di``, ``rhs`` and ``cp`` (n-1,) are scratch: the
    eliminated pivots, right side and upper diagonal.
    """
    m = e.shape[0]
    inv_h2 = 1.0 / (h * h)
    newton = method == METHOD_NEWTON
    iters = 0
    residual = 0.0
    while True:
        residual = 0.0
        for j in range(m):
            wl = w[j]
            wr = w[j + 1]
            # Eq. D.4: the new edge for the current alpha
            c0 = (wl + wr) * alpha[j]
            ex = xbar[j + 1, 0] - xbar[j, 0]
            ey = xbar[j + 1, 1] - xbar[j, 1]
            ez = xbar[j + 1, 2] - xbar[j, 2]
            Ex = ex - c0 * e[j, 0]
            Ey = ey - c0 * e[j, 1]
            Ez = ez - c0 * e[j, 2]
            if j > 0:
                c1 = wl * alpha[j - 1]
                Ex += c1 * e[j - 1, 0]
                Ey += c1 * e[j - 1, 1]
                Ez += c1 * e[j - 1, 2]
            if j < m - 1:
                c2 = wr * alpha[j + 1]
                Ex += c2 * e[j + 1, 0]
                Ey += c2 * e[j + 1, 1]
                Ez += c2 * e[j + 1, 2]
            E[j, 0] = Ex
            E[j, 1] = Ey
            E[j, 2] = Ez
            if wl + wr == 0.0 or parted[j] != 0:
                l_j = 0.0
                d_j = 1.0
                u_j = 0.0
                r_j = 0.0
            else:
                s = rest[j] * (1.0 + compliance[j] * alpha[j] * elen[j] * inv_h2)
                g = Ex * Ex + Ey * Ey + Ez * Ez - s * s
                r = abs(g) / (rest[j] * rest[j])
                if r > residual or r != r:
                    residual = r
                if newton:
                    # row of the Jacobian 2 E_j . C_jk; the compliant target adds -d(s^2)/d alpha_j
                    px = 2.0 * Ex
                    py = 2.0 * Ey
                    pz = 2.0 * Ez
                    r_j = -g
                    dcomp = 2.0 * s * rest[j] * compliance[j] * elen[j] * inv_h2
                else:
                    # row of A + B(alpha_n): (E_j + ebar_j) . C_jk, right side s^2 - |ebar_j|^2; the compliant
                    # target s(alpha)^2 is linearised about alpha_n (lagging it diverges for soft EA at small h)
                    px = Ex + ex
                    py = Ey + ey
                    pz = Ez + ez
                    dcomp = 2.0 * s * rest[j] * compliance[j] * elen[j] * inv_h2
                    r_j = s * s - dcomp * alpha[j] - (ex * ex + ey * ey + ez * ez)
                l_j, d_j, u_j = _matrix_row(j, m, px, py, pz, e, wl, wr, dcomp)
            # forward elimination of the Thomas algorithm, fused with building the row
            if j > 0:
                d_j -= l_j * cp[j - 1]
                r_j -= l_j * rhs[j - 1]
            cp[j] = u_j / d_j
            rhs[j] = r_j / d_j
        if residual <= tol or iters >= max_iters or residual != residual or residual > 1e300:
            break
        # back substitution; Newton solves for the change of alpha, the contraction mapping for alpha itself
        nxt = rhs[m - 1]
        if newton:
            alpha[m - 1] += nxt
            for j in range(m - 2, -1, -1):
                nxt = rhs[j] - cp[j] * nxt
                alpha[j] += nxt
        else:
            alpha[m - 1] = nxt
            for j in range(m - 2, -1, -1):
                nxt = rhs[j] - cp[j] * nxt
                alpha[j] = nxt
        iters += 1
    return iters, residual
