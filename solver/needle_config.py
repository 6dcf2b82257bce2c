"""The `needle:` section of a scenario (docs/SCENARIOS.md): a curved needle swaged to the thread's vertex 0.

A needle is given by its length along the arc and the fraction of a circle it spans, as suture needles are
sold (a "3/8-circle 12 mm" needle: arc 135 degrees, radius 12 mm / (3 pi / 4) = 5.09 mm), or by `radius` and
`arc` (degrees). Checked before anything runs; every error names the file, key and reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import Section
from .needle import (NP_ARC, NP_C_ROT, NP_COUNT, NP_INERTIA, NP_K_ROT, NP_MASS, NP_MAX_TORQUE, NP_RADIUS,
                     NP_WIRE)

# Shipped needle shapes: (fraction of a circle, length along the arc in m)
NEEDLE_PRESETS = {"3/8-12mm": (3.0 / 8.0, 0.012), "1/2-17mm": (0.5, 0.017), "3/8-19mm": (3.0 / 8.0, 0.019)}


@dataclass
class NeedleSpec:
    par: np.ndarray          # needle.NP_*
    grasp: str | None        # the grasp on vertex 0 whose stylus holds the needle at the start, if any (a
                             # tool's jaw may take it later: the rotational coupling acts whenever one holds it)
    orientation: np.ndarray  # (4,) w, x, y, z: body to world at t = 0


def read_needle(sec: Section | None, grasps: dict, kinematic: list[int]) -> NeedleSpec | None:
    """Validate the `needle:` section (None if absent). ``grasps`` maps grasp id to its GraspSpec."""
    if sec is None:
        return None
    par = np.zeros(NP_COUNT)
    if sec.has("preset"):
        name = sec.get("preset", str, choices=tuple(NEEDLE_PRESETS))
        for key in ("radius", "arc", "length", "circle"):
            if sec.has(key):
                raise sec.error(key, f"the preset {name!r} gives the needle's shape; give one or the other")
        circle, length = NEEDLE_PRESETS[name]
        arc = 2.0 * math.pi * circle
        radius = length / arc
    elif sec.has("length") or sec.has("circle"):
        length = sec.get("length", float, above=0.0, maxval=0.2)
        circle = sec.get("circle", float, above=0.0, maxval=0.75)
        arc = 2.0 * math.pi * circle
        radius = length / arc
    else:
        radius = sec.get("radius", float, above=0.0, maxval=0.1)
        arc = math.radians(sec.get("arc", float, above=0.0, maxval=270.0))
    par[NP_RADIUS] = radius
    par[NP_ARC] = arc
    par[NP_MASS] = sec.get("mass", float, 3e-5, above=0.0, maxval=0.01)
    par[NP_INERTIA] = par[NP_MASS] * radius * radius
    par[NP_WIRE] = 0.5 * sec.get("wire_diameter", float, 4e-4, above=0.0, maxval=0.005)
    par[NP_K_ROT] = sec.get("rotational_stiffness", float, 0.05, minval=0.0, maxval=100.0)
    par[NP_C_ROT] = sec.get("rotational_damping", float, 2e-4, minval=0.0, maxval=10.0)
    # a needle holder's grip slips at some tens of mN m (a 6-DoF stylus renders ~0.1 N m at most)
    par[NP_MAX_TORQUE] = sec.get("max_torque", float, 0.02, above=0.0, maxval=10.0)
    q = np.array(sec.vector("orientation", 4, [1.0, 0.0, 0.0, 0.0]))
    if np.linalg.norm(q) < 1e-9:
        raise sec.error("orientation", "must be a nonzero quaternion [w, x, y, z]")
    grasp = sec.get("grasp", str, None) if sec.has("grasp") else None
    if grasp is not None:
        if grasp not in grasps:
            raise sec.error("grasp", f"no grasp {grasp!r} in boundary.grasps")
        if grasps[grasp].vertex != 0:
            raise sec.error("grasp", f"grasp {grasp!r} holds vertex {grasps[grasp].vertex}; the needle is swaged to "
                                     "vertex 0, so its grasp must hold vertex 0")
    if 0 in kinematic:
        raise sec.error("grasp", "vertex 0 is pinned or driven; the needle's swage must be free to move")
    sec.finish()
    return NeedleSpec(par=par, grasp=grasp, orientation=q / np.linalg.norm(q))
