"""One reader of chat completion streams: server-sent events (read with httpx-sse) assembled as a client would.

Used by the serving checks (to judge the answer) and by the measurement (to time it), so both read a stream the
same way. An event that is not a JSON object is a malformed stream, reported as such, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .sanity import REASONING_FIELDS


class StreamError(Exception):
    """The server sent something that is not a chat completion stream; the message says what."""


def chunk_of(data: str) -> dict[str, Any]:
    """One `data:` payload as a JSON object, or StreamError quoting what came instead."""
    try:
        chunk = json.loads(data)
    except ValueError:
        raise StreamError(f"an event that is not JSON: {data[:200]!r}") from None
    if not isinstance(chunk, dict):
        raise StreamError(f"an event that is not a JSON object ({type(chunk).__name__}): {data[:200]!r}")
    return chunk


@dataclass
class Assembled:
    """A streamed chat completion, put together: the text, the thinking, the tool calls, the usage."""

    events: list[str] = field(default_factory=list)  # every `data:` payload, in order
    content: str = ""
    reasoning: str = ""
    reasoning_key: str | None = None
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: Any = None  # an error event the server sent mid-stream

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"

    @property
    def message(self) -> dict[str, Any]:
        return {"content": self.content, self.reasoning_key or "reasoning": self.reasoning,
                "tool_calls": [self.tool_calls[i] for i in sorted(self.tool_calls)]}

    @property
    def generated_text(self) -> str:
        """Everything the model generated (for counting tokens where the server sends no usage)."""
        calls = "".join(c["function"]["name"] + c["function"]["arguments"] for c in self.tool_calls.values())
        return self.reasoning + self.content + calls

    def feed(self, data: str) -> bool:
        """Take one `data:` payload; True when it carried a generated token (content, thinking or a tool call)."""
        self.events.append(data)
        if data == "[DONE]":
            return False
        chunk = chunk_of(data)
        self.error = chunk.get("error") or self.error
        self.usage = chunk.get("usage") or self.usage
        token = False
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                raise StreamError(f"a choice that is not a JSON object: {data[:200]!r}")
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content += delta["content"]
                token = True
            for key in REASONING_FIELDS:
                if delta.get(key):
                    self.reasoning += delta[key]
                    self.reasoning_key = key
                    token = True
            # Tool-call deltas: the first of an index carries id and name, later ones argument fragments.
            for part in delta.get("tool_calls") or []:
                call = self.tool_calls.setdefault(part.get("index", 0), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = part.get("id") or call["id"]
                fn = part.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
                token = True
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return token


def assembled(raw: bytes) -> Assembled:
    """A whole event stream received as bytes (what a proxy forwarded), read with httpx-sse and assembled."""
    from httpx import Response
    from httpx_sse import EventSource

    out = Assembled()
    for event in EventSource(Response(200, headers={"content-type": "text/event-stream"}, content=raw)).iter_sse():
        out.feed(event.data)
    return out
