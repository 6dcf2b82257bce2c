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


# The 1000 s cases and the 10 s sweeps are the rows of `validate --no-contact`'s table (test_cli.py's
# test_validate_full_table): computed once, in conftest.py's session-scoped validate_table, and read from it here
# (a case the table did not compute with these arguments is computed by the fixture itself). The group keeps
# them on one xdist worker (pyproject's addopts: --dist loadgroup), so the table is computed once there too.
@pytest.mark.long
@pytest.mark.xdist_group("validate-no-contact")
def test_energy_no_drift_1000s(validate_table):
    case, residual = validate_table.result("energy_case", duration=1000.0, window=100.0)
    assert case.passed, case.row()
    assert residual <= 1e-10


@pytest.mark.long
@pytest.mark.xdist_group("validate-no-contact")
def test_momentum_conserved_1000s(validate_table):
    cases, residual = validate_table.result("momentum_case", duration=1000.0)
    for c in cases:
        assert c.passed, c.row()
    assert residual <= 1e-10


@pytest.mark.long
@pytest.mark.xdist_group("validate-no-contact")
@pytest.mark.parametrize("preset", preset_names())
def test_stability_sweep_10s(preset, validate_table):
    case = validate_table.result("sweep_case", preset, seed=1, duration=10.0)
    assert case.passed, case.row()
