"""What a person reads of a run, as one object registered with pytest's plugin manager (pytest-html's report shape):
progress lines around capture, every report masked, the HTML report's summary, title, check column and
environment table, the Markdown summary, and the checks catalogue. The numbers come from the run (RunSession)."""

from __future__ import annotations

import html
import sys
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest

from .checks import Check
from .fleetrun import LABEL_KEY
from .redact import mask
from .report import answer_rows, summary_html, summary_markdown
from .results import CheckResult
from .session import RunSession, layer
from .shipped import LAYERS


class Reporting:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.run: RunSession | None = None  # set once the run exists (it needs `say` to be made)
        # In a fleet, each box's run is a pytest-xdist worker, whose terminal is not the operator's: its progress
        # goes to the stderr it shares with the controller, each line naming its box.
        self.box: str | None = getattr(config, "workerinput", {}).get(LABEL_KEY)

    def say(self, msg: str) -> None:
        """A progress line on the terminal, masked, around pytest's capture (which would hold it until the test
        ends: a model loads for minutes). A line that starts with two spaces is a detail, left out under -q."""
        if self.config.option.verbose < 0 and msg.startswith("  "):
            return
        self.write(msg, prefix="" if self.box is not None else "[sparkgate] ")

    def write(self, msg: str, sep: bool = False, prefix: str = "") -> None:
        """A line on the terminal, masked (`sep`: as a red separator). A fleet's box writes to the stderr its worker
        shares with the controller (its own terminal is no one's), each line naming its box."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else nullcontext():
            if self.box is not None:
                sys.stderr.write(f"[sparkgate {self.box}] {mask(msg)}\n")
                sys.stderr.flush()
            elif reporter is not None and sep:
                reporter.write_sep("=", mask(msg), red=True)
            elif reporter is not None:
                reporter.write_line(prefix + mask(msg))

    # ---- every report masked, with its check's ID --------------------------------------------------------

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        report = (yield).get_result()
        c = Check.of(item)
        if c:
            report.user_properties.append(("check", c.id))
        mask_report(report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """What ran, at which level, layer by layer: a pass says what it covered."""
        if self.run is None or not self.run.outcomes:
            return
        self.write(self.ran())

    def ran(self) -> str:
        assert self.run is not None
        return f"What ran, at --level {self.run.level.name}: {what_ran(self.run.outcomes)}"

    # ---- pytest-html --------------------------------------------------------------------------------------

    def pytest_html_results_summary(self, prefix: list[str], summary: list[str], postfix: list[str],
                                    session: pytest.Session) -> None:
        """The report opens on the run's summary: figures, failures by cause, plots, skips by reason."""
        if self.run is not None and self.run.outcomes:
            # masked inside, before escaping
            prefix.append(summary_html(self.run.outcomes, self.run.measured, self._answers()))
            prefix.append(f'<p id="sparkgate-ran">{html.escape(mask(self.ran()))}</p>')

    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        """A skipped check's row says why, in one line, instead of pytest's raw (path, line, reason) tuple."""
        if report.skipped and isinstance(report.longrepr, tuple):
            data[:] = [html.escape(report.longrepr[2].removeprefix("Skipped: "))]

    def pytest_html_report_title(self, report: Any) -> None:
        report.title = "sparkgate: is this box fit to serve?"

    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells.insert(1, "<th>Check</th>")

    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        cells.insert(1, f"<td>{dict(report.user_properties).get('check', '')}</td>")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The environment table (pytest-metadata's, which pytest-html renders at the end) and the Markdown summary."""
        if self.run is None:
            return
        masked = {k: mask(v) for k, v in self.run.environment.items()}  # masked first, then escaped: never after
        meta = self._metadata()
        if meta is not None and self.box is None:  # a fleet's boxes: each in its section (their workers' metadata
            # would overwrite each other's in the controller's); pytest-html renders the values as HTML: what a server
            # or recipe says is only text
            meta.update({k: html.escape(v) for k, v in masked.items()})
        if path := self.config.option.sg_summary_md:
            env = {**{k: str(v) for k, v in (meta or {}).items() if k not in masked}, **masked}
            Path(path).write_text(mask(summary_markdown(self.run.outcomes, self.run.measured, env, self._answers())))

    def _answers(self) -> list[list[str]]:
        assert self.run is not None
        base = self.run.baseline
        return answer_rows(self.run.results.data.answers, base.answers if base is not None else None)

    def _metadata(self) -> dict[str, Any] | None:
        try:
            from pytest_metadata.plugin import metadata_key
        except ImportError:
            return None
        return self.config.stash.get(metadata_key, None)

    # ---- the catalogue ------------------------------------------------------------------------------------

    def write_checks(self, path: str, items: list[pytest.Item]) -> None:
        """The catalogue of checks, generated from the tests themselves so it cannot drift from them."""
        rows, seen = [], set()
        for item in items:
            c = Check.of(item)
            if c and c.id not in seen:
                seen.add(c.id)
                where = f"`{item.nodeid.split('[')[0]}`"
                cells = [f"`{c.id}`", layer(item) or "", where, c.must, c.why, c.fix]
                rows.append("| " + " | ".join(x.replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
        text = "\n".join(["# Checks", "", "Generated by `pytest --list-checks=docs/CHECKS.md`; do not edit by hand.",
                          "Which self-test proves each check green, and which red: [PROOFS.md](PROOFS.md).",
                          "", "| ID | layer | file::function | MUST | why it matters | what to do |",
                          "| --- | --- | --- | --- | --- | --- |", *rows, ""])
        if path == "-":
            print(text)
        else:
            Path(path).write_text(text)


def what_ran(outcomes: list[CheckResult]) -> str:
    """Per layer, how many checks passed, failed and could not run."""
    counts: dict[str, Counter[str]] = {name: Counter() for name in LAYERS}
    for o in outcomes:  # the layer is the check file's folder, whatever the test ids are relative to
        folder = next((part for part in reversed(Path(o.test.split("::")[0]).parts[:-1]) if part in LAYERS), "other")
        counts.setdefault(folder, Counter())[o.outcome] += 1
    return "; ".join(f"{name} {n['passed']} passed, {n['failed']} failed, {n['skipped']} could not run"
                     for name, n in counts.items() if n)


def mask_report(report: pytest.TestReport) -> None:
    """Everything a report carries to the terminal, the HTML report and the results goes through mask()."""
    report.sections = [(title, mask(text)) for title, text in report.sections]
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:  # a skip: (path, line, reason)
        path, line, reason = report.longrepr
        report.longrepr = (path, line, mask(reason))
    elif report.longrepr is not None:
        text = str(report.longrepr)
        if mask(text) != text:
            report.longrepr = mask(text)
