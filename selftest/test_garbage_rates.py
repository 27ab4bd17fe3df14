"""The sanity detector measured on the garbage corpus (selftest/garbage/corpus.jsonl): what real broken models of
the embedded default answered, and real clean text. The matrix docs/GARBAGE.md shows is the detector's own, and its
rates hold.

The corpus is built once (`python -m selftest.garbage.corpus build`: the real vLLM engine, ~20 minutes) and kept in
the repository, so these tests read it in seconds.
"""

from __future__ import annotations

import json

import pytest

from sparkgate import sanity

from .garbage.corpus import CORPUS, matrix, matrix_markdown
from .helpers import ROOT

ROWS = matrix()
# The least share of its (non-empty) answers the detector flags, per kind of broken model: the rates measured
# (docs/GARBAGE.md: 88%, 100%, 76%) less about two answers in sixty, so that a change that loses real detections
# fails here.
MIN_DETECTED = {"perturbed": 0.85, "random": 0.98, "misconfigured": 0.72}


def rate_of(kind: str) -> float:
    rows = [r for r in ROWS if r["kind"] == kind]
    return sum(r["flagged"] for r in rows) / sum(r["n"] - r["empty"] for r in rows)


def test_the_detection_matrix_in_the_docs_is_the_detectors_own():
    table = matrix_markdown(ROWS)
    assert table in (ROOT / "docs" / "GARBAGE.md").read_text(), (
        "docs/GARBAGE.md is stale: paste the table `python -m selftest.garbage.corpus matrix` prints\n" + table)


@pytest.mark.parametrize("kind", sorted(MIN_DETECTED))
def test_each_kind_of_broken_model_is_caught_at_its_measured_rate(kind):
    assert rate_of(kind) >= MIN_DETECTED[kind], [r for r in ROWS if r["kind"] == kind]


def test_no_human_text_is_flagged():
    assert rate_of("human") == 0, [r for r in ROWS if r["kind"] == "human"]


def test_the_real_models_answers_are_never_salad_and_only_its_own_loops_are_flagged():
    """The 135M model, unbroken, loops on a few prompts when greedy: those are degenerate repetition, rightly
    flagged; nothing else in its answers is."""
    answers = [json.loads(line) for line in CORPUS.read_text().splitlines()]
    kinds = {f.kind for r in answers if r["kind"] == "clean" for f in sanity.scan(r["text"], r["prompt"])}
    assert kinds <= {"repetition"}, kinds
