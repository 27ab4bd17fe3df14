"""Fixtures shared by the self-tests: the docker test host, started once for every test that needs an engine."""

import os
from pathlib import Path

import pytest

# One cache for every suite the self-tests run (pytester gives each its own HOME, which would convert the
# embedded weights and compile vLLM's graphs again in every run): the repository's, beside the test hosts'.
os.environ.setdefault("SPARKGATE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))


def _import_httpx_fully() -> None:
    """httpx imports httpcore's backends and its table of exceptions on the first request. pytester restores
    sys.modules after each test, so whatever a test imported first is imported again later, as new classes that
    httpx's cached table no longer recognises (raw httpcore errors escape). Import it all before any test."""
    import asyncio

    import httpx

    for get in (lambda: httpx.get("http://127.0.0.1:9", timeout=1),
                lambda: asyncio.run(httpx.AsyncClient(timeout=1).get("http://127.0.0.1:9"))):
        try:
            get()
        except httpx.HTTPError:
            pass


_import_httpx_fully()


@pytest.fixture(scope="session")
def dock():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root (network namespaces)")
    from .dockhost import started_dock

    with started_dock() as d:
        yield d
