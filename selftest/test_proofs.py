"""The proofs table: only a self-test that passed proves anything, and "could not run" proves nothing."""

import json
import re

from selftest.proofs import ROOT, WHY_NOT_YET, _registry, proofs, table


def _lines(*entries):
    return [json.dumps(e) for e in entries]


def test_a_check_is_proven_only_by_self_tests_that_passed_and_only_by_what_it_did():
    log = _lines(
        {"by": "t.py::good", "check": "HOST-ARCH", "outcome": "passed"},
        {"by": "t.py::broken", "check": "HOST-ARCH", "outcome": "failed"},
        {"by": "t.py::flaky", "check": "HOST-GPU", "outcome": "failed"},  # its self-test failed: no proof
        {"by": "t.py::good", "check": "HOST-GPU", "outcome": "skipped"},  # could not run: no proof
        {"by": "t.py::broken", "check": "HOST-GPU", "outcome": "failed", "verdict": False},  # a crash: no proof
        {"selftest": "t.py::good", "outcome": "passed", "when": "call"},
        {"selftest": "t.py::broken", "outcome": "passed", "when": "call"},
        {"selftest": "t.py::flaky", "outcome": "passed", "when": "call"},
        {"selftest": "t.py::flaky", "outcome": "failed", "when": "teardown"},
    )
    assert proofs(log) == {"HOST-ARCH": {"green": ["t.py::good"], "red": ["t.py::broken"]}}


def test_a_self_test_stopped_after_its_setup_proves_nothing():
    """A long setup is logged for its seconds; the suite runs it started are no proof until the test's call passed."""
    log = _lines({"by": "t.py::stopped", "check": "HOST-ARCH", "outcome": "passed"},
                 {"selftest": "t.py::stopped", "outcome": "passed", "when": "setup", "seconds": 300.0})
    assert proofs(log) == {}


def test_the_table_lists_the_checks_not_proven_both_ways_first():
    text = table({"HOST-ARCH": {"green": ["t.py::good"], "red": ["t.py::broken"]}}, "a log")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows[-1] == "| `HOST-ARCH` | `good` | `broken` |"
    assert "1 of " in text and "`HOST-GPU`" in text.split("not yet:")[1].split("\n")[0]


def test_every_check_not_proven_says_why_under_the_table():
    text = table({"HOST-ARCH": {"green": ["t.py::good"]}, "CONT-EAGER": {}}, "a log")
    why = text.split("Why not yet:")[1]
    assert f"- `CONT-EAGER`: {WHY_NOT_YET['CONT-EAGER']}" in why
    assert "- `HOST-ARCH`: **no reason stated**" in why  # proven green only: it must say why not red


def test_every_reason_names_a_check_that_exists():
    assert set(WHY_NOT_YET) <= set(_registry())


def test_the_reasons_are_those_of_the_checks_the_published_table_has_not_proven():
    """A reason left behind once its check is proven both ways would mislead: PROOFS.md's list and WHY_NOT_YET agree."""
    listed = (ROOT / "docs" / "PROOFS.md").read_text().split("not yet: ")[1].split("\n")[0]
    assert set(re.findall(r"`([A-Z]+-[A-Z0-9-]+)`", listed)) == set(WHY_NOT_YET)
