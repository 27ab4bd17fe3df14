"""The reasoning checks on a model that really reasons: the embedded model taught here to think in <think> tags
(selftest/thinker.py), served by the real CPU engine with vLLM's qwen3 reasoning parser. It passes SERVE-REASONING
and SERVE-THINKING-OFF; two twins, each served wrong in one way, fail exactly the check that guards against it:
without the reasoning parser the thinking reaches the answer, and behind a template that ignores enable_thinking it
thinks when told not to.

The same model was taught the agent loop's harness (on countries the tasks never ask about), so it completes enough
agent tasks for QUAL-AGENT-TASKS to judge a loss: gated on its own run it passes both agent checks, and behind
a gateway that empties the tool results (the model calls, cleanly, and never reads what came back) it fails exactly
QUAL-AGENT-TASKS."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkgate import levels, quality
from sparkgate.recipes import load_recipes
from sparkgate.results import Results

from .helpers import (
    broken_gateway_at,
    cores_apart,
    failed_checks,
    made_here_recipe,
    node_id,
    run_suites_at_once,
    serving_at_once,
)
from .thinker import TEMPLATE_ALWAYS_THINKS, build

NAME = "smollm2-think"
TWINS = {"good": 18040, "no-parser": 18041, "always-thinks": 18042}
CORES = dict(zip(TWINS, cores_apart(len(TWINS)), strict=True))  # the twins' runs go at once: spread the engines
SELECTION = "reasoning or thinking"
AGENT = "test_agent"  # QUAL-AGENT-TASKS, QUAL-AGENT-CALLS
TASKS = levels.QUICK_AGENT_TASKS  # the agent tasks a quick run asks
TWIN_GATEWAY_PORT = 18043  # selftest/broken_gateway.py in front of the good twin


def _recipe(kind: str, model: Path, tmp: Path) -> Path:
    def change(data: dict) -> None:
        if kind != "no-parser":
            data["serve_args"] += ["--reasoning-parser", "qwen3"]
        if kind == "always-thinks":
            (tmp / "always-thinks.jinja").write_text(TEMPLATE_ALWAYS_THINKS)
            data["serve_args"] += ["--chat-template", str(tmp / "always-thinks.jinja")]

    return made_here_recipe(tmp, NAME, model, "reasoning", TWINS[kind], CORES[kind], change)


@pytest.fixture(scope="module")
def thinkers(tmp_path_factory):
    """The model built (once, cached) and its three servers started at once: kind -> (recipes folder, server)."""
    model = build()
    folders = {kind: _recipe(kind, model, tmp_path_factory.mktemp(kind)) for kind in TWINS}
    with serving_at_once({kind: load_recipes(folder)[NAME] for kind, folder in folders.items()}) as servers:
        yield {kind: (folders[kind], servers[kind]) for kind in TWINS}


def _args(thinkers, kind, *args, selection=SELECTION, base_url=None) -> list[str]:
    folder, srv = thinkers[kind]
    return ["-m", "serving", "--level=quick", f"--recipes-dir={folder}", f"--recipe={NAME}",
            f"--base-url={base_url or srv.base_url}", "-k", selection, *args]


GOOD = "test_a_model_that_reasons_passes_both_reasoning_checks_and_the_results_name_the_field"
NO_PARSER = "test_served_without_its_reasoning_parser_the_thinking_reaches_the_answer_and_the_reasoning_check_says_so"
ALWAYS = "test_behind_a_template_that_ignores_the_switch_it_thinks_anyway_and_fails_exactly_the_thinking_off_check"
GATED = "test_gated_on_a_baseline_the_reasoning_check_fails_exactly_when_the_field_moved"
AGAIN = "test_gated_on_its_own_run_a_model_that_completes_agent_tasks_passes_both_agent_checks"
LOST = "test_behind_a_gateway_that_empties_the_tool_results_it_fails_exactly_the_agent_tasks_check"
FIELDS = ["reasoning", "reasoning_content"]


@pytest.fixture(scope="module")
def runs(thinkers, tmp_path_factory):
    """The reasoning checks against each twin at once (they count tokens and read fields, never time), and the agent
    episodes on the good one; then, at once, the good one again against two baselines (the good run's own results,
    with the field the thinking came in kept (reasoning) or moved (reasoning_content)), and its agent episodes gated
    on the good run's, straight and behind the gateway. name -> the run; "results": the good run's results file."""
    d = tmp_path_factory.mktemp("reasoning-runs")
    results = d / "results.json"
    good = _args(thinkers, "good", f"--results-json={results}", selection=f"{SELECTION} or {AGENT}")
    out = run_suites_at_once({"good": (node_id(__name__, GOOD), good),
                              "no-parser": (node_id(__name__, NO_PARSER), _args(thinkers, "no-parser")),
                              "always-thinks": (node_id(__name__, ALWAYS), _args(thinkers, "always-thinks"))}, d)
    def baseline(name, checks, field=None):
        """The good run's results holding only what a gated run measures (`checks`), as its own run would; `field`:
        the reasoning field its server is recorded to have used instead."""
        data = json.loads(results.read_text())
        if field:
            data["recipes"][0]["server"]["reasoning_field"] = field
        for key, by in (("checks", "id"), ("measurements", "check"), ("answers", "check")):
            data[key] = [x for x in data.get(key, []) if x[by] in checks]
        (d / f"base-{name}.json").write_text(json.dumps(data))
        return d / f"base-{name}.json"

    gated = {}
    for field in FIELDS:
        baseline(field, {"SERVE-REASONING"}, field)
        gated[field] = (node_id(__name__, f"{GATED}[{field}]"), _args(thinkers, "good", "-k", "thinking_lands",
                                                           f"--baseline={d / f'base-{field}.json'}"))
    agent_base = baseline("agent", {"QUAL-AGENT-TASKS", "QUAL-AGENT-CALLS"})
    gated["again"] = (node_id(__name__, AGAIN), _args(thinkers, "good", f"--baseline={agent_base}", selection=AGENT))
    with broken_gateway_at(TWIN_GATEWAY_PORT, thinkers["good"][1].base_url) as gateway:
        gated["lost"] = (node_id(__name__, LOST), _args(thinkers, "good", f"--baseline={agent_base}", selection=AGENT,
                                                        base_url=f"{gateway}/empty-tool-results"))
        return out | run_suites_at_once(gated, d) | {"results": results}


def test_a_model_that_reasons_passes_both_reasoning_checks_and_the_results_name_the_field(runs):
    result = runs["good"]
    out = result.stdout.str()
    assert failed_checks(out) == [] and result.parseoutcomes()["passed"] == 2, out[-4000:]
    result.stdout.fnmatch_lines(["SKIPPED*[[]QUAL-AGENT-TASKS[]] could not run: no --baseline to hold it to*",
                                 "SKIPPED*[[]QUAL-AGENT-CALLS[]] could not run: no --baseline to hold it to*"])
    result.stdout.fnmatch_lines(["*reasoning field: reasoning (* chars); content *",
                                 "*completion tokens: thinking on *, off *"])
    [run] = Results.model_validate_json(runs["results"].read_text()).recipes
    assert run.server["reasoning_field"] == "reasoning", run.server


@pytest.mark.parametrize("field", FIELDS)
def test_gated_on_a_baseline_the_reasoning_check_fails_exactly_when_the_field_moved(runs, field):
    """Against a baseline whose server sent the thinking where this one does, the good server passes; against one
    whose server sent it in `reasoning_content` (vLLM builds before the rename) it MUST fail, naming both fields."""
    result = runs[field]
    out = result.stdout.str()
    assert failed_checks(out) == ([] if field == "reasoning" else ["SERVE-REASONING"]), out[-4000:]
    assert (result.ret == 0) == (field == "reasoning"), out[-4000:]
    assert "did not measure" not in out, out[-4000:]
    assert result.parseoutcomes().get("passed", 0) == (field == "reasoning"), out[-4000:]
    if field == "reasoning_content":
        result.stdout.fnmatch_lines(["*expected: the thinking in `reasoning_content`, where the baseline's server "
                                     "sent it (*base-reasoning_content.json)*",
                                     "*found:    the thinking in `reasoning`: a client that reads `reasoning_content` "
                                     "finds none*"])


def test_served_without_its_reasoning_parser_the_thinking_reaches_the_answer_and_the_reasoning_check_says_so(runs):
    """SERVE-REASONING MUST fail with its own verdict; SERVE-THINKING-OFF, whose thinking-on answer carries the same
    leak, fails pointing at it (one defect, one diagnosis)."""
    result = runs["no-parser"]
    assert failed_checks(result.stdout.str()) == ["SERVE-REASONING", "SERVE-THINKING-OFF"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(["*found:    reasoning field absent (0 chars), content '<think>*",
                                 "*found:    thinking in the content (a literal <think> at char 0) while no reasoning "
                                 "field carries any*",
                                 "*the same defect as SERVE-REASONING's, which diagnoses thinking left in the answer*"])


def test_behind_a_template_that_ignores_the_switch_it_thinks_anyway_and_fails_exactly_the_thinking_off_check(runs):
    result = runs["always-thinks"]
    assert failed_checks(result.stdout.str()) == ["SERVE-THINKING-OFF"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(["*found:    * completion tokens, reasoning *(* chars), content *"])


def _completed(results: Path) -> int:
    data = Results.model_validate_json(results.read_text())
    return sum(a.right for a in data.answers if a.check == "QUAL-AGENT-TASKS")


def test_gated_on_its_own_run_a_model_that_completes_agent_tasks_passes_both_agent_checks(runs):
    """The good run's episodes (enough completed for a loss to be significant) against a second run of the same
    server: both agent checks MUST run and pass."""
    assert _completed(runs["results"]) >= quality.SMALLEST_LOSS, runs["good"].stdout.str()[-4000:]
    result = runs["again"]
    out = result.stdout.str()
    assert failed_checks(out) == [] and result.parseoutcomes()["passed"] == 2, out[-4000:]
    result.stdout.fnmatch_lines([f"*against the baseline: {NAME} [[]QUAL-AGENT-TASKS[]] */{TASKS} right before*"])


def test_behind_a_gateway_that_empties_the_tool_results_it_fails_exactly_the_agent_tasks_check(runs):
    """The model still calls each tool well-formed (QUAL-AGENT-CALLS passes) but never reads a result, so no answer
    carries the temperature: QUAL-AGENT-TASKS MUST fail with its own message (no other check diagnoses it)."""
    result = runs["lost"]
    out = result.stdout.str()
    assert failed_checks(out) == ["QUAL-AGENT-TASKS"], out[-6000:]
    assert result.parseoutcomes()["passed"] == 1, out[-4000:]
    assert "expected: no significant loss of episodes completed (the answer carries the temperature the tools gave) " \
           "against the baseline (McNemar's exact test" in out, out[-4000:]
    assert re.search(rf"found:    \d+/{TASKS} right before, \d+/{TASKS} after: \d+ went from right to wrong", out), \
        out[-4000:]
    assert "the same defect as" not in out, out[-4000:]  # its own message: no other check diagnoses it
