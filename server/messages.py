"""Wire payloads (server/protocol.py) built from a solver state: what the thread looks like and what each
device feels. Shared by the headless runner and the daemon so both publish the same bytes for the same state."""
from __future__ import annotations

import numpy as np

from ..solver import diagnostics
from ..solver.forces import constraint_force_at
from ..solver.integrator import STAT_MAX_ITERS, STAT_MAX_RESIDUAL, STAT_SUBSTEPS
from ..solver.scenario import Scenario
from ..solver.model import ThreadState
from . import protocol


class MessageBuilder:
    """Encodes `state` and `force` payloads for one scenario; holds its small scratch buffers. ``grasps`` is
    the live list of grasps (the daemon adds and removes grasps at run time); default: the scenario's."""

    def __init__(self, scenario: Scenario, grasps: list | None = None):
        self.scenario = scenario
        self.grasps = scenario.grasps if grasps is None else grasps
        self._axial = np.zeros(3)

    def axial(self, state: ThreadState, vertex: int) -> float:
        """Magnitude (N) of the thread's net axial constraint force at ``vertex``."""
        return constraint_force_at(state.x, state.tension, vertex, self._axial)

    def state(self, seq: int, state: ThreadState, contacts: int = 0) -> bytes:
        """The `state` payload (DESIGN.md): positions, tensions (N), twist (rad), grasps, energies (J)."""
        grasps = [{"id": g.id, "vertex": g.vertex, "device": g.device,
                   "pos": state.grasp_target[g.slot], "force": state.grasp_force[g.slot]}
                  for g in self.grasps]
        solver = {"iters": int(state.stats[STAT_MAX_ITERS]), "residual": float(state.stats[STAT_MAX_RESIDUAL]),
                  "substeps": int(state.stats[STAT_SUBSTEPS])}
        return protocol.encode_state(seq, float(state.time[0]), state.x, state.tension, float(state.twist[0]),
                                     grasps, contacts, diagnostics.energies(self.scenario.model, state), solver)

    def forces(self, seq: int, state: ThreadState) -> list[bytes]:
        """One `force` payload per grasp (device = the grasp's device; force = the reaction the stylus feels,
        minus the coupling force on the thread) and per externally loaded vertex (device "vertex<i>", force =
        the applied load). `axial` is the magnitude of the thread's net constraint force at that vertex (N)."""
        out = []
        t = float(state.time[0])
        for g in self.grasps:
            axial = self.axial(state, g.vertex)
            out.append(protocol.encode_force(seq, t, g.device, state.grasp_target[g.slot],
                                             -state.grasp_force[g.slot], axial, 0))
        for v in self.scenario.force_vertices:
            axial = self.axial(state, v)
            out.append(protocol.encode_force(seq, t, f"vertex{v}", state.x[v], state.ext_force[v], axial, 0))
        return out
