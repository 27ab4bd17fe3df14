"""Fixtures shared by the self-tests: the docker test host, started once for every test that needs an engine."""

import os

import pytest


@pytest.fixture(scope="session")
def dock():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root (network namespaces)")
    from .dockhost import started_dock

    with started_dock() as d:
        yield d
