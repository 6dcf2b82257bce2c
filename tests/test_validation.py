"""The validation cases of issue 2 / Wang 2017 Sec. 6.1 (tools/validate.py): short runs by default, the full
1000 s runs under the `long` marker (run in CI by .ci/run)."""
from __future__ import annotations

import pytest

from suturesim.solver.presets import preset_names
from suturesim.tools import validate


def test_energy_no_drift_short():
    case, residual = validate.energy_case(duration=60.0, window=10.0)
    assert case.passed, case.row()
    assert residual <= 1e-10


def test_momentum_conserved_short():
    cases, residual = validate.momentum_case(duration=60.0)
    for c in cases:
        assert c.passed, c.row()
    assert residual <= 1e-10


def test_axial_force_matches_static_solution():
    case, residual = validate.axial_force_case(duration=100.0)
    assert case.passed, case.row()
    assert case.measured < 1e-3
    assert residual <= 1e-10


def test_hanging_tension_equals_weight_below():
    case, residual = validate.hanging_case(duration=10.0)
    assert case.passed, case.row()
    assert residual <= 1e-10


def test_contraction_and_newton_agree():
    cases = validate.methods_case(duration=2.0)
    for c in cases:
        assert c.passed, c.row()


@pytest.mark.parametrize("preset", preset_names())
def test_stability_sweep_short(preset):
    case = validate.sweep_case(preset, seed=2, duration=2.0)
    assert case.passed, case.row()


@pytest.mark.long
def test_energy_no_drift_1000s():
    case, residual = validate.energy_case(duration=1000.0, window=100.0)
    assert case.passed, case.row()
    assert residual <= 1e-10


@pytest.mark.long
def test_momentum_conserved_1000s():
    cases, residual = validate.momentum_case(duration=1000.0)
    for c in cases:
        assert c.passed, c.row()
    assert residual <= 1e-10


@pytest.mark.long
@pytest.mark.parametrize("preset", preset_names())
def test_stability_sweep_10s(preset):
    case = validate.sweep_case(preset, seed=1, duration=10.0)
    assert case.passed, case.row()
