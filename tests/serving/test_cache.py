"""Prefix cache and concurrency: a cached or batched request answers as cleanly as a lone, uncached one.

The guide's garbage depended on how many tokens were actually scheduled for prefill, which prefix caching
decides from the content: the same body was clean cold and garbage warm. Prefix caching itself is lossless;
these checks catch an engine whose cached or batched path is not.
"""

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from sparkgate import metrics, sanity
from sparkgate.probes import COHERENCE, chat_body

DOOR = "green"  # what the notes say, and so the answer
NOTES = (
    "Field notes from the lighthouse on Skerry Point, kept by the keeper for the relief crew. "
    f"The door of the lighthouse is painted {DOOR}. The lamp is lit at sunset and put out at sunrise. "
    "Fresh water comes by boat every second Tuesday. The radio is checked at noon every day. "
) * 12


@pytest.mark.check("SERVE-PREFIX-CACHE", why=sanity.WHY, fix=sanity.FIX)
def test_a_repeated_request_answers_the_same_uncached_and_cached(check, server, endpoint):
    """A greedy request sent twice (uncached, then from the prefix cache) MUST answer cleanly, rightly and the same."""
    # A fresh nonce first, so the first send cannot hit a cache left by an earlier run.
    system = f"Session {uuid.uuid4().hex}.\n{NOTES}"
    # Cached and uncached garbage agree, so the detector and the known answer fail a broken model here: the detector
    # gets the room its rates were measured with (a healthy model answers in far fewer tokens).
    body = chat_body(server.served_name, "According to the notes, what colour is the lighthouse door? "
                                         "Answer in one short sentence.", max_tokens=sanity.JUDGED_TOKENS)
    body["messages"].insert(0, {"role": "system", "content": system})
    answers, hits, unavailable = [], [], None

    def scrape():
        nonlocal unavailable
        try:
            return metrics.scrape(server.base_url, server.served_name, server.headers)
        except metrics.MetricsUnavailable as exc:
            unavailable = str(exc)
            return {}

    for label in ("uncached", "cached"):
        before = scrape()
        data = endpoint.chat(body, label=f"the {label} send")
        answers.append(data["choices"][0]["message"].get("content") or "")
        hits.append(metrics.delta(before, scrape()).get(metrics.PREFIX_CACHE_HITS))
    print(f"prompt tokens served from the prefix cache ({metrics.PREFIX_CACHE_HITS}): uncached {hits[0]}, "
          f"cached {hits[1]}")
    n = min(40, *(len(a) for a in answers))
    agree = n > 0 and answers[0][:n] == answers[1][:n]
    # The notes answer the question: a broken model's two identical answers can escape the detector, not this.
    right = all(DOOR in a.lower() for a in answers)
    check.that(agree and right,
               expected="two non-empty answers that agree on their first 40 characters, both naming the door's "
                        f"colour the notes give ({DOOR})",
               found=f"uncached {answers[0][:80]!r}, cached {answers[1][:80]!r}",
               why=None if not agree else "the answers agree, cached and not, and are wrong: the cache is not the "
                   "cause " + sanity.diagnosed_by("SERVE-COHERENCE", "wrong answers"))
    if unavailable:
        check.cannot_run(f"the answers agree, but whether the second came from the prefix cache cannot be told: "
                         f"{unavailable}", "serve with vLLM (its /metrics count prefix-cache hits)")
    if not hits[1]:
        check.cannot_run(f"the second send was not served from the prefix cache ({metrics.PREFIX_CACHE_HITS} "
                         f"+{hits[1]:.0f}), so the cached path was not exercised: SERVE-PREFIX-HITS says why",
                         "serve with prefix caching on (vLLM's default; not --no-enable-prefix-caching)")


@pytest.mark.check(
    "SERVE-PREFIX-HITS",
    why="a chat or an agent sends its whole history again every turn: with the prefix cache only the new turn is "
        "prefilled, without it every turn pays for all of it and the time to first token grows with the conversation; "
        "it can be off with no error (an FP8 KV cache turned it off in a GB10 owner's vLLM start: 0.0% hit rate), and "
        "a gateway that writes a request id or the time at the top of the prompt defeats it",
    fix="read what the start said of it (`docker logs NAME 2>&1 | grep -i prefix`), drop the flag that turned it off "
        "(e.g. --kv-cache-dtype fp8 where the log says so) or set --enable-prefix-caching, and keep the top of the "
        "prompt the same from request to request (no id or time in the system prompt)",
)
def test_a_prompt_sent_again_is_served_from_the_prefix_cache(check, server, recipe, endpoint, record_property):
    """A long prompt sent again MUST have at least half its tokens served from the prefix cache, unless the recipe
    turns prefix caching off."""
    if recipe.arg("--no-enable-prefix-caching") is not None:
        check.cannot_run(f"recipe {recipe.name} turns prefix caching off (--no-enable-prefix-caching)",
                         "a recipe that keeps it on (vLLM's default)")
    body = chat_body(server.served_name, "What colour is the door?", max_tokens=1)  # the prefill is what is judged
    body["messages"].insert(0, {"role": "system", "content": f"Session {uuid.uuid4().hex}.\n{NOTES}"})
    try:
        endpoint.chat(body, label="the first send")
        before = metrics.scrape(server.base_url, server.served_name, server.headers)
        again = endpoint.chat(body, label="the same request again")
        hits = metrics.delta(before, metrics.scrape(server.base_url, server.served_name, server.headers))
    except metrics.MetricsUnavailable as exc:
        check.cannot_run(f"how much of the prompt came from the prefix cache cannot be told: {exc}",
                         "serve with vLLM (its /metrics count prefix-cache hits)")
    if metrics.PREFIX_CACHE_HITS not in hits:
        check.cannot_run(f"the server's /metrics has no {metrics.PREFIX_CACHE_HITS}", "serve with vLLM")
    cached, prompt = hits[metrics.PREFIX_CACHE_HITS], (again.get("usage") or {}).get("prompt_tokens") or 0
    record_property("prefix cache", f"{cached:.0f} of the repeat's {prompt} prompt tokens from the cache")
    check.that(prompt > 0 and cached >= prompt / 2,
               expected=f"at least half of the repeated prompt's {prompt or '?'} tokens from the prefix cache",
               found=f"{cached:.0f} ({metrics.PREFIX_CACHE_HITS} +{cached:.0f} over the repeat)")


@pytest.mark.check("SERVE-CONCURRENT", why="every seat of --max-num-seqs is a user: a batch that corrupts one "
                   "sequence hands one user garbage while the others look fine", fix=sanity.FIX)
def test_a_full_batch_of_concurrent_requests_all_answer_clean_and_right(check, server, recipe, endpoint):
    """As many concurrent requests as --max-num-seqs MUST all come back clean and with the known answer."""
    n = recipe.max_num_seqs
    probes = [COHERENCE[i % len(COHERENCE)] for i in range(n)]
    bodies = [chat_body(server.served_name, p.prompt, max_tokens=24) for p in probes]
    with ThreadPoolExecutor(max_workers=n) as pool:
        responses = list(pool.map(endpoint.post, bodies))
    wrong = []
    for i, (probe, body, response) in enumerate(zip(probes, bodies, responses, strict=True)):
        if response.status_code != 200:
            wrong.append(f"request {i}: HTTP {response.status_code}: {response.text[:120]!r}")
            continue
        message = endpoint.answer(response, body, label=f"concurrent request {i} of {n}")["choices"][0]["message"]
        if not probe.answered(message.get("content") or ""):
            wrong.append(f"request {i}: {probe.prompt!r} -> {message.get('content')!r}")
    check.that(not wrong, expected=f"{n} of {n} concurrent requests answered right",
               found=f"{len(wrong)} wrong: " + "; ".join(wrong))
