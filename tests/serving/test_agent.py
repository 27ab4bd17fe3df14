"""Tool calling under an agent loop, not one round trip: the model calls a tool, reads its result, calls the next and
answers, on one conversation, with a harness that repairs malformed calls (sparkgate.agent). Two figures per run,
each paired episode by episode with --baseline's: tasks completed, and episodes whose calls all reached the agent
well-formed. The guide names this untested: an agent loop many turns long, malformed calls a harness must repair.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from _pytest.outcomes import Failed

from sparkgate import agent, quality, sanity
from sparkgate.compare import compare_answers, first_answers, paired
from sparkgate.probes import chat_body
from sparkgate.results import Answer

WHY = ("agents run many turns of call, result, call again, answer; an image, a chat template, a tool parser or a "
       "quantization that makes the loop fail more often breaks every agent on the box, in answers that read fine "
       "one at a time")
FIX = ("keep the baseline's image and flags and try the change's parts one at a time (the tool-call parser and the "
       "chat template first); read the lost episodes above, then SERVE-TOOLS-*'s messages for the single call")
TOOLS_CHECK = "SERVE-TOOLS-AUTO"  # diagnoses a server that refuses tool_choice=auto or leaves a call in the content
CALLS_CHECK = "QUAL-AGENT-CALLS"
# recipe, server, level -> the episodes, or the ID of the check whose run of them failed (one loop for both checks)
_EPISODES: dict[tuple[str, str, int], list[agent.Episode] | str] = {}


@pytest.fixture
def episodes(server, endpoint, recipe, level, check):
    """episodes() -> this level's agent tasks, one episode each, run once for both checks: the first to ask runs them
    (a transport error or a non-200 fails it); the other then could not run, pointing at it."""
    if not recipe.features.tools:
        check.cannot_run(f"recipe {recipe.name} does not declare tool calling (features.tools: false)",
                         "serve with --enable-auto-tool-choice --tool-call-parser NAME and set features.tools: true "
                         "in the recipe")
    key = (recipe.name, server.base_url, level.agent_tasks)
    refused = f"{WHY} {sanity.diagnosed_by(TOOLS_CHECK, 'a server that refuses tool_choice=auto')}"

    def send(messages):
        # Not through the garbage detector: what a turn says is the loop's outcome (SERVE-SANITY judges garbage).
        body = {**chat_body(server.served_name, "", max_tokens=agent.MAX_TOKENS, tools=agent.TOOLS,
                            tool_choice="auto", seed=0), "messages": messages}
        return endpoint.choice(body, "an agent turn", why=refused)

    def run():
        if isinstance(_EPISODES.get(key), str):
            check.cannot_run(f"the agent episodes failed to run under {_EPISODES[key]}: read its message")
        if key not in _EPISODES:
            seqs = int(recipe.args.value("--max-num-seqs") or 4)
            parser = recipe.arg("--tool-call-parser")
            try:
                with ThreadPoolExecutor(max(1, min(4, seqs))) as pool:
                    _EPISODES[key] = list(pool.map(lambda t: agent.run(t, send, parser),
                                                   agent.tasks(level.agent_tasks)))
            except Failed:
                _EPISODES[key] = check.id
                raise
        return _EPISODES[key]
    return run


def _garbage(e: agent.Episode) -> bool:
    """A call cut off at max_tokens (a model looping inside it), or a final answer the garbage detector flags:
    SERVE-SANITY's to diagnose."""
    return (e.cut and bool(e.leaked)) or bool(sanity.scan(e.answer, e.task.question))


def _why(check, lost: list[agent.Episode]) -> str:
    """One defect, one failure: where most lost episodes share a cause another check diagnoses, point there."""
    def most(test):
        return sum(map(test, lost)) * 2 >= len(lost) > 0
    if most(_garbage):
        return f"{WHY} {sanity.diagnosed_by('SERVE-SANITY', 'garbage answers')}"
    if most(lambda e: bool(e.leaked)):
        return f"{WHY} {sanity.diagnosed_by(TOOLS_CHECK, 'tool calls left as text in the content')}"
    if check.id != CALLS_CHECK and most(lambda e: not e.calls_clean):
        return f"{WHY} {sanity.diagnosed_by(CALLS_CHECK, 'episodes whose calls stopped or broke')}"
    return WHY


def _judge(check, recipe, level, results, baseline_answers, episodes, outcome, what):
    """Record each episode's outcome, print the figure, and hold it to the baseline's, paired (McNemar)."""
    kept = [Answer(recipe=recipe.name, check=check.id, probe=e.task.id, prompt_digest=agent.setup_digest(e.task),
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
        check.cannot_run(f"the baseline has no {check.id} episodes to pair with these (an older results file or "
                         f"harness, another level, or the check did not run there): {right}/{len(kept)} {what}",
                         "make the baseline again with this version of the suite at this level")
    verdict = compare_answers(recipe.name, check.id, before, now)
    if not verdict.flips.can_show_loss:
        more = ("run the baseline and this run at --level standard (all the tasks), or serve a model that completes "
                "more of them" if level.agent_tasks else "serve a model that completes more of the tasks")
        check.cannot_run(f"the baseline has {verdict.flips.right_before} of {len(before)} episodes {what}: even "
                         f"losing all of them would not be significant (McNemar's exact test needs "
                         f"{quality.SMALLEST_LOSS} at p < {quality.ALPHA:g}); now {right}/{len(kept)}", more)
    print(f"  against the baseline: {verdict.describe()}")
    lost = [e for e in episodes if e.task.id in before and before[e.task.id].right and not now[e.task.id].right]
    check.that(not verdict.worse,
               expected=f"no significant loss of episodes {what} against the baseline (McNemar's exact test on the "
                        f"paired episodes, one-sided, p < {quality.ALPHA:g})",
               found=f"{verdict.flips.describe()}; lost: " + "; ".join(f"{e.task.id} {e.describe()}" for e in lost[:4])
                     + (f"; ... {len(lost) - 4} more" if len(lost) > 4 else ""), why=_why(check, lost))


@pytest.mark.check("QUAL-AGENT-TASKS", why=WHY, fix=FIX)
def test_agent_tasks_are_completed_as_often_as_in_the_baseline(check, recipe, level, results, baseline_answers,
                                                                episodes):
    """Agent tasks (call a tool, read its result, call the next, answer) MUST, against --baseline, not be completed
    significantly less often than in the baseline's run (McNemar's exact test, paired by task, p < 0.01)."""
    _judge(check, recipe, level, results, baseline_answers, episodes(), lambda e: e.completed,
           "completed (the answer carries the temperature the tools gave)")


@pytest.mark.check("QUAL-AGENT-CALLS", why=WHY, fix=FIX)
def test_agent_calls_reach_the_agent_well_formed_as_often_as_in_the_baseline(check, recipe, level, results,
                                                                              baseline_answers, episodes):
    """Agent episodes MUST, against --baseline, not fail to call a tool well-formed (no call at all, a call to an
    unknown tool or without its required field, a call left as text in the content) significantly more often than in
    the baseline's run (McNemar's exact test, paired by task, p < 0.01)."""
    _judge(check, recipe, level, results, baseline_answers, episodes(), lambda e: e.calls_clean,
           "with every call in tool_calls[] well-formed")
