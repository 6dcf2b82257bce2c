"""Stylus paths read from a recording, for the `replay` device backend (haptics/replay.py)."""
from __future__ import annotations

import os

import numpy as np

from ..haptics.replay import PoseTrack, quat_rows
from . import protocol
from .recording import read_messages


def load_pose_tracks(path: str | os.PathLike) -> dict[str, PoseTrack]:
    """Every device's stylus path in the recording ``path``: device -> PoseTrack (scene time, position m, and
    the orientation a needle's live stylus sent).
    Externally loaded vertices ("vertex<i>") are not styluses and are left out. Raises ValueError if the file
    has no `force` messages from a device. A scene reset inside the recording ends each path (the first run
    is replayed)."""
    samples: dict[str, tuple[list, list, list]] = {}
    ended: set[str] = set()
    for topic, payload, _log, _pub in read_messages(path):
        if topic != protocol.TOPIC_FORCE.decode():
            continue
        msg = protocol.decode_force(payload)
        device = msg["device"]
        if device.startswith("vertex") or device in ended:
            continue
        ts, ps, qs = samples.setdefault(device, ([], [], []))
        if ts and msg["t"] < ts[-1]:   # the scene was reset or reloaded: the replay is the first run only
            ended.add(device)
            continue
        ts.append(msg["t"])
        ps.append(msg["pose"])
        qs.append(msg.get("quat"))
    if not samples:
        raise ValueError(f"{path}: no stylus poses (no `force` messages from a device) to replay")
    return {d: PoseTrack(np.asarray(ts), np.asarray(ps), quat_rows(qs)) for d, (ts, ps, qs) in samples.items()}
