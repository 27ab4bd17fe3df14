"""The client's count against the server's own (/metrics): the instrument is checked on every run."""

import asyncio

import pytest

from sparkgate import metrics
from sparkgate.measure import Figure, burst
from sparkgate.workloads import PROSE, chat

_COUNTED: dict[str, tuple] = {}  # per recipe: the three checks read the same requests
MAX_TOKENS = 128  # at --level standard; a level sets its share


@pytest.fixture
def counted(server, target, recipe, completed, check, level, progress):
    """A few streamed requests (--level sets how many) and the /metrics delta around them; could not run without
    /metrics."""
    if recipe.name not in _COUNTED:
        try:
            before = metrics.scrape(server.base_url, server.served_name, server.headers)
            steps, records, max_tokens = progress(level.counted_requests), [], level.tokens(MAX_TOKENS)
            for i in range(level.counted_requests):
                steps(f"request {i + 1} of {level.counted_requests}, counted against /metrics")
                records += asyncio.run(burst(target, [chat(recipe, PROSE[i % len(PROSE)], max_tokens)]))
            after = metrics.scrape(server.base_url, server.served_name, server.headers)
            _COUNTED[recipe.name] = records, metrics.delta(before, after), None, max_tokens
        except metrics.MetricsUnavailable as exc:
            _COUNTED[recipe.name] = [], {}, str(exc), None
    records, d, unavailable, max_tokens = _COUNTED[recipe.name]
    if unavailable:
        check.cannot_run(unavailable, "serve with vLLM, or enable the server's Prometheus endpoint")
    return completed(records), d, max_tokens


@pytest.mark.check(
    "PERF-SERVER-TOKENS",
    why="every figure divides by the token count; if the client's and the server's counts disagree, the "
        "figures are wrong (or another client shares the server during the run)",
    fix="run on a server no one else is using; if it persists, compare usage.completion_tokens with the "
        "server log's per-request counts",
)
def test_the_servers_token_counter_agrees_with_the_client(check, counted):
    """The server's generation-token counter MUST grow by exactly the tokens the client was sent."""
    records, d, _ = counted
    client = sum(r.completion_tokens or 0 for r in records)
    print(f"[{check.id}]: client counted {client} tokens in {len(records)} requests, the server's counter grew "
          f"by {d.get(metrics.GENERATION_TOKENS, 'nothing (absent)')}")
    check.that(d.get(metrics.GENERATION_TOKENS) == client, expected=f"{metrics.GENERATION_TOKENS} +{client}",
               found=f"+{d.get(metrics.GENERATION_TOKENS, 'absent'):g}" if metrics.GENERATION_TOKENS in d
               else "no such metric on /metrics")


@pytest.mark.check(
    "PERF-SERVER-ITL",
    why="the server's inter-token latency and the client's decode rate time the same thing; a gap means "
        "the client (or the network between) distorts the figures",
    fix="measure from a machine closer to the server, or with fewer concurrent clients",
)
def test_the_servers_inter_token_latency_agrees_with_the_client(check, counted, record):
    """The server's mean inter-token latency MUST be within 25% of the client's."""
    records, d, max_tokens = counted
    if not d.get(metrics.ITL_COUNT):
        check.cannot_run(f"no {metrics.ITL_COUNT} on /metrics")
    # The server observes inter-token latency once per engine step, and a step can emit several tokens
    # (speculative decoding): per request its sum is t_last - t_first, so divide by tokens, not steps.
    server_itl = d[metrics.ITL_SUM] / (d[metrics.GENERATION_TOKENS] - len(records))
    spans = [r.t_last_token - r.t_first_token for r in records]
    client_itl = sum(spans) / sum((r.completion_tokens or 1) - 1 for r in records)
    shape = {"prompt": "short prose", "max_tokens": max_tokens, "requests": len(records)}
    record(Figure.of("inter-token latency, client", "ms", [client_itl * 1000], shape))
    record(Figure.of("inter-token latency, server (/metrics)", "ms", [server_itl * 1000], shape))
    check.that(abs(server_itl - client_itl) <= 0.25 * server_itl,
               expected=f"client within 25% of the server's {server_itl * 1000:.2f} ms",
               found=f"client {client_itl * 1000:.2f} ms")


@pytest.mark.check(
    "PERF-SPEC-ACCEPT",
    why="MTP is only speed when drafts are accepted: none drafted means speculative decoding is silently off (the "
        "guide: MTP works only with the checkpoint's model_mtp.safetensors), and a low rate turns it into overhead",
    fix="no drafts counted: check that the checkpoint carries its MTP heads (model_mtp.safetensors beside "
        "model.safetensors: re-run the model's download) and that --speculative-config reached the server (CONT-ARGS); "
        "a low rate: restart the server (acceptance is set per launch), and compare natural and forced shapes: forced "
        "length (ignore_eos) depresses acceptance",
)
def test_speculative_decoding_accepts_drafts(check, recipe, counted, record):
    """With MTP speculative decoding declared, the server MUST draft and accept tokens, at the recipe's floor
    where one is published."""
    if not recipe.features.mtp:
        check.cannot_run(f"recipe {recipe.name} does not use speculative decoding")
    records, d, max_tokens = counted
    drafts, accepted = d.get(metrics.SPEC_DRAFT, 0), d.get(metrics.SPEC_ACCEPTED, 0)
    shape = {"prompt": "short prose", "max_tokens": max_tokens, "ignore_eos": False, "requests": len(records)}
    check.that(drafts > 0 and accepted > 0,
               expected=f"{metrics.SPEC_DRAFT} and {metrics.SPEC_ACCEPTED} grow (MTP declared: features.mtp)",
               found=f"{drafts:g} draft tokens, {accepted:g} accepted over {shape['requests']} requests on "
                     f"{recipe.name}: " + ("speculative decoding is not running" if not drafts
                                           else "every draft was rejected"))
    rate = accepted / drafts
    record(Figure.of("draft acceptance rate", "ratio", [rate], shape), "spec_acceptance")
    floor = recipe.floors.get("spec_acceptance")
    if floor is None:
        check.cannot_run(f"recipe {recipe.name} declares no spec_acceptance floor (rate {rate:.2f} recorded; the "
                         f"guide publishes none)", "add floors.spec_acceptance from a published rate")
    check.that(rate >= floor.min, expected=floor.expected(" of draft tokens accepted"),
               found=f"{rate:.2f} ({accepted:g} of {drafts:g} draft tokens) on {recipe.name}, shape {shape}")
