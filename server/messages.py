"""Wire payloads (server/protocol.py) built from a solver state: what the thread looks like and what each
device feels. Shared by the headless runner and the daemon so both publish the same bytes for the same state."""
from __future__ import annotations

import math

import numpy as np

from ..haptics.safety import SafetyConfig
from ..solver import diagnostics
from ..solver.breakage import whole
from ..solver.forces import constraint_force_at
from ..solver.contact_response import CS_CONTACTS, CS_COUNT, CS_OVERFLOW, CS_PENETRATION, CS_PROJECTIONS
from ..solver.instruments import CAPSULES_PER_TOOL, TC_IMPULSE
from ..solver.integrator import STAT_MAX_ITERS, STAT_MAX_RESIDUAL, STAT_SUBSTEPS
from ..solver.needle import NP_ARC, NP_RADIUS, NS_Q, NS_TORQUE, arc_point
from ..solver.scenario import Scenario
from ..solver.suture import STATE_NAMES, SutureWatch, lateral_force, pad_gap
from ..solver.tissue import (PD_HALF, PF_DRAG, PF_LOCAL, PF_SIGMA, PI_PAD, PI_STATE, PS_X, PUN_ACTIVE, PUN_FREE,
                             PUN_NEEDLE)
from ..solver.model import ThreadState
from . import protocol
from .device import Device, DeviceTable


class MessageBuilder:
    """Encodes `state` and `force` payloads for one scenario and holds its small scratch buffers; its force stage
    (:meth:`compute_forces`) steps each device's force-safety pipeline (haptics/safety.py), so that `force` carries
    what a device is sent.

    :param grasps: the live list of grasps (the daemon adds and removes grasps at run time); default: the
        scenario's.
    :param safety: the safety settings (default: SafetyConfig()), for a table of its own.
    :param limits: device name -> nominal max continuous force (N) reported by its driver, for a table of its own.
    :param devices: the devices that get a `force` message every tick, in order (default: the grasps'
        devices); a device holding no grasp is sent zero force at its stylus's pose.
    :param table: the devices' records (server/device.py), shared with the physics loop that feeds them poses;
        default: a table of its own (a headless run).
    """

    def __init__(self, scenario: Scenario, grasps: list | None = None, safety: SafetyConfig | None = None,
                 limits: dict[str, float] | None = None, devices: list[str] | None = None,
                 table: DeviceTable | None = None):
        self.scenario = scenario
        self.grasps = scenario.grasps if grasps is None else grasps
        self.table = DeviceTable(safety, limits) if table is None else table
        self.tick = float(scenario.model.solver.tick)
        self._axial = np.zeros(3)
        self._axial_next = np.zeros(3)
        self._torque = np.zeros(3)
        #: the devices with a `force` stream, in the order their messages go out
        self.streams: list[Device] = []
        #: the suture's events, and the knot that `state`'s `tissue` map reports (solver/suture.py)
        self.watch = SutureWatch(scenario.model)
        self.watch.reset(scenario.initial)
        # the pads' sizes (m) never change: one list each, sent by every `state`
        self._pad_sizes = [(2.0 * scenario.model.pads[p, PD_HALF:PD_HALF + 3]).tolist()
                           for p in range(len(scenario.model.pad_ids))]
        # the targets' offsets from their pads' centres (m), Python floats
        self._target_local = [[float(v) for v in tg.local] for tg in scenario.targets]
        # arc length (m) from the thread's first vertex to each vertex at rest: where a thread coordinate j + u is
        self._arc = np.concatenate(([0.0], np.cumsum(scenario.model.rest_length))).tolist()
        for d in dict.fromkeys(devices if devices is not None else [g.device for g in self.grasps]):
            self.add_device(d)

    @property
    def devices(self) -> list[str]:
        """The names of the devices with a `force` stream, in order."""
        return [d.name for d in self.streams]

    def add_device(self, device: str) -> None:
        """Give ``device`` a `force` stream, starting from zero force (Device.restart_stream)."""
        dev = self.table[device]
        if dev in self.streams:
            return
        self.streams.append(dev)
        dev.restart_stream()

    def reset(self, state: ThreadState, devices: list[str]) -> None:
        """Back to how a new builder of this scenario, its grasps and ``devices`` starts, in place (a scene reset):
        each device's `force` stream from zero force through a pipeline reset, no orientation kept, the watch
        read from ``state``. Allocates nothing but a device record the table did not have."""
        wanted = [self.table[d] for d in dict.fromkeys(devices)]
        for dev in wanted:
            dev.restart_stream()
        self.streams[:] = wanted
        self.watch.reset(state)

    def remove_device(self, device: str) -> None:
        """Stop ``device``'s `force` stream (a scripted stylus that let go: there is no motor to ramp down)."""
        dev = self.table.get(device)
        if dev is not None and dev in self.streams:
            self.streams.remove(dev)

    def needle_device(self) -> str | None:
        """The device whose grasp holds the needle (the scenario's needle grasp, or a tool's jaw that took it),
        or None."""
        for g in self.grasps:
            if g.kind == "needle":
                return g.device
        return None

    def axial(self, state: ThreadState, vertex: int, frac: float = 0.0) -> float:
        """Magnitude (N) of the thread's net axial constraint force at ``vertex``; with ``frac`` > 0, at the point
        that far along segment ``vertex``: the net constraint force on that segment's two vertices, the tensions
        of the segments either side of it (T_{v+1} along e_{v+1} less T_{v-1} along e_{v-1}). Segment v's own
        tension is internal to the held piece and cancels: on a thread pulled from one side it carries only the
        share f of the pull, not the pull the hand feels."""
        if frac == 0.0:
            return constraint_force_at(state.x, state.tension, vertex, self._axial)
        a = self._axial
        constraint_force_at(state.x, state.tension, vertex, a)
        constraint_force_at(state.x, state.tension, vertex + 1, self._axial_next)
        a += self._axial_next
        return math.sqrt(a[0] * a[0] + a[1] * a[1] + a[2] * a[2])

    def state(self, seq: int, state: ThreadState) -> bytes:
        """The `state` payload (docs/PROTOCOL.md Sec. 3.1): positions, tensions (N), twist (rad), grasps,
        energies (J), and the last tick's solver and self-contact statistics."""
        # in the wire's own form (protocol.encode_canonical_state): Python values, maps in their keys' order
        pad_ids = self.scenario.model.pad_ids
        grasps = [{"id": g.id, "vertex": int(g.vertex), "device": g.device, "holds": g.kind, "frac": float(g.frac),
                   **({"pad": pad_ids[g.pad]} if g.pad >= 0 else {}),
                   "pos": state.grasp_target[g.slot].tolist(), "force": state.grasp_force[g.slot].tolist()}
                  for g in self.grasps]
        stats = state.stats
        cs = state.contact_stats.tolist()
        solver = {"iters": int(stats[STAT_MAX_ITERS]), "residual": float(stats[STAT_MAX_RESIDUAL]),
                  "substeps": int(stats[STAT_SUBSTEPS]), "candidates": int(cs[CS_COUNT]),
                  "list_overflow": bool(cs[CS_OVERFLOW]), "penetration": cs[CS_PENETRATION],
                  "projections": int(cs[CS_PROJECTIONS])}
        m = self.scenario.model
        return protocol.encode_canonical_state(
            seq, float(state.time[0]), state.x, state.tension, float(state.twist[0]), grasps, int(cs[CS_CONTACTS]),
            diagnostics.energies(m, state), solver, self._tissue(state) if m.tissue_on else None,
            self._needle(state) if m.needle_on else None, self._tools(),
            None if whole(state) else np.flatnonzero(state.parted).tolist())

    def _tools(self) -> list[protocol.SortedMap] | None:
        """The `state` topic's `tools` (docs/PROTOCOL.md Sec. 3.1): each device with a stylus, its tool's tip
        and orientation, its body, clutch, and what its jaw holds; None if no device has a stylus."""
        tools = []
        for dev in self.streams:
            if not dev.has_stylus:
                continue
            held = next((g for g in self.grasps if g.device == dev.name), None)
            b = dev.body
            tools.append(protocol.SortedMap(body=None if b is None else [b.jaw_length, b.jaw_radius,
                                                                         b.shaft_length, b.shaft_radius],
                                            centre=dev.workspace_centre(), clutched=dev.clutched, device=dev.name,
                                            frame=dev.frame.tolist(), grasp=None if held is None else held.id,
                                            holds=None if held is None else held.kind,
                                            pos=dev.stylus.tolist(), quat=dev.tool_quat.tolist(),
                                            scale=dev.motion_scale))
        return tools or None

    def _tissue(self, state: ThreadState) -> protocol.SortedMap:
        """The `state` topic's `tissue` map (docs/PROTOCOL.md Sec. 3.1), built with its keys in sorted order."""
        m = self.scenario.model
        # Python floats and ints throughout: a numpy scalar costs more to read, and a sum of two Python floats is
        # the float64 sum numpy makes, bit for bit
        centres = [row[PS_X:PS_X + 3] for row in state.pst.tolist()]
        pads = [protocol.SortedMap(id=pid, pos=centres[p], size=self._pad_sizes[p])
                for p, pid in enumerate(m.pad_ids)]
        punctures = []
        for q, row in enumerate(state.pun_i.tolist()):
            st = row[PI_STATE]
            if st == PUN_FREE:
                continue
            f = state.pun_f[q].tolist()   # a row at a time: most slots are free, and the whole table costs more
            p = row[PI_PAD]
            c = centres[p]
            punctures.append(protocol.SortedMap(
                **({"arc": self.thread_arc(f[PF_SIGMA])} if st == PUN_ACTIVE else {}),
                drag=f[PF_DRAG], id=q,
                **({"lateral": float(lateral_force(state.pun_f, q))} if st == PUN_NEEDLE else {}),
                on=STATE_NAMES[st], pad=m.pad_ids[p],
                pos=[c[0] + f[PF_LOCAL], c[1] + f[PF_LOCAL + 1], c[2] + f[PF_LOCAL + 2]]))
        g = float(pad_gap(m.pads, state.pst))
        w = self.watch
        # a mark moves with its pad: the pad's centre plus the mark's offset, component by component
        targets = [protocol.SortedMap(id=tg.id, kind=tg.kind, pad=m.pad_ids[tg.pad],
                                      pos=[a + b for a, b in zip(centres[tg.pad], self._target_local[k])])
                   for k, tg in enumerate(self.scenario.targets)]
        # keys in sorted order (a SortedMap is packed as built): targets, when the scene marks any, before throws
        return protocol.SortedMap(gap=g if math.isfinite(g) else None, knot=w.knot, linking=w.link, pads=pads,
                                  punctures=punctures, **({"targets": targets} if targets else {}), throws=w.throws)

    def thread_arc(self, sigma: float) -> float:
        """The arc length (m, from the thread's first vertex, at rest) of thread coordinate ``sigma`` = j + u: where
        a puncture's thread runs through it, or a segment broke (its middle, j + 0.5)."""
        arc = self._arc
        j = min(max(int(sigma), 0), len(arc) - 2)
        return arc[j] + (sigma - j) * (arc[j + 1] - arc[j])

    def _needle(self, state: ThreadState) -> protocol.SortedMap:
        """The `state` topic's `needle` map (docs/PROTOCOL.md Sec. 3.1), built with its keys in sorted order."""
        npar = self.scenario.model.needle_par
        r, arc = float(npar[NP_RADIUS]), float(npar[NP_ARC])
        return protocol.SortedMap(arc=arc, pos=state.x[0].tolist(), quat=state.nst[NS_Q:NS_Q + 4].tolist(),
                                  radius=r, tip=list(arc_point(state.x, state.nst, NS_Q, r, arc)),
                                  torque=(-state.nst[NS_TORQUE:NS_TORQUE + 3]).tolist())

    def compute_forces(self, state: ThreadState) -> None:
        """The force stage: each streamed device's force (N, scene frame), axial force (N) and flags into its
        record. A device's force is the reaction of the virtual couplings it holds (minus the coupling force on
        the thread) and of the thread against its tool's jaw and shaft (minus the tool's impulse on the thread
        over the tick, solver/instruments.py), through its safety pipeline at this tick; `axial` is the
        magnitude of the thread's net constraint force at the grasped vertex (or point, :meth:`axial`); `flags`
        are the pipeline's OR the driver's."""
        t = float(state.time[0])
        caps = state.tool_cap
        per_tick = 1.0 / self.tick
        # Python floats throughout: numpy's scalar reads and 3-vector operations cost the tick more than the sums
        for dev in self.streams:
            fx = fy = fz = 0.0
            axial = 0.0
            # a clutched hand moves freely: its force ramps to zero at the pipeline's slew rate, and back
            if not dev.clutched:
                for g in self.grasps:
                    if g.device == dev.name:
                        gx, gy, gz = state.grasp_force[g.slot].tolist()
                        fx, fy, fz = fx - gx, fy - gy, fz - gz
                        if g.vertex >= 0:   # the thread's axial force where a grasp holds it (a pad has none)
                            axial = max(axial, self.axial(state, g.vertex, float(state.grasp_frac[g.slot])))
                if dev.tool_row >= 0:
                    for row in caps[CAPSULES_PER_TOOL * dev.tool_row:CAPSULES_PER_TOOL * (dev.tool_row + 1),
                                    TC_IMPULSE:TC_IMPULSE + 3].tolist():
                        fx, fy, fz = fx - row[0] * per_tick, fy - row[1] * per_tick, fz - row[2] * per_tick
            dev.flags = dev.safety.step((fx, fy, fz), t, t, self.tick, dev.force) | dev.driver_flags
            dev.axial = axial

    def encode_forces(self, seq: int, state: ThreadState) -> list[bytes]:
        """One `force` payload per streamed device, as the force stage left it, and one per externally loaded
        vertex. A device's pose is its grasp's target, or its stylus's when it holds nothing (zero before any
        pose came); a device whose stylus sent an orientation sends it as it came (its tool lies along it, and
        a needle it holds turns toward it), and the device holding the needle the needle's torque on the hand.
        An externally loaded vertex ("vertex<i>") reports the applied load, unshaped."""
        out = []
        t = float(state.time[0])
        needle_device = self.needle_device()
        for dev in self.streams:
            pose = dev.stylus
            for g in self.grasps:
                if g.device == dev.name:
                    pose = state.grasp_target[g.slot]
            torque = None
            quat = dev.quat if dev.has_quat else None
            if dev.name == needle_device:
                torque = self._torque
                np.negative(state.nst[NS_TORQUE:NS_TORQUE + 3], out=torque)   # felt: the reaction
                tx, ty, tz = torque.tolist()
                if tx - tx + ty - ty + tz - tz != 0.0:   # 0 for finite components, nan otherwise
                    torque.fill(0.0)
            out.append(protocol.encode_force(seq, t, dev.name, pose, dev.force, dev.axial, dev.flags,
                                             dev.stylus if dev.has_stylus else None, torque, quat))
        for v in self.scenario.force_vertices:
            axial = self.axial(state, v)
            out.append(protocol.encode_force(seq, t, f"vertex{v}", state.x[v], state.ext_force[v], axial, 0))
        return out

    def forces(self, seq: int, state: ThreadState) -> list[bytes]:
        """The force stage, then its payloads (:meth:`compute_forces`, :meth:`encode_forces`)."""
        self.compute_forces(state)
        return self.encode_forces(seq, state)
