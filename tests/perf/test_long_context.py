"""A 30,000-token prompt (or as much as the recipe's context admits): decode, prefill and TTFT at depth."""

import asyncio
import secrets

import pytest

from sparkgate.measure import Figure, burst
from sparkgate.workloads import chat, long_context_words, long_prompt

pytestmark = pytest.mark.extended
RUNS = 3


_RUNS: dict[str, tuple] = {}  # per recipe: both checks read the same three long runs


@pytest.fixture
def long_runs(target, recipe, completed, check, level, progress):
    if not level.runs(check.id):
        check.cannot_run(f"its ~30,000-token prompt is a long shape, run at --level extended only (this run: "
                         f"{level.name})", "--level extended")
    if recipe.name not in _RUNS:
        _RUNS[recipe.name] = _measure(target, recipe, completed, progress(RUNS))
    return _RUNS[recipe.name]


def _measure(target, recipe, completed, steps):
    # llama-benchy's --pp 30000 --tg 2000 (the floors' method): up to 2,000 tokens out, stopping naturally;
    # a quarter of the context where the recipe has less room.
    max_tokens = min(2000, recipe.max_model_len // 4)
    words = long_context_words(recipe, max_tokens=max_tokens)
    asyncio.run(burst(target, [chat(recipe, "Say hi.", 8)]))  # warm-up, discarded
    # Each prompt opens with a fresh random prefix: nothing comes from the prefix cache, this run or the last.
    records = []
    for i in range(RUNS):
        steps(f"long-context request {i + 1} of {RUNS} (~{int(words * 1.3)} tokens in, up to {max_tokens} out)")
        records += asyncio.run(burst(target, [chat(recipe, long_prompt(words, secrets.randbits(64)), max_tokens)]))
    records = completed(records, "long-context request")
    # The prompt's length is the recipe's (its context sets it), rounded so that two runs of it share a shape.
    shape = {"prompt": "filler", "prompt_tokens": round(records[0].prompt_tokens or 0, -2), "max_tokens": max_tokens,
             "ignore_eos": False, "thinking": "off", "temperature": 0.3, "concurrency": 1, "cache": "defeated"}
    return records, shape


def floor_check(check, recipe, name, figure):
    floor = recipe.floors.get(name)  # (the figure was recorded with it)
    if floor is None:
        check.cannot_run(f"recipe {recipe.name} declares no {name} floor ({figure} recorded)")
    check.that(figure.mean >= floor.min, expected=floor.expected(),
               found=f"{figure} on {recipe.name}, a {figure.shape.prompt_tokens}-token uncached prompt")


@pytest.mark.check(
    "PERF-LONG-DECODE",
    why="agents send long contexts; decode at depth is what they feel (the guide: ~25% below short context)",
    fix="compare with the last good run; check --max-num-batched-tokens and the attention backend",
)
def test_decode_after_a_long_prompt_meets_the_floor(check, recipe, long_runs, roofline, record):
    """Decode after a ~30K-token uncached prompt MUST meet the recipe's floor."""
    records, shape = long_runs
    figure = record(Figure.of("long-context decode, per request", "tok/s", [r.decode_tok_s for r in records],
                              shape, roofline), "long_context_decode")
    floor_check(check, recipe, "long_context_decode", figure)


@pytest.mark.check(
    "PERF-LONG-PREFILL",
    why="prefill sets the time to first token of every long agent request (~25 s at 30K on the 27B)",
    fix="compare with the last good run; check chunked prefill and --max-num-batched-tokens",
)
def test_prefill_of_a_long_prompt_meets_the_floor(check, recipe, long_runs, record):
    """Prefill of a ~30K-token uncached prompt MUST meet the recipe's floor."""
    records, shape = long_runs
    record(Figure.of("long-context TTFT", "s", [r.ttft_s for r in records], shape))
    figure = record(Figure.of("long-context prefill", "tok/s", [r.prefill_tok_s for r in records], shape),
                    "long_context_prefill")
    floor_check(check, recipe, "long_context_prefill", figure)
