"""Process utilities below everything: the cache folder, the parent-death signal, the signals that tear a run down
and the shield that holds them off during a teardown."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def to_stderr(line: str) -> None:
    """A line on stderr from a signal handler (os.write: print's buffer may be mid-write), best effort: the terminal
    may be gone (SIGHUP) or its pipe closed."""
    try:
        os.write(2, line.encode())
    except OSError:
        pass


def cache_dir() -> Path:
    """Where converted weights, compiler caches and server logs live (SPARKGATE_CACHE to move it)."""
    path = Path(os.environ.get("SPARKGATE_CACHE") or Path.home() / ".cache" / "sparkgate")
    path.mkdir(parents=True, exist_ok=True)
    return path


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """preexec_fn: the child gets `sig` when the suite's process dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, sig)


DEFERRED_SIGNALS: list[int] = []  # received during a shielded teardown: the run stops after it (the plugin)


def noting(progress: Callable[[str], None], what: str) -> Callable[[int, object], None]:
    """A signal handler that notes a signal instead of obeying it, saying so (at most every 5 s)."""
    said = [0.0]

    def note(signum: int, _frame: object) -> None:
        DEFERRED_SIGNALS.append(signum)
        if time.monotonic() - said[0] > 5:
            said[0] = time.monotonic()
            progress(f"{signal.Signals(signum).name} received: {what} goes on to its end, then the run stops (a "
                     f"restore abandoned half-way leaves the box worse; to abandon it anyway, Ctrl-\\ or kill -9: "
                     f"the next run puts the box back)")

    return note


@contextlib.contextmanager
def shielded(progress: Callable[[str], None], what: str) -> Iterator[None]:
    """Run a teardown to its end: Ctrl-C, SIGTERM and SIGHUP during it are noted, not obeyed (a second Ctrl-C
    must never abandon a restore half-way); the run stops once it is done. Only the main thread can hold
    signals; elsewhere it runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    note = noting(progress, what)
    previous = {s: signal.signal(s, note) for s in TEARDOWN_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
