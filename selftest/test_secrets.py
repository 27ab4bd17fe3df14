"""No secret leaves the box: secrets planted in a recipe (an env token, the server's --api-key) appear in no terminal
output, HTML report, results file or `recipes show`; and a server started with --api-key is tested with it.

The planted recipe is the embedded default with a token in its env and an API key in its serve args, served for
real by vLLM (which then refuses requests without the key), so the model-server listing of the host facts and
the host layer's competing-server message see the key in a real process's argv. The awkward recipes (a process one
and a docker one, never started) carry secrets holding what breaks quoting, escaping and shells.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from sparkgate.launch import serving
from sparkgate.recipes import RECIPES_DIR, load_profiles, load_recipes

from .helpers import local_mem_available, move_port, run_suite, sparkgate_cli

PORT = 18150
TOKEN, KEY, PASSWORD = "hf_plantedToken0123456789abcdefgh", "planted-api-key-9876", "s3cret-planted-pw"
# Quotes, a backslash, markup, spaces and a command substitution: nothing of them may show, not even a part.
AWKWARD_ENV = {"HF_TOKEN": """Aw1k"Rd9q'Zx4m\\Pt7v &<>" $(Hy6j) `Lc2n`""",
               "DB_PASSWORD": """Pw8s d0 "q'\\ &amp; $(Vn5b)"""}
AWKWARD_KEY = """Kq2w' "Ly5n\\ &<>" $(Mj3p) Hb8c"""


def plant(where: Path, base: str, name: str, env: dict[str, str], key: str, port: int | None = None) -> None:
    """A copy of the shipped recipe `base` in `where`, named `name`, with `env` added, `--api-key key` after its
    serve args and, if given, serving on `port`."""
    where.mkdir(exist_ok=True)
    data = yaml.safe_load((RECIPES_DIR / f"{base}.yaml").read_text())
    data["name"], data["env"] = name, {**data.get("env", {}), **env}
    if port is not None:
        move_port(data, port)
    data["serve_args"] = [*data["serve_args"], "--api-key", key]
    (where / f"{name}.yaml").write_text(yaml.safe_dump(data))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A recipes folder with the planted recipe, and its server running."""
    d = tmp_path_factory.mktemp("planted") / "recipes"
    plant(d, "smollm2-cpu", "planted", {"HF_TOKEN": TOKEN, "DB_PASSWORD": PASSWORD}, KEY, PORT)
    recipe = load_recipes(d)["planted"]
    with serving(recipe, load_profiles()["cpu"], local_mem_available, print, 600) as srv:
        yield d, srv


@pytest.fixture(scope="module")
def awkward(tmp_path_factory):
    """A recipes folder with a process recipe and a docker recipe carrying the awkward secrets (never started)."""
    d = tmp_path_factory.mktemp("awkward") / "recipes"
    plant(d, "smollm2-cpu", "awkward-process", AWKWARD_ENV, AWKWARD_KEY)
    plant(d, "qwen38-27b-nvfp4", "awkward-docker", AWKWARD_ENV, AWKWARD_KEY)
    return d


def no_secret(where: str, text: str) -> None:
    for secret in (TOKEN, KEY, PASSWORD):
        assert secret not in text, f"{secret!r} leaked into {where}"


def test_recipes_show_masks_the_planted_secrets(planted):
    recipes, _ = planted
    out = sparkgate_cli("recipes", "show", "planted", "--recipes-dir", str(recipes))
    no_secret("recipes show", out)
    assert "HF_TOKEN=***" in out and "--api-key ***" in out, out


@pytest.mark.parametrize("name", ["awkward-process", "awkward-docker"])
def test_recipes_show_prints_no_part_of_a_secret_holding_quotes_markup_or_a_command(awkward, name):
    """Every run of four letters or digits of each secret is a part that MUST NOT show; where each was, `***`."""
    out = sparkgate_cli("recipes", "show", name, "--recipes-dir", str(awkward))
    shown = [part for value in (*AWKWARD_ENV.values(), AWKWARD_KEY) for part in re.findall(r"[A-Za-z0-9]{4,}", value)
             if part in out]
    assert not shown, (shown, out)
    assert "HF_TOKEN=***" in out and "DB_PASSWORD=***" in out and "--api-key ***" in out, out


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

