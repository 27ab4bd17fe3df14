"""The endpoint answers the OpenAI-compatible API the way clients rely on."""

import json

import httpx
import pytest


@pytest.fixture
def api(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def chat_body(server, text, **extra):
    return {"model": server.served_name, "messages": [{"role": "user", "content": text}],
            "max_tokens": 32, "temperature": 0, **extra}


@pytest.mark.check(
    "SERVE-MODELS",
    why="clients address the model by this name; a different one makes every request a 404",
    fix="set --served-model-name in the recipe's serve args to the name clients use",
)
def test_the_served_name_is_listed(check, server, api):
    """GET /v1/models MUST list the recipe's served model name."""
    response = api.get("/v1/models")
    ids = [m["id"] for m in response.json().get("data", [])] if response.status_code == 200 else []
    check.that(server.served_name in ids, expected=f"{server.served_name!r} in /v1/models",
               found=ids or f"HTTP {response.status_code}: {response.text[:200]}")


@pytest.mark.check(
    "SERVE-CHAT",
    why="a chat completion without text or usage breaks every client and every token count",
    fix="read the server log for the failing request; check the chat template and the serve args",
)
def test_a_chat_completion_returns_text_and_usage(check, server, api):
    """A non-streamed chat completion MUST return non-empty text and a usage block."""
    response = api.post("/v1/chat/completions", json=chat_body(server, "Say hello in one short sentence."))
    body = response.json() if response.status_code == 200 else {}
    text = (body.get("choices") or [{}])[0].get("message", {}).get("content") or ""
    usage = body.get("usage") or {}
    check.that(bool(text.strip()) and usage.get("completion_tokens", 0) > 0,
               expected="HTTP 200 with message.content and usage.completion_tokens > 0",
               found=f"HTTP {response.status_code}, content {text[:80]!r}, usage {usage}"
               if response.status_code == 200 else f"HTTP {response.status_code}: {response.text[:300]}")


@pytest.mark.check(
    "SERVE-STREAM",
    why="streaming clients wait for [DONE] and read token counts from the usage chunk",
    fix="read the server log; a stream cut short is usually an engine error mid-generation",
)
def test_a_streamed_chat_completion_ends_with_done_and_usage(check, server, api):
    """A streamed chat completion MUST deliver text, a usage chunk and end with `data: [DONE]`."""
    body = chat_body(server, "Count from one to five.", stream=True, stream_options={"include_usage": True})
    events, text, usage = [], "", None
    with api.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    for data in events:
        if data != "[DONE]":
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            text += "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or [])
    ok = bool(events) and events[-1] == "[DONE]" and bool(text.strip()) and bool(usage)
    check.that(ok, expected="content deltas, then a usage chunk, then [DONE]",
               found=f"{len(events)} events, last {events[-1] if events else None!r}, text {text[:60]!r}, "
                     f"usage {usage}")
