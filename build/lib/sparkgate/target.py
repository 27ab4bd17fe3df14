"""Reaching the box under test: `local`, an ssh name from the ssh config, or ssh://user@host:port.

Every ssh the suite runs carries the same options: never prompt (BatchMode: a bad key fails at once instead of
waiting for a password nobody types), keepalives (a lost network is noticed in about a minute, not hours) and
a connect timeout.
"""

from __future__ import annotations

import subprocess
import tempfile
from typing import Any

from testinfra.backend.local import LocalBackend
from testinfra.backend.ssh import SshBackend
from testinfra.host import Host

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
               "-o", "ConnectTimeout=15")


def is_local(target: str) -> bool:
    return target in ("local", "local://")


def ssh_argv(target: str, ssh_config: str | None = None, identity_file: str | None = None) -> list[str]:
    """`ssh [options] [-p PORT] DESTINATION`: append the remote command (or -N and forwards before the
    destination: it is always the last item)."""
    cmd = ["ssh", *SSH_OPTIONS]
    if ssh_config:
        cmd += ["-F", ssh_config]
    if identity_file:
        cmd += ["-i", identity_file]
    if target.startswith("ssh://"):
        rest = target[len("ssh://"):].rstrip("/")
        hostport = rest.rsplit("@", 1)[-1]
        if ":" in hostport:
            host, port = hostport.rsplit(":", 1)
            return [*cmd, "-p", port, rest[: len(rest) - len(hostport)] + host]
        return [*cmd, rest]
    return [*cmd, target]


class _OwnSession:
    """testinfra's commands, each in a session of its own: the terminal's Ctrl-C goes to the whole foreground
    process group, and would cut a command of a teardown half-way (a journal left on the host, a rename not
    made). The suite decides when to stop; its commands finish."""

    def run_local(self, command: str, *args: str) -> Any:
        cmd = self.encode(self.quote(command, *args))  # type: ignore[attr-defined]
        p = subprocess.Popen(cmd, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        stdout, stderr = p.communicate()
        return self.result(p.returncode, cmd, stdout, stderr)  # type: ignore[attr-defined]


class _SshBackend(_OwnSession, SshBackend):
    pass


class _LocalBackend(_OwnSession, LocalBackend):
    pass


def open_host(target: str, ssh_config: str | None = None, identity_file: str | None = None) -> Any:
    """A testinfra host for `target`. Over ssh, one connection is reused for every command (ControlPath):
    without it testinfra's ssh backend opens a new connection per command."""
    if is_local(target):
        return Host(_LocalBackend())
    spec = target.removeprefix("ssh://")
    control = tempfile.mkdtemp(prefix="sparkgate-ssh-")
    extra = " ".join(SSH_OPTIONS[i] + " " + SSH_OPTIONS[i + 1] for i in range(0, len(SSH_OPTIONS), 2)
                     if "ConnectTimeout" not in SSH_OPTIONS[i + 1])  # testinfra sets its own connect timeout
    return Host(_SshBackend(spec, ssh_config=ssh_config, ssh_identity_file=identity_file, timeout=15,
                            controlpath=f"{control}/%%C", controlpersist=120,  # %%: testinfra %-formats
                            ssh_extra_args=extra))
