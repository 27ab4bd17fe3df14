"""A fleet in one run (`--host` repeated, or `--inventory`): pytest-xdist runs one worker per box, each a whole
sparkgate run of its own (its box's lock, journal, recipes, teardown and results file), so one box's failure
never stops another's. This is the controller's side: it starts the workers, runs no check and touches no
box, and merges what they report: one HTML report with a host column, one Markdown summary, the fleet's agreement."""

from __future__ import annotations

import html
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from . import fleet, redact
from .proc import TEARDOWN_SIGNALS, to_stderr
from .redact import mask, md_text
from .report import answer_rows, html_table, summary_html, summary_markdown
from .results import Results

WORKER_KEY = "sparkgate_host"  # the box a worker checks, in its workerinput
LABEL_KEY = "sparkgate_label"  # its name in what the run prints and writes: the box's, or box1.. with --redact
EXIT_PRIORITY = (1, 3, 4, 5)  # a fleet's exit status, where no check failed: a box that failed at its end (the
# gate), then an internal error, a box not checked, a box that ran nothing (an interrupted run ends 2, as xdist ends it)
OUTPUT_KEY = "sparkgate_results"  # what the worker measured, in its workeroutput


def as_a_box_of_the_fleet(config: pytest.Config) -> None:
    """A worker's run is its box's (workerinput), named by its label from the start under --redact, and writes its own
    results file beside the others (`run.json` -> `run.BOX.json`); the controller writes the one Markdown summary."""
    opt, box = config.option, config.workerinput  # type: ignore[attr-defined]
    opt.sg_host, label = box[WORKER_KEY], box[LABEL_KEY]
    if opt.sg_redact:
        redact.MASKER.redact(opt.sg_host, label)
    if opt.sg_results_json:
        opt.sg_results_json = fleet.per_host(opt.sg_results_json, label)
    opt.sg_summary_md = None


class FleetRun:
    def __init__(self, config: pytest.Config, hosts: list[str]) -> None:
        opt = config.option
        if not config.pluginmanager.hasplugin("xdist"):
            raise pytest.UsageError("several boxes at once run on pytest-xdist, which is not installed: "
                                    "pip install pytest-xdist (or one run per box: docs/FLEET.md)")
        if getattr(opt, "numprocesses", None) or getattr(opt, "tx", None) or getattr(opt, "dist", "no") != "no":
            raise pytest.UsageError("with several --host, sparkgate starts one pytest-xdist worker per box itself: "
                                    "leave out -n, --dist and --tx")
        if opt.sg_base_url:
            raise pytest.UsageError("--base-url tests one running server: name one --host with it")
        opt.dist, opt.tx, opt.maxworkerrestart = "each", ["popen"] * len(hosts), "0"  # a dead worker's box: not rerun
        self.config, self.hosts = config, hosts
        # --redact: the boxes are box1, box2, ... in everything the run writes, as each box's own run masks its name.
        self.labels = [f"box{i + 1}" for i in range(len(hosts))] if opt.sg_redact else list(hosts)
        if opt.sg_redact:  # what a box's worker says before it knows its box
            for host, label in zip(hosts, self.labels, strict=True):
                redact.MASKER.redact(host, label)
        self.saved_handlers: dict[int, Any] = {}
        self.results_json, self.summary_md = opt.sg_results_json, opt.sg_summary_md
        opt.sg_results_json = opt.sg_summary_md = None  # the controller measures nothing: the workers write them
        self.results: dict[str, Results] = {}
        self.interrupted = False
        self.outcomes: dict[str, dict[str, str]] = {}  # box -> test -> its outcome, as the reports arrive
        self.collected: dict[str, int] = {}  # worker -> the checks its box runs
        self.status: dict[str, int] = {}  # box -> its run's exit status (the gate's verdict included)
        self.environment: dict[str, dict[str, str]] = {}  # box -> its run's environment table
        self.down: dict[str, str] = {}  # box -> why its worker ended without results
        self.agreement: tuple[list[fleet.Difference], list[str], dict[str, list[str]]] | None = None

    # ---- the workers ------------------------------------------------------------------------------------------

    def pytest_configure_node(self, node: Any) -> None:
        i = int(node.gateway.id.removeprefix("gw"))
        node.workerinput[WORKER_KEY], node.workerinput[LABEL_KEY] = self.hosts[i], self.labels[i]

    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        host = node.workerinput[LABEL_KEY]
        status, said, environment, unusable = getattr(node, "workeroutput", {}).get(OUTPUT_KEY, (None,) * 4)
        if status is not None:
            self.status[host] = status
        if unusable:
            self.down[host] = f"ERROR: {mask(unusable)}"
        elif said:
            try:
                self.results[host], self.environment[host] = Results.model_validate_json(said), environment
            except ValueError as exc:  # pydantic's ValidationError is one: what a box sent is its results file's text
                self.down[host] = f"its results could not be read: {mask(str(exc).splitlines()[0])}"
        if error and not unusable:  # xdist's word for how the worker ended: "keyboard-interrupt", or its crash
            self.down[host] = mask(str(error))

    # ---- what a person reads ----------------------------------------------------------------------------------

    def pytest_report_header(self, config: pytest.Config) -> str:
        return "sparkgate fleet: " + ", ".join(f"{h} (gw{i})" for i, h in enumerate(self.labels))

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session
        self.saved_handlers = {s: signal.signal(s, self._interrupt) for s in TEARDOWN_SIGNALS}

    def _interrupt(self, signum: int, frame: object) -> None:
        """Each box's run stops the way a one-box run stops (its teardown puts its box back), and the controller goes
        on taking their reports until every worker has ended (then xdist ends the run, exit 2). A Ctrl-C typed reaches
        every worker by itself; SIGTERM (CI's cancel) and SIGHUP sent to the controller are passed on as Ctrl-C."""
        if signum != signal.SIGINT or not _typed_at_the_terminal():
            for gateway in self._gateways():
                try:
                    os.kill(gateway._io.popen.pid, signal.SIGINT)
                except (AttributeError, OSError):
                    pass  # gone already
        if not self.interrupted:
            self.interrupted = True
            to_stderr(f"\n[sparkgate] {signal.Signals(signum).name} received: waiting for each box's run to put its "
                      "box back\n")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        for s, handler in self.saved_handlers.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    def _gateways(self) -> list[Any]:
        dsession = self.config.pluginmanager.getplugin("dsession")
        return list(getattr(getattr(dsession, "nodemanager", None), "group", None) or [])

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.collected[node.gateway.id] = len(ids)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Every report names its box: its test id (the terminal's summary, the HTML report's rows) and the failure's
        headline, `test_x@spark02`."""
        self.session.testscollected = sum(self.collected.values())  # xdist counts one box's: progress is the fleet's
        if box := host_of(report):
            if report.when == "???" and self.status.get(box) == pytest.ExitCode.INTERRUPTED:
                # xdist's "worker crashed while running" for the check the box's Ctrl-C cut short: not a failure
                report.outcome, report.longrepr = "skipped", (report.location[0], report.location[1] or 0,
                                                              "interrupted (Ctrl-C) before it finished")
            seen = self.outcomes.setdefault(box, {})
            if report.when == "call" or not report.passed:  # a check's outcome; a failure in any phase is its own
                if seen.get(report.nodeid) != "failed":
                    seen[report.nodeid] = report.outcome
            report.nodeid = f"{report.nodeid}@{box}"
            path, line, domain = report.location
            report.location = (path, line, f"{domain}@{box}")

    def boxes(self) -> dict[str, Results]:
        return {h: self.results[h] for h in self.labels if h in self.results}

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """The fleet's agreement and exit status, and the one Markdown summary."""
        dsession = self.config.pluginmanager.getplugin("dsession")
        if nodes := getattr(dsession, "nodemanager", None):  # every worker has ended its run by now; xdist would
            nodes.EXIT_TIMEOUT = None  # kill one still exiting after 10 s, and nothing of a box's run may be cut
        for h in self.labels:
            if h not in self.status:
                self.down.setdefault(h, "its worker ended without a word (killed, or it crashed)")
        boxes = self.boxes()
        if len(boxes) > 1:
            self.agreement = fleet.differences(boxes)
        # Beside the checks' own verdicts: what a box's run decided at its end (the baseline gate; 4: the box could not
        # be checked), a box whose worker died (1), and boxes that differ (1).
        codes = {c for c in self.status.values() if c} | {1 for h in self.labels if h not in self.status}
        if self.agreement and self.agreement[0]:
            codes.add(1)
        if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and self.interrupted:
            session.exitstatus = pytest.ExitCode.INTERRUPTED  # a signal that came before the workers' runs began
        elif exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and codes:
            session.exitstatus = next((c for c in EXIT_PRIORITY if c in codes), max(codes))
        if self.summary_md:
            Path(self.summary_md).write_text(mask(self.markdown()))

    def agreement_text(self) -> str:
        if self.agreement is None:
            return f"fleet agreement: not compared ({len(self.results)} of {len(self.labels)} boxes reported)\n"
        return fleet.report(self.boxes(), *self.agreement)

    def overview(self) -> list[list[str]]:
        """Per box: passed, failed, could not run, and its results file (or why it has none)."""
        rows = []
        for h in self.labels:
            seen = list(self.outcomes.get(h, {}).values())
            n = {k: str(seen.count(k)) for k in ("passed", "failed", "skipped")}
            where = fleet.per_host(self.results_json, h) if self.results_json else "none (--results-json)"
            rows.append([h, n["passed"], n["failed"], n["skipped"], f"{self.down[h]} ({where})" if h in self.down
                         else where])
        return rows

    def markdown(self) -> str:
        lines = [f"# sparkgate fleet: {len(self.labels)} boxes", "",
                 "| host | passed | failed | could not run | results |", "| --- | --- | --- | --- | --- |",
                 *("| " + " | ".join(md_text(c) for c in r) + " |" for r in self.overview()), "", "## Agreement", "",
                 *(f"- {md_text(line)}" for line in self.agreement_text().splitlines()), ""]
        for h, r in self.boxes().items():
            lines.append(summary_markdown(r.checks, r.measurements, self.environment[h], answer_rows(r.answers),
                                          title=h))
        return "\n".join(lines)

    def pytest_html_results_summary(self, prefix: list[str], summary: list[str], postfix: list[str],
                                    session: pytest.Session) -> None:
        prefix.append(f"<h2>sparkgate fleet: {len(self.labels)} boxes</h2>"
                      + html_table(["host", "passed", "failed", "could not run", "results"], self.overview(),
                                   "sparkgate-fleet")
                      + f'<pre id="sparkgate-agreement">{html.escape(mask(self.agreement_text()))}</pre>')
        for h, r in self.boxes().items():  # ids by the box's place in the fleet: a box without results leaves a gap
            prefix.append(summary_html(r.checks, r.measurements, answer_rows(r.answers), title=h,
                                       anchor=f"-box{self.labels.index(h) + 1}"))
            prefix.append(html_table(["environment", ""], [list(kv) for kv in self.environment[h].items()]))

    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells.insert(1, "<th>Host</th>")

    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        cells.insert(1, f"<td>{html.escape(mask(host_of(report)))}</td>")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for row in self.overview():
            terminalreporter.write_line(mask(f"{row[0]}: {row[1]} passed, {row[2]} failed, {row[3]} could not run; "
                                             f"results: {row[4]}"))
        text = self.agreement_text()
        terminalreporter.write_line(mask(text.rstrip()), red=bool(self.agreement and self.agreement[0]))


def _typed_at_the_terminal() -> bool:
    """Whether a SIGINT came from the terminal, which sends it to every process of the run, workers included: the run
    is its terminal's foreground job."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def host_of(report: pytest.TestReport) -> str:
    """The box a worker's report is about (xdist sets `node` on the reports it receives)."""
    node = getattr(report, "node", None)
    return getattr(node, "workerinput", {}).get(LABEL_KEY, "")

