"""The pytest plugin: options, markers, the host and recipe fixtures, the run lock, signals and report plumbing.
No checks live here."""

from __future__ import annotations

import html
import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from . import __version__, commit, redact
from .checks import Check
from .compare import TOLERANCE_PCT
from .hostfacts import HostFacts, gather, gpu_mib_of_container, matching_profile
from .hostlock import HostLock, Journal, LockError
from .launch import Server, StartError, serving
from .launch.base import DEFERRED_SIGNALS, TEARDOWN_SIGNALS, noting, wait_ready
from .launch.container_spec import HostPaths
from .launch.docker_engine import DockerEngine
from .launch.docker_launcher import HostSide, undo
from .measure import Figure
from .recipes import RECIPES_DIR, Profile, Recipe, RecipeError, load_profiles, load_recipes
from .redact import mask
from .report import summary_html, summary_markdown
from .results import CheckResult, Measurement, Results, ResultsFile, Submitter, load
from .shipped import LAYERS, layer_of
from .target import open_host

STATE = pytest.StashKey["State"]()


class State:
    """What one session knows: the recipes, the host and what was chosen to run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        opt = config.option
        self.target: str = opt.sg_host
        try:
            self.profiles = load_profiles()
            self.recipes = load_recipes(Path(opt.sg_recipes_dir), self.profiles)
        except RecipeError as exc:
            raise pytest.UsageError(str(exc)) from None
        unknown = [n for n in opt.sg_recipe or [] if n not in self.recipes]
        if unknown:
            raise pytest.UsageError(f"--recipe {', '.join(unknown)}: no such recipe (have: {', '.join(self.recipes)})")
        if opt.sg_profile and opt.sg_profile not in self.profiles:
            raise pytest.UsageError(f"--profile {opt.sg_profile}: no such profile (have: {', '.join(self.profiles)})")
        if opt.sg_base_url and len(opt.sg_recipe or []) != 1:
            raise pytest.UsageError("--base-url tests one running server against one recipe: add --recipe NAME")
        # Until the host is read, every named recipe (or every recipe) is a candidate.
        self.selected: list[Recipe] = [self.recipes[n] for n in opt.sg_recipe] if opt.sg_recipe else list(
            self.recipes.values())
        self.not_matching: list[Recipe] = []
        self._host: Any = None
        self._facts: HostFacts | None = None
        # What the run measured and found, kept as it goes (and written as it goes with --results-json).
        self.results = ResultsFile(Path(opt.sg_results_json) if opt.sg_results_json else None,
                                   Submitter(name=opt.sg_submitter, notes=opt.sg_notes))
        self.baseline: Results | None = None
        if not opt.sg_tolerance >= 0:  # NaN too
            raise pytest.UsageError(f"--tolerance {opt.sg_tolerance:g}: a percentage of 0 or more is how much slower "
                                    "a figure may get (100: twice as slow)")
        if opt.sg_baseline:
            try:
                self.baseline = load(Path(opt.sg_baseline))
            except (OSError, ValueError) as exc:
                raise pytest.UsageError(f"--baseline {opt.sg_baseline}: not a readable sparkgate results file: "
                                        f"{str(exc).splitlines()[0]} (`sparkgate validate FILE` says what is "
                                        "wrong)") from None
        if opt.sg_image:
            self.override_image(opt.sg_image)
        self.start_errors: dict[str, str] = {}
        self._docker: DockerEngine | None = None
        self.lock: HostLock | None = None
        self._journal: Journal | None = None
        # Secrets the run knows before it starts: they are masked in everything it writes.
        redact.secret(opt.sg_api_key)
        for r in self.recipes.values():
            redact.secrets_of(r.env, r.serve_args)

    @property
    def api_key(self) -> str | None:
        """The key for a server started elsewhere (--base-url): --api-key, else the openai client's variable."""
        return self.config.option.sg_api_key or os.environ.get("OPENAI_API_KEY") or None

    @property
    def docker(self) -> DockerEngine:
        """The target's docker engine, opened on first use."""
        if self._docker is None:
            opt = self.config.option
            self._docker = DockerEngine(self.target, opt.ssh_config, opt.ssh_identity_file,
                                        docker_host=opt.sg_docker_host, pull=opt.sg_docker_pull)
        return self._docker

    @property
    def host_side(self) -> HostSide:
        """What the docker launcher needs of the host itself: its paths, what exists there, GPU memory held."""
        f = self.facts
        return HostSide(paths=HostPaths(home=f.home or "$HOME", hf_cache=f.hf_cache or "$HOME/.cache/huggingface"),
                        exists=lambda path: self.host.file(path).exists,
                        gpu_mib=lambda container_id: gpu_mib_of_container(self.host, f, container_id))

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal(self.host)
        return self._journal

    def take_the_host(self, say: Any) -> None:
        """One run per host: hold its lock for the session, then finish what a dead run left undone."""
        opt = self.config.option
        self.lock = HostLock(self.target, opt.ssh_config, opt.ssh_identity_file)
        try:
            self.lock.acquire()
        except LockError as exc:
            self.lock = None
            raise pytest.UsageError(mask(str(exc))) from None
        if self.lock.warning:
            say(f"WARNING: {self.lock.warning}")
        for stale in self.lock.stale:
            say(f"WARNING: took over the run lock of {self.target} from a run that died: held by {stale}")
        left = self.journal.load()
        if left:
            say(f"an earlier run on {self.target} died before putting the box back; restoring it first")
            try:
                for done in undo(self.docker, left, say):
                    say(f"  {done}")
            except StartError as exc:
                raise pytest.UsageError(mask(f"{self.target} is not as an earlier run found it, and it could not be "
                                             f"restored: {exc}")) from None
            self.journal.clear()

    def override_image(self, image: str) -> None:
        """--image: every docker recipe serves this image instead of its own, for this run only."""
        docker = {n: r for n, r in self.recipes.items() if r.launcher == "docker"}
        if processes := [r.name for r in self.selected if r.launcher != "docker" and self.config.option.sg_recipe]:
            raise pytest.UsageError(f"--image {image}: {', '.join(processes)} runs as a process, not from an image")
        if not docker:
            raise pytest.UsageError(f"--image {image}: no docker recipe to serve it (--image replaces a docker "
                                    "recipe's image; have: " + ", ".join(self.recipes) + ")")
        for name, r in docker.items():
            self.recipes[name] = r.model_copy(update={"image": image})
        self.selected = [self.recipes[r.name] for r in self.selected]

    @property
    def outcomes(self) -> list[CheckResult]:
        return self.results.data.checks

    @property
    def measured(self) -> list[Measurement]:
        return self.results.data.measurements

    def record_figure(self, figure: Figure, recipe: Recipe, check: str, test: str, floor: float | None = None,
                      floor_name: str | None = None) -> Measurement:
        """A measured figure, for the report's summary and plots and the results file."""
        return self.results.add(figure, recipe, check, test, floor, floor_name)

    def note_outcome(self, item: pytest.Item, report: pytest.TestReport, check: str) -> None:
        """How a check ended (a failure in setup, call or teardown is its outcome, whatever else happened)."""
        if (old := self.results.check(item.nodeid)) is not None and old.outcome == "failed":
            return
        outcome = "skipped" if report.skipped else "failed" if report.failed else "passed"
        if isinstance(report.longrepr, tuple):
            message = report.longrepr[2].removeprefix("Skipped: ")
        else:
            message = str(report.longrepr or "")
        self.results.set_check(CheckResult(id=check, test=item.nodeid, recipe=_recipe_of(item), outcome=outcome,
                                           message=mask(message)))

    def summary_markdown(self) -> str:
        meta = self.config.stash.get(_metadata_key(), {}) if _metadata_key() else {}
        return summary_markdown(self.outcomes, self.measured, {k: str(v) for k, v in meta.items()})

    def release(self) -> None:
        if self._docker is not None:
            self._docker.close()  # the ssh forward of the engine's socket
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    @property
    def host(self) -> Any:
        if self._host is None:
            # --ssh-config and --ssh-identity-file are testinfra's own options; they apply to --host too.
            opt = self.config.option
            self._host = open_host(self.target, opt.ssh_config, opt.ssh_identity_file)
        return self._host

    @property
    def facts(self) -> HostFacts:
        if self._facts is None:
            try:
                self._facts = gather(self.host, self.target)
            except Exception as exc:  # one clear error for an unreachable host, not one per test
                raise pytest.UsageError(mask(f"cannot read host {self.target!r}: {type(exc).__name__}: {exc}")) \
                    from None
            if self.config.option.sg_redact:
                redact_identities(self._facts)
            self.results.set_system(self._facts)
        return self._facts

    def profile(self) -> Profile | None:
        opt = self.config.option
        if opt.sg_profile:
            return self.profiles[opt.sg_profile]
        chosen = {r.profile for r in self.selected}
        if opt.sg_recipe and len(chosen) == 1:
            return self.profiles[chosen.pop()]
        return matching_profile(self.facts, self.profiles)

    def select_for_host(self) -> None:
        """Default selection: the recipes whose hardware profile matches the host."""
        if self.config.option.sg_recipe:
            return
        profile = matching_profile(self.facts, self.profiles)
        matching = [r for r in self.selected if profile and r.profile == profile.name]
        self.not_matching = [r for r in self.selected if r not in matching]
        self.selected = matching


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sparkgate", "sparkgate: is this box fit to serve?")
    group.addoption("--host", dest="sg_host", default="local", metavar="TARGET",
                    help="the box to check: an ssh name from your ssh config, ssh://user@host:port, or "
                         "local (default: local)")
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
    group.addoption("--image", dest="sg_image", default=None, metavar="REF",
                    help="serve every docker recipe with this image instead of its own, for this run (the "
                         "upgrade candidate; default: the recipe's image)")
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
    for layer in LAYERS:
        config.addinivalue_line("markers", f"{layer}: the {layer} layer (applied from the tests/{layer} folder)")
    config.addinivalue_line("markers", "extended: long shapes (30K-token prompts, sustained load)")
    config.addinivalue_line("markers", "check(id, why, fix): the stable ID of an acceptance check")
    for option in ("hosts", "connection"):  # testinfra's: accepted by pytest, silently meaning the local machine
        if getattr(config.option, option, None):
            raise pytest.UsageError(f"--{option} is testinfra's option, and sparkgate does not read it: the box is "
                                    "--host (an ssh name, ssh://user@host:port, or local), reached over ssh")
    config.stash[STATE] = State(config)


_SAVED_HANDLERS = pytest.StashKey[dict[int, Any]]()


def _teardown_on_every_signal(config: pytest.Config) -> None:
    """Ctrl-C, SIGTERM (CI cancel, `timeout`) and SIGHUP (a closed ssh session) all stop the run through pytest's
    own interrupt path, which tears every fixture down, restoring the box. Only the first one interrupts: the
    wind-down that follows runs to its end, and later signals are noted, not obeyed."""
    if threading.current_thread() is not threading.main_thread():
        return
    note = noting(lambda msg: print(f"\n[sparkgate] {msg}", flush=True), "putting the box back")

    def interrupt(signum: int, frame: object) -> None:
        if DEFERRED_SIGNALS:
            note(signum, frame)
            return
        DEFERRED_SIGNALS.append(signum)
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    config.stash[_SAVED_HANDLERS] = {s: signal.signal(s, interrupt) for s in TEARDOWN_SIGNALS}


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        state.release()
    if DEFERRED_SIGNALS:
        for s in TEARDOWN_SIGNALS:  # all is put back; what is left is the interpreter's exit
            signal.signal(s, signal.SIG_IGN)
        return
    for s, handler in config.stash.get(_SAVED_HANDLERS, {}).items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def redact_identities(facts: HostFacts) -> None:
    """--redact: stable placeholders for what identifies the box and its people."""
    home = os.path.expanduser("~")
    redact.MASKER.redact(facts.target if facts.target != "local" else None, "<target>")
    redact.MASKER.redact(facts.hostname, "<hostname>")
    redact.MASKER.redact(home if home != "/" else None, "<home>")
    redact.MASKER.redact(facts.user if facts.user not in ("root", "") else None, "<user>")
    for i, gpu in enumerate(facts.gpus):
        redact.MASKER.redact(gpu.pci_bus_id, f"<pci-{i}>")


def _layer(item: pytest.Item) -> str | None:
    return layer_of(Path(str(item.path)))


def _recipe_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params["recipe"].name if callspec and "recipe" in callspec.params else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Layer markers come from the folder, before `-m` selects on them.
    for item in items:
        if layer := _layer(item):
            item.add_marker(layer)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "recipe" in metafunc.fixturenames:
        state = metafunc.config.stash[STATE]
        metafunc.parametrize("recipe", state.selected, ids=[r.name for r in state.selected],
                             indirect=True, scope="session")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Read the host once (never for --collect-only) and keep the recipes whose profile it matches."""
    config = session.config
    state = config.stash[STATE]
    if config.option.sg_list_checks:
        _write_checks(config.option.sg_list_checks, session.items)
        return
    if config.option.collectonly or not any(_layer(i) for i in session.items):
        return
    _teardown_on_every_signal(config)  # from here on the run may change the box: every signal tears down
    state.take_the_host(_progress(config))
    facts = state.facts
    state.select_for_host()
    chosen = {r.name for r in state.selected}
    keep, drop = [], []
    for item in session.items:
        name = _recipe_of(item)
        (keep if name is None or name in chosen else drop).append(item)
    if drop and chosen:
        config.hook.pytest_deselected(items=drop)
        session.items[:] = keep
    elif drop:
        reason = (f"no recipe is for this host ({facts.arch}, "
                  f"{facts.gpus[0].name if facts.gpus else 'no NVIDIA GPU'}): name one with --recipe "
                  f"(have: {', '.join(state.recipes)})")
        for item in drop:
            item.add_marker(pytest.mark.skip(reason=reason))
    # The host layer first (before anything is started on it), then each recipe's layers in turn.
    order = {r.name: i for i, r in enumerate(state.selected)}
    session.items.sort(key=lambda item: (_layer(item) != "host", order.get(_recipe_of(item), -1),
                                         LAYERS.index(_layer(item) or "host")))
    _record_environment(config, facts, {"sparkgate": f"{__version__} (commit {commit()})"})
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        for key, value in facts.summary().items():
            reporter.write_line(mask(f"{key}: {value}"))
        names = ", ".join(r.name for r in state.selected) or "none"
        others = ", ".join(f"{r.name} ({r.profile})" for r in state.not_matching)
        reporter.write_line(f"Recipes: {names}" + (f"; not for this host: {others}" if others else ""))


def _write_checks(path: str, items: list[pytest.Item]) -> None:
    """The catalogue of checks, generated from the tests themselves so it cannot drift from them."""
    rows, seen = [], set()
    for item in items:
        c = Check.of(item)
        if c and c.id not in seen:
            seen.add(c.id)
            cells = [f"`{c.id}`", _layer(item) or "", c.must, c.why, c.fix]
            rows.append("| " + " | ".join(x.replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    text = "\n".join(["# Checks", "", "Generated by `pytest --list-checks=docs/CHECKS.md`; do not edit by hand.", "",
                      "| ID | layer | MUST | why it matters | what to do |", "| --- | --- | --- | --- | --- |",
                      *rows, ""])
    if path == "-":
        print(text)
    else:
        Path(path).write_text(text)


def pytest_runtestloop(session: pytest.Session) -> bool | None:
    return True if session.config.option.sg_list_checks else None  # listing checks runs nothing


def _metadata_key() -> Any:
    try:
        from pytest_metadata.plugin import metadata_key
    except ImportError:
        return None
    return metadata_key


def _record_environment(config: pytest.Config, facts: HostFacts, extra: dict[str, str] | None = None) -> None:
    """Host facts and recipes into pytest-html's environment table (pytest-metadata)."""
    key = _metadata_key()
    meta = config.stash.get(key, None) if key else None
    if meta is not None:
        meta.update({k: mask(v) for k, v in facts.summary().items()})
        meta.update({k: mask(v) for k, v in (extra or {}).items()})


def _progress(config: pytest.Config):
    """Progress lines on the terminal, masked, around pytest's capture (which would hold them until the test
    ends: a model loads for minutes)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    quiet = config.option.verbose < 0

    def say(msg: str) -> None:
        if reporter is None or (quiet and msg.startswith("  ")):  # details are left out under -q
            return
        if capman is not None:
            with capman.global_and_fixture_disabled():
                reporter.write_line(f"[sparkgate] {mask(msg)}")
        else:
            reporter.write_line(f"[sparkgate] {mask(msg)}")

    return say


# ---- fixtures -------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def sparkgate_state(pytestconfig: pytest.Config) -> State:
    return pytestconfig.stash[STATE]


@pytest.fixture(scope="session")
def host(sparkgate_state: State) -> Any:
    """The box under test as a testinfra host (overrides testinfra's own, module-scoped `host`)."""
    return sparkgate_state.host


@pytest.fixture(scope="session")
def host_facts(sparkgate_state: State) -> HostFacts:
    return sparkgate_state.facts


@pytest.fixture(scope="session")
def profile(sparkgate_state: State) -> Profile:
    p = sparkgate_state.profile()
    if p is None:
        f = sparkgate_state.facts
        pytest.skip(f"this host ({f.arch}, {f.gpus[0].name if f.gpus else 'no NVIDIA GPU'}) matches no "
                    f"hardware profile ({', '.join(sparkgate_state.profiles)}): name one with --profile")
    return p


@pytest.fixture(scope="session")
def selected_recipes(sparkgate_state: State) -> list[Recipe]:
    """The recipes this run serves (after matching them to the host)."""
    return sparkgate_state.selected


@pytest.fixture(scope="session")
def recipe(request: pytest.FixtureRequest) -> Recipe:
    return request.param


@pytest.fixture(scope="session")
def _served(recipe: Recipe, sparkgate_state: State, pytestconfig: pytest.Config) -> Any:
    """The recipe, serving, or the StartError that says why not. Started once per recipe, removed after
    its last test; with --base-url, the running server is used and nothing is started or stopped."""
    opt = pytestconfig.option
    state = sparkgate_state
    if opt.sg_base_url:
        srv = Server(base_url=opt.sg_base_url.rstrip("/"), served_name=recipe.model.served_name,
                     recipe=recipe, started=False, api_key=state.api_key or recipe.args.api_key)
        try:  # one look before any check: a server that can never answer these checks is one error
            wait_ready(srv.base_url, None, 30, lambda: None, _progress(pytestconfig), f"the server at {srv.base_url}",
                       srv.api_key, quiet=True)
        except StartError as exc:
            yield exc
            return
        ids = [m["id"] for m in httpx.get(f"{srv.base_url}/v1/models", headers=srv.headers, timeout=30).json()["data"]]
        if srv.served_name not in ids:  # SERVE-MODELS's defect: that check fails on it, the others point at it
            srv.not_served = f"the server serves {ids}, not {srv.served_name!r}"
        _record_server(srv, state)
        yield srv
        return
    if recipe.launcher == "process" and state.target != "local":
        yield StartError(f"{recipe.name} runs as a local process and --host is {state.target}")
        return
    served = None
    try:
        with serving(recipe, state.profiles[recipe.profile], lambda: mem_available(state.host),
                     _progress(pytestconfig), opt.sg_startup_timeout, docker=lambda: state.docker,
                     journal=state.journal, host=state.host_side) as srv:
            served = srv
            _record_server(srv, state)
            yield srv
    except Exception as exc:
        if served is not None:
            raise  # the teardown could not put the box back: an error of the run, with the commands to do it
        # Refused, crashed, a docker API error, a pull that failed: one error, not one per test.
        yield exc if isinstance(exc, StartError) else StartError(f"{type(exc).__name__}: {exc}")


def mem_available(host: Any) -> int:
    from .hostfacts import parse_meminfo

    return parse_meminfo(host.file("/proc/meminfo").content_string)["MemAvailable"]


def _record_server(srv: Server, state: State) -> None:
    """What is serving, for the results file: the server's own vLLM version, and the launcher's facts
    (image digest and the like)."""
    try:
        srv.facts.setdefault("vllm_version", httpx.get(f"{srv.base_url}/version", timeout=10,
                                                       headers=srv.headers).json()["version"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        srv.facts.setdefault("vllm_version", "unknown (no /version)")
    state.results.add_recipe(srv.recipe, srv.facts)
    r, f = srv.recipe, srv.facts
    if r is not None:  # the report's environment table: what served, exactly
        image = f"{f['image']} ({f.get('image_id', '')[:19]}; {f.get('image_digest') or 'no registry digest'})" \
            if f.get("image") else "none (a local process)"
        _record_environment(state.config, state.facts, {f"{r.name}: model": r.model.id,
                                                        f"{r.name}: vLLM": f["vllm_version"],
                                                        f"{r.name}: image": image,
                                                        f"{r.name}: recipe digest": r.digest,
                                                        f"{r.name}: served at": srv.base_url})


@pytest.fixture
def server(_served: Any, recipe: Recipe, sparkgate_state: State, request: pytest.FixtureRequest) -> Server:
    """The running server of the current recipe. A recipe that could not start is one error (on its first
    test) and its other tests could not run: skipped, pointing at that error."""
    if isinstance(_served, StartError):
        if recipe.name in sparkgate_state.start_errors:
            pytest.skip(f"{recipe.name} could not be brought up (see the error on its first test)")
        sparkgate_state.start_errors[recipe.name] = str(_served)
        pytest.fail(mask(f"{recipe.name} could not be brought up: {_served}"), pytrace=False)
    c = Check.of(request.node)
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
def results(sparkgate_state: State) -> ResultsFile:
    return sparkgate_state.results


# ---- report plumbing -------------------------------------------------------------------------------------

@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run in which every check was skipped ran nothing: it must not read as a pass to a gate script."""
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    if state.outcomes:
        state.results.finish()
    if session.config.option.sg_summary_md:
        Path(session.config.option.sg_summary_md).write_text(mask(state.summary_markdown()))
    ran = {o.outcome for o in state.outcomes}
    if exitstatus == pytest.ExitCode.OK and state.outcomes and not ran & {"passed", "failed"}:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter:
            reporter.write_line(f"sparkgate: all {len(state.outcomes)} selected checks were skipped: nothing ran "
                                "(exit status 5; read the skip reasons)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    report = outcome.get_result()
    c = Check.of(item)
    if c:
        report.user_properties.append(("check", c.id))
    state = item.config.stash.get(STATE, None)
    if state is not None and _layer(item) and (call.when == "call" or not report.passed):
        state.note_outcome(item, report, c.id if c else item.name)
    _mask_report(report)
    if DEFERRED_SIGNALS and call.when == "teardown":  # Ctrl-C during a restore: stop now that it is done
        item.session.shouldstop = f"{signal.Signals(DEFERRED_SIGNALS[0]).name} received during a teardown"


def _mask_report(report: pytest.TestReport) -> None:
    """Everything a report carries to the terminal, the HTML report and the results goes through mask()."""
    report.sections = [(title, mask(text)) for title, text in report.sections]
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:  # a skip: (path, line, reason)
        path, line, reason = report.longrepr
        report.longrepr = (path, line, mask(reason))
    elif report.longrepr is not None:
        text = str(report.longrepr)
        if mask(text) != text:
            report.longrepr = mask(text)


def pytest_html_results_summary(prefix: list[str], summary: list[str], postfix: list[str],
                                session: pytest.Session) -> None:
    """The report opens on the run's summary: figures, failures by cause, plots, skips by reason."""
    state = session.config.stash.get(STATE, None)
    if state is not None and state.outcomes:
        prefix.append(mask(summary_html(state.outcomes, state.measured)))


def pytest_html_results_table_html(report: pytest.TestReport, data: list[str]) -> None:
    """A skipped check's row says why, in one line, instead of pytest's raw (path, line, reason) tuple."""
    if report.skipped and isinstance(report.longrepr, tuple):
        data[:] = [html.escape(report.longrepr[2].removeprefix("Skipped: "))]


def pytest_html_report_title(report: Any) -> None:
    report.title = "sparkgate: is this box fit to serve?"


def pytest_html_results_table_header(cells: list[str]) -> None:
    cells.insert(1, "<th>Check</th>")


def pytest_html_results_table_row(report: pytest.TestReport, cells: list[str]) -> None:
    cid = dict(report.user_properties).get("check", "")
    cells.insert(1, f"<td>{cid}</td>")
