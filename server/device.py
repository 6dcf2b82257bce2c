"""One record per device: everything the server knows about a stylus, from the pose that comes in to the force
that goes out, and the table of them.

A :class:`Device` is made the first time its name is used (a configured device, a grasp's device, a link slot)
and lives as long as the physics process: its stylus, buttons and driver state outlast a scene change, so a
stylus that held still across a `load` is still where it was. What belongs to a scene's force stream (its
safety pipeline's state, the force sent, the orientation that turned the needle) starts again with each scene
(:meth:`Device.restart_stream`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ..haptics.safety import ForceSafety, SafetyConfig


def _zeros3() -> np.ndarray:
    return np.zeros(3)


@dataclass(eq=False)
class Device:
    """A stylus (a Phantom / Touch, a remote program, a replayed or scripted hand) as the server knows it."""
    name: str
    safety: ForceSafety                    # its force-safety pipeline (haptics/safety.py): clamp, slew, watchdog
    max_step: float = 0.0                  # m: the most its grasps' targets move in one tick (max_speed x tick)
    link_slot: int = -1                    # its slot in the device link (haptics/link.py), -1 if none
    # -- what comes in
    stylus: np.ndarray = field(default_factory=_zeros3)   # m, scene frame: where its stylus is
    has_stylus: bool = False               # a pose came: its grasps follow ``stylus``
    quat: np.ndarray = field(default_factory=lambda: np.zeros(4))   # the orientation (w, x, y, z) as it came
    has_quat: bool = False                 # ... and it turned the needle in this scene
    pose_t_ns: int = 0                     # the newest link pose's time (ns, monotonic: for the latency)
    live_at: float | None = None           # monotonic s of the last pose that drove one of its grasps, this scene
    link_live: bool = False                # its driver publishes poses on the link
    buttons: int = 0                       # the last button bitmask
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

    def set_stylus(self, pos: np.ndarray) -> None:
        """The stylus is at ``pos`` (m, scene frame)."""
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
