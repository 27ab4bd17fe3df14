"""Fixtures shared by the self-tests: the docker test host, started once for every test that needs an engine."""

import os
from pathlib import Path

import pytest

# One cache for every suite the self-tests run (pytester gives each its own HOME, which would convert the
# embedded weights and compile vLLM's graphs again in every run): the repository's, beside the test hosts'.
os.environ.setdefault("SPARKGATE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))


@pytest.fixture(scope="session")
def dock():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root (network namespaces)")
    from .dockhost import started_dock

    with started_dock() as d:
        yield d
