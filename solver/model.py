"""Thread model (parameters, fixed during a run) and thread state (everything a step changes).

As MuJoCo splits mjModel and mjData: a ThreadModel holds the rest geometry, masses, stiffnesses, boundary
conditions and the scripted timeline; a ThreadState holds positions, multipliers, twist, grasp targets and
every scratch buffer, allocated once. Kernels read the model and write only the state. Reset is copying an
initial state. SI units throughout.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields

import numpy as np
from numba import njit

from .contact_response import CS_COUNT, CS_SIZE
from .instruments import tool_capsules
from .needle import NP_COUNT, NS_COUNT, NS_Q, NS_QT
from .timers import N_TIMERS
from .tissue import MAX_PUNCTURES, PD_COUNT, PD_REST, PF_COUNT, PI_COUNT, PI_MATE, PS_COUNT, PS_X, TP_COUNT

MAX_GRASPS = 4
STAT_SLOTS = 15   # state.stats: solver/integrator.py's STAT_* slots, then its stage timers from STAT_TIMERS


@dataclass(frozen=True)
class ThreadParams:
    """Physical parameters of one thread, resolved to SI (see solver/presets.py for how they are read)."""
    name: str
    length: float                 # m
    segments: int
    linear_density: float         # kg/m
    bending_stiffness: float      # EI, N*m^2
    twisting_stiffness: float     # GJ, N*m^2
    air_drag: float = 0.0         # quadratic drag per length, N*s^2/m^3 (Wang 2017 Eq. 4 per unit length)
    air_drag_linear: float = 0.0  # linear drag per length, N*s/m^2
    bending_dissipation: float = 0.0  # Wang 2017 Eq. 5 k_d, J*s per hinge
    contact_radius: float = 0.0   # m
    diameter: float = 0.0         # m (0 = not given)
    extensible: bool = False
    stretch_stiffness: float = math.inf  # EA, N (inf when inextensible)
    friction_static: float = 0.0  # Coulomb coefficient of the thread on itself, sticking
    friction_kinetic: float = 0.0  # and sliding (<= static)
    contact_stiffness: float = 0.0  # N/m, the self-contact penalty k_s a scenario uses by default (0: none given)
    knot_pull_strength: float = math.inf  # N, the rated knot-pull strength: a segment pulled harder parts
                                          # (solver/breakage.py); inf: the thread never breaks

    @property
    def mass(self) -> float:
        """Total mass (kg)."""
        return self.linear_density * self.length

    @property
    def radius(self) -> float:
        """The thread's radius (m) where it touches something else (a pad, a tool): its contact radius, else half
        its diameter, else 0.1 mm."""
        return self.contact_radius or 0.5 * self.diameter or 1e-4


@dataclass(frozen=True)
class SolverSettings:
    """How the equations are solved; part of the model because a run's results depend on it."""
    method: str = "newton"        # "newton" (Eq. 13) or "contraction" (Eq. 10)
    tol: float = 1e-12            # max |psi_j| / l_j^2 at which the multiplier iteration stops
    max_iters: int = 50           # multiplier iterations per step
    tick: float = 1e-3            # s, one tick of the fixed-rate loop
    substeps: int = 0             # fixed substeps per tick; 0 = chosen each tick from the stability bound
    max_substeps: int = 32        # budget of automatic substeps; beyond it, selective mass scaling (stability.py)
    retry_substeps: int = 1024    # a tick that failed may be run again with up to this many (a transient overrun)
    stability_target: float = 1.0  # h * omega_max aimed for (the explicit limit is 2)
    scaled_mass_keeps: str = "energy"  # what a vertex keeps when mass scaling makes it heavier: "energy" or
                                       # "velocity" (docs/PHYSICS.md Sec. 6)
    mass_scaling: str = "local"   # how the scaling reads stiffness: "local" (each vertex's own hinges, pairs and
                                  # static tension) or "whole-thread" (as before 2026-11-27; docs/PHYSICS.md Sec. 6)


@dataclass(frozen=True)
class ContactSettings:
    """Self-contact (solver/contact_response.py); off unless a scenario turns it on. SI units."""
    enabled: bool = False
    stiffness: float = 0.0        # k_s, N/m (Wang 2017 Eq. 14)
    distance: float = 0.0         # Delta d, m: centre-line distance at which strands touch
    smooth: float = 0.0           # m, the rounded onset of the penalty
    min_gap: float = 0.0          # m, the no-crossing floor
    friction_static: float = 0.0
    friction_kinetic: float = 0.0
    skin: float = 0.0             # m, the neighbour list's margin beyond Delta d
    recover_speed: float = 0.1    # m/s, how fast the floor pushes apart strands that start a substep below it
    exclude: int = 1              # segments within this many of each other along the thread never pair
    max_pairs: int = 0            # neighbour-list capacity (0: 32 per segment)
    rounds: int = 32              # rounds of (no-crossing floor, friction, constraint solve) per substep at most
    polygon_friction: bool = True   # friction's normal force scaled so a polyline's capstan is a rope's
    settle: float = 1e-3          # friction has settled when a round moves no contact point more than this x min_gap
    warm_friction: bool = True    # each substep's friction starts from the force of the one before
    stall: float = 0.0            # the rounds end once a friction pass changes more than this x the pass before's

    def near_pairs_clear(self, rest_length: np.ndarray) -> bool:
        """Whether the pair one segment past the excluded ones lies clear of touching on a straight thread (the
        segments between it longer than the contact distance plus a tenth of the skin): only then does it
        count for the stability bound by its approach (contact_response.REACH_*). Where segments are as long
        as the contact distance (Wang 2017's knots) it touches at every fold and keeps half a skin: read by its
        approach, its spring flickered in and out of the bound and a 200-segment knot at 3 substeps jittered
        (median vertex speed 102 mm/s against 25; docs/PHYSICS.md Sec. 6)."""
        ex = self.exclude   # >= 1 (scenario.py)
        if rest_length.shape[0] < ex + 2:
            return False
        # the straight gap of the pair (a, a + ex + 1): the ex segments between them
        between = np.convolve(rest_length, np.ones(ex), mode="valid")[1:-1]
        return bool(between.min() > self.distance + 0.1 * self.skin)

    def par(self, near_reach: bool = True) -> np.ndarray:
        """The kernels' parameter vector (solver/contact_response.CP_*); ``near_reach``: the pair one segment
        past the excluded ones counts for the stability bound only as its approach brings it near (local mass
        scaling)."""
        return np.array([self.stiffness, self.distance, self.smooth, self.min_gap, self.friction_static,
                         self.friction_kinetic, self.skin, self.recover_speed, float(self.rounds),
                         float(self.polygon_friction), float(self.exclude + 1) if near_reach else 0.0,
                         self.settle, float(self.warm_friction), self.stall])


@dataclass
class ThreadModel:
    """Immutable during a run. Arrays are float64 unless noted; vertex arrays have n = segments + 1 rows."""
    params: ThreadParams
    solver: SolverSettings
    rest_length: np.ndarray       # (n-1,) m
    mass: np.ndarray              # (n,) kg, lumped: half of each adjacent segment
    inv_mass: np.ndarray          # (n,) 1/kg, 0 for kinematic (pinned or driven) vertices
    kinematic: np.ndarray         # (n,) int8, 1 = position prescribed
    hinge_k: np.ndarray           # (n,) J, K_i = 4 EI / (l_{i-1} + l_i); 0 at the ends (docs/PHYSICS.md)
    bend_gersh: np.ndarray        # (n,) N/m per vertex: Gershgorin row sum of the straight bending stiffness
    drag_quad: np.ndarray         # (n,) N*s^2/m^2
    drag_lin: np.ndarray          # (n,) N*s/m
    compliance: np.ndarray        # (n-1,) 1/N: 1/EA, 0 for an inextensible thread
    gravity: np.ndarray           # (3,) m/s^2
    twist_k: float                # N*m, GJ / L_bar with 2 L_bar = sum of (l_{i-1} + l_i) over hinges
    bending_dissipation: float    # J*s
    contact: ContactSettings = field(default_factory=ContactSettings)
    contact_par: np.ndarray = field(default_factory=lambda: ContactSettings().par())
    # scripted timeline (solver/motion.py): kind, index, start, end (s), velocity (m/s or rad/s)
    mot_kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mot_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    mot_t0: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mot_t1: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mot_vel: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    # tissue (solver/tissue.py): pads the thread collides with and punctures it slides through
    tissue_on: bool = False
    tissue_par: np.ndarray = field(default_factory=lambda: np.zeros(TP_COUNT))   # tissue.TP_*
    pads: np.ndarray = field(default_factory=lambda: np.zeros((0, PD_COUNT)))   # (P, tissue.PD_COUNT)
    pad_ids: tuple = ()
    # a needle swaged to vertex 0 (solver/needle.py)
    needle_on: bool = False
    needle_par: np.ndarray = field(default_factory=lambda: np.zeros(NP_COUNT))   # needle.NP_*

    @property
    def n_vertices(self) -> int:
        return self.mass.shape[0]

    @property
    def n_segments(self) -> int:
        return self.rest_length.shape[0]

    @property
    def method_code(self) -> int:
        return 1 if self.solver.method == "newton" else 0


@dataclass
class ThreadState:
    """Everything a step changes, plus scratch; allocated once by make_state."""
    x: np.ndarray                 # (n,3) m, positions at the current time
    x_prev: np.ndarray            # (n,3) m, positions one substep earlier
    h: np.ndarray                 # (1,) s, the substep that separates x_prev and x
    time: np.ndarray              # (1,) s
    tension: np.ndarray           # (n-1,) N, axial force of each segment (Wang 2017 Eq. 8)
    tension_in: np.ndarray        # (n-1,) N, the part of it the velocities make (inertial: grows with scaled masses)
    tension_floor: np.ndarray     # (n-1,) N, the tension the tick's mass scaling counts on each segment at least
    twist: np.ndarray             # (2,) rad: [total end-to-end twist Theta, accumulated input twist]
    kin_target: np.ndarray        # (n,3) m, where kinematic vertices are (driven by the timeline)
    ext_force: np.ndarray         # (n,3) N, external point forces
    grasp_vertex: np.ndarray      # (G,) int64, grasped vertex or -1
    grasp_frac: np.ndarray        # (G,) where along segment grasp_vertex the grasp holds, 0 <= f < 1: the point
                                  # (1 - f) x[v] + f x[v+1]; 0 = the vertex itself
    grasp_pad: np.ndarray         # (G,) int64, the tissue pad the grasp holds (its vertex then -1), or -1
    grasp_k: np.ndarray           # (G,) N/m, coupling stiffness
    grasp_c: np.ndarray           # (G,) N*s/m, coupling damping
    grasp_fmax: np.ndarray        # (G,) N, coupling force limit
    grasp_target: np.ndarray      # (G,3) m, target (stylus) position now
    grasp_target_prev: np.ndarray  # (G,3) m, target one substep earlier
    grasp_vel: np.ndarray         # (G,3) m/s, target velocity set by a live device (ramps a pose across a tick)
    grasp_force: np.ndarray       # (G,3) N, force the coupling applies to the thread
    grasp_sat: np.ndarray         # (G,) int8, 1 while the coupling force is at its limit
    stats: np.ndarray             # (STAT_SLOTS + N_TIMERS,) see STAT_* in solver/integrator.py
    inv_mass_tick: np.ndarray     # (n,) 1/kg, the inverse masses of the current tick (mass-scaled if needed)
    # self-contact (solver/contact_response.py): the neighbour list and what each pair carries between kernels
    cand_i: np.ndarray            # (P,) int64, first segment of each candidate pair
    cand_j: np.ndarray            # (P,) int64, second segment
    cand_s: np.ndarray            # (P,) closest-point parameter on cand_i, frozen at the substep's start
    cand_t: np.ndarray            # (P,) on cand_j
    cand_d: np.ndarray            # (P,) m, the pair's gap at the substep's start (at a rebuild: its distance)
    cand_n: np.ndarray            # (P,3) unit normal from cand_j to cand_i, frozen at the substep's start
    cand_f: np.ndarray            # (P,) N, normal force of the pair this substep (for friction)
    cand_fp: np.ndarray           # (P,) N, the no-crossing floor's force this substep
    cand_fa: np.ndarray           # (P,3) m, the change friction made to the pair's relative point this substep
    cand_ff: np.ndarray           # (P,3) N, friction's force on the pair in the substep before (the next one's warm
                                  # start: contact_response.warm_friction)
    cand_near: np.ndarray         # (P,) int64, the pairs the no-crossing floor may act on in a substep
                                  # (contact_response.floor_pairs)
    fp_kept: np.ndarray           # (P,) N, the floor forces at a substep's contact rounds' start (a substep the
                                  # crossing guard undoes gives them back)
    x_ref: np.ndarray             # (n,3) m, positions the list was built at (inf: build before the next substep)
    contact_k: np.ndarray         # (n,) N/m, Gershgorin row sums of the contact springs that may act within the
                                  # coming tick (stability bound and mass scaling before it)
    contact_k_act: np.ndarray     # (n,) N/m, the same for the springs that acted in the last substep (the check after it)
    turn: np.ndarray              # (n,) rad, the thread's turn at each vertex this substep (polygon friction)
    fold: np.ndarray              # (n,) each hinge's stiffening factor (stability.hinge_factors, scratch)
    contact_stats: np.ndarray     # (CS_SIZE,) see CS_* in solver/contact_response.py
    grid_head: np.ndarray
    grid_next: np.ndarray
    grid_cells: np.ndarray
    grid_scratch: np.ndarray
    alpha_extra: np.ndarray       # (n-1,) multipliers of the re-solve after the no-crossing floor
    old_j: np.ndarray             # (P,) int64, scratch of a neighbour-list rebuild (contact_response.py)
    old_n: np.ndarray
    old_fp: np.ndarray
    old_ff: np.ndarray
    old_next: np.ndarray
    seg_head: np.ndarray          # (n-1,) int64
    # tissue (solver/tissue.py)
    pst: np.ndarray               # (P, tissue.PS_COUNT) the pads' centres, velocities and the thread's pull
    pun_i: np.ndarray             # (MAX_PUNCTURES, tissue.PI_COUNT) int64: state, pad, mate of each puncture
    pun_f: np.ndarray             # (MAX_PUNCTURES, tissue.PF_COUNT): where it is, on the pad and on the thread
    nst: np.ndarray               # (needle.NS_COUNT,) the needle's orientation, its stylus's, the torque
    tool_cap: np.ndarray          # (instruments.MAX_CAPSULES, instruments.TC_COUNT) the tools' jaws and shafts
    # the thread's breaks (solver/breakage.py)
    parted: np.ndarray            # (n-1,) int8, 1 = the segment broke: no constraint, bending or contact across it
    breakage: np.ndarray          # (breakage.BK_COUNT,) int64: segments parted, ticks running over the strength
    # scratch
    force: np.ndarray
    twist_grad: np.ndarray
    xbar: np.ndarray
    w_eff: np.ndarray
    edges: np.ndarray
    elen: np.ndarray
    new_edges: np.ndarray
    alpha: np.ndarray
    tri_lo: np.ndarray
    tri_di: np.ndarray
    tri_up: np.ndarray
    tri_rhs: np.ndarray
    tri_cp: np.ndarray
    again_len: np.ndarray         # (n-1,) m, the target lengths of a solve again (integrator.solve_again)
    again_compliance: np.ndarray  # (n-1,) 1/N, and its compliances
    closest: np.ndarray           # (3,) the closest points of two segments (contact.segment_closest)

    def __post_init__(self) -> None:
        self._carry, self._scratch, self._layout = _pack(self)

    # pickling (a scene built in a worker process) and deepcopy take the arrays one by one; the copy packs them
    # again, so its arrays are views of its own buffers, not independent copies
    def __getstate__(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def copy(self) -> "ThreadState":
        return copy.deepcopy(self)

    def packed(self) -> tuple:
        """(carried float64, scratch float64, carried int64, scratch int64, carried int8, layout): the five
        buffers every field is a view of, and where each lies in them, one row per field in STATE_FIELDS order
        (buffer BUF_*, offset, rows, columns; 1 column for a vector). A kernel handed these rebuilds the fields
        as views (integrator.advance_state): six arguments instead of one per array (numba unboxes each array
        argument on every call, about 0.1 us each, and the step reads 68 of the state's). TickCopy copies the
        carried buffers whole."""
        cf, ci, cb = self._carry
        sf, si = self._scratch
        return cf, sf, ci, si, cb, self._layout

    def copy_into(self, other: "ThreadState") -> None:
        """Overwrite ``other``'s arrays in place (no allocation): how reset restores the initial state."""
        for f in fields(self):
            np.copyto(getattr(other, f.name), getattr(self, f.name))


# What a tick writes before it reads: the contact grid and a rebuild's carry-over of the old list. A copy taken
# to run a tick again leaves them out, and takes of the neighbour list only the pairs its count covers (with
# both, the copy is about 0.1 MB rather than 0.4 MB for 80 segments, and a quarter of the time).
TICK_SCRATCH = frozenset(("grid_head", "grid_next", "grid_cells", "grid_scratch", "old_j", "old_n", "old_fp", "old_ff",
                          "old_next", "seg_head", "turn", "fold", "cand_near", "fp_kept", "again_len",
                          "again_compliance", "closest"))
NEIGHBOUR_LIST = ("cand_i", "cand_j", "cand_s", "cand_t", "cand_d", "cand_n", "cand_f", "cand_fp", "cand_fa",
                  "cand_ff")


# the buffers of ThreadState.packed, and the dtypes each kind of field is kept in
BUF_CARRIED_F, BUF_SCRATCH_F, BUF_CARRIED_I, BUF_SCRATCH_I, BUF_CARRIED_B = range(5)
_CARRIED_BUFFERS = ((np.dtype(np.float64), BUF_CARRIED_F), (np.dtype(np.int64), BUF_CARRIED_I),
                    (np.dtype(np.int8), BUF_CARRIED_B))
_SCRATCH_BUFFERS = ((np.dtype(np.float64), BUF_SCRATCH_F), (np.dtype(np.int64), BUF_SCRATCH_I))
STATE_FIELDS = tuple(f.name for f in fields(ThreadState))


def _pack(state: ThreadState) -> tuple:
    """Move every field into one buffer per dtype and kind, each field becoming a view of it (same shape,
    C-contiguous, so the kernels see the same types). Returns (carried buffers, scratch buffers, layout).

    Carried: every array a tick carries over (all but TICK_SCRATCH and NEIGHBOUR_LIST). Copying a tick's start is
    then one kernel call over the buffers (TickCopy) instead of one call per array: the copy runs every tick, and
    for a thread of a few hundred segments a call's overhead, paid once per array, costs more than the bytes it
    moves. Scratch: the rest. The layout (ThreadState.packed)
    lets a kernel take the buffers instead of the fields."""
    skip = TICK_SCRATCH.union(NEIGHBOUR_LIST)
    layout = np.zeros((len(STATE_FIELDS), 4), np.int64)
    carried = _pack_group(state, [n for n in STATE_FIELDS if n not in skip], _CARRIED_BUFFERS, layout)
    scratch = _pack_group(state, [n for n in STATE_FIELDS if n in skip], _SCRATCH_BUFFERS, layout)
    return carried, scratch, layout


def _pack_group(state: ThreadState, names: list, kinds: tuple, layout: np.ndarray) -> tuple:
    values = {name: getattr(state, name) for name in names}
    for name, value in values.items():
        if value.dtype not in [d for d, _ in kinds] or value.ndim not in (1, 2):
            raise TypeError(f"ThreadState.{name}: a {value.ndim}-d {value.dtype} array cannot be packed")
    buffers = []
    for dtype, buf_id in kinds:
        members = [(name, v) for name, v in values.items() if v.dtype == dtype]
        buf = np.empty(sum(v.size for _, v in members), dtype=dtype)
        at = 0
        for name, value in members:
            view = buf[at:at + value.size].reshape(value.shape)
            view[...] = value
            setattr(state, name, view)
            layout[STATE_FIELDS.index(name)] = (buf_id, at, value.shape[0], value.shape[1] if value.ndim == 2 else 1)
            at += value.size
        buffers.append(buf)
    return tuple(buffers)


_LIST_ROWS = tuple(STATE_FIELDS.index(name) for name in NEIGHBOUR_LIST)


@njit(cache=True, error_model="numpy")
def _copy_tick(cf, ci, cb, sf, si, to_cf, to_ci, to_cb, to_sf, to_si, lay, count) -> None:
    """The carried buffers whole, and of the neighbour list the first ``count`` pairs (rows past the count are
    never read: a rebuild writes them before the count covers them), from one packed state into another of the
    same layout."""
    to_cf[:] = cf
    to_ci[:] = ci
    to_cb[:] = cb
    for k in _LIST_ROWS:
        o = lay[k, 1]
        size = count * lay[k, 3]
        if lay[k, 0] == BUF_SCRATCH_F:
            to_sf[o:o + size] = sf[o:o + size]
        else:
            to_si[o:o + size] = si[o:o + size]


class TickCopy:
    """Copies what a tick starts from, ``src`` into ``dst`` (two states of one model), allocating nothing: the
    Stepper's backup of the state before a tick, and its restore for a tick run again. One kernel call."""

    def __init__(self, src: ThreadState, dst: ThreadState):
        cf, sf, ci, si, cb, lay = src.packed()
        to_cf, to_sf, to_ci, to_si, to_cb, to_lay = dst.packed()
        if not np.array_equal(lay, to_lay):
            raise ValueError("TickCopy: the two states are not of one model (their layouts differ)")
        self._args = (cf, ci, cb, sf, si, to_cf, to_ci, to_cb, to_sf, to_si, lay)
        self._count = src.contact_stats

    def __call__(self) -> None:
        _copy_tick(*self._args, int(self._count[CS_COUNT]))


def lumped_masses(rest_length: np.ndarray, linear_density: float) -> np.ndarray:
    """Vertex masses (kg): each segment's mass split equally between its two vertices."""
    n = rest_length.shape[0] + 1
    m = np.zeros(n)
    seg = linear_density * rest_length
    m[:-1] += 0.5 * seg
    m[1:] += 0.5 * seg
    return m


def build_model(params: ThreadParams, solver: SolverSettings, gravity=(0.0, 0.0, -9.81),
                kinematic_vertices=(), rest_length: np.ndarray | None = None,
                timeline: dict | None = None, contact: ContactSettings | None = None) -> ThreadModel:
    """Make the model of a thread with equal segments (or the given rest lengths, m)."""
    ns = params.segments
    if rest_length is None:
        rest_length = np.full(ns, params.length / ns)
    rest_length = np.asarray(rest_length, dtype=np.float64)
    n = ns + 1
    mass = lumped_masses(rest_length, params.linear_density)
    kin = np.zeros(n, np.int8)
    for v in kinematic_vertices:
        kin[v] = 1
    inv_mass = np.where(kin == 1, 0.0, 1.0 / mass)

    # Voronoi length of each vertex (m): half of each adjacent segment.
    vor = np.zeros(n)
    vor[:-1] += 0.5 * rest_length
    vor[1:] += 0.5 * rest_length

    # Bending: E_i = K_i tan^2(phi_i/2) with K_i = 4 EI / (l_{i-1} + l_i) -> 1/2 EI kappa^2 over the Voronoi
    # length (docs/PHYSICS.md); Wang 2017 Eq. 3's k_b equals K_i.
    hinge_k = np.zeros(n)
    hinge_k[1:-1] = 4.0 * params.bending_stiffness / (rest_length[:-1] + rest_length[1:])

    # Gershgorin bound of the linearised bending stiffness: hinge i has energy (K_i/2) phi^2 / 2 ... i.e.
    # stiffness c_i = K_i / 2 on phi ~ g . y with g = [1/l_a, -(1/l_a + 1/l_b), 1/l_b].
    bend_gersh = np.zeros(n)
    for i in range(1, n - 1):
        la, lb = rest_length[i - 1], rest_length[i]
        g = np.array([1.0 / la, -(1.0 / la + 1.0 / lb), 1.0 / lb])
        c = 0.5 * hinge_k[i]
        row = c * np.abs(g) * np.abs(g).sum()
        bend_gersh[i - 1:i + 2] += row

    l_bar = 0.5 * float(np.sum(rest_length[:-1] + rest_length[1:])) if ns > 1 else float(rest_length.sum())
    twist_k = params.twisting_stiffness / l_bar if l_bar > 0 else 0.0
    compliance = np.zeros(ns) if not params.extensible else np.full(ns, 1.0 / params.stretch_stiffness)

    tl = timeline or {}
    contact = contact or ContactSettings()
    return ThreadModel(
        params=params, solver=solver, rest_length=rest_length, mass=mass, inv_mass=inv_mass, kinematic=kin,
        hinge_k=hinge_k, bend_gersh=bend_gersh, drag_quad=params.air_drag * vor,
        drag_lin=params.air_drag_linear * vor, compliance=compliance,
        gravity=np.asarray(gravity, dtype=np.float64), twist_k=twist_k,
        bending_dissipation=params.bending_dissipation, contact=contact,
        contact_par=contact.par(solver.mass_scaling == "local" and contact.near_pairs_clear(rest_length)),
        mot_kind=np.asarray(tl.get("kind", np.zeros(0)), np.int64),
        mot_index=np.asarray(tl.get("index", np.zeros(0)), np.int64),
        mot_t0=np.asarray(tl.get("t0", np.zeros(0)), np.float64),
        mot_t1=np.asarray(tl.get("t1", np.zeros(0)), np.float64),
        mot_vel=np.asarray(tl.get("vel", np.zeros((0, 3))), np.float64).reshape(-1, 3),
    )


def make_state(model: ThreadModel, x0: np.ndarray, v0: np.ndarray | None = None,
               twist0: float = 0.0) -> ThreadState:
    """Allocate a state at positions x0 (n,3) m with velocities v0 (n,3) m/s (x_prev = x0 - v0 h)."""
    n = model.n_vertices
    ns = model.n_segments
    x0 = np.ascontiguousarray(x0, dtype=np.float64).reshape(n, 3)
    h0 = model.solver.tick / max(model.solver.substeps, 1)
    v = np.zeros((n, 3)) if v0 is None else np.asarray(v0, np.float64).reshape(n, 3)
    v = np.where(model.kinematic[:, None] == 1, 0.0, v)
    z = lambda *s: np.zeros(s)  # noqa: E731
    c = model.contact
    cap = (c.max_pairs or 32 * ns) if c.enabled else 0
    return ThreadState(
        x=x0.copy(), x_prev=x0 - v * h0, h=np.array([h0]), time=np.zeros(1), tension=z(ns), tension_in=z(ns), tension_floor=z(ns),
        twist=np.array([twist0, 0.0]), kin_target=x0.copy(), ext_force=z(n, 3),
        grasp_vertex=np.full(MAX_GRASPS, -1, np.int64), grasp_frac=z(MAX_GRASPS),
        grasp_pad=np.full(MAX_GRASPS, -1, np.int64), grasp_k=z(MAX_GRASPS),
        grasp_c=z(MAX_GRASPS),
        grasp_fmax=np.full(MAX_GRASPS, np.inf), grasp_target=z(MAX_GRASPS, 3),
        grasp_target_prev=z(MAX_GRASPS, 3), grasp_vel=z(MAX_GRASPS, 3), grasp_force=z(MAX_GRASPS, 3),
        grasp_sat=np.zeros(MAX_GRASPS, np.int8), stats=z(STAT_SLOTS + N_TIMERS),
        inv_mass_tick=model.inv_mass.copy(),
        force=z(n, 3), twist_grad=z(n, 3), xbar=z(n, 3), w_eff=z(n), edges=z(ns, 3), elen=z(ns),
        new_edges=z(ns, 3), alpha=z(ns), tri_lo=z(ns), tri_di=z(ns), tri_up=z(ns), tri_rhs=z(ns),
        tri_cp=z(ns), again_len=z(ns), again_compliance=z(ns), closest=z(3),
        cand_i=np.zeros(cap, np.int64), cand_j=np.zeros(cap, np.int64), cand_s=z(cap), cand_t=z(cap),
        cand_d=z(cap), cand_n=z(cap, 3), cand_f=z(cap), cand_fp=z(cap), cand_fa=z(cap, 3), cand_ff=z(cap, 3),
        cand_near=np.zeros(cap, np.int64), fp_kept=z(cap), x_ref=np.full((n, 3), np.inf),
        contact_k=z(n), contact_k_act=z(n), turn=z(n), fold=z(n), contact_stats=z(CS_SIZE), grid_head=np.zeros(2 * ns + 1, np.int64),
        grid_next=np.zeros(ns, np.int64), grid_cells=np.zeros((ns, 3), np.int64), grid_scratch=z(3),
        alpha_extra=z(ns), old_j=np.zeros(cap, np.int64), old_n=z(cap, 3), old_fp=z(cap), old_ff=z(cap, 3),
        old_next=np.zeros(cap, np.int64), seg_head=np.zeros(ns, np.int64),
        pst=_pad_state(model.pads), pun_i=_no_punctures(), pun_f=z(MAX_PUNCTURES, PF_COUNT), nst=_needle_state(),
        tool_cap=tool_capsules(), parted=np.zeros(ns, np.int8), breakage=np.zeros(2, np.int64),
    )


def _needle_state() -> np.ndarray:
    nst = np.zeros(NS_COUNT)
    nst[NS_Q] = nst[NS_QT] = 1.0   # identity orientations
    return nst


def _pad_state(pads: np.ndarray) -> np.ndarray:
    pst = np.zeros((pads.shape[0], PS_COUNT))
    pst[:, PS_X:PS_X + 3] = pads[:, PD_REST:PD_REST + 3]
    return pst


def _no_punctures() -> np.ndarray:
    pun_i = np.zeros((MAX_PUNCTURES, PI_COUNT), np.int64)
    pun_i[:, PI_MATE] = -1
    return pun_i
