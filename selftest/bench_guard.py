"""How much slower the recording guard makes small requests while large and malformed bodies hit it.

    python -m selftest.bench_guard [--runs 3] [--seconds 8]

The guard runs in front of the reference server (selftest/schedule_server.py: it answers at once, so what is
measured is the guard), on ports of its own (18020, 18021). Each run sends small chat requests one after another for
--seconds alone, then again for --seconds while the heavy bodies below hit the guard at once, and prints the small
requests' latency each way: n, mean, sample std, p95 and max. The self-test
(test_other_servers.py::test_small_requests_keep_their_pace_while_large_and_malformed_bodies_hit_the_guard) holds
the guard to LATENCY_BUDGET_S with the same load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sparkgate.guard import MAX_BODY

from .helpers import guard, serving_at

SCHEDULE_PORT, GUARD_PORT = 18020, 18021
LATENCY_BUDGET_S = 1.0  # a small request's p95 under load; the guard that judged on its event loop took 11.7 s
SCHEDULE = {"tokens": 3, "ttft_s": 0, "interval_s": 0}  # answered at once: the time is the guard's
SMALL = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "stream": True, "schedule": SCHEDULE}


def _chat(content: bytes, size: int) -> bytes:
    """A chat request `size` bytes long whose user turn is `content` repeated (valid JSON, answered 200)."""
    head = json.dumps({"model": "m", "stream": True, "schedule": SCHEDULE,
                       "messages": [{"role": "user", "content": ""}]}).encode()
    cut = head.index(b'"content": ""') + len(b'"content": "')
    return head[:cut] + content * ((size - len(head)) // len(content)) + head[cut:]


def _chunks(size: int) -> Iterator[bytes]:
    """A body sent without a length (chunked): the guard learns its size only by reading it."""
    for _ in range(size // 2**20):
        yield b" " * 2**20


# What hits the guard at once: (what, body, the answer it MUST get). A body it reads whole is judged after its answer
# (about 10 s of detector time for the one just under the limit, on a 2-core VM).
HEAVY: list[tuple[str, Callable[[], bytes | Iterator[bytes]], int]] = [
    ("just under the limit", lambda: _chat(b"x", MAX_BODY - 1), 200),
    ("20 MB of prose", lambda: _chat(b"The quick brown fox jumps. ", 20 * 2**20), 200),
    ("over the limit, with its length", lambda: b"{" + b" " * (MAX_BODY + 2**20) + b"}", 413),
    ("over the limit, chunked", lambda: _chunks(MAX_BODY + 2**20), 413),
    ("10 MB of JSON cut short", lambda: _chat(b"y", 10 * 2**20)[:-3], 502),  # the upstream cannot read it
    ("a lone surrogate", lambda: _chat(b"\\ud800 ", 2**20), 200),
    ("nested 100,000 deep", lambda: b"[" * 100_000, 502),
]


def hit(url: str, make: Callable[[], bytes | Iterator[bytes]]) -> int:
    """POST one heavy body to the guard; its status, or 0 if the connection broke (said by the caller)."""
    try:
        return httpx.post(f"{url}/v1/chat/completions", content=make(), timeout=120,
                          headers={"content-type": "application/json"}).status_code
    except httpx.HTTPError:
        return 0


def small_latencies(url: str, seconds: float, busy: threading.Event | None = None,
                    headers: dict[str, str] | None = None) -> list[float]:
    """Small requests one after another for `seconds` (and while `busy` is set): each one's time to its last byte."""
    times: list[float] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=120, headers=headers) as client:
        while time.monotonic() < deadline or (busy is not None and busy.is_set()):
            t0 = time.monotonic()
            with client.stream("POST", "/v1/chat/completions", json=SMALL) as response:
                response.read()
                assert response.status_code == 200, (response.status_code, response.text[:300])
            times.append(time.monotonic() - t0)
    return times


def under_load(url: str, seconds: float) -> tuple[list[float], dict[str, int]]:
    """Small requests' latencies while every HEAVY body hits the guard at once, and the status each heavy one got."""
    busy = threading.Event()
    busy.set()
    with ThreadPoolExecutor(len(HEAVY)) as pool:
        futures = {what: pool.submit(hit, url, make) for what, make, _ in HEAVY}
        for future in futures.values():
            future.add_done_callback(lambda _: all(f.done() for f in futures.values()) and busy.clear())
        times = small_latencies(url, seconds, busy)
        return times, {what: f.result() for what, f in futures.items()}


def p95(values: list[float]) -> float:
    """The nearest-rank 95th percentile: of 10 values, the largest."""
    return sorted(values)[math.ceil(0.95 * len(values)) - 1]


def describe(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return (f"n={len(values)}, mean {statistics.mean(values) * 1000:.1f} ms, std {spread * 1000:.1f} ms, "
            f"p95 {p95(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms")


@contextlib.contextmanager
def guarded(out: Path, *args: str, host: str = "127.0.0.1") -> Iterator[tuple[str, subprocess.Popen]]:
    """The reference server with the guard in front of it (`args`: the guard's options), listening on `host`: the
    guard's URL and process (killed at the end: it would otherwise finish judging what it holds first)."""
    upstream = f"http://127.0.0.1:{SCHEDULE_PORT}"
    with serving_at([sys.executable, "-m", "selftest.schedule_server", str(SCHEDULE_PORT)], upstream, timeout=30):
        proc = guard(upstream, out, port=GUARD_PORT, host=host, args=args)
        try:
            yield f"http://127.0.0.1:{GUARD_PORT}", proc
        finally:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    alone_all, loaded_all = [], []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="sparkgate-bench-guard-") as tmp, guarded(Path(tmp) / "repro") as (
                url, _):
            alone = small_latencies(url, args.seconds)
            loaded, statuses = under_load(url, args.seconds)
        alone_all += alone
        loaded_all += loaded
        print(f"run {i + 1}: alone {describe(alone)}", flush=True)
        print(f"run {i + 1}: under load {describe(loaded)}; heavy bodies answered {statuses}", flush=True)
    print(f"\nall {args.runs} runs, small requests alone:      {describe(alone_all)}")
    print(f"all {args.runs} runs, small requests under load: {describe(loaded_all)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
