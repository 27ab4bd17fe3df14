"""Forced length (min_tokens + ignore_eos): identical output lengths, to compare images and engines.

Never "how fast it feels": forcing past the natural stop understated real use by ~45% under MTP in the
guide. It is the figure an upgrade gate compares first (`--baseline`), and llama-benchy's `tg128 --exact-tg`.
Its latency also runs through pytest-benchmark, whose own options (`--benchmark-save`, `--benchmark-compare`) apply.
"""

import asyncio

import pytest

from sparkgate.measure import Figure, burst
from sparkgate.workloads import PROSE, forced

TOKENS = 128  # at --level standard; a level sets its share


def shape_of(tokens):
    return {"prompt": "short prose", "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True,
            "thinking": "off", "temperature": 0.0, "concurrency": 1}


@pytest.mark.check(
    "PERF-FORCED",
    why="comparing two images needs the same number of tokens out of each; a server that ignores "
        "min_tokens/ignore_eos makes that comparison meaningless",
    fix="the server ignored min_tokens or ignore_eos: check the vLLM version's sampling parameters",
)
def test_forced_length_generates_exactly_the_forced_tokens(check, target, recipe, roofline, record, benchmark,
                                                          completed, level, progress):
    """A forced-length request MUST return exactly the forced number of tokens; its latency is benchmarked."""
    tokens = level.tokens(TOKENS)
    body = forced(recipe, PROSE[0], tokens)
    asyncio.run(burst(target, [forced(recipe, PROSE[0], 16)]))  # warm-up, discarded
    records, steps = [], progress(level.forced_rounds)

    def one():
        steps(f"forced request {len(records) + 1} of {level.forced_rounds} ({tokens} tokens)")
        records.extend(asyncio.run(burst(target, [body])))

    benchmark.extra_info.update(recipe=recipe.name, shape=shape_of(tokens))
    if benchmark.disabled:  # pytest-benchmark turns itself off under pytest-xdist (a fleet): the rounds still run
        for _ in range(level.forced_rounds):
            one()
    else:
        benchmark.pedantic(one, rounds=level.forced_rounds, iterations=1)
    counts = [r.completion_tokens for r in completed(records)]
    check.that(counts == [tokens] * len(records), expected=f"{tokens} completion tokens each time",
               found=f"{counts}")
    record(Figure.of("forced-length decode, per request (not a feel figure)", "tok/s",
                     [r.decode_tok_s for r in records], shape_of(tokens), roofline))
