"""Fixtures shared by the self-tests, each started once for every test that needs it: the docker test host, and
the embedded default serving on a port of its own."""

import contextlib
import os
from pathlib import Path

import pytest
import yaml

from sparkgate.hostfacts import parse_meminfo
from sparkgate.recipes import RECIPES_DIR

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


def pytest_configure(config):
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


# The shared server's port: the recipe's own (18000) stays free for the self-tests that start the recipe themselves.
EMBEDDED_PORT = 18005


def move_port(data: dict, port: int) -> None:
    """A recipe's data (as loaded from its YAML) moved to serve on `port`."""
    data["port"] = port
    data["serve_args"][data["serve_args"].index("--port") + 1] = str(port)


def embedded_recipe_dir(where: Path, port: int = EMBEDDED_PORT) -> Path:
    """A recipes folder holding the embedded default, moved to `port`."""
    data = yaml.safe_load((RECIPES_DIR / "smollm2-cpu.yaml").read_text())
    move_port(data, port)
    where.mkdir(parents=True, exist_ok=True)
    (where / "smollm2-cpu.yaml").write_text(yaml.safe_dump(data))
    return where


@pytest.fixture(scope="session")
def embedded_server(tmp_path_factory):
    """The embedded default, serving for the whole session on EMBEDDED_PORT: every self-test that breaks one thing
    at a time against a running server (--base-url) shares this one start."""
    from sparkgate.launch import serving
    from sparkgate.recipes import load_profiles, load_recipes

    recipe = load_recipes(embedded_recipe_dir(tmp_path_factory.mktemp("embedded")))["smollm2-cpu"]
    mem = lambda: parse_meminfo(Path("/proc/meminfo").read_text())["MemAvailable"]  # noqa: E731
    with serving(recipe, load_profiles()["cpu"], mem, print, 600) as srv:
        yield srv


def server_group(srv):
    """The pids of the embedded server's process group (the API server and its engine processes)."""
    port = srv.base_url.rsplit(":", 1)[1]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and port.encode() in argv:
            pgid = os.getpgid(int(cmdline.parent.name))
            return [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat") if _pgid(p) == pgid]
    raise AssertionError(f"no vLLM API server on port {port}")


def _pgid(stat):
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def cpu_quota(pids, cores):
    """Hold `pids` to `cores` of CPU time with a cgroup (v1 cpu controller), then give it back."""
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu: cannot slow the engine down")
    group = root / f"sparkgate-slow-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(100000 * cores)))
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(pid)
        group.rmdir()
