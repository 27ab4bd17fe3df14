"""The docker engine of the box under test, through the docker SDK.

A remote --host's engine is reached through OpenSSH with the suite's own ssh options (--ssh-config,
--ssh-identity-file, BatchMode, keepalives): its unix socket is forwarded to a local one (`ssh -N -L
local.sock:remote.sock`), which the SDK uses. The SDK's own ssh:// support reads only ~/.ssh/config, so it would
miss those options; `--docker-host` (any DOCKER_HOST URL) overrides the forward.

The forward runs in its own session, so the terminal's Ctrl-C (sent to the whole foreground process group) does
not cut the one connection a teardown needs; it still dies with the suite (parent-death signal). When it drops
anyway (a lost network), `reconnect()` opens a new one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from functools import cached_property
from typing import Any

from ..proc import die_with_parent
from ..target import is_local, ssh_argv
from .base import StartError


class DockerEngine:
    """The docker engine of the box under test, opened on first use and closed by close()."""

    def __init__(self, target: str, ssh_config: str | None = None, identity_file: str | None = None,
                 docker_host: str | None = None, pull: bool = False, remote_socket: str = "/var/run/docker.sock"):
        self.target = target
        self.ssh_config, self.identity_file = ssh_config, identity_file
        self.docker_host = docker_host
        self.pull = pull
        self.remote_socket = remote_socket
        self.tunnel: subprocess.Popen[bytes] | None = None
        self._tmp: str | None = None

    @property
    def local(self) -> bool:
        return is_local(self.target)

    @cached_property
    def address(self) -> str:
        """Where the host's published ports answer, from here."""
        if self.docker_host and "://" in self.docker_host and not self.docker_host.startswith(("unix:", "npipe:")):
            host = self.docker_host.split("://", 1)[1].rsplit("@", 1)[-1].split("/")[0]
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        if self.local:
            return "127.0.0.1"
        base = ssh_argv(self.target, self.ssh_config, self.identity_file)
        out = subprocess.run([*base[:-1], "-G", base[-1]], capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname":
                return value.strip()
        return base[-1].rsplit("@", 1)[-1]

    @cached_property
    def client(self) -> Any:
        import docker

        try:
            if self.docker_host:
                client = docker.DockerClient(base_url=self.docker_host, use_ssh_client=True)
            elif self.local:
                client = docker.from_env()
            else:
                client = docker.DockerClient(base_url=f"unix://{self._forward()}")
            client.ping()
        except Exception as exc:  # the SDK raises several kinds; one message says which engine and why
            self.close()
            raise StartError(f"cannot reach the docker engine of {self.target}: {type(exc).__name__}: {exc}") from None
        return client

    def reconnect(self) -> Any:
        """A fresh connection (and forward) after the old one dropped; raises StartError if none can be made."""
        self.close()
        return self.client

    def _forward(self) -> str:
        """A local unix socket forwarded by OpenSSH to the engine's socket on the target."""
        self._tmp = tempfile.mkdtemp(prefix="sparkgate-docker-")
        sock = os.path.join(self._tmp, "docker.sock")
        base = ssh_argv(self.target, self.ssh_config, self.identity_file)
        # Its own connection (no ControlMaster): the forward lives exactly as long as this process, and in its
        # own session, out of reach of the terminal's Ctrl-C.
        cmd = [*base[:-1], "-N", "-o", "ExitOnForwardFailure=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none",
               "-o", "StreamLocalBindUnlink=yes", "-L", f"{sock}:{self.remote_socket}", base[-1]]
        self.tunnel = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if self.tunnel.poll() is not None:
                err = self.tunnel.stderr.read().decode(errors="replace") if self.tunnel.stderr else ""
                raise StartError(f"ssh could not forward the docker socket of {self.target}: {err.strip()}")
            if time.monotonic() > deadline:
                raise StartError(f"ssh did not forward the docker socket of {self.target} within 30 s")
            time.sleep(0.05)
        return sock

    def close(self) -> None:
        if "client" in self.__dict__:
            with contextlib.suppress(Exception):
                self.__dict__.pop("client").close()
        if self.tunnel is not None:
            if self.tunnel.poll() is None:
                self.tunnel.terminate()
                try:
                    self.tunnel.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.tunnel.kill()
                    self.tunnel.wait()
            self.tunnel = None
        if self._tmp:
            with contextlib.suppress(OSError):
                for f in os.listdir(self._tmp):
                    os.unlink(os.path.join(self._tmp, f))
                os.rmdir(self._tmp)
            self._tmp = None
