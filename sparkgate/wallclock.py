"""How far a box's clock is from this machine's, read over the connection the run already holds.

`date +%s.%N` runs on the box between two readings of this machine's clock. The box's reading is taken to be
halfway through that round trip, as NTP reads a server, so it is off by at most half the round trip; of a few
tries, the one with the shortest round trip is kept. The round trip is timed with the monotonic clock, so a step of
this machine's own clock during a try cannot shorten it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .redact import printable

READ = "date +%s.%N"
# systemd's view of time sync (timesyncd or chrony behind it): "yes" or "no"; absent without systemd.
SYNC = "timedatectl show --property=NTPSynchronized --value"
_EPOCH = re.compile(r"[0-9]{1,12}\.[0-9]{9}")  # a clock reset to 1970 reads as a small number: still a reading


@dataclass(frozen=True)
class Offset:
    seconds: float | None  # the box's clock minus this machine's; None: not read (error says why)
    within: float = 0.0  # half the round trip: how far the reading may be off either way
    error: str = ""

    def beyond(self, limit: float) -> bool:
        """The clocks are further apart than `limit` even at the reading's most favourable end."""
        return self.seconds is not None and abs(self.seconds) - self.within > limit

    def inside(self, limit: float) -> bool:
        """The clocks are `limit` apart or less even at the reading's least favourable end."""
        return self.seconds is not None and abs(self.seconds) + self.within <= limit


def parse_epoch(text: str) -> float | None:
    """`date +%s.%N`'s output as seconds since the epoch; None for anything else (a box's output is not trusted)."""
    text = text.strip()
    return float(text) if _EPOCH.fullmatch(text) else None


def offset(run: Callable[[str], Any], tries: int = 3, wall: Callable[[], float] = time.time,
           monotonic: Callable[[], float] = time.monotonic) -> Offset:
    """The box's clock against this machine's, through `run` (a testinfra host's run)."""
    best: Offset | None = None
    error = ""
    for _ in range(tries):
        now, start = wall(), monotonic()
        out = run(READ)
        half = (monotonic() - start) / 2
        value = parse_epoch(out.stdout) if out.rc == 0 else None
        if value is None:
            said = printable((out.stdout or "").strip() or (out.stderr or "").strip(), 120) or "nothing"
            error = f"`{READ}` on the box printed {said!r} (exit {out.rc})"
            continue
        if best is None or half < best.within:
            best = Offset(value - (now + half), half)
    return best or Offset(None, error=error)


def synchronized(run: Callable[[str], Any]) -> bool | None:
    """Whether systemd says the box's clock is synchronised (timedatectl's NTPSynchronized); None: it cannot say."""
    out = run(SYNC)
    return {"yes": True, "no": False}.get(out.stdout.strip()) if out.rc == 0 else None


def describe(seconds: float) -> str:
    """'12.4 s ahead of', '0.003 s behind' (this machine's clock)."""
    size = f"{abs(seconds):.3f}" if abs(seconds) < 1 else f"{abs(seconds):,.1f}"
    return f"{size} s {'ahead of' if seconds > 0 else 'behind'}"
