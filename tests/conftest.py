"""Shared fixtures. Numba kernels compile once (cache=True) and are reused across tests."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    # long validations (1000 s simulated) are selected with -m long; CI runs both sets (.ci/run)
    pass


@pytest.fixture(scope="session")
def tmp_out(tmp_path_factory):
    return tmp_path_factory.mktemp("out")
