"""One record per device: everything the server knows about a stylus, from the pose that comes in to the force
that goes out, and the table of them.

A :class:`Device` is made the first time its name is used (a configured device, a grasp's device, a link slot)
and lives as long as the physics process: its stylus, buttons and driver state outlast a scene change, so a
stylus that held still across a `load` is still where it was. What belongs to a scene's force stream (its
safety pipeline's state, the force sent, the orientation that turned the needle) starts again with each scene
(:meth:`Device.restart_stream`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from ..haptics.safety import ForceSafety, SafetyConfig

if TYPE_CHECKING:
    from .jaws import ToolShape


def _zeros3() -> np.ndarray:
    return np.zeros(3)


def _unit_quat() -> np.ndarray:
    return np.array([1.0, 0.0, 0.0, 0.0])


def python_floats(v) -> list[float]:
    """A short vector's components as Python floats: an array's by tolist, a tenth of the time of reading its
    numpy scalars one by one (the tick does this for every stylus and tool)."""
    return v.tolist() if type(v) is np.ndarray else [float(c) for c in v]


def quat_mul(a, b) -> tuple[float, float, float, float]:
    """The Hamilton product a b of quaternions (w, x, y, z)."""
    a0, a1, a2, a3 = python_floats(a)
    b0, b1, b2, b3 = python_floats(b)
    return (a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3,
            a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
            a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1,
            a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0)


def quat_mul_into(a, b, out) -> None:
    """The Hamilton product a b (quat_mul) into ``out`` (which may be a or b: both are read first)."""
    out[0], out[1], out[2], out[3] = quat_mul(a, b)


def unit_quat_or_none(q) -> tuple[float, float, float, float] | None:
    """``q`` (w, x, y, z) normalised, or None if it has no direction or is not finite."""
    w, x, y, z = python_floats(q)
    n = math.sqrt(w ** 2 + x ** 2 + y ** 2 + z ** 2)
    if not (n > 1e-6 and math.isfinite(n)):
        return None
    return w / n, x / n, y / n, z / n


@dataclass(eq=False)
class Device:
    """A stylus (a Phantom / Touch, a remote program, a replayed or scripted hand) as the server knows it."""
    name: str
    safety: ForceSafety                    # its force-safety pipeline (haptics/safety.py): clamp, slew, watchdog
    max_step: float = 0.0                  # m: the most its grasps' targets move in one tick (max_speed x tick)
    link_slot: int = -1                    # its slot in the device link (haptics/link.py), -1 if none
    # -- what comes in
    stylus: np.ndarray = field(default_factory=_zeros3)   # m, scene frame: where its tool's tip (the jaw) is:
                                           # the stylus through the workspace mapping and the clutch
    has_stylus: bool = False               # a pose came: its grasps follow ``stylus``
    quat: np.ndarray = field(default_factory=lambda: np.zeros(4))   # the orientation (w, x, y, z) as it came
    has_quat: bool = False                 # ... and one came in this scene (recorded with the force)
    tool_quat: np.ndarray = field(default_factory=_unit_quat)   # the tool's orientation, unit, last known
    pose_t_ns: int = 0                     # the newest link pose's time (ns, monotonic: for the latency)
    live_at: float | None = None           # monotonic s of the last pose that drove one of its grasps, this scene
    link_live: bool = False                # its driver publishes poses on the link
    buttons: int = 0                       # the last button bitmask
    # -- the workspace mapping and the clutch (:meth:`to_tool`): the hand's stylus -> the tool's tip
    hand: np.ndarray = field(default_factory=_zeros3)     # m, scene frame: the stylus as it came
    hand_quat: np.ndarray = field(default_factory=_unit_quat)   # its orientation as it came (unit)
    origin: np.ndarray = field(default_factory=_zeros3)   # m: the point motion scales about (the device's origin)
    offset: np.ndarray = field(default_factory=_zeros3)   # m: the scene's workspace offset
    motion_scale: float = 1.0              # tool motion per stylus motion
    shift: np.ndarray = field(default_factory=_zeros3)    # m: what clutching has added to the tool's position
    quat_shift: np.ndarray = field(default_factory=_unit_quat)   # ... and to its orientation (tool = shift hand)
    body: ToolShape | None = None          # its tool's body once it has one in the scene (server/jaws.py)
    tool_row: int = -1                     # ... and its capsule pair in the state (solver/instruments.py), else -1
    frame: np.ndarray = field(default_factory=_unit_quat)   # the device's axes in the scene (w x y z: its
                                           # transform's rotation): an operator's view looks along them
    mapped: bool = False                   # the mapping is not the identity (else the tool is the stylus, bit for bit)
    clutched: bool = False                 # the clutch is held: the tool holds still, the hand feels no force
    driver_flags: int = 0                  # the safety flags its driver reported (OR'd into its force's flags)
    driver_error: int = 0                  # the last device error code its driver reported
    # -- what goes out: the force stage (MessageBuilder.compute_forces), then the encoder and the link
    force: np.ndarray = field(default_factory=_zeros3)   # N, scene frame: after the safety pipeline
    axial: float = 0.0                     # N: the thread's net axial constraint force where it holds it
    flags: int = 0                         # the pipeline's flags OR the driver's

    def restart_stream(self) -> None:
        """Its `force` stream from the start, as a scene starts: zero force through a reset pipeline, no
        orientation kept for the needle. Allocates nothing."""
        self.safety.reset()
        self.force.fill(0.0)
        self.axial = 0.0
        self.flags = 0
        self.has_quat = False

    def set_workspace(self, origin, offset, scale: float, frame=(1.0, 0.0, 0.0, 0.0)) -> None:
        """The mapping of this scene (m, m, dimensionless; ``frame`` the device's axes in the scene, w x y z);
        what clutching added starts again from nothing."""
        self.frame[:] = frame
        self.origin[:] = origin
        self.offset[:] = offset
        self.motion_scale = float(scale)
        self.shift.fill(0.0)
        self.quat_shift[:] = (1.0, 0.0, 0.0, 0.0)
        self.clutched = False
        self._update_mapped()

    def _update_mapped(self) -> None:
        self.mapped = bool(self.motion_scale != 1.0 or self.offset.any() or self.shift.any()
                           or self.quat_shift[0] != 1.0)

    def to_tool(self, pos, quat, pos_out: np.ndarray, quat_out: np.ndarray) -> bool:
        """The hand's stylus at ``pos`` (m, scene frame) with orientation ``quat`` (w, x, y, z, or None) ->
        the tool's tip into ``pos_out`` and its orientation into ``quat_out``:
        ``tool = origin + offset + motion_scale (pos - origin) + shift``, ``q_tool = quat_shift q``. False while
        the clutch is held: the tool holds still (nothing is written). Allocates nothing."""
        self.hand[:] = pos
        if quat is not None:
            u = unit_quat_or_none(quat)
            if u is not None:
                self.hand_quat[0], self.hand_quat[1], self.hand_quat[2], self.hand_quat[3] = u
        if self.clutched:
            return False
        if not self.mapped:   # the identity: the stylus as it came, so that recordings of unmapped runs repeat
            pos_out[:] = pos
            if quat is not None:
                quat_out[:] = quat
            return True
        s = self.motion_scale
        for i in range(3):
            o = self.origin[i]
            pos_out[i] = o + self.offset[i] + s * (float(pos[i]) - o) + self.shift[i]
        quat_mul_into(self.quat_shift, self.hand_quat, quat_out)
        return True

    def workspace_centre(self) -> list[float]:
        """Where the centre of the device's workspace (its origin) is in the scene now (m), clutching included."""
        o, f, s = self.origin.tolist(), self.offset.tolist(), self.shift.tolist()   # Python floats: the same sums
        return [o[0] + f[0] + s[0], o[1] + f[1] + s[1], o[2] + f[2] + s[2]]

    def clutch(self, on: bool, tool: np.ndarray, tool_quat: np.ndarray) -> None:
        """Hold (``on``) or let go of the clutch. Letting go re-engages the tool where it is (``tool``, m, and
        ``tool_quat``): the mapping takes up the hand's move while clutched, so the tool does not jump."""
        if on == self.clutched:
            return
        self.clutched = on
        if on:
            return
        s = self.motion_scale
        for i in range(3):
            o = self.origin[i]
            self.shift[i] = float(tool[i]) - (o + self.offset[i] + s * (self.hand[i] - o))
        # q_tool = quat_shift q_hand  =>  quat_shift = q_tool q_hand^-1 (a unit quaternion's inverse: conjugate)
        h = self.hand_quat
        conj = (float(h[0]), -float(h[1]), -float(h[2]), -float(h[3]))
        u = unit_quat_or_none(tool_quat)
        quat_mul_into(u if u is not None else (1.0, 0.0, 0.0, 0.0), conj, self.quat_shift)
        self._update_mapped()

    def set_stylus(self, pos: np.ndarray) -> None:
        """The tool's tip (the stylus through the mapping) is at ``pos`` (m, scene frame)."""
        self.stylus[:] = pos
        self.has_stylus = True


class DeviceTable:
    """The devices a server knows, by name; each made on first use with its settings.

    :param safety: the safety pipeline's settings, every device's.
    :param limits: device name -> nominal max continuous force (N) its driver reports.
    :param settings: device name -> (max_step m per tick, link slot or -1); by default (0, -1): a device of a
        headless run, which no stylus drives.
    """

    def __init__(self, safety: SafetyConfig | None = None, limits: dict[str, float] | None = None,
                 settings: Callable[[str], tuple[float, int]] | None = None):
        self.safety = SafetyConfig() if safety is None else safety
        self.limits = dict(limits or {})
        self.settings = settings
        self._by_name: dict[str, Device] = {}

    def __getitem__(self, name: str) -> Device:
        d = self._by_name.get(name)
        if d is None:
            max_step, slot = self.settings(name) if self.settings is not None else (0.0, -1)
            d = self._by_name[name] = Device(name, ForceSafety(self.safety, self.limits.get(name)), max_step, slot)
        return d

    def get(self, name: str) -> Device | None:
        """The device ``name`` if it was ever used, else None (without making it)."""
        return self._by_name.get(name)

    def drop(self, name: str) -> None:
        """Forget ``name`` (a grasp's made-up device that let go): a request naming ever new devices must not
        grow the table for ever."""
        self._by_name.pop(name, None)

    def __iter__(self) -> Iterator[Device]:
        return iter(self._by_name.values())
