"""Where per-person speed stops being usable: concurrency doubled until per-request decode falls below it.

The guide's open question: more users always add aggregate throughput (up to memory bandwidth), but each
user's speed falls; the useful number is the concurrency at which it stops being pleasant, not where it errors.
"""

import asyncio

import pytest

from sparkgate.measure import Figure, aggregate_tok_s, burst
from sparkgate.workloads import CODE, PROSE, chat

MAX_TOKENS = 250  # at --level standard; a level sets its share


@pytest.mark.check(
    "PERF-CAPACITY",
    why="capacity planning needs the number of users each still served at a usable speed; aggregate "
        "throughput keeps rising long after each user's speed has become unpleasant",
    fix="if even one user is below the usable speed, read PERF-NATURAL's message; otherwise plan for at most "
        "the reported number of concurrent users (or raise --max-num-seqs and re-run to look further)",
)
def test_capacity_sweep_reports_the_largest_usable_concurrency(check, target, recipe, roofline, record, request,
                                                               completed, level, progress):
    """Doubling concurrency from 1, per-request decode MUST be usable at 1; the largest usable level is reported."""
    usable = request.config.getoption("sg_usable_tok_s")
    floor = recipe.floors.get("usable_decode")
    usable = floor.min if floor else usable
    held_to = "usable_decode" if floor else usable  # the recipe's floor by name, else --usable-tok-s
    prompts = PROSE + CODE
    asyncio.run(burst(target, [chat(recipe, prompts[0], 16)]))  # warm-up, discarded
    # Requests past --max-num-seqs queue, which users feel too (TTFT); at --level extended one doubling past it
    # shows that.
    limit, c, best, rows = level.capacity_limit(recipe.max_num_seqs), 1, None, []
    # One step per doubling up to the limit, if every level is usable.
    steps, max_tokens = progress(limit.bit_length()), level.tokens(MAX_TOKENS)
    while c <= limit:
        steps(f"{c} concurrent (the sweep goes to {limit} while each request decodes at >= {usable:g} tok/s)")
        shape = {"prompt": "short prose and code", "max_tokens": max_tokens, "ignore_eos": False,
                 "thinking": "off", "temperature": 0.2, "concurrency": c}
        records = completed(asyncio.run(burst(target, [chat(recipe, prompts[i % 4], max_tokens, 0.2)
                                                                for i in range(c)])),
                            f"request at {c} concurrent")
        figure = record(Figure.of(f"capacity sweep: decode per request at {c} concurrent", "tok/s",
                                  [r.decode_tok_s for r in records], shape, roofline), held_to)
        ttft = max(r.ttft_s or 0 for r in records)
        record(Figure.of(f"capacity sweep: worst TTFT at {c} concurrent", "s", [ttft], shape))
        rows.append(f"{c}: {figure.mean:.1f} tok/s per request, {aggregate_tok_s(records):.1f} aggregate, "
                    f"worst TTFT {ttft:.2f} s")
        if figure.mean < usable:
            break
        best, c = c, c * 2
    print(f"{recipe.name} capacity sweep (usable >= {usable:g} tok/s per request):\n  " + "\n  ".join(rows))
    print(f"largest usable concurrency: {best or 'none'}" + (f" (the sweep's limit at --level {level.name})"
                                                           if best and best * 2 > limit else ""))
    check.that(best is not None, expected=f"a single stream at >= {usable:g} tok/s (usable)",
               found=rows[0])
