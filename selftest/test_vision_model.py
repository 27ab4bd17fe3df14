"""SERVE-VISION on a model that really sees: the embedded language model given a vision tower trained here to say
what an image shows (selftest/seer.py), served by the real CPU engine. It describes both of the suite's own images
(the number 47, the red disc); its twin, the same weights behind another model's image processor (CLIP's
normalisation: the classic wrong processor), sees every pixel shifted and fails exactly SERVE-VISION."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkgate.recipes import load_recipes

from .helpers import cores_apart, failed_checks, made_here_recipe, node_id, run_suites_at_once, serving_at_once
from .seer import WRONG_PROCESSOR, build

NAME = "smollm2-see"
TWINS = {"good": 18050, "wrong-processor": 18051}
CORES = dict(zip(TWINS, cores_apart(len(TWINS)), strict=True))


def _with_wrong_processor(model: Path, tmp: Path) -> Path:
    """The model's folder as another folder, its files linked, but for a processor that normalises as CLIP does."""
    twin = tmp / "wrong-processor"
    twin.mkdir()
    for f in model.iterdir():
        (twin / f.name).symlink_to(f)
    config = json.loads((model / "processor_config.json").read_text())
    config["image_processor"].update(WRONG_PROCESSOR)
    (twin / "processor_config.json").unlink()
    (twin / "processor_config.json").write_text(json.dumps(config))
    return twin


def _weights(data: dict) -> None:
    data["memory"] = {**data["memory"], "weights_gib": 0.7,
                      "basis": "the embedded model and a vision tower, 0.66 GB in float32 on disk; the rest as the "
                               "embedded default's"}


@pytest.fixture(scope="module")
def seers(tmp_path_factory):
    """The model built (once, cached) and its two servers started at once: kind -> (recipes folder, server)."""
    model = build()
    folders = {}
    for kind, port in TWINS.items():
        tmp = tmp_path_factory.mktemp(kind)
        folders[kind] = made_here_recipe(tmp, NAME, model if kind == "good" else _with_wrong_processor(model, tmp),
                                         "vision", port, CORES[kind], _weights)
    with serving_at_once({kind: load_recipes(folder)[NAME] for kind, folder in folders.items()}) as servers:
        yield {kind: (folders[kind], servers[kind]) for kind in TWINS}


@pytest.fixture(scope="module")
def runs(seers, tmp_path_factory):
    """The serving layer's image checks against each twin, both at once."""
    tests = {"good": "test_a_model_that_sees_describes_what_each_image_shows",
             "wrong-processor": "test_behind_the_wrong_image_processor_it_fails_exactly_the_vision_check"}
    return run_suites_at_once({kind: (node_id(__name__, tests[kind]),
                                      ["-m", "serving", f"--recipes-dir={folder}", f"--recipe={NAME}",
                                       f"--base-url={srv.base_url}", "-k", "image"])
                               for kind, (folder, srv) in seers.items()}, tmp_path_factory.mktemp("runs"))


def test_a_model_that_sees_describes_what_each_image_shows(runs):
    """SERVE-VISION MUST pass on both of the suite's images; the text-only check could not run, naming why."""
    result = runs["good"]
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*declares vision; SERVE-VISION checks images*"])


def test_behind_the_wrong_image_processor_it_fails_exactly_the_vision_check(runs):
    """The number MUST be misread, failing SERVE-VISION with what was asked and what came back, and no other check
    fails. (The disc's colour may survive the shift: a wrong processor blurs detail before it loses colour.)"""
    result = runs["wrong-processor"]
    out = result.stdout.str()
    assert failed_checks(out) == ["SERVE-VISION"], out[-4000:]
    result.stdout.fnmatch_lines(["FAILED tests/serving/test_vision.py::test_an_image_with_known_content_is_described_"
                                 "correctly[[]*digits[]]*"])
    assert "expected: 47 in the answer to 'What number is written in this image?" in out, out[-4000:]
