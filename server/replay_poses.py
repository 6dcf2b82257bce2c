"""Stylus paths read from a recording: for the `replay` device backend (haptics/replay.py) and for a
resimulation (tools/replay.py), which must drive a live device exactly as it moved."""
from __future__ import annotations

import os

import numpy as np

from ..haptics.replay import PoseTrack, quat_rows
from . import protocol
from .recording import read_messages


class PoseSamples:
    """Each device's stylus path, gathered from decoded `force` messages in recording order: scene time (s), the
    stylus position (m; `stylus`, or `pose` in recordings made before `stylus` was recorded: a grasp lags its
    stylus after a jump, so `pose` would replay the lag twice) and the orientation a needle's live stylus sent.
    A scene reset or reload inside the recording (the scene time going back) ends a device's path: the first run
    is what is replayed."""

    def __init__(self):
        self.samples: dict[str, tuple[list, list, list]] = {}
        self.ended: set[str] = set()

    def add(self, msg: dict) -> None:
        device = msg["device"]
        if device in self.ended:
            return
        ts, ps, qs = self.samples.setdefault(device, ([], [], []))
        if ts and msg["t"] < ts[-1]:
            self.ended.add(device)
            return
        ts.append(msg["t"])
        ps.append(msg.get("stylus", msg["pose"]))
        qs.append(msg.get("quat"))

    def devices(self) -> list[str]:
        """The styluses seen; externally loaded vertices ("vertex<i>") are not styluses."""
        return [d for d in self.samples if not d.startswith("vertex")]

    def track(self, device: str) -> PoseTrack:
        ts, ps, qs = self.samples[device]
        return PoseTrack(np.asarray(ts), np.asarray(ps), quat_rows(qs))


def load_pose_tracks(path: str | os.PathLike) -> dict[str, PoseTrack]:
    """Every device's stylus path in the recording ``path`` (PoseSamples): device -> PoseTrack. Raises
    ValueError if the file has no `force` messages from a device."""
    samples = PoseSamples()
    for topic, payload, _log, _pub in read_messages(path):
        if topic == protocol.TOPIC_FORCE.decode():
            samples.add(protocol.decode_force(payload))
    if not samples.devices():
        raise ValueError(f"{path}: no stylus poses (no `force` messages from a device) to replay")
    return {d: samples.track(d) for d in samples.devices()}
