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

from .garbage.corpus import CORPUS, guard_flags, guard_markdown, matrix, matrix_markdown
from .helpers import ROOT

ROWS = matrix()
# The least share of its (non-empty) answers the detector flags, per kind of broken model: the rates measured
# (docs/GARBAGE.md) less about two answers in sixty, so that a change that loses real detections fails here.
MIN_DETECTED = {"perturbed": 0.87, "random": 0.98, "misconfigured": 0.89, "numerics": 0.97, "written": 0.9}
# The sign each kind of written garbage (selftest/garbage/written.py) is caught by; the salad of function words drawn
# as often as content words is the one it misses (docs/GARBAGE.md says so).
WRITTEN_SIGNS = {"written: punctuation noise": {"punctuation"}, "written: BPE markers": {"bpe-marker"},
                 "written: word salad": {"salad", "word-salad"}, "written: script not asked for": {"script"}}
WRITTEN_MISSED = ("the of river and to a cloud",)
# The real engine's new kinds of broken model, and the sign that catches each.
REAL_SIGNS = {"nan-logits": "punctuation", "no-decoder": "bpe-marker", "sentencepiece-decoder": "bpe-marker"}
ANSWERS = [json.loads(line) for line in CORPUS.read_text().splitlines()]


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
    kinds = {f.kind for r in ANSWERS if r["kind"] == "clean" for f in sanity.scan(r["text"], r["prompt"])}
    assert kinds <= {"repetition"}, kinds


@pytest.mark.parametrize("variant", sorted(WRITTEN_SIGNS))
def test_each_kind_of_written_garbage_is_caught_by_its_own_sign(variant):
    for r in (r for r in ANSWERS if r["variant"] == variant and not r["text"].startswith(WRITTEN_MISSED)):
        kinds = {f.kind for f in sanity.scan(r["text"], r["prompt"])}
        assert kinds & WRITTEN_SIGNS[variant], (r, kinds)


@pytest.mark.parametrize("variant", sorted(REAL_SIGNS))
def test_each_new_kind_of_broken_engine_is_caught_on_every_answer_by_its_own_sign(variant):
    """What the real engine answered broken each new way (a NaN model, a detokenizer that does not run) is flagged on
    every answer, and by the sign made for it wherever the answer shows that sign's defect at all (without a decoder,
    the model's own loop of zeros holds no marker: it is a loop)."""
    answers = [r for r in ANSWERS if r["variant"] == variant and r["text"].strip()]
    assert answers, f"the corpus holds no answer of {variant}: python -m selftest.garbage.corpus build --only {variant}"
    kinds = [{f.kind for f in sanity.scan(r["text"], r["prompt"])} for r in answers]
    assert all(kinds), [r for r, k in zip(answers, kinds, strict=True) if not k][:3]
    shows = [k for r, k in zip(answers, kinds, strict=True) if set(r["text"]) & set(sanity.MARKERS + "!")]
    assert shows and all(REAL_SIGNS[variant] in k for k in shows), kinds


GUARD = guard_flags()


def test_the_guards_false_positive_rate_in_the_docs_is_its_own():
    table = guard_markdown(GUARD)
    assert table in (ROOT / "docs" / "GARBAGE.md").read_text(), (
        "docs/GARBAGE.md is stale: paste the guard's table `python -m selftest.garbage.corpus matrix` prints\n" + table)


def test_the_guard_stores_no_clean_text_but_the_real_models_own_loops():
    """The guard judges real traffic: every clean answer it stores becomes a red replay. It stores none of the human
    and written text, and of the real model's answers only those the detector rightly calls loops."""
    assert all(flagged == 0 for variant, (_, flagged, _) in GUARD.items() if variant.startswith("human")), GUARD
    loops = next(r["flagged"] for r in ROWS if r["variant"] == "real-model")
    assert GUARD["clean | real-model"][1] == loops, GUARD
