"""No secret leaves the box: secrets planted in a recipe (an env token, the server's --api-key) appear in no terminal
output, HTML report, results file or `recipes show`; and a server started with --api-key is tested with it.

The planted recipe is the embedded default with a token in its env and an API key in its serve args, served for
real by vLLM (which then refuses requests without the key), so the model-server listing of the host facts and
the host layer's competing-server message see the key in a real process's argv.
"""

from __future__ import annotations

import json

import pytest
import yaml

from sparkgate.launch import serving
from sparkgate.recipes import RECIPES_DIR, load_profiles, load_recipes

from .helpers import local_mem_available, run_suite, sparkgate_cli

PORT = 18150
TOKEN, KEY, PASSWORD = "hf_plantedToken0123456789abcdefgh", "planted-api-key-9876", "s3cret-planted-pw"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A recipes folder with the planted recipe, and its server running."""
    d = tmp_path_factory.mktemp("planted") / "recipes"
    d.mkdir()
    data = yaml.safe_load((RECIPES_DIR / "smollm2-cpu.yaml").read_text())
    data["name"], data["port"] = "planted", PORT
    args = data["serve_args"]
    args[args.index("--port") + 1] = str(PORT)
    data["serve_args"] = [*args, "--api-key", KEY]
    data["env"] = {**data.get("env", {}), "HF_TOKEN": TOKEN, "DB_PASSWORD": PASSWORD}
    (d / "planted.yaml").write_text(yaml.safe_dump(data))
    recipe = load_recipes(d)["planted"]
    with serving(recipe, load_profiles()["cpu"], local_mem_available, print, 600) as srv:
        yield d, srv


def no_secret(where: str, text: str) -> None:
    for secret in (TOKEN, KEY, PASSWORD):
        assert secret not in text, f"{secret!r} leaked into {where}"


def test_recipes_show_masks_the_planted_secrets(planted):
    recipes, _ = planted
    out = sparkgate_cli("recipes", "show", "planted", "--recipes-dir", str(recipes))
    no_secret("recipes show", out)
    assert "HF_TOKEN=***" in out and "--api-key ***" in out, out


def test_a_server_with_an_api_key_is_tested_with_it_and_no_output_carries_a_secret(pytester, tmp_path, planted):
    recipes, srv = planted
    report, results = tmp_path / "report.html", tmp_path / "results.json"
    result = run_suite(pytester, "-m", "serving or perf", "--recipe=planted", f"--recipes-dir={recipes}",
                       f"--base-url={srv.base_url}", "-k",
                       "served_name or chat_completion_returns or openai or natural", f"--html={report}",
                       "--self-contained-html", f"--results-json={results}", "-rA", "--level=quick")
    out = result.stdout.str() + result.stderr.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 4 and not outcomes.get("failed") and not outcomes.get("errors"), out[-3000:]
    data = json.loads(results.read_text())
    assert any(KEY[:4] in p or "***" in p for p in data["host"]["model_processes"]), data["host"]
    for where, text in (("the terminal", out), ("the HTML report", report.read_text()),
                        ("the results file", results.read_text())):
        no_secret(where, text)


def test_the_competing_server_message_masks_its_key(pytester, planted):
    recipes, _ = planted
    result = run_suite(pytester, "-m", "host", "--recipe=planted", f"--recipes-dir={recipes}",
                       "-k", "other_model_server")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]HOST-NO-COMPETITOR[]]*", "*--api-key [*][*][*]*"])
    no_secret("the HOST-NO-COMPETITOR message", result.stdout.str())

