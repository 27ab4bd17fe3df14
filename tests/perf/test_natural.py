"""Per-request speed at natural length: what a person in a chat actually experiences."""

import asyncio

import httpx
import pytest

from sparkgate.measure import Figure, stream_chat

# Prose and code: speculative decoding accepts more drafts on code, so both are in every natural figure.
PROMPTS = [
    "Explain in a few paragraphs how a refrigerator keeps food cold.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and an example.",
    "Describe the water cycle to a curious ten-year-old.",
    "Write a shell script that counts the lines of every .py file under the current directory.",
]
RUNS = 4  # one warm-up, then n = 3 measured
SHAPE = {"prompt": "short prose and code", "max_tokens": 400, "ignore_eos": False, "thinking": "off",
         "temperature": 0.3, "concurrency": 1}


async def natural_runs(server):
    async with httpx.AsyncClient(timeout=600) as client:
        records = []
        for i in range(RUNS):
            body = {"model": server.served_name, "max_tokens": SHAPE["max_tokens"],
                    "temperature": SHAPE["temperature"],
                    "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    "chat_template_kwargs": {"enable_thinking": False}}
            records.append(await stream_chat(client, server.base_url, body))
        return records[1:]  # the first request after a start is warm-up


@pytest.mark.check(
    "PERF-NATURAL",
    why="this is the speed a user feels; a drop after an image or flag change is a regression",
    fix="compare the image and serve args with the last good run (--results-json); on GB10 check driver "
        ">= 590 (CUDA graphs) and that nothing else holds memory bandwidth",
)
def test_natural_single_stream_decode_meets_the_floor(check, server, recipe, results):
    """Natural single-stream decode, per request, MUST meet the recipe's floor."""
    floor = recipe.floors.get("natural_decode")
    if floor is None:
        check.cannot_run(f"recipe {recipe.name} declares no natural_decode floor")
    records = asyncio.run(natural_runs(server))
    rates = [r.decode_tok_s for r in records if r.decode_tok_s is not None]
    if len(rates) < len(records):
        check.that(False, expected=f"{len(records)} timed generations of at least 2 tokens",
                   found=f"{len(rates)} ({[r.completion_tokens for r in records]} tokens)")
    figure = Figure.of("natural decode, per request", "tok/s", rates, SHAPE)
    print(f"{recipe.name}: {figure}; floor {floor.min:g} (measured {floor.measured})")
    if results:
        results.add(figure, recipe, check.id)
    check.that(figure.mean >= floor.min, expected=f">= {floor.min:g} {floor.unit} ({floor.measured}; {floor.source})",
               found=f"{figure} on {recipe.name}, shape {SHAPE}")
