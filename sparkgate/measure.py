"""One definition of speed, everywhere: per-request timings of streamed chat completions.

Per request: monotonic timestamps when the request was sent, the first SSE event arrived, the first token
(content, reasoning or tool-call delta) arrived, and the last token arrived; N is the server's own count
(usage.completion_tokens). Decode rate = (N - 1) / (t_last - t_first_token); TTFT = t_first_token - t_sent.
These are the definitions of llama-benchy and `vllm bench serve`, so figures compare.

A server whose stream carries no usage chunk (llama.cpp's, some proxies) has its tokens counted with the model's
tokenizer instead, as llama-benchy does; a figure built on such counts says so in its method.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from httpx_sse import SSEError, aconnect_sse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .httpclient import limits
from .stream import Assembled, StreamError

METHOD = "sparkgate.stream/1: decode=(N-1)/(t_last-t_first_token), TTFT=t_first_token-t_sent, N=usage"
METHOD_TOKENIZER = ("sparkgate.stream/1: decode=(N-1)/(t_last-t_first_token), TTFT=t_first_token-t_sent, "
                    "N=the model's tokenizer (the stream carries no usage)")
DEADLINE_S = 900  # no request may take longer in all (a trickling server holds a check no longer than this)


@dataclass
class Target:
    """Where requests go, and how their tokens are counted when the stream does not say."""

    base_url: str
    headers: dict[str, str] = field(default_factory=dict)
    count_tokens: Callable[[str], int] | None = None  # the model's tokenizer, for streams without usage


def target_of(where: Target | str) -> Target:
    return where if isinstance(where, Target) else Target(where)


class RequestRecord(BaseModel):
    t_sent: float
    t_first_event: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    counted_by: str = Field("usage", description="usage: the server's count; tokenizer: counted here")
    finish_reason: str | None = None
    text: str = ""
    reasoning: str = ""
    error: str | None = Field(None, description="why the request did not complete; None: it did")
    cut: bool = Field(False, description="still running at the end of a sustained window: timed on its tokens so far")

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first_token is None else self.t_first_token - self.t_sent

    @property
    def decode_tok_s(self) -> float | None:
        """None when there is nothing to time: fewer than two tokens, or all arrived in one event."""
        n = self.completion_tokens
        if not n or n < 2 or self.t_first_token is None or self.t_last_token is None:
            return None
        span = self.t_last_token - self.t_first_token
        return (n - 1) / span if span > 0 else None

    @property
    def itl_ms(self) -> float | None:
        """Mean inter-token latency: the time between tokens once the first has come (1000 / decode)."""
        rate = self.decode_tok_s
        return 1000 / rate if rate else None

    @property
    def prefill_tok_s(self) -> float | None:
        ttft = self.ttft_s
        return self.prompt_tokens / ttft if self.prompt_tokens and ttft else None


def method_of(records: list[RequestRecord]) -> str:
    """The method a figure over `records` was measured with: whose token count it divides by."""
    return METHOD_TOKENIZER if any(r.counted_by == "tokenizer" for r in records) else METHOD


class Shape(BaseModel):
    """What was sent, as typed fields: two figures compare only when their shapes are equal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = Field(description="the prompt class (short prose and code, filler, ...)")
    prompt_tokens: int | None = Field(None, description="prompt length in tokens, where it was sized")
    max_tokens: int | None = None
    min_tokens: int | None = Field(None, description="forced length (with ignore_eos)")
    ignore_eos: bool = False
    concurrency: int = 1
    cache: Literal["cold", "warm", "defeated"] | None = Field(None, description="prefix cache state of the prompt")
    thinking: Literal["on", "off"] | None = None
    temperature: float | None = None
    duration_s: float | None = Field(None, description="closed-loop load: how long it was held")
    requests: int | None = Field(None, description="how many requests a single-valued figure summarises")

    def key(self) -> str:
        """A stable text of the shape, for matching figures across files."""
        return self.model_dump_json(exclude_none=True)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


class Figure(BaseModel):
    """A measured quantity with everything needed to compare it: n, mean, std, percentiles, raw values, shape,
    method."""

    # Read from contributors' files too: nothing that cannot be true (non-finite numbers, an n or a mean that
    # disagrees with the raw values) is a figure.
    model_config = ConfigDict(allow_inf_nan=False)

    name: str
    unit: str
    n: int = Field(ge=1)
    mean: float
    std: float = Field(description="sample standard deviation (n-1); 0 when n == 1")
    p50: float
    p90: float
    p99: float
    raw: list[float]
    shape: Shape
    method: str = METHOD
    roofline: float | None = Field(None, description="decode ceiling of the profile, same unit; None: unknown")

    @model_validator(mode="after")
    def _consistent_with_its_raw_values(self) -> Figure:
        if len(self.raw) != self.n:
            raise ValueError(f"n is {self.n} and there are {len(self.raw)} raw values")
        try:
            std = statistics.stdev(self.raw) if self.n > 1 else 0.0
            mean = statistics.fmean(self.raw)
        except ArithmeticError as exc:  # finite values whose sum is not (1e308 twice)
            raise ValueError(f"its raw values have no mean or std: {exc}") from None
        for what, stated, actual in (("mean", self.mean, mean), ("std", self.std, std)):
            if not math.isclose(stated, actual, rel_tol=1e-6, abs_tol=1e-9):
                raise ValueError(f"{what} is {stated:g}, and its raw values give {actual:g}")
        return self

    @property
    def roofline_share(self) -> float | None:
        return self.mean / self.roofline if self.roofline else None

    @property
    def higher_is_better(self) -> bool:
        """Speeds and rates rise when things improve; times (s, ms) fall."""
        return self.unit not in ("s", "ms")

    @classmethod
    def of(cls, name: str, unit: str, values: list[float], shape: Shape | dict[str, Any],
           roofline: float | None = None, method: str = METHOD) -> Figure:
        if not values:
            raise ValueError(f"no values to make {name} from")
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(name=name, unit=unit, n=len(values), mean=statistics.fmean(values), std=std,
                   p50=percentile(values, 50), p90=percentile(values, 90), p99=percentile(values, 99),
                   raw=values, shape=Shape.model_validate(shape), roofline=roofline, method=method)

    def __str__(self) -> str:
        text = f"{self.name} {self.mean:.2f} +/- {self.std:.2f} {self.unit} (n={self.n}, sample std)"
        if self.roofline_share is not None:
            text += f", {self.roofline_share:.0%} of the {self.roofline:.1f} {self.unit} roofline"
        return text


def roofline_tok_s(bandwidth_gbs: float | None, active_params_b: float, bytes_per_param: float) -> float | None:
    """Decode ceiling of a memory-bound model: every active weight is read once per token. Speculative
    decoding can exceed it (several tokens per read); nothing else can."""
    if not bandwidth_gbs:
        return None
    return bandwidth_gbs * 1e9 / (active_params_b * 1e9 * bytes_per_param)


def local_copy_bandwidth_gbs(mib: int = 256, rounds: int = 5) -> float | None:
    """This machine's memory bandwidth, measured: the best of `rounds` copies of a `mib` MiB array, bytes
    read plus bytes written per second (STREAM's copy). None without numpy. For profiles that publish none
    (the CPU profile is any machine), so a CPU box still shows decode against a ceiling."""
    try:
        import numpy as np
    except ImportError:
        return None
    src = np.ones(mib * 2**20 // 8)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(rounds))
    return 2 * src.nbytes / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def aggregate_tok_s(records: list[RequestRecord]) -> float:
    """Tokens of all requests over the wall span from the first send to the last token: a capacity figure,
    never a speed (it is N requests' tokens summed)."""
    span = max(r.t_last_token or r.t_sent for r in records) - min(r.t_sent for r in records)
    return sum(r.completion_tokens or 0 for r in records) / span if span > 0 else 0.0


async def burst(where: Target | str, bodies: list[dict[str, Any]], deadline_s: float = DEADLINE_S
                ) -> list[RequestRecord]:
    """Send all bodies at once, each on its own connection, and time each."""
    target = target_of(where)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=30), headers=target.headers,
                                 limits=limits(len(bodies))) as client:
        return list(await asyncio.gather(*(stream_chat(client, target, b, deadline_s) for b in bodies)))


async def closed_loop(where: Target | str, make_body: Callable[[int], dict[str, Any]], streams: int,
                      duration_s: float, deadline_s: float = DEADLINE_S) -> list[RequestRecord]:
    """Keep `streams` requests in flight for `duration_s`; each stream sends its next request as soon as the last
    one ends. At the end of the window every request still running is cut (`cut`), timed on the tokens it had by
    then (vLLM's continuous usage stats count them): what would run after it, fewer and fewer streams draining, is
    not sustained load, and it took longer than the window itself."""
    target = target_of(where)
    deadline = time.monotonic() + duration_s
    records: list[RequestRecord] = []

    async def stream(client: httpx.AsyncClient, k: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            body = make_body(k + i * streams)
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
            records.append(record := RequestRecord(t_sent=time.monotonic()))
            await stream_chat(client, target, body, deadline_s, record)
            i += 1

    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=30), headers=target.headers,
                                 limits=limits(streams)) as client:
        tasks = [asyncio.create_task(stream(client, k)) for k in range(streams)]
        _, running = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        for task in running:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    for record in records:
        record.cut = record.finish_reason is None and record.error is None
    return records


async def stream_chat(client: httpx.AsyncClient, where: Target | str, body: dict[str, Any],
                      deadline_s: float = DEADLINE_S, record: RequestRecord | None = None) -> RequestRecord:
    """Send one streamed chat completion and time it (into `record`, which holds what came if the request is
    cancelled). A request that fails (an HTTP error status, an error event, a malformed stream, a dropped
    connection, the total deadline) comes back with `error` set: never timed, never lost."""
    target = target_of(where)
    record = record or RequestRecord(t_sent=time.monotonic())
    out = Assembled()
    try:
        await asyncio.wait_for(_stream_into(record, out, client, target, body), deadline_s)
    except httpx.HTTPStatusError as exc:
        record.error = f"HTTP {exc.response.status_code}: {exc.response.text[:300]}"
    except (StreamError, SSEError) as exc:
        record.error = f"a malformed stream: {exc}"
    except TimeoutError:
        record.error = f"no complete answer within {deadline_s:.0f} s (the total deadline per request)"
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc} (after {len(out.events)} events)"
    record.text, record.reasoning = out.content, out.reasoning
    if record.error is None and out.error is not None:
        record.error = f"error event in the stream: {str(out.error)[:300]}"
    if record.error is None and record.completion_tokens is None:
        try:
            if target.count_tokens is None:
                raise LookupError("no tokenizer is at hand to count its tokens")
            record.completion_tokens = target.count_tokens(out.generated_text)
            record.counted_by = "tokenizer"
        except LookupError as exc:
            record.error = f"the stream ended without a usage chunk, and {exc}"
    return record


async def _stream_into(record: RequestRecord, out: Assembled, client: httpx.AsyncClient, target: Target,
                       body: dict[str, Any]) -> None:
    body = {**body, "stream": True, "stream_options": {"include_usage": True, **body.get("stream_options", {})}}
    async with aconnect_sse(client, "POST", f"{target.base_url}/v1/chat/completions", json=body) as source:
        if source.response.status_code >= 400:
            await source.response.aread()
            source.response.raise_for_status()
        async for event in source.aiter_sse():
            now = time.monotonic()
            if record.t_first_event is None:
                record.t_first_event = now
            if out.feed(event.data):
                record.t_first_token = record.t_first_token or now
                record.t_last_token = now
            if out.usage:
                record.prompt_tokens = out.usage.get("prompt_tokens")
                record.completion_tokens = out.usage.get("completion_tokens")
            record.finish_reason = out.finish_reason
            if out.done or out.error is not None:
                return
