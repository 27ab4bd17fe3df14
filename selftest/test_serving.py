"""The serving layer's negative path: a real engine serving a randomly initialised model answers garbage.

vLLM's `--load-format dummy` gives SmolLM2's architecture random weights: the real engine, the real API
server and the real tokenizer, producing real garbage. The sanity detector and the repro replay must fail on
it, each with its own ID and the detector's finding; the positive path is test_suite.py's full run.
"""

from pathlib import Path

import pytest

from sparkgate.launch import serving
from sparkgate.recipes import load_profiles, load_recipes

from .test_suite import broken_recipe, local_mem_available, run_suite

PORT = 18001  # beside the embedded default's 18000, so both can run


def random_weights(data):
    data["serve_args"][data["serve_args"].index("--port") + 1] = str(PORT)
    data["port"] = PORT
    data["serve_args"] += ["--load-format", "dummy"]


@pytest.fixture(scope="module")
def garbage_server(tmp_path_factory):
    recipes = broken_recipe(tmp_path_factory.mktemp("random-weights"), random_weights)
    recipe = load_recipes(Path(recipes))["smollm2-cpu"]
    with serving(recipe, load_profiles()["cpu"], local_mem_available, print, 600) as srv:
        yield recipes, srv


@pytest.mark.parametrize(("selection", "check_ids"), [
    ("ordinary_prompts", ["SERVE-SANITY"]),
    ("known_answers_get_them", ["SERVE-COHERENCE"]),
    ("repro", ["SERVE-REPRO", "SERVE-REPRO-AGENT"]),
], ids=["sanity", "coherence", "repro-replay"])
def test_a_random_weight_model_fails_the_garbage_checks(pytester, garbage_server, selection, check_ids):
    recipes, srv = garbage_server
    result = run_suite(pytester, "-m", "serving", f"--recipes-dir={recipes}", "--recipe=smollm2-cpu",
                       f"--base-url={srv.base_url}", "-k", selection)
    result.assert_outcomes(failed=len(check_ids))
    for check_id in check_ids:
        result.stdout.fnmatch_lines([f"*[[]{check_id}[]]*", "*found:*degenerate repetition: * repeated *x back to "
                                     "back*", "*fix:*cudagraph_mode*PIECEWISE*"])
