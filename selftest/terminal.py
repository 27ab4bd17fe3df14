"""The suite run as an operator runs it: a pytest process on a pseudo-terminal of its own, whose output is read
as it comes and to which keys (Ctrl-C) and signals are sent at chosen moments.

Ctrl-C typed on a terminal is SIGINT to its whole foreground process group (pytest and every child that did not
leave the group), which is what `interrupt()` does: it writes ^C to the terminal, and the kernel does the rest.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Every run of the acceptance suite the self-tests start: neither pytest's cache nor Hypothesis' plugin (which
# pytest loads by its entry point, and which costs a second or more of import in each of about a hundred runs), and
# the log of which self-test proved each check (selftest/proofs.py).
SUITE_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "selftest.proofs")


def _controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # stdin is the terminal's slave side; we lead a new session


class Terminal:
    def __init__(self, *pytest_args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        argv = [sys.executable, "-m", "pytest", *SUITE_PLUGINS, "--color=no", *pytest_args]
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                     start_new_session=True, preexec_fn=_controlling_terminal,
                                     env={**os.environ, "COLUMNS": "200", **(env or {})})
        os.close(slave)
        self.output = ""
        self.started = time.monotonic()

    def _read(self, timeout: float) -> int:
        """Read what comes within `timeout`: the number of bytes, 0 if none came, -1 at the end of output."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return 0
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            return -1
        self.output += chunk.decode(errors="replace").replace("\r\n", "\n")
        return len(chunk) or -1

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match[str]:
        """Read until `pattern` (a regex) shows in the output; AssertionError with the output if it does not."""
        deadline = time.monotonic() + timeout
        while not (m := re.search(pattern, self.output, re.M)):
            if time.monotonic() > deadline or self._read(0.2) < 0:
                raise AssertionError(f"{pattern!r} did not show within {timeout:.0f} s; output:\n{self.output[-4000:]}")
        return m

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def finish(self, timeout: float = 180) -> int:
        """Read to the end and reap the process; its exit status. (A child that outlived pytest and still holds
        the terminal does not keep this waiting: once pytest has exited, a quiet half second ends the output.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self._read(0.5)
            if n < 0 or (n == 0 and self.proc.poll() is not None):
                break
        try:
            rc = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"pytest still running after {timeout:.0f} s; output:\n"
                                 f"{self.output[-4000:]}") from None
        os.close(self.master)
        return rc

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started
