"""One definition of speed, everywhere: per-request timings of streamed chat completions.

Per request: monotonic timestamps when the request was sent, the first SSE event arrived, the first token
(content, reasoning or tool-call delta) arrived, and the last token arrived; N is the server's own count
(usage.completion_tokens). Decode rate = (N - 1) / (t_last - t_first_token); TTFT = t_first_token - t_sent.
These are the definitions of llama-benchy and `vllm bench serve`, so figures compare.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import httpx
from httpx_sse import aconnect_sse
from pydantic import BaseModel, Field

METHOD = "sparkgate.stream/1: decode=(N-1)/(t_last-t_first_token), TTFT=t_first_token-t_sent, N=usage"


class RequestRecord(BaseModel):
    t_sent: float
    t_first_event: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""
    reasoning: str = ""

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
    def prefill_tok_s(self) -> float | None:
        ttft = self.ttft_s
        return self.prompt_tokens / ttft if self.prompt_tokens and ttft else None


class Figure(BaseModel):
    """A measured quantity with everything needed to compare it: n, mean, std, raw values, shape, method."""

    name: str
    unit: str
    n: int
    mean: float
    std: float = Field(description="sample standard deviation (n-1); 0 when n == 1")
    raw: list[float]
    shape: dict[str, Any]
    method: str = METHOD

    @classmethod
    def of(cls, name: str, unit: str, values: list[float], shape: dict[str, Any]) -> Figure:
        if not values:
            raise ValueError(f"no values to make {name} from")
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(name=name, unit=unit, n=len(values), mean=statistics.fmean(values), std=std,
                   raw=values, shape=shape)

    def __str__(self) -> str:
        return f"{self.name} {self.mean:.2f} +/- {self.std:.2f} {self.unit} (n={self.n}, sample std)"


def _delta_has_token(delta: dict[str, Any]) -> tuple[bool, str, str]:
    content = delta.get("content") or ""
    reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
    return bool(content or reasoning or delta.get("tool_calls")), content, reasoning


async def stream_chat(client: httpx.AsyncClient, base_url: str, body: dict[str, Any]) -> RequestRecord:
    """Send one streamed chat completion and time it. Raises httpx.HTTPStatusError on a non-2xx answer."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    record = RequestRecord(t_sent=time.monotonic())
    async with aconnect_sse(client, "POST", f"{base_url}/v1/chat/completions", json=body) as source:
        if source.response.status_code >= 400:
            await source.response.aread()
            source.response.raise_for_status()
        async for event in source.aiter_sse():
            now = time.monotonic()
            if record.t_first_event is None:
                record.t_first_event = now
            if event.data == "[DONE]":
                break
            chunk = json.loads(event.data)
            if usage := chunk.get("usage"):
                record.prompt_tokens = usage.get("prompt_tokens")
                record.completion_tokens = usage.get("completion_tokens")
            for choice in chunk.get("choices") or []:
                has_token, content, reasoning = _delta_has_token(choice.get("delta") or {})
                if has_token:
                    record.t_first_token = record.t_first_token or now
                    record.t_last_token = now
                record.text += content
                record.reasoning += reasoning
                record.finish_reason = choice.get("finish_reason") or record.finish_reason
    return record
