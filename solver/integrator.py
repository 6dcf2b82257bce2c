"""The explicit discrete variational integrator with exact inextensibility (Wang 2017 Eq. 7, 9; App. B, D).

One substep of length h is a sequence of stage kernels (`substep`), each over grouped views of the model and
state (Rod, Timeline, Settings, Body, Grasps, Work, Contact, Tissue, Needle, Tools; built by `advance_state`):
  1. drive: the timeline moves kinematic vertices, grasp targets and the input twist over [t, t+h]; live grasp
     targets follow their ramp; the pads move; the needle turns; the tools' capsules move;
  2. add_forces: forces at x^k (solver/forces.py), the twist's, self-contact's penalty;
  3. predict: xbar = 2 x^k - x^{k-1} + h^2 M^-1 F (Eq. 9 without the constraint term, Eq. D.1);
  4. couple_grasps: a grasped vertex takes its virtual-coupling spring-damper implicitly (backward Euler on the
     spring), which only changes its xbar and its effective inverse mass, so any coupling stiffness is stable;
     a grasp on a point inside a segment does the same to the segment's two vertices;
  5. solve: multipliers (solver/constraints.py) and x^{k+1} = xbar + constraint displacement (Eq. D.3);
  6. contact_rounds, tool_rounds and 7. tissue_rounds: the no-crossing floor, friction, the tools' jaws and
     shafts, the pads and the needle, each followed by the constraints again;
  8. commit: tensions T_j = alpha_j |e_j| / h^2 (N; Eq. 8), the accumulated twist (Eq. C.5 written as the
     change of the twist along the actual displacement, so that twist force and twist energy stay consistent),
     and the force each grasp applies to the thread.

`advance` runs n substeps in one call (one dispatch per tick); `tick` picks n from the stability bound.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from .breakage import BK_PARTED, find_break, part
from .constraints import inertial_tension, solve_multipliers
from .contact_response import (CS_CONTACTS, CS_COUNT, CS_PENETRATION, CS_PROJECTIONS, CS_REBUILDS,
                               CS_REVERTED, CS_ROUNDS, CS_ROUNDS_OUT, CS_ROUNDS_RAISED, CS_ROUNDS_SLID, CS_SKIN,
                               CS_STICKING, CP_MIN_GAP, CP_ROUNDS, CP_SETTLE, CP_SKIN, CP_STALL, CP_WARM,
                               FLOOR_MARGIN, apply_friction, enforce_min_gap, floor_pairs, floor_reach,
                               guard_crossings, keep_friction, largest_step, neighbours_stale, penalty_forces,
                               rebuild_neighbours, warm_friction)
from .forces import accumulate_forces, edge_vectors
from .model import (BUF_CARRIED_B, BUF_CARRIED_F, BUF_CARRIED_I, STAT_SLOTS, STATE_FIELDS, ThreadModel, ThreadState,
                    TickCopy)
from .motion import apply_motions
from .timers import (N_TIMERS, TM_COMMIT, TM_CONTACT, TM_DRIVE, TM_FORCES, TM_MASSES, TM_NEIGHBOURS, TM_PREDICT,
                     TM_SOLVE, TM_TISSUE, TM_TOOLS, cycles)
from .stability import omega_bound, scale_masses, substeps_for
from .instruments import SH_COUNT, TC_IMPULSE, TC_PUSHES, move_tools, place_capsules, tool_contact
from .needle import (NP_WIRE, needle_constraints, needle_finish, needle_forces_clear, needle_held, needle_pierce,
                     needle_thread, needle_turn)
from .tissue import (PF_SIGMA, PI_STATE, PUN_ACTIVE, TP_EDGE_MU, TP_RADIUS, TP_ROUNDS, collide_pads, locate_punctures,
                     puncture_forces, puncture_load, puncture_predict, step_pads)

# state.stats slots
STAT_ITERS = 0          # multiplier iterations of the last substep
STAT_RESIDUAL = 1       # max |psi_j|/l_j^2 after the last substep
STAT_SUBSTEPS = 2       # substeps in the last tick
STAT_MAX_ITERS = 3      # most iterations any substep of the last tick needed
STAT_MAX_RESIDUAL = 4   # largest residual of any substep of the last tick
STAT_TOTAL_ITERS = 5    # iterations summed over the last tick
STAT_OMEGA = 6          # stability bound (rad/s) used for the last tick
STAT_SCALED = 7         # vertices whose mass was scaled in the last tick
STAT_MASS_FACTOR = 8    # largest mass scale factor of the last tick (1 = none)
STAT_OMEGA_END = 9      # stability bound (rad/s) at the masses, tensions and acting contact springs the last
                        # tick ended with (Stepper's check that h * omega < 2 held)
# the tissue's rounds (tissue_rounds) in the last tick, and which of its pushes kept them going
STAT_TISSUE_ROUNDS = 10   # rounds run
STAT_TISSUE_PADS = 11     # of them, rounds in which a vertex was put back out of a pad
STAT_TISSUE_NEEDLE = 12   # of them, rounds in which the needle was held by the tissue or the pads
STAT_TISSUE_THREAD = 13   # of them, rounds in which the thread was kept off its needle
STAT_TISSUE_OUT = 14      # substeps whose rounds ran out with a push still made
STAT_TIMERS = STAT_SLOTS  # from here, N_TIMERS slots: the last tick's cycles in each stage (solver/timers.py)
# a substep's residual above this (or NaN) is a divergence, not a solve short of converging: the tick is run again
# (Stepper) or, out of retries, faults; so its remaining substeps are not run (a diverging solve takes every
# substep to its iteration limit, and a tick's retries run up to retry_substeps: it would hold the loop for seconds)
DIVERGED_RESIDUAL = 1e-3


# the tissue's rounds of a substep in which the needle is kept off its own thread (needle.needle_thread). A needle
# held in a jaw with its taut strand pressed on it (an instrument tie's wind) never settles: each push moves the
# light needle and each solve draws the strand after it, so every round of every substep ran, and those substeps
# were the run's slowest steps (docs/PHYSICS.md Sec. 9). What the rounds leave, the next substep's pushes take up,
# each measured from that substep's start on the side the strand came from
NEEDLE_THREAD_ROUNDS = 2


PAD_CRACK = 3.0      # thread radii left between two pads that meet: the thread that crosses between them
TOOL_ROUNDS = 3     # rounds of the tool contact per substep at most (a wrap round a jaw settles in two or three)
FRICTION_H = 2.5e-4  # s: the substep the tolerance and the contact rounds are set for (4 substeps of a 1 ms tick)


@njit(cache=True, error_model="numpy", inline="always")
def friction_rounds(rounds: int, min_gap: float, settle: float, h: float) -> tuple:
    """The rounds of floor, friction and constraint solve a substep of ``h`` seconds may take, and the change
    (m) of a contact point under which friction has settled, for the scenario's ``contact.rounds``,
    ``min_gap`` (m) and ``settle`` (a fraction of min_gap). At h >= FRICTION_H, those as given.

    Below it both follow the substep: the slip friction answers in a substep, and what a round leaves of it,
    scale as h^2 (forces times h^2), while what is left at the end of a substep becomes a velocity, its size
    over h. A fixed tolerance let the rounds stop after the first at short substeps (the whole slip of a held
    knot was under it at 64 substeps), and the solve's slide or friction's push left behind set a tied knot
    jittering at 6 mm/s and creeping open by 18 mm in 17 s; at 4 substeps it crept 0.2 mm in 57 s. So the
    tolerance shrinks as h^2, and the rounds grow as sqrt(FRICTION_H / h): the alternation of friction and
    solve converges more slowly at short substeps, and a substep that runs out of rounds ends on a solve,
    whose slide is slip no friction answers (6 rounds at 16 substeps ran out in 15.9 substeps of 16 and the
    knot slid 25 mm in 7 s; 12 held it; docs/PHYSICS.md Sec. 7)."""
    tol = settle * min_gap
    if h >= FRICTION_H * (1.0 - 1e-9):   # a 1 ms tick in 4 substeps exactly as before
        return rounds, tol
    r = FRICTION_H / h
    return int(math.ceil(rounds * math.sqrt(r))), tol / (r * r)


@njit(cache=True, error_model="numpy")
def constraint_displace(xbar: np.ndarray, w_eff: np.ndarray, alpha: np.ndarray, edges: np.ndarray) -> None:
    """xbar += the constraint displacement W (alpha_j e_j - alpha_{j-1} e_{j-1}) (m; Wang 2017 Eq. D.3)."""
    m = edges.shape[0]
    for i in range(xbar.shape[0]):
        for d in range(3):
            xn = xbar[i, d]
            if i < m:
                xn += w_eff[i] * alpha[i] * edges[i, d]
            if i > 0:
                xn -= w_eff[i] * alpha[i - 1] * edges[i - 1, d]
            xbar[i, d] = xn


@njit(cache=True, error_model="numpy")
def solve_again(xbar, edges, elen, w_eff, rest, compliance, h, method, tol, max_iters, alpha, alpha_extra,
                new_edges, again_len, again_compliance, di, rhs, cp, parted):
    """Solve the constraints again after xbar was moved (a floor, a pad), add the displacement to xbar and
    the extra multipliers to alpha. Returns (iterations, residual). ``again_len`` and ``again_compliance``
    (m,) receive the extra solve's target lengths (m) and compliances (1/N); ``di``, ``rhs`` and ``cp`` (m,)
    are the tridiagonal solve's scratch; ``parted`` (m,) the segments that broke (solver/breakage.py)."""
    # An extensible segment's target length follows its whole tension, alpha + alpha_extra, but
    # solve_multipliers reads only the multiplier it solves for: solved from zero, the extra solve pulled each
    # stretched segment back to its rest length and doubled its tension (the Choi rod's end force read twice
    # its value in the ticks where this ran). So the extra solve gets the length the present alpha stretches to
    # and the compliance that keeps the same target (Wang 2017 Eq. D.4 with s_j = l_j (1 + T_j / EA)):
    #   l (1 + c (a + a') e / h^2) = l_a (1 + c' a' e / h^2),  l_a = l (1 + c a e / h^2),  c' = c l / l_a.
    # Inextensible (c = 0): l_a = l and c' = 0 exactly.
    inv_h2 = 1.0 / (h * h)
    for j in range(alpha.shape[0]):
        alpha_extra[j] = 0.0
        l_a = rest[j] * (1.0 + compliance[j] * alpha[j] * elen[j] * inv_h2)
        again_len[j] = l_a
        again_compliance[j] = compliance[j] * rest[j] / l_a if l_a > 0.0 else compliance[j]
    it, residual = solve_multipliers(xbar, edges, elen, w_eff, again_len, again_compliance, h, method, tol,
                                     max_iters, alpha_extra, new_edges, di, rhs, cp, parted)
    constraint_displace(xbar, w_eff, alpha_extra, edges)
    for j in range(alpha.shape[0]):
        alpha[j] += alpha_extra[j]
    return it, residual


# ---- the step's grouped views -------------------------------------------------------------------------------
# A stage reads and writes whole groups; advance_state builds them once per call as views of the model's arrays
# and the state's packed buffers (ThreadState.packed). A field added to ThreadState reaches the stages by being
# added to its group here and in advance_state.

class Rod(NamedTuple):
    """The thread as the step reads it (ThreadModel): fixed during a run."""
    rest: np.ndarray            # (m,) m, rest lengths
    mass: np.ndarray            # (n,) kg
    base_inv_mass: np.ndarray   # (n,) 1/kg, unscaled; 0 for kinematic vertices
    kinematic: np.ndarray       # (n,) int8, 1 = position prescribed
    hinge_k: np.ndarray         # (n,) J
    k_d: float                  # J*s, bending dissipation
    drag_quad: np.ndarray       # (n,) N*s^2/m^2
    drag_lin: np.ndarray        # (n,) N*s/m
    compliance: np.ndarray      # (m,) 1/N
    gravity: np.ndarray         # (3,) m/s^2
    twist_k: float              # N*m
    bend_gersh: np.ndarray      # (n,) N/m


class Timeline(NamedTuple):
    """The scripted motions (solver/motion.py): kind, index, start and end (s), velocity (m/s or rad/s)."""
    kind: np.ndarray
    index: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    vel: np.ndarray


class Settings(NamedTuple):
    """How the step solves (SolverSettings)."""
    method: int                 # 1 Newton, 0 contraction
    tol: float                  # max |psi_j| / l_j^2
    max_iters: int
    target: float               # h * omega the mass scaling aims for
    keep_energy: bool           # a scaled vertex keeps its kinetic energy (else its velocity)
    local: bool                 # local mass scaling (else whole-thread)


class Body(NamedTuple):
    """The thread's carried state: what a substep starts from and ends with."""
    x: np.ndarray               # (n,3) m
    x_prev: np.ndarray          # (n,3) m, one substep earlier
    inv_mass: np.ndarray        # (n,) 1/kg, this tick's (mass-scaled where needed)
    tension: np.ndarray         # (m,) N
    tension_in: np.ndarray      # (m,) N, the part the velocities make
    tension_floor: np.ndarray   # (m,) N, the least tension the mass scaling counts
    twist: np.ndarray           # (2,) rad
    kin_target: np.ndarray      # (n,3) m
    ext_force: np.ndarray       # (n,3) N
    stats: np.ndarray           # (10,) STAT_*
    parted: np.ndarray          # (m,) int8, 1 = the segment broke (solver/breakage.py)
    breakage: np.ndarray        # (breakage.BK_COUNT,) int64


class Grasps(NamedTuple):
    """The virtual couplings of styluses (or scripted hands) to points of the thread, one row each."""
    vertex: np.ndarray          # (G,) int64, -1 = free
    frac: np.ndarray            # (G,) the point (1 - f) x[v] + f x[v+1] is held, 0 <= f < 1 (0: the vertex)
    pad: np.ndarray             # (G,) int64, the tissue pad held (vertex -1), -1 = none: tissue.step_pads
    k: np.ndarray               # (G,) N/m
    c: np.ndarray               # (G,) N*s/m
    fmax: np.ndarray            # (G,) N
    target: np.ndarray          # (G,3) m, now
    target_prev: np.ndarray     # (G,3) m, one substep earlier
    vel: np.ndarray             # (G,3) m/s, a live device's ramp across the tick
    force: np.ndarray           # (G,3) N, on the thread
    sat: np.ndarray             # (G,) int8, 1 while at fmax


class Work(NamedTuple):
    """A substep's scratch, one buffer per purpose (written before read within a substep)."""
    force: np.ndarray           # (n,3) N
    twist_grad: np.ndarray      # (n,3) rad/m, dTheta/dx (its last value is read by the next substep)
    xbar: np.ndarray            # (n,3) m, the prediction, then the new positions
    w_eff: np.ndarray           # (n,) 1/kg, inverse masses with the couplings folded in
    edges: np.ndarray           # (m,3) m
    elen: np.ndarray            # (m,) m
    new_edges: np.ndarray       # (m,3) m
    alpha: np.ndarray           # (m,) multipliers
    alpha_extra: np.ndarray     # (m,) multipliers of a solve again
    tri_lo: np.ndarray          # (m,) the tridiagonal solves' rows and right-hand side
    tri_di: np.ndarray
    tri_up: np.ndarray
    tri_rhs: np.ndarray
    tri_cp: np.ndarray
    again_len: np.ndarray       # (m,) m, a solve again's target lengths (solve_again)
    again_compliance: np.ndarray  # (m,) 1/N, and compliances
    closest: np.ndarray         # (3,) closest points of two segments (contact.segment_closest)
    fold: np.ndarray            # (n,) each hinge's stiffening factor (stability.hinge_factors)


class Contact(NamedTuple):
    """Self-contact (solver/contact_response.py): settings, the neighbour list and its rebuild's scratch."""
    on: bool
    par: np.ndarray             # contact_response.CP_*
    exclude: int
    cand_i: np.ndarray          # (P,) the neighbour list, as ThreadState describes it
    cand_j: np.ndarray
    cand_s: np.ndarray
    cand_t: np.ndarray
    cand_d: np.ndarray
    cand_n: np.ndarray
    cand_f: np.ndarray
    cand_fp: np.ndarray
    cand_fa: np.ndarray
    cand_ff: np.ndarray
    cand_near: np.ndarray       # (P,) the pairs the floor visits this round
    fp_kept: np.ndarray         # (P,) N, the floor forces at the rounds' start (a substep the guard undid gets them)
    x_ref: np.ndarray           # (n,3) m, where the list was built
    k: np.ndarray               # (n,) N/m, springs that may act this tick
    k_act: np.ndarray           # (n,) N/m, springs that acted in the last substep
    turn: np.ndarray            # (n,) rad
    stats: np.ndarray           # (CS_SIZE,) CS_*
    grid_head: np.ndarray       # a rebuild's scratch (contact_response.rebuild_neighbours)
    grid_next: np.ndarray
    grid_cells: np.ndarray
    grid_scratch: np.ndarray
    old_j: np.ndarray
    old_n: np.ndarray
    old_fp: np.ndarray
    old_ff: np.ndarray
    old_next: np.ndarray
    seg_head: np.ndarray


class Tissue(NamedTuple):
    """Tissue pads and punctures (solver/tissue.py)."""
    on: bool
    par: np.ndarray             # tissue.TP_*
    pads: np.ndarray            # (P, tissue.PD_COUNT)
    pst: np.ndarray             # (P, tissue.PS_COUNT)
    pun_i: np.ndarray           # (MAX_PUNCTURES, tissue.PI_COUNT) int64
    pun_f: np.ndarray           # (MAX_PUNCTURES, tissue.PF_COUNT)


class Needle(NamedTuple):
    """A needle swaged to vertex 0 (solver/needle.py)."""
    on: bool
    par: np.ndarray             # needle.NP_*
    nst: np.ndarray             # needle.NS_*


class Tools(NamedTuple):
    """The instruments' jaws and shafts (solver/instruments.py)."""
    caps: np.ndarray            # (instruments.MAX_CAPSULES, instruments.TC_COUNT)
    rounds: int                 # rounds of (tool contact, constraints again) per substep at most


# ---- the stages of a substep, in the order substep runs them --------------------------------------------------
# advance and the stages are compiled without numba's reference counting (_nrt=False): they allocate nothing
# and only borrow the arrays advance_state holds for the whole call. With it, every call of a stage and every
# read of a group's member counted references to the arrays with atomic operations, which cost a 100-segment
# substep about 4 us of its 8 (`suturesim bench solver`, `bench suture`); numba's refcount pruning removes such
# pairs only within a basic block.

@njit(cache=True, error_model="numpy", _nrt=False)
def drive(h: float, t: float, rod: Rod, tl: Timeline, body: Body, gr: Grasps, ts: Tissue, nd: Needle,
          tools: Tools) -> tuple:
    """Stage 1: move what is driven over [t, t+h] (s): live grasp targets along their ramp, the timeline's
    motions, the tissue pads, the needle's turn, the tools. Returns (whether a grasp holds the needle, how many
    tool capsules there are)."""
    target = gr.target
    target_prev = gr.target_prev
    vel = gr.vel
    for g in range(gr.vertex.shape[0]):
        for d in range(3):
            target_prev[g, d] = target[g, d]
            target[g, d] += vel[g, d] * h  # a live device's pose, ramped across the tick
    apply_motions(t, h, tl.kind, tl.index, tl.t0, tl.t1, tl.vel, body.kin_target, target, body.twist, nd.nst,
                  gr.k, gr.c, gr.fmax)
    if ts.on:
        step_pads(h, ts.pads, ts.pst, PAD_CRACK * ts.par[TP_RADIUS], ts.par[TP_EDGE_MU], gr.pad, gr.target,
                  gr.target_prev, gr.k, gr.c, gr.fmax, gr.force, gr.sat)
    held = False
    if nd.on:
        held = needle_held(gr.vertex, gr.k)
        needle_turn(h, nd.par, nd.nst, body.x, held, rod.gravity)
    return held, move_tools(h, tools.caps)


@njit(cache=True, error_model="numpy", _nrt=False)
def add_forces(h: float, n_cand: int, rod: Rod, body: Body, wk: Work, ct: Contact) -> None:
    """Stage 2: the forces at x^k (N) into ``wk.force``: bending, dissipation, drag, gravity, external, twist
    (solver/forces.py) and, with contact on, the penalty of the first ``n_cand`` listed pairs."""
    x = body.x
    x_prev = body.x_prev
    twist_grad = wk.twist_grad
    force = wk.force
    n = x.shape[0]
    # a thread in pieces has free ends at its breaks: no end-to-end twist (solver/breakage.py)
    twist_k = rod.twist_k if body.breakage[BK_PARTED] == 0 else 0.0
    # the twist gradient of the previous substep, along the displacement it was applied to
    g_prev = 0.0
    if twist_k != 0.0:
        for i in range(n):
            for d in range(3):
                g_prev += twist_grad[i, d] * (x[i, d] - x_prev[i, d])
    edge_vectors(x, wk.edges, wk.elen)
    accumulate_forces(x, x_prev, wk.edges, wk.elen, h, rod.mass, body.inv_mass, rod.hinge_k, rod.k_d,
                      rod.drag_quad, rod.drag_lin, rod.gravity, body.ext_force, twist_k, force, twist_grad,
                      body.parted)
    if twist_k != 0.0:
        # Theta advanced over the last substep with the gradient at its start; now that the gradient at its end
        # is known, complete the trapezoidal rule 1/2 (g^k + g^{k+1}) . (x^{k+1} - x^k): the twist energy then
        # stays bounded instead of drifting at first order in h (docs/PHYSICS.md Sec. 2)
        g_new = 0.0
        for i in range(n):
            for d in range(3):
                g_new += twist_grad[i, d] * (x[i, d] - x_prev[i, d])
        body.twist[0] += 0.5 * (g_new - g_prev)
        # uniform twist (Wang 2017 Eq. 3, App. C): E_t = twist_k theta^2 / 2, F = -twist_k theta dTheta/dx
        ft = -twist_k * body.twist[0]
        for i in range(n):
            for d in range(3):
                force[i, d] += ft * twist_grad[i, d]
    if ct.on:
        touching, pen = penalty_forces(x, x_prev, ct.par, n_cand, ct.cand_i, ct.cand_j, ct.cand_s, ct.cand_t,
                                       ct.cand_d, ct.cand_n, ct.cand_f, ct.cand_fp, wk.closest,
                                       force, ct.k, ct.k_act, ct.turn)
        if touching > ct.stats[CS_CONTACTS]:
            ct.stats[CS_CONTACTS] = touching
        if pen > ct.stats[CS_PENETRATION]:
            ct.stats[CS_PENETRATION] = pen


@njit(cache=True, error_model="numpy", _nrt=False)
def predict(h: float, rod: Rod, body: Body, wk: Work, ts: Tissue, nd: Needle) -> None:
    """Stage 3: the unconstrained prediction into ``wk.xbar`` (m) and the inverse masses into ``wk.w_eff``;
    kinematic vertices at their targets with w = 0; the punctures' drag (tissue.puncture_predict)."""
    x = body.x
    x_prev = body.x_prev
    xbar = wk.xbar
    w_eff = wk.w_eff
    force = wk.force
    inv_mass = body.inv_mass
    kinematic = rod.kinematic
    kin_target = body.kin_target
    h2 = h * h
    # Eq. D.1 in displacement form, x + (x - x_prev) + h^2 F / m, which rounds at the size of the step rather
    # than of the position: the discrete momentum then stays at round-off over 10^6 steps
    for i in range(x.shape[0]):
        if kinematic[i] == 1:
            for d in range(3):
                xbar[i, d] = kin_target[i, d]
            w_eff[i] = 0.0
        else:
            for d in range(3):
                xbar[i, d] = x[i, d] + ((x[i, d] - x_prev[i, d]) + h2 * force[i, d] * inv_mass[i])
            w_eff[i] = inv_mass[i]
    if ts.on:
        puncture_predict(h, x, xbar, w_eff, ts.par, ts.pst, ts.pun_i, ts.pun_f, 1 if nd.on else 0)


@njit(cache=True, error_model="numpy", inline="always")
def _coupling_force(k: float, c: float, p: np.ndarray, p0: np.ndarray, x: np.ndarray, x_prev: np.ndarray, g: int,
                    v: int, d: int, h: float) -> float:
    """Component d (N) of grasp g's spring-damper pull on vertex v: stiffness k (N/m) toward the target p (m),
    damping c (N*s/m) on the target's move p - p0 against the vertex's x - x_prev over the substep h (s)."""
    return k * (p[g, d] - x[v, d]) + c * ((p[g, d] - p0[g, d]) - (x[v, d] - x_prev[v, d])) / h


@njit(cache=True, error_model="numpy", inline="always")
def _point_force(k: float, c: float, p: np.ndarray, p0: np.ndarray, x: np.ndarray, x_prev: np.ndarray, g: int,
                 v: int, f: float, d: int, h: float) -> float:
    """Component d (N) of grasp g's spring-damper pull on the point (1 - f) x[v] + f x[v+1] of segment v:
    _coupling_force with that point, and its move from x_prev to x over the substep h (s), for the vertex's."""
    a = 1.0 - f
    pt = a * x[v, d] + f * x[v + 1, d]
    pt0 = a * x_prev[v, d] + f * x_prev[v + 1, d]
    return k * (p[g, d] - pt) + c * ((p[g, d] - p0[g, d]) - (pt - pt0)) / h


@njit(cache=True, error_model="numpy")
def couple_point(h: float, g: int, v: int, f: float, x: np.ndarray, x_prev: np.ndarray, xbar: np.ndarray,
                 w_eff: np.ndarray, gr: Grasps) -> None:
    """Grasp g's coupling (N/m, N*s/m) to the point c = (1 - f) x[v] + f x[v+1] inside segment v (0 < f < 1),
    folded into the predictions xbar (m) and inverse masses w_eff (1/kg) of vertices v and v+1: a force F on
    the point acts as (1 - f) F on v and f F on v+1. Past the force limit, a constant pull of fmax (N).

    A kinematic vertex (w_eff = 0) takes no share of the motion: the formulas below then put the coupling on
    the free vertex alone with the weight f (or 1 - f) the point has on it, which is the lumped rigid segment's
    answer (a pull at the fraction f of a segment pinned at v turns it as f F at v+1 would); its own share of
    F goes into whatever drives it. Both kinematic: couple_grasps skips the grasp."""
    k = gr.k[g]
    c = gr.c[g]
    p = gr.target
    p0 = gr.target_prev
    force = gr.force
    h2 = h * h
    a = 1.0 - f
    wa = w_eff[v]
    wb = w_eff[v + 1]
    # the spring-damper force if the point did not move this substep: decides whether the coupling saturates
    fx = _point_force(k, c, p, p0, x, x_prev, g, v, f, 0, h)
    fy = _point_force(k, c, p, p0, x, x_prev, g, v, f, 1, h)
    fz = _point_force(k, c, p, p0, x, x_prev, g, v, f, 2, h)
    fmag = math.sqrt(fx * fx + fy * fy + fz * fz)
    if fmag > gr.fmax[g]:
        # saturated: a constant pull of fmax toward the target, split (1 - f) : f onto the segment's vertices
        sc = gr.fmax[g] / fmag
        force[g, 0] = fx * sc
        force[g, 1] = fy * sc
        force[g, 2] = fz * sc
        for d in range(3):
            xbar[v, d] += h2 * a * force[g, d] * wa
            xbar[v + 1, d] += h2 * f * force[g, d] * wb
        gr.sat[g] = 1
        return
    # backward Euler on the point: x1_v = xbar_v + h^2 w_v (1 - f) F, x1_{v+1} = xbar_{v+1} + h^2 w_{v+1} f F
    # with F = k (p1 - c1) + c ((p1 - p0) - (c1 - c0)) / h = G - K c1, G = k p1 + c (p1 - p0 + c0) / h,
    # K = k + c / h, and c1 = cbar + h^2 W F, W = (1 - f)^2 w_v + f^2 w_{v+1}; so F = (G - K cbar) / (1 + K h^2 W).
    # At f = 0 this is the vertex's formula in couple_grasps, rearranged (m_eff = m (1 + K h^2 w)).
    kk = k + c / h
    den = 1.0 + kk * h2 * (a * a * wa + f * f * wb)
    for d in range(3):
        cbar = a * xbar[v, d] + f * xbar[v + 1, d]
        g_d = k * p[g, d] + c * (p[g, d] - p0[g, d] + (a * x[v, d] + f * x[v + 1, d])) / h
        fd = (g_d - kk * cbar) / den
        xbar[v, d] += h2 * wa * a * fd
        xbar[v + 1, d] += h2 * wb * f * fd
    # The constraint solve sees each vertex heavier by its share of the coupling, m + (1 - f)(h^2 k + h c) and
    # m + f (h^2 k + h c): the row sums of the coupling's stiffness on the two vertices, h^2 K J^T J with
    # J = [(1 - f), f] (the punctures' two-vertex couplings grow their masses alike, tissue.puncture_predict).
    # They dominate J^T J, so any k and c stay stable; a force inside the segment (its tension, equal and
    # opposite on v and v+1) then moves the point by (1 - f) w_v - f w_{v+1} times it, 0 as k grows; and the
    # momentum the two vertices gain over the substep is h times the spring-damper force at the point where the
    # solve leaves it, the force commit reports (the constraint's share telescopes away).
    grow = h2 * k + h * c
    if wa > 0.0:
        w_eff[v] = 1.0 / (1.0 / wa + a * grow)
    if wb > 0.0:
        w_eff[v + 1] = 1.0 / (1.0 / wb + f * grow)
    gr.sat[g] = 0


@njit(cache=True, error_model="numpy", _nrt=False)
def couple_grasps(h: float, rod: Rod, body: Body, gr: Grasps, wk: Work) -> None:
    """Stage 4: each grasp's virtual coupling (a spring-damper to its target, N/m and N*s/m) folded into its
    vertex's prediction and effective inverse mass; a coupling past its force limit pulls with the limit. A
    grasp on a point inside a segment (grasp frac > 0) couples the segment's two vertices (couple_point)."""
    x = body.x
    x_prev = body.x_prev
    xbar = wk.xbar
    w_eff = wk.w_eff
    kinematic = rod.kinematic
    vertex = gr.vertex
    p = gr.target
    p0 = gr.target_prev
    force = gr.force
    h2 = h * h
    for g in range(vertex.shape[0]):
        v = vertex[g]
        if v < 0:
            continue
        f = gr.frac[g]
        if f != 0.0:
            if v + 1 < x.shape[0] and (kinematic[v] == 0 or kinematic[v + 1] == 0):
                couple_point(h, g, v, f, x, x_prev, xbar, w_eff, gr)
            continue
        if kinematic[v] == 1:
            continue
        k = gr.k[g]
        c = gr.c[g]
        # spring-damper force if the vertex did not move this substep: decides whether the coupling saturates
        fx = _coupling_force(k, c, p, p0, x, x_prev, g, v, 0, h)
        fy = _coupling_force(k, c, p, p0, x, x_prev, g, v, 1, h)
        fz = _coupling_force(k, c, p, p0, x, x_prev, g, v, 2, h)
        fmag = math.sqrt(fx * fx + fy * fy + fz * fz)
        if fmag > gr.fmax[g]:
            # saturated: a constant pull of fmax toward the target (explicit, no stiffness left to destabilise)
            sc = gr.fmax[g] / fmag
            force[g, 0] = fx * sc
            force[g, 1] = fy * sc
            force[g, 2] = fz * sc
            for d in range(3):
                xbar[v, d] += h2 * force[g, d] * w_eff[v]
            gr.sat[g] = 1
        else:
            # backward Euler on the coupling: m (x1 - xbar)/h^2 = k (p1 - x1) + c ((p1 - p0) - (x1 - x))/h,
            # solved for x1; it only shrinks the vertex's effective inverse mass, so any stiffness is stable
            m_v = 1.0 / w_eff[v]
            m_eff = m_v + h2 * k + h * c
            for d in range(3):
                xbar[v, d] = (m_v * xbar[v, d] + h2 * k * p[g, d] + h * c * (p[g, d] - p0[g, d] + x[v, d])) / m_eff
            w_eff[v] = 1.0 / m_eff
            gr.sat[g] = 0


@njit(cache=True, error_model="numpy", _nrt=False)
def solve(h: float, split: bool, n_cand: int, rod: Rod, sv: Settings, body: Body, wk: Work, ct: Contact) -> tuple:
    """Stage 5: the multipliers warm-started from the tensions, friction on the prediction first (contact on),
    then x^{k+1} = xbar + the constraint displacement in ``wk.xbar`` (Wang 2017 Eq. D.3). With ``split``, the
    part of the tensions the velocities make into ``body.tension_in`` (constraints.inertial_tension), else
    zeros. Returns (iterations, residual)."""
    x = body.x
    xbar = wk.xbar
    w_eff = wk.w_eff
    alpha = wk.alpha
    elen = wk.elen
    tension = body.tension
    h2 = h * h
    # warm start from the previous tensions (alpha = h^2 T / |e|)
    for j in range(alpha.shape[0]):
        alpha[j] = h2 * tension[j] / elen[j] if w_eff[j] + w_eff[j + 1] > 0.0 and body.parted[j] == 0 else 0.0
    if ct.on:
        warm_friction(x, xbar, w_eff, h, ct.par, n_cand, ct.cand_i, ct.cand_j, ct.cand_s, ct.cand_t, ct.cand_n,
                      ct.cand_f, ct.cand_fa, ct.cand_ff)
    iters, residual = solve_multipliers(xbar, wk.edges, elen, w_eff, rod.rest, rod.compliance, h, sv.method,
                                        sv.tol, sv.max_iters, alpha, wk.new_edges, wk.tri_di, wk.tri_rhs, wk.tri_cp,
                                        body.parted)
    # which part of the tensions the velocities make, for the next substep's (local) mass scaling; without
    # it, none: all counts as static, which never makes a vertex too light
    if split:
        inertial_tension(x, body.x_prev, body.inv_mass, w_eff, wk.edges, elen, wk.new_edges, rod.rest,
                         rod.compliance, alpha, h, wk.tri_lo, wk.tri_di, wk.tri_up, wk.tri_rhs, wk.tri_cp,
                         body.tension_in, body.parted)
    else:
        body.tension_in[:] = 0.0
    constraint_displace(xbar, w_eff, alpha, wk.edges)
    return iters, residual


@njit(cache=True, error_model="numpy", inline="always")
def _solve_again(h: float, rod: Rod, sv: Settings, body: Body, wk: Work) -> tuple:
    return solve_again(wk.xbar, wk.edges, wk.elen, wk.w_eff, rod.rest, rod.compliance, h, sv.method, sv.tol,
                       sv.max_iters, wk.alpha, wk.alpha_extra, wk.new_edges, wk.again_len, wk.again_compliance,
                       wk.tri_di, wk.tri_rhs, wk.tri_cp, body.parted)


@njit(cache=True, error_model="numpy", _nrt=False)
def contact_rounds(h: float, n_cand: int, rod: Rod, sv: Settings, body: Body, wk: Work, ct: Contact,
                   iters: int, residual: float) -> tuple:
    """Stage 6: rounds of the no-crossing floor, friction and the constraints again until both settle
    (contact_response.py), then the crossing guard. ``iters`` and ``residual`` are the solve's so far.
    Returns (vertices the guard put back, iterations, residual)."""
    x = body.x
    xbar = wk.xbar
    w_eff = wk.w_eff
    fp_kept = ct.fp_kept
    cand_fp = ct.cand_fp
    raised = 0
    for c in range(n_cand):
        fp_kept[c] = cand_fp[c]
    min_gap = ct.par[CP_MIN_GAP]
    rounds, settled = friction_rounds(int(ct.par[CP_ROUNDS]), min_gap, ct.par[CP_SETTLE], h)
    # the floor visits only the pairs it can reach (contact_response.floor_pairs), listed again whenever the
    # substep's largest move may have brought another within reach; a round then costs the ~10 pairs near
    # the floor in a held knot, not the ~280 listed (docs/PHYSICS.md Sec. 9)
    reach = -1.0
    n_near = 0
    stats = ct.stats
    # friction's largest change of the round before: a held knot's friction and solve can stop converging, each
    # pass changing its pairs by about as much as the one before, far above the tolerance, so that every substep
    # ran all its rounds and ended no nearer to settled. With contact.stall set, a pass that shrinks the change
    # by less than that factor is followed by its solve and ends the rounds, as running out of them does; the
    # floor's rounds (raised > 0) are never cut (docs/PHYSICS.md Sec. 7, "When friction stops converging")
    stall = ct.par[CP_STALL]
    slid_before = math.inf
    for r in range(rounds):
        step = largest_step(xbar, x)
        if 2.0 * step + FLOOR_MARGIN * min_gap > reach:
            reach = floor_reach(step, min_gap)
            n_near = floor_pairs(ct.par, n_cand, ct.cand_d, ct.cand_fp, reach, ct.cand_near)
        raised = enforce_min_gap(xbar, w_eff, h, ct.par, ct.cand_near, n_near, ct.cand_i, ct.cand_j, ct.cand_s,
                                 ct.cand_t, ct.cand_d, ct.cand_n, ct.cand_fp)
        # friction again after each solve: the solve's slide along the edges is slip
        stick, slid = apply_friction(x, xbar, w_eff, h, ct.par, n_cand, ct.cand_i, ct.cand_j, ct.cand_s,
                                     ct.cand_t, ct.cand_n, ct.cand_f, ct.cand_fa)
        stats[CS_ROUNDS] += 1.0
        stats[CS_STICKING] = stick
        if raised > 0:
            stats[CS_ROUNDS_RAISED] += 1.0
        if slid > settled:
            stats[CS_ROUNDS_SLID] += 1.0
        if raised == 0 and slid <= settled:
            break
        stalled = stall > 0.0 and raised == 0 and slid > stall * slid_before
        slid_before = slid
        if r == rounds - 1 or stalled:
            stats[CS_ROUNDS_OUT] += 1.0
        stats[CS_PROJECTIONS] += raised
        it2, residual = _solve_again(h, rod, sv, body, wk)
        iters += it2
        if stalled:
            break
    reverted = 0
    if raised > 0:
        reverted = guard_crossings(x, xbar, rod.kinematic, ct.par, n_cand, ct.cand_i, ct.cand_j, ct.cand_s,
                                   ct.cand_t, ct.cand_n)
        ct.stats[CS_REVERTED] += reverted
        if reverted > 0:
            # the floor forces go back with the thread: its rounds pushed a motion that was thrown away, and
            # kept, a thread undone every substep summed them without bound (tests/test_self_contact.py::
            # test_a_substep_the_guard_undid_keeps_the_tensions_and_floor_forces_before_it)
            for c in range(n_cand):
                cand_fp[c] = fp_kept[c]
    # the friction forces the next substep starts from; none after a substep the guard undid (a motion thrown
    # away: like its floor forces, they would be the answer to a push that did not happen)
    if ct.par[CP_WARM] > 0.0:
        keep_friction(w_eff, h, n_cand, reverted == 0, ct.cand_i, ct.cand_j, ct.cand_s, ct.cand_t, ct.cand_f,
                      ct.cand_fa, ct.cand_ff)
    return reverted, iters, residual


@njit(cache=True, error_model="numpy", _nrt=False)
def tissue_rounds(h: float, held: bool, rod: Rod, sv: Settings, body: Body, wk: Work, ts: Tissue, nd: Needle,
                  iters: int, residual: float) -> tuple:
    """Stage 7: the needle's tip pierces; vertices that entered a pad go back out of it, the needle is held by
    the tissue and kept off its own thread (in the first NEEDLE_THREAD_ROUNDS), and the constraints are solved
    again, for up to the tissue's rounds (tissue.collide_pads, needle.needle_constraints, needle.needle_thread);
    then the punctures' forces.
    Returns (iterations, residual) with the rounds' added."""
    x = body.x
    xbar = wk.xbar
    w_eff = wk.w_eff
    with_needle = 1 if nd.on else 0
    if nd.on:
        needle_pierce(xbar, nd.par, nd.nst, ts.pads, ts.pst, ts.pun_i, ts.pun_f, held)
        needle_forces_clear(ts.pun_i, ts.pun_f)
    stats = body.stats
    rounds = int(ts.par[TP_ROUNDS])
    for r in range(rounds):
        pads = collide_pads(h, x, xbar, w_eff, rod.rest, ts.par, ts.pads, ts.pst, ts.pun_i, ts.pun_f, with_needle)
        needle = 0
        thread = 0
        if nd.on:
            needle = needle_constraints(h, x, xbar, w_eff, rod.rest, nd.par, nd.nst, ts.par, ts.pads, ts.pst,
                                        ts.pun_i, ts.pun_f, held, wk.closest)
            # and against its own thread (a thread and its needle are both solid)
            if r < NEEDLE_THREAD_ROUNDS:
                thread = needle_thread(h, x, xbar, w_eff, nd.par, nd.nst, ts.par, ts.pst, wk.closest)
        stats[STAT_TISSUE_ROUNDS] += 1.0
        if pads > 0:
            stats[STAT_TISSUE_PADS] += 1.0
        if needle > 0:
            stats[STAT_TISSUE_NEEDLE] += 1.0
        if thread > 0:
            stats[STAT_TISSUE_THREAD] += 1.0
        if pads + needle + thread == 0:
            break
        if r == rounds - 1:
            stats[STAT_TISSUE_OUT] += 1.0
        it2, residual = _solve_again(h, rod, sv, body, wk)
        iters += it2
    if nd.on:
        needle_pierce(xbar, nd.par, nd.nst, ts.pads, ts.pst, ts.pun_i, ts.pun_f, held)  # where the pushes took the tip
    puncture_forces(h, x, xbar, rod.kinematic, ts.par, ts.pst, ts.pun_i, ts.pun_f, with_needle)
    return iters, residual


@njit(cache=True, error_model="numpy", _nrt=False)
def tool_rounds(h: float, rod: Rod, sv: Settings, body: Body, wk: Work, tools: Tools, iters: int,
                residual: float) -> tuple:
    """Stage 6b: the thread kept out of the tools' jaws and shafts, with their friction
    (instruments.tool_contact), and the constraints solved again, for up to ``tools.rounds`` rounds; the last
    round's push is not followed by a solve. A thread wound round a jaw under tension is pulled into it by
    every solve: ending on a solve left the wraps 0.5 mm inside a 1 mm jaw at 0.05 N, ending on the push
    leaves the segments' lengths off by what the next substep's solve takes back. Returns (iterations,
    residual) with the rounds' added."""
    for r in range(tools.rounds):
        if tool_contact(h, body.x, wk.xbar, wk.w_eff, tools.caps, wk.closest, body.parted) == 0 \
                or r == tools.rounds - 1:
            break
        it2, residual = _solve_again(h, rod, sv, body, wk)
        iters += it2
    return iters, residual


@njit(cache=True, error_model="numpy", _nrt=False)
def commit(h: float, reverted: int, rod: Rod, body: Body, gr: Grasps, wk: Work, ts: Tissue, nd: Needle) -> None:
    """Stage 8: x^{k+1} becomes x and x^k x_prev; the twist along the displacement; tensions
    T_j = alpha_j |e_j| / h^2 (N; Wang 2017 Eq. 8) unless the guard undid the substep; the punctures located on
    the thread; the needle's substep finished; the force (N) each grasp applied."""
    x = body.x
    x_prev = body.x_prev
    xbar = wk.xbar
    twist_grad = wk.twist_grad
    # the twist change along the displacement, and the shift of the history
    dtheta = 0.0
    for i in range(x.shape[0]):
        for d in range(3):
            xn = xbar[i, d]
            dtheta += twist_grad[i, d] * (xn - x[i, d])
            x_prev[i, d] = x[i, d]
            x[i, d] = xn
    body.twist[0] += dtheta
    # a substep the guard undid keeps the tensions of the one before: its multipliers belong to a motion that
    # was thrown away. Read as tensions they fed the mass scaling, which made the masses larger, which made the
    # next undone solve's multipliers larger (the push it answered, times the mass, over h^2): a knot held under
    # too few contact rounds, undone every substep, read 22 kN at 2 N of pull and diverged (docs/PHYSICS.md Sec. 7)
    if reverted == 0:
        h2 = h * h
        tension = body.tension
        alpha = wk.alpha
        elen = wk.elen
        for j in range(tension.shape[0]):
            tension[j] = alpha[j] * elen[j] / h2
    if ts.on:
        locate_punctures(h, x, rod.rest, ts.pst, ts.pun_i, ts.pun_f, False, nd.on, nd.par[NP_WIRE] + ts.par[TP_RADIUS])
    if nd.on:
        needle_finish(h, nd.nst)
    vertex = gr.vertex
    p = gr.target
    p0 = gr.target_prev
    force = gr.force
    for g in range(vertex.shape[0]):
        v = vertex[g]
        if v < 0:
            continue
        if gr.sat[g] == 1:
            continue  # gr.force already holds the applied pull
        k = gr.k[g]
        c = gr.c[g]
        f = gr.frac[g]
        if f == 0.0:
            for d in range(3):
                force[g, d] = _coupling_force(k, c, p, p0, x, x_prev, g, v, d, h)
        elif v + 1 < x.shape[0]:
            # at the point: the momentum the segment's two vertices gained this substep over h (couple_point)
            for d in range(3):
                force[g, d] = _point_force(k, c, p, p0, x, x_prev, g, v, f, d, h)


@njit(cache=True, error_model="numpy", _nrt=False)
def substep(h: float, t: float, split: bool, n_cand: int, rod: Rod, tl: Timeline, sv: Settings, body: Body,
            gr: Grasps, wk: Work, ct: Contact, ts: Tissue, nd: Needle, tools: Tools) -> tuple:
    """Advance the state by one substep h (s) starting at time t (s): the stages in order. Returns
    (iterations, residual). ``split``: the tensions' inertial part is computed (stage 5). With contact on, the
    first ``n_cand`` pairs of the neighbour list get the contact response and ``ct.stats`` its statistics; with
    the tissue on, the pads move, the punctures act and the thread is kept out of the pads (solver/tissue.py);
    with the needle on, vertex 0 is a needle's swage (solver/needle.py); the thread is kept out of the tools
    (solver/instruments.py)."""
    tm = body.stats[STAT_TIMERS:]   # each stage's cycles, summed over the tick (solver/timers.py)
    c0 = cycles()
    held, n_tools = drive(h, t, rod, tl, body, gr, ts, nd, tools)
    c1 = cycles()
    tm[TM_DRIVE] += c1 - c0
    add_forces(h, n_cand, rod, body, wk, ct)
    c0 = cycles()
    tm[TM_FORCES] += c0 - c1
    predict(h, rod, body, wk, ts, nd)
    couple_grasps(h, rod, body, gr, wk)
    c1 = cycles()
    tm[TM_PREDICT] += c1 - c0
    iters, residual = solve(h, split, n_cand, rod, sv, body, wk, ct)
    c0 = cycles()
    tm[TM_SOLVE] += c0 - c1
    reverted = 0
    if ct.on:
        reverted, iters, residual = contact_rounds(h, n_cand, rod, sv, body, wk, ct, iters, residual)
    c1 = cycles()
    tm[TM_CONTACT] += c1 - c0
    if n_tools > 0:
        iters, residual = tool_rounds(h, rod, sv, body, wk, tools, iters, residual)
    c0 = cycles()
    tm[TM_TOOLS] += c0 - c1
    if ts.on:
        iters, residual = tissue_rounds(h, held, rod, sv, body, wk, ts, nd, iters, residual)
    c1 = cycles()
    tm[TM_TISSUE] += c1 - c0
    commit(h, reverted, rod, body, gr, wk, ts, nd)
    tm[TM_COMMIT] += cycles() - c1
    return iters, residual


@njit(cache=True, error_model="numpy", _nrt=False)
def refresh_neighbours(n_cand: int, body: Body, ct: Contact) -> int:
    """Before a substep: rebuild the neighbour list if a vertex has moved more than half its skin since it was
    built (a Verlet list: every pair within the contact distance is then in it). Returns the pairs listed."""
    x = body.x
    # the list's skin grows with the motion: a thread whipping at metres per second moves a millimetre a
    # substep, more than a suture's skin, and a pair further than the skin could cross within one substep
    step_max = largest_step(x, body.x_prev)
    skin = max(ct.par[CP_SKIN], 8.0 * step_max)
    # stale against the skin the list was built with; a rebuild takes the skin of now
    if skin > ct.stats[CS_SKIN] or neighbours_stale(x, ct.x_ref, ct.stats[CS_SKIN], step_max):
        rebuild_neighbours(x, ct.par, skin, ct.exclude, ct.grid_head, ct.grid_next, ct.grid_cells, ct.grid_scratch,
                           ct.cand_i, ct.cand_j, ct.cand_s, ct.cand_t, ct.cand_d, ct.cand_n, ct.cand_fp, ct.cand_ff,
                           ct.old_j, ct.old_n, ct.old_fp, ct.old_ff, ct.old_next, ct.seg_head, ct.x_ref, ct.stats,
                           body.parted)
        return int(ct.stats[CS_COUNT])
    return n_cand


@njit(cache=True, error_model="numpy", _nrt=False)
def advance(n_sub: int, h: float, t: float, scale: bool, tension_margin: float, trace, rod: Rod, tl: Timeline,
            sv: Settings, body: Body, gr: Grasps, wk: Work, ct: Contact, ts: Tissue, nd: Needle,
            tools: Tools) -> None:
    """Run n_sub substeps of h (s) from time t (s); write iteration statistics into ``body.stats`` (STAT_*).

    With ``scale``, ``body.inv_mass`` is rewritten before every substep from ``rod.base_inv_mass`` by selective
    mass scaling (stability.scale_masses) with the tensions of the substep before, so the scaling follows a
    tension that rises within the tick (a thread snapping taut); ``sv.local`` chooses its reading of the
    stiffness (SolverSettings.mass_scaling), ``body.tension_floor`` (N per segment) the least tension it counts,
    ``tension_margin`` how much the tensions may grow within the tick.

    With contact on, the neighbour list is refreshed before every substep (refresh_neighbours) and ``ct.stats``
    gets the tick's contact statistics (contact_response.CS_*).

    ``trace`` (k, n, 3), if k >= n_sub, gets the positions after every substep (tests follow every state the
    integrator went through); pass a (0, n, 3) array otherwise."""
    x = body.x
    cstats = ct.stats
    if ct.on:
        cstats[CS_REBUILDS] = 0.0
        cstats[CS_CONTACTS] = 0.0
        cstats[CS_PENETRATION] = 0.0
        cstats[CS_PROJECTIONS] = 0.0
        cstats[CS_REVERTED] = 0.0
        cstats[CS_ROUNDS] = 0.0
        cstats[CS_ROUNDS_RAISED] = 0.0
        cstats[CS_ROUNDS_SLID] = 0.0
        cstats[CS_ROUNDS_OUT] = 0.0
    max_it = 0
    max_res = 0.0
    total = 0
    it = 0
    res = 0.0
    n_scaled = 0
    worst = 1.0
    n_cand = int(cstats[CS_COUNT])
    split = scale and sv.local
    tm = body.stats[STAT_TIMERS:]
    for k in range(N_TIMERS):
        tm[k] = 0.0
    for k in range(STAT_TISSUE_ROUNDS, STAT_TISSUE_OUT + 1):
        body.stats[k] = 0.0
    for c in range(tools.caps.shape[0]):
        tools.caps[c, TC_PUSHES] = 0.0
        for d in range(3):
            tools.caps[c, TC_IMPULSE + d] = 0.0
    for s in range(n_sub):
        c0 = cycles()
        if ct.on:
            n_cand = refresh_neighbours(n_cand, body, ct)
        c1 = cycles()
        tm[TM_NEIGHBOURS] += c1 - c0
        if scale:
            # the hinges' fold is read every substep: they can fold within a tick (a whip), and stiffen fast
            ns, f = scale_masses(rod.mass, rod.base_inv_mass, rod.bend_gersh, rod.rest, body.tension,
                                 body.tension_in, body.tension_floor, tension_margin, h, sv.target, ct.k,
                                 body.inv_mass, x, body.x_prev, sv.keep_energy, sv.local, wk.fold, body.parted)
            if ns > n_scaled:
                n_scaled = ns
            if f > worst:
                worst = f
        tm[TM_MASSES] += cycles() - c1
        it, res = substep(h, t + s * h, split, n_cand, rod, tl, sv, body, gr, wk, ct, ts, nd, tools)
        if trace.shape[0] > s:
            for i in range(x.shape[0]):
                for d in range(3):
                    trace[s, i, d] = x[i, d]
        total += it
        if it > max_it:
            max_it = it
        if res > max_res or not math.isfinite(res):
            max_res = res
        if not (res <= DIVERGED_RESIDUAL):
            break
    stats = body.stats
    stats[STAT_ITERS] = it
    stats[STAT_RESIDUAL] = res
    stats[STAT_SUBSTEPS] = n_sub
    stats[STAT_MAX_ITERS] = max_it
    stats[STAT_MAX_RESIDUAL] = max_res
    stats[STAT_TOTAL_ITERS] = total
    stats[STAT_SCALED] = n_scaled
    stats[STAT_MASS_FACTOR] = worst
    # the springs that acted, not those that may act next tick (ct.k), which set the next tick's substeps
    stats[STAT_OMEGA_END] = omega_bound(x, body.inv_mass, rod.bend_gersh, rod.rest, body.tension, 1.0, ct.k_act,
                                        wk.fold, body.parted, sv.local)


@njit(cache=True, error_model="numpy")
def rescale_history(x: np.ndarray, x_prev: np.ndarray, ratio: float) -> None:
    """Change the substep from h to ratio*h keeping the velocity (x - x_prev)/h."""
    for i in range(x.shape[0]):
        for d in range(3):
            x_prev[i, d] = x[i, d] - ratio * (x[i, d] - x_prev[i, d])


_NO_TRACE = np.zeros((0, 0, 3))

# rows of ThreadState.packed's layout that the step reads (module constants: numba reads them at compile time)
(_X, _X_PREV, _TENSION, _TENSION_IN, _TENSION_FLOOR, _TWIST, _KIN_TARGET, _EXT_FORCE, _GRASP_VERTEX, _GRASP_FRAC,
 _GRASP_PAD, _GRASP_K, _GRASP_C, _GRASP_FMAX, _GRASP_TARGET, _GRASP_TARGET_PREV, _GRASP_VEL, _GRASP_FORCE, _GRASP_SAT,
 _STATS, _INV_MASS_TICK, _CAND_I, _CAND_J, _CAND_S, _CAND_T, _CAND_D, _CAND_N, _CAND_F, _CAND_FP, _CAND_FA, _CAND_FF,
 _CAND_NEAR, _FP_KEPT, _X_REF, _CONTACT_K, _CONTACT_K_ACT, _TURN, _FOLD, _CONTACT_STATS, _GRID_HEAD, _GRID_NEXT,
 _GRID_CELLS, _GRID_SCRATCH, _ALPHA_EXTRA, _OLD_J, _OLD_N, _OLD_FP, _OLD_FF, _OLD_NEXT, _SEG_HEAD, _PST, _PUN_I,
 _PUN_F, _NST, _FORCE, _TWIST_GRAD, _XBAR, _W_EFF, _EDGES, _ELEN, _NEW_EDGES, _ALPHA, _TRI_LO, _TRI_DI, _TRI_UP,
 _TRI_RHS, _TRI_CP, _AGAIN_LEN, _AGAIN_COMPLIANCE, _CLOSEST, _TOOL_CAP, _PARTED, _BREAKAGE) = (
    STATE_FIELDS.index(name) for name in (
        "x", "x_prev", "tension", "tension_in", "tension_floor", "twist", "kin_target", "ext_force", "grasp_vertex",
        "grasp_frac", "grasp_pad", "grasp_k", "grasp_c", "grasp_fmax", "grasp_target", "grasp_target_prev",
        "grasp_vel", "grasp_force", "grasp_sat", "stats", "inv_mass_tick", "cand_i", "cand_j", "cand_s", "cand_t",
        "cand_d", "cand_n", "cand_f", "cand_fp", "cand_fa", "cand_ff", "cand_near", "fp_kept", "x_ref", "contact_k",
        "contact_k_act", "turn", "fold", "contact_stats", "grid_head", "grid_next", "grid_cells", "grid_scratch",
        "alpha_extra", "old_j", "old_n", "old_fp", "old_ff", "old_next", "seg_head", "pst", "pun_i", "pun_f", "nst",
        "force", "twist_grad", "xbar", "w_eff", "edges", "elen", "new_edges", "alpha", "tri_lo", "tri_di", "tri_up",
        "tri_rhs", "tri_cp", "again_len", "again_compliance", "closest", "tool_cap", "parted", "breakage"))


@njit(cache=True, error_model="numpy", inline="always")
def _in_carried(lay, k) -> bool:
    return lay[k, 0] == BUF_CARRIED_F or lay[k, 0] == BUF_CARRIED_I or lay[k, 0] == BUF_CARRIED_B


@njit(cache=True, error_model="numpy", inline="always")
def _vector(carried, scratch, lay, k):
    """Field k of a packed state (ThreadState.packed), a vector: a view of the carried or the scratch buffer of
    its dtype."""
    b = carried if _in_carried(lay, k) else scratch
    return b[lay[k, 1]:lay[k, 1] + lay[k, 2]]


@njit(cache=True, error_model="numpy", inline="always")
def _matrix(carried, scratch, lay, k):
    """Field k of a packed state, a matrix (rows, columns as the layout says)."""
    b = carried if _in_carried(lay, k) else scratch
    return b[lay[k, 1]:lay[k, 1] + lay[k, 2] * lay[k, 3]].reshape((lay[k, 2], lay[k, 3]))


@njit(cache=True, error_model="numpy")
def advance_state(n_sub: int, h: float, t: float, scale: bool, tension_margin: float, trace,
                  rest, mass, inv_mass, kinematic, hinge_k, k_d, drag_quad, drag_lin, compliance, gravity, twist_k,
                  mot_kind, mot_index, mot_t0, mot_t1, mot_vel, method, tol, max_iters, bend_gersh,
                  target, keep_energy, local, contact_on, cpar, cexclude,
                  tissue_on, tpar, pads, needle_on, npar, cf, sf, ci, si, cb, lay) -> None:
    """advance() on a model's arrays and settings as model_args gives them and a packed state
    (ThreadState.packed: the buffers ``cf``, ``sf`` (float64), ``ci``, ``si`` (int64), ``cb`` (int8) and their
    ``lay``out). The groups the stages read are built here as views.

    The arguments stay flat at this one call from Python: the dispatcher types arrays and plain scalars on its
    fast path, while a NamedTuple argument is typed in Python on every call (several microseconds a tick)."""
    rod = Rod(rest, mass, inv_mass, kinematic, hinge_k, k_d, drag_quad, drag_lin, compliance, gravity, twist_k,
              bend_gersh)
    tl = Timeline(mot_kind, mot_index, mot_t0, mot_t1, mot_vel)
    sv = Settings(method, tol, max_iters, target, keep_energy, local)
    body = Body(_matrix(cf, sf, lay, _X), _matrix(cf, sf, lay, _X_PREV), _vector(cf, sf, lay, _INV_MASS_TICK),
                _vector(cf, sf, lay, _TENSION), _vector(cf, sf, lay, _TENSION_IN),
                _vector(cf, sf, lay, _TENSION_FLOOR), _vector(cf, sf, lay, _TWIST), _matrix(cf, sf, lay, _KIN_TARGET),
                _matrix(cf, sf, lay, _EXT_FORCE), _vector(cf, sf, lay, _STATS), _vector(cb, cb, lay, _PARTED),
                _vector(ci, si, lay, _BREAKAGE))
    gr = Grasps(_vector(ci, si, lay, _GRASP_VERTEX), _vector(cf, sf, lay, _GRASP_FRAC),
                _vector(ci, si, lay, _GRASP_PAD), _vector(cf, sf, lay, _GRASP_K),
                _vector(cf, sf, lay, _GRASP_C),
                _vector(cf, sf, lay, _GRASP_FMAX), _matrix(cf, sf, lay, _GRASP_TARGET),
                _matrix(cf, sf, lay, _GRASP_TARGET_PREV), _matrix(cf, sf, lay, _GRASP_VEL),
                _matrix(cf, sf, lay, _GRASP_FORCE), _vector(cb, cb, lay, _GRASP_SAT))
    wk = Work(_matrix(cf, sf, lay, _FORCE), _matrix(cf, sf, lay, _TWIST_GRAD), _matrix(cf, sf, lay, _XBAR),
              _vector(cf, sf, lay, _W_EFF), _matrix(cf, sf, lay, _EDGES), _vector(cf, sf, lay, _ELEN),
              _matrix(cf, sf, lay, _NEW_EDGES), _vector(cf, sf, lay, _ALPHA), _vector(cf, sf, lay, _ALPHA_EXTRA),
              _vector(cf, sf, lay, _TRI_LO), _vector(cf, sf, lay, _TRI_DI), _vector(cf, sf, lay, _TRI_UP),
              _vector(cf, sf, lay, _TRI_RHS), _vector(cf, sf, lay, _TRI_CP), _vector(cf, sf, lay, _AGAIN_LEN),
              _vector(cf, sf, lay, _AGAIN_COMPLIANCE), _vector(cf, sf, lay, _CLOSEST), _vector(cf, sf, lay, _FOLD))
    ct = Contact(contact_on, cpar, cexclude,
                 _vector(ci, si, lay, _CAND_I), _vector(ci, si, lay, _CAND_J), _vector(cf, sf, lay, _CAND_S),
                 _vector(cf, sf, lay, _CAND_T), _vector(cf, sf, lay, _CAND_D), _matrix(cf, sf, lay, _CAND_N),
                 _vector(cf, sf, lay, _CAND_F), _vector(cf, sf, lay, _CAND_FP), _matrix(cf, sf, lay, _CAND_FA),
                 _matrix(cf, sf, lay, _CAND_FF),
                 _vector(ci, si, lay, _CAND_NEAR), _vector(cf, sf, lay, _FP_KEPT), _matrix(cf, sf, lay, _X_REF),
                 _vector(cf, sf, lay, _CONTACT_K), _vector(cf, sf, lay, _CONTACT_K_ACT), _vector(cf, sf, lay, _TURN),
                 _vector(cf, sf, lay, _CONTACT_STATS), _vector(ci, si, lay, _GRID_HEAD),
                 _vector(ci, si, lay, _GRID_NEXT), _matrix(ci, si, lay, _GRID_CELLS),
                 _vector(cf, sf, lay, _GRID_SCRATCH), _vector(ci, si, lay, _OLD_J), _matrix(cf, sf, lay, _OLD_N),
                 _vector(cf, sf, lay, _OLD_FP), _matrix(cf, sf, lay, _OLD_FF),
                 _vector(ci, si, lay, _OLD_NEXT), _vector(ci, si, lay, _SEG_HEAD))
    ts = Tissue(tissue_on, tpar, pads, _matrix(cf, sf, lay, _PST), _matrix(ci, si, lay, _PUN_I),
                _matrix(cf, sf, lay, _PUN_F))
    nd = Needle(needle_on, npar, _vector(cf, sf, lay, _NST))
    tools = Tools(_matrix(cf, sf, lay, _TOOL_CAP), TOOL_ROUNDS)
    advance(n_sub, h, t, scale, tension_margin, trace, rod, tl, sv, body, gr, wk, ct, ts, nd, tools)


def model_args(model: ThreadModel) -> tuple:
    """advance_state's arguments that come from the model (its arrays and solver settings), in order. A Stepper
    takes them once; step() otherwise takes them at every call."""
    s = model.solver
    return (model.rest_length, model.mass, model.inv_mass, model.kinematic, model.hinge_k,
            model.bending_dissipation, model.drag_quad, model.drag_lin, model.compliance, model.gravity,
            model.twist_k, model.mot_kind, model.mot_index, model.mot_t0, model.mot_t1, model.mot_vel,
            model.method_code, s.tol, s.max_iters, model.bend_gersh, s.stability_target,
            s.scaled_mass_keeps == "energy", s.mass_scaling == "local", model.contact.enabled, model.contact_par,
            model.contact.exclude, model.tissue_on, model.tissue_par, model.pads, model.needle_on, model.needle_par)


def step(model: ThreadModel, state: ThreadState, n_sub: int, h: float, scale: bool = False,
         tension_margin: float = 1.5, trace: np.ndarray | None = None, margs: tuple | None = None) -> None:
    """Advance ``state`` by n_sub substeps of h seconds (one kernel call). With ``scale``, masses are scaled
    before every substep wherever the substep is too long for the local stiffness (docs/PHYSICS.md Sec. 6),
    counting each segment's tension as at least ``state.tension_floor`` (N; tension_floors sets it).
    ``trace`` (k >= n_sub, n, 3), if given, gets the positions (m) after each substep. ``margs``: the model's
    model_args, if the caller keeps them."""
    if h != state.h[0]:
        rescale_history(state.x, state.x_prev, h / state.h[0])
        state.h[0] = h
    if not scale:
        np.copyto(state.inv_mass_tick, model.inv_mass)
    # with scale, inv_mass_tick still holds the masses of the previous substep, which scale_masses needs
    advance_state(n_sub, h, state.time[0], scale, tension_margin, _NO_TRACE if trace is None else trace,
                  *(model_args(model) if margs is None else margs), *state.packed())
    state.time[0] += n_sub * h


def tension_floors(model: ThreadModel, state: ThreadState) -> float:
    """Set ``state.tension_floor``, the static tension (N) the coming tick's mass scaling must count on each
    segment, as Stepper.tick does (plan_tick): what the grasps can pull with and what the punctures hold
    (_tension_floors). Returns the largest."""
    return _tension_floors(state.x, state.grasp_vertex, state.grasp_frac, state.grasp_target, state.grasp_k,
                           state.grasp_fmax, model.solver.scaled_mass_keeps == "energy", model.tissue_on,
                           model.tissue_par, state.pun_i, state.pun_f, state.tension_floor,
                           model.solver.mass_scaling == "local")


@njit(cache=True, error_model="numpy")
def _grasp_tension_floor(x, grasp_vertex, grasp_frac, grasp_target, grasp_k, grasp_fmax, wide: bool) -> float:
    """The tension (N) the grasps can put into the thread during the next tick: each coupling's force if its
    vertex stayed where it is, min(max_force, k |p - x|). A stylus far from its vertex is about to pull. At an
    end of the thread, a coupling pushing the end back along the thread compresses it rather than pulls, and
    counts 0 (stability.py: compression sets no step limit). A grasp on a point inside a segment (grasp_frac
    f > 0) counts with the point (1 - f) x[v] + f x[v+1] for x, whatever its direction: it is at no end.

    With ``wide`` (mass scaling that keeps energy), an end's coupling counts unless it points back along the
    end's segment within 45 degrees: a pull across the segment swings it round into tension within the tick
    (3 N on the 0.08 mg end of a 3-0 silk suture is 4e7 m/s^2), and with kinetic energy kept a vertex made
    lighter is no longer held back by the inertia it had (the default scene diverged at 6.13 s with a pull
    1.3 degrees behind the perpendicular). Without it, any pull with a backward component counts 0, as the
    suture scripts were tuned under."""
    floor = 0.0
    cos_back = -0.7071 if wide else 0.0
    last = x.shape[0] - 1
    for g in range(grasp_vertex.shape[0]):
        v = grasp_vertex[g]
        if v < 0:
            continue
        f = grasp_frac[g]
        if f != 0.0 and v < last:
            a = 1.0 - f
            dx = grasp_target[g, 0] - (a * x[v, 0] + f * x[v + 1, 0])
            dy = grasp_target[g, 1] - (a * x[v, 1] + f * x[v + 1, 1])
            dz = grasp_target[g, 2] - (a * x[v, 2] + f * x[v + 1, 2])
            floor = max(floor, min(grasp_fmax[g], grasp_k[g] * math.sqrt(dx * dx + dy * dy + dz * dz)))
            continue
        dx = grasp_target[g, 0] - x[v, 0]
        dy = grasp_target[g, 1] - x[v, 1]
        dz = grasp_target[g, 2] - x[v, 2]
        if v == 0 or v == last:
            w = 1 if v == 0 else last - 1       # the end's neighbour: the coupling pulls if it points away
            ex = x[v, 0] - x[w, 0]
            ey = x[v, 1] - x[w, 1]
            ez = x[v, 2] - x[w, 2]
            outward = dx * ex + dy * ey + dz * ez
            if outward < cos_back * math.sqrt((dx * dx + dy * dy + dz * dz) * (ex * ex + ey * ey + ez * ez)):
                continue
        f = min(grasp_fmax[g], grasp_k[g] * math.sqrt(dx * dx + dy * dy + dz * dz))
        floor = max(floor, f)
    return floor


@njit(cache=True, error_model="numpy")
def _tension_floors(x, grasp_vertex, grasp_frac, grasp_target, grasp_k, grasp_fmax, wide, tissue_on, tpar, pun_i,
                    pun_f, out, local) -> float:
    """Into ``out`` (N per segment): tension that may arise within the coming tick, before the multipliers
    show it, which the mass scaling counts as static. What the grasps can pull with (_grasp_tension_floor),
    on every segment, and what the punctures' drag can hold (tissue.puncture_load), on the segments from the
    first active puncture to the last: beyond them a free strand carries none of it (counted there too, it
    made a released 3-0 silk tail 3,900 times heavier; docs/PHYSICS.md Sec. 6). The whole-thread scaling
    (not ``local``) counts both on every segment. Returns the largest."""
    grasp = _grasp_tension_floor(x, grasp_vertex, grasp_frac, grasp_target, grasp_k, grasp_fmax, wide)
    m = out.shape[0]
    lo = m
    hi = -1
    load = 0.0
    if tissue_on:
        load = puncture_load(tpar, pun_i, pun_f)
        for q in range(pun_i.shape[0]):
            if pun_i[q, PI_STATE] == PUN_ACTIVE:
                j = min(int(pun_f[q, PF_SIGMA]), m - 1)
                lo = min(lo, j - 1)
                hi = max(hi, j + 1)
    top = grasp
    for j in range(m):
        out[j] = max(grasp, load) if lo <= j <= hi or not local else grasp
        top = max(top, out[j])
    return top


@njit(cache=True, error_model="numpy")
def plan_tick(x, tension, grasp_vertex, grasp_frac, grasp_target, grasp_k, grasp_fmax, wide, tissue_on, tpar, pun_i,
              pun_f, inv_mass, bend_gersh, rest, contact_k, est, floors, fold, parted, local) -> tuple:
    """The static floors of the coming tick into ``floors`` (N per segment, _tension_floors) and the tension
    estimate into ``est`` (N): each segment's |tension|, but at least its floor. Returns (the largest floor in
    N, the stability bound in rad/s at the estimate x1.5). One kernel call: the parts called one by one from
    Python cost about 7 us a tick."""
    floor = _tension_floors(x, grasp_vertex, grasp_frac, grasp_target, grasp_k, grasp_fmax, wide, tissue_on, tpar,
                            pun_i, pun_f, floors, local)
    for j in range(tension.shape[0]):
        est[j] = max(abs(tension[j]), floors[j])
    return floor, omega_bound(x, inv_mass, bend_gersh, rest, est, 1.5, contact_k, fold, parted, local)


def choose_substeps(model: ThreadModel, state: ThreadState, tension: np.ndarray | None = None,
                    omega: float | None = None) -> tuple[int, int]:
    """(substeps for the next tick, substeps the stability bound asks for). Fixed if the model says so; else
    from the bound ``omega`` (rad/s), by default taken with the given tension estimate (default: the current
    tensions; x1.5, tension can grow within a tick), capped at max_substeps."""
    s = model.solver
    if s.substeps > 0:
        return s.substeps, s.substeps
    if omega is None:
        t_est = state.tension if tension is None else tension
        omega = omega_bound(state.x, model.inv_mass, model.bend_gersh, model.rest_length, t_est, 1.5,
                            state.contact_k, state.fold, state.parted, s.mass_scaling == "local")
    state.stats[STAT_OMEGA] = omega
    needed = substeps_for(omega, s.tick, s.stability_target, 1 << 30)
    n = min(needed, s.max_substeps)
    prev = int(state.stats[STAT_SUBSTEPS])
    # hysteresis: only drop the substep count once the bound is clearly lower, so h does not flicker
    if 0 < n < prev and n > 0.75 * prev:
        n = prev
    return n, needed


class SolverDivergence(RuntimeError):
    """The step produced non-finite positions or multipliers that did not converge, and no retry helped."""


class Stepper:
    """Advances one model/state pair tick by tick (model.solver.tick seconds each).

    With automatic substeps (docs/PHYSICS.md Sec. 6) each tick takes the substeps the stability bound asks
    for, up to the budget model.solver.max_substeps; past the budget the vertices that are too stiff for the
    substep get their mass scaled (stability.scaled_inverse_masses), so a taut suture never needs more than
    the budget. A tick that fails its checks is run again, first within the budget with its masses scaled
    for all the tension it reached, then if need be with up to solver.retry_substeps substeps (an overrun of
    the real-time budget, reported by the caller and counted in ``past_budget``, rather than a diverging
    state). The bound uses a
    tension estimate: the current tensions, but at least what the grasps can pull
    with during the tick (tension_floor). A tick is checked after it ran: every substep's multipliers must
    have converged, and the bound at the tensions the tick ended with must still hold (h * omega < 2). Tension
    can rise within one tick faster than any estimate (a thread snapping taut), so a tick that fails is run
    again from a copy of the state taken before it, with more substeps and a larger estimate: the tensions it
    reached, or four times the estimate if they were not finite. The copy is allocated once, here; a tick
    allocates nothing.
    """

    CONVERGED = 1e-9      # residual max |G_j|/l_j^2 above which a substep counts as not converged
    RUNAWAY = 20.0        # h * omega at a tick's end (stable below 2) above which its tensions are not counted
    MAX_RETRIES = 6

    def __init__(self, model: ThreadModel, state: ThreadState):
        self.model = model
        self.state = state
        self._backup = state.copy()
        self._save = TickCopy(state, self._backup)
        self._restore = TickCopy(self._backup, state)
        self._tension = state.tension.copy()   # the tension estimate of the tick being run (N)
        self.retries = 0          # ticks run again since this stepper was made or reset
        self.past_budget = 0      # of those, ticks kept with more substeps than solver.max_substeps (overruns)
        self.trace: np.ndarray | None = None   # (k, n, 3): if set, each tick writes its substeps' positions
        self.broke = -1           # the segment the last tick parted (solver/breakage.py), or -1
        self.broke_tension = 0.0  # N, the tension it broke at
        self.use_model(model)

    def use_model(self, model: ThreadModel) -> None:
        """Step with ``model`` from the next tick on: the same thread (same state layout) with, say, timeline
        motions removed (a live device took over a grasp). Allocates no state."""
        self.model = model
        state = self.state
        # the kernels' arguments, taken once: a model's arrays and settings do not change during a run, and a
        # state's arrays are never replaced, only written
        self._margs = model_args(model)
        self._strength = float(model.params.knot_pull_strength)
        s = model.solver
        self._plan_args = (state.x, state.tension, state.grasp_vertex, state.grasp_frac, state.grasp_target,
                           state.grasp_k, state.grasp_fmax, s.scaled_mass_keeps == "energy", model.tissue_on,
                           model.tissue_par, state.pun_i, state.pun_f, model.inv_mass, model.bend_gersh,
                           model.rest_length, state.contact_k, self._tension, state.tension_floor, state.fold,
                           state.parted, s.mass_scaling == "local")

    def reset(self) -> None:
        """As a new Stepper of the same model and state starts (after the state was reset in place): the tension
        estimate taken from the state, the counters zeroed. The backup is rewritten by every tick before it is
        read, so it is left as it is. Allocates nothing."""
        np.copyto(self._tension, self.state.tension)
        self.retries = 0
        self.past_budget = 0

    def tick(self) -> int:
        """Advance one tick; returns the substeps of the run that was kept. Raises SolverDivergence if the
        state went non-finite (then it must not be used: reset it). A thread pulled past its rated strength
        parts after the tick (solver/breakage.py): ``broke`` says where."""
        n = self._advance()
        self.broke = -1
        if self._strength < math.inf:
            state = self.state
            j = find_break(state.tension, state.parted, self._strength, state.breakage)
            if j >= 0:
                self.broke = j
                self.broke_tension = float(state.tension[j])
                part(state, j)
                self._tension[j] = 0.0
        return n

    def _advance(self) -> int:
        model, state, s = self.model, self.state, self.model.solver
        if s.substeps > 0:
            n = s.substeps
            step(model, state, n, s.tick / n, trace=self.trace, margs=self._margs)
            self._check_finite(n)
            return n
        est = self._tension
        floor, omega = plan_tick(*self._plan_args)
        n, needed = choose_substeps(model, state, est, omega)
        self._save()
        for attempt in range(self.MAX_RETRIES + 1):
            h = s.tick / n
            step(model, state, n, h, scale=needed > n, trace=self.trace, margs=self._margs)
            ok = state.stats[STAT_MAX_RESIDUAL] <= self.CONVERGED  # False for NaN too
            if ok:
                ok = h * state.stats[STAT_OMEGA_END] < 2.0
            if ok or attempt == self.MAX_RETRIES:
                self._check_finite(n)
                if n > s.max_substeps:
                    self.past_budget += 1
                return n
            # run the tick again with more substeps and a higher tension floor for the mass scaling: the
            # tensions it reached, and at least four times the floor (a violent snap can leave the multipliers
            # unconverged but finite; each retry then slows the stiff vertices further until they converge)
            converged = state.stats[STAT_MAX_RESIDUAL] <= self.CONVERGED
            # tensions of an unconverged solve mean nothing, nor do those of a run that went far past its
            # stability bound: counted as static they scale the masses by up to 1e12, and the next tick diverged
            # (a free tail snapped taut under mass scaling read 1.4e8 N at h omega = 3,340; docs/PHYSICS.md Sec. 6)
            if converged and h * state.stats[STAT_OMEGA_END] < self.RUNAWAY:
                np.maximum(est, np.abs(state.tension), out=est)
            floor = max(4.0 * floor, 1e-3)
            np.maximum(est, floor, out=est)
            self._restore()
            np.maximum(state.tension_floor, floor, out=state.tension_floor)   # after the restore, which copies it
            self.retries += 1
            omega_new = omega_bound(state.x, model.inv_mass, model.bend_gersh, model.rest_length, est, 1.5,
                                    state.contact_k, state.fold, state.parted, s.mass_scaling == "local")
            needed = max(substeps_for(omega_new, s.tick, s.stability_target, 1 << 30), 2 * n)
            if attempt == 0:
                # first within the real-time budget, the masses scaled for all the tension the tick reached,
                # counted as static: a cinch that drives the wound's edges together under the local scaling
                # left the multipliers unconverged at 4 substeps, and ran within them with the tensions (or four
                # times the floor) counted; past the budget it took 911-1024 (docs/PHYSICS.md Sec. 6)
                np.maximum(state.tension_floor, est, out=state.tension_floor)
                n = min(needed, s.max_substeps)
            else:
                # past the real-time budget if need be: mass scaling tames tension from loads, not the inertial
                # tension of a whip (it grows with the added mass), so a violent tick gets real substeps
                n = min(needed, max(s.max_substeps, s.retry_substeps))
        return n

    def _check_finite(self, n: int) -> None:
        r = self.state.stats[STAT_MAX_RESIDUAL]
        if not (r <= DIVERGED_RESIDUAL):  # NaN fails too
            raise SolverDivergence(
                f"the solver diverged at t = {self.state.time[0]:.4f} s with {n} substeps per tick "
                f"(constraint residual {r:.3g}); use automatic substeps or more substeps")


def tick(model: ThreadModel, state: ThreadState) -> int:
    """Advance one tick without Stepper's mass scaling and retry: fixed substeps, or the bound at the tick's
    start up to max_substeps (for benchmarks of the bare scheme)."""
    n, _ = choose_substeps(model, state)
    step(model, state, n, model.solver.tick / n)
    return n


def warm_up(model: ThreadModel, state: ThreadState) -> None:
    """Run every kernel a tick can reach once, on a copy of ``state``: the plain and the mass-scaled step, a
    change of substep (rescale_history), the stability bounds, the energies and a tool's placement. numba loads
    compiled code from its cache at a function's first call (milliseconds each), so a loop that has not called
    them all would pay that in the first tick that needs one (the first taut tick, say)."""
    from .diagnostics import energies

    s = state.copy()
    h = model.solver.tick
    step(model, s, 1, h)
    step(model, s, 2, h / 2, scale=True)
    omega_bound(s.x, model.inv_mass, model.bend_gersh, model.rest_length, s.tension, 1.0, s.contact_k, s.fold,
                s.parted, model.solver.mass_scaling == "local")
    energies(model, s)
    find_break(s.tension, s.parted, math.inf, s.breakage)
    place_capsules(s.tool_cap, 0, s.x[0].copy(), np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(SH_COUNT), 0.0, -1, -1,
                   h, 0.0, True)   # a tool's placement (the physics loop's, each tick a stylus drives one)
    Stepper(model, state.copy()).tick()
