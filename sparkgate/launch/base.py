"""What every launcher shares, below all of them: the server tests are handed, the start error, the readiness
wait and the masking of progress lines (the cache and the teardown shield are sparkgate.proc's)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..httpclient import limits
from ..recipes import Recipe
from ..redact import mask

# A progress line for the operator. A line that starts with two spaces is a detail (a loading phase, the time
# spent): shown by default, left out under -q.
Progress = Callable[[str], None]


class StartError(Exception):
    """A recipe that could not be brought to serving: refused, crashed or timed out. Says why."""


class CouldNotRun(StartError):
    """The recipe cannot be brought up by this run for a reason that is no failure of the box: its checks could not
    run. Says why, and what would run them."""


class Occupied(CouldNotRun):
    """The recipe could only be served with what serves on its port taken down. Says what serves there."""


class NeedsTakeOver(Occupied):
    """Occupied by a container the run may set aside with --take-over. Says what the downtime would be."""


@dataclass
class Server:
    """A running OpenAI-compatible server, as tests see it."""

    base_url: str
    served_name: str
    recipe: Recipe | None
    started: bool  # False: it was already running (--base-url, a reused container) and is not ours to stop
    log_path: Path | None = None
    facts: dict[str, str] = field(default_factory=dict)
    container: str | None = None  # the docker launcher's container (its name)
    logs: Callable[[], str] | None = None  # the server's log, where it is not a file (a container's)
    api_key: str | None = field(default=None, repr=False)  # what clients send as `Authorization: Bearer`
    not_served: str | None = None  # a server found running: why the recipe's model is not listed (SERVE-MODELS's)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        if self.logs is not None:
            return self.logs()
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


def first_token(server: Server, since: float, timeout_s: float = 300) -> tuple[float | None, str]:
    """Seconds from `since` (time.monotonic() at the start) to the first token of a short streamed answer: when a
    start really serves, as a user sees it (a first request may still compile or warm up); None with why where no
    token came."""
    import asyncio

    from ..measure import Target, burst
    from ..probes import chat_body

    body = chat_body(server.served_name, "Say OK.", max_tokens=4)
    [record] = asyncio.run(burst(Target(server.base_url, server.headers), [body], deadline_s=timeout_s))
    if record.t_first_token is None:
        return None, record.error or "the answer held no token"
    return record.t_first_token - since, ""


def log_tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def _never_ready(response: httpx.Response, served_name: str | None) -> str | None:
    """Why an answer to GET /v1/models means the server will never be ready for these tests; None while it
    may still be loading (a 503 from a server that loads behind a live port, a proxy's 502)."""
    status = response.status_code
    if status in (401, 403):
        return (f"GET /v1/models answers HTTP {status}: the server wants an API key"
                + (" and refused the one sent" if "authorization" in response.request.headers else "")
                + ". Pass it with --api-key (or OPENAI_API_KEY); a recipe's own --api-key is sent by itself")
    if status in (404, 405):
        return (f"GET /v1/models answers HTTP {status}: not an OpenAI-compatible server at this address "
                "(the base URL is without /v1)")
    if status != 200:
        return None
    try:
        data = response.json()
        ids = [m["id"] for m in data["data"]]
    except (ValueError, KeyError, TypeError):
        kind = response.headers.get("content-type", "no content type")
        return (f"GET /v1/models answers HTTP 200 with {kind}, not an OpenAI model list: "
                f"{response.text[:200]!r}")
    return None if served_name is None or served_name in ids else f"the server serves {ids}, not {served_name!r}"


def wait_ready(base_url: str, served_name: str | None, timeout_s: float, alive: Callable[[], str | None],
               progress: Progress, label: str, api_key: str | None = None, quiet: bool = False,
               log: Callable[[], str] | None = None) -> float:
    """Poll /v1/models until `served_name` is listed (None: until any model list answers); return the seconds it
    took. `alive()` returns why the server is gone, or None.
    An answer that can never become ready (401, 403, 404, not a model list, another model) fails at once.
    While it loads, each phase its log shows (`log()`: weights, graphs, KV cache) is a progress detail."""
    from ..vllmlog import phases

    start = time.monotonic()
    last_note = last_look = start
    seen: set[str] = set()
    latest: tuple[str, float] | None = None  # the last new phase and when: where a start that hangs is stuck

    def look(now: float) -> None:
        """Each phase the log shows that was not shown yet."""
        nonlocal latest, last_note
        for phase in phases(log()) if log is not None else ():
            if phase not in seen:
                seen.add(phase)
                latest = (phase, now - start)
                progress(f"  {label}: {phase} ({now - start:.0f} s)")
                last_note = now

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=5, headers=headers, limits=limits()) as client:
        while True:
            if (gone := alive()) is not None:
                raise StartError(f"{label} stopped while loading: {gone}")
            try:
                response = client.get(f"{base_url}/v1/models")
            except httpx.HTTPError:
                response = None
            if response is not None:
                if response.status_code == 200 and (why := _never_ready(response, served_name)) is None:
                    took = time.monotonic() - start
                    look(time.monotonic())  # the phases logged since the last look (weights, KV cache) too
                    if not quiet:
                        progress(f"{label}: serving {served_name} after {took:.0f} s")
                    return took
                if why := _never_ready(response, served_name):
                    raise StartError(f"{label} at {base_url}: {why}")
            now = time.monotonic()
            if now - start > timeout_s:
                stuck = (f"; the last phase its log showed: {latest[0]} (at {latest[1]:.0f} s)" if latest else
                         "; its log showed no phase of a vLLM start" if log is not None else "")
                raise StartError(f"{label} not serving after {timeout_s:.0f} s"
                                 + ("" if quiet else " (--startup-timeout)") + stuck)
            if log is not None and now - last_look >= 3:
                last_look = now
                look(now)
            if now - last_note >= 15:
                progress(f"  {label}: loading, {now - start:.0f} s")
                last_note = now
            time.sleep(1)


def served_names(base_url: str, api_key: str | None = None) -> list[str] | None:
    """The model names a server on `base_url` lists; None when nothing answers there (or not with a model list)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=10)
        return [str(m["id"]) for m in response.json()["data"]] if response.status_code == 200 else []
    except httpx.HTTPError:
        return None
    except (ValueError, KeyError, TypeError):
        return []


def masked(progress: Progress) -> Progress:
    """Every progress line through the one masking formatter."""
    return lambda msg: progress(mask(msg))
