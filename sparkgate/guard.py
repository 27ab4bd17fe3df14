"""`sparkgate guard`: a recording guard in front of a production server.

The guide's worst garbage happened on a warm production engine, for one real request shape, and was clean on a
fresh engine and on synthetic bodies: a test that starts its own engine and sends its own bodies cannot see it.
The guard sits where it happens. It passes every request through to the upstream server unchanged (streams
forwarded chunk by chunk as they arrive), runs the sanity detector on every chat answer, and when one is garbage
it stores the exact request body (secrets masked) as a repro body, with the answer, the time and the server's
facts beside it. Those bodies are what SERVE-REPRO replays (`--repro-dir`), against the warm engine, after every
image bump.

    sparkgate guard --listen 127.0.0.1:8001 --upstream http://127.0.0.1:8000 --out ~/sparkgate-repro

It never changes what a client gets except by being slower, and barely that: a body over MAX_BODY is refused (413)
before it is read whole, an upstream that does not answer is a 502 with one line, and judging and storing run in a
process of their own, at a lower priority, after the answer has gone (never on the event loop, never holding its
interpreter lock, never as an error the client sees). What it stores is bounded (MAX_STORED files, one per distinct
body), private (0600 in a 0700 folder) and masked.

It listens on loopback unless given a token (`--token-file`): then every request carries `Authorization: Bearer
<token>`, compared in constant time, or is a 401 with one line, never forwarded. The token is the guard's own and
never goes upstream; a key the upstream wants (vLLM's `--api-key`) is the guard's to send (`--upstream-key-file`),
so any OpenAI client works through it with the token as its API key. With neither, a client's own Authorization
goes through unchanged. Both are read from files (a command line shows in `ps`) and masked wherever the guard writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import multiprocessing
import os
import signal
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import SSEError

from . import sanity
from .httpclient import limits
from .redact import MASKER, mask, mask_json, secret
from .stream import StreamError, assembled

CHAT_PATHS = ("/v1/chat/completions",)
MAX_BODY = 32 * 2**20  # a 128K-token prompt is about 0.5 MB of JSON; images in base64 a few MB more
MAX_STORED = 1000  # repro bodies kept per folder: enough to see a pattern, never a full disk
MIN_TOKEN = 16  # characters: `openssl rand -hex 32` gives 64
JUDGE_BACKLOG = 64  # answers waiting to be judged; past it, an answer goes unjudged (said on stderr), never delayed
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
              "proxy-authenticate", "host", "content-length", "accept-encoding"}


class Recorder:
    """Stores the garbage-producing requests of one upstream server in one folder."""

    def __init__(self, out: Path, upstream: str) -> None:
        self.out = out
        self.upstream = upstream
        self.out.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.out.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise ValueError(f"{out} is not this user's own folder (owner uid {st.st_uid}, mode "
                             f"{st.st_mode & 0o7777:o}): another user could read or plant repro bodies there; give "
                             "--out a folder of your own")
        self.facts: dict[str, Any] = {}
        self.stored = 0
        self.full_said = False
        self._lock = threading.Lock()  # the dedup look and the quota count, then the write, as one step

    async def learn_facts(self, client: httpx.AsyncClient) -> None:
        """What the upstream says of itself (its vLLM version, its models), recorded with every repro body."""
        for path, key in (("/version", "version"), ("/v1/models", "models")):
            try:
                response = await client.get(f"{self.upstream}{path}", timeout=10)
                self.facts[key] = response.json() if response.status_code == 200 else f"HTTP {response.status_code}"
            except (httpx.HTTPError, ValueError) as exc:
                self.facts[key] = f"{type(exc).__name__}"

    def judge(self, body: dict[str, Any], message: dict[str, Any]) -> list[sanity.Finding]:
        findings = sanity.scan_message(message, sanity.prompt_text(body))
        if findings:
            self.store(body, message, findings)
        return findings

    def judge_raw(self, raw_body: bytes, answer: bytes, streamed: bool) -> None:
        """Parse, judge and store one exchange, in the judging thread: whatever it holds, a failure is a line on
        stderr, never the client's error (the client already has its answer)."""
        try:
            body = _json_object(raw_body)
            if body is None:
                return
            if streamed:
                message: Any = assembled(answer).message
            else:
                choices = (_json_object(answer) or {}).get("choices")
                if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
                    return
                message = choices[0].get("message") or {}
            if isinstance(message, dict):
                self.judge(body, message)
        except (StreamError, SSEError):
            return  # not a chat completion stream: nothing the detector can read
        except Exception as exc:
            print(mask(f"sparkgate guard: could not judge or store one answer: {type(exc).__name__}: {exc}"),
                  file=sys.stderr, flush=True)

    def store(self, body: dict[str, Any], message: dict[str, Any], findings: list[sanity.Finding]) -> Path | None:
        """`<time>-<hash>.json`: the request body as sent (secrets masked), what SERVE-REPRO replays; beside it
        `<time>-<hash>.meta`: the answer, the findings, the time and the server's facts (not replayed)."""
        text = json.dumps(mask_json(body))  # masked value by value: it still parses (ASCII: a lone surrogate too)
        with self._lock:
            return self._store(text, message, findings)

    def _store(self, text: str, message: dict[str, Any], findings: list[sanity.Finding]) -> Path | None:
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        if seen := sorted(self.out.glob(f"*-{digest}.json")):  # the same body again: stored once
            return seen[0]
        if len(list(self.out.glob("*.json"))) >= MAX_STORED:
            if not self.full_said:
                self.full_said = True
                print(f"sparkgate guard: {self.out} holds {MAX_STORED} repro bodies; storing no more",
                      file=sys.stderr, flush=True)
            return None
        stamp = dt.datetime.now(dt.UTC)
        name = f"{stamp:%Y%m%dT%H%M%SZ}-{digest}"
        meta = {"time": stamp.isoformat(timespec="seconds"), "upstream": self.upstream, "server": self.facts,
                "findings": [f.what for f in findings], "answer": message}
        _write_private(self.out / f"{name}.meta", json.dumps(mask_json(meta), indent=2))
        _write_private(self.out / f"{name}.json", text)
        self.stored += 1
        return self.out / f"{name}.json"


_JUDGE: list[Recorder] = []  # in the judging process: its recorder


def _start_judging(out: Path, upstream: str, facts: dict[str, Any], secrets: list[str]) -> None:
    """The judging process: the guard's recorder and secrets, a lower priority than answering, and no life of its own
    (gone with the guard; Ctrl-C is the guard's to handle, letting what is being stored finish)."""
    os.nice(10)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(AttributeError, OSError):  # Linux: PR_SET_PDEATHSIG, SIGKILL
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    for value in secrets:
        secret(value)
    recorder = Recorder(out, upstream)
    recorder.facts = facts
    _JUDGE.append(recorder)


def _judge(raw_body: bytes, answer: bytes, streamed: bool) -> None:
    _JUDGE[0].judge_raw(raw_body, answer, streamed)


def app(upstream: str, out: Path, token: str | None = None, upstream_key: str | None = None) -> Any:
    """The guard as an ASGI application (Starlette): every path and method passed through; with a `token`, only
    for a request that carries it."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    upstream = upstream.rstrip("/")
    recorder = Recorder(out, upstream)
    secret(token)  # hidden in every line and stored body, like any secret the suite knows
    secret(upstream_key)
    expected = token.encode() if token is not None else None
    own_auth = token is not None or upstream_key is not None  # else a client's Authorization goes through as sent
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30), limits=limits(None),
                               headers={"authorization": f"Bearer {upstream_key}"} if upstream_key else None)

    # Judging and storing: one process of their own (a thread would share the event loop's interpreter lock, which
    # the detector's regular expressions hold for as long as a large prompt takes), with a bounded backlog.
    judging: list[ProcessPoolExecutor] = []
    pending: set[Future[None]] = set()
    closing, dropped = [False], [0]

    def start_judging() -> None:
        judging[:] = [ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), _start_judging,
                                          (out, upstream, recorder.facts, sorted(MASKER.secrets)))]
        judging[0].submit(int)  # started now, not on the first answer

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        await recorder.learn_facts(client)
        start_judging()
        yield
        closing[0] = True  # a stop (SIGTERM) lets what is being stored finish: never half a repro body
        await asyncio.to_thread(judging[0].shutdown, True)
        await client.aclose()

    def judge_later(raw_body: bytes, answer: bytes, streamed: bool) -> None:
        if closing[0] or not judging:
            return
        if len(pending) >= JUDGE_BACKLOG:
            dropped[0] += 1
            if dropped[0] in (1, 10, 100) or dropped[0] % 1000 == 0:
                print(f"sparkgate guard: judging is {JUDGE_BACKLOG} answers behind; {dropped[0]} left unjudged so "
                      "far (the answers went out unchanged)", file=sys.stderr, flush=True)
            return
        try:
            future = judging[0].submit(_judge, raw_body, answer, streamed)
        except BrokenProcessPool:  # the judging process died (out of memory?): another one, for the next answers
            print("sparkgate guard: the judging process ended; starting another (this answer goes unjudged)",
                  file=sys.stderr, flush=True)
            start_judging()
            return
        pending.add(future)
        future.add_done_callback(pending.discard)

    async def proxy(request: Request) -> Response:
        if expected is not None and not _carries(request.headers.get("authorization", ""), expected):
            return Response("sparkgate guard: this guard wants its token: send `Authorization: Bearer <token>`\n",
                            status_code=401, media_type="text/plain", headers={"www-authenticate": "Bearer"})
        if int(request.headers.get("content-length") or 0) > MAX_BODY:
            return _refused_too_large()
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                return _refused_too_large()
            chunks.append(chunk)
        raw = b"".join(chunks)
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in HOP_BY_HOP and not (own_auth and k.lower() == "authorization")}
        headers["accept-encoding"] = "identity"  # the guard reads what it forwards
        upstream_request = client.build_request(request.method, f"{upstream}{request.url.path}",
                                                params=request.query_params, headers=headers, content=raw)
        try:
            response = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return Response(mask(f"sparkgate guard: the upstream {upstream} did not answer: {type(exc).__name__}: "
                                 f"{exc}\n"), status_code=502, media_type="text/plain")
        passed = {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP}
        chat = request.url.path in CHAT_PATHS and request.method == "POST"  # parsed in the judging thread, later
        if not chat or response.status_code != 200:
            content = await response.aread()
            await response.aclose()
            return Response(content, status_code=response.status_code, headers=passed)
        if "text/event-stream" in response.headers.get("content-type", ""):
            received: list[bytes] = []

            async def forward():
                complete = False
                try:
                    async for chunk in response.aiter_raw():
                        yield chunk  # first to the client; judging waits for the end of the stream
                        received.append(chunk)
                    complete = True
                finally:
                    await response.aclose()
                if complete:  # a stream the client left half-way is not judged
                    judge_later(raw, b"".join(received), True)

            return StreamingResponse(forward(), status_code=response.status_code, headers=passed)
        content = await response.aread()
        await response.aclose()
        judge_later(raw, content, False)
        return Response(content, status_code=response.status_code, headers=passed)

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
    application = Starlette(routes=[Route("/{path:path}", proxy, methods=methods)], lifespan=lifespan)
    application.state.recorder = recorder
    return application


def _refused_too_large() -> Any:
    from starlette.responses import Response

    return Response(f"sparkgate guard: request body larger than {MAX_BODY // 2**20} MB\n", status_code=413,
                    media_type="text/plain")


def _write_private(path: Path, text: str) -> None:
    """Only the guard's user can read what it stores (0600); written beside (a new file, never through a link),
    then renamed: never half a file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _carries(authorization: str, token: bytes) -> bool:
    """`Bearer <token>`, compared in constant time (a byte-by-byte compare tells a prober how much it got right)."""
    scheme, _, given = authorization.partition(" ")
    # (compare_digest first, whatever the scheme: the time never says which part was wrong)
    return hmac.compare_digest(given.strip().encode("latin-1"), token) and scheme.lower() == "bearer"


def read_secret(path: Path, what: str, min_length: int = 1) -> str:
    """A secret from a file only its owner can read: one line of visible ASCII (it travels in a header)."""
    try:
        mode, text = path.stat().st_mode, path.read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path} cannot be read ({exc}): give a file holding the secret on one line") from exc
    if mode & 0o077:
        raise ValueError(f"{what} {path} is open to other users (mode {mode & 0o777:o}): chmod 600 {path}")
    if len(text) < min_length or not all("!" <= c <= "~" for c in text):
        raise ValueError(f"{what} {path} must hold one line of at least {min_length} visible ASCII characters, no "
                         "spaces (e.g. `openssl rand -hex 32`)")
    return text


def loopback(host: str) -> bool:
    """Whether only this machine can reach `host`. A name other than localhost may resolve to any address."""
    host = host.strip("[]")
    if host in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(listen: str, upstream: str, out: Path, token_file: Path | None = None,
          upstream_key_file: Path | None = None) -> None:
    import uvicorn

    host, _, port = listen.rpartition(":")
    token = read_secret(token_file, "--token-file", MIN_TOKEN) if token_file else None
    if token is None and not loopback(host):
        raise ValueError(f"--listen {listen} can be reached from other machines and this guard has no token: anyone "
                         "who reaches it could use the upstream through it. Give --token-file FILE (a secret of at "
                         f"least {MIN_TOKEN} characters, mode 0600, that clients send as `Authorization: Bearer "
                         "<token>`), or listen on 127.0.0.1")
    upstream_key = read_secret(upstream_key_file, "--upstream-key-file") if upstream_key_file else None
    application = app(upstream, out, token, upstream_key)
    print(mask(f"sparkgate guard: {listen} -> {upstream}; garbage-producing requests are stored in {out}"
               + ("; each request must carry its token" if token else "")), flush=True)
    uvicorn.run(application, host=host.strip("[]") or "127.0.0.1", port=int(port), log_level="warning")
