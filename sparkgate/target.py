"""Reaching the box under test: `local`, an ssh name from the ssh config, or ssh://user@host:port."""

from __future__ import annotations

import tempfile
from typing import Any

import testinfra


def open_host(target: str, ssh_config: str | None = None, identity_file: str | None = None) -> Any:
    """A testinfra host for `target`. Over ssh, one connection is reused for every command (ControlPath):
    without it testinfra's ssh backend opens a new connection per command."""
    if target in ("local", "local://"):
        return testinfra.get_host("local://")
    spec = target if "://" in target else f"ssh://{target}"
    control = tempfile.mkdtemp(prefix="sparkgate-ssh-")
    return testinfra.get_host(spec, ssh_config=ssh_config, ssh_identity_file=identity_file,
                              controlpath=f"{control}/%%C", controlpersist=120)  # %%: testinfra %-formats
