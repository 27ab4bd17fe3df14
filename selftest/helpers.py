"""What more than one self-test module uses: the repository's paths, the acceptance suite run through pytester,
broken and moved copies of the embedded recipe, the embedded server's process group and a CPU quota to slow it,
a small server process (serving_at) and the broken gateway in front of a server, the failed check IDs a run printed,
and the recording guard started as a process. conftest.py holds the hooks
and fixtures; no module imports a test module or conftest.py for a helper.

Importing it sets the self-tests up as conftest.py did (the shared cache, httpx imported fully), for the scripts
run outside pytest too (`python -m selftest.false_alarms`, `python -m selftest.garbage.corpus`)."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from sparkgate.hostfacts import parse_meminfo
from sparkgate.recipes import RECIPES_DIR

from .terminal import SUITE_PLUGINS

# One cache for every suite the self-tests run (pytester gives each its own HOME, which would convert the
# embedded weights and compile vLLM's graphs again in every run): the repository's, beside the test hosts'.
os.environ.setdefault("SPARKGATE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))
# Hundreds of suite runs each import the project and rewrite its test modules' asserts: where the machine forbids
# bytecode caches (PYTHONDONTWRITEBYTECODE), each run compiled all of it again. Cached in __pycache__ (git ignores it).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def _import_httpx_fully() -> None:
    """httpx imports httpcore's backends and its table of exceptions on the first request. pytester restores
    sys.modules after each test, so whatever a test imported first is imported again later, as new classes that
    httpx's cached table no longer recognises (raw httpcore errors escape). Import it all before any test."""
    import asyncio

    for get in (lambda: httpx.get("http://127.0.0.1:9", timeout=1),
                lambda: asyncio.run(httpx.AsyncClient(timeout=1).get("http://127.0.0.1:9"))):
        try:
            get()
        except httpx.HTTPError:
            pass


_import_httpx_fully()

ROOT = Path(__file__).resolve().parent.parent
TESTS = str(ROOT / "tests")
ARTIFACTS = ROOT / "selftest-artifacts"  # kept after a CI run: the report's screenshot, the summary


def local_mem_available():
    return parse_meminfo(Path("/proc/meminfo").read_text())["MemAvailable"]


# ---- the acceptance suite, run ---------------------------------------------------------------------------

def run_suite(pytester, *args, timeout=1200):
    """The acceptance suite in a subprocess, run from the project root so report paths read tests/... A run that
    outlives `timeout` fails with the last of what it printed, and with every thread's stack, dumped a minute
    before the kill by pytest's faulthandler: a hang on a CI machine says where it hung."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        try:
            return pytester.runpytest_subprocess(TESTS, *SUITE_PLUGINS, "-rA", "-o",
                                                 f"faulthandler_timeout={max(timeout - 60, 1)}", *args,
                                                 timeout=timeout)
        except pytester.TimeoutExpired:
            tails = {name: (pytester.path / name).read_text(errors="replace")[-6000:] for name in ("stdout", "stderr")}
            pytest.fail(f"the suite ran past {timeout} s; it printed, last:\n{tails['stdout']}\n--- its stderr, last "
                        f"(the stacks):\n{tails['stderr']}", pytrace=False)


def bind_to_core(data: dict, core: str) -> None:
    """A recipe's data (as loaded from its YAML) with its CPU engine bound to `core` (one of cores_apart's)."""
    data["env"] = {**data.get("env", {}), "VLLM_CPU_OMP_THREADS_BIND": core}


def node_id(module: str, test: str) -> str:
    """The node id of a self-test of `module` (its __name__): the proof a suite run made for it records it."""
    return f"{module.replace('.', '/')}.py::{test}"


def cores_apart(n: int) -> list[str]:
    """n CPU cores for n engines that run at once, as VLLM_CPU_OMP_THREADS_BIND values: apart while there are cores
    enough (vLLM's `auto` binds every engine to the same cores: all but the last, which it keeps for the API
    server), shared after."""
    cores = sorted(os.sched_getaffinity(0))
    return [str(cores[i % len(cores)]) for i in range(n)]


def run_suites_at_once(runs: dict[str, tuple[str, list[str]]], tmp: Path, timeout=1200) -> dict[str, pytest.RunResult]:
    """Several runs of the acceptance suite at the same time, each as run_suite runs one: name -> (the node id of
    the self-test it proves for, its arguments). Runs that judge answers, not time, share the engines' idle moments
    (a batch of four costs a CPU engine about what one request does) instead of waiting on each other."""
    def start(name, outer, args):
        # A HOME of its own, as pytester gives each run: the suite's run lock lives there (one run per target and
        # user), and these runs start nothing. PYTEST_CURRENT_TEST: whose proof it is (selftest/proofs.py). Output
        # to files, as pytester's: a pipe nobody reads yet would stall a run mid-check.
        home = tmp / f"{name}-home"
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HOME": str(home), "PY_COLORS": "0", "PYTEST_CURRENT_TEST": f"{outer} (call)",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        env.pop("PYTEST_ADDOPTS", None)
        with open(home / "stdout", "w") as out, open(home / "stderr", "w") as err:
            return subprocess.Popen([sys.executable, "-m", "pytest", f"--basetemp={tmp / name}", TESTS,
                                     *SUITE_PLUGINS, "-rA", "-o", f"faulthandler_timeout={max(timeout - 60, 1)}",
                                     *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def printed(name, stream):
        return (tmp / f"{name}-home" / stream).read_text(errors="replace")

    t0 = time.monotonic()
    started, results = {}, {}
    try:
        for name, (outer, args) in runs.items():
            started[name] = start(name, outer, args)
        for name, proc in started.items():
            try:
                proc.wait(timeout=max(1, timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the suite ({name}) ran past {timeout} s; it printed, last:\n"
                            f"{printed(name, 'stdout')[-6000:]}\n--- its stderr, last (the stacks):\n"
                            f"{printed(name, 'stderr')[-6000:]}", pytrace=False)
            out = printed(name, "stdout")
            print(f"--- the suite ({name}) printed:\n{out}")  # the outer test's output, as pytester's runs show
            results[name] = pytest.RunResult(proc.returncode, out.splitlines(), printed(name, "stderr").splitlines(),
                                             time.monotonic() - t0)
    finally:
        for proc in started.values():  # a failure above leaves no suite running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def sparkgate_cli(*args):
    return subprocess.run([sys.executable, "-m", "sparkgate.cli", *args], capture_output=True, text=True,
                          check=True).stdout


# ---- recipes: broken copies, the embedded default moved --------------------------------------------------

def broken_recipe(tmp_path, change, name="smollm2-cpu"):
    """A recipes folder holding one copy of a shipped recipe with `change` applied."""
    d = tmp_path / "recipes"
    d.mkdir(exist_ok=True)
    data = yaml.safe_load((RECIPES_DIR / f"{name}.yaml").read_text())
    change(data)
    (d / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return str(d)


TWO_NODES = {"head": {"host": "spark01", "address": "192.168.100.10"},
             "worker": {"host": "spark02", "address": "192.168.100.11"}, "interface": "enp1s0f1np1"}


def two_node(data: dict, name: str | None = None) -> None:
    """Turn a recipe's data into two Sparks as one (NVIDIA's two-Spark playbook's addresses and interface): a
    docker recipe on a head and a worker, tensor parallel 2 over Ray; renamed `name` when given."""
    if name:
        data["name"] = name
    data.update(launcher="docker", nodes=copy.deepcopy(TWO_NODES), image=data.get("image") or "vllm-cpu:selftest",
                container_name=data.get("container_name") or data["name"])
    args = data["serve_args"]
    if "--tensor-parallel-size" in args:
        args[args.index("--tensor-parallel-size") + 1] = "2"
    else:
        args += ["--tensor-parallel-size", "2"]
    args += ["--distributed-executor-backend", "ray"]


def beside_its_one_box_twin(tmp_path, name: str = "smollm2-cpu", change=None) -> Path:
    """A recipes folder: the shipped recipe `name`, and the same model as two Sparks as one (`NAME-2node`), with
    `change` then applied to the two-node one."""
    folder = Path(broken_recipe(tmp_path, lambda d: None, name))
    data = yaml.safe_load((folder / f"{name}.yaml").read_text())
    two_node(data, f"{name}-2node")
    if change:
        change(data)
    (folder / f"{name}-2node.yaml").write_text(yaml.safe_dump(data))
    return folder


def made_here_recipe(tmp_path, name: str, model: Path, feature: str, port: int, core: str, change=None) -> Path:
    """A recipes folder holding the embedded default turned into recipe `name` serving a model made here
    (selftest/madehere.py) from its folder, declaring `feature`, on `port` and CPU `core`; `change` then applies a
    twin's one difference."""
    def made(data: dict) -> None:
        data["name"] = name
        data["model"] = {**data["model"], "id": str(model), "source": None, "served_name": name}
        data["serve_args"][data["serve_args"].index("--served-model-name") + 1] = name
        data["features"][feature] = True
        move_port(data, port)
        bind_to_core(data, core)
        if change:
            change(data)

    folder = Path(broken_recipe(tmp_path, made))
    (folder / "smollm2-cpu.yaml").rename(folder / f"{name}.yaml")
    return folder


@contextlib.contextmanager
def serving_at_once(recipes: dict):
    """kind -> recipe, started at once, each from a thread of its own that lives as long as its server (a server's
    process dies with the thread that started it: PR_SET_PDEATHSIG): kind -> server. One that fails to start is
    raised once the others are put away."""
    from sparkgate.launch import serving
    from sparkgate.recipes import load_profiles

    with ThreadPoolExecutor(len(recipes)) as threads, contextlib.ExitStack() as stack:
        loading = {kind: (ctx := serving(recipe, load_profiles()["cpu"], local_mem_available, print, 600),
                          threads.submit(ctx.__enter__)) for kind, recipe in recipes.items()}
        started, errors = {}, []
        for kind, (ctx, future) in loading.items():
            try:
                started[kind] = future.result()
                stack.push(ctx.__exit__)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        yield started


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


# ---- the embedded server's processes, slowed -------------------------------------------------------------

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


# ---- small servers and the recording guard ---------------------------------------------------------------

@contextlib.contextmanager
def serving_at(argv: list[str], url: str, timeout: float = 120):
    """A server process, answering at `url`, stopped however the tests end."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(url, timeout=2).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise TimeoutError(f"{argv} not answering at {url}")
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def broken_gateway_at(port: int, upstream: str):
    """selftest/broken_gateway.py on `port` in front of the server at `upstream`: its base URL, to which a way is
    appended."""
    url = f"http://127.0.0.1:{port}"
    with serving_at([sys.executable, "-m", "selftest.broken_gateway", str(port), upstream],
                    f"{url}/v1-only/v1/models", timeout=30):
        yield url


def failed_checks(out: str) -> list[str]:
    """The IDs of the checks a run of the suite printed as failed (each failure's message starts `[ID] `)."""
    return sorted(set(re.findall(r"^\[([A-Z]+-[A-Z0-9-]+)\] ", out, re.M)))


GUARD_PORT = 18004


def guard(upstream: str, out: Path, port: int = GUARD_PORT, cpu: int | None = None, host: str = "127.0.0.1",
          args: tuple[str, ...] = ()) -> subprocess.Popen:
    """`sparkgate guard` listening on host:port (`args`: more of its options), once it answers."""
    preexec = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    proc = subprocess.Popen([sys.executable, "-m", "sparkgate.cli", "guard", "--listen", f"{host}:{port}",
                             "--upstream", upstream, "--out", str(out), *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=preexec)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"the guard did not listen: {proc.stderr.read().decode() if proc.stderr else ''}")
