"""Where per-person speed stops being usable: concurrency doubled until per-request decode falls below it, or the
first token comes too late (queueing), and never counted past --max-num-seqs.

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
        "throughput keeps rising long after each user's speed has become unpleasant, and TTFT, not the error "
        "rate, is the saturation signal (the guide): requests past --max-num-seqs queue for a seat",
    fix="if even one user is below the usable speed, read PERF-NATURAL's message; a first token later than the "
        "usable TTFT at one stream is a server that queues or prefills slowly: read its log; otherwise plan for at "
        "most the reported number of concurrent users (or raise --max-num-seqs and re-run to look further)",
)
def test_capacity_sweep_reports_the_largest_usable_concurrency(check, target, recipe, roofline, record, request,
                                                               completed, level, progress):
    """Doubling concurrency from 1, per-request decode and TTFT MUST be usable at 1; the largest usable is reported."""
    usable = request.config.getoption("sg_usable_tok_s")
    usable_ttft = request.config.getoption("sg_usable_ttft_s")
    floor = recipe.floors.get("usable_decode")
    usable = floor.min if floor else usable
    held_to = "usable_decode" if floor else usable  # the recipe's floor by name, else --usable-tok-s
    prompts = PROSE + CODE
    asyncio.run(burst(target, [chat(recipe, prompts[0], 16)]))  # warm-up, discarded
    # Requests past --max-num-seqs queue for a seat, which users feel as TTFT; at --level extended one doubling past
    # it shows that. Such a level is never counted as capacity: the server serves max-num-seqs at once, no more.
    seats = recipe.max_num_seqs
    limit, c, best, rows = level.capacity_limit(seats), 1, None, []
    # One step per doubling up to the limit, if every level is usable.
    steps, max_tokens = progress(limit.bit_length()), level.tokens(MAX_TOKENS)
    while c <= limit:
        steps(f"{c} concurrent (the sweep goes to {limit} while each request decodes at >= {usable:g} tok/s and "
              f"its first token comes within {usable_ttft:g} s)")
        shape = {"prompt": "short prose and code", "max_tokens": max_tokens, "ignore_eos": False,
                 "thinking": "off", "temperature": 0.2, "concurrency": c}
        records = completed(asyncio.run(burst(target, [chat(recipe, prompts[i % 4], max_tokens, 0.2)
                                                                for i in range(c)])),
                            f"request at {c} concurrent")
        figure = record(Figure.of(f"capacity sweep: decode per request at {c} concurrent", "tok/s",
                                  [r.decode_tok_s for r in records], shape, roofline), held_to)
        ttft = max(r.ttft_s or 0 for r in records)
        record(Figure.of(f"capacity sweep: worst TTFT at {c} concurrent", "s", [ttft], shape))
        queued = f" (past --max-num-seqs {seats}: requests queue for a seat)" if c > seats else ""
        unusable = [f"decode {figure.mean:.1f} < {usable:g} tok/s"] if figure.mean < usable else []
        unusable += [f"worst TTFT {ttft:.2f} s > {usable_ttft:g} s{queued}"] if ttft > usable_ttft else []
        rows.append(f"{c}: {figure.mean:.1f} tok/s per request, {aggregate_tok_s(records):.1f} aggregate, "
                    f"worst TTFT {ttft:.2f} s" + (f": not usable, {'; '.join(unusable)}" if unusable else
                                                  f"{queued}, not counted" if queued else ""))
        if unusable:
            break
        best = c if c <= seats else best
        c *= 2
    print(f"{recipe.name} capacity sweep (usable: >= {usable:g} tok/s per request, first token within "
          f"{usable_ttft:g} s):\n  " + "\n  ".join(rows))
    print(f"largest usable concurrency: {best or 'none'}" + (
        f" (--max-num-seqs {seats}: the server serves no more at once)" if best == seats else
        f" (the sweep's limit at --level {level.name})" if best and best * 2 > limit else ""))
    check.that(best is not None, expected=f"a single stream at >= {usable:g} tok/s, its first token within "
                                          f"{usable_ttft:g} s (usable)", found=rows[0])
