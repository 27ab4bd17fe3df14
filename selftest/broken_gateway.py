"""Gateways in front of a real engine, each wrong in one way: what an operator gets when vLLM is served behind a
proxy that drops or rewrites part of the traffic. Every answer is the engine's own; the way is chosen by the first
part of the path (`--base-url http://127.0.0.1:PORT/<way>`):

    openai-only  forwards only the fields of OpenAI's chat completion request; vLLM's own (structured_outputs,
                 guided_*, chat_template_kwargs, min_tokens, ...) are dropped without an error, as a gateway that
                 validates requests against OpenAI's schema does
    errors-500   an error the engine answers (HTTP 4xx, with its message) reaches the client as a bare HTTP 500, as a
                 proxy that intercepts upstream errors does
    v1-only      forwards only the OpenAI API (paths under /v1/); anything else, /health included, is a 404, as a
                 proxy configured for the API alone answers
    buffers      holds each answer until the engine has sent all of it, then passes it on at once: a stream arrives as
                 one burst, as through a proxy that buffers responses (nginx's proxy_buffering on)
    cache-drifts a long request (over LONG characters of messages) sent before is answered as if its last message
                 asked something else: a fluent answer to another question, as from a prefix cache that serves the
                 KV blocks of another prompt (short prompts fill few blocks: a cache barely touches them)
    stamps       writes a request number at the top of every system message, as a gateway that puts a request id or
                 the time in the system prompt does: no two requests share a prefix, so the prefix cache never hits
    last-only    forwards only the last message of a conversation, as a gateway that trims the context to a budget
                 does: an agent's instructions and earlier turns never reach the model
    empty-tool-results
                 forwards a conversation with its tool results emptied (each role "tool" message's content replaced by
                 {}), as a gateway that strips them, or a chat template that renders a tool turn without its content,
                 does: the model calls, and never reads what came back
    calls-as-text
                 a chat completion's tool calls come back as Hermes text in the content, tool_calls[] empty, as from a
                 server whose --tool-call-parser does not match the model's format (the guide's fingerprint)

    python -m selftest.broken_gateway PORT UPSTREAM_BASE_URL
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

# OpenAI's chat completion request, as a schema-validating gateway knows it; anything else is dropped.
OPENAI_FIELDS = {"model", "messages", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
                 "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream",
                 "stream_options", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "user"}
BARE_500 = b"<html><body><h1>500 Internal Server Error</h1></body></html>"
ANOTHER_QUESTION = "Name one thing a lighthouse keeper does every night. Answer in one short sentence."
LONG = 1000


def stamped(body: bytes, n: int) -> bytes:
    """The request with `[request n]` before the text of each system message (unchanged if it has none)."""
    try:
        request = json.loads(body)
        for m in request["messages"]:
            if m.get("role") == "system" and isinstance(m.get("content"), str):
                m["content"] = f"[request {n}] {m['content']}"
        return json.dumps(request).encode()
    except (ValueError, KeyError, TypeError, AttributeError):
        return body


def is_long(body: bytes) -> bool:
    try:
        return sum(len(m.get("content") or "") for m in json.loads(body)["messages"]
                   if isinstance(m.get("content"), str)) > LONG
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def asked_something_else(body: bytes) -> bytes:
    """The request with its last message's text replaced by ANOTHER_QUESTION (unchanged if it has none)."""
    try:
        request = json.loads(body)
        if isinstance(request["messages"][-1]["content"], str):
            request["messages"][-1]["content"] = ANOTHER_QUESTION
            return json.dumps(request).encode()
    except (ValueError, KeyError, IndexError, TypeError):
        pass
    return body


def last_only(body: bytes) -> bytes:
    """The request with its conversation trimmed to its last message (unchanged if it has none)."""
    try:
        request = json.loads(body)
        request["messages"] = request["messages"][-1:]
        return json.dumps(request).encode()
    except (ValueError, KeyError, TypeError, AttributeError):
        return body


def empty_tool_results(body: bytes) -> bytes:
    """The request with each tool result (a role "tool" message's content) replaced by {} (unchanged if it has none)."""
    try:
        request = json.loads(body)
        for m in request["messages"]:
            if m.get("role") == "tool":
                m["content"] = "{}"
        return json.dumps(request).encode()
    except (ValueError, KeyError, TypeError, AttributeError):
        return body


def calls_as_text(answer: bytes) -> bytes:
    """A non-streamed chat completion with each message's tool calls written into its content as Hermes text."""
    try:
        data = json.loads(answer)
        for choice in data["choices"]:
            message = choice["message"]
            calls = message.get("tool_calls") or []
            if calls:
                message["content"] = "\n".join(
                    "<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                  "arguments": json.loads(c["function"]["arguments"])})
                    + "\n</tool_call>" for c in calls)
                message["tool_calls"] = []
                choice["finish_reason"] = "stop"
        return json.dumps(data).encode()
    except (ValueError, KeyError, TypeError, AttributeError):
        return answer


class Handler(BaseHTTPRequestHandler):
    upstream: httpx.Client
    seen: set[bytes] = set()  # the request bodies cache-drifts has forwarded
    stamps = 0  # the requests stamps has numbered
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def _plain(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self, method: str) -> None:
        _, way, *rest = self.path.split("/", 2)
        path = "/" + (rest[0] if rest else "")
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        if way == "v1-only" and not path.startswith("/v1/"):
            self._plain(404, "text/plain", b"not found")
            return
        if way == "openai-only" and method == "POST" and body:
            try:
                request = json.loads(body)
                body = json.dumps({k: v for k, v in request.items() if k in OPENAI_FIELDS}).encode()
            except (ValueError, AttributeError):
                pass  # not a JSON object: the engine says what is wrong with it
        if way == "cache-drifts" and method == "POST" and is_long(body):
            key = hashlib.sha256(body).digest()
            with self.lock:
                again = key in self.seen
                self.seen.add(key)
            if again:
                body = asked_something_else(body)
        if way == "last-only" and method == "POST" and body:
            body = last_only(body)
        if way == "empty-tool-results" and method == "POST" and body:
            body = empty_tool_results(body)
        if way == "stamps" and method == "POST" and body:
            with self.lock:
                Handler.stamps += 1
                body = stamped(body, Handler.stamps)
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
        request = self.upstream.build_request(method, path, content=body or None, headers=headers)
        try:
            answer = self.upstream.send(request, stream=True)
        except httpx.HTTPError as exc:  # the engine unreachable or silent: a 502 or 504 saying so, as a proxy answers
            timed_out = isinstance(exc, httpx.TimeoutException)
            self._plain(504 if timed_out else 502, "text/plain", f"{type(exc).__name__}: {exc}".encode())
            return
        try:
            if way == "errors-500" and 400 <= answer.status_code < 500:
                answer.read()
                self._plain(500, "text/html", BARE_500)
                return
            self.send_response(answer.status_code)
            self.send_header("content-type", answer.headers.get("content-type", "application/json"))
            self.send_header("connection", "close")  # streamed through as it comes; the end is the close
            self.end_headers()
            whole = way == "buffers" or (way == "calls-as-text" and method == "POST")
            for chunk in [answer.read()] if whole else answer.iter_bytes():
                if way == "calls-as-text" and method == "POST":
                    chunk = calls_as_text(chunk)
                self.wfile.write(chunk)
                self.wfile.flush()
        finally:
            answer.close()
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._forward("GET")

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self._forward("POST")


class Server(ThreadingHTTPServer):
    request_queue_size = 128  # several suites at once, each with a batch of requests in flight
    daemon_threads = True


def main() -> None:
    # A connection of its own per request upstream, as downstream (every answer ends with the close): a pooled one
    # the engine is closing as it idles out would drop a request the engine never saw.
    Handler.upstream = httpx.Client(base_url=sys.argv[2], timeout=httpx.Timeout(600, connect=10),
                                    limits=httpx.Limits(max_keepalive_connections=0))
    server = Server(("127.0.0.1", int(sys.argv[1])), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
