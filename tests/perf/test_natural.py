"""Per-request speed at natural length: what a person in a chat actually experiences."""

import asyncio

import pytest

from sparkgate.measure import Figure, burst
from sparkgate.workloads import CODE, PROSE, chat

SHAPE = {"prompt": "short prose and code", "max_tokens": 400, "ignore_eos": False, "thinking": "off",
         "temperature": 0.3, "concurrency": 1}


async def one_at_a_time(target, recipe, prompts):
    return [(await burst(target, [chat(recipe, p, SHAPE["max_tokens"])]))[0] for p in prompts]


@pytest.mark.check(
    "PERF-NATURAL",
    why="this is the speed a user feels; a drop after an image or flag change is a regression",
    fix="compare the image and serve args with the last good run (--results-json); on GB10 check driver "
        ">= 590 (CUDA graphs, HOST-DRIVER-MIN) and that nothing else holds memory bandwidth",
)
def test_natural_single_stream_decode_meets_the_floor(check, target, recipe, roofline, record, completed):
    """Natural single-stream decode, per request, MUST meet the recipe's floor."""
    floor = recipe.floors.get("natural_decode")
    if floor is None:
        check.cannot_run(f"recipe {recipe.name} declares no natural_decode floor")
    # The first request after a start is warm-up (~5 tok/s on a Spark after idle): discarded.
    records = completed(asyncio.run(one_at_a_time(target, recipe, [PROSE[0], *PROSE, *CODE]))[1:])
    rates = [r.decode_tok_s for r in records]
    figure = record(Figure.of("natural decode, per request", "tok/s", rates, SHAPE, roofline), "natural_decode")
    record(Figure.of("natural decode, prose", "tok/s", rates[:2], {**SHAPE, "prompt": "prose"}, roofline))
    record(Figure.of("natural decode, code", "tok/s", rates[2:], {**SHAPE, "prompt": "code"}, roofline))
    check.that(figure.mean >= floor.min,
               expected=floor.expected(),
               found=f"{figure} on {recipe.name}, shape {SHAPE}")
