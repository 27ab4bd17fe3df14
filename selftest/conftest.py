"""Hooks and fixtures of the self-tests, each fixture started once for every test that needs it: the docker test
host, and the embedded default serving on a port of its own. The helpers they and the tests share are helpers.py's
(importing it sets up the shared cache and imports httpx fully, before any test)."""

import os

import pytest

from .helpers import broken_gateway_at, embedded_recipe_dir, local_mem_available
from .proofs import record_outcome, start_log


def pytest_configure(config):
    start_log()  # which self-test proved each check, from the suite's runs (proofs.py)
    config.addinivalue_line("markers", "clean_machine: runs this machine's own host checks, so it runs first, "
                                       "before the session's shared server (another model server here) starts")


def pytest_collection_modifyitems(items):
    """The clean_machine tests first, the tests that share `embedded_server` last: once it serves, this machine
    (and the test host, which sees its processes) has another model server on it, which HOST-NO-COMPETITOR and
    the launchers' pre-flight rightly count."""
    def order(item):
        if item.get_closest_marker("clean_machine"):
            return 0
        return 2 if "embedded_server" in getattr(item, "fixturenames", ()) else 1

    items.sort(key=order)  # stable: within each group, the files' own order


@pytest.fixture(scope="session")
def dock():
    if os.geteuid() != 0:
        pytest.skip("the test host needs root (network namespaces)")
    from .dockhost import started_dock

    with started_dock() as d:
        yield d


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory):
    """The embedded default, serving for the whole session on EMBEDDED_PORT: every self-test that breaks one thing
    at a time against a running server (--base-url) shares this one start."""
    from sparkgate.launch import serving
    from sparkgate.recipes import load_profiles, load_recipes

    recipe = load_recipes(embedded_recipe_dir(tmp_path_factory.mktemp("embedded")))["smollm2-cpu"]
    with serving(recipe, load_profiles()["cpu"], local_mem_available, print, 600) as srv:
        yield srv


GATEWAY_PORT = 18152


@pytest.fixture(scope="session")
def gateway(embedded_server):
    """selftest/broken_gateway.py in front of the embedded default: its base URL, to which a way is appended."""
    with broken_gateway_at(GATEWAY_PORT, embedded_server.base_url) as url:
        yield url


def pytest_runtest_logreport(report):
    record_outcome(report)


def pytest_terminal_summary(terminalreporter):
    """Each test file's share of the run (setup, call and teardown together), longest first: where CI's time goes."""
    spent: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if hasattr(report, "duration") and hasattr(report, "nodeid"):
                path = report.nodeid.split("::")[0]
                spent[path] = spent.get(path, 0) + report.duration
    if spent:
        terminalreporter.write_sep("=", "time per test file")
        for path, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
