"""Per-request speed at natural length: what a person in a chat actually experiences."""

import asyncio

import pytest

from sparkgate.measure import Figure, burst
from sparkgate.workloads import CODE, PROSE, chat

MAX_TOKENS = 400  # at --level standard; a level sets its share
SHAPE = {"prompt": "short prose and code", "ignore_eos": False, "thinking": "off", "temperature": 0.3,
         "concurrency": 1}


@pytest.mark.check(
    "PERF-NATURAL",
    why="this is the speed a user feels; a drop after an image or flag change is a regression",
    fix="compare the image and serve args with the last good run (--results-json); on GB10 check driver "
        ">= 590 (CUDA graphs, HOST-DRIVER-MIN) and that nothing else holds memory bandwidth",
)
def test_natural_single_stream_decode_meets_the_floor(check, target, recipe, roofline, record, completed, level,
                                                      progress):
    """Natural single-stream decode, per request, MUST meet the recipe's floor."""
    floor = recipe.floors.get("natural_decode")
    if floor is None:
        check.cannot_run(f"recipe {recipe.name} declares no natural_decode floor")
    shape = {**SHAPE, "max_tokens": level.tokens(MAX_TOKENS)}
    # The first request after a start is warm-up (~5 tok/s on a Spark after idle): discarded.
    asyncio.run(burst(target, [chat(recipe, PROSE[0], 16)]))
    each = level.natural_requests // 2  # prose and code alike
    prompts = [("prose", p) for p in PROSE[:each]] + [("code", p) for p in CODE[:each]]
    steps, records = progress(len(prompts)), []
    for i, (kind, prompt) in enumerate(prompts):
        steps(f"natural request {i + 1} of {len(prompts)} ({kind})")
        records += asyncio.run(burst(target, [chat(recipe, prompt, shape["max_tokens"])]))
    rates = [r.decode_tok_s for r in completed(records)]
    figure = record(Figure.of("natural decode, per request", "tok/s", rates, shape, roofline), "natural_decode")
    record(Figure.of("natural decode, prose", "tok/s", rates[:each], {**shape, "prompt": "prose"}, roofline))
    record(Figure.of("natural decode, code", "tok/s", rates[each:], {**shape, "prompt": "code"}, roofline))
    check.that(figure.mean >= floor.min,
               expected=floor.expected(),
               found=f"{figure} on {recipe.name}, shape {shape}")
