"""Validated configuration: thread presets, scenario files, error messages, timeline compilation.

Fast: nothing here steps the simulation; scenarios are only loaded and their initial states built.
"""

import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from suturesim.solver import presets
from suturesim.solver.config import ConfigError
from suturesim.solver.contact_response import CP_NEAR
from suturesim.solver.model import SolverSettings
from suturesim.solver.motion import MOTION_GRASP, MOTION_TWIST, MOTION_VERTEX
from suturesim.solver.scenario import load_scenario, scenario_names

# A small valid thread: 1 m, 10 segments -> 11 vertices, straight along +x from the origin.
THREAD = """\
thread:
  length: 1.0
  segments: 10
  mass: 0.01
  bending_stiffness: 1.0e-6
"""


def _write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _load(tmp_path: Path, text: str, name: str = "scenario.yaml"):
    return load_scenario(str(_write(tmp_path, text, name)))


def _error(tmp_path: Path, text: str, key: str, reason: str, *, file: str | None = None,
           name: str = "scenario.yaml") -> str:
    """Load ``text`` expecting a ConfigError that names ``file`` (default: the scenario), ``key`` and ``reason``."""
    path = _write(tmp_path, text, name)
    with pytest.raises(ConfigError) as info:
        load_scenario(str(path))
    msg = str(info.value)
    assert (file or path.name) in msg, msg
    if key:
        assert f": {key}: " in msg, msg
        assert info.value.key == key
    assert reason in msg, msg
    return msg


# -- shipped presets and scenarios --------------------------------------------------------------------------
def test_something_is_shipped():
    assert len(presets.preset_names()) >= 1
    assert len(scenario_names()) >= 1


@pytest.mark.parametrize("name", presets.preset_names())
def test_shipped_preset_loads(name):
    p = presets.load_preset(name)
    assert p.segments >= 1 and p.length > 0
    for value in (p.bending_stiffness, p.linear_density):
        assert math.isfinite(value) and value > 0
    assert math.isfinite(p.twisting_stiffness) and p.twisting_stiffness >= 0
    assert math.isfinite(p.contact_radius) and p.contact_radius >= 0
    assert p.stretch_stiffness > 0 and (math.isfinite(p.stretch_stiffness) == p.extensible)
    raw = yaml.safe_load(presets.preset_path(name).read_text())
    if "poisson_ratio" in raw:
        # isotropic rod: GJ / EI = 2 G / E = 1 / (1 + nu)
        assert p.twisting_stiffness / p.bending_stiffness == pytest.approx(1.0 / (1.0 + float(raw["poisson_ratio"])))
    if p.twisting_stiffness > 0 and "paper_kt" not in raw and "twisting_stiffness" not in raw:
        assert 0.5 < p.twisting_stiffness / p.bending_stiffness <= 1.0
    if "diameter" in raw:
        assert 0 < p.diameter < 0.01  # a suture, m


@pytest.mark.parametrize("name", scenario_names())
def test_shipped_scenario_initial_state_satisfies_rest_lengths(name):
    s = load_scenario(name)
    x = s.initial.x
    rest = s.model.rest_length
    assert x.shape == (s.model.params.segments + 1, 3)
    seg = np.linalg.norm(np.diff(x, axis=0), axis=1)
    np.testing.assert_allclose(seg, rest, rtol=1e-12, atol=0)
    kind = s.source.get("shape", {}).get("kind")
    if kind == "points":
        # published points (Choi's knots): their own edges, which add up to the thread's length
        assert rest.sum() == pytest.approx(s.model.params.length, rel=1e-9)
    elif kind == "polyline":
        # a vertex on every corner: the legs' segments nearly equal, adding up to the thread's length
        assert rest.sum() == pytest.approx(s.model.params.length, rel=1e-9)
        assert rest.max() / rest.min() < 1.2
    else:
        # the other shipped shapes have equal segments that add up to the thread's length
        np.testing.assert_allclose(rest, s.model.params.length / s.model.params.segments, rtol=1e-12)
    assert np.all(np.isfinite(s.initial.x_prev))
    assert s.duration > 0 and s.state_rate > 0


def test_load_scenario_by_name_and_by_path_agree():
    name = scenario_names()[0]
    a = load_scenario(name)
    b = load_scenario(str(Path(a.file)))
    np.testing.assert_array_equal(a.initial.x, b.initial.x)
    assert a.model.params == b.model.params


# -- quantity mappings ----------------------------------------------------------------------------------------
def _preset(tmp_path, text, name="thread.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return presets.load_preset(str(path))


def test_paper_kb_mapping_is_exact(tmp_path):
    p = _preset(tmp_path, """\
        length: 1.0
        segments: 100
        mass: 0.01
        paper_kb: 0.001
        paper_kt: 0.002
        """)
    assert p.bending_stiffness == 0.001 * 0.01 / 2
    assert p.twisting_stiffness == 0.002  # k_t is GJ itself
    assert p.linear_density == 0.01


def test_paper_kb_scales_with_segment_length(tmp_path):
    s = _load(tmp_path, """\
        thread:
          length: 1.0
          segments: 20
          mass: 0.02
          paper_kb: 0.02
        """)
    assert s.model.params.bending_stiffness == pytest.approx(0.02 * 0.05 / 2, rel=1e-15)


def test_youngs_modulus_poisson_and_density_mappings(tmp_path):
    E, d, nu, rho = 3.0e9, 1.75e-4, 0.4, 1140.0
    p = _preset(tmp_path, f"""\
        length: 0.45
        segments: 100
        diameter: {d!r}
        density: {rho!r}
        youngs_modulus: 3.0e+9
        poisson_ratio: {nu!r}
        """)
    assert p.bending_stiffness == pytest.approx(E * math.pi * d ** 4 / 64, rel=1e-14)
    assert p.twisting_stiffness == pytest.approx(E / (2 * (1 + nu)) * math.pi * d ** 4 / 32, rel=1e-14)
    assert p.linear_density == pytest.approx(rho * math.pi * d ** 2 / 4, rel=1e-14)
    assert p.contact_radius == d / 2  # default
    assert not p.extensible and p.stretch_stiffness == math.inf


def test_other_mappings(tmp_path):
    d, G = 2.0e-4, 1.0e9
    p = _preset(tmp_path, f"""\
        length: 2.0
        segments: 4
        diameter: {d!r}
        mass: 0.5
        bending_stiffness: 1.0e-6
        shear_modulus: 1.0e+9
        extensible: true
        stretch_stiffness: 50.0
        """)
    assert p.linear_density == 0.25
    assert p.bending_stiffness == 1.0e-6
    assert p.twisting_stiffness == pytest.approx(G * math.pi * d ** 4 / 32, rel=1e-14)
    assert p.extensible and p.stretch_stiffness == 50.0


def test_extensible_stretch_from_youngs_modulus(tmp_path):
    E, d = 4.0e9, 1.25e-4
    p = _preset(tmp_path, f"""\
        length: 0.45
        segments: 10
        diameter: {d!r}
        linear_density: 1.0e-5
        youngs_modulus: 4.0e+9
        extensible: true
        """)
    assert p.stretch_stiffness == pytest.approx(E * math.pi * d ** 2 / 4, rel=1e-14)
    assert p.twisting_stiffness == 0.0  # twisting is optional


def test_yaml11_exponent_string_is_a_number(tmp_path):
    # PyYAML (YAML 1.1) reads 3.0e9 (no sign in the exponent) as the string '3.0e9'
    assert yaml.safe_load("a: 3.0e9")["a"] == "3.0e9"
    d = 1.0e-3
    s = _load(tmp_path, f"""\
        thread:
          length: 1.0
          segments: 10
          mass: 1e2
          diameter: {d!r}
          youngs_modulus: 3.0e9
        duration: 2e1
        """)
    assert s.model.params.bending_stiffness == pytest.approx(3.0e9 * math.pi * d ** 4 / 64, rel=1e-14)
    assert s.model.params.linear_density == 100.0
    assert s.duration == 20.0


def test_yaml11_exponent_string_in_a_vector(tmp_path):
    s = _load(tmp_path, THREAD + "gravity: [0, 0, -9.81e0]\n")
    assert s.model.gravity.tolist() == [0.0, 0.0, -9.81]


def test_scenario_override_replaces_the_presets_way_of_giving_a_quantity(tmp_path):
    # wang2017-fig4 gives mass, bending_stiffness and twisting_stiffness; each is replaced by another way
    s = _load(tmp_path, """\
        thread:
          preset: wang2017-fig4
          linear_density: 0.03
          paper_kb: 0.004
          diameter: 1.0e-3
          shear_modulus: 1.0e+9
        """)
    p = s.model.params
    base = presets.load_preset("wang2017-fig4")
    assert p.segments == base.segments and p.length == base.length
    assert p.linear_density == 0.03
    assert p.bending_stiffness == pytest.approx(0.004 * (base.length / base.segments) / 2, rel=1e-15)
    assert p.twisting_stiffness == pytest.approx(1.0e9 * math.pi * 1.0e-3 ** 4 / 32, rel=1e-14)


def test_scenario_override_of_the_same_key_and_of_segments(tmp_path):
    s = _load(tmp_path, """\
        thread:
          preset: wang2017-fig17a
          segments: 50
          paper_kb: 0.002
        """)
    assert s.model.params.segments == 50
    assert s.model.params.bending_stiffness == pytest.approx(0.002 * 0.02 / 2, rel=1e-15)
    assert s.initial.x.shape == (51, 3)


def test_load_scenario_overrides_argument(tmp_path):
    path = _write(tmp_path, THREAD)
    s = load_scenario(str(path), overrides={"thread": {"segments": 4}, "duration": 3.0})
    assert s.model.params.segments == 4 and s.duration == 3.0
    assert s.model.params.bending_stiffness == 1.0e-6


def test_preset_by_relative_path(tmp_path):
    (tmp_path / "threads").mkdir()
    (tmp_path / "threads" / "mine.yaml").write_text("length: 0.5\nsegments: 5\nlinear_density: 1.0e-4\n"
                                                   "bending_stiffness: 2.0e-8\n")
    s = _load(tmp_path, "thread:\n  preset: threads/mine.yaml\n  segments: 10\n")
    assert s.model.params.segments == 10 and s.model.params.bending_stiffness == 2.0e-8


# -- defaults -------------------------------------------------------------------------------------------------
def test_defaults(tmp_path):
    s = _load(tmp_path, THREAD, name="my-scen.yaml")
    m = s.model
    assert s.name == "my-scen" and s.description == "" and s.duration == 10.0 and s.state_rate == 100.0
    assert m.gravity.tolist() == [0.0, 0.0, -9.81]
    # the file's defaults are the model's: automatic substeps, Newton multipliers, a 1 ms tick
    assert m.solver == SolverSettings()
    assert m.solver.method == "newton" and m.solver.substeps == 0 and m.solver.tick == 1e-3
    np.testing.assert_allclose(s.initial.x[:, 0], np.linspace(0, 1, 11), rtol=0, atol=1e-15)
    assert np.all(s.initial.x[:, 1:] == 0)
    assert not m.kinematic.any() and m.mot_kind.shape == (0,)
    assert s.initial.twist.tolist() == [0.0, 0.0]
    assert s.grasps == [] and np.all(s.initial.ext_force == 0) and np.all(s.initial.x_prev == s.initial.x)


def test_boundary_grasp_force_and_velocity(tmp_path):
    s = _load(tmp_path, THREAD + textwrap.dedent("""\
        boundary:
          pinned: [0]
          driven: [-1]
          forces:
            - vertex: 5
              force: [0.0, 0.0, -0.1]
          grasps:
            - id: left
              vertex: 3
            - vertex: 7
              stiffness: 500
              damping: 0.5
              max_force: 2
              device: stylus-b
              target: [0.7, 0.0, 0.01]
          initial_twist: 0.5
        initial_velocity:
          uniform: [0.0, 1.0, 0.0]
        solver:
          substeps: 4
        """))
    m, st = s.model, s.initial
    assert m.kinematic.tolist() == [1] + [0] * 9 + [1]
    assert m.inv_mass[0] == 0 and m.inv_mass[10] == 0
    assert st.ext_force[5].tolist() == [0.0, 0.0, -0.1] and s.force_vertices == [5]
    g0, g1 = s.grasps
    assert (g0.id, g0.slot, g0.vertex, g0.device, g0.stiffness, g0.damping, g0.max_force) == \
        ("left", 0, 3, "left", 1000.0, 0.0, 10.0)
    assert (g1.id, g1.slot, g1.vertex, g1.device, g1.stiffness, g1.damping, g1.max_force) == \
        ("grasp1", 1, 7, "stylus-b", 500.0, 0.5, 2.0)
    np.testing.assert_allclose(st.grasp_target[0], st.x[3])  # default target: the vertex
    assert st.grasp_target[1].tolist() == [0.7, 0.0, 0.01]
    assert st.grasp_vertex.tolist()[:2] == [3, 7] and st.grasp_vertex[2] == -1
    assert st.twist[0] == 0.5
    # x_prev = x - v h with h = tick / substeps; kinematic vertices get no velocity
    h = 1e-3 / 4
    np.testing.assert_allclose((st.x - st.x_prev)[1:-1] / h, [[0.0, 1.0, 0.0]] * 9, rtol=1e-9)
    assert np.all(st.x_prev[[0, 10]] == st.x[[0, 10]])


def test_initial_velocity_linear_in_arc_length(tmp_path):
    s = _load(tmp_path, THREAD + textwrap.dedent("""\
        initial_velocity:
          start: [0.0, 0.05, 0.0]
          end: [0.0, -0.05, 0.0]
        solver:
          substeps: 1
        """))
    v = (s.initial.x - s.initial.x_prev) / 1e-3
    np.testing.assert_allclose(v[:, 1], np.linspace(0.05, -0.05, 11), atol=1e-12)


def test_helix_and_points_shapes(tmp_path):
    s = _load(tmp_path, THREAD + textwrap.dedent("""\
        shape:
          kind: helix
          start: [0.1, 0.2, 0.3]
          axis: [0, 0, 1]
          radius: 0.05
          pitch: 0.2
        """))
    x = s.initial.x
    np.testing.assert_allclose(np.linalg.norm(np.diff(x, axis=0), axis=1), 0.1, rtol=1e-12)
    assert x[0].tolist() == pytest.approx([0.1, 0.2, 0.3])
    # the points lie on a cylinder of radius 0.05 about a line parallel to the axis, rising along it
    a, b, c = x[0, :2], x[1, :2], x[2, :2]
    d = 2 * (a[0] * (b[1] - c[1]) + b[0] * (c[1] - a[1]) + c[0] * (a[1] - b[1]))
    centre = np.array([
        (a @ a * (b[1] - c[1]) + b @ b * (c[1] - a[1]) + c @ c * (a[1] - b[1])) / d,
        (a @ a * (c[0] - b[0]) + b @ b * (a[0] - c[0]) + c @ c * (b[0] - a[0])) / d])
    np.testing.assert_allclose(np.linalg.norm(x[:, :2] - centre, axis=1), 0.05, rtol=1e-9)
    np.testing.assert_allclose(np.diff(x[:, 2]), np.diff(x[:, 2])[0], rtol=1e-9)
    assert np.diff(x[:, 2])[0] > 0
    pts = [[i * 0.1, 0.0, 0.0] for i in range(11)]
    s = _load(tmp_path, THREAD + f"shape:\n  kind: points\n  points: {pts}\n")
    np.testing.assert_array_equal(s.initial.x, np.array(pts))



def test_points_shape_from_a_file_beside_the_scenario(tmp_path):
    """`shape.file`: the points in a text file next to the scenario (how Choi's published knots are shipped);
    the same checks as inline points, each naming the file key; a file that cannot be read is named with why."""
    pts = np.array([[i * 0.1, 0.01 * i * i, 0.0] for i in range(11)])
    pts *= 1.0 / np.linalg.norm(np.diff(pts, axis=0), axis=1).sum()      # a 1 m span
    np.savetxt(tmp_path / "knot.txt", pts, header="a comment line")
    s = _load(tmp_path, THREAD + "shape:\n  kind: points\n  file: knot.txt\n")
    np.testing.assert_array_equal(s.initial.x, pts)
    np.savetxt(tmp_path / "short.txt", pts[:-1])
    _error(tmp_path, THREAD + "shape:\n  kind: points\n  file: short.txt\n", "shape.file", "must be 11 finite")
    np.savetxt(tmp_path / "long.txt", 2.0 * pts)
    _error(tmp_path, THREAD + "shape:\n  kind: points\n  file: long.txt\n", "shape.file", "the points span 2")
    (tmp_path / "words.txt").write_text("0 0 zero\n")
    _error(tmp_path, THREAD + "shape:\n  kind: points\n  file: words.txt\n", "shape.file", "cannot read the points")
    _error(tmp_path, THREAD + "shape:\n  kind: points\n  file: missing.txt\n", "shape.file", "missing.txt")
    _error(tmp_path, THREAD + f"shape:\n  kind: points\n  file: knot.txt\n  points: {pts.tolist()}\n", "shape.file",
           "not both")


def test_points_shape_scaled_lays_the_points_at_another_size(tmp_path):
    """`shape.scale`: every point multiplied by it (Choi's knot laid at a suture's diameter); the thread's length
    is then the scaled span, and a scale that is not positive is refused with its key."""
    pts = np.array([[i * 0.1, 0.01 * i * i, 0.0] for i in range(11)])
    pts *= 4.0 / np.linalg.norm(np.diff(pts, axis=0), axis=1).sum()      # a 4 m span, laid at a quarter
    np.savetxt(tmp_path / "knot.txt", pts)
    s = _load(tmp_path, THREAD + "shape:\n  kind: points\n  file: knot.txt\n  scale: 0.25\n")
    np.testing.assert_allclose(s.initial.x, 0.25 * pts, rtol=1e-15)
    assert s.model.rest_length.sum() == pytest.approx(1.0, rel=1e-12)
    _error(tmp_path, THREAD + "shape:\n  kind: points\n  file: knot.txt\n", "shape.file", "the points span 4")
    _error(tmp_path, THREAD + "shape:\n  kind: points\n  file: knot.txt\n  scale: 0\n", "shape.scale", "must be > 0")


# -- errors: file, key path, reason --------------------------------------------------------------------------
def test_error_unknown_top_level_key(tmp_path):
    _error(tmp_path, THREAD + "gravty: [0, 0, -9.81]\n", "gravty", "unknown key")


def test_error_unknown_key_inside_thread(tmp_path):
    _error(tmp_path, THREAD + "  bending_stifness: 1.0e-6\n", "thread.bending_stifness", "unknown key")


def test_error_unknown_key_nested(tmp_path):
    _error(tmp_path, THREAD + "solver:\n  substep: 2\n", "solver.substep", "unknown key")
    _error(tmp_path, THREAD + "boundary:\n  grasps:\n    - vertex: 2\n      stifness: 3\n",
           "boundary.grasps[0].stifness", "unknown key")


def test_error_wrong_type(tmp_path):
    _error(tmp_path, THREAD.replace("length: 1.0", "length: long"), "thread.length", "number")
    _error(tmp_path, THREAD.replace("segments: 10", "segments: ten"), "thread.segments", "integer")
    _error(tmp_path, THREAD.replace("segments: 10", "segments: 10.0"), "thread.segments", "integer")
    _error(tmp_path, THREAD + "duration: true\n", "duration", "number")
    _error(tmp_path, THREAD + "gravity: [0, 0]\n", "gravity", "3 numbers")
    _error(tmp_path, THREAD + "duration: .nan\n", "duration", "finite")


def test_error_negative_stiffness(tmp_path):
    _error(tmp_path, THREAD.replace("bending_stiffness: 1.0e-6", "bending_stiffness: -1"),
           "thread.bending_stiffness", "must be >= 0")


def test_error_zero_segments(tmp_path):
    _error(tmp_path, THREAD.replace("segments: 10", "segments: 0"), "thread.segments", "must be >= 1")


def test_error_two_specs_of_one_quantity(tmp_path):
    msg = _error(tmp_path, THREAD + "  diameter: 1.0e-3\n  youngs_modulus: 1.0e+9\n", "thread.youngs_modulus",
                 "one way only")
    assert "bending_stiffness" in msg


def test_error_two_specs_of_mass(tmp_path):
    _error(tmp_path, THREAD + "  linear_density: 0.01\n", "thread.mass", "one way only")


def test_error_missing_quantity_and_diameter(tmp_path):
    _error(tmp_path, "thread:\n  length: 1\n  segments: 2\n  bending_stiffness: 1.0e-6\n",
           "thread.linear_density", "mass is required")
    _error(tmp_path, "thread:\n  length: 1\n  segments: 2\n  mass: 1\n  youngs_modulus: 1.0e+9\n",
           "thread.youngs_modulus", "diameter")
    _error(tmp_path, THREAD + "  poisson_ratio: 0.3\n", "thread.poisson_ratio", "youngs_modulus")
    _error(tmp_path, THREAD + "  extensible: true\n", "thread.extensible", "stretch_stiffness")
    _error(tmp_path, THREAD + "  stretch_stiffness: 10\n", "thread.stretch_stiffness", "extensible")
    _error(tmp_path, "name: x\n", "thread", "is required")


def test_error_unknown_preset_lists_known(tmp_path):
    msg = _error(tmp_path, "thread:\n  preset: no-such-thread\n", "thread.preset", "no thread preset")
    for name in presets.preset_names():
        assert name in msg
    with pytest.raises(ConfigError) as info:
        presets.load_preset("no-such-thread")
    assert "no-such-thread" in str(info.value) and all(n in str(info.value) for n in presets.preset_names())


def test_error_vertex_out_of_range_in_pinned(tmp_path):
    _error(tmp_path, THREAD + "boundary:\n  pinned: [0, 11]\n", "boundary.pinned", "vertex index in [-11, 10]")
    _error(tmp_path, THREAD + "boundary:\n  pinned: [-12]\n", "boundary.pinned", "got -12")
    _error(tmp_path, THREAD + "boundary:\n  pinned: 0\n", "boundary.pinned", "list")
    _error(tmp_path, THREAD + "boundary:\n  forces:\n    - vertex: 11\n      force: [0, 0, 1]\n",
           "boundary.forces[0].vertex", "vertex index")


def test_error_timeline_moves_a_vertex_that_is_not_driven(tmp_path):
    _error(tmp_path, THREAD + textwrap.dedent("""\
        boundary:
          driven: [0]
        timeline:
          - vertex: 5
            velocity: [0, 0, 1]
            to: 1.0
        """), "timeline[0].vertex", "driven")


def test_error_timeline_waypoints_not_starting_at_the_subject(tmp_path):
    _error(tmp_path, THREAD + textwrap.dedent("""\
        boundary:
          driven: [-1]
        timeline:
          - vertex: -1
            waypoints: [[0.0, 1.0, 0.0, 0.1], [1.0, 1.0, 0.0, 0.2]]
        """), "timeline[0].waypoints", "first waypoint")


def test_error_timeline_waypoints_must_follow_earlier_entries(tmp_path):
    # after the first entry the vertex is at (1, 0, 0.5) at t = 1; a waypoint list starting at rest position fails
    text = THREAD + textwrap.dedent("""\
        boundary:
          driven: [-1]
        timeline:
          - vertex: -1
            velocity: [0.0, 0.0, 0.5]
            to: 1.0
          - vertex: -1
            waypoints: [[2.0, 1.0, 0.0, {z}], [3.0, 1.0, 0.0, 0.0]]
        """)
    _error(tmp_path, text.format(z="0.0"), "timeline[1].waypoints", "first waypoint")
    s = _load(tmp_path, text.format(z="0.5"))
    assert s.model.mot_vel[1].tolist() == [0.0, 0.0, -0.5]


def test_error_timeline_entry_shape(tmp_path):
    _error(tmp_path, THREAD + "boundary:\n  driven: [0]\ntimeline:\n  - vertex: 0\n    grasp: g\n",
           "timeline[0].vertex", "exactly one")
    _error(tmp_path, THREAD + "boundary:\n  driven: [0]\ntimeline:\n  - vertex: 0\n    to: 1\n",
           "timeline[0].velocity", "exactly one")
    _error(tmp_path, THREAD + "boundary:\n  driven: [0]\ntimeline:\n  - vertex: 0\n    velocity: [0, 0, 1]\n"
           "    from: 2\n    to: 1\n", "timeline[0].to", "must be > 2")
    _error(tmp_path, THREAD + "timeline:\n  - grasp: nobody\n    velocity: [0, 0, 1]\n    to: 1\n",
           "timeline[0].grasp", "no grasp")
    _error(tmp_path, THREAD + "timeline:\n  - twist: input\n    rate: 0\n    max: 1\n", "timeline[0].rate",
           "must not be 0")
    _error(tmp_path, THREAD + "boundary:\n  driven: [0]\ntimeline:\n  - vertex: 0\n"
           "    waypoints: [[1, 0, 0, 0], [1, 0, 0, 1]]\n", "timeline[0].waypoints", "increase")
    _error(tmp_path, THREAD + "boundary:\n  driven: [0]\ntimeline:\n  - vertex: 0\n"
           "    waypoints: [[0, 0, 0, 0]]\n", "timeline[0].waypoints", "at least two")


@pytest.mark.parametrize("wps", ["[[0, 0, 0, 0], [1, 0, 0]]", "[[0, 0, 0, 0], [1, 0, 0, abc]]"])
def test_error_malformed_waypoints(tmp_path, wps):
    _error(tmp_path, THREAD + f"boundary:\n  driven: [0]\ntimeline:\n  - vertex: 0\n    waypoints: {wps}\n",
           "timeline[0].waypoints", "must be")


def test_error_grasp_on_a_pinned_vertex(tmp_path):
    _error(tmp_path, THREAD + "boundary:\n  pinned: [-1]\n  grasps:\n    - vertex: 10\n",
           "boundary.grasps[0].vertex", "pinned")
    _error(tmp_path, THREAD + "boundary:\n  grasps:\n    - id: a\n      vertex: 1\n    - id: a\n      vertex: 2\n",
           "boundary.grasps[1].id", "duplicate")
    five = "".join(f"    - vertex: {i + 1}\n" for i in range(5))
    _error(tmp_path, THREAD + "boundary:\n  grasps:\n" + five, "boundary.grasps[4].id", "at most 4")


def test_error_malformed_yaml_names_file_and_line(tmp_path):
    path = _write(tmp_path, "name: broken\nduration: 1.0\nthread:\n  length: 1.0\n   segments: 2\n")
    with pytest.raises(ConfigError) as info:
        load_scenario(str(path))
    msg = str(info.value)
    assert path.name in msg and "line 5" in msg and "YAML" in msg


def test_error_yaml_list_instead_of_mapping(tmp_path):
    _error(tmp_path, "- thread\n- duration\n", "", "mapping")


def test_error_section_not_a_mapping(tmp_path):
    _error(tmp_path, "thread: [1, 2]\n", "thread", "mapping")


def test_error_missing_scenario_lists_shipped(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_scenario(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in str(info.value) and scenario_names()[0] in str(info.value)


@pytest.mark.parametrize("value,word", [("0", "auto"), ('"fast"', "auto"), ("2.0", "integer"), ("true", "auto")])
def test_error_substeps(tmp_path, value, word):
    _error(tmp_path, THREAD + f"solver:\n  substeps: {value}\n", "solver.substeps", word)


def test_solver_bounds(tmp_path):
    _error(tmp_path, THREAD + "solver:\n  method: euler\n", "solver.method", "one of")
    _error(tmp_path, THREAD + "solver:\n  tol: 1.0e-3\n", "solver.tol", "<= 1e-06")
    _error(tmp_path, THREAD + "solver:\n  tick: 0\n", "solver.tick", "> 0")
    _error(tmp_path, THREAD + "solver:\n  stability_target: 2.5\n", "solver.stability_target", "<= 2")
    _error(tmp_path, THREAD + "solver:\n  scaled_mass_keeps: momentum\n", "solver.scaled_mass_keeps", "one of")
    _error(tmp_path, THREAD + "solver:\n  mass_scaling: global\n", "solver.mass_scaling", "one of")
    _error(tmp_path, THREAD + "record:\n  state_rate: 2000\n", "record.state_rate", "<= 1000")
    s = _load(tmp_path, THREAD + "solver:\n  method: contraction\n  tick: 0.002\n  substeps: auto\n"
              "record:\n  state_rate: 500\n")
    assert s.model.solver.method == "contraction" and s.model.solver.substeps == 0 and s.state_rate == 500
    assert s.model.solver.scaled_mass_keeps == "energy" and s.model.solver.mass_scaling == "local"
    s = _load(tmp_path, THREAD + "contact:\n  distance: 0.001\n")
    assert s.model.contact_par[CP_NEAR] == s.model.contact.exclude + 1   # the pair one past the excluded ones
    s = _load(tmp_path, THREAD + "solver:\n  scaled_mass_keeps: velocity\n  mass_scaling: whole-thread\n"
              "contact:\n  distance: 0.001\n")
    assert s.model.solver.scaled_mass_keeps == "velocity" and s.model.solver.mass_scaling == "whole-thread"
    assert s.model.contact_par[CP_NEAR] == 0.0      # every pair looks half a skin ahead, as before


def test_error_shape(tmp_path):
    _error(tmp_path, THREAD + "shape:\n  kind: spiral\n", "shape.kind", "one of")
    _error(tmp_path, THREAD + "shape:\n  direction: [0, 0, 0]\n", "shape.direction", "zero")
    _error(tmp_path, THREAD + "shape:\n  kind: points\n  points: [[0, 0, 0], [1, 0, 0]]\n", "shape.points",
           "segments + 1")
    _error(tmp_path, THREAD + "shape:\n  kind: helix\n  radius: 0.1\n", "shape.pitch", "required")


# -- errors inside a preset file are reported against the preset file ---------------------------------------
PRESET_OK = "length: 1.0\nsegments: 10\nmass: 0.01\nbending_stiffness: 1.0e-6\n"


@pytest.mark.parametrize("preset_text,key,reason", [
    (PRESET_OK + "bending_stifness: 1\n", "thread.bending_stifness", "unknown key"),
    (PRESET_OK.replace("segments: 10", "segments: -3"), "thread.segments", "must be >= 1"),
    (PRESET_OK.replace("mass: 0.01", "mass: heavy"), "thread.mass", "number"),
    (PRESET_OK + "diameter: 1.0e-3\nyoungs_modulus: 1.0e+9\n", "thread.youngs_modulus", "one way only"),
    ("length: [1\nsegments: 2\n", "", "line"),
    ("- 1\n- 2\n", "", "mapping"),
])
def test_error_in_preset_names_the_preset_file(tmp_path, preset_text, key, reason):
    (tmp_path / "bad-thread.yaml").write_text(preset_text)
    msg = _error(tmp_path, "thread:\n  preset: bad-thread.yaml\n", key, reason, file="bad-thread.yaml")
    assert "scenario.yaml" not in msg
    with pytest.raises(ConfigError) as info:
        presets.load_preset(str(tmp_path / "bad-thread.yaml"))
    assert "bad-thread.yaml" in str(info.value) and reason in str(info.value)


def test_error_in_override_names_the_scenario_file(tmp_path):
    (tmp_path / "good-thread.yaml").write_text(PRESET_OK)
    msg = _error(tmp_path, "thread:\n  preset: good-thread.yaml\n  segments: 0\n", "thread.segments", ">= 1")
    assert "good-thread.yaml" not in msg


def test_error_poisson_ratio_minus_one(tmp_path):
    _error(tmp_path, "thread:\n  length: 1\n  segments: 10\n  mass: 0.01\n  diameter: 1.0e-3\n"
           "  youngs_modulus: 1.0e+9\n  poisson_ratio: -1\n", "thread.poisson_ratio", "must be")


# -- shapes the loader gets wrong -----------------------------------------------------------------------------
def test_helix_with_zero_pitch_is_a_circle(tmp_path):
    s = _load(tmp_path, THREAD + "shape:\n  kind: helix\n  axis: [0, 0, 1]\n  radius: 0.5\n  pitch: 0\n")
    x = s.initial.x
    np.testing.assert_allclose(np.linalg.norm(np.diff(x, axis=0), axis=1), 0.1, rtol=1e-12)
    np.testing.assert_allclose(x[:, 2], 0.0, atol=1e-15)


def test_tight_helix_takes_the_smallest_angle_step(tmp_path):
    radius, pitch, seg = 0.01, 0.002, 0.0045
    s = _load(tmp_path, """\
        thread:
          length: 0.45
          segments: 100
          mass: 0.01
          bending_stiffness: 1.0e-6
        shape:
          kind: helix
          axis: [1, 0, 0]
          radius: 0.01
          pitch: 0.002
        """)
    c = pitch / (2 * math.pi)
    lo, hi = 0.0, math.pi  # the chord grows monotonically on [0, pi]; 2 r > seg so the root is there
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if math.hypot(2 * radius * math.sin(mid / 2), c * mid) < seg else (lo, mid)
    x = s.initial.x
    # the axial rise per segment is c * dphi
    assert x[1, 0] - x[0, 0] == pytest.approx(c * lo, rel=1e-9)


def test_points_shape_respects_the_thread_mass(tmp_path):
    text = ("thread:\n  length: 1.0\n  segments: 2\n  mass: 0.01\n  bending_stiffness: 1.0e-6\n"
            "shape:\n  kind: points\n  points: [[0, 0, 0], [1, 0, 0], [2, 0, 0]]\n")
    try:
        s = _load(tmp_path, text)
    except ConfigError:
        return  # rejecting the mismatch is also acceptable
    assert s.model.mass.sum() == pytest.approx(0.01)


# -- timeline compilation -------------------------------------------------------------------------------------
def test_timeline_move_to(tmp_path):
    s = _load(tmp_path, THREAD + textwrap.dedent("""\
        boundary:
          driven: [-1]
        timeline:
          - vertex: -1
            move_to: [1.0, 0.0, 0.5]
            from: 1.0
            to: 3.0
          - vertex: 10
            velocity: [0.0, 0.1, 0.0]
            from: 3.0
            to: 4.0
          - vertex: -1
            move_to: [1.0, 0.0, 0.0]
            from: 5.0
            to: 6.0
        """))
    m = s.model
    assert m.mot_kind.tolist() == [MOTION_VERTEX] * 3 and m.mot_index.tolist() == [10] * 3
    assert m.mot_t0.tolist() == [1.0, 3.0, 5.0] and m.mot_t1.tolist() == [3.0, 4.0, 6.0]
    np.testing.assert_allclose(m.mot_vel[0], [0.0, 0.0, 0.25])
    np.testing.assert_allclose(m.mot_vel[1], [0.0, 0.1, 0.0])
    # goal minus where the vertex is at `from` (1, 0.1, 0.5), over 1 s
    np.testing.assert_allclose(m.mot_vel[2], [0.0, -0.1, -0.5])


def test_timeline_twist(tmp_path):
    s = _load(tmp_path, THREAD + textwrap.dedent("""\
        timeline:
          - twist: input
            rate: -2.0
            from: 0.5
            max: 3.0
          - twist: input
            rate: 1.0
            to: 4.0
        """))
    m = s.model
    assert m.mot_kind.tolist() == [MOTION_TWIST, MOTION_TWIST]
    assert m.mot_t0.tolist() == [0.5, 0.0] and m.mot_t1.tolist() == [0.5 + 3.0 / 2.0, 4.0]
    assert m.mot_vel.tolist() == [[-2.0, 0.0, 0.0], [1.0, 0.0, 0.0]]


def test_timeline_waypoints(tmp_path):
    s = _load(tmp_path, THREAD + textwrap.dedent("""\
        boundary:
          grasps:
            - id: needle
              vertex: 5
        timeline:
          - grasp: needle
            waypoints:
              - [0.5, 0.5, 0.0, 0.0]
              - [1.0, 0.5, 0.0, 0.1]
              - [3.0, 0.7, 0.0, 0.1]
              - [3.5, 0.7, 0.0, 0.1]
        """))
    m = s.model
    assert m.mot_kind.tolist() == [MOTION_GRASP] * 3 and m.mot_index.tolist() == [0] * 3
    assert m.mot_t0.tolist() == [0.5, 1.0, 3.0] and m.mot_t1.tolist() == [1.0, 3.0, 3.5]
    np.testing.assert_allclose(m.mot_vel, [[0.0, 0.0, 0.2], [0.1, 0.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-15)


def test_timeline_integrates_to_the_waypoints(tmp_path):
    from suturesim.solver.motion import apply_motions

    s = _load(tmp_path, THREAD + textwrap.dedent("""\
        boundary:
          pinned: [0]
          grasps:
            - vertex: 5
              target: [0.5, 0.0, 0.05]
        timeline:
          - vertex: 0
            waypoints: [[0.0, 0.0, 0.0, 0.0], [0.3, 0.0, 0.1, 0.0], [0.7, 0.2, 0.1, 0.0]]
          - grasp: grasp0
            move_to: [0.6, 0.0, 0.0]
            from: 0.2
            to: 0.45
          - twist: input
            rate: 3.0
            max: 1.5
        """))
    m, st = s.model, s.new_state()
    t, steps = 0.0, np.r_[np.full(37, 0.013), np.full(200, 0.0031)]
    for h in steps:
        apply_motions(t, h, m.mot_kind, m.mot_index, m.mot_t0, m.mot_t1, m.mot_vel, st.kin_target,
                      st.grasp_target, st.twist, st.nst, st.grasp_k, st.grasp_c, st.grasp_fmax)
        t += h
    assert t > 0.7
    np.testing.assert_allclose(st.kin_target[0], [0.2, 0.1, 0.0], atol=1e-12)
    np.testing.assert_allclose(st.grasp_target[0], [0.6, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(st.twist, [1.5, 1.5], atol=1e-12)
    np.testing.assert_array_equal(st.kin_target[1:], s.initial.kin_target[1:])


def test_docs_example_loads(tmp_path):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "SCENARIOS.md").read_text()
    example = doc.split("## A complete example", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    s = _load(tmp_path, example)
    m = s.model
    assert s.name == "pull-through" and m.params.segments == 60 and s.duration == 5.0
    d = presets.load_preset("silk-3-0").diameter
    assert m.params.twisting_stiffness == pytest.approx(1.0e8 * math.pi * d ** 4 / 32, rel=1e-14)
    assert m.mot_kind.tolist() == [MOTION_VERTEX, MOTION_GRASP, MOTION_GRASP, MOTION_TWIST]
    np.testing.assert_allclose(m.mot_vel[0], [-0.05, 0.0, 0.05], atol=1e-15)
    np.testing.assert_allclose(m.mot_vel[2], [0.05, 0.0, 0.02], atol=1e-15)
    assert m.mot_t1[3] == pytest.approx(2.5)


def test_set_keys_changes_a_scenario_by_key_path_and_list_index():
    """`suturesim run --set` and `replay --set`: a dotted key path, a number indexing a list, a YAML value; a
    path that does not fit is an error naming it, and the scenario given is left as it was."""
    from suturesim.solver.scenario import load_scenario, set_keys

    data = {"shape": {"start": [0, 0, 0]}, "timeline": [{"to": 1.0}, {"to": 2.0}]}
    out = set_keys(data, ["shape.start=[0.0015, 0, 0]", "timeline.1.to=3.5", "timeline.-1.from=3", "gravity.z=1"])
    assert out == {"shape": {"start": [0.0015, 0, 0]}, "timeline": [{"to": 1.0}, {"to": 3.5, "from": 3}],
                   "gravity": {"z": 1}}
    assert data["timeline"][1] == {"to": 2.0}
    for bad, reason in (("timeline.x=1", "timeline is a list: index it with a number"),
                        ("timeline.2.to=1", "timeline has 2 items, no item 2"),
                        ("shape.start.0.x=1", "shape.start.0 is a value"), ("=1", "wants key.path=value"),
                        ("shape", "wants key.path=value"), ("shape.start=[1,", "its value is not YAML")):
        with pytest.raises(ConfigError, match=reason.replace("[", r"\[")):
            set_keys(data, [bad])
    sc = load_scenario("simple-interrupted-suture", assignments=["boundary.grasps.0.max_force=4.5"])
    assert [g.max_force for g in sc.grasps] == [4.5, 3.0]
    with pytest.raises(ConfigError, match="nope: unknown key"):
        load_scenario("simple-interrupted-suture", assignments=["nope=1"])
