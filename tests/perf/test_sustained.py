"""Sustained closed-loop load: max-num-seqs streams kept full, the figure to plan capacity with."""

import asyncio

import pytest

from sparkgate.measure import Figure, aggregate_tok_s, closed_loop
from sparkgate.workloads import CODE, PROSE, chat

pytestmark = pytest.mark.extended
MAX_TOKENS = 1500


@pytest.mark.check(
    "PERF-SUSTAINED",
    why="bursts understate throughput (ramp-up and the ragged tail dominate); capacity planning needs the "
        "sustained figure, and each user's speed under it",
    fix="compare with the last good run; watch TTFT (queueing) first, errors last",
)
def test_sustained_load_keeps_every_stream_at_its_floor(check, target, recipe, roofline, record, completed, level,
                                                        progress, request):
    """Under sustained load at max-num-seqs, per-request decode MUST meet the recipe's floor for that level."""
    duration_s = request.config.getoption("sg_sustained_s")
    if not level.runs(check.id):
        check.cannot_run(f"{duration_s} s of sustained load is a long shape, run at --level extended only (this run: "
                         f"{level.name})", "--level extended")
    streams = recipe.max_num_seqs
    progress(1)(f"{streams} streams kept full for {duration_s} s (about {duration_s} s left when it starts)")
    prompts = PROSE + CODE
    ran = asyncio.run(closed_loop(target, lambda i: chat(recipe, prompts[i % 4], MAX_TOKENS), streams, duration_s))
    # A request cut at the window's end is timed on its tokens so far, where the server counts them as they go.
    records = completed([r for r in ran if not r.cut or r.decode_tok_s is not None], "request under sustained load")
    print(f"[{check.id}] {len(records)} requests timed in {duration_s} s, {sum(r.cut for r in records)} of them cut "
          f"at the window's end")
    shape = {"prompt": "prose and code", "max_tokens": MAX_TOKENS, "ignore_eos": False, "thinking": "off",
             "temperature": 0.3, "concurrency": streams, "duration_s": duration_s}
    floor = recipe.floors.get("sustained_decode")
    figure = record(Figure.of(f"sustained decode per request at {streams} streams", "tok/s",
                              [r.decode_tok_s for r in records], shape, roofline), "sustained_decode")
    # Capacity, for planning: reported, never a floor (a sum over users is no one's speed).
    record(Figure.of(f"sustained aggregate at {streams} streams (capacity, not a speed)", "tok/s",
                     [aggregate_tok_s(records)], shape))
    if floor is None:
        check.cannot_run(f"recipe {recipe.name} declares no sustained_decode floor (figures recorded)")
    check.that(figure.mean >= floor.min, expected=floor.expected(" per request"),
               found=f"{figure} on {recipe.name}, shape {shape}")
