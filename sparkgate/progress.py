"""Progress through a long check, the way model loading has it: which step of how many, the time spent, and an
estimate of what is left at the pace so far. The lines are details (left out under -q)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Steps:
    """`steps(what)` before each of `total` steps: "[PERF-CONCURRENT, standard] 3/8 4 concurrent, burst 1 of 5:
    41 s so far, about 68 s left"."""

    def __init__(self, say: Callable[[str], None], label: str, total: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.say, self.label, self.total, self.clock = say, label, max(total, 1), clock
        self.started = clock()
        self.done = 0

    def __call__(self, what: str) -> None:
        elapsed = self.clock() - self.started
        left = f", about {elapsed / self.done * (self.total - self.done):.0f} s left" if self.done else ""
        self.done += 1
        self.say(f"  [{self.label}] {min(self.done, self.total)}/{self.total} {what}: {elapsed:.0f} s so far{left}")
