"""Which self-test proves each check green and which red, taken from what the suite's runs really did.

Every run of the suite a self-test starts loads this module as a plugin (SUITE_PLUGINS): with SPARKGATE_PROOF_LOG
set (the self-tests' session sets it), it appends one line per check that ran, with its outcome and the self-test
that started the run. The self-tests' session adds a line for each self-test that passed. A check is proven green
by a passing self-test in which it passed, and red by a passing self-test in which it failed with its own verdict
(the self-tests assert which checks fail and with what message; a crash, or a self-test that failed, proves
nothing).

    python -m selftest.proofs [LOG] [--write docs/PROOFS.md]

reads the newest log (a full `pytest selftest` run's) and prints, or writes, the table, unproven checks first.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

LOG = "SPARKGATE_PROOF_LOG"
ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".cache" / "proofs"


def _append(entry: dict) -> None:
    with open(os.environ[LOG], "a", encoding="utf-8") as f:  # one short line per write: appends do not interleave
        f.write(json.dumps(entry) + "\n")


# ---- inside a run of the suite --------------------------------------------------------------------------------

_OUTER = re.sub(r" \((setup|call|teardown)\)$", "", os.environ.get("PYTEST_CURRENT_TEST", ""))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    marker = item.get_closest_marker("check")
    if LOG in os.environ and _OUTER and marker and marker.args:
        failed_setup = report.when == "setup" and not report.passed  # a skip (could not run) or an error
        if report.when == "call" or failed_setup:
            # A failure is the check's verdict only when its message is (it starts "[ID] "): a crash is no proof.
            verdict = report.passed or str(report.longrepr).startswith(f"[{marker.args[0]}] ")
            entry = {"by": _OUTER, "check": marker.args[0], "outcome": report.outcome, "verdict": verdict}
            if report.skipped and isinstance(report.longrepr, tuple):  # why it could not run, to tell runs apart
                entry["why"] = report.longrepr[2][:300]
            _append(entry)
    return report


# ---- the self-tests' own session ------------------------------------------------------------------------------

def start_log() -> None:
    """Called by the self-tests' session: a new log for this run (kept beside the others, newest last); a worker
    of that session writes to its controller's."""
    if LOG not in os.environ:
        LOGS.mkdir(parents=True, exist_ok=True)
        os.environ[LOG] = str(LOGS / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl")


def record_outcome(report) -> None:
    """A self-test's own outcome, for the table: only a self-test that passed proves anything. A setup or teardown
    is kept too where it failed or took a second or more (its seconds: where CI's time goes)."""
    if LOG in os.environ and (report.when == "call" or not report.passed or report.duration >= 1):
        _append({"selftest": report.nodeid, "outcome": report.outcome, "when": report.when,
                 "seconds": round(report.duration, 1)})


# ---- the table -------------------------------------------------------------------------------------------------

def proofs(lines: list[str]) -> dict[str, dict[str, list[str]]]:
    """check ID -> {"green": [self-tests], "red": [self-tests]} from a log's lines."""
    entries = [json.loads(line) for line in lines if line.strip()]
    bad = {e["selftest"] for e in entries if "selftest" in e and e["outcome"] != "passed"}
    # Passed means its call passed: a setup that passed is no proof (the run may have stopped in the call).
    good = {e["selftest"] for e in entries
            if "selftest" in e and e["when"] == "call" and e["outcome"] == "passed"} - bad
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: {"green": set(), "red": set()})
    for e in entries:
        if "check" in e and e["by"] in good and e["outcome"] in ("passed", "failed") and e.get("verdict", True):
            out[e["check"]]["green" if e["outcome"] == "passed" else "red"].add(e["by"])
    return {k: {way: sorted(v[way]) for way in v} for k, v in out.items()}


# Why a check has no proof yet in a direction, as measured here: shown under the table beside each unproven check.
WHY_NOT_YET = {
    "CONT-CUDAGRAPH": "green needs a Gated DeltaNet hybrid served with MTP on an engine that captures CUDA graphs (a "
                      "GPU) and logs its cudagraph mode: the CPU engine runs neither (red is proven on the serve "
                      "args alone)",
    "CONT-EAGER": "both ways need an engine on a GPU whose profile supports CUDA graphs: on the CPU engine (its log "
                  "sizes a CPU KV cache) the check could not run",
}


def _registry() -> list[str]:
    text = (ROOT / "docs" / "CHECKS.md").read_text()
    return re.findall(r"^\| `([A-Z]+-[A-Z0-9-]+)` \|", text, re.M)


def _cell(tests: list[str]) -> str:
    if not tests:
        return "**none**"
    names = [t.split("::", 1)[-1].split("[")[0] for t in tests]
    shown = ", ".join(f"`{n}`" for n in dict.fromkeys(names[:2]))
    return shown + (f" (+{len(tests) - 2})" if len(tests) > 2 else "")


def table(found: dict[str, dict[str, list[str]]], source: str) -> str:
    ids = _registry()
    unproven = [i for i in ids if not (found.get(i, {}).get("green") and found.get(i, {}).get("red"))]
    lines = ["# Proofs", "",
             "Generated by `python -m selftest.proofs --write docs/PROOFS.md` from the log of a full self-test run "
             f"({source}); do not edit by hand.",
             "A check is proven green by a passing self-test in which it passed, and red by a passing self-test in "
             "which it failed (the self-test asserts that it fails, and with what message).", "",
             f"{len(ids) - len(unproven)} of {len(ids)} checks are proven both ways; not yet: "
             + (", ".join(f"`{i}`" for i in unproven) or "none") + ".", "",
             "| ID | proven green by | proven red by |", "| --- | --- | --- |"]
    for i in sorted(ids, key=lambda i: (i not in unproven, ids.index(i))):
        ways = found.get(i, {})
        lines.append(f"| `{i}` | {_cell(ways.get('green', []))} | {_cell(ways.get('red', []))} |")
    if unproven:
        lines += ["", "Why not yet:", ""]
        lines += [f"- `{i}`: {WHY_NOT_YET.get(i, '**no reason stated** (add it to WHY_NOT_YET in selftest/proofs.py)')}"
                  for i in unproven]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    write = argv[argv.index("--write") + 1] if "--write" in argv else None
    args = [a for a in argv if a not in ("--write", write)]
    logs = sorted(LOGS.glob("run-*.jsonl"), key=lambda p: p.stat().st_mtime)
    path = Path(args[0]) if args else (logs[-1] if logs else None)
    if path is None or not path.exists():
        print(f"no proof log: run `pytest selftest` first (logs are kept in {LOGS})", file=sys.stderr)
        return 2
    text = table(proofs(path.read_text().splitlines()), path.name)
    if write:
        Path(write).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
