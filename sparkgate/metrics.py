"""The server's own count, from its Prometheus /metrics: what the client measured is cross-checked against it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Current vLLM names (the old vllm:time_per_output_token_seconds is deprecated and hidden in recent versions).
GENERATION_TOKENS = "vllm:generation_tokens_total"
ITL_SUM, ITL_COUNT = "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"  # prompt tokens served from the prefix cache
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"  # prompt tokens looked up in it (none: the cache is off)
SPEC_ACCEPTED, SPEC_DRAFT = "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"


class MetricsUnavailable(Exception):
    """The server publishes no Prometheus /metrics (or not in the exposition format): checks that read it
    could not run."""


def scrape(base_url: str, model: str | None = None, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Every sample of /metrics, summed over labels (only the given model's, when it is labelled)."""
    try:
        response = httpx.get(f"{base_url}/metrics", timeout=30, headers=headers)
    except httpx.HTTPError as exc:
        raise MetricsUnavailable(f"GET /metrics failed: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise MetricsUnavailable(f"GET /metrics answers HTTP {response.status_code}: the server publishes no "
                                 "Prometheus metrics (vLLM always does; llama.cpp's server needs --metrics)")
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if model and sample.labels.get("model_name", model) != model:
                    continue
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError as exc:
        raise MetricsUnavailable(f"GET /metrics is not in the Prometheus text format: {exc}") from None
    return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}
