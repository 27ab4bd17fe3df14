"""Servers that answer what a broken proxy or a half-compatible server answers, one way each, chosen by the first
part of the path (`--base-url http://127.0.0.1:PORT/<way>`). Not a stand-in for vLLM: it exists to prove the
suite turns each malformed answer into one clear failure of the running check, never a traceback.

    html     every answer is a proxy's HTML error page with HTTP 200
    list     /v1/models is fine; a chat completion is a JSON list, not an object
    badsse   /v1/models is fine; a streamed chat completion carries events that are not JSON
    trickle  /v1/models is fine; a chat completion comes one byte a second, for minutes
    key      /v1/* answers 401 without `Authorization: Bearer sparkgate-test-key` (vLLM's --api-key), then as list
    markup   /v1/models is fine; /version carries markup that runs script if a page renders it as HTML
    oddmsg   /v1/models is fine; a chat completion's `message` (streamed: its `delta`) is a string, not an object
    garbage  /v1/models is fine; a chat completion's content is garbage (NUL bytes), for the recording guard to store

    python -m selftest.misbehaving_server PORT
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "smollm2-135m-instruct"
KEY = "sparkgate-test-key"
ODD_STREAM = b'data: {"choices": [{"delta": "a string, not an object"}]}\n\ndata: [DONE]\n\n'
MARKUP = "<img src=x onerror=\"document.title='pwned'\">0.32.0"
PAGE = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1>nginx</body></html>"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self) -> tuple[str, str]:
        _, way, *rest = self.path.split("/", 2)
        return way, "/" + (rest[0] if rest else "")

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        way, path = self._route()
        if way == "html":
            return self._send(200, PAGE, "text/html")
        if way == "key" and self.headers.get("authorization") != f"Bearer {KEY}" and path.startswith("/v1"):
            return self._send(401, json.dumps({"error": "Unauthorized"}).encode())
        if way == "markup" and path == "/version":
            return self._send(200, json.dumps({"version": MARKUP}).encode())
        if path == "/v1/models":
            return self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
        return self._send(404, json.dumps({"detail": "Not Found"}).encode())

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        way, path = self._route()
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if way == "html":
            return self._send(200, PAGE, "text/html")
        if way == "key" and self.headers.get("authorization") != f"Bearer {KEY}":
            return self._send(401, json.dumps({"error": "Unauthorized"}).encode())
        if way == "oddmsg" and body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(ODD_STREAM)
            self.close_connection = True
            return None
        if way == "oddmsg":
            return self._send(200, json.dumps({"choices": [{"message": "not an object"}]}).encode())
        if way == "garbage":
            return self._send(200, json.dumps({"choices": [{"message": {"role": "assistant",
                                                                      "content": "Par\x00\x00is"}}]}).encode())
        if way in ("list", "key"):
            return self._send(200, json.dumps([{"message": {"content": "Paris"}}]).encode())
        if way == "badsse" and body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\ndata: {"choices": [{"del\n\n')
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return None
        if way == "trickle":
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "100000")
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(1)
            except OSError:  # the client gave up, as it should
                pass
            return None
        return self._send(404, json.dumps({"detail": "Not Found"}).encode())


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
