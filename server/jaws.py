"""A tool's jaw: what its grasp button closes on, and how what it holds follows the tool.

Each stylus drives a tool whose jaw is at the tool's tip (the stylus through its workspace mapping and clutch,
server/device.py). Closing the jaw takes, of what lies within its reach (``grasp_radius``), by priority and then
distance:

1. the **needle**, anywhere along its arc (the swage is the arc's start, so it belongs to the needle): the jaw
   keeps the needle's pose relative to it as it was when the jaw closed, position and orientation. The needle's
   position is its swage (the thread's vertex 0, solver/needle.py), so the jaw's grasp couples vertex 0 to the
   point the held pose puts the swage at, ``p_jaw + q_jaw r``, and the needle's rotational coupling turns it
   toward ``q_jaw q_r`` (``r``, ``q_r``: the swage's position and the needle's orientation in the jaw's frame
   at the closing). A needle held a third of the way from the swage turns about the jaw, as a driver turns it.
2. the **thread**, at the closest point along any segment (a grasp holds a point ``(1 - f) x_v + f x_v+1``);
3. with forceps (``tool: forceps``), a **tissue pad** whose surface is within reach (an edge held and presented):
   the jaw keeps the offset from it to the pad's centre, and the pad follows the jaw through a coupling
   (solver/tissue.py step_pads).

Units: SI; quaternions (w, x, y, z), body or jaw to world.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..solver.instruments import (SH_COUNT, SH_JAW_LENGTH, SH_JAW_RADIUS, SH_MU_K, SH_MU_S, SH_SHAFT_LENGTH,
                                   SH_SHAFT_RADIUS)
from ..solver.needle import NP_ARC, NP_RADIUS, NS_Q
from ..solver.tissue import PD_HALF, PS_X
from .device import python_floats, quat_mul as mul

KIND_NEEDLE = "needle"
KIND_THREAD = "thread"
KIND_TISSUE = "tissue"


@dataclass(frozen=True)
class ToolShape:
    """A tool's body as the thread meets it (solver/instruments.py): its jaw, a capsule from the tip back to
    the hinge, and its shaft, a capsule from the hinge back toward the hand, both along the tool's axis (its
    body +z, OpenHaptics' stylus axis); and the thread's Coulomb friction on them. Lengths and radii in m."""
    jaw_length: float
    jaw_radius: float
    shaft_length: float
    shaft_radius: float
    mu_static: float
    mu_kinetic: float
    par: np.ndarray = field(init=False, repr=False, compare=False)   # the same as instruments.SH_* reads it

    def __post_init__(self) -> None:
        par = np.zeros(SH_COUNT)
        par[SH_JAW_LENGTH], par[SH_JAW_RADIUS] = self.jaw_length, self.jaw_radius
        par[SH_SHAFT_LENGTH], par[SH_SHAFT_RADIUS] = self.shaft_length, self.shaft_radius
        par[SH_MU_S], par[SH_MU_K] = self.mu_static, self.mu_kinetic
        object.__setattr__(self, "par", par)


# A needle driver's closed jaws are about 2 mm across and 12 mm long; fine forceps' about 1.5 mm and 10 mm; both
# shafts are taken as 5 and 4 mm rods 10 cm long. The friction of silk on steel is not measured here: the
# tools take the thread's own coefficients on itself (configs/threads/silk-3-0.yaml, 0.30 and 0.25). A hand has
# no shape here: the thread does not meet it.
SHAPES = {"needle_driver": ToolShape(0.012, 0.001, 0.10, 0.0025, 0.30, 0.25),
          "forceps": ToolShape(0.010, 0.00075, 0.10, 0.002, 0.30, 0.25)}


def held_segments(kind: str, vertex: int, hold_offset: float, rest: float, n_segments: int,
                  shape: ToolShape) -> tuple[int, int]:
    """The thread segments a jaw holding ``kind`` does not meet (first, last), (-1, -1) for none: for the
    thread held at segment ``vertex``, the segments within the jaw's radius of the held point each way along
    the thread (the held point is on the jaw's axis); for the needle, the thread's first segments up to the
    swage's distance ``hold_offset`` (m) from the jaw and the two that leave the swage (the needle's own
    THREAD_SKIP). ``rest``: a segment's length (m)."""
    if kind == KIND_THREAD:
        k = int(math.ceil(shape.jaw_radius / rest)) + 1
        return max(vertex - k, 0), min(vertex + k, n_segments - 1)
    if kind == KIND_NEEDLE:
        return 0, min(int(math.ceil(hold_offset / rest)) + 2, n_segments - 1)
    return -1, -1


def rotate(q, v) -> tuple[float, float, float]:
    """``v`` (3) turned by the unit quaternion ``q`` (w, x, y, z): q v q^-1."""
    w, x, y, z = python_floats(q)
    vx, vy, vz = python_floats(v)
    # t = 2 (q_xyz x v); v' = v + w t + q_xyz x t
    tx = 2.0 * (y * vz - z * vy)
    ty = 2.0 * (z * vx - x * vz)
    tz = 2.0 * (x * vy - y * vx)
    return (vx + w * tx + (y * tz - z * ty),
            vy + w * ty + (z * tx - x * tz),
            vz + w * tz + (x * ty - y * tx))


def conj(q) -> tuple[float, float, float, float]:
    """The inverse of a unit quaternion."""
    return float(q[0]), -float(q[1]), -float(q[2]), -float(q[3])


def _unit(q) -> tuple[float, float, float, float]:
    n = math.sqrt(sum(float(v) * float(v) for v in q))
    return tuple(float(v) / n for v in q)


@dataclass(eq=False)
class Hold:
    """How a jaw carries what its grasp holds, kept by grasp id beside the grasp (whose GraspSpec.kind says what
    it is): the needle's pose in the jaw's frame, or a pad's centre from the jaw. A jaw on the thread needs none:
    the grasp's target follows the jaw itself."""
    kind: str                                   # KIND_NEEDLE or KIND_TISSUE
    offset: np.ndarray = field(default_factory=lambda: np.zeros(3))   # m: the swage in the jaw's frame (needle),
                                                                       # or the pad's centre from the jaw (tissue)
    q_rel: np.ndarray = field(default_factory=lambda: np.array([1.0, 0.0, 0.0, 0.0]))   # the needle in it
    jaw_quat: np.ndarray = field(default_factory=lambda: np.array([1.0, 0.0, 0.0, 0.0]))  # the jaw's, last known
    goal: np.ndarray = field(default_factory=lambda: np.zeros(3))     # m, scene: where the grasp's target is led

    def follow(self, jaw: np.ndarray, nst: np.ndarray, qt: int) -> None:
        """The jaw is at ``jaw`` (m) turned ``jaw_quat``: the needle's swage goal ``p_jaw + q_jaw r`` into
        ``goal`` and its orientation target ``q_jaw q_r`` into ``nst[qt:qt+4]``; a pad's centre goal
        ``p_jaw + offset``."""
        if self.kind == KIND_TISSUE:   # a pad does not turn: its centre keeps its offset from the jaw
            self.goal[:] = jaw + self.offset
            return
        rx, ry, rz = rotate(self.jaw_quat, self.offset)
        self.goal[0] = float(jaw[0]) + rx
        self.goal[1] = float(jaw[1]) + ry
        self.goal[2] = float(jaw[2]) + rz
        q = mul(self.jaw_quat, self.q_rel)
        nst[qt], nst[qt + 1], nst[qt + 2], nst[qt + 3] = q

    def details(self) -> dict:
        """What a `grasp` event says of it beyond the grasp's own fields (a resimulation rebuilds it from them)."""
        if self.kind == KIND_TISSUE:
            return {"holds": self.kind, "offset": [float(v) for v in self.offset]}
        return {"holds": self.kind, "offset": [float(v) for v in self.offset],
                "q_rel": [float(v) for v in self.q_rel], "jaw_quat": [float(v) for v in self.jaw_quat]}

    @classmethod
    def recorded(cls, e: dict, goal: np.ndarray) -> Hold | None:
        """The hold a recorded `grasp` event ``e`` describes (what :meth:`details` wrote), its goal starting at
        ``goal`` (m: the held swage or pad centre, as when the jaw closed); None for a grasp without one."""
        if e.get("holds") not in (KIND_NEEDLE, KIND_TISSUE) or "offset" not in e:
            return None
        h = cls(e["holds"])
        h.offset[:] = e["offset"]
        if h.kind == KIND_NEEDLE:
            h.q_rel[:] = e["q_rel"]
            h.jaw_quat[:] = e["jaw_quat"]
        h.goal[:] = goal
        return h


def needle_hold(jaw: np.ndarray, jaw_quat, swage: np.ndarray, needle_quat) -> Hold:
    """The hold of a jaw at ``jaw`` (m) turned ``jaw_quat`` closing on the needle whose swage is at ``swage``
    (m) turned ``needle_quat``: ``r = q_jaw^-1 (swage - p_jaw)``, ``q_r = q_jaw^-1 q_needle``."""
    qj = _unit(jaw_quat)
    inv = conj(qj)
    h = Hold(KIND_NEEDLE)
    h.offset[:] = rotate(inv, np.asarray(swage, float) - np.asarray(jaw, float))
    h.q_rel[:] = _unit(mul(inv, _unit(needle_quat)))
    h.jaw_quat[:] = qj
    h.goal[:] = swage
    return h


def needle_in_reach(x0: np.ndarray, nst: np.ndarray, npar: np.ndarray, jaw: np.ndarray) -> tuple[float, float]:
    """(distance m, arc angle rad from the swage) of the needle's point closest to ``jaw``: the arc
    ``R (sin t, 1 - cos t, 0)``, 0 <= t <= A, in the needle's body frame (solver/needle.py)."""
    radius, arc = float(npar[NP_RADIUS]), float(npar[NP_ARC])
    bx, by, bz = rotate(conj(nst[NS_Q:NS_Q + 4]), np.asarray(jaw, float) - x0)
    theta = min(max(math.atan2(bx, radius - by), 0.0), arc)
    ax, ay = radius * math.sin(theta), radius * (1.0 - math.cos(theta))
    return math.sqrt((bx - ax) ** 2 + (by - ay) ** 2 + bz * bz), theta


def thread_in_reach(x: np.ndarray, kinematic: np.ndarray, jaw: np.ndarray) -> tuple[float, int, float]:
    """(distance m, segment v, fraction f) of the thread's point closest to ``jaw`` on a segment neither of
    whose ends is pinned or driven: the point ``(1 - f) x_v + f x_v+1``, 0 <= f < 1 (a point at a segment's
    end is its next segment's start). (inf, -1, 0) if there is none. Allocates: a button press, not a tick."""
    a, b = x[:-1], x[1:]
    e = b - a
    ee = np.einsum("ij,ij->i", e, e)
    t = np.clip(np.einsum("ij,ij->i", np.asarray(jaw, float) - a, e) / np.where(ee > 0.0, ee, 1.0), 0.0, 1.0)
    d2 = ((a + t[:, None] * e - jaw) ** 2).sum(axis=1)
    k = kinematic.astype(bool)
    d2[k[:-1] | k[1:]] = np.inf
    v = int(np.argmin(d2))
    if not math.isfinite(d2[v]):
        return math.inf, -1, 0.0
    dist, f = math.sqrt(float(d2[v])), float(t[v])
    if f >= 1.0:   # the segment's end: its vertex v+1 (free, since the segment is), held as a vertex
        v, f = v + 1, 0.0
    return dist, v, f


def pad_in_reach(pads: np.ndarray, pst: np.ndarray, jaw: np.ndarray) -> tuple[float, int]:
    """(distance m, pad) of the pad whose box surface is closest to ``jaw`` (0 inside it): pads are axis-aligned
    boxes of half extents ``pads[p, PD_HALF:]`` centred at ``pst[p, PS_X:]`` (solver/tissue.py). (inf, -1)
    without pads."""
    best, which = math.inf, -1
    for p in range(pads.shape[0]):
        out = np.maximum(np.abs(np.asarray(jaw, float) - pst[p, PS_X:PS_X + 3]) - pads[p, PD_HALF:PD_HALF + 3], 0.0)
        d = float(np.sqrt((out * out).sum()))
        if d < best:
            best, which = d, p
    return best, which


def tissue_hold(jaw: np.ndarray, centre: np.ndarray) -> Hold:
    """The hold of a jaw at ``jaw`` (m) closing on a pad centred at ``centre`` (m): the pad's centre kept at
    ``jaw + (centre - jaw at the closing)``."""
    h = Hold(KIND_TISSUE)
    h.offset[:] = np.asarray(centre, float) - np.asarray(jaw, float)
    h.goal[:] = centre
    return h
