"""How the serving checks talk to the endpoint: one client, and every answer through the sanity detector.

`endpoint.chat(body)` and `endpoint.stream(body)` fail the running check, with its own ID, on a transport
failure (hang, dropped connection), on an unexpected status and on garbage in the answer; they return the
parsed answer otherwise. `endpoint.post(...)` is the raw form for checks that judge the status themselves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import SSEError, connect_sse

from sparkgate import sanity
from sparkgate.httpclient import limits
from sparkgate.shipped import REPRO_DIR
from sparkgate.stream import Assembled, StreamError

SANITY_CHECK = "SERVE-SANITY"  # the check that diagnoses garbage answers; the others point at it
REASONING_CHECK = "SERVE-REASONING"  # the one that diagnoses thinking left in the answer
TIMEOUT_S = 300  # a 2-core CPU box answers a long prompt in tens of seconds; a hang is longer than this


def short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return repr(text[:limit]) + (f" (+{len(text) - limit} chars)" if len(text) > limit else "")


class Endpoint:
    """The server under test, as one check talks to it: its key sent, every request under a total deadline."""

    def __init__(self, server: Any, check: Any, client: httpx.Client, timeout: float = TIMEOUT_S) -> None:
        self.server, self.check, self.client = server, check, client
        self.model = server.served_name
        self.timeout = timeout  # --request-timeout: the most any request may take in all

    def post(self, body: Any = None, *, path: str = "/v1/chat/completions", content: bytes | None = None,
             timeout: float | None = None) -> httpx.Response:
        """POST and return the response whatever its status; a hang, a trickle past `timeout` in all or a dropped
        connection fails the running check."""
        __tracebackhide__ = True
        timeout = min(timeout or self.timeout, self.timeout)
        deadline = time.monotonic() + timeout
        kwargs: dict[str, Any] = ({"content": content, "headers": {"content-type": "application/json"}}
                                  if content is not None else {"json": body})
        try:
            with self.client.stream("POST", path, timeout=timeout, **kwargs) as response:
                received = []
                for chunk in response.iter_bytes():
                    received.append(chunk)
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("the total deadline passed while the answer trickled in")
                # The decoded body, so the headers that described its encoding on the wire no longer apply.
                headers = [(k, v) for k, v in response.headers.items()
                           if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
                return httpx.Response(response.status_code, headers=headers, content=b"".join(received),
                                      request=response.request)
        except httpx.TimeoutException:
            self.check.that(False, expected=f"an answer to POST {path} within {timeout:.0f} s",
                            found=f"no complete answer after {timeout:.0f} s: the server hangs on this request",
                            fix="read the server log for the request; a hang on one request shape is an "
                                "engine defect: report it with the body (tests/data/repro)")
        except httpx.TransportError as exc:
            self.check.that(False, expected=f"an HTTP answer to POST {path}",
                            found=f"{type(exc).__name__}: {exc} (the connection dropped: did the server crash?)",
                            fix="read the server log: a dropped connection is usually an engine crash")
        raise AssertionError("unreachable")

    def chat(self, body: dict[str, Any], label: str = "", timeout: float | None = None,
             judged_here: Collection[str] = ()) -> dict[str, Any]:
        """A non-streamed chat completion that must answer 200; its message must be clean (but for the kinds of
        finding the running check judges itself: `judged_here`)."""
        __tracebackhide__ = True
        return self.answer(self.post(body, timeout=timeout), body, label, judged_here)

    def choice(self, body: dict[str, Any], what: str, why: str | None = None) -> dict[str, Any]:
        """The first choice of a chat completion that must answer 200 with one, not judged for garbage (for checks
        whose verdict is what the answers say: how many are right)."""
        __tracebackhide__ = True
        return self.first_choice(self.post(body), what, why)[1]

    def first_choice(self, response: httpx.Response, what: str, why: str | None = None) -> tuple[dict, dict]:
        """The JSON object of a chat completion that answered 200 with a choice whose message is an object, and its
        first choice; the running check fails otherwise."""
        __tracebackhide__ = True
        found = f"HTTP {response.status_code}: {short(response.text)}"
        self.check.that(response.status_code == 200, expected=f"HTTP 200 with {what}", found=found, why=why)
        data = self.json_object(response, what)
        choices = data.get("choices")
        self.check.that(isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict)
                        and isinstance(choices[0].get("message") or {}, dict),
                        expected=f"HTTP 200 with a choice for {what}", found=found, why=why)
        return data, choices[0]

    def json_object(self, response: httpx.Response, what: str) -> dict[str, Any]:
        """The response's JSON object, or the running check fails saying what came instead (HTML, a list)."""
        __tracebackhide__ = True
        try:
            data = response.json()
        except ValueError:
            data = None
        kind = response.headers.get("content-type", "no content type")
        self.check.that(isinstance(data, dict), expected=f"a JSON object for {what}",
                        found=f"HTTP {response.status_code}, {kind}: {short(response.text)}",
                        fix="is this an OpenAI-compatible server (the base URL without /v1), or a proxy's error page "
                            "in front of it? Read the server and proxy logs")
        return data

    @staticmethod
    def error_message(response: httpx.Response) -> str:
        """The message of an OpenAI-style error body (`{"error": {"message": ...}}`, or a bare string); ""."""
        try:
            error = response.json().get("error")
        except (ValueError, AttributeError):
            return ""
        if isinstance(error, dict):
            return str(error.get("message") or "")
        return str(error or "")

    def answer(self, response: httpx.Response, body: dict[str, Any], label: str = "",
               judged_here: Collection[str] = ()) -> dict[str, Any]:
        """Judge a chat completion already received: HTTP 200 with a choice, and a clean message."""
        __tracebackhide__ = True
        data, choice = self.first_choice(response, f"a chat completion{label and ' for ' + label}")
        self.clean(choice.get("message") or {}, body, label, judged_here)
        return data

    def stream(self, body: dict[str, Any], label: str = "", timeout: float | None = None,
               judged_here: Collection[str] = ()) -> Assembled:
        """A streamed chat completion (with the usage chunk), assembled; it must be clean."""
        __tracebackhide__ = True
        timeout = min(timeout or self.timeout, self.timeout)
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        out = Assembled()
        deadline = time.monotonic() + timeout
        try:
            with connect_sse(self.client, "POST", "/v1/chat/completions", json=body, timeout=timeout) as source:
                response = source.response
                if response.status_code != 200:
                    response.read()
                    self.check.that(False, expected=f"HTTP 200 and an event stream{label and ' for ' + label}",
                                    found=f"HTTP {response.status_code}: {short(response.text)}")
                for event in source.iter_sse():
                    out.feed(event.data)
                    if out.done or time.monotonic() > deadline:
                        break
        except (StreamError, SSEError) as exc:
            self.check.that(False, expected="an event stream of chat completion chunks (JSON objects)",
                            found=f"after {len(out.events)} events, {exc}",
                            fix="read the server log; a proxy in front of the server may be rewriting the stream")
        except httpx.TimeoutException:
            self.check.that(False, expected=f"a complete stream within {timeout:.0f} s",
                            found=f"{len(out.events)} events, then nothing: the stream hangs")
        except httpx.TransportError as exc:
            self.check.that(False, expected="a stream that ends with data: [DONE]",
                            found=f"{len(out.events)} events, then {type(exc).__name__}: {exc} "
                                  f"(the connection dropped: did the server crash?)")
        self.check.that(out.done or time.monotonic() <= deadline, expected=f"a complete stream within {timeout:.0f} s",
                        found=f"{len(out.events)} events in {timeout:.0f} s, still not done: the stream trickles")
        self.check.that(out.error is None, expected="a stream without error events",
                        found=f"the server sent an error mid-stream: {short(out.error)}")
        self.clean(out.message, body, label, judged_here)
        return out

    def clean(self, message: dict[str, Any], body: dict[str, Any], label: str = "",
              judged_here: Collection[str] = ()) -> None:
        """Fail the running check when the answer carries garbage, quoting what and where. Every check that reads
        an answer judges it so; SERVE-SANITY is the one whose job it is (SERVE-REASONING's, for thinking left in
        the answer), so the others point at it: when it fails too, they fail on the same defect."""
        __tracebackhide__ = True
        findings = [f for f in sanity.scan_message(message, sanity.prompt_text(body)) if f.kind not in judged_here]
        leak = bool(findings) and {f.kind for f in findings} == {"reasoning-leak"}  # no reasoning parser, only that
        recipe = self.server.recipe
        cause = REASONING_CHECK if leak and recipe is not None and recipe.features.reasoning else SANITY_CHECK
        what = "thinking left in the answer" if cause == REASONING_CHECK else "garbage answers"
        same = "" if self.check.id == cause else " " + sanity.diagnosed_by(cause, what)
        self.check.that(
            not findings,
            expected="a clean answer" + (f" to {label}" if label else "") + ": no NUL or control bytes, no "
                     "script the request neither uses nor asks for, no leaked special token, no tokenizer markers, "
                     "no punctuation noise, no degenerate repetition, no salad",
            found=f"{sanity.summary(findings)}\n            answer: {short(message.get('content') or '')}",
            why=sanity.WHY + same, fix=sanity.REASONING_FIX if leak else sanity.FIX)


@pytest.fixture
def endpoint(server: Any, check: Any, pytestconfig: pytest.Config) -> Any:
    timeout = pytestconfig.option.sg_request_timeout
    with httpx.Client(base_url=server.base_url, timeout=timeout, headers=server.headers,
                      limits=limits()) as client:
        yield Endpoint(server, check, client, timeout)


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
