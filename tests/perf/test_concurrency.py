"""Several users at once: the speed each one sees. The sum over users is capacity, reported apart."""

import asyncio

import pytest

from sparkgate.measure import Figure, aggregate_tok_s, burst
from sparkgate.workloads import CODE, PROSE, chat

LEVELS = (1, 4, 8, 16)
MAX_TOKENS = 250  # the guide's burst runs: short prompts, max_tokens 250 (at --level standard; a level sets its share)
# Rounds per concurrency (--level sets them): at concurrency c the requests of one round share a batch, so a round is
# one sample for a comparison; batches vary more than single requests, so a level of c > 1 gets more of them.


def levels_for(recipe):
    return [c for c in LEVELS if c <= recipe.max_num_seqs]


@pytest.mark.check(
    "PERF-CONCURRENT",
    why="per-request speed under load is what each user of a shared box feels; it drops as users are "
        "added, and an upgrade that steepens the drop is a regression even if the single stream is fine",
    fix="compare with the last good run; check --max-num-seqs and --max-num-batched-tokens against the "
        "recipe, and TTFT (queueing) before errors, as the saturation signal",
)
def test_per_request_decode_under_concurrency_meets_the_floors(check, target, recipe, roofline, record,
                                                               completed, level, progress):
    """Per-request decode at each concurrency level up to max-num-seqs MUST meet the recipe's floor for it."""
    prompts = PROSE + CODE
    asyncio.run(burst(target, [chat(recipe, prompts[0], 16)]))  # warm-up, discarded
    short, judged = [], []
    rounds = {c: level.single_rounds if c == 1 else level.batch_rounds for c in levels_for(recipe)}
    steps, max_tokens = progress(sum(rounds.values())), level.tokens(MAX_TOKENS)
    for c in levels_for(recipe):
        shape = {"prompt": "short prose and code", "max_tokens": max_tokens, "ignore_eos": False,
                 "thinking": "off", "temperature": 0.2, "concurrency": c}
        # Bursts of c, one after another: a figure of one round has no spread between rounds, and cannot be compared
        # with a baseline.
        records = []
        for k in range(rounds[c]):
            steps(f"{c} concurrent, burst {k + 1} of {rounds[c]}")
            records += asyncio.run(burst(target, [chat(recipe, prompts[i % 4], max_tokens, 0.2) for i in range(c)]))
        records = completed(records, f"request at {c} concurrent")
        floor = "single_stream_decode" if c == 1 else f"concurrent_{c}_decode"
        figure = record(Figure.of(f"decode per request at {c} concurrent", "tok/s",
                                  [r.decode_tok_s for r in records], shape, roofline), floor)
        record(Figure.of(f"TTFT at {c} concurrent", "s", [r.ttft_s for r in records], shape))
        record(Figure.of(f"inter-token latency at {c} concurrent", "ms", [r.itl_ms for r in records], shape))
        record(Figure.of(f"aggregate at {c} concurrent (capacity: {c} requests summed, not a speed)", "tok/s",
                         [aggregate_tok_s(records[:c])], shape))
        if floor in recipe.floors:
            judged.append(floor)
            if figure.mean < recipe.floors[floor].min:
                short.append(f"{figure}, expected {recipe.floors[floor].expected()}")
    # A floor only for a level past --max-num-seqs (never measured) judges nothing.
    check.every(judged, "floor for a concurrency level measured", f"recipe {recipe.name} (levels measured: "
                f"{', '.join(map(str, rounds))}; floors declared: {', '.join(recipe.floors) or 'none'}; figures "
                "were recorded)")
    check.that(not short, expected="every level at or above its floor",
               found=f"on {recipe.name}, short prose and code prompts, max_tokens {max_tokens}: " + "; ".join(short))
