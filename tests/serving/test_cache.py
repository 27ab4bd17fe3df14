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
NOTE = (  # about 62 tokens
    "Field notes from the lighthouse on Skerry Point, kept by the keeper for the relief crew. "
    f"The door of the lighthouse is painted {DOOR}. The lamp is lit at sunset and put out at sunrise. "
    "Fresh water comes by boat every second Tuesday. The radio is checked at noon every day. "
)
NOTES_UNITS, HYBRID_UNITS = 12, 160  # about 760 and 10,000 tokens
NOTES = NOTE * NOTES_UNITS
NO_COUNTER = (f"the server's /metrics has no {metrics.PREFIX_CACHE_HITS} or {metrics.PREFIX_CACHE_QUERIES} (vLLM "
              "started with --disable-log-stats publishes neither; other servers count no prefix cache)")
METRICS_FROM_VLLM = "vLLM's own /metrics, without --disable-log-stats"


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
    if unavailable or hits[1] is None:
        check.cannot_run(f"the answers agree, but whether the second came from the prefix cache cannot be told: "
                         f"{unavailable or NO_COUNTER}", METRICS_FROM_VLLM)
    if not hits[1]:
        check.cannot_run(f"the second send was not served from the prefix cache ({metrics.PREFIX_CACHE_HITS} "
                         f"+{hits[1]:.0f}), so the cached path was not exercised: SERVE-PREFIX-HITS says why",
                         "serve with prefix caching on (vLLM's default; not --no-enable-prefix-caching)")


@pytest.mark.check(
    "SERVE-PREFIX-HITS",
    why="a chat or an agent sends its whole history again every turn: with the prefix cache only the new turn is "
        "prefilled, without it every turn pays for all of it and the time to first token grows with the conversation; "
        "it can be lost with no error: an engine that turns the cache off for the model, or a gateway that writes a "
        "request id or the time at the top of the prompt",
    fix="read what the start said of prefix caching (`docker logs NAME 2>&1 | grep -i prefix`); where vLLM turned it "
        "off for this model, an image whose vLLM caches it, or take --enable-prefix-caching out of the recipe; where "
        "the prompt's top changes, keep it the same from request to request (no id or time in the system prompt)",
)
def test_a_prompt_sent_again_is_served_from_the_prefix_cache(check, server, recipe, endpoint, record_property):
    """A long prompt sent again MUST have at least half its tokens served from the prefix cache, unless the recipe
    turns prefix caching off."""
    if recipe.arg("--no-enable-prefix-caching") is not None:
        check.cannot_run(f"recipe {recipe.name} turns prefix caching off (--no-enable-prefix-caching)",
                         "a recipe that keeps it on (vLLM's default)")
    # The cache keeps whole blocks only: a hybrid model's attention block is hundreds to thousands of tokens (vLLM
    # sizes it to the Mamba state's page), so its prompt is long enough that blocks of up to ~5,000 still hold half.
    units = HYBRID_UNITS if recipe.model.gdn_hybrid else NOTES_UNITS
    body = chat_body(server.served_name, "What colour is the door?", max_tokens=1)  # the prefill is what is judged
    body["messages"].insert(0, {"role": "system", "content": f"Session {uuid.uuid4().hex}.\n{NOTE * units}"})
    try:
        endpoint.chat(body, label="the first send")
        before = metrics.scrape(server.base_url, server.served_name, server.headers)
        again = endpoint.chat(body, label="the same request again")
        counted = metrics.delta(before, metrics.scrape(server.base_url, server.served_name, server.headers))
    except metrics.MetricsUnavailable as exc:
        check.cannot_run(f"how much of the prompt came from the prefix cache cannot be told: {exc}", METRICS_FROM_VLLM)
    hits, queried = counted.get(metrics.PREFIX_CACHE_HITS), counted.get(metrics.PREFIX_CACHE_QUERIES)
    prompt = (again.get("usage") or {}).get("prompt_tokens")
    if hits is None or queried is None:
        check.cannot_run(f"how much of the prompt came from the prefix cache cannot be told: {NO_COUNTER}",
                         METRICS_FROM_VLLM)
    if not isinstance(prompt, int) or prompt <= 0:
        check.cannot_run("the answer to the repeat states no usage.prompt_tokens to judge the cache's share against")
    record_property("prefix cache", f"{hits:.0f} of the repeat's {prompt} prompt tokens from the cache")
    if queried == 0:  # the engine looked nothing up: its cache is off
        explicit = recipe.arg("--enable-prefix-caching") is not None
        found = f"the engine's prefix cache is off ({metrics.PREFIX_CACHE_QUERIES} +0 over the repeat)"
        if not explicit:
            check.cannot_run(f"{found}, and recipe {recipe.name} does not ask for it",
                             "--enable-prefix-caching in the recipe, to hold the server to it")
        check.that(False, expected="the prefix cache the recipe asks for (--enable-prefix-caching) on", found=found)
    if hits < 0 or queried < 0:
        check.cannot_run("the server's counters went back between two reads: it restarted during the repeat")
    if queried != prompt:
        check.cannot_run(f"other requests reached the engine during the repeat (its counters moved by {queried:.0f} "
                         f"queried tokens, the repeat has {prompt}): its cache hits are not the repeat's alone",
                         "a server no other client uses while the suite runs")
    check.that(hits >= prompt / 2,
               expected=f"at least half of the repeated prompt's {prompt} tokens from the prefix cache",
               found=f"{hits:.0f} of them, all {queried:.0f} looked up ({metrics.PREFIX_CACHE_HITS} +{hits:.0f}, "
                     f"{metrics.PREFIX_CACHE_QUERIES} +{queried:.0f})")


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
