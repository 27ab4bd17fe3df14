"""The run: one object registered with pytest's plugin manager (pytest-benchmark's `BenchmarkSession` shape), its
hooks its methods. It owns what was chosen to run, the host and its lock and journal, the results and outcomes, and
the baseline gate. The checks never see it: they take the narrow fixtures sparkgate.plugin makes from it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from . import __version__, commit, gpuclocks, kernellog, redact
from .checks import Check
from .compare import ALPHA, compare_figure, key
from .fleetrun import LABEL_KEY, OUTPUT_KEY, WORKER_KEY
from .hostfacts import HostFacts, gather, gpu_mib_of_container, matching_profile
from .hostlock import OLD_JOURNAL, HostLock, Journal, JournalError, LockError
from .launch import Server, StartError
from .launch.base import wait_ready
from .launch.container_spec import HostPaths
from .launch.docker_engine import DockerEngine
from .launch.docker_launcher import HostSide, undo
from .levels import LEVELS, Level
from .measure import Figure
from .proc import DEFERRED_SIGNALS, TEARDOWN_SIGNALS, cache_dir, noting, shielded, to_stderr
from .recipes import Profile, Recipe, RecipeError, load_profiles, load_recipes, override_images
from .redact import mask
from .results import CheckResult, Downtime, Measurement, Results, ResultsFile, Submitter, load
from .shipped import LAYERS, layer_of
from .target import open_host

Say = Callable[[str], None]
_REGRESSIONS = pytest.StashKey[list[str]]()


def layer(item: pytest.Item) -> str | None:
    return layer_of(Path(str(item.path)))


def recipe_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params["recipe"].name if callspec and "recipe" in callspec.params else None


class RunSession:
    """What one run knows and does: the recipes and the level, the host, what was chosen to run, what it found."""

    def __init__(self, config: pytest.Config, say: Say, write: Callable[..., None]) -> None:
        self.config, self.say, self.write = config, say, write  # write(line, sep=False): the terminal, masked
        opt = config.option
        self.target: str = opt.sg_host
        self.level: Level = LEVELS[opt.sg_level]
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
        self.reads_packages = True  # whether the facts include dpkg's and apt's state (HOST-DPKG is selected)
        # What the run measured and found, kept as it goes (and written as it goes with --results-json).
        self.results = ResultsFile(Path(opt.sg_results_json) if opt.sg_results_json else None,
                                   Submitter(name=opt.sg_submitter, notes=opt.sg_notes), self.level.name,
                                   selection(config))
        self.environment: dict[str, str] = {}  # for the report's environment table
        self.baseline = self._baseline()
        self._earlier_starts = _starts()  # before this run's own: what its starts are held to
        if opt.sg_image:
            self.override_images(opt.sg_image)
        self.start_errors: dict[str, str] = {}
        self._docker: DockerEngine | None = None
        self.lock: HostLock | None = None
        self._journal: Journal | None = None
        self.kernel_log_at_start: kernellog.KernelLog | None = None
        self.gpu_clocks_at_start: tuple[gpuclocks.GpuClocks, float] | None = None
        self.sample_clocks = False  # whether the SM clock is sampled while each perf figure is measured
        self.clock_samples: list[tuple[str, list[tuple[int, int]]]] = []  # (recipe [check], its samples)
        self.began: float | None = None  # when the run began on the box (time.time()), once it reached it
        self.serving_now: list[ExitStack] = []  # the servers this run started and has not removed yet
        self.started_any = False  # whether it started a server of its own (not --base-url, not in place)
        self.unusable: str | None = None  # a fleet's box: why it could not be checked at all
        self.unusable_status = pytest.ExitCode.USAGE_ERROR  # INTERNAL_ERROR where the reason is not the box's
        self._saved_handlers: dict[int, Any] = {}
        # Secrets the run knows before it starts: they are masked in everything it writes.
        redact.secret(opt.sg_api_key)
        for r in self.recipes.values():
            redact.secrets_of(r.env, r.serve_args)

    def _baseline(self) -> Results | None:
        opt = self.config.option
        if not opt.sg_tolerance >= 0:  # NaN too
            raise pytest.UsageError(f"--tolerance {opt.sg_tolerance:g}: a percentage of 0 or more is how much slower "
                                    "a figure may get (100: twice as slow)")
        if not opt.sg_baseline:
            return None
        try:
            baseline = load(Path(opt.sg_baseline))
        except (OSError, ValueError) as exc:
            raise pytest.UsageError(f"--baseline {opt.sg_baseline}: not a readable sparkgate results file: "
                                    f"{str(exc).splitlines()[0]} (`sparkgate validate FILE` says what is "
                                    "wrong)") from None
        if baseline.measured_level != self.level.name:
            raise pytest.UsageError(f"--baseline {opt.sg_baseline} was measured at --level {baseline.measured_level} "
                                    f"and this run is at --level {self.level.name}: their figures have different "
                                    f"repetitions and shapes; run with --level {baseline.measured_level}, or make "
                                    "the baseline again at this level")
        return baseline

    # ---- the host -----------------------------------------------------------------------------------------

    @property
    def api_key(self) -> str | None:
        """The key for a server started elsewhere (--base-url): --api-key, else the openai client's variable."""
        return self.config.option.sg_api_key or os.environ.get("OPENAI_API_KEY") or None

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
                self._facts = gather(self.host, self.target, packages=self.reads_packages)
            except Exception as exc:  # one clear error for an unreachable host, not one per test
                raise pytest.UsageError(mask(f"cannot read host {self.target!r}: {type(exc).__name__}: {exc}")) \
                    from None
            if self.config.option.sg_redact:
                redact_identities(self._facts)
            self.results.set_system(self._facts)
        return self._facts

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
                        gpu_mib=lambda container_id: gpu_mib_of_container(self.host, f.compute_apps, container_id))

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal(self.host)
        return self._journal

    def mem_available(self) -> int:
        from .hostfacts import parse_meminfo

        return parse_meminfo(self.host.file("/proc/meminfo").content_string)["MemAvailable"]

    def take_the_host(self) -> None:
        """One run per host: hold its lock for the session, then finish what a dead run left undone."""
        opt = self.config.option
        self.lock = HostLock(self.target, opt.ssh_config, opt.ssh_identity_file)
        try:
            self.lock.acquire()
        except LockError as exc:
            self.lock = None
            raise pytest.UsageError(mask(str(exc))) from None
        if self.lock.warning:
            self.say(f"WARNING: {self.lock.warning}")
        for stale in self.lock.stale:
            self.say(f"WARNING: took over the run lock of {self.target} from a run that died: held by {stale}")
        try:
            left = self.journal.load()
        except JournalError as exc:
            self.release()
            raise pytest.UsageError(mask(str(exc))) from None
        if self.host.run(f"test -s {OLD_JOURNAL}").rc == 0:
            self.say(f"WARNING: {OLD_JOURNAL} on {self.target} is a journal of an earlier sparkgate (in a folder every "
                     "user could write): it is not acted on. Read it: if it says a container was set aside "
                     "(NAME.sparkgate-saved), put it back by hand; then remove it")
        if left:
            self.say(f"an earlier run on {self.target} died before putting the box back; restoring it first")
            try:
                for done in undo(self.docker, left, self.say):
                    self.say(f"  {done}")
            except StartError as exc:
                raise pytest.UsageError(mask(f"{self.target} is not as an earlier run found it, and it could not be "
                                             f"restored: {exc}")) from None
            self.journal.clear()

    # ---- production, set aside by --take-over ---------------------------------------------------------------

    def last_start(self, recipe: str) -> float | None:
        """Seconds the suite took to bring `recipe` to serving on this target in an earlier run (the runner's cache),
        if known."""
        return self._earlier_starts.get(f"{self.target} {recipe}")

    def put_back(self) -> None:
        """After the run's last recipe: bring back what --take-over set aside, and wait until it serves again (on its
        port, its model listed, a real answer), at most twice its own last start (its log's) plus a minute, else
        --startup-timeout. The downtime is printed and recorded; a production that does not come back is one
        failure with the commands that bring it back."""
        if self._journal is None or not self._journal.entries:
            return
        entries = list(self._journal.entries)
        with shielded(self.say, "putting production back"):
            for done in undo(self.docker, entries, self.say):
                self.say(f"  {done}")
            self._journal.clear()
        for e in entries:  # it is back and started; the wait only proves it serves, and Ctrl-C may cut it short
            if e["kind"] == "set-aside" and e.get("running"):
                if self._exists(e["id"]):
                    self._wait_back(e)
                else:
                    self.results.add_downtime(Downtime(container=e["name"], served=e.get("served") or [],
                                                       outcome="removed by someone else while set aside"))

    def end_serving(self) -> None:
        """Before the checks that judge the box after the run: remove every server the run started and put back what
        --take-over set aside, as the session's end would (which then finds nothing left to do)."""
        while self.serving_now:
            self.serving_now.pop().close()
        self.put_back()

    def _exists(self, container_id: str) -> bool:
        import docker.errors

        try:
            self.docker.client.containers.get(container_id)
            return True
        except docker.errors.NotFound:
            return False

    def _wait_back(self, e: dict[str, Any]) -> None:
        name, served, load_s = e["name"], e.get("served") or [], e.get("load_s")
        budget = 2 * load_s + 60 if load_s else self.config.option.sg_startup_timeout
        rule = f"twice its own last start, {load_s:.0f} s, plus a minute" if load_s else "--startup-timeout"
        url = f"http://{self.docker.address}:{e['port']}"
        recipe = self.recipes.get(e.get("recipe", ""))
        key = recipe.args.api_key if recipe else None  # the key the plan found it serving with
        outcome, seconds = f"{name} back under its name and started; it served nothing on port {e['port']} before", None
        try:
            if served:
                self.say(f"{name}: waiting for it to serve {served[0]} again (at most {budget:.0f} s)")
                wait_ready(url, served[0], budget, lambda: None, self.say, name, key, quiet=True)
                answer_once(url, served[0], key)
                seconds = time.time() - e["down_at"]
                outcome = f"{name} serves {served[0]} again (a real answer) after {seconds:.0f} s down"
        except (StartError, httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            outcome = f"{name} did not serve {served[0]} again within {budget:.0f} s: {exc}"
            self.results.add_downtime(Downtime(container=name, served=served, seconds=None, outcome=mask(outcome)))
            pytest.fail(mask(
                f"PRODUCTION IS NOT SERVING: {outcome}\n"
                f"  expected: {name} serving {served[0]} on port {e['port']} within {budget:.0f} s of its restore "
                f"({rule})\n"
                f"  found:    it was renamed back and started (docker start), and does not answer with its model\n"
                f"  why:      this run took it down (--take-over); every user of the box is without it\n"
                f"  fix:      docker logs --tail 50 {name}; docker restart {name}; then curl {url}/v1/models"),
                pytrace=False)
        self.say(f"{outcome}" + (f" (set aside at {time.strftime('%H:%M:%S', time.localtime(e['down_at']))})"
                                 if seconds is not None else ""))
        self.results.add_downtime(Downtime(container=name, served=served, seconds=seconds and round(seconds, 1),
                                           outcome=mask(outcome)))

    def release(self) -> None:
        if self._docker is not None:
            self._docker.close()  # the ssh forward of the engine's socket
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ---- selection ----------------------------------------------------------------------------------------

    def override_images(self, specs: list[str]) -> None:
        """--image: the recipes it names (by name, or by the image they use today) serve the candidate image instead
        of their own, for this run only."""
        try:
            images = override_images(self.recipes, specs, self.config.option.sg_recipe)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        for name, image in images.items():
            self.recipes[name] = self.recipes[name].model_copy(update={"image": image})
        self.selected = [self.recipes[r.name] for r in self.selected]

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

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Read the host once (never for --collect-only or --list-checks) and keep the recipes whose profile it
        matches: the host layer first, then each recipe's layers in turn. First of the hooks: a fleet's worker
        (pytest-xdist) tells the controller which checks it runs in its own, and they must be these."""
        try:
            self._prepare(session)
        except Exception as exc:
            if WORKER_KEY not in getattr(self.config, "workerinput", {}):
                raise
            # A fleet's box that cannot be checked (unreachable, its lock held, ssh lost while reading it): one error
            # for that box, said on the terminal the workers share and sent to the controller; its worker runs
            # nothing, and the other boxes go on.
            if isinstance(exc, pytest.UsageError):
                self.unusable = mask(str(exc))
            else:  # not the box's doing: sparkgate's, said with where it happened
                where = traceback.extract_tb(exc.__traceback__)[-1]
                self.unusable = mask(f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})")
                self.unusable_status = pytest.ExitCode.INTERNAL_ERROR
            self.say(f"ERROR: this box could not be checked: {self.unusable}")
            session.config.hook.pytest_deselected(items=list(session.items))
            session.items[:] = []

    def _prepare(self, session: pytest.Session) -> None:
        config = session.config
        if config.option.sg_list_checks or config.option.collectonly or not any(layer(i) for i in session.items):
            return
        self.teardown_on_every_signal()  # from here on the run may change the box: every signal tears down
        self.take_the_host()
        self.reads_packages = any((c := Check.of(i)) and c.id == "HOST-DPKG" for i in session.items)
        facts = self.facts
        wanted = {f for i in session.items for f in getattr(i, "fixturenames", ())}
        if "kernel_log_at_start" in wanted:
            self.kernel_log_at_start = kernellog.read(self.host.run)  # what HOST-KERNEL-LOG counts from
        if "gpu_clocks_at_start" in wanted and facts.gpus:  # what HOST-GPU-CLOCKS counts from
            self.gpu_clocks_at_start = (gpuclocks.read(self.host.run), time.monotonic())
        self.sample_clocks = "gpu_clock_samples" in wanted and bool(facts.gpus)  # what HOST-GPU-CLOCK-FLOOR judges
        self.began = time.time()
        self.select_for_host()
        chosen = {r.name for r in self.selected}
        keep, drop = [], []
        for item in session.items:
            name = recipe_of(item)
            (keep if name is None or name in chosen else drop).append(item)
        if drop and chosen:
            config.hook.pytest_deselected(items=drop)
            session.items[:] = keep
        elif drop:
            reason = (f"no recipe is for this host ({facts.arch}, "
                      f"{facts.gpus[0].name if facts.gpus else 'no NVIDIA GPU'}): name one with --recipe "
                      f"(have: {', '.join(self.recipes)})")
            for item in drop:
                item.add_marker(pytest.mark.skip(reason=reason))
        order = {r.name: i for i, r in enumerate(self.selected)}
        # The host layer, then each recipe's layers in turn, then what judges the whole run (marked run_end).
        session.items.sort(key=lambda item: (2 if item.get_closest_marker("run_end") else layer(item) != "host",
                                             order.get(recipe_of(item), -1), LAYERS.index(layer(item) or "host")))
        self.environment.update(facts.summary())
        self.environment["sparkgate"] = f"{__version__} (commit {commit()})"
        self.environment["level"] = f"{self.level.name}: {self.level.summary}"
        for k, value in facts.summary().items():
            self.write(f"{k}: {value}")
        names = ", ".join(r.name for r in self.selected) or "none"
        others = ", ".join(f"{r.name} ({r.profile})" for r in self.not_matching)
        self.write(f"Recipes: {names}" + (f"; not for this host: {others}" if others else ""))
        self.write(f"Level: {self.level.name} ({self.level.summary}; --level quick|standard|extended)")

    # ---- what is serving ----------------------------------------------------------------------------------

    def record_server(self, srv: Server) -> None:
        """What is serving, for the results file and the environment table: the server's own vLLM version, and
        the launcher's facts (image digest and the like)."""
        try:
            srv.facts.setdefault("vllm_version", httpx.get(f"{srv.base_url}/version", timeout=10,
                                                           headers=srv.headers).json()["version"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            srv.facts.setdefault("vllm_version", "unknown (no /version)")
        self.results.add_recipe(srv.recipe, srv.facts)
        if srv.started and srv.recipe is not None and (load_s := srv.facts.get("load_s")):
            # What CONT-STARTUP-TIME holds the next start to: its first streamed token where that was timed.
            _remember_start(f"{self.target} {srv.recipe.name}", float(srv.facts.get("first_answer_s") or load_s))
        r, f = srv.recipe, srv.facts
        if r is not None:
            image = f"{f['image']} ({f.get('image_id', '')[:19]}; {f.get('image_digest') or 'no registry digest'})" \
                if f.get("image") else "none (a local process)"
            self.environment.update({f"{r.name}: model": r.model.id, f"{r.name}: vLLM": f["vllm_version"],
                                     f"{r.name}: image": image, f"{r.name}: recipe digest": r.digest,
                                     f"{r.name}: served at": srv.base_url})

    # ---- outcomes, figures and the baseline gate ----------------------------------------------------------

    @property
    def outcomes(self) -> list[CheckResult]:
        return self.results.data.checks

    @property
    def measured(self) -> list[Measurement]:
        return self.results.data.measurements

    def keep_figure(self, item: pytest.Item, figure: Figure, recipe: Recipe, check: str, floor: float | None = None,
                    floor_name: str | None = None) -> Measurement:
        """A measured figure, for the report, the summary and the results file; with --baseline, also compared
        with the baseline's (sparkgate.compare's rule): a significant regression fails the check after its own
        verdict."""
        measured = self.results.add(figure, recipe, check, item.nodeid, floor, floor_name)
        if self.baseline is not None and (problem := self._against_baseline(measured)):
            item.stash.setdefault(_REGRESSIONS, []).append(problem)
        return measured

    def _against_baseline(self, measured: Measurement) -> str | None:
        """What is wrong with `measured` against the baseline's figure of the same recipe, check and name: a
        significant regression, or a figure measured differently; None when nothing is (or the baseline lacks it)."""
        assert self.baseline is not None
        base = next((m for m in self.baseline.measurements if key(m) == key(measured)), None)
        if base is None:
            print("  against the baseline: not in it")
            return None
        if base.shape != measured.shape or base.method != measured.method:
            return (f"{measured.name} not comparable: the baseline measured it differently (shape "
                    f"{base.shape.key()}, method {base.method!r}); this run: {measured.shape.key()}, "
                    f"{measured.method!r}")
        verdict = compare_figure(base, measured, self.config.option.sg_tolerance)
        print(f"  against the baseline: {verdict.describe()}: {verdict.verdict}")
        return verdict.describe() if verdict.regressed else None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """--baseline: a check whose own verdict passed still fails on a significant regression against the baseline
        (one failure naming every such figure); a check that failed on its own keeps that failure. While a perf check
        measures, the GPU's SM clock is sampled (HOST-GPU-CLOCK-FLOOR judges it after the run)."""
        check, recipe = Check.of(item), self.recipes.get(recipe_of(item) or "")
        on_gpu = recipe is not None and self.profiles[recipe.profile].gpu is not None  # not a CPU recipe beside a GPU
        if self.sample_clocks and on_gpu and check is not None and check.id.startswith("PERF-"):
            sampler = gpuclocks.Sampler(self.host.run)
            try:
                with sampler:
                    result = yield
            except pytest.skip.Exception:  # could not run: whatever it read was not a figure's load
                sampler.reads = 0
                raise
            finally:  # a figure that failed its floor was measured too: its clocks count
                if sampler.reads:
                    self.clock_samples.append((f"{recipe_of(item)} [{check.id}]", sampler.samples))
        else:
            result = yield
        problems = item.stash.get(_REGRESSIONS, [])
        if problems:
            opt, base = item.config.option, self.baseline
            assert base is not None
            images = ", ".join(f"{r.recipe}: {r.image or 'process'}" for r in base.recipes)
            pytest.fail(Check.of(item).message(
                expected=f"no figure significantly worse than in the baseline {opt.sg_baseline} (more than "
                         f"{opt.sg_tolerance:g}% slower, beyond the noise of both: Welch's t-test, p < {ALPHA:g})",
                found="; ".join(problems),
                why=f"the baseline is this box before the change ({images}; sparkgate {base.suite.version}, "
                    f"{base.started}); a figure that got significantly worse is what the change did to every user, "
                    "even above the floor",
                fix="keep the previous image or flags (the baseline's image and serving digest are in its results "
                    "file); `sparkgate compare BASELINE CANDIDATE` shows every figure side by side. A figure "
                    "measured differently: make the baseline again with this version of the suite"), pytrace=False)
        return result

    def missing_from_baseline(self) -> list[str]:
        """What the baseline judged and this run did not: each figure it measured and this run did not, each check
        that passed there and neither passed nor failed here (not selected, or could not run), and how the two
        selections differ. A candidate that measured less never passes the gate for what it left out."""
        assert self.baseline is not None
        base, opt = self.baseline, self.config.option
        have = {key(m) for m in self.measured}
        figures = [f"{m.recipe} [{m.check}] {m.name}" for m in base.measurements if key(m) not in have]
        ran = {(c.recipe, c.id) for c in self.outcomes if c.outcome != "skipped"}
        checks = sorted({f"{c.recipe or 'host'} [{c.id}]" for c in base.checks
                         if c.outcome == "passed" and (c.recipe, c.id) not in ran})
        if not figures and not checks:
            return []
        lines = []
        if figures:
            lines += [f"{len(figures)} figure(s) of the baseline {opt.sg_baseline} not measured by this run:",
                      *(f"  {f}" for f in figures)]
        if checks:
            lines += [f"{len(checks)} check(s) that passed in the baseline and neither passed nor failed here:",
                      *(f"  {c}" for c in checks)]
        mine = self.results.data.selection
        if base.selection != mine:
            lines.append(f"the selections differ: the baseline ran {base.selection or 'everything'}, this run "
                         f"{mine or 'everything'}")
        lines.append("run the candidate with the baseline's selection and level (and recipes), or make the baseline "
                     "again with this run's; a figure the candidate did not measure is not one it passed")
        return lines

    def note_outcome(self, item: pytest.Item, report: pytest.TestReport, check: str) -> None:
        """How a check ended (a failure in setup, call or teardown is its outcome, whatever else happened)."""
        if (old := self.results.check(item.nodeid)) is not None and old.outcome == "failed":
            return
        outcome = "skipped" if report.skipped else "failed" if report.failed else "passed"
        if isinstance(report.longrepr, tuple):
            message = report.longrepr[2].removeprefix("Skipped: ")
        else:
            message = str(report.longrepr or "")
        self.results.set_check(CheckResult(id=check, test=item.nodeid, recipe=recipe_of(item), outcome=outcome,
                                           message=mask(message)))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        report = (yield).get_result()
        c = Check.of(item)
        if layer(item) and (call.when == "call" or not report.passed):
            self.note_outcome(item, report, c.id if c else item.name)
        if DEFERRED_SIGNALS and call.when == "teardown":  # Ctrl-C during a restore: stop now that it is done
            item.session.shouldstop = f"{signal.Signals(DEFERRED_SIGNALS[0]).name} received during a teardown"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """A run in which every check was skipped ran nothing: it must not read as a pass to a gate script."""
        if self.outcomes:
            self.results.finish()
        if self.baseline is not None and self.outcomes and exitstatus in (pytest.ExitCode.OK,
                                                                           pytest.ExitCode.TESTS_FAILED):
            missing = self.missing_from_baseline()
            if missing:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
                self.write("sparkgate: the gate fails on what the candidate did not measure", sep=True)
                for line in missing:
                    self.write(line)
        ran = {o.outcome for o in self.outcomes}
        if exitstatus == pytest.ExitCode.OK and self.outcomes and not ran & {"passed", "failed"}:
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
            self.write(f"sparkgate: all {len(self.outcomes)} selected checks were skipped: nothing ran (exit status 5; "
                       "read the skip reasons)")
        if (output := getattr(self.config, "workeroutput", None)) is not None:  # a fleet's worker: to the controller
            status = self.unusable_status if self.unusable else session.exitstatus
            output[OUTPUT_KEY] = (int(status), self.results.masked_json(),
                                  {k: mask(v) for k, v in self.environment.items()}, self.unusable)

    # ---- signals ------------------------------------------------------------------------------------------

    def teardown_on_every_signal(self) -> None:
        """Ctrl-C, SIGTERM (CI cancel, `timeout`) and SIGHUP (a closed ssh session) all stop the run through pytest's
        own interrupt path, which tears every fixture down, restoring the box. Only the first one interrupts: the
        wind-down that follows runs to its end, and later signals are noted, not obeyed."""
        if threading.current_thread() is not threading.main_thread():
            return
        box = getattr(self.config, "workerinput", {}).get(LABEL_KEY)
        note = noting(lambda msg: print(f"\n[sparkgate] {msg}", flush=True) if box is None else
                      to_stderr(f"[sparkgate {box}] {msg}\n"), "putting the box back")

        def interrupt(signum: int, frame: object) -> None:
            if DEFERRED_SIGNALS:
                note(signum, frame)
                return
            DEFERRED_SIGNALS.append(signum)
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

        self._saved_handlers = {s: signal.signal(s, interrupt) for s in TEARDOWN_SIGNALS}

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.release()
        if DEFERRED_SIGNALS:
            for s in TEARDOWN_SIGNALS:  # all is put back; what is left is the interpreter's exit
                signal.signal(s, signal.SIG_IGN)
            return
        for s, handler in self._saved_handlers.items():
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


def selection(config: pytest.Config) -> str | None:
    """What was selected to run, as given: -m and -k (None: everything)."""
    opt = config.option
    parts = [f"-m {opt.markexpr!r}" if opt.markexpr else "", f"-k {opt.keyword!r}" if opt.keyword else "",
             *(f"--recipe {name}" for name in opt.sg_recipe or [])]
    return " ".join(p for p in parts if p) or None


def _starts_file() -> Path:
    return cache_dir() / "starts.json"


def _starts() -> dict[str, float]:
    try:
        data = json.loads(_starts_file().read_text())
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError, TypeError):
        return {}


def _remember_start(key: str, seconds: float) -> None:
    """Keep a measured start for the next run's downtime estimate (best effort: an estimate is not a result)."""
    starts = _starts()
    starts[key] = round(seconds, 1)
    tmp = _starts_file().with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(starts, indent=1))
        os.replace(tmp, _starts_file())
    except OSError:
        pass


def answer_once(base_url: str, model: str, api_key: str | None) -> None:
    """One real answer from `model` (a few tokens): serving, not only listing. Raises when there is none."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.post(f"{base_url}/v1/chat/completions", headers=headers, timeout=120,
                          json={"model": model, "max_tokens": 8,
                                "messages": [{"role": "user", "content": "Say OK."}]})
    response.raise_for_status()
    if not response.json()["usage"]["completion_tokens"]:
        raise ValueError("it answered with no tokens")
