"""The instrument's reference: an OpenAI-shaped streaming server that emits tokens on a known schedule.

Not a stand-in for vLLM: it exists to calibrate sparkgate's timing. A request body's `schedule` field says
when to answer: the first token `ttft_s` after the request arrived, then one every `interval_s` (0: as fast as
the server can write), `tokens` in all; with `stream_options.continuous_usage_stats` every chunk carries the count
so far, as vLLM's do. Each token is sent at its absolute deadline, so sleep overshoot never
accumulates, and GET / returns, per request, the monotonic times each token was actually written (CLOCK_MONOTONIC
is one clock for every process on the machine), so a client's figures can be compared with the truth.

    python -m selftest.schedule_server PORT
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left if left > 0.002 else 0)  # the last 2 ms spin: sleep() overshoots by ~0.1 ms


LOG: list[dict[str, object]] = []  # per request: when it arrived and when each token was written
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        with LOCK:
            data = json.dumps(LOG).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:  # quiet: the test prints what matters
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        received = time.monotonic()
        if self.path != "/v1/chat/completions":
            self.send_error(404, "only /v1/chat/completions streams here")
            return
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        schedule = body["schedule"]
        n, ttft, interval = int(schedule["tokens"]), float(schedule["ttft_s"]), float(schedule["interval_s"])
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        written = []
        as_it_goes = (body.get("stream_options") or {}).get("continuous_usage_stats")  # as vLLM counts
        try:
            for i in range(n):
                _sleep_until(received + ttft + i * interval)
                chunk = {"choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]}
                if as_it_goes:
                    chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": i + 1, "total_tokens": i + 11}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                written.append(time.monotonic())
        except OSError:  # the client cut the request
            with LOCK:
                LOG.append({"received": received, "written": written})
            return
        usage = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": n + 10}
        final = {"choices": [], "usage": usage}
        self.wfile.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()
        self.close_connection = True
        with LOCK:
            LOG.append({"received": received, "written": written})


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
