"""Answers that are right, not only fast and clean: the quality probes (sparkgate.quality), held to the recipe's floor
and, with --baseline, compared probe by probe with the baseline's answers.

The guide calls output quality the biggest gap: an uncalibrated FP8 KV scale took GSM8K from 0.78 to 0.025 (vLLM PR
#19292), and a cutlass-dsl release answered MoE layers wrongly on sm_121a (NVIDIA/cutlass#3227), in fluent text.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from sparkgate import quality, sanity
from sparkgate.compare import compare_answers, first_answers, paired, rerun_noise
from sparkgate.probes import chat_body
from sparkgate.results import Answer, Step

WHY = ("a tokens/sec win is worthless if it costs correctness (the guide): an image, a kernel or a KV cache dtype can "
       "make answers wrong in fluent text, which no speed figure and no garbage detector sees")
FIX = ("keep the baseline's image and flags; try the change's parts one at a time (KV cache dtype first: without "
       "calibrated scales an FP8 KV cache loses accuracy, vLLM PR #19292), and read the flipped probes below")
THINKING_BUDGET = 1024  # tokens a reasoning recipe may think before its short answer


@pytest.fixture
def answer_all(server, endpoint, recipe):
    """answer_all(probes) -> [(probe, message, choice)]: greedy, seeded, thinking as the recipe declares, as many at
    once as the server schedules."""
    def ask(probe):
        extra = {"seed": 0, "logprobs": True, "top_logprobs": quality.TOP_K}
        if recipe.features.reasoning:
            extra["chat_template_kwargs"] = {"enable_thinking": True}
        max_tokens = probe.max_tokens + (THINKING_BUDGET if recipe.features.reasoning else 0)
        body = chat_body(server.served_name, probe.prompt, max_tokens=max_tokens, **extra)
        choice = endpoint.choice(body, f"quality probe {probe.id}")
        return probe, choice.get("message") or {}, choice

    def run(probes):
        seqs = int(recipe.args.value("--max-num-seqs") or 4)
        with ThreadPoolExecutor(max(1, min(4, seqs))) as pool:
            return list(pool.map(ask, probes))
    return run


@pytest.mark.check("QUAL-ANSWERS", why=WHY, fix=FIX)
def test_the_probes_are_answered_right_as_often_as_the_floor_and_the_baseline_say(check, recipe, level, results,
                                                                                 answer_all, baseline_answers):
    """The quality probes MUST be answered right at least as often as the recipe's floor and, with --baseline, not
    significantly less often than the baseline's run answered them (McNemar's exact test, one-sided, p < 0.01)."""
    probes = quality.probe_set(level.quality_probes)
    again = probes[::quality.RERUN_SHARE]
    answered = answer_all(probes) + answer_all(list(reversed(again)))  # the rerun in another order: other batches
    kept, garbage = [], set()
    for i, (probe, message, choice) in enumerate(answered):
        text = message.get("content") if isinstance(message.get("content"), str) else ""
        if i < len(probes) and sanity.scan_message(message, probe.prompt):
            garbage.add(probe.id)
        kept.append(Answer(recipe=recipe.name, check=check.id, probe=probe.id,
                           prompt_digest=quality.digest(probe.prompt),
                           right=probe.right(text), text=text[:400], rerun=i >= len(probes),
                           steps=[Step(text=t, logprob=lp, top=top) for t, lp, top in quality.steps_of(choice)]))
    results.add_answers(kept)
    first = {a.probe: a for a in kept if not a.rerun}
    clean = {p: a for p, a in first.items() if p not in garbage}
    right = sum(a.right for a in first.values())
    print(f"{right}/{len(probes)} right: {quality.by_kind(first.values())}"
          + (f"; {len(garbage)} answers garbage (SERVE-SANITY's to judge)" if garbage else ""))
    if noise := rerun_noise(kept):
        print(f"the engine's own rerun of {len(again)} probes: {noise.describe()}")
    if baseline_answers is None and recipe.quality is None:
        check.cannot_run(f"recipe {recipe.name} states no quality floor and no --baseline was given: {right}/"
                         f"{len(probes)} right, recorded in the results file for a later --baseline",
                         "give --baseline BEFORE.json (a run of this level before the change), or state "
                         "`quality: min_right` in the recipe from a run you trust")

    def why(fails_on_clean_answers: bool) -> str:
        """One defect, one failure: garbage is SERVE-SANITY's. The message points there when the garbage is the cause:
        judged on the clean answers alone the verdict would pass, or most answers are garbage (what is left is too
        little to judge, and likely garbage the detector missed). Otherwise the wrong answers are this check's own."""
        if not garbage:
            return WHY
        if fails_on_clean_answers and len(garbage) * 2 <= len(probes):
            return f"{WHY} (and {len(garbage)} answers are garbage besides: SERVE-SANITY judges those)"
        return f"{WHY} {sanity.diagnosed_by('SERVE-SANITY', 'garbage answers')}"
    if recipe.quality is not None:
        floor = recipe.quality
        wrong = [f"{p.id} {first[p.id].text[:60]!r} (expected {p.expected!r})" for p in probes if not first[p.id].right]
        check.that(right >= floor.min_right * len(probes),
                   expected=f">= {floor.min_right:.0%} of the {len(probes)} probes right ({floor.measured}; "
                            f"{floor.source})",
                   found=f"{right}/{len(probes)} right ({right / len(probes):.0%}); wrong: {_some(wrong)}",
                   why=why(sum(a.right for a in clean.values()) < floor.min_right * len(clean)))
    if baseline_answers is not None:
        before = paired(first_answers(baseline_answers).get((recipe.name, check.id), {}), first)
        if not before:
            had = [a for a in baseline_answers if a.check == check.id]
            why_not = (f"its {len(had)} answers are to probes asked differently (another version of the probe set)"
                       if had else "it has no answers (an older results file, or QUAL-ANSWERS did not run there)")
            if recipe.quality is None:
                check.cannot_run(f"the baseline cannot be paired with this run: {why_not}; recipe {recipe.name} "
                                 f"states no quality floor. {right}/{len(probes)} right, recorded for a later "
                                 "--baseline", "make the baseline again with this version of the suite")
            print(f"  against the baseline: {why_not}")
            return
        verdict = compare_answers(recipe.name, check.id, before, first,
                                  [a for a in baseline_answers if a.check == check.id])
        print(f"  against the baseline: {verdict.describe()}")
        on_clean = quality.flips({p: a.right for p, a in before.items() if p in clean},
                                 {p: a.right for p, a in clean.items()})
        check.that(not verdict.worse,
                   expected="no significant loss of right answers against the baseline (McNemar's exact test on the "
                            f"paired probes, one-sided, p < {quality.ALPHA:g})",
                   found=f"{verdict.flips.describe()}; right to wrong: {_some(verdict.lost)}",
                   why=why(on_clean.significantly_worse))


def _some(items: list[str], shown: int = 6) -> str:
    return "; ".join(items[:shown]) + (f"; ... {len(items) - shown} more" if len(items) > shown else "")
