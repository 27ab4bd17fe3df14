"""The client's count against the server's own (/metrics): the instrument is checked on every run."""

import asyncio
from typing import NamedTuple

import pytest

from sparkgate import metrics
from sparkgate.measure import Figure, RequestRecord, burst
from sparkgate.workloads import PROSE, chat

MAX_TOKENS = 128  # at --level standard; a level sets its share


class Counted(NamedTuple):
    records: list[RequestRecord]  # one at a time
    delta: dict[str, float]  # /metrics around them
    max_tokens: int
    burst: list[RequestRecord]  # then --max-num-seqs at once, 16 at most
    burst_delta: dict[str, float]


_COUNTED: dict[str, Counted | str] = {}  # per recipe: the three checks read the same requests; or why they cannot


@pytest.fixture
def counted(server, target, recipe, completed, check, level, progress) -> Counted:
    """A few streamed requests one at a time (--level sets how many), then a burst of --max-num-seqs, each with the
    /metrics delta around it; could not run without /metrics."""
    if recipe.name not in _COUNTED:
        try:
            def scrape():
                return metrics.scrape(server.base_url, server.served_name, server.headers)

            # The guide confirmed its figures with vLLM's counters at 16 concurrent; a recipe that sets no
            # --max-num-seqs (vLLM's 256) is counted at that many.
            n, seats = level.counted_requests, min(recipe.max_num_seqs, 16)
            steps, records, max_tokens = progress(n + 1), [], level.tokens(MAX_TOKENS)
            before = scrape()
            for i in range(n):
                steps(f"request {i + 1} of {n}, counted against /metrics")
                records += asyncio.run(burst(target, [chat(recipe, PROSE[i % len(PROSE)], max_tokens)]))
            middle = scrape()
            steps(f"{seats} requests at once, counted against /metrics")
            at_once = asyncio.run(burst(target, [chat(recipe, PROSE[i % len(PROSE)], max_tokens)
                                                 for i in range(seats)]))
            _COUNTED[recipe.name] = Counted(records, metrics.delta(before, middle), max_tokens, at_once,
                                            metrics.delta(middle, scrape()))
        except metrics.MetricsUnavailable as exc:
            _COUNTED[recipe.name] = str(exc)
    counts = _COUNTED[recipe.name]
    if isinstance(counts, str):
        check.cannot_run(counts, "serve with vLLM, or enable the server's Prometheus endpoint")
    return counts._replace(records=completed(counts.records), burst=completed(counts.burst, "request at once"))


@pytest.mark.check(
    "PERF-SERVER-TOKENS",
    why="every figure divides by the token count; if the client's and the server's counts disagree, the "
        "figures are wrong (or another client shares the server during the run)",
    fix="run on a server no one else is using; if it persists, compare usage.completion_tokens with the "
        "server log's per-request counts",
)
def test_the_servers_token_counter_agrees_with_the_client(check, counted):
    """The server's token counter MUST grow by exactly the client's count, one at a time and --max-num-seqs at once."""
    rows, agree, at_once = [], True, len(counted.burst)
    for label, records, d in (("one at a time", counted.records, counted.delta),
                              (f"{at_once} at once", counted.burst, counted.burst_delta)):
        client = sum(r.completion_tokens or 0 for r in records)
        server = d.get(metrics.GENERATION_TOKENS)
        print(f"[{check.id}]: {label}: client counted {client} tokens in {len(records)} requests, the server's "
              f"counter grew by {'nothing (absent)' if server is None else f'{server:g}'}")
        agree = agree and server == client
        rows.append(f"{label}: client {client}, server " + ("no such metric on /metrics" if server is None
                                                              else f"+{server:g}"))
    check.that(agree, expected=f"{metrics.GENERATION_TOKENS} grows by exactly the client's count, one request at a "
                               f"time and {at_once} at once", found="; ".join(rows))


@pytest.mark.check(
    "PERF-SERVER-ITL",
    why="the server's inter-token latency and the client's decode rate time the same thing; a gap means "
        "the client (or the network between) distorts the figures",
    fix="measure from a machine closer to the server, or with fewer concurrent clients",
)
def test_the_servers_inter_token_latency_agrees_with_the_client(check, counted, record):
    """The server's mean inter-token latency MUST be within 25% of the client's."""
    records, d, max_tokens = counted.records, counted.delta, counted.max_tokens
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
    why="speculative decoding is only speed when drafts are accepted: none drafted means it is silently off (the "
        "guide: MTP works only with the checkpoint's model_mtp.safetensors), and a low rate turns it into overhead",
    fix="no drafts counted: check that --speculative-config reached the server (CONT-ARGS) and, for MTP, that the "
        "checkpoint carries its MTP heads (model_mtp.safetensors beside model.safetensors: re-run the model's "
        "download); a low rate: restart the server (acceptance is set per launch), and compare natural and forced "
        "shapes: forced length (ignore_eos) depresses acceptance",
)
def test_speculative_decoding_accepts_drafts(check, recipe, counted, record):
    """With speculative decoding declared (MTP, n-gram, a draft model), the server MUST draft and accept tokens, at
    the recipe's floor where one is published."""
    spec = recipe.args.speculative
    if spec is None and not recipe.features.mtp:
        check.cannot_run(f"recipe {recipe.name} does not use speculative decoding (no --speculative-config, "
                         "features.mtp false)")
    declared = f"--speculative-config method {spec.get('method', '?')}" if spec else "features.mtp"
    # Every request counted, one at a time and at once: acceptance varies from answer to answer.
    requests = len(counted.records) + len(counted.burst)
    drafts, accepted = (sum(d.get(key, 0) for d in (counted.delta, counted.burst_delta))
                        for key in (metrics.SPEC_DRAFT, metrics.SPEC_ACCEPTED))
    shape = {"prompt": "short prose", "max_tokens": counted.max_tokens, "ignore_eos": False, "requests": requests}
    where = f"over {requests} requests on {recipe.name}"
    check.that(drafts > 0, expected=f"{metrics.SPEC_DRAFT} grows (declared: {declared})",
               found=f"no draft tokens {where}: speculative decoding is not running")
    rate = accepted / drafts
    record(Figure.of("draft acceptance rate", "ratio", [rate], shape), "spec_acceptance")
    floor = recipe.floors.get("spec_acceptance")
    if floor is None:
        check.that(accepted > 0, expected=f"{metrics.SPEC_ACCEPTED} grows (declared: {declared})",
                   found=f"0 of {drafts:g} draft tokens accepted {where}: every draft was rejected")
        check.cannot_run(f"recipe {recipe.name} declares no spec_acceptance floor (rate {rate:.2f} recorded; the "
                         f"guide publishes none)", "add floors.spec_acceptance from a published rate")
    check.that(rate >= floor.min, expected=floor.expected(" of draft tokens accepted"),
               found=f"{rate:.2f} ({accepted:g} of {drafts:g} draft tokens) {where}, shape {shape}")
