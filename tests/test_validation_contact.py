"""The self-contact validation cases of issue 3 (tools/validate_contact.py): each checks tunnelling between
every two consecutive substeps with tools/crossings.py. The square knot and a short crumple run by default;
the plectoneme, the Fig. 17 load and the 30 s crumple under the `long` marker (run in CI by .ci/run)."""
from __future__ import annotations

import pytest

from suturesim.tools import validate_contact as vc


def test_square_knot_tightens_levels_and_holds():
    for c in vc.square_knot_case():
        assert c.passed, c.row()


CRUMPLE_OPEN = ("issue 3 open: a light suture crumpled by fast hands still loses a crossing now and then, during "
                "whips the stepper runs again (seed 1 held 30 s, seed 3 crossed at 1.8 s; docs/PHYSICS.md Sec. 7)")


@pytest.mark.xfail(reason=CRUMPLE_OPEN, strict=False)
def test_crumple_short_no_tunnelling():
    for c in vc.crumple_case(duration=2.0, seed=3):
        assert c.passed, c.row()


@pytest.mark.long
def test_plectoneme_torque_drops_and_rises(tmp_path):
    for c in vc.plectoneme_case(tmp_path):
        assert c.passed, c.row()
    assert (tmp_path / "plectoneme-torque.png").stat().st_size > 10_000


@pytest.mark.long
def test_fig17_load_no_tunnelling():
    for c in vc.fig17_case():
        assert c.passed, c.row()


@pytest.mark.long
@pytest.mark.xfail(reason=CRUMPLE_OPEN, strict=False)
def test_crumple_30s_no_tunnelling():
    for c in vc.crumple_case(duration=30.0, seed=1):
        assert c.passed, c.row()


def test_capstan_friction_follows_exp_mu_pi():
    for c in vc.capstan_case(mus=(0.3,)):
        assert c.passed, c.row()


@pytest.mark.long
def test_choi_trefoil_audoly_law_and_speed_independence():
    for c in vc.choi_n1_case():
        assert c.passed, c.row()


@pytest.mark.long
def test_capstan_friction_all_coefficients():
    for c in vc.capstan_case():
        assert c.passed, c.row()
