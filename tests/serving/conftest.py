"""How the serving checks talk to the endpoint: one client, and every answer through the sanity detector.

`endpoint.chat(body)` and `endpoint.stream(body)` fail the running check, with its own ID, on a transport
failure (hang, dropped connection), on an unexpected status and on garbage in the answer; they return the
parsed answer otherwise. `endpoint.post(...)` is the raw form for checks that judge the status themselves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkgate import sanity

REPRO_DIR = Path(__file__).resolve().parent.parent / "data" / "repro"
TIMEOUT_S = 300  # a 2-core CPU box answers a long prompt in tens of seconds; a hang is longer than this


@dataclass
class Streamed:
    """A streamed chat completion, assembled as a client would."""

    events: list[str] = field(default_factory=list)
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

    def add(self, chunk: dict[str, Any]) -> None:
        self.error = chunk.get("error") or self.error
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            self.content += delta.get("content") or ""
            for key in sanity.REASONING_FIELDS:
                if delta.get(key):
                    self.reasoning += delta[key]
                    self.reasoning_key = key
            # Tool-call deltas: the first of an index carries id and name, later ones argument fragments.
            for part in delta.get("tool_calls") or []:
                call = self.tool_calls.setdefault(part.get("index", 0), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = part.get("id") or call["id"]
                fn = part.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason


def short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return repr(text[:limit]) + (f" (+{len(text) - limit} chars)" if len(text) > limit else "")


class Endpoint:
    """The server under test, as one check talks to it."""

    def __init__(self, server: Any, check: Any, client: httpx.Client) -> None:
        self.server, self.check, self.client = server, check, client
        self.model = server.served_name

    def post(self, body: Any = None, *, path: str = "/v1/chat/completions", content: bytes | None = None,
             timeout: float = TIMEOUT_S) -> httpx.Response:
        """POST and return the response whatever its status; a hang or a dropped connection fails."""
        __tracebackhide__ = True
        try:
            if content is not None:
                return self.client.post(path, content=content, headers={"content-type": "application/json"},
                                        timeout=timeout)
            return self.client.post(path, json=body, timeout=timeout)
        except httpx.TimeoutException:
            self.check.that(False, expected=f"an answer to POST {path} within {timeout:.0f} s",
                            found=f"no answer after {timeout:.0f} s: the server hangs on this request",
                            fix="read the server log for the request; a hang on one request shape is an "
                                "engine defect: report it with the body (tests/data/repro)")
        except httpx.TransportError as exc:
            self.check.that(False, expected=f"an HTTP answer to POST {path}",
                            found=f"{type(exc).__name__}: {exc} (the connection dropped: did the server crash?)",
                            fix="read the server log: a dropped connection is usually an engine crash")
        raise AssertionError("unreachable")

    def chat(self, body: dict[str, Any], label: str = "", timeout: float = TIMEOUT_S) -> dict[str, Any]:
        """A non-streamed chat completion that must answer 200; its message must be clean."""
        __tracebackhide__ = True
        return self.answer(self.post(body, timeout=timeout), body, label)

    def answer(self, response: httpx.Response, body: dict[str, Any], label: str = "") -> dict[str, Any]:
        """Judge a chat completion already received: HTTP 200 with a choice, and a clean message."""
        __tracebackhide__ = True
        data: dict[str, Any] = {}
        if response.status_code == 200:
            try:
                data = response.json()
            except ValueError:
                data = {}
        self.check.that(bool(data.get("choices")), expected=f"HTTP 200 with a choice{label and ' for ' + label}",
                        found=f"HTTP {response.status_code}: {short(response.text)}")
        self.clean(data["choices"][0].get("message") or {}, body, label)
        return data

    def stream(self, body: dict[str, Any], label: str = "", timeout: float = TIMEOUT_S) -> Streamed:
        """A streamed chat completion (with the usage chunk), assembled; it must be clean."""
        __tracebackhide__ = True
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        out = Streamed()
        try:
            with self.client.stream("POST", "/v1/chat/completions", json=body, timeout=timeout) as response:
                if response.status_code != 200:
                    response.read()
                    self.check.that(False, expected=f"HTTP 200 and an event stream{label and ' for ' + label}",
                                    found=f"HTTP {response.status_code}: {short(response.text)}")
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        out.events.append(line[6:])
                        if line[6:] != "[DONE]":
                            out.add(json.loads(line[6:]))
        except httpx.TimeoutException:
            self.check.that(False, expected=f"a complete stream within {timeout:.0f} s",
                            found=f"{len(out.events)} events, then nothing: the stream hangs")
        except httpx.TransportError as exc:
            self.check.that(False, expected="a stream that ends with data: [DONE]",
                            found=f"{len(out.events)} events, then {type(exc).__name__}: {exc} "
                                  f"(the connection dropped: did the server crash?)")
        self.check.that(out.error is None, expected="a stream without error events",
                        found=f"the server sent an error mid-stream: {short(out.error)}")
        self.clean(out.message, body, label)
        return out

    def clean(self, message: dict[str, Any], body: dict[str, Any], label: str = "") -> None:
        """Fail the running check when the answer carries garbage, quoting what and where."""
        __tracebackhide__ = True
        findings = sanity.scan_message(message, sanity.prompt_text(body))
        self.check.that(
            not findings,
            expected="a clean answer" + (f" to {label}" if label else "") + ": no NUL or control bytes, no "
                     "script foreign to the prompt, no leaked special token, no degenerate repetition",
            found=f"{sanity.summary(findings)}\n            answer: {short(message.get('content') or '')}",
            why=sanity.WHY, fix=sanity.FIX)


@pytest.fixture
def endpoint(server: Any, check: Any) -> Any:
    with httpx.Client(base_url=server.base_url, timeout=TIMEOUT_S) as client:
        yield Endpoint(server, check, client)


def repro_bodies(config: pytest.Config) -> list[Path]:
    """The stored repro bodies: tests/data/repro/*.json and every --repro-dir."""
    extra = [Path(d) for d in config.getoption("sg_repro_dir", None) or []]
    if missing := [str(d) for d in extra if not d.is_dir()]:
        raise pytest.UsageError(f"--repro-dir {', '.join(missing)}: no such folder")
    dirs = [REPRO_DIR, *extra]
    return sorted(p for d in dirs for p in d.glob("*.json"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "repro_path" in metafunc.fixturenames:
        paths = repro_bodies(metafunc.config)
        metafunc.parametrize("repro_path", paths, ids=[p.stem for p in paths])
