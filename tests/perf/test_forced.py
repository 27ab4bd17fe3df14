"""Forced length (min_tokens + ignore_eos): identical output lengths, to compare images and engines.

Never "how fast it feels": forcing past the natural stop understated real use by ~45% under MTP in the
guide. It is the figure an upgrade gate compares first (`--baseline`), and llama-benchy's `tg128 --exact-tg`.
Its latency also runs through pytest-benchmark, whose own options (`--benchmark-save`, `--benchmark-compare`) apply.
"""

import asyncio

import pytest

from sparkgate.measure import Figure, burst
from sparkgate.workloads import PROSE, forced

TOKENS = 128
SHAPE = {"prompt": "short prose", "max_tokens": TOKENS, "min_tokens": TOKENS, "ignore_eos": True,
         "thinking": "off", "temperature": 0.0, "concurrency": 1}


@pytest.mark.check(
    "PERF-FORCED",
    why="comparing two images needs the same number of tokens out of each; a server that ignores "
        "min_tokens/ignore_eos makes that comparison meaningless",
    fix="the server ignored min_tokens or ignore_eos: check the vLLM version's sampling parameters",
)
def test_forced_length_generates_exactly_the_forced_tokens(check, target, recipe, roofline, record, benchmark,
                                                          completed):
    """A forced-length request MUST return exactly the forced number of tokens; its latency is benchmarked."""
    body = forced(recipe, PROSE[0], TOKENS)
    asyncio.run(burst(target, [body]))  # warm-up, discarded
    records = []
    benchmark.extra_info.update(recipe=recipe.name, shape=SHAPE)
    benchmark.pedantic(lambda: records.extend(asyncio.run(burst(target, [body]))), rounds=5, iterations=1)
    counts = [r.completion_tokens for r in completed(records)]
    check.that(counts == [TOKENS] * len(records), expected=f"{TOKENS} completion tokens each time",
               found=f"{counts}")
    record(Figure.of("forced-length decode, per request (not a feel figure)", "tok/s",
                     [r.decode_tok_s for r in records], SHAPE, roofline))
