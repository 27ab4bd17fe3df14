"""The pytest plugin, wiring only: options, markers, collection hooks and the fixtures the checks take. The run's
state and behaviour are a RunSession (sparkgate.session), what a person reads a Reporting (sparkgate.reporting);
both are registered with the plugin manager, their hooks their methods. No checks live here."""

from __future__ import annotations

import argparse
import re
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from . import link
from .checks import Check
from .compare import TOLERANCE_PCT
from .fleet import fleet_hosts
from .fleetrun import WORKER_KEY, FleetRun, as_a_box_of_the_fleet
from .gpuclocks import GpuClocks
from .hostfacts import HostFacts
from .kernellog import KernelLog
from .launch import CouldNotRun, NeedsTakeOver, Server, StartError, serving
from .launch.base import wait_ready
from .launch.docker_engine import DockerEngine
from .levels import DEFAULT, LEVELS, Level
from .progress import Steps
from .recipes import RECIPES_DIR, Profile, Recipe, one_node_twin
from .redact import mask, printable
from .reporting import Reporting
from .results import Answer, ResultsFile
from .session import RunSession, layer
from .shipped import LAYERS

RUN = pytest.StashKey[RunSession]()


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def _seconds(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds, 1 or more")
    return int(text)


def _address(text: str) -> tuple[str | None, str]:
    box, _, address = text.rpartition("=")  # BOX=ADDR: for that box of a fleet only
    try:
        return box or None, link.peer_address(address)
    except ValueError as exc:  # not an address, or not one of another box
        raise argparse.ArgumentTypeError(f"{exc} (the other node's address on the link)") from None


def _peers_of(box: str, hosts: list[str], given: list[tuple[str | None, str]] | None) -> list[str] | None:
    """The --link-peer addresses for `box`: those given bare, and those given as BOX=ADDR for it."""
    if unknown := sorted({b for b, _ in given or [] if b is not None and b not in hosts}):
        raise pytest.UsageError(f"--link-peer {', '.join(unknown)}=...: not a box of this run ({', '.join(hosts)})")
    return [address for b, address in given or [] if b in (None, box)] or None


def _interface(text: str) -> str:
    if not re.fullmatch(link.INTERFACE, text, re.ASCII):
        raise argparse.ArgumentTypeError(f"{text!r} is not a network interface's name")
    return text


def _mtu(text: str) -> int:
    if not text.isdigit() or not 1280 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not an MTU in bytes (1280 to 65535)")
    return int(text)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sparkgate", "sparkgate: is this box fit to serve?")
    group.addoption("--host", dest="sg_hosts", action="append", default=None, metavar="TARGET",
                    help="the box to check: an ssh name from your ssh config, ssh://user@host:port, or local; "
                         "repeatable: several boxes checked at once, one pytest-xdist worker each, one report "
                         "(default: local)")
    group.addoption("--inventory", dest="sg_inventory", default=None, metavar="FILE",
                    help="more boxes to check at once: one target per line, as an Ansible INI inventory lists its "
                         "hosts ([group] headers and comments skipped) (default: none)")
    group.addoption("--level", dest="sg_level", choices=list(LEVELS), default=DEFAULT,
                    help="how much of each check runs, by time budget: quick (every layer, the fewest repetitions a "
                         "verdict needs: minutes), standard (the repetitions the upgrade gate needs), extended (plus "
                         "~30K-token prompts, sustained load and the capacity sweep past --max-num-seqs) "
                         "(default: %(default)s)")
    group.addoption("--recipe", dest="sg_recipe", action="append", default=None, metavar="NAME",
                    help="recipe to serve and test (repeatable; default: every recipe whose hardware profile "
                         "matches the host). `sparkgate recipes list` shows them")
    group.addoption("--recipes-dir", dest="sg_recipes_dir", default=str(RECIPES_DIR), metavar="DIR",
                    help=f"where recipes are read from (default: {RECIPES_DIR})")
    group.addoption("--profile", dest="sg_profile", default=None, metavar="NAME",
                    help="hardware profile to hold the host to (default: the selected recipes' profile, "
                         "else the one the host matches)")
    group.addoption("--base-url", dest="sg_base_url", default=None, metavar="URL",
                    help="test a server that is already running at URL (e.g. http://spark01:8000); "
                         "start and stop nothing. Needs exactly one --recipe (default: start the recipe)")
    group.addoption("--results-json", dest="sg_results_json", default=None, metavar="PATH",
                    help="write every check's outcome, every figure and the system to PATH as the run goes "
                         "(schema: `sparkgate results-schema`; default: none)")
    group.addoption("--submitter", dest="sg_submitter", default=None, metavar="NAME",
                    help="who ran it, for the results file (default: none)")
    group.addoption("--notes", dest="sg_notes", default=None, metavar="TEXT",
                    help="anything a reader of the results file should know (default: none)")
    group.addoption("--image", dest="sg_image", action="append", default=None, metavar="[WHAT=]REF",
                    help="the upgrade candidate: serve REF instead of the image of WHAT (a recipe's name, or the image "
                         "recipes use today: all of those), for this run (repeatable). A bare REF only when the "
                         "selected docker recipes use one image: it never guesses (default: the recipes' images)")
    group.addoption("--take-over", dest="sg_take_over", action="store_true", default=False,
                    help="a recipe that could only run with what serves on its port taken down (production) may take "
                         "it down: it is set aside once, the recipes run in turn, and it is put back after the last "
                         "and waited on until it serves; the downtime is printed and recorded (default: what serves "
                         "is tested in place, and such a recipe could not run, with the downtime it would cost)")
    group.addoption("--baseline", dest="sg_baseline", default=None, metavar="FILE",
                    help="a results file of the last good run: every perf check also fails on a figure "
                         "significantly worse than there, by `sparkgate compare`'s rule (default: floors only)")
    group.addoption("--tolerance", dest="sg_tolerance", type=float, default=TOLERANCE_PCT, metavar="PCT",
                    help="with --baseline: how much slower a figure may get (100: twice as slow) before it is "
                         "judged (and only then if beyond the noise); raise it on a box whose runs drift: compare "
                         "two runs of an unchanged server to see how far (default: %(default)s)")
    group.addoption("--repro-dir", dest="sg_repro_dir", action="append", default=None, metavar="DIR",
                    help="more stored request bodies (*.json) to replay on every run, besides the shipped "
                         "ones (repeatable; default: the shipped ones only)")
    group.addoption("--usable-tok-s", dest="sg_usable_tok_s", type=float, default=20, metavar="TOK_S",
                    help="per-request decode below which a user's speed is no longer usable, for the capacity "
                         "sweep (default 20: people read at 4-5 tok/s, and 20+ outruns reading comfortably); "
                         "a recipe's usable_decode floor overrides it")
    group.addoption("--usable-ttft-s", dest="sg_usable_ttft_s", type=_positive, default=5, metavar="S",
                    help="time to first token of a short prompt beyond which a concurrency level is not usable, for "
                         "the capacity sweep: TTFT is the saturation signal, requests that queue wait for a seat "
                         "(default: %(default)s)")
    group.addoption("--sustained-s", dest="sg_sustained_s", type=_seconds, default=60, metavar="S",
                    help="how long PERF-SUSTAINED (--level extended) keeps --max-num-seqs streams full; a longer run "
                         "shows the clocks and heat of a soak that a minute does not (default: %(default)s)")
    group.addoption("--link-peer", dest="sg_link_peers", action="append", type=_address, default=None,
                    metavar="[BOX=]ADDR", help="the other node's address on the fast link of a two-node setup (its "
                         "ConnectX-7 interface), repeatable for each link; the HOST-LINK checks ping it from --host. "
                         "BOX=ADDR: for that box only, so both nodes are checked in one run (--host=a --host=b "
                         "--link-peer=a=ADDR_OF_B --link-peer=b=ADDR_OF_A) (default: none, a box on its own)")
    group.addoption("--link-interface", dest="sg_link_interfaces", action="append", type=_interface, default=None,
                    metavar="DEV", help="a link interface of --host, repeatable (default: the interfaces backed by an "
                                        "RDMA device, as a DGX Spark's ConnectX-7 ports are)")
    group.addoption("--link-mtu", dest="sg_link_mtu", type=_mtu, default=9000, metavar="BYTES",
                    help="the MTU every link interface must carry end to end (default: %(default)s, jumbo frames)")
    group.addoption("--clock-skew", dest="sg_clock_skew", type=_positive, default=1.0, metavar="S",
                    help="how far the box's clock may be from the clock of the machine running the suite "
                         "(HOST-CLOCK); a box whose time sync works is within milliseconds (default: %(default)s)")
    group.addoption("--list-checks", dest="sg_list_checks", default=None, metavar="PATH",
                    help="write the collected checks (ID, layer, MUST, why, fix) as Markdown to PATH "
                         "('-': the terminal) and run nothing (default: run the checks)")
    group.addoption("--docker-host", dest="sg_docker_host", default=None, metavar="URL",
                    help="the docker engine to use, as DOCKER_HOST (default: the local engine for --host local, "
                         "else the engine's socket on --host, forwarded over ssh with the ssh options given)")
    group.addoption("--docker-pull", dest="sg_docker_pull", action="store_true", default=False,
                    help="pull a docker recipe's image when the engine lacks it (default: refuse, never pull)")
    group.addoption("--startup-timeout", dest="sg_startup_timeout", type=float, default=1800, metavar="S",
                    help="seconds to wait for a recipe to serve (default 1800: a Spark loads for minutes)")
    group.addoption("--request-timeout", dest="sg_request_timeout", type=float, default=300, metavar="S",
                    help="the most one serving check's request may take in all, trickle included (default 300)")
    group.addoption("--api-key", dest="sg_api_key", default=None, metavar="KEY",
                    help="API key for a server that wants one (default: the recipe's own --api-key, else "
                         "$OPENAI_API_KEY); sent as a bearer token, never printed")
    group.addoption("--summary-md", dest="sg_summary_md", default=None, metavar="PATH",
                    help="write the run's summary (figures, failures by cause, environment, skips) as Markdown to "
                         "PATH, short enough to paste into an issue (default: none)")
    group.addoption("--redact", dest="sg_redact", action="store_true", default=False,
                    help="replace the hostname, ssh target, user, home paths and PCI ids with placeholders in "
                         "the report and the results file, so they can be shared (secrets are always masked)")




def pytest_configure(config: pytest.Config) -> None:
    for name in LAYERS:
        config.addinivalue_line("markers", f"{name}: the {name} layer (applied from the tests/{name} folder)")
    config.addinivalue_line("markers", "extended: long shapes (30K-token prompts, sustained load): --level extended")
    config.addinivalue_line("markers", "check(id, why, fix): the stable ID of an acceptance check")
    config.addinivalue_line("markers", "run_end: judges the whole run, so it runs after every recipe's checks")
    for option in ("hosts", "connection"):  # testinfra's: accepted by pytest, silently meaning the local machine
        if getattr(config.option, option, None):
            raise pytest.UsageError(f"--{option} is testinfra's option, and sparkgate does not read it: the box is "
                                    "--host (an ssh name, ssh://user@host:port, or local), reached over ssh")
    try:
        hosts = fleet_hosts(config.option.sg_hosts, config.option.sg_inventory)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    worker = getattr(config, "workerinput", None)
    opt = config.option
    if len(hosts) > 1 and worker is None and not (opt.sg_list_checks or opt.collectonly):
        # the controller of a fleet: it runs no check and touches no box
        config.pluginmanager.register(FleetRun(config, hosts), "sparkgate-fleet")
    opt.sg_host = hosts[0]
    if WORKER_KEY in (worker or {}):  # one box of a fleet, in a worker of its own
        as_a_box_of_the_fleet(config)
    config.option.sg_link_peers = _peers_of(config.option.sg_host, hosts, config.option.sg_link_peers)
    reporting = Reporting(config)
    config.stash[RUN] = reporting.run = RunSession(config, reporting.say, reporting.write)
    config.pluginmanager.register(reporting, "sparkgate-reporting")
    config.pluginmanager.register(config.stash[RUN], "sparkgate-run")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """A box of a fleet (its own xdist worker): pytest-benchmark, which turns itself off under xdist with a warning at
    the end of every fleet run, is off before it looks. PERF-FORCED still runs its rounds and judges them."""
    if WORKER_KEY in getattr(config, "workerinput", {}):
        config.option.benchmark_disable = True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # layer markers come from the folder, before `-m` selects on them
        if name := layer(item):
            item.add_marker(name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "_testinfra_host" in metafunc.fixturenames:  # testinfra's `host`: this machine, never the box under test
        raise pytest.UsageError(f"{metafunc.definition.nodeid} asks for testinfra's `host` fixture, which is the "
                                "machine pytest runs on, not the box under test: ask for `target_host`")
    if "recipe" in metafunc.fixturenames:
        selected = metafunc.config.stash[RUN].selected
        metafunc.parametrize("recipe", selected, ids=[r.name for r in selected], indirect=True, scope="session")


def pytest_collection_finish(session: pytest.Session) -> None:
    if path := session.config.option.sg_list_checks:
        session.config.pluginmanager.get_plugin("sparkgate-reporting").write_checks(path, session.items)


def pytest_runtestloop(session: pytest.Session) -> bool | None:
    return True if session.config.option.sg_list_checks else None  # listing checks runs nothing


# ---- fixtures: the run, narrowly --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def _run(pytestconfig: pytest.Config) -> RunSession:
    return pytestconfig.stash[RUN]


@pytest.fixture(scope="session")
def target_host(_run: RunSession) -> Any:
    """The box under test as a testinfra host. Not named `host`: testinfra's own `host` (the machine pytest runs on,
    unless testinfra's --hosts says otherwise) would win over it in any module pytest loaded testinfra before."""
    return _run.host


@pytest.fixture(scope="session")
def host_facts(_run: RunSession) -> HostFacts:
    return _run.facts


@pytest.fixture
def after_the_recipes(_run: RunSession) -> RunSession:
    """For a check that judges the box after the run: everything the run started is removed, and what --take-over
    set aside is back and serving, as at the session's end."""
    _run.end_serving()
    return _run


@pytest.fixture(scope="session")
def kernel_log_at_start(_run: RunSession) -> KernelLog | None:
    """The box's kernel log as the run began (None: the run never reached the box)."""
    return _run.kernel_log_at_start


@pytest.fixture(scope="session")
def gpu_clocks_at_start(_run: RunSession) -> tuple[GpuClocks, float] | None:
    """The GPU's clock counters as the run began, and when (monotonic); None: the run never reached the box."""
    return _run.gpu_clocks_at_start


@pytest.fixture(scope="session")
def gpu_clock_samples(_run: RunSession) -> list[tuple[str, list[tuple[int, int]]]]:
    """The SM clocks sampled while each perf check measured, (recipe [check], [(MHz, max MHz)]), read at run end."""
    return _run.clock_samples


@pytest.fixture(scope="session")
def target_name(_run: RunSession) -> str:
    """--host as given: `local`, an ssh name or an ssh:// URL."""
    return _run.target


@pytest.fixture(scope="session")
def profiles(_run: RunSession) -> dict[str, Profile]:
    return _run.profiles


@pytest.fixture(scope="session")
def profile(_run: RunSession) -> Profile:
    """The hardware profile the host is held to."""
    p = _run.profile()
    if p is None:
        f = _run.facts
        pytest.skip(f"this host ({f.arch}, {f.gpus[0].name if f.gpus else 'no NVIDIA GPU'}) matches no "
                    f"hardware profile ({', '.join(_run.profiles)}): name one with --profile")
    return p


@pytest.fixture(scope="session")
def level(_run: RunSession) -> Level:
    return _run.level


@pytest.fixture(scope="session")
def docker_engine(_run: RunSession) -> DockerEngine:
    """The target's docker engine (opened on first use of its client)."""
    return _run.docker


@pytest.fixture(scope="session")
def selected_recipes(_run: RunSession) -> list[Recipe]:
    """The recipes this run serves (after matching them to the host)."""
    return _run.selected


@pytest.fixture(scope="session")
def recipe(request: pytest.FixtureRequest) -> Recipe:
    return request.param


@pytest.fixture(scope="session")
def link_of_box(_run: RunSession, pytestconfig: pytest.Config) -> tuple[list[str], list[str]]:
    """This box's link peers and link interfaces: --link-peer and --link-interface, else what the run's two-node
    recipes that name this box as a node say (the other node's address, the link's interface); [] where none."""
    opt = pytestconfig.option
    nodes = [r.nodes for r in _run.selected if r.nodes and r.nodes.peer_of(opt.sg_host)]
    peers = opt.sg_link_peers or list(dict.fromkeys(n.peer_of(opt.sg_host) for n in nodes))
    return peers, opt.sg_link_interfaces or list(dict.fromkeys(n.interface for n in nodes))


@pytest.fixture(scope="session")
def one_node(recipe: Recipe, _run: RunSession) -> Recipe | None:
    """A two-node recipe's one-box counterpart (the same model on one box), whose figures its own are shown beside."""
    return one_node_twin(recipe, _run.recipes)


@pytest.fixture
def earlier_start(_run: RunSession, recipe: Recipe) -> float | None:
    """Seconds an earlier run took to bring `recipe` to serving on this target (the runner's cache), if known."""
    return _run.last_start(recipe.name)


@pytest.fixture(scope="session")
def recipe_profile(recipe: Recipe, profiles: dict[str, Profile]) -> Profile:
    """The hardware profile the recipe is written for."""
    return profiles[recipe.profile]


@pytest.fixture(scope="session")
def _production(_run: RunSession) -> Any:
    """What --take-over set aside stays aside until the last recipe is done (set up before the first recipe, torn
    down after the last): then it is put back and waited on until it serves."""
    yield
    _run.put_back()


@pytest.fixture(scope="session")
def _served(recipe: Recipe, _run: RunSession, pytestconfig: pytest.Config, _production: Any) -> Any:
    """The recipe, serving, or the StartError that says why not. Started once per recipe, removed after
    its last test; with --base-url, the running server is used and nothing is started or stopped."""
    opt = pytestconfig.option
    if opt.sg_base_url:
        srv = Server(base_url=opt.sg_base_url.rstrip("/"), served_name=recipe.model.served_name,
                     recipe=recipe, started=False, api_key=_run.api_key or recipe.args.api_key)
        try:  # one look before any check: a server that can never answer these checks is one error
            wait_ready(srv.base_url, None, 30, lambda: None, _run.say, f"the server at {srv.base_url}",
                       srv.api_key, quiet=True)
        except StartError as exc:
            yield exc
            return
        ids = [m["id"] for m in httpx.get(f"{srv.base_url}/v1/models", headers=srv.headers, timeout=30).json()["data"]]
        if srv.served_name not in ids:  # SERVE-MODELS's defect: that check fails on it, the others point at it
            srv.not_served = f"the server serves {ids}, not {srv.served_name!r}"
        _run.record_server(srv)
        yield srv
        return
    if recipe.launcher == "process" and _run.target != "local":
        yield StartError(f"{recipe.name} runs as a local process and --host is {_run.target}")
        return
    if recipe.nodes:  # one run holds one box's lock, journal and teardown: it starts nothing on a second box
        exc = CouldNotRun(f"it serves on two nodes ({recipe.nodes.head.host} and "
                          f"{recipe.nodes.worker.host}), which a run does not start: start them as `sparkgate "
                          f"recipes show {recipe.name}` prints, then run with --base-url=http://"
                          f"{recipe.nodes.head.host}:{recipe.port}")
        _run.say(f"{recipe.name}: could not run: {exc}")
        yield exc
        return
    served = None
    try:
        with ExitStack() as stack:  # the run's end checks may close it first (RunSession.end_serving)
            srv = stack.enter_context(serving(
                recipe, _run.profiles[recipe.profile], _run.mem_available, _run.say, opt.sg_startup_timeout,
                docker=lambda: _run.docker, journal=_run.journal, host=_run.host_side, take_over=opt.sg_take_over,
                last_start=_run.last_start))
            served = srv
            _run.record_server(srv)
            _run.serving_now.append(stack)
            _run.started_any |= srv.started
            yield srv
    except Exception as exc:
        if served is not None:
            raise  # the teardown could not put the box back: an error of the run, with the commands to do it
        if isinstance(exc, CouldNotRun):
            _run.say(mask(f"{recipe.name}: could not run: {exc}"
                          + (" (to run it: --take-over)" if isinstance(exc, NeedsTakeOver) else "")))
        # Refused, crashed, a docker API error, a pull that failed: one error, not one per test.
        yield exc if isinstance(exc, StartError) else StartError(f"{type(exc).__name__}: {exc}")


@pytest.fixture
def server(_served: Any, recipe: Recipe, _run: RunSession, request: pytest.FixtureRequest) -> Server:
    """The running server of the current recipe. A recipe that could not start is one error (on its first
    test) and its other tests could not run: skipped, pointing at that error."""
    c = Check.of(request.node)
    if isinstance(_served, CouldNotRun):  # e.g. what serves there is not this recipe's, and stays up
        pytest.skip(f"[{c.id if c else request.node.name}] could not run: {recipe.name}: {mask(str(_served))}"
                    + (" (to run it: --take-over)" if isinstance(_served, NeedsTakeOver) else ""))
    if isinstance(_served, StartError):
        if recipe.name in _run.start_errors:
            pytest.skip(f"{recipe.name} could not be brought up (see the error on its first test)")
        _run.start_errors[recipe.name] = str(_served)
        pytest.fail(mask(f"{recipe.name} could not be brought up: {_served}"), pytrace=False)
    if _served.not_served and c and c.id != "SERVE-MODELS":
        pytest.skip(f"[{c.id}] could not run: {_served.not_served}, and every request names the recipe's model "
                    "(the same defect as SERVE-MODELS's)")
    return _served


@pytest.fixture
def check(request: pytest.FixtureRequest) -> Check:
    """The Check of the running test, from its `check` marker and docstring."""
    found = Check.of(request.node)
    if found is None:
        raise pytest.UsageError(f"{request.node.nodeid} has no @pytest.mark.check(ID, why=..., fix=...)")
    return found


@pytest.fixture(scope="session")
def results(_run: RunSession) -> ResultsFile:
    return _run.results


@pytest.fixture
def server_fact(_run: RunSession, recipe: Recipe) -> Any:
    """server_fact(key, value): keep a fact a check learned of the recipe's server in the results file, and return
    what the --baseline's run of the same recipe said of it (None: no baseline, or it said nothing), as printable
    text: the baseline is a file someone else may have written."""
    def keep(key: str, value: str) -> str | None:
        _run.results.note(recipe.name, key, value)
        before = next((r for r in _run.baseline.recipes if r.recipe == recipe.name), None) if _run.baseline else None
        said = None if before is None else before.server.get(key)
        return None if said is None else printable(said, 80)
    return keep


@pytest.fixture
def baseline_answers(_run: RunSession, recipe: Recipe) -> list[Answer] | None:
    """The --baseline's quality answers of this recipe (empty: it has none); None without --baseline."""
    if _run.baseline is None:
        return None
    return [a for a in _run.baseline.answers if a.recipe == recipe.name]


@pytest.fixture
def keep_figure(_run: RunSession, recipe: Recipe, check: Check, request: pytest.FixtureRequest) -> Any:
    """keep_figure(figure, floor=None, floor_name=None): a measured figure of this check, for the report and the
    results file, and (with --baseline) held to the baseline's."""
    return lambda figure, floor=None, floor_name=None: _run.keep_figure(request.node, figure, recipe, check.id, floor,
                                                                        floor_name)


@pytest.fixture
def progress(_run: RunSession, check: Check) -> Any:
    """progress(total) -> steps; steps(what) before each step of a long check: which, how far, what is left."""
    return lambda total: Steps(_run.say, f"{check.id}, {_run.level.name}", total)
