"""Wire protocol, schema version 1 (docs/PROTOCOL.md; docs/ARCHITECTURE.md Sec. 6).

Every message is a two-frame ZeroMQ multipart ``[topic, payload]``: ``topic`` is one of the ``TOPIC_*`` byte
strings and ``payload`` is a msgpack map (packed with ``use_bin_type=True``). Arrays travel as raw little-endian
bytes (msgpack ``bin``), every quantity is in SI units in the scene frame, and every payload carries

* ``v``   -- schema version (int, always :data:`SCHEMA_VERSION`),
* ``seq`` -- the simulation tick number (int, >= 0),
* ``t``   -- simulation time (float, s).

Topic payloads (besides v, seq, t):

``state``
    ``n`` vertex count; ``x`` float32[n*3] positions (m); ``tension`` float32[n-1] segment tensions (N);
    ``twist`` (rad); ``grasps`` list of {``id``, ``vertex``, ``device``, ``pos`` [3] (m), ``force`` [3] (N)};
    ``contacts`` count; ``energy`` {``kinetic``, ``elastic``, ``gravity``} (J);
    ``solver`` {``iters``, ``residual``, ``substeps``}.
``force``
    ``device``; ``pose`` [3] stylus position (m); ``force`` [3] force commanded to the device after safety (N);
    ``axial`` axial constraint force magnitude at the grasp (N); ``flags`` bitmask of ``FLAG_*``.
``stats``
    free-form map of loop statistics (latencies in microseconds).
``event``
    ``kind`` (grasp, release, reset, load, fault, overrun, ...) and free-form details.

Encoding is deterministic: the same inputs always give the same bytes (map keys are emitted in a fixed order;
free-form maps -- event details and stats -- are emitted with their keys sorted).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import msgpack
import numpy as np

from ..haptics.safety import FLAG_CLAMPED, FLAG_FAULT, FLAG_SLEWED, FLAG_WATCHDOG  # noqa: F401 (re-exported)
from ..solver.config import MAX_NAME_CHARS, is_name

__all__ = [
    "SCHEMA_VERSION", "MAX_MESSAGE_BYTES",
    "TOPIC_STATE", "TOPIC_FORCE", "TOPIC_STATS", "TOPIC_EVENT", "TOPICS",
    "FLAG_CLAMPED", "FLAG_SLEWED", "FLAG_WATCHDOG", "FLAG_FAULT",
    "ProtocolError", "SortedMap",
    "encode_state", "encode_force", "encode_event", "encode_stats",
    "decode", "decode_state", "decode_force", "decode_event", "decode_stats", "decode_multipart",
    "REQUEST_MAX_DEPTH", "REQUEST_MAX_STR_BYTES", "REQUEST_MAX_ITEMS", "STYLUS_MAX_BYTES", "STYLUS_MAX_DEVICE_CHARS",
    "REQUEST_MAX_OBJECTS", "REQUEST_CONTAINER_ITEMS", "REQUEST_PATH_BYTES", "STYLUS_MAX_POS_M", "STYLUS_MAX_RAW_POS",
    "StylusSample",
    "decode_request", "decode_stylus",
]

SCHEMA_VERSION = 1
#: Largest payload accepted by :func:`decode` and produced by the encoders (bytes).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

TOPIC_STATE = b"state"
TOPIC_FORCE = b"force"
TOPIC_STATS = b"stats"
TOPIC_EVENT = b"event"
TOPICS = (TOPIC_STATE, TOPIC_FORCE, TOPIC_STATS, TOPIC_EVENT)   # the PUB socket's
TOPIC_SCORE = b"score"     # the scorer process's own PUB socket (endpoints.score), beside its score events


_ENVELOPE_KEYS = ("v", "seq", "t")
_ENERGY_KEYS = ("kinetic", "elastic", "gravity")
_F32 = np.dtype("<f4")
_F64 = np.dtype(np.float64)


class ProtocolError(ValueError):
    """A payload that cannot be encoded or decoded under schema version 1."""


# ---------------------------------------------------------------------------------------------------------------
# encoding


_PACKERS = threading.local()   # a Packer per thread: packb makes one a call (0.6 us of a force message's 1.7)


def _pack(obj: dict) -> bytes:
    packer = getattr(_PACKERS, "packer", None)
    if packer is None:
        packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True, default=_pack_default)
    try:
        data = packer.pack(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode payload: {exc}") from exc
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"encoded payload is {len(data)} bytes, over the {MAX_MESSAGE_BYTES}-byte cap")
    return data


def _pack_default(obj: Any) -> Any:
    # Only reached for types msgpack cannot pack natively (numpy scalars/arrays in free-form maps).
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"cannot serialize object of type {type(obj).__name__}")


def _envelope(seq: int, t: float) -> dict:
    return {"v": SCHEMA_VERSION, "seq": int(seq), "t": float(t)}


def _vec3(value: Iterable[float], what: str) -> list[float]:
    return _floats(value, 3, what)


def _floats(value: Iterable[float], size: int, what: str) -> list[float]:
    """``value`` as ``size`` Python floats, or ProtocolError."""
    # a float64 array's tolist is a tenth of the loop's time (1 kHz per device); its dtype is numpy's one float64
    # descriptor unless it was made another way (byte-swapped, say), which the loop then reads as well
    if type(value) is np.ndarray and value.dtype is _F64 and value.shape == (size,):
        return value.tolist()
    out = [float(c) for c in value]
    if len(out) != size:
        raise ProtocolError(f"{what} must have {size} components, got {len(out)}")
    return out


_SCALARS = (float, int, str, bool, type(None))


class SortedMap(dict):
    """A free-form map built in canonical order: its keys sorted, and those of every map inside it, which holds
    nothing but msgpack's own types (str, int, float, bool, None, lists and maps). The encoders send it as it is
    instead of copying it into that order: the `state` topic's tissue and needle maps, 100 times a second from the
    loop's process, where the copy cost 12 us of a 42 us message (server/messages.py builds them so)."""


def _canonical(obj: Any) -> Any:
    """Free-form values with map keys sorted (recursively), so encoding does not depend on insertion order."""
    kind = type(obj)
    # exact types before the ABC check, which costs about 1 us a value (a state's tissue has hundreds)
    if kind in _SCALARS or kind is SortedMap:
        return obj
    if kind is dict or (kind is not list and isinstance(obj, Mapping)):
        return {k: _canonical(obj[k]) for k in sorted(obj)}
    if kind is list or isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    return obj


def _maps(m: dict, key: str, where: str):
    """(item, its path) for each item of the list m[key], every item a map."""
    for i, item in enumerate(_get(m, key, list, where)):
        path = f"{where}.{key}[{i}]"
        if not isinstance(item, dict):
            raise _fail(path, f"must be a map, got {type(item).__name__}")
        yield item, path


def encode_state(seq: int, t: float, x: np.ndarray, tension: np.ndarray, twist: float,
                 grasps: Sequence[Mapping[str, Any]], contacts: int, energy: Mapping[str, float],
                 solver: Mapping[str, Any], tissue: Mapping[str, Any] | None = None,
                 needle: Mapping[str, Any] | None = None, tools: Sequence[Mapping[str, Any]] | None = None,
                 parted: Sequence[int] | None = None) -> bytes:
    """Encode a ``state`` payload.

    :param seq: tick number.
    :param t: simulation time (s).
    :param x: vertex positions, shape (n, 3), m; sent as float32 little-endian bytes (n*3 values).
    :param tension: segment tensions, shape (n-1,), N; sent as float32 little-endian bytes.
    :param twist: total twist (rad).
    :param grasps: ``{"id": str, "vertex": int, "device": str, "pos": [3] (m), "force": [3] (N)}`` items, with
        ``"holds"`` ("needle" or "thread", default "thread") and ``"frac"`` (the point held along segment
        ``vertex``, default 0: the vertex).
    :param contacts: number of active contacts.
    :param energy: ``{"kinetic", "elastic", "gravity"}`` in J (extra keys are kept, sorted).
    :param solver: ``{"iters": int, "residual": float, "substeps": int}`` (extra keys are kept, sorted).
    :param tissue: in a scene with tissue: ``{"pads": [{"id", "pos"[3] (m), "size"[3] (m)}], "punctures":
        [{"pad", "pos"[3] (m), "on": "needle"|"thread"|"passed", "drag" (N), "id", "arc" (m, on thread)}], "gap" (m
        or None), "knot" (str),
        "throws", "linking"}`` (docs/PROTOCOL.md Sec. 3.1); omitted otherwise.
    :param needle: in a scene with a needle: ``{"pos"[3] swage (m), "quat"[4] (w, x, y, z), "radius" (m),
        "arc" (rad), "tip"[3] (m), "torque"[3] (N m, felt)}``; omitted otherwise.
    :param tools: each stylus's tool: ``{"device", "pos"[3] (m, the jaw), "quat"[4] (w, x, y, z), "clutched",
        "holds" ("needle"|"thread"|None), "grasp" (id or None), "frame"[4] (the device's axes), "centre"[3] (m,
        its workspace's centre), "scale"}``; omitted when no device has a stylus.
    :param parted: the segments where the thread broke (ascending); omitted while it is whole.
    """
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != 3 or x.shape[0] < 1:
        raise ProtocolError(f"x must have shape (n, 3) with n >= 1, got {x.shape}")
    n = x.shape[0]
    tension = np.asarray(tension)
    if tension.shape != (n - 1,):
        raise ProtocolError(f"tension must have shape ({n - 1},) for n={n}, got {tension.shape}")
    try:
        energy_out = {k: float(energy[k]) for k in _ENERGY_KEYS}
        energy_out.update({k: float(energy[k]) for k in sorted(energy) if k not in energy_out})
        solver_out = {"iters": int(solver["iters"]), "residual": float(solver["residual"]),
                      "substeps": int(solver["substeps"])}
        solver_out.update({k: _canonical(solver[k]) for k in sorted(solver) if k not in solver_out})
        grasps_out = [{"id": str(g["id"]), "vertex": int(g["vertex"]), "device": str(g["device"]),
                       "holds": str(g.get("holds", "thread")), "frac": float(g.get("frac", 0.0)),
                       **({"pad": str(g["pad"])} if "pad" in g else {}),
                       "pos": _vec3(g["pos"], "grasp pos"), "force": _vec3(g["force"], "grasp force")}
                      for g in grasps]
    except KeyError as exc:
        raise ProtocolError(f"state: missing key {exc.args[0]!r}") from exc
    return encode_canonical_state(int(seq), float(t), x, tension, float(twist), grasps_out, int(contacts),
                                  energy_out, solver_out, None if tissue is None else _canonical(tissue),
                                  None if needle is None else _canonical(needle),
                                  None if tools is None else _canonical(tools),
                                  [int(j) for j in parted] if parted else None)


def encode_canonical_state(seq: int, t: float, x: np.ndarray, tension: np.ndarray, twist: float,
                           grasps: list[dict], contacts: int, energy: dict, solver: dict,
                           tissue: SortedMap | None, needle: SortedMap | None, tools: list[SortedMap] | None,
                           parted: list[int] | None) -> bytes:
    """:func:`encode_state` of values already as the wire has them, unchecked: the loop's own `state`, 100 times a
    second (server/messages.py), where checking and copying them again cost the tick a third of the message.
    Python ints, floats and strs; ``x`` (n, 3) and ``tension`` (n - 1,) float arrays; each grasp a dict of id,
    vertex, device, holds, frac, pad if it holds one, pos and force [3] in that order; ``energy`` kinetic,
    elastic, gravity and then any other key sorted; ``solver`` iters, residual, substeps and then the others
    sorted; the maps as :class:`SortedMap` (their keys sorted); ``parted`` None while the thread is whole.
    tests/test_suture_by_hand.py holds the loop's bytes to :func:`encode_state`'s."""
    msg = {"v": SCHEMA_VERSION, "seq": seq, "t": t, "n": x.shape[0],
           "x": x.astype(_F32, order="C", copy=False).tobytes(),
           "tension": tension.astype(_F32, order="C", copy=False).tobytes(), "twist": twist, "grasps": grasps,
           "contacts": contacts, "energy": energy, "solver": solver}
    if tissue is not None:
        msg["tissue"] = tissue
    if needle is not None:
        msg["needle"] = needle
    if tools is not None:
        msg["tools"] = tools
    if parted:
        msg["parted"] = parted
    return _pack(msg)


def encode_force(seq: int, t: float, device: str, pose: Sequence[float], force: Sequence[float], axial: float,
                 flags: int, stylus: Sequence[float] | None = None, torque: Sequence[float] | None = None,
                 quat: Sequence[float] | None = None) -> bytes:
    """Encode a ``force`` payload.

    :param device: device name.
    :param pose: where the device holds the thread: its grasp's target [3] (m).
    :param stylus: where the stylus itself is [3] (m); default ``pose`` (a scripted stylus, or one whose grasp
        has caught up with it).
    :param force: force commanded to the device after safety processing [3] (N).
    :param axial: axial constraint force magnitude at the grasp (N).
    :param flags: bitmask of ``FLAG_CLAMPED | FLAG_SLEWED | FLAG_WATCHDOG | FLAG_FAULT``.
    :param torque: for the device holding a needle: the torque its rotational coupling puts on the hand [3]
        (N m, scene frame); what a 6-DoF device would render (a 3-DoF one renders only the force). Omitted
        otherwise.
    :param quat: once the device's live stylus has sent an orientation: that orientation [4] (w, x, y, z, scene
        frame) as it arrived (the tool's body lies along it, a needle it holds turns toward it, normalised); a
        recording keeps it, so a session driven live resimulates exactly. Omitted otherwise.
    """
    msg = _envelope(seq, t)
    msg["device"] = str(device)
    msg["pose"] = _vec3(pose, "pose")
    msg["stylus"] = _vec3(pose if stylus is None else stylus, "stylus")
    msg["force"] = _vec3(force, "force")
    msg["axial"] = float(axial)
    flags = int(flags)
    if flags < 0:
        raise ProtocolError(f"flags must be >= 0, got {flags}")
    msg["flags"] = flags
    if torque is not None:
        msg["torque"] = _vec3(torque, "torque")
    if quat is not None:
        msg["quat"] = _floats(quat, 4, "quat")
    return _pack(msg)


def encode_event(seq: int, t: float, kind: str, **details: Any) -> bytes:
    """Encode an ``event`` payload: ``kind`` (grasp, release, reset, load, fault, overrun, ...) plus details.

    Details are emitted after ``kind`` in sorted key order; they must not reuse v, seq, t or kind.
    """
    clash = set(details).intersection(("v", "seq", "t", "kind"))
    if clash:
        raise ProtocolError(f"event details may not use reserved keys {sorted(clash)}")
    msg = _envelope(seq, t)
    msg["kind"] = str(kind)
    for k in sorted(details):
        msg[k] = _canonical(details[k])
    return _pack(msg)


def encode_score(seq: int, t: float, body: Mapping[str, Any]) -> bytes:
    """Encode a ``score`` payload (published by the scorer process on ``endpoints.score``, not on the PUB
    socket: server/scoring.py): ``t`` is the scene time of the newest message scored; ``body`` holds the
    attempt's summary (docs/PROTOCOL.md Sec. 3.5) and must not reuse v, seq or t."""
    return _encode_map("score", seq, t, body)


def encode_stats(seq: int, t: float, stats: Mapping[str, Any]) -> bytes:
    """Encode a ``stats`` payload: loop lateness/period/step-time percentiles (microseconds), overruns, substeps.

    ``stats`` is free-form; its keys are emitted in sorted order and must not reuse v, seq or t.
    """
    return _encode_map("stats", seq, t, stats)


def _encode_map(topic: str, seq: int, t: float, body: Mapping[str, Any]) -> bytes:
    """The envelope, then ``body``'s keys in sorted order (none of them v, seq or t)."""
    clash = set(body).intersection(_ENVELOPE_KEYS)
    if clash:
        raise ProtocolError(f"{topic} may not use reserved keys {sorted(clash)}")
    msg = _envelope(seq, t)
    for k in sorted(body):
        msg[k] = _canonical(body[k])
    return _pack(msg)


# ---------------------------------------------------------------------------------------------------------------
# decoding


def _fail(topic: str, msg: str) -> ProtocolError:
    return ProtocolError(f"{topic}: {msg}")


def _get(m: dict, key: str, types: type | tuple, topic: str) -> Any:
    if key not in m:
        raise _fail(topic, f"missing key {key!r}")
    val = m[key]
    # bool is an int subclass but never a valid number here
    if isinstance(val, bool) or not isinstance(val, types):
        tn = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise _fail(topic, f"key {key!r} must be {tn}, got {type(val).__name__}")
    return val


def _num(m: dict, key: str, topic: str) -> float:
    return float(_get(m, key, (int, float), topic))


def _vec3_in(m: dict, key: str, topic: str) -> list[float]:
    val = _get(m, key, list, topic)
    if len(val) != 3 or any(isinstance(c, bool) or not isinstance(c, (int, float)) for c in val):
        raise _fail(topic, f"key {key!r} must be a list of 3 numbers")
    return [float(c) for c in val]


def _unpack(payload: bytes, topic: str) -> dict:
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise _fail(topic, f"payload must be bytes, got {type(payload).__name__}")
    if len(payload) > MAX_MESSAGE_BYTES:
        raise _fail(topic, f"payload is {len(payload)} bytes, over the {MAX_MESSAGE_BYTES}-byte cap")
    try:
        m = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises a zoo of ValueError/TypeError/UnicodeDecodeError subclasses
        raise _fail(topic, f"not a valid msgpack payload ({type(exc).__name__}: {exc})") from exc
    if not isinstance(m, dict):
        raise _fail(topic, f"payload must be a msgpack map, got {type(m).__name__}")
    v = _get(m, "v", int, topic)
    if v != SCHEMA_VERSION:
        raise _fail(topic, f"unsupported schema version v={v} (expected {SCHEMA_VERSION})")
    if _get(m, "seq", int, topic) < 0:
        raise _fail(topic, "seq must be >= 0")
    m["t"] = _num(m, "t", topic)
    return m


def _f32_array(m: dict, key: str, count: int, topic: str) -> np.ndarray:
    raw = _get(m, key, bytes, topic)
    if len(raw) != 4 * count:
        raise _fail(topic, f"key {key!r} has {len(raw)} bytes, expected {4 * count} (float32[{count}])")
    return np.frombuffer(raw, dtype=_F32)


def _check_state(m: dict) -> dict:
    topic = "state"
    n = _get(m, "n", int, topic)
    if n < 1:
        raise _fail(topic, f"n must be >= 1, got {n}")
    # read-only views on the payload bytes, no copy
    m["x"] = _f32_array(m, "x", 3 * n, topic).reshape(n, 3)
    m["tension"] = _f32_array(m, "tension", n - 1, topic)
    m["twist"] = _num(m, "twist", topic)
    grasps = _get(m, "grasps", list, topic)
    for i, g in enumerate(grasps):
        where = f"state.grasps[{i}]"
        if not isinstance(g, dict):
            raise _fail(where, f"must be a map, got {type(g).__name__}")
        _get(g, "id", str, where)
        vertex = _get(g, "vertex", int, where)
        if not 0 <= vertex < n and not (vertex == -1 and g.get("holds") == "tissue"):   # a pad has no vertex
            raise _fail(where, f"vertex {vertex} out of range [0, {n})")
        _get(g, "device", str, where)
        g["pos"] = _vec3_in(g, "pos", where)
        g["force"] = _vec3_in(g, "force", where)
    if _get(m, "contacts", int, topic) < 0:
        raise _fail(topic, "contacts must be >= 0")
    energy = _get(m, "energy", dict, topic)
    for k in _ENERGY_KEYS:
        energy[k] = _num(energy, k, "state.energy")
    solver = _get(m, "solver", dict, topic)
    _get(solver, "iters", int, "state.solver")
    solver["residual"] = _num(solver, "residual", "state.solver")
    if "substeps" in solver:
        _get(solver, "substeps", int, "state.solver")
    if "tissue" in m:
        tissue = _get(m, "tissue", dict, topic)
        for pad, where in _maps(tissue, "pads", "state.tissue"):
            _get(pad, "id", str, where)
            pad["pos"] = _vec3_in(pad, "pos", where)
            pad["size"] = _vec3_in(pad, "size", where)
        for pun, where in _maps(tissue, "punctures", "state.tissue"):
            _get(pun, "pad", str, where)
            pun["pos"] = _vec3_in(pun, "pos", where)
            if _get(pun, "on", str, where) not in ("needle", "thread", "passed"):
                raise _fail(where, f"on must be needle, thread or passed, got {pun['on']!r}")
            if "id" in pun:
                _get(pun, "id", int, where)
            if "arc" in pun:
                _num(pun, "arc", where)
        if "knot" in tissue:
            _get(tissue, "knot", str, "state.tissue")
    if "needle" in m:
        needle = _get(m, "needle", dict, topic)
        for key in ("pos", "tip", "torque"):
            needle[key] = _vec3_in(needle, key, "state.needle")
        quat = _get(needle, "quat", list, "state.needle")
        if len(quat) != 4 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in quat):
            raise _fail("state.needle", "quat must be 4 numbers (w, x, y, z)")
    if "parted" in m:
        parted = _get(m, "parted", list, topic)
        if not all(isinstance(j, int) and not isinstance(j, bool) and 0 <= j < n - 1 for j in parted):
            raise _fail("state.parted", f"must be segment indices in [0, {n - 1}), got {parted!r}")
    return m


def _check_force(m: dict) -> dict:
    topic = "force"
    _get(m, "device", str, topic)
    m["pose"] = _vec3_in(m, "pose", topic)
    if "stylus" in m:   # absent in recordings made before it was added
        m["stylus"] = _vec3_in(m, "stylus", topic)
    m["force"] = _vec3_in(m, "force", topic)
    m["axial"] = _num(m, "axial", topic)
    if _get(m, "flags", int, topic) < 0:
        raise _fail(topic, "flags must be >= 0")
    if "quat" in m:
        q = _get(m, "quat", list, topic)
        if len(q) != 4 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                  for v in q):
            raise _fail(topic, "quat must be 4 finite numbers (w, x, y, z)")
    return m


def _check_event(m: dict) -> dict:
    _get(m, "kind", str, "event")
    return m


def _check_stats(m: dict) -> dict:
    return m


def _check_score(m: dict) -> dict:
    _num(m, "score", "score")
    for key in ("done", "passed"):
        if not isinstance(m.get(key), bool):
            raise _fail("score", f"key {key!r} must be bool")
    for key in ("phases", "marks", "penalties", "checks"):
        _get(m, key, list, "score")
    return m


_CHECKS = {"state": _check_state, "force": _check_force, "event": _check_event, "stats": _check_stats,
           "score": _check_score}


def _topic_name(topic: bytes | str) -> str:
    name = topic.decode("ascii", "replace") if isinstance(topic, (bytes, bytearray)) else str(topic)
    if name not in _CHECKS:
        raise ProtocolError(f"unknown topic {name!r}")
    return name


def _infer_topic(m: dict) -> str:
    if "x" in m:
        return "state"
    if "axial" in m:
        return "force"
    if "kind" in m:
        return "event"
    return "stats"


def decode(payload: bytes, topic: bytes | str | None = None) -> dict:
    """Decode and validate one payload; raise :class:`ProtocolError` if it is malformed.

    Checks the size cap, that the payload is a msgpack map, ``v == 1``, ``seq`` (int >= 0), ``t`` (number, s)
    and the required keys and types of ``topic``. In ``state`` payloads ``x`` becomes a read-only float32
    array of shape (n, 3) and ``tension`` one of shape (n-1,). Numbers documented as floats come back as
    ``float``.

    Pass ``topic`` (the first multipart frame) whenever it is known. Without it the topic is inferred from the
    keys (``x`` -> state, ``axial`` -> force, ``kind`` -> event, otherwise stats), which cannot catch a state or
    force payload that lacks its distinguishing key.
    """
    name = None if topic is None else _topic_name(topic)
    m = _unpack(payload, name or "payload")
    return _CHECKS[name or _infer_topic(m)](m)


def decode_state(payload: bytes) -> dict:
    """:func:`decode` for a ``state`` payload."""
    return decode(payload, "state")


def decode_force(payload: bytes) -> dict:
    """:func:`decode` for a ``force`` payload."""
    return decode(payload, "force")


def decode_event(payload: bytes) -> dict:
    """:func:`decode` for an ``event`` payload."""
    return decode(payload, "event")


def decode_stats(payload: bytes) -> dict:
    """:func:`decode` for a ``stats`` payload."""
    return decode(payload, "stats")


def decode_multipart(frames: Sequence[bytes]) -> tuple[bytes, dict]:
    """Decode a received ``[topic, payload]`` multipart message; returns ``(topic, decoded payload)``."""
    if len(frames) != 2:
        raise ProtocolError(f"expected a two-frame multipart message, got {len(frames)} frames")
    topic = bytes(frames[0])
    return topic, decode(frames[1], topic)


# ---------------------------------------------------------------------------------------------------------------
# inbound: what clients send the server (control requests on REP, stylus samples on PULL)
#
# The one validation layer for every message that arrives at the server. Each runs in the physics process's
# tick, so each is bounded before it is decoded: the size first (a byte count, no work), then msgpack's own
# per-container limits while it decodes, then one walk over what it built. Nothing here allocates in
# proportion to anything but the (capped) message.

#: Deepest nesting of maps and lists in a control request (an inline scenario needs 5: timeline[i].waypoints[j]).
REQUEST_MAX_DEPTH = 16
#: Longest string in a control request, in UTF-8 bytes (a file path: Linux's PATH_MAX).
REQUEST_MAX_STR_BYTES = 4096
#: Most items in all the lists and maps of a control request together, each list or map counting as
#: REQUEST_CONTAINER_ITEMS more (checking one costs a Python call, about as much as checking 4 items). The
#: decoding stops at the container that passes it, so this, not the byte cap (a 64 KiB request holds 65536
#: one-byte items), bounds what a request costs the tick: about 0.1 us an item, 0.25 ms at worst, measured
#: (`suturesim bench inbound`). The largest shipped scenario sent inline counts 720.
REQUEST_MAX_OBJECTS = 2048
REQUEST_CONTAINER_ITEMS = 4
#: Most items in any one list or map of a control request: msgpack refuses a longer one from its header,
#: before it allocates anything.
REQUEST_MAX_ITEMS = REQUEST_MAX_OBJECTS
#: Largest stylus sample, bytes, checked before decoding (a sample with a quaternion is about 100 bytes).
STYLUS_MAX_BYTES = 1024
#: Longest device name in a stylus sample, characters (printable): the grasp id/device limit of a scenario.
STYLUS_MAX_DEVICE_CHARS = MAX_NAME_CHARS
#: Farthest a stylus sample's position may be from the scene's origin, m: the size of any workspace (checked by
#: the server after a device-frame sample is mapped into the scene).
STYLUS_MAX_POS_M = 10.0
#: Farthest a stylus sample's position may be from its frame's origin as it arrives, in its own units: 10 m in the
#: millimetres of a device-frame sample (``frame: device``), and no more than that for any sample.
STYLUS_MAX_RAW_POS = 1e4
_STYLUS_MAX_BUTTONS = 0xFFFFFFFF   # a 32-bit button mask (OpenHaptics' HD_CURRENT_BUTTONS)

#: A refused request up to this size, bytes, is walked once more for the key path of its first bad value
#: (a Python loop over its items: about 0.25 us each); a larger one is refused with the reason alone.
REQUEST_PATH_BYTES = 1024

class _ContentError(ProtocolError):
    """A request that decoded within the limits but holds a value the protocol does not allow."""


class _Checker:
    """msgpack hooks that check each list and map as msgpack finishes it, innermost first: the types of its
    items, their finiteness, its depth (1 + its deepest child's, kept by id while the children live) and the
    running item count, which stops the decoding as soon as it passes REQUEST_MAX_OBJECTS."""

    __slots__ = ("objects", "depth")

    def __init__(self) -> None:
        self.objects = 0
        self.depth: dict[int, int] = {}

    def _items(self, items: Any, n: int, what: str) -> int:
        self.objects += n + REQUEST_CONTAINER_ITEMS
        if self.objects > REQUEST_MAX_OBJECTS:
            raise ProtocolError(f"more than {REQUEST_MAX_OBJECTS} items in all (a list or map counts as "
                                f"{REQUEST_CONTAINER_ITEMS})")
        d = 1
        for v in items:
            t = type(v)
            if t is float:
                if v - v != 0.0:   # inf - inf and nan - nan are nan
                    raise _ContentError(f"a {what} holds a number that is not finite")
            elif t is list or t is dict:
                dv = self.depth.pop(id(v), 1)
                if dv >= d:
                    d = dv + 1
            elif t is not str and t is not int and t is not bool and v is not None:
                raise _ContentError(f"{t.__name__} is not allowed in a {what} (only maps, lists, strings, "
                                    "numbers, booleans and nil)")
        if d > REQUEST_MAX_DEPTH:
            raise _ContentError(f"nested deeper than {REQUEST_MAX_DEPTH} levels")
        return d

    def list_hook(self, value: list) -> list:
        d = self._items(value, len(value), "list")
        if d > 1:
            self.depth[id(value)] = d
        return value

    def object_hook(self, value: dict) -> dict:
        for k in value:
            if type(k) is not str:
                raise _ContentError(f"map keys must be strings, got {type(k).__name__}")
        d = self._items(value.values(), len(value), "map")
        if d > 1:
            self.depth[id(value)] = d
        return value


def _decode_limited(raw: Any, max_bytes: int, what: str, max_str: int, max_items: int,
                    checker: _Checker | None = None) -> Any:
    """msgpack ``raw`` (bytes-like, at most ``max_bytes``) with msgpack's limits; ProtocolError if not."""
    try:
        size = len(raw)
    except TypeError:
        raise ProtocolError(f"{what}: must be bytes, got {type(raw).__name__}") from None
    if size > max_bytes:
        raise ProtocolError(f"{what}: {size} bytes, over the {max_bytes}-byte cap")
    hooks = {} if checker is None else {"list_hook": checker.list_hook, "object_hook": checker.object_hook}
    try:
        # bin and ext never appear in an inbound message (no field documents bytes): a zero cap refuses both
        return msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True, max_str_len=max_str,
                               max_bin_len=0, max_ext_len=0, max_array_len=max_items, max_map_len=max_items,
                               **hooks)
    except _ContentError as exc:
        raise _ContentError(f"{what}: {exc}") from None
    except ProtocolError as exc:
        raise ProtocolError(f"{what}: {exc}") from None
    except Exception as exc:  # msgpack raises ValueError/TypeError/StackError/UnicodeDecodeError/ExtraData...
        raise ProtocolError(f"{what}: not a valid msgpack message within the limits "
                            f"({type(exc).__name__}: {exc})") from None


def _key_path(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _walk_plain(value: Any, path: str, depth: int) -> None:
    """Check that ``value`` holds only str-keyed maps, lists, str, int, float (finite), bool and None, nested
    at most REQUEST_MAX_DEPTH deep; ProtocolError naming the key path otherwise. A Python loop over every
    item: for the error message of a request the hooks refused, never on a request's way in."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return
    if kind is float:
        if not math.isfinite(value):
            raise ProtocolError(f"{path or '<request>'}: must be a finite number, got {value!r}")
        return
    if kind is dict or kind is list:
        if depth >= REQUEST_MAX_DEPTH:
            raise ProtocolError(f"{path or '<request>'}: nested deeper than {REQUEST_MAX_DEPTH} levels")
        if kind is dict:
            for k, v in value.items():
                if type(k) is not str:
                    raise ProtocolError(f"{path or '<request>'}: map keys must be strings, got {type(k).__name__}")
                _walk_plain(v, _key_path(path, k), depth + 1)
        else:
            for i, v in enumerate(value):
                _walk_plain(v, f"{path}[{i}]", depth + 1)
        return
    raise ProtocolError(f"{path or '<request>'}: {kind.__name__} is not allowed (only maps, lists, strings, "
                        "numbers, booleans and nil)")


def decode_request(raw: bytes, max_bytes: int) -> dict:
    """A control request (docs/PROTOCOL.md Sec. 4) decoded and checked: at most ``max_bytes`` (counted before
    decoding), msgpack with every string at most REQUEST_MAX_STR_BYTES, every list or map at most
    REQUEST_MAX_ITEMS and REQUEST_MAX_OBJECTS items in all, no bin or ext; a map whose values are only maps
    (string keys), lists, strings, ints, finite floats, booleans and nil, at most REQUEST_MAX_DEPTH deep, with
    a string ``cmd``. Raises ProtocolError naming the key path and the reason. The fields of each command are
    checked by the command (server/control.py)."""
    try:
        req = _decode_limited(raw, max_bytes, "request", REQUEST_MAX_STR_BYTES, REQUEST_MAX_ITEMS, _Checker())
    except _ContentError:
        # the hooks see containers, not where they are: a small request is decoded again (it is at most
        # REQUEST_PATH_BYTES, so at most that many items) and walked for the key path of its first bad value
        if len(raw) <= REQUEST_PATH_BYTES:
            _walk_plain(msgpack.unpackb(raw, raw=False, strict_map_key=True), "", 0)
        raise
    if type(req) is not dict:
        raise ProtocolError(f"request: must be a map with a 'cmd' field, got {type(req).__name__}")
    if type(req.get("cmd")) is not str:
        raise ProtocolError("cmd: missing or not a string")
    return req


@dataclass(frozen=True, slots=True)
class StylusSample:
    """One remote stylus sample (docs/PROTOCOL.md Sec. 5), checked."""
    device: str                                             # device name, printable, <= STYLUS_MAX_DEVICE_CHARS
    pos: tuple[float, float, float]                         # m, scene frame (or device units), within STYLUS_MAX_RAW_POS
    quat: tuple[float, float, float, float] | None          # (w, x, y, z) as sent (not normalised), or None
    buttons: int                                            # bitmask, 0..2^32-1
    seq: int                                                # the sender's counter (0 if not sent)
    t: float                                                # s, the sender's clock (0.0 if not sent)


def _finite_numbers(m: dict, key: str, count: int) -> tuple[float, ...]:
    v = m[key]
    if type(v) is not list or len(v) != count:
        raise ProtocolError(f"stylus: {key}: must be a list of {count} numbers, got {type(v).__name__}"
                            f"{' of ' + str(len(v)) if type(v) is list else ''}")
    out = []
    for c in v:
        if type(c) is not float and type(c) is not int:
            raise ProtocolError(f"stylus: {key}: must be numbers, got {type(c).__name__}")
        f = float(c)
        if f - f != 0.0:
            raise ProtocolError(f"stylus: {key}: must be finite, got {c!r}")
        out.append(f)
    return tuple(out)


def decode_stylus(raw: bytes) -> StylusSample:
    """A stylus sample decoded and checked: at most STYLUS_MAX_BYTES (counted before decoding); a map with
    ``device`` (a printable string of 1..STYLUS_MAX_DEVICE_CHARS characters), ``pos`` (3 finite numbers, in
    the scene's metres or a device's own units, at most STYLUS_MAX_RAW_POS from the origin; the server checks
    STYLUS_MAX_POS_M in the scene), optional ``quat`` (4 finite numbers or nil), ``buttons`` (int
    in 0..2^32-1, default 0), ``seq`` (int, default 0) and ``t`` (finite number, s, default 0). Other keys are
    ignored (Sec. 1, compatibility). Raises ProtocolError naming the key and the reason."""
    m = _decode_limited(raw, STYLUS_MAX_BYTES, "stylus", 4 * STYLUS_MAX_DEVICE_CHARS, 16)
    if type(m) is not dict:
        raise ProtocolError(f"stylus: must be a map, got {type(m).__name__}")
    device = m.get("device")
    if not is_name(device):
        raise ProtocolError(f"stylus: device: must be a printable string of 1 to {STYLUS_MAX_DEVICE_CHARS} "
                            "characters")
    if "pos" not in m:
        raise ProtocolError("stylus: pos: is required")
    pos = _finite_numbers(m, "pos", 3)
    if pos[0] * pos[0] + pos[1] * pos[1] + pos[2] * pos[2] > STYLUS_MAX_RAW_POS * STYLUS_MAX_RAW_POS:
        raise ProtocolError(f"stylus: pos: farther than {STYLUS_MAX_RAW_POS:g} units from the origin")
    quat = _finite_numbers(m, "quat", 4) if m.get("quat") is not None else None
    buttons = m.get("buttons", 0)
    if type(buttons) is not int or not 0 <= buttons <= _STYLUS_MAX_BUTTONS:
        raise ProtocolError(f"stylus: buttons: must be an integer in 0..{_STYLUS_MAX_BUTTONS}")
    seq = m.get("seq", 0)
    if type(seq) is not int:
        raise ProtocolError("stylus: seq: must be an integer")
    t = m.get("t", 0.0)
    if (type(t) is not float and type(t) is not int) or float(t) - float(t) != 0.0:
        raise ProtocolError("stylus: t: must be a finite number (s)")
    return StylusSample(device=device, pos=pos, quat=quat, buttons=buttons, seq=seq, t=float(t))
