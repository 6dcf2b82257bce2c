"""Scenarios: a thread preset with overrides, an initial shape, gravity, boundary conditions, a timeline of
motions, the solver settings and a duration, read from YAML and validated before anything runs.

The file format is documented in docs/SCENARIOS.md. Every error names the file, the key path and the reason.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .config import MAX_NAME_CHARS, ConfigError, Section, is_name, load_yaml
from .model import MAX_GRASPS, ContactSettings, SolverSettings, ThreadModel, ThreadState, build_model, make_state
from .motion import MOTION_GRASP, MOTION_RELEASE, MOTION_SPIN, MOTION_TWIST, MOTION_VERTEX
from .needle import NP_ARC, NP_MASS, NP_RADIUS, NS_Q, NS_QT, arc_point
from .needle_config import NeedleSpec, read_needle
from .knots import BEND_KINDS, KNOT_KINDS, bend_thread, knot_curve, lay_chords
from .presets import CONFIG_DIR, merged_thread_section, resolve_thread
from .sources import (FILE_REFUSED, SCENARIO_REFUSED, FilePolicy, ScenarioFiles, confined_mapping,
                      confined_scenario_path)
from .tissue_config import TissueSpec, read_tissue

SCENARIOS_DIR = CONFIG_DIR / "scenarios"

# Bounds of a grasp's virtual coupling: a haptic stylus renders ~1e3-1e4 N/m and a few newtons; beyond these
# the coupling is not a stylus and its forces would only be numbers.
MAX_GRASP_STIFFNESS = 1e6   # N/m
MAX_GRASP_DAMPING = 1e3     # N*s/m
MAX_GRASP_FORCE = 100.0     # N

# Limits that keep a scene within what the server's 1 kHz loop can run and its memory can hold; a value past
# one would pass as a number and then wedge the loop, fill memory, or diverge on every tick (a fault, a reset to
# the same scene, a fault again). docs/PROTOCOL.md Sec. 6 lists them.
# The cheapest substep measured costs 0.56 us (docs/BENCHMARKS.md Sec. 1: the fit's 61 ns/segment + 0.56
# us/substep, at no segments at all), so 1024 substeps of even the smallest thread take 0.57 ms: more per tick
# than this never fits a 1 ms tick, whatever the thread.
MAX_SUBSTEPS = 1024
# A tick that failed its checks may run again past the budget (integrator.Stepper, up to MAX_RETRIES = 6 times),
# a deliberate one-tick overrun instead of a divergence; a cinch needed 911-1024 (docs/PHYSICS.md Sec. 6). At
# 4096 the worst retried tick of the 100-segment suture (~7 us a substep) is 6 x 4096 x 7 us = 0.17 s: a
# stall the devices' watchdogs (5 ms, haptics/safety.py) meet by ramping their forces to zero, not a wedge.
MAX_RETRY_SUBSTEPS = 4096
# The neighbour list's per-pair arrays (model.ThreadState cand_* and old_*: 11 scalars and 3 vectors of 8-byte
# values) are 160 bytes a pair, held twice (the state and the stepper's copy of it): 1e6 pairs are 320 MB.
MAX_CONTACT_PAIRS = 1_000_000
CONTACT_PAIR_BYTES = 160
MAX_GRAVITY = 1000.0        # m/s^2, |gravity|: 100 g
MAX_SPEED = 100.0           # m/s: a scripted velocity (timeline, waypoints, paths) or an initial velocity
MAX_SPIN = 1000.0           # rad/s: the needle's scripted angular velocity, an input twist's rate (1 rad a tick)
MAX_TWIST = 1e4             # rad: an initial twist
MAX_LOAD = 1000.0           # N: a scripted force on a vertex
MAX_POSITION = 1000.0       # m: any coordinate of the initial shape or of a grasp's target
MAX_DURATION = 1e6          # s: a scene's duration (11.6 days)


@dataclass(frozen=True)
class GraspSpec:
    """A virtual coupling between a target (a stylus) and a vertex."""
    id: str
    slot: int
    vertex: int
    device: str
    stiffness: float   # N/m
    damping: float     # N*s/m
    max_force: float   # N
    kind: str = "thread"   # what it holds: "needle" (its swage, vertex 0), "thread" or "tissue" (a pad)
    frac: float = 0.0      # it holds the point frac of the way from vertex to vertex + 1 (0: the vertex)
    pad: int = -1          # the tissue pad it holds (vertex -1), or -1


@dataclass(frozen=True)
class Workspace:
    """Where a device's workspace sits in a scene: the tool is at ``origin + offset + scale (stylus - origin)``,
    ``origin`` the device's origin in the scene (its transform's offset), plus what clutching added."""
    offset: tuple[float, float, float] = (0.0, 0.0, 0.0)   # m
    scale: float = 1.0                                       # tool motion per stylus motion
    tool: str | None = None                                  # the tool it drives (None: the server config's)


MAX_MOTION_SCALE = 20.0     # tool motion per stylus motion: past it a hand's tremor is centimetres
# a tool's kind (server/jaws.py): each takes the needle and the thread, forceps tissue too; a hand is fingers that
# pinch, with no body the thread meets (a hand tie's loop passes over a finger as a finger is drawn out of it)
TOOLS = ("needle_driver", "forceps", "hand")


@dataclass
class Scenario:
    name: str
    description: str
    file: str
    duration: float                 # s
    state_rate: float               # Hz of the `state` topic in recordings
    model: ThreadModel
    initial: ThreadState
    grasps: list[GraspSpec] = field(default_factory=list)
    force_vertices: list[int] = field(default_factory=list)
    source: dict = field(default_factory=dict)  # the file as read, for recording metadata
    needle_grasp: str | None = None  # the grasp whose stylus holds the needle (its orientation turns it)
    base_dir: str = "."              # the directory its relative file references resolved against
    files_read: tuple[str, ...] = ()  # real paths of the files it read (preset, shape.file): a `set` may reread them
    workspaces: dict[str, Workspace] = field(default_factory=dict)   # device name -> its workspace in this scene
    targets: tuple = ()              # tissue_config.Target: where the needle should enter and leave the pads

    def new_state(self) -> ThreadState:
        """A fresh copy of the initial state."""
        return self.initial.copy()


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIOS_DIR.glob("*.yaml"))


def scenario_path(name_or_path: str) -> Path:
    """A shipped scenario by name, or a path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return SCENARIOS_DIR / f"{name_or_path}.yaml"


def set_keys(data: dict, assignments: Iterable[str], label: str = "--set") -> dict:
    """``key.path=value`` assignments (the value read as YAML; a number in the path indexes a list:
    ``boundary.grasps.0.max_force=6``) applied to a copy of the scenario mapping ``data``. A ConfigError names
    the assignment (``label``, the key path) and why it does not fit."""
    import copy

    import yaml

    out = copy.deepcopy(data)
    for item in assignments:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(label, item, "wants key.path=value")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(label, key, f"its value is not YAML: {exc}") from None
        node: Any = out
        parts = key.split(".")
        for i, part in enumerate(parts):
            last, where = i == len(parts) - 1, ".".join(parts[:i]) or "the scenario"
            if isinstance(node, list):
                try:
                    idx = int(part)
                except ValueError:
                    raise ConfigError(label, key, f"{where} is a list: index it with a number") from None
                if not -len(node) <= idx < len(node):
                    raise ConfigError(label, key, f"{where} has {len(node)} items, no item {idx}")
            elif isinstance(node, dict):
                idx = part
                if not last and idx not in node:
                    node[idx] = {}
            else:
                raise ConfigError(label, key, f"{where} is a value, not a mapping or list")
            if last:
                node[idx] = value
            else:
                node = node[idx]
    return out


def load_scenario(name_or_path: str, overrides: dict | None = None, *, policy: FilePolicy | None = None,
                  assignments: Iterable[str] = ()) -> Scenario:
    """Read and validate a scenario file (by shipped name or path). ``overrides`` is a nested mapping merged
    over the file's content (e.g. {"thread": {"segments": 20}}) before validation, then ``assignments``
    (:func:`set_keys`). ``policy`` (None: trusted) confines the file and what it refers to
    (solver/sources.py)."""
    path = scenario_path(name_or_path)
    missing = f"no such scenario (shipped: {', '.join(scenario_names())})"
    if policy is None:
        if not path.is_file():
            raise ConfigError(str(path), "", missing)
        data = load_yaml(path)
    else:
        if not policy.allows(path):
            raise ConfigError(name_or_path, "", SCENARIO_REFUSED)
        path = Path(os.path.realpath(path))
        data = confined_mapping(path, policy, missing, "not a YAML mapping of scenario keys",
                                lambda reason: ConfigError(str(path), "", reason))
    if overrides:
        data = _merge(data, overrides)
    if assignments:
        data = set_keys(data, assignments)
    return build_scenario(data, str(path), policy=policy)


def load_scenario_request(spec: str | dict, scenarios_dir: str, label: str = "<load request>") -> Scenario:
    """The scenario a network client asked for (control `load`), confined to the shipped configs and
    ``scenarios_dir``: a shipped scenario name, a .yaml/.yml file name relative to ``scenarios_dir``, or an inline
    mapping (its relative references against ``scenarios_dir``). Errors are ConfigErrors (``label`` for the
    request itself)."""
    policy = FilePolicy(roots=(Path(scenarios_dir),))
    if isinstance(spec, dict):
        return build_scenario(spec, label, policy=policy, base_dir=scenarios_dir)
    if spec in scenario_names():
        return load_scenario(str(SCENARIOS_DIR / f"{spec}.yaml"), policy=policy)
    if not spec.endswith((".yaml", ".yml")) and "/" not in spec and os.sep not in spec:
        raise ConfigError(label, "scenario", f"no shipped scenario {spec!r} (shipped: {', '.join(scenario_names())}; "
                                             "or a .yaml file name under the scenarios directory)")
    return load_scenario(str(confined_scenario_path(spec, scenarios_dir, label)), policy=policy)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _vertex(sec: Section, key: str, n: int, value=None) -> int:
    v = sec.get(key, int) if value is None else value
    if isinstance(v, bool) or not isinstance(v, int) or not -n <= v < n:
        raise sec.error(key, f"must be a vertex index in [{-n}, {n - 1}], got {v!r}")
    return v % n


def _shape(sec: Section, n_seg: int, length: float, files: ScenarioFiles) -> np.ndarray:
    kind = sec.get("kind", str, "straight", choices=("straight", "helix", "points", "polyline", "knot", "bend"))
    if kind == "polyline":
        return _polyline_shape(sec, n_seg, length)
    if kind == "knot":
        return _knot_shape(sec, n_seg, length)
    if kind == "bend":
        return _bend_shape(sec, n_seg, length)
    if kind == "points":
        key = "file" if sec.has("file") else "points"
        if key == "file":
            if sec.has("points"):
                raise sec.error("file", "give the points or a file of them, not both")
            arr = _points_file(sec, files)
        else:
            try:
                arr = np.asarray(sec.raw("points"), dtype=np.float64)
            except (TypeError, ValueError):
                raise sec.error("points", "must be a list of [x, y, z] points") from None
        if arr.ndim != 2 or arr.shape[1] != 3 or arr.shape[0] != n_seg + 1 or not np.all(np.isfinite(arr)):
            raise sec.error(key, f"must be {n_seg + 1} finite [x, y, z] points (segments + 1), got "
                                 f"{arr.shape[0] if arr.ndim == 2 else 'no'} rows of {arr.shape[-1]}")
        # a published shape laid at another size (Choi's knot in a suture's thread): every point times `scale`
        arr = arr * sec.get("scale", float, 1.0, above=0.0)
        seg = np.linalg.norm(np.diff(arr, axis=0), axis=1)
        if np.any(seg <= 0):
            raise sec.error(key, "consecutive points must differ")
        if abs(seg.sum() - length) > 1e-9 * length:
            raise sec.error(key, f"the points span {seg.sum():.10g} m but thread.length is {length:.10g} m")
        sec.finish()
        return arr
    start = np.array(sec.vector("start", 3, [0.0, 0.0, 0.0]))
    if kind == "straight":
        d = np.array(sec.vector("direction", 3, [1.0, 0.0, 0.0], nonzero=True))
        sec.finish()
        return start + np.outer(np.linspace(0.0, length, n_seg + 1), d / np.linalg.norm(d))
    axis = np.array(sec.vector("axis", 3, [1.0, 0.0, 0.0], nonzero=True))
    radius = sec.get("radius", float, above=0.0)
    pitch = sec.get("pitch", float, minval=0.0)  # m per turn
    sec.finish()
    axis = axis / np.linalg.norm(axis)
    u = np.cross(axis, [0.0, 0.0, 1.0])
    if np.linalg.norm(u) < 1e-9:
        u = np.cross(axis, [0.0, 1.0, 0.0])
    u /= np.linalg.norm(u)
    w = np.cross(axis, u)
    c = pitch / (2.0 * math.pi)

    def chord(dphi: float) -> float:
        return math.hypot(2.0 * radius * math.sin(dphi / 2.0), c * dphi)

    # equal chords of length L/N: find the angle step by bisection on [0, pi], where the chord grows with it
    target = length / n_seg
    lo, hi = 0.0, math.pi
    if chord(hi) < target:
        raise sec.error("radius", f"segments of {target:.6g} m are longer than half a turn of this helix "
                                  f"({chord(hi):.6g} m): use more segments or a larger radius")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if chord(mid) < target else (lo, mid)
    phi = np.arange(n_seg + 1) * 0.5 * (lo + hi)
    return start + radius * (np.outer(np.cos(phi), u) + np.outer(np.sin(phi), w) - u) + np.outer(c * phi, axis)


def _points_file(sec: Section, files: ScenarioFiles) -> np.ndarray:
    """The points of a `points` shape's ``file``: a text file beside the scenario's (or a path relative to its
    folder), one vertex a row, x y z in m, '#' starting a comment; found and read through ``files``."""
    name = sec.get("file", str)
    path = files.locate(sec, "file", name, FILE_REFUSED)
    return files.points(sec, "file", path, f"no such file: {name}")


def _knot_shape(sec: Section, n_seg: int, length: float) -> np.ndarray:
    """A loose open knot (solver/knots.py) laid in equal chords, its knotted part in the middle of the thread,
    the tails along x, the whole shifted by `start`."""
    kind = sec.get("knot", str, choices=KNOT_KINDS)
    big = sec.get("radius", float, above=0.0, maxval=10.0)
    tube = sec.get("tube", float, 0.5 * big, above=0.0, below=big)
    n = sec.get("n", int, 1, minval=1, maxval=10) if kind == "overhand" else 1
    start = np.array(sec.vector("start", 3, [0.0, 0.0, 0.0]))
    sec.finish()
    core = knot_curve(kind, big, tube, 0.0, n=n)
    core_len = float(np.linalg.norm(np.diff(core, axis=0), axis=1).sum())
    if core_len >= length:
        raise sec.error("radius", f"the knot needs {core_len:.4g} m of thread but the thread is {length:.4g} m: "
                                  f"make the knot smaller")
    pts = lay_chords(knot_curve(kind, big, tube, 0.5 * (length - core_len), n=n), n_seg, length / n_seg)
    return pts - pts[0] + start


def _polyline_shape(sec: Section, n_seg: int, length: float) -> np.ndarray:
    """The thread along a polyline from its first corner, with a vertex on every corner (a pass's entry and
    exit points lie on the thread exactly); what the polyline lacks of the thread's length continues straight
    past its last corner. The segments are shared among the legs in proportion to their lengths (largest
    remainder, at least one each), so they are nearly, not exactly, equal."""
    pts = sec.raw("points")
    try:
        corners = np.asarray(pts, dtype=np.float64)
    except (TypeError, ValueError):
        raise sec.error("points", "must be a list of [x, y, z] corners") from None
    if corners.ndim != 2 or corners.shape[1] != 3 or corners.shape[0] < 2 or not np.all(np.isfinite(corners)):
        raise sec.error("points", "must be at least two finite [x, y, z] corners")
    sec.finish()
    legs = np.linalg.norm(np.diff(corners, axis=0), axis=1)
    if np.any(legs <= 0.0):
        raise sec.error("points", "consecutive corners must differ")
    rest = length - float(legs.sum())
    if rest < -1e-9 * length:
        raise sec.error("points", f"the polyline is {legs.sum():.6g} m long but the thread only {length:.6g} m")
    if rest <= 1e-9 * length:
        rest = 0.0      # the polyline is the whole thread (a rounding remainder would make a null segment)
    spans = np.append(legs, rest)
    need = len(legs) + (1 if rest > 0.0 else 0)
    if need > n_seg:
        raise sec.error("points", f"{len(legs)} legs{' and the rest of the thread past them' if rest > 0.0 else ''} "
                                  f"need at least {need} segments; the thread has {n_seg}")
    share = spans / length * n_seg
    count = np.where(spans > 0.0, np.maximum(np.floor(share), 1), 0).astype(int)
    count[:-1] = np.maximum(count[:-1], 1)
    while count.sum() > n_seg:                    # the minimum of one per leg took too many: trim the longest
        count[np.argmax(np.where(count > 1, spans / np.maximum(count, 1), -1.0))] -= 1
    order = np.argsort(-(share - np.floor(share)))
    k = 0
    while count.sum() < n_seg:                    # largest remainder first
        i = order[k % len(order)]
        if spans[i] > 0.0:
            count[i] += 1
        k += 1
    out = [corners[0]]
    for i in range(len(legs)):
        a, b = corners[i], corners[i + 1]
        for s in range(1, count[i] + 1):
            out.append(a + (b - a) * s / count[i])
    if count[-1] > 0:
        d = (corners[-1] - corners[-2]) / legs[-1]
        for s in range(1, count[-1] + 1):
            out.append(corners[-1] + d * rest * s / count[-1])
    return np.array(out)


def _bend_shape(sec: Section, n_seg: int, length: float) -> np.ndarray:
    """The thread tied into a loose bend round a loop (solver/knots.py bend_thread), shifted by `start`."""
    kind = sec.get("knot", str, choices=BEND_KINDS)
    spacing = sec.get("spacing", float, above=0.0, maxval=1.0)
    tail = sec.get("tail", float, above=0.0, maxval=10.0)
    start = np.array(sec.vector("start", 3, [0.0, 0.0, 0.0]))
    sec.finish()
    if length / n_seg > 0.75 * spacing:
        raise sec.error("spacing", f"segments of {length / n_seg:.4g} m cannot lay a weave whose strands are "
                                   f"{spacing:.4g} m apart: use at least {math.ceil(length / (0.75 * spacing))} "
                                   f"segments or a larger spacing")
    try:
        pts, _ = bend_thread(kind, n_seg, length, spacing, tail)
    except ValueError as exc:
        raise sec.error("spacing", str(exc)) from None
    return pts + start


def build_scenario(data: dict, file: str, *, policy: FilePolicy | None = None,
                   base_dir: str | os.PathLike | None = None) -> Scenario:
    """Validate a scenario mapping read from ``file`` (a path, or a label such as "<load request>") and build
    its model and initial state. Its relative file references (thread.preset, shape.file) resolve against
    ``base_dir`` (None: the directory of ``file``); ``policy`` (None: trusted) confines them
    (solver/sources.py)."""
    files = ScenarioFiles(Path(file).parent if base_dir is None else Path(base_dir), policy)
    top = Section(data, file)
    name = top.get("name", str, Path(file).stem)
    description = top.get("description", str, "")
    duration = top.get("duration", float, 10.0, above=0.0, maxval=MAX_DURATION)
    params = resolve_thread(merged_thread_section(top.section("thread"), files=files))
    n_seg = params.segments
    n = n_seg + 1
    gravity = top.vector("gravity", 3, [0.0, 0.0, -9.81])
    if math.hypot(*gravity) > MAX_GRAVITY:
        raise top.error("gravity", f"its magnitude must be <= {MAX_GRAVITY:g} m/s^2 (100 g), got "
                                   f"{math.hypot(*gravity):g}")

    x0 = _shape(top.section("shape", {}), n_seg, params.length, files)
    if not np.all(np.abs(x0) <= MAX_POSITION):
        raise top.error("shape", f"the thread must lie within {MAX_POSITION:g} m of the origin in each coordinate")
    rest = np.linalg.norm(np.diff(x0, axis=0), axis=1)

    settings = _solver_settings(top.section("solver", {}))
    kinematic, forces, grasps, grasp_targets, twist0 = _boundary(top.section("boundary", {}), n, x0)

    contact = _contact(top.section("contact", None), params, rest)
    tissue = read_tissue(top.section("tissue", None), params, rest)
    needle = read_needle(top.section("needle", None), {g.id: g for g in grasps}, kinematic)
    if needle is not None and needle.grasp is not None:
        grasps = [dataclasses.replace(g, kind="needle") if g.id == needle.grasp else g for g in grasps]

    # -- timeline --------------------------------------------------------------------------------------
    timeline = _timeline(top.sections("timeline"), n, x0, kinematic, {g.id: g for g in grasps}, grasp_targets,
                         needle)

    model = build_model(params, settings, gravity=gravity, kinematic_vertices=kinematic, rest_length=rest,
                        timeline=timeline, contact=contact)
    if tissue is not None:
        model = dataclasses.replace(model, tissue_on=True, tissue_par=tissue.par, pads=tissue.pads,
                                    pad_ids=tissue.ids)
    if needle is not None:
        # the swage is vertex 0: it carries the needle's mass
        model.mass[0] += needle.par[NP_MASS]
        model.inv_mass[0] = 1.0 / model.mass[0]
        model = dataclasses.replace(model, needle_on=True, needle_par=needle.par)

    v0 = _initial_velocity(top.section("initial_velocity", None), n, rest)

    workspaces = _workspaces(top.section("devices", {}))
    rsec = top.section("record", {})
    state_rate = rsec.get("state_rate", float, 100.0, above=0.0, maxval=1.0 / settings.tick)
    rsec.finish()
    top.finish()

    state = _initial_state(model, file, x0, v0, twist0, needle, tissue, forces, grasps, grasp_targets)
    return Scenario(name=name, description=description, file=file, duration=duration, state_rate=state_rate,
                    model=model, initial=state, grasps=grasps, force_vertices=[v for v, _ in forces],
                    source=data, needle_grasp=needle.grasp if needle is not None else None,
                    base_dir=str(files.base_dir), files_read=tuple(files.read), workspaces=workspaces,
                    targets=tissue.targets if tissue is not None else ())


def _workspaces(sec: Section) -> dict[str, Workspace]:
    """The scenario's ``devices`` section: per device name, where its workspace sits in this scene
    (``workspace_offset``, m) and its ``motion_scale``. A server config's own values for a device win."""
    out = {}
    for name in sec.keys():
        d = sec.section(name)
        offset = d.vector("workspace_offset", 3, [0.0, 0.0, 0.0])
        if not all(abs(v) <= MAX_POSITION for v in offset):
            raise d.error("workspace_offset", f"must be within {MAX_POSITION:g} m in each coordinate")
        out[str(name)] = Workspace(tuple(offset), d.get("motion_scale", float, 1.0, above=0.0,
                                                        maxval=MAX_MOTION_SCALE),
                                   d.get("tool", str, None, choices=TOOLS) if d.has("tool") else None)
        d.finish()
    sec.finish()
    return out


def _solver_settings(ssec: Section) -> SolverSettings:
    """The scenario's ``solver`` section."""
    sub_raw = ssec.raw("substeps", "auto")
    if sub_raw == "auto":
        substeps = 0
    elif isinstance(sub_raw, int) and not isinstance(sub_raw, bool) and 1 <= sub_raw <= MAX_SUBSTEPS:
        substeps = sub_raw
    else:
        raise ssec.error("substeps", f"must be 'auto' or an integer in 1..{MAX_SUBSTEPS} (more never fits a "
                                     f"1 ms tick), got {sub_raw!r}")
    settings = SolverSettings(
        method=ssec.get("method", str, "newton", choices=("newton", "contraction")),
        tol=ssec.get("tol", float, 1e-12, above=0.0, maxval=1e-6),
        max_iters=ssec.get("max_iters", int, 50, minval=1, maxval=10_000),
        tick=ssec.get("tick", float, 1e-3, above=0.0, maxval=0.1),
        substeps=substeps,
        max_substeps=ssec.get("max_substeps", int, 32, minval=1, maxval=MAX_SUBSTEPS),
        retry_substeps=ssec.get("retry_substeps", int, 1024, minval=1, maxval=MAX_RETRY_SUBSTEPS),
        stability_target=ssec.get("stability_target", float, 1.0, above=0.0, maxval=2.0),
        scaled_mass_keeps=ssec.get("scaled_mass_keeps", str, "energy", choices=("energy", "velocity")),
        mass_scaling=ssec.get("mass_scaling", str, "local", choices=("local", "whole-thread")),
    )
    ssec.finish()
    return settings


def _boundary(bsec: Section, n: int, x0: np.ndarray) -> tuple:
    """The ``boundary`` section of a thread of n vertices at x0 (m): (kinematic vertices, point forces as
    (vertex, N), GraspSpecs, grasp targets (m), initial twist (rad))."""
    kinematic: list[int] = []
    for key in ("pinned", "driven"):
        lst = bsec.raw(key, [])
        if not isinstance(lst, list):
            raise bsec.error(key, f"must be a list of vertex indices, got {lst!r}")
        for v in lst:
            kinematic.append(_vertex(bsec, key, n, v))
    forces = []
    for fs in bsec.sections("forces"):
        forces.append((_vertex(fs, "vertex", n), fs.vector("force", 3)))
        if math.hypot(*forces[-1][1]) > MAX_LOAD:
            raise fs.error("force", f"its magnitude must be <= {MAX_LOAD:g} N, got {math.hypot(*forces[-1][1]):g}")
        fs.finish()
    grasps: list[GraspSpec] = []
    grasp_targets = []
    for i, gs in enumerate(bsec.sections("grasps")):
        if i >= MAX_GRASPS:
            raise gs.error("id", f"at most {MAX_GRASPS} grasps")
        gid = _name(gs, "id", f"grasp{i}")
        if any(g.id == gid for g in grasps):
            raise gs.error("id", f"duplicate grasp id {gid!r}")
        v = _vertex(gs, "vertex", n)
        if v in kinematic:
            raise gs.error("vertex", f"vertex {v} is pinned or driven; a grasp needs a free vertex")
        grasps.append(GraspSpec(
            id=gid, slot=i, vertex=v, device=_name(gs, "device", gid),
            stiffness=gs.get("stiffness", float, 1000.0, above=0.0, maxval=MAX_GRASP_STIFFNESS),
            damping=gs.get("damping", float, 0.0, minval=0.0, maxval=MAX_GRASP_DAMPING),
            max_force=gs.get("max_force", float, 10.0, above=0.0, maxval=MAX_GRASP_FORCE)))
        grasp_targets.append(gs.vector("target", 3, list(x0[v])))
        if max(abs(c) for c in grasp_targets[-1]) > MAX_POSITION:
            raise gs.error("target", f"must lie within {MAX_POSITION:g} m of the origin in each coordinate")
        gs.finish()
    twist0 = bsec.get("initial_twist", float, 0.0, minval=-MAX_TWIST, maxval=MAX_TWIST)
    bsec.finish()
    return kinematic, forces, grasps, grasp_targets, twist0


def _initial_velocity(vsec: Section | None, n: int, rest: np.ndarray) -> np.ndarray:
    """The ``initial_velocity`` section: (n, 3) m/s, uniform or linear in arc length from start to end."""
    v0 = np.zeros((n, 3))
    if vsec is not None:
        if vsec.has("uniform"):
            v0[:] = vsec.vector("uniform", 3)
        else:
            a = np.array(vsec.vector("start", 3))
            b = np.array(vsec.vector("end", 3))
            s = np.concatenate([[0.0], np.cumsum(rest)]) / rest.sum()
            v0 = np.outer(1.0 - s, a) + np.outer(s, b)  # linear in arc length
        if np.max(np.linalg.norm(v0, axis=1)) > MAX_SPEED:
            raise vsec.error("uniform" if vsec.has("uniform") else "end",
                             f"speeds must be <= {MAX_SPEED:g} m/s")
        vsec.finish()
    return v0


def _initial_state(model: ThreadModel, file: str, x0: np.ndarray, v0: np.ndarray, twist0: float,
                   needle: NeedleSpec | None, tissue: TissueSpec | None, forces: list, grasps: list,
                   grasp_targets: list) -> ThreadState:
    """The scenario's initial state: the thread at x0 (m) moving at v0 (m/s), the needle in its orientation and
    outside the pads, the thread through its punctures, the point forces (N) and the grasps on."""
    state = make_state(model, x0, v0, twist0)
    if needle is not None:
        state.nst[NS_Q:NS_Q + 4] = needle.orientation
        state.nst[NS_QT:NS_QT + 4] = needle.orientation
        if tissue is not None:
            inside = needle_inside_pads(state, model)
            if inside is not None:
                raise ConfigError(file, "needle.orientation", f"the needle starts inside pad {inside!r}; place it "
                                                              "outside the tissue (only its tip may enter, by piercing)")
    if tissue is not None:
        tissue.thread_through(state, model)
    for vtx, f in forces:
        state.ext_force[vtx] += f
    for g, target in zip(grasps, grasp_targets):
        state.grasp_vertex[g.slot] = g.vertex
        state.grasp_k[g.slot] = g.stiffness
        state.grasp_c[g.slot] = g.damping
        state.grasp_fmax[g.slot] = g.max_force
        state.grasp_target[g.slot] = target
        state.grasp_target_prev[g.slot] = target
    return state


def _name(sec: Section, key: str, default: str) -> str:
    """A grasp's id or device: printable, 1 to MAX_NAME_CHARS characters (it is copied into every message)."""
    value = sec.get(key, str, default)
    if not is_name(value):
        raise sec.error(key, f"must be printable and 1 to {MAX_NAME_CHARS} characters (it is sent in every "
                             f"`force` and `state`), got {len(value)}")
    return value


def _max_pairs(sec: Section, n_segments: int) -> int:
    """The neighbour list's capacity: given, or 32 a segment; at most MAX_CONTACT_PAIRS (memory)."""
    default = min(32 * n_segments, MAX_CONTACT_PAIRS)
    value = sec.get("max_pairs", int, default, minval=1)
    if value > MAX_CONTACT_PAIRS:
        raise sec.error("max_pairs", f"must be <= {MAX_CONTACT_PAIRS} ({CONTACT_PAIR_BYTES} bytes a pair, held "
                                     f"twice: {2 * CONTACT_PAIR_BYTES * MAX_CONTACT_PAIRS / 1e6:g} MB), got {value}")
    return value


def _contact(sec: Section | None, params, rest: np.ndarray) -> ContactSettings:
    """The `contact:` section (docs/SCENARIOS.md): self-contact on, and how stiff, thick and rough."""
    if sec is None:
        return ContactSettings()
    enabled = sec.get("enabled", bool, True)
    distance = sec.get("distance", float, 2.0 * params.contact_radius, minval=0.0)
    if enabled and distance <= 0.0:
        raise sec.error("distance", "self-contact needs a contact distance (m): give contact.distance, or the "
                                    "thread's contact_radius or diameter")
    stiffness = sec.get("stiffness", float, params.contact_stiffness, minval=0.0, maxval=1e7)
    mu_s = sec.get("friction_static", float, params.friction_static, minval=0.0, maxval=10.0)
    mu_k = sec.get("friction_kinetic", float, min(params.friction_kinetic, mu_s), minval=0.0, maxval=10.0)
    if mu_k > mu_s:
        raise sec.error("friction_kinetic", f"{mu_k} exceeds friction_static {mu_s}: kinetic friction is at "
                                            "most static")
    min_gap = sec.get("min_gap", float, 0.5 * distance, minval=0.0)
    if enabled and not 0.0 < min_gap <= distance:
        raise sec.error("min_gap", f"must be in (0, distance = {distance:g}] m, got {min_gap:g}")
    settings = ContactSettings(
        enabled=enabled, stiffness=stiffness, distance=distance,
        smooth=sec.get("smooth", float, 0.1 * distance, minval=0.0, maxval=max(distance, 0.0)),
        min_gap=min_gap, friction_static=mu_s, friction_kinetic=mu_k,
        skin=sec.get("skin", float, max(distance, 0.25 * float(np.median(rest))), above=0.0),
        recover_speed=sec.get("recover_speed", float, 0.1, above=0.0, maxval=100.0),
        # a pair closer along the thread than the contact distance touches only by folding within the thread's
        # own thickness, which bending resists: not a contact
        exclude=sec.get("exclude", int, max(1, math.ceil(distance / float(np.median(rest)) - 1e-9)), minval=1,
                        maxval=max(1, rest.shape[0] - 2)),
        max_pairs=_max_pairs(sec, rest.shape[0]),
        rounds=sec.get("rounds", int, 32, minval=1, maxval=256),
        polygon_friction=sec.get("polygon_friction", bool, True),
        settle=sec.get("settle", float, ContactSettings.settle, above=0.0, maxval=1.0),
        warm_friction=sec.get("warm_friction", bool, True),
        stall=sec.get("stall", float, ContactSettings.stall, minval=0.0, maxval=1.0))
    sec.finish()
    return settings


PATH_POINTS_PER_TURN = 48   # a circle as a 48-gon: the chord sits 0.2 % of the radius inside the arc


def _unit(es: Section, key: str, default: list) -> np.ndarray:
    v = np.array(es.vector(key, 3, default, nonzero=True))
    return v / np.linalg.norm(v)


def _scripted_path(es: Section, here: np.ndarray, a: float, b: float) -> np.ndarray:
    """The named stylus motions (docs/SCENARIOS.md, `path`), from position ``here`` (m) over [a, b] (s), as
    waypoints [[t, x, y, z], ...]: a scripted stylus runs them as a piecewise-linear path."""
    name = es.get("path", str, choices=("circle", "lift_and_pull", "wrap"))
    if name == "lift_and_pull":
        lift = es.get("lift", float, minval=0.0, maxval=10.0)
        pull = np.array(es.vector("pull", 3))
        up = here + np.array([0.0, 0.0, lift])
        return np.array([[a, *here], [a + (b - a) / 3.0, *up], [b, *(up + pull)]])
    turns = es.get("turns", float, 1.0, above=0.0, maxval=100.0)
    m = max(2, int(np.ceil(PATH_POINTS_PER_TURN * turns)))
    phase = np.linspace(0.0, 2.0 * np.pi * turns, m + 1)
    if name == "circle":
        radius = es.get("radius", float, above=0.0, maxval=10.0)
        normal = _unit(es, "normal", [0.0, 0.0, 1.0])
        # u: the direction from the centre to the start, any unit vector normal to `normal`
        e = np.eye(3)[int(np.argmin(np.abs(normal)))]
        u = np.cross(normal, e)
        u /= np.linalg.norm(u)
        w = np.cross(normal, u)
        centre = here - radius * u
        pts = centre + radius * (np.cos(phase)[:, None] * u + np.sin(phase)[:, None] * w)
    else:  # wrap: helical turns round the line through `around` along `axis`, from where the stylus is
        axis = _unit(es, "axis", [1.0, 0.0, 0.0])
        around = np.array(es.vector("around", 3))
        advance = es.get("advance", float, 0.0)
        r_vec = here - around - np.dot(here - around, axis) * axis
        radius = np.linalg.norm(r_vec)
        if radius < 1e-6:
            raise es.error("around", "the stylus is on the axis: a wrap needs it off the axis")
        u = r_vec / radius
        w = np.cross(axis, u)
        base = here - r_vec
        pts = (base + radius * (np.cos(phase)[:, None] * u + np.sin(phase)[:, None] * w)
               + (phase / phase[-1] * advance)[:, None] * axis)
    pts[0] = here
    times = np.linspace(a, b, m + 1)
    return np.column_stack([times, pts])


def needle_inside_pads(state: ThreadState, model: ThreadModel) -> str | None:
    """The id of a pad the needle (tip included) is inside of, or None."""
    r, arc = model.needle_par[NP_RADIUS], model.needle_par[NP_ARC]
    for k in range(49):
        px, py, pz = arc_point(state.x, state.nst, NS_Q, r, arc * k / 48)
        for p, pid in enumerate(model.pad_ids):
            rel = np.abs(np.array([px, py, pz]) - state.pst[p, :3]) - model.pads[p, :3]
            if np.all(rel < 0.0):
                return pid
    return None


def _rotation(axis_angle: np.ndarray) -> np.ndarray:
    """The rotation matrix of a rotation vector (rad)."""
    ang = float(np.linalg.norm(axis_angle))
    if ang == 0.0:
        return np.eye(3)
    k = axis_angle / ang
    kx = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + math.sin(ang) * kx + (1.0 - math.cos(ang)) * kx @ kx


def _quat_matrix(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


class _Timeline:
    """The timeline's motion rows as they are read (solver/motion.py: kind, index, start and end in s,
    velocity), with what an entry needs to know of the rows before it: where a vertex or grasp is, how the
    needle's stylus is turned."""

    def __init__(self, needle: NeedleSpec | None):
        self.needle = needle
        self.kind: list[int] = []
        self.index: list[int] = []
        self.t0: list[float] = []
        self.t1: list[float] = []
        self.vel: list = []

    def add(self, kind: int, index: int, a: float, b: float, vel) -> None:
        self.kind.append(kind)
        self.index.append(index)
        self.t0.append(a)
        self.t1.append(b)
        self.vel.append(vel)

    def position_at(self, k: int, i: int, t: float, start: np.ndarray) -> np.ndarray:
        """Where subject (k, i) is at t (s), starting from ``start`` (m) and moved by the rows so far."""
        p = start.copy()
        for kk, ii, a, b, v in zip(self.kind, self.index, self.t0, self.t1, self.vel):
            if kk == k and ii == i:
                p += np.asarray(v) * max(0.0, min(b, t) - a)
        return p

    def needle_frame_at(self, t: float) -> np.ndarray:
        """The needle stylus's orientation at t as a matrix (spins do not overlap in time)."""
        rot = _quat_matrix(self.needle.orientation)
        rows = zip(self.kind, self.t0, self.t1, self.vel)
        for kk, a, b, v in sorted((kk, a, b, v) for kk, a, b, v in rows if kk == MOTION_SPIN):
            rot = _rotation(np.asarray(v) * max(0.0, min(b, t) - a)) @ rot
        return rot

    def add_spin(self, es: Section, a: float, b: float, w: np.ndarray) -> None:
        for kk, aa, bb in zip(self.kind, self.t0, self.t1):
            if kk == MOTION_SPIN and aa < b and a < bb:
                raise es.error("from", f"overlaps the needle's turn over [{aa:g}, {bb:g}] s; turns must not overlap")
        self.add(MOTION_SPIN, 0, a, b, list(w))

    def needle_entry(self, es: Section, grasps: dict[str, GraspSpec], grasp_targets: list) -> None:
        """An entry that spins the needle's stylus, or drives the needle along its own arc."""
        needle = self.needle
        if needle is None:
            raise es.error("needle", "the scenario has no needle")
        how = es.get("needle", str, choices=("spin", "drive"))
        a = es.get("from", float, 0.0, minval=0.0)
        b = es.get("to", float, above=a)
        if how == "spin":
            self.add_spin(es, a, b, np.array(es.vector("angular_velocity", 3)))
            es.finish()
            return
        # drive: turn the needle about its own arc's centre and axis by `angle`, tip first; its stylus's
        # grasp carries the swage round that circle (waypoints) while its orientation turns (a spin)
        if needle.grasp is None:
            raise es.error("needle", "a drive moves the needle's grasp; give needle.grasp")
        phi = math.radians(es.get("angle", float, minval=-720.0, maxval=720.0))
        es.finish()
        slot = grasps[needle.grasp].slot
        here = self.position_at(MOTION_GRASP, slot, a, np.asarray(grasp_targets[slot]))
        frame = self.needle_frame_at(a)
        centre = here + frame @ np.array([0.0, needle.par[NP_RADIUS], 0.0])
        axis = frame @ np.array([0.0, 0.0, 1.0])
        m = max(8, int(math.ceil(PATH_POINTS_PER_TURN * abs(phi) / (2.0 * math.pi))))
        pts = [centre + _rotation(axis * phi * s / m) @ (here - centre) for s in range(m + 1)]
        times = np.linspace(a, b, m + 1)
        for s in range(m):
            self.add(MOTION_GRASP, slot, times[s], times[s + 1],
                     list((pts[s + 1] - pts[s]) / (times[s + 1] - times[s])))
        self.add_spin(es, a, b, axis * phi / (b - a))

    def twist_entry(self, es: Section) -> None:
        """An entry that turns the input twist at the thread's end at ``rate`` (rad/s)."""
        es.get("twist", str, choices=("input",))  # the subject: the input twist at the thread's end
        rate = es.get("rate", float, minval=-MAX_SPIN, maxval=MAX_SPIN)
        a = es.get("from", float, 0.0, minval=0.0)
        if es.has("max"):
            mx = es.get("max", float, above=0.0)
            if rate == 0.0:
                raise es.error("rate", "must not be 0 with 'max'")
            b = a + mx / abs(rate)
        else:
            b = es.get("to", float, above=a)
        self.add(MOTION_TWIST, 0, a, b, [rate, 0.0, 0.0])
        es.finish()

    def motion_entry(self, es: Section, subj: str, k: int, i: int, start: np.ndarray) -> None:
        """An entry that moves subject (k, i) from ``start`` (m): by velocity, to a point, along waypoints or a
        scripted path."""
        modes = [m for m in ("velocity", "move_to", "waypoints", "path") if es.has(m)]
        if len(modes) != 1:
            raise es.error("velocity", "give exactly one of: velocity, move_to, waypoints, path")
        if modes[0] in ("path", "waypoints"):
            if modes[0] == "path":
                a = es.get("from", float, 0.0, minval=0.0)
                b = es.get("to", float, above=a)
                arr = _scripted_path(es, self.position_at(k, i, a, start), a, b)
            else:
                wps = es.raw("waypoints")
                try:
                    arr = np.asarray(wps, dtype=np.float64) if isinstance(wps, list) else np.zeros((0,))
                except (TypeError, ValueError):
                    arr = np.zeros((0,))
                if arr.ndim != 2 or arr.shape[1] != 4 or arr.shape[0] < 2 or not np.all(np.isfinite(arr)):
                    raise es.error("waypoints", "must be a list of at least two [t, x, y, z] (s, m)")
                if np.any(np.diff(arr[:, 0]) <= 0) or arr[0, 0] < 0:
                    raise es.error("waypoints", "times must start >= 0 and increase")
                here = self.position_at(k, i, arr[0, 0], start)
                if np.linalg.norm(here - arr[0, 1:]) > 1e-6:
                    raise es.error("waypoints", f"the first waypoint must be where the {subj} is at t={arr[0, 0]} "
                                   f"s: {np.round(here, 6).tolist()}")
            # each consecutive pair of [t, x, y, z] is one segment of constant velocity
            for p, q in zip(arr[:-1], arr[1:]):
                self.add(k, i, p[0], q[0], list((q[1:] - p[1:]) / (q[0] - p[0])))
            es.finish()
            return
        a = es.get("from", float, 0.0, minval=0.0)
        b = es.get("to", float, above=a)
        if modes[0] == "velocity":
            v = es.vector("velocity", 3)
        else:
            goal = np.array(es.vector("move_to", 3))
            v = list((goal - self.position_at(k, i, a, start)) / (b - a))
        self.add(k, i, a, b, v)
        es.finish()

    def check_speeds(self, marks: list) -> None:
        """Every row within the speed limits; ``marks``: (first row, its entry), to name the entry."""
        for r, (kk, v) in enumerate(zip(self.kind, self.vel)):
            limit, unit = (MAX_SPIN, "rad/s") if kk in (MOTION_SPIN, MOTION_TWIST) else (MAX_SPEED, "m/s")
            speed = abs(v[0]) if kk == MOTION_TWIST else math.sqrt(v[0] ** 2 + v[1] ** 2 + v[2] ** 2)
            if speed > limit:
                es = [e for first, e in marks if first <= r][-1]
                raise es.error("from", f"moves at {speed:.4g} {unit}, faster than {limit:g} {unit}")


def _timeline(entries: list[Section], n: int, x0: np.ndarray, kinematic: list[int],
              grasps: dict[str, GraspSpec], grasp_targets: list, needle: NeedleSpec | None = None) -> dict:
    """The ``timeline`` entries as motion rows (solver/motion.py), in the arrays build_model takes."""
    tl = _Timeline(needle)
    marks: list[tuple[int, Section]] = []   # (first motion row, its entry), for the speed check after the loop
    for es in entries:
        marks.append((len(tl.kind), es))
        subjects = [k for k in ("vertex", "grasp", "twist", "needle") if es.has(k)]
        if len(subjects) != 1:
            raise es.error("vertex", "each timeline entry moves exactly one of: vertex, grasp, twist, needle")
        subj = subjects[0]
        if subj == "needle":
            tl.needle_entry(es, grasps, grasp_targets)
            continue
        if subj == "twist":
            tl.twist_entry(es)
            continue
        if subj == "vertex":
            i = _vertex(es, "vertex", n)
            if i not in kinematic:
                raise es.error("vertex", f"vertex {i} must be listed in boundary.driven (or pinned) to be moved")
            k, start = MOTION_VERTEX, x0[i]
        else:
            gid = es.get("grasp", str)
            if gid not in grasps:
                raise es.error("grasp", f"no grasp {gid!r} in boundary.grasps")
            i = grasps[gid].slot
            k, start = MOTION_GRASP, np.asarray(grasp_targets[i])
            if es.has("release"):
                # the hand lets go at this time: its coupling goes slack (no force either way)
                at = es.get("release", float, minval=0.0)
                tl.add(MOTION_RELEASE, i, at, at, [0.0, 0.0, 0.0])
                es.finish()
                continue
        tl.motion_entry(es, subj, k, i, start)
    tl.check_speeds(marks)
    return {"kind": tl.kind, "index": tl.index, "t0": tl.t0, "t1": tl.t1, "vel": tl.vel}
