"""QUAL-ANSWERS and the quality gate, both ways: the probes' own judges, the paired statistics against scipy's, and on
the real engine a second run of the same model (green), and the same model with its weights damaged until it answers
the probes wrongly in answers the garbage detector passes (red: the recipe's floor, the baseline gate, `sparkgate
compare`).

The damaged model is the garbage corpus's mechanism (Gaussian noise, a share of each weight matrix's own standard
deviation). The damage at which the gate turns red against the damage at which the detector does, at the standard
level, is measured apart (python -m selftest.quality_gate, README).
"""

from __future__ import annotations

import json
import math
import random
import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate import agent, embedded, quality
from sparkgate.compare import compare, report
from sparkgate.launch import serving
from sparkgate.proc import cache_dir
from sparkgate.recipes import load_profiles, load_recipes
from sparkgate.results import load

from .garbage.corpus import perturbed
from .helpers import (
    bind_to_core,
    broken_recipe,
    cores_apart,
    failed_checks,
    local_mem_available,
    move_port,
    node_id,
    run_suite,
    run_suites_at_once,
)

# Noise at a tenth of each matrix's std: 17 of the quick level's 27 probes right before, 5 after, none of the 27
# answers garbage to the detector (it flags some answers to other prompts: selftest/quality_gate.py measures how many).
DAMAGE = 0.1
DAMAGED_PORT = 18062
CHECKS = "probes_are_answered"  # QUAL-ANSWERS
AGENT = "test_agent"  # QUAL-AGENT-TASKS, QUAL-AGENT-CALLS (tests/serving/test_agent.py)


# ---- the probes and the statistics, without a server -------------------------------------------------------

def test_every_probe_accepts_its_own_expected_answer_and_refuses_another():
    probes = quality.probe_set()
    assert len({p.id for p in probes}) == len(probes) >= 300
    for p in probes:
        assert p.right(p.expected), p
        assert p.right(f"Sure! The answer is: {p.expected}."), p
        assert not p.right("I do not know."), p
        assert not p.right("Sorry, that is something I cannot say."), p


def test_each_level_asks_a_prefix_of_one_fixed_order_spread_over_every_family():
    """A larger level only adds probes, so a quick run's answers are a standard run's first answers."""
    whole = quality.probe_set()
    assert [p.id for p in quality.probe_set(27)] == [p.id for p in whole[:27]]
    assert {p.family for p in quality.probe_set(27)} == {p.family for p in whole}
    assert [p.prompt for p in quality.probe_set()] == [p.prompt for p in whole]  # seeded: the same every call


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=60))
def test_the_flip_test_is_mcnemars_exact_test_as_scipy_computes_it(pairs):
    from scipy.stats import binomtest

    before = {f"p{i}": b for i, (b, _) in enumerate(pairs)}
    after = {f"p{i}": a for i, (_, a) in enumerate(pairs)}
    f = quality.flips(before, after)
    n = f.worse + f.better
    expected = binomtest(f.worse, n, 0.5, alternative="greater").pvalue if n else 1.0
    assert math.isclose(f.p_value, expected, rel_tol=1e-9), (f, expected)
    assert f.worse == sum(b and not a for b, a in pairs) and f.better == sum(a and not b for b, a in pairs)


def test_seven_flips_one_way_and_none_back_are_worse_and_six_are_not():
    """The level sizes rest on it (sparkgate.levels): 7 right-to-wrong flips alone are significant at p < 0.01."""
    def verdict(worse):
        return quality.flips({f"p{i}": True for i in range(20)},
                             {f"p{i}": i >= worse for i in range(20)}).significantly_worse
    assert verdict(7) and not verdict(6)



def _scripted(*turns):
    """A send() that answers each turn with the next message, as a server's first choice would."""
    it = iter(turns)
    return lambda messages: {"message": next(it), "finish_reason": "stop"}


def _call(name, arguments):
    return {"content": None, "tool_calls": [{"id": f"c-{name}", "type": "function",
                                             "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def test_an_agent_episode_is_completed_only_through_both_tools_and_its_calls_clean_only_when_every_call_was():
    task = agent.tasks(1)[0]
    done = agent.run(task, _scripted(_call("get_capital", {"country": task.country}),
                                     _call("get_temperature", {"city": task.city}),
                                     {"content": f"It is {task.temperature} °C."}), None)
    assert done.completed and done.calls_clean and done.turns == 3
    repaired = agent.run(task, _scripted(_call("get_weather", {"city": task.city}),
                                         _call("get_temperature", {"town": task.city}),
                                         _call("get_temperature", {"city": task.city}),
                                         {"content": f"{task.temperature} °C"}), "hermes")
    assert repaired.completed and not repaired.calls_clean and len(repaired.malformed) == 2
    guessed = agent.run(task, _scripted(_call("get_temperature", {"city": task.country}),
                                        {"content": f"It is {task.temperature + 1} °C."}), None)
    assert not guessed.completed and guessed.calls_clean  # well-formed, wrong: the task's figure, not the calls'
    leaked = agent.run(task, _scripted({"content": '<tool_call>\n{"name": "get_capital"}\n</tool_call>'}), None)
    assert leaked.leaked and not leaked.calls_clean and not leaked.completed
    prose = agent.run(task, _scripted({"content": "I think it is mild."}), None)
    assert not prose.calls_clean and not prose.completed  # no call at all is not a clean loop
    inside = agent.run(task, _scripted({"content": f"About {task.temperature}0 people live there."}), None)
    assert not inside.completed  # the temperature as a whole number, not inside another
    endless = agent.run(task, lambda messages: {"message": _call("get_capital", {"country": task.country})}, None)
    assert endless.turns == agent.MAX_TURNS and not endless.completed and endless.out_of_turns
    assert "no answer in 5 turns" in endless.describe() and "answered 'It is" in done.describe()

def _steps(tokens, rng):
    out = []
    for t in tokens:
        top = sorted([(t, -0.1)] + [(f"alt{j}", -rng.uniform(2, 9)) for j in range(4)], key=lambda x: -x[1])
        out.append((t, -0.1, top))
    return out


def test_identical_answers_have_not_moved_and_a_changed_one_shows_where_it_parted():
    rng = random.Random(1)
    a = {"p": _steps(["The", " answer", " is", " 5"], rng)}
    same = quality.movement(a, a)
    assert (same.identical, same.first_divergence, same.top1_agreement, same.mean_kl) == (1, None, 1.0, 0.0)
    b = {"p": a["p"][:2] + _steps([" was", " 6"], rng)}
    moved = quality.movement(a, b)
    assert moved.identical == 0 and moved.first_divergence == 2
    # The common prefix agrees; where they part, each run's own greedy choice leads its distribution.
    assert moved.top1_agreement == pytest.approx(2 / 3)
    shifted = {"p": [(t, lp, [(x, v - (3 if x == t else 0)) for x, v in top]) for t, lp, top in a["p"]]}
    assert quality.movement(a, shifted).mean_kl > 0.5 and quality.movement(a, shifted).top1_agreement < 1


TOPS = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]),
                          st.floats(min_value=-9999, max_value=0) | st.sampled_from([-9999.0, 0.0, -50.0])),
                min_size=1, max_size=5)


@settings(max_examples=500, deadline=None)
@given(p=TOPS, q=TOPS)
def test_how_far_a_distribution_moved_is_a_finite_figure_whatever_its_log_probabilities(p, q):
    """A broken model's -inf (vLLM sends -9999) on one side and not the other must not raise (it once did)."""
    kl = quality._kl(p, q)
    assert math.isfinite(kl) and kl >= 0
    assert quality._kl(p, p) == pytest.approx(0, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_the_json_judge_reads_any_text_without_raising(text):
    probe = next(p for p in quality.probe_set() if p.family == "extraction")
    assert probe.right(text) in (True, False)
    assert probe.right(text + " " + probe.expected)


JSON = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                        st.sampled_from(["logprobs", "content", "token", "logprob", "top_logprobs", "x"]), inner,
                        max_size=4), max_leaves=20)


@settings(max_examples=500, deadline=None)
@given(choice=st.dictionaries(st.sampled_from(["logprobs", "message"]), JSON, max_size=2))
def test_any_logprobs_a_server_returns_are_read_without_raising_and_kept_only_when_well_formed(choice):
    for text, logprob, top in quality.steps_of(choice):
        assert isinstance(text, str) and -9999 <= logprob <= 0 and len(top) <= quality.TOP_K
        assert all(isinstance(t, str) and -9999 <= v <= 0 for t, v in top)


def test_a_results_file_of_schema_2_still_reads_and_has_no_answers(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema_version": 2, "suite": {"version": "0.1", "commit": "x"},
                               "started": "2026-12-01T00:00:00+00:00"}))
    assert load(old).answers == []


# ---- on the real engine -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """The embedded model with DAMAGE noise in every weight matrix, served on a port of its own: (recipes folder with
    the floor, recipes folder without it, server)."""
    tmp = tmp_path_factory.mktemp("damaged")

    def change(data):
        move_port(data, DAMAGED_PORT)
        # Off the embedded engine's core (on two cores): the runs below go two at a time, one on each engine.
        bind_to_core(data, cores_apart(2)[1])
        perturbed(lambda name: True, DAMAGE)(embedded.prepare("embedded:smollm2", cache_dir()), tmp / "weights")
        data["model"] = {**data["model"], "id": str(tmp / "weights"), "source": None}
    with_floor = broken_recipe(tmp, change)
    data = (tmp / "recipes" / "smollm2-cpu.yaml").read_text()
    floorless = tmp / "floorless"
    floorless.mkdir()
    plain = yaml.safe_load(data)
    plain.pop("quality")
    (floorless / "smollm2-cpu.yaml").write_text(yaml.safe_dump(plain))
    recipe = load_recipes(tmp / "recipes")["smollm2-cpu"]
    with serving(recipe, load_profiles()["cpu"], local_mem_available, print, 600) as srv:
        yield with_floor, str(floorless), srv


@pytest.fixture(scope="module")
def runs(embedded_server, gateway, damaged, tmp_path_factory):
    """before: the good engine (its floor), probes and agent episodes; again: the same engine gated on before; worse:
    the damaged one, without a floor, gated on before; below: the damaged one held to the recipe's floor, no baseline;
    agent: the good engine's agent episodes behind a gateway that trims each conversation to its last message, gated on
    before; leaks:
    its agent episodes and single tool calls behind a gateway that turns every call into text, gated on before. Two to
    four at a time (greedy answers on the CPU engine do not depend on what shares their batch: README). name -> (file,
    run)."""
    d = tmp_path_factory.mktemp("quality")
    with_floor, floorless, srv = damaged

    def run(name, url, proves, *args, checks=CHECKS):
        return name, (node_id(__name__, proves),
                      ["-s", "-m", "serving", "-k", checks, "--level=quick", "--recipe=smollm2-cpu",
                       f"--base-url={url}", f"--results-json={d / name}.json", *args])
    gate = f"--baseline={d / 'before.json'}"
    good = "test_the_good_engine_meets_the_recipes_floor_and_a_second_run_passes_its_gate"
    both = f"{CHECKS} or {AGENT}"
    out = run_suites_at_once(dict([
        run("before", embedded_server.base_url, good, checks=both),
        run("below", srv.base_url, "test_damaged_weights_fail_the_recipes_floor_without_a_baseline",
            f"--recipes-dir={with_floor}")]), d)
    out |= run_suites_at_once(dict([
        run("again", embedded_server.base_url, good, gate, checks=both),
        run("worse", srv.base_url, "test_damaged_weights_that_answer_wrongly_in_clean_text_fail_the_quality_gate_with_"
            "its_own_message", gate, f"--recipes-dir={floorless}"),
        run("agent", f"{gateway}/last-only", "test_a_gateway_that_trims_the_conversation_fails_the_agent_calls_check_"
            "with_its_own_message", gate, checks=AGENT),
        run("leaks", f"{gateway}/calls-as-text", "test_calls_left_as_text_fail_the_agent_calls_check_pointing_at_the_"
            "tool_checks", gate, checks=f"{AGENT} or tool_choice_auto")]), d)
    return {name: (d / f"{name}.json", result) for name, result in out.items()}


def test_the_good_engine_meets_the_recipes_floor_and_a_second_run_passes_its_gate(runs):
    for name in ("before", "again"):
        _, result = runs[name]
        assert result.ret == 0, result.stdout.str()[-4000:]
    out = runs["again"][1].stdout.str()
    assert "against the baseline: smollm2-cpu [QUAL-ANSWERS] " in out, out[-4000:]
    assert "the engine's own rerun of " in out
    assert re.search(r"against the baseline: smollm2-cpu \[QUAL-AGENT-CALLS\] (\d+)/16 right before", out), out[-4000:]
    # The embedded model completes a few of its 16 agent tasks: too few for a loss to be significant, and it says so.
    assert re.search(r"\[QUAL-AGENT-TASKS\] could not run: the baseline has \d of 16 episodes completed .*: even "
                     r"losing all of them would not be significant", out), out[-4000:]


def test_a_gateway_that_trims_the_conversation_fails_the_agent_calls_check_with_its_own_message(runs):
    """Behind a gateway that forwards only a conversation's last message, the model never sees the agent's
    instructions and answers in clean prose without a call: the episodes whose calls all reached tool_calls[]
    well-formed fall from most of the 16 to few, which McNemar's test calls worse, and no other check diagnoses it."""
    out = runs["agent"][1].stdout.str()
    assert failed_checks(out) == ["QUAL-AGENT-CALLS"], out[-6000:]
    assert "expected: no significant loss of episodes with every call in tool_calls[] well-formed against the " \
           "baseline (McNemar's exact test" in out, out[-4000:]
    assert re.search(r"found:    \d+/16 right before, \d+/16 after: \d+ went from right to wrong, \d+ from wrong to "
                     r"right .*; lost: agent-\d+ [\w ]+ \(\d+ °C\): answered .*?; calls: none", out), out[-4000:]
    assert "the same defect as" not in out  # its own: clean prose, no call


def test_damaged_weights_that_answer_wrongly_in_clean_text_fail_the_quality_gate_with_its_own_message(runs):
    out = runs["worse"][1].stdout.str()
    assert failed_checks(out) == ["QUAL-ANSWERS"], out[-6000:]
    assert "expected: no significant loss of right answers against the baseline (McNemar's exact test" in out
    assert re.search(r"found:    \d+/27 right before, \d+/27 after: \d+ went from right to wrong", out), out[-4000:]
    assert "right to wrong: " in out and "the same defect as SERVE-SANITY's" not in out


def test_calls_left_as_text_fail_the_agent_calls_check_pointing_at_the_tool_checks(runs):
    """One defect, one failure: behind a server whose tool parser does not match the model's format, every call stays
    in the content. SERVE-TOOLS-AUTO fails on it; QUAL-AGENT-CALLS, which loses its episodes to it, points there."""
    out = runs["leaks"][1].stdout.str()
    assert failed_checks(out) == ["QUAL-AGENT-CALLS", "SERVE-TOOLS-AUTO"], out[-6000:]
    assert re.search(r"found:    \d+/16 right before, 0/16 after: \d+ went from right to wrong, 0 from wrong to "
                     r"right .*; lost: agent-\d+ [\w ]+ \(\d+ °C\): leaked call '<tool_call>", out), out[-4000:]
    assert "(the same defect as SERVE-TOOLS-AUTO's, which diagnoses tool calls left as text in the content" in out
    # SERVE-TOOLS-AUTO's own message (up to the next check's or the summary), on its own cause.
    tools = re.search(r"^\[SERVE-TOOLS-AUTO\] .*?(?=^\[(?:SERVE|QUAL)-|^_{3,}|^=+ |\Z)", out, re.M | re.S).group()
    assert "found:    no tool call at all; content '<tool_call>" in tools and "the same defect as" not in tools, tools


def test_damaged_weights_fail_the_recipes_floor_without_a_baseline(runs):
    out = runs["below"][1].stdout.str()
    assert failed_checks(out) == ["QUAL-ANSWERS"], out[-6000:]
    assert re.search(r"expected: >= \d+% of the 27 probes right \(", out) and "wrong: " in out, out[-4000:]


def test_compare_says_whether_answers_got_worse_with_a_p_value(runs):
    base, again, worse, agent = (load(runs[n][0]) for n in ("before", "again", "worse", "agent"))
    same, damaged = compare(base, again), compare(base, worse)
    assert not same.worse_answers and [a.check for a in damaged.worse_answers] == ["QUAL-ANSWERS"], \
        (report(same), report(damaged))
    assert [a.check for a in compare(base, agent).worse_answers] == ["QUAL-AGENT-CALLS"], report(compare(base, agent))
    text = report(damaged)
    assert "answers worse: smollm2-cpu [QUAL-ANSWERS] " in text and "p=" in text and "the baseline's own rerun" in text
    assert "answers (quality probes and agent episodes, paired):" in report(same)
    assert "smollm2-cpu [QUAL-AGENT-CALLS] " in report(same)


def test_a_recipe_without_a_floor_and_a_run_without_a_baseline_could_not_run_and_say_how(runs, embedded_server,
                                                                                       damaged, pytester, tmp_path):
    result = run_suite(pytester, "-m", "serving", "-k", "probes_are_answered", "--level=quick",
                       "--recipe=smollm2-cpu", f"--base-url={embedded_server.base_url}", f"--recipes-dir={damaged[1]}")
    out = result.stdout.str()
    assert result.ret == 5 or "1 skipped" in out, out[-3000:]
    assert "[QUAL-ANSWERS] could not run: recipe smollm2-cpu states no quality floor and no --baseline" in out
