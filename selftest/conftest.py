"""Hooks and fixtures of the self-tests, each fixture started once for every test that needs it: the docker test
host, and the embedded default serving on a port of its own. The helpers they and the tests share are helpers.py's
(importing it sets up the shared cache and imports httpx fully, before any test)."""

import os

import pytest
from hypothesis import settings

from .helpers import broken_gateway_at, embedded_recipe_dir, local_mem_available
from .madehere import build_in_background, stop_background
from .proofs import record_outcome, start_log

# Hypothesis's per-example deadline times each example, which no self-test proves (speed is a benchmark's): off, so
# an example slowed by the work beside it (the model's build) is not a failure.
settings.register_profile("selftest", deadline=None)
settings.load_profile("selftest")


def pytest_configure(config):
    start_log()  # which self-test proved each check, from the suite's runs (proofs.py)
    config.addinivalue_line("markers", "clean_machine: runs this machine's own host checks, so it runs first, "
                                       "before the session's shared server (another model server here) starts")


# Files that neither time anything nor start an engine: they run while the models made here build (selftest/madehere.py:
# minutes of CPU-bound training), right after the clean_machine tests.
WHILE_THE_MODEL_BUILDS = {
    "test_host_layer.py", "test_fleet.py", "test_link.py", "test_recipes.py", "test_untrusted.py", "test_spark01.py",
    "test_linkparse.py", "test_hostfacts.py", "test_levels.py", "test_layout.py", "test_knownbad.py",
    "test_hfcache.py", "test_garbage_rates.py", "test_sanity.py", "test_proofs.py", "test_vllmlog.py",
    "test_kernellog.py", "test_gpuclocks.py"}
# Files that start engines but judge no speed (their floors are ones any CPU meets): they run next, still beside the
# build. An engine starting leaves a core idle for tens of seconds (measured: the two cores 50-80% busy through such
# starts), which the build, niced, takes; before, the tests of the models waited minutes for it with nothing beside.
BESIDE_THE_BUILD = {
    "test_container_layer.py", "test_faults.py", "test_docker_launcher.py", "test_secrets.py", "test_install.py",
    "test_httpclient.py"}
# ...but not the fixtures that start many engines at once: the drifted containers (seven, about 2 GiB each) beside the
# build (up to 3.9 GiB) took this 23.5 GiB machine past its memory, and the kernel killed the build.
MANY_ENGINES_AT_ONCE = {"drifted"}
# The files that serve a model made here, and the model each serves, in the order they are built and run.
NEEDS_A_MODEL = {"test_reasoning_model.py": "smollm2-think", "test_vision_model.py": "smollm2-see"}


def pytest_collection_modifyitems(items):
    """The clean_machine tests first; then, while the models made here build, the files that share the machine with
    them; then the tests of those models; then the rest, which time what they measure; the tests that share
    `embedded_server` last: once it serves, this machine (and the test host, which sees its processes) has another
    model server on it, which HOST-NO-COMPETITOR and the launchers' pre-flight rightly count."""
    def order(item):
        if item.get_closest_marker("clean_machine"):
            return 0
        if item.path.name in WHILE_THE_MODEL_BUILDS:
            return 1
        fixtures = set(getattr(item, "fixturenames", ()))
        if "embedded_server" in fixtures:
            return 5
        if item.path.name in BESIDE_THE_BUILD and not fixtures & MANY_ENGINES_AT_ONCE:
            return 2
        if item.path.name in NEEDS_A_MODEL:
            return 3 + list(NEEDS_A_MODEL).index(item.path.name) / len(NEEDS_A_MODEL)
        return 4

    items.sort(key=order)  # stable: within each group, the files' own order


_models_wanted: list[str] = []


def pytest_collection_finish(session):
    """The models made here that selected tests serve (after -k, -m and --deselect have had their say)."""
    files = {item.path.name for item in session.items}
    _models_wanted[:] = [model for file, model in NEEDS_A_MODEL.items() if file in files]


def pytest_runtest_setup(item):
    """The models' build starts once the clean_machine tests are done (they judge this machine alone), if a selected
    test needs one that is not built."""
    if _models_wanted and not item.get_closest_marker("clean_machine"):
        build_in_background(_models_wanted)


def pytest_sessionfinish():
    stop_background()


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
