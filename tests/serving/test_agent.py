"""Tool calling under an agent loop, not one round trip: the model calls a tool, reads its result, calls the next and
answers, on one conversation, with a harness that repairs malformed calls (sparkgate.agent). Two figures per run,
each paired episode by episode with --baseline's: tasks completed, and episodes whose calls all reached the agent
well-formed. The guide names this untested: an agent loop many turns long, malformed calls a harness must repair.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from sparkgate import agent, quality, sanity
from sparkgate.compare import compare_answers, first_answers, paired
from sparkgate.probes import chat_body
from sparkgate.results import Answer

WHY = ("agents run many turns of call, result, call again, answer; an image, a chat template, a tool parser or a "
       "quantization that makes the loop fail more often breaks every agent on the box, in answers that read fine "
       "one at a time")
FIX = ("keep the baseline's image and flags and try the change's parts one at a time (the tool-call parser and the "
       "chat template first); read the lost episodes above, then SERVE-TOOLS-*'s messages for the single call")
TOOLS_CHECK = "SERVE-TOOLS-AUTO"  # diagnoses a call left as text in the content (the parser did not recognise it)
_EPISODES: dict[tuple[str, str, int], list[agent.Episode]] = {}  # one loop per recipe, server and level, two checks


@pytest.fixture
def episodes(server, endpoint, recipe, level, check):
    """The agent tasks of this level, each one episode, run once for both checks (the first to ask runs them; its
    endpoint fails it on a transport error or a non-200)."""
    if not recipe.features.tools:
        check.cannot_run(f"recipe {recipe.name} does not declare tool calling (features.tools: false)",
                         "serve with --enable-auto-tool-choice --tool-call-parser NAME and set features.tools: true "
                         "in the recipe")
    key = (recipe.name, server.base_url, level.agent_tasks)
    if key not in _EPISODES:
        parser = recipe.arg("--tool-call-parser")

        def send(messages):
            # Not through the garbage detector: what a turn says is the loop's outcome here (SERVE-SANITY judges
            # garbage, SERVE-TOOLS-AUTO a call left in the content).
            body = {**chat_body(server.served_name, "", max_tokens=agent.MAX_TOKENS, tools=agent.TOOLS,
                                tool_choice="auto", seed=0), "messages": messages}
            response = endpoint.post(body)
            data = endpoint.json_object(response, "an agent turn")
            choices = data.get("choices")
            check.that(response.status_code == 200 and isinstance(choices, list) and bool(choices)
                       and isinstance(choices[0], dict) and isinstance(choices[0].get("message"), dict),
                       expected="HTTP 200 with a choice for an agent turn",
                       found=f"HTTP {response.status_code}: {response.text[:300]!r}")
            return choices[0]["message"]

        seqs = int(recipe.args.value("--max-num-seqs") or 4)
        with ThreadPoolExecutor(max(1, min(4, seqs))) as pool:
            _EPISODES[key] = list(pool.map(lambda t: agent.run(t, send, parser), agent.tasks(level.agent_tasks)))
    return _EPISODES[key]


def _judge(check, recipe, results, baseline_answers, episodes, outcome, what):
    """Record each episode's outcome, print the figure, and hold it to the baseline's, paired (McNemar)."""
    kept = [Answer(recipe=recipe.name, check=check.id, probe=e.task.id, prompt_digest=quality.digest(e.task.question),
                   right=outcome(e), text=e.describe()[:400]) for e in episodes]
    results.add_answers(kept)
    right = sum(a.right for a in kept)
    print(f"{right}/{len(kept)} {what}")
    if baseline_answers is None:
        check.cannot_run(f"no --baseline to hold it to: {right}/{len(kept)} {what}, recorded in the results file for "
                         "a later --baseline", "give --baseline BEFORE.json (a run of this level before the change)")
    now = {a.probe: a for a in kept}
    before = paired(first_answers(baseline_answers).get((recipe.name, check.id), {}), now)
    if not before:
        check.cannot_run(f"the baseline has no {check.id} episodes to pair with these (an older results file, another "
                         f"level, or the check did not run there): {right}/{len(kept)} {what}",
                         "make the baseline again with this version of the suite at this level")
    had = sum(a.right for a in before.values())
    if had < quality.SMALLEST_LOSS:
        check.cannot_run(f"the baseline has {had} of {len(before)} episodes {what}: even losing all of them would "
                         f"not be significant (McNemar's exact test needs {quality.SMALLEST_LOSS} at p < "
                         f"{quality.ALPHA:g}); now {right}/{len(kept)}",
                         "run a level with more tasks (--level standard), or a model that completes more of them")
    verdict = compare_answers(recipe.name, check.id, before, now)
    print(f"  against the baseline: {verdict.describe()}")
    lost = [e for e in episodes if e.task.id in before and before[e.task.id].right and not now[e.task.id].right]
    why = WHY
    if sum(bool(e.leaked) for e in lost) * 2 >= len(lost) > 0:  # most were lost to calls the server left as text
        why = f"{WHY} {sanity.diagnosed_by(TOOLS_CHECK, 'tool calls left as text in the content')}"
    check.that(not verdict.worse,
               expected=f"no significant loss of episodes {what} against the baseline (McNemar's exact test on the "
                        f"paired episodes, one-sided, p < {quality.ALPHA:g})",
               found=f"{verdict.flips.describe()}; lost: " + "; ".join(e.describe() for e in lost[:4])
                     + (f"; ... {len(lost) - 4} more" if len(lost) > 4 else ""), why=why)


@pytest.mark.check("QUAL-AGENT-TASKS", why=WHY, fix=FIX)
def test_agent_tasks_are_completed_as_often_as_in_the_baseline(check, recipe, results, baseline_answers, episodes):
    """Agent tasks (call a tool, read its result, call the next, answer) MUST, against --baseline, not be completed
    significantly less often than in the baseline's run (McNemar's exact test, paired by task, p < 0.01)."""
    _judge(check, recipe, results, baseline_answers, episodes, lambda e: e.completed,
           "completed (the answer carries the temperature the tools gave)")


@pytest.mark.check("QUAL-AGENT-CALLS", why=WHY, fix=FIX)
def test_agent_calls_reach_the_agent_well_formed_as_often_as_in_the_baseline(check, recipe, results,
                                                                              baseline_answers, episodes):
    """Agent episodes MUST, against --baseline, not fail to call a tool well-formed (no call at all, a call to an
    unknown tool or without its required field, a call left as text in the content) significantly more often than in
    the baseline's run (McNemar's exact test, paired by task, p < 0.01)."""
    _judge(check, recipe, results, baseline_answers, episodes, lambda e: e.calls_clean,
           "with every call in tool_calls[] well-formed")
