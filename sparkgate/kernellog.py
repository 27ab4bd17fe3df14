"""The box's kernel log, read for the faults an operator greps it for: the NVIDIA driver's Xid reports and PCIe AER
errors.

`dmesg` first; where the kernel keeps its buffer from users (kernel.dmesg_restrict=1, Ubuntu's default) `journalctl
-k`, which members of the adm and systemd-journal groups may read. Both stamp each line with seconds since boot, so a
run marks the last line it saw when it began and judges only what came after.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .redact import printable

COMMANDS = ("dmesg", "journalctl -k -b -o short-monotonic --no-pager -q")
_LINE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
_JOURNAL_HOST = re.compile(r"^\S+ kernel: ")  # short-monotonic: "[    3.733040] spark01 kernel: NVRM: ..."
XID = re.compile(r"\bNVRM: Xid \(")  # NVRM: Xid (PCI:0000:0f:01): 79, pid=..., GPU has fallen off the bus.
# "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error message received from 0000:01:00.0", and per error
# "nvidia 0000:01:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)"
AER_UNCORRECTED = re.compile(r"\b(AER: .*|PCIe Bus Error: severity=)(Uncorrect|Fatal)", re.I)
AER_CORRECTED = re.compile(r"\b(AER: .*|PCIe Bus Error: severity=)(?<!un)Corrected\b", re.I)
SHOWN = 3  # lines quoted per kind; the rest are counted


@dataclass
class KernelLog:
    source: str | None  # the command that read it; None: none could
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds since boot, message)
    refused: str = ""  # why no command could read it

    @property
    def mark(self) -> float:
        """The stamp of its last line: what a later read counts from."""
        return max((t for t, _ in self.lines), default=0.0)

    def since(self, mark: float) -> list[tuple[float, str]]:
        return [(t, text) for t, text in self.lines if t > mark]


def read(run: Callable[[str], Any]) -> KernelLog:
    """Read the kernel log through `run` (a testinfra host's run): the first command that prints stamped lines."""
    refusals = []
    for command in COMMANDS:
        res = run(f"LC_ALL=C {command}")
        lines = parse(res.stdout, journal=command.startswith("journalctl")) if res.rc == 0 else []
        if lines:
            return KernelLog(command, lines)
        said = printable((res.stderr or "").strip().splitlines()[0] if (res.stderr or "").strip() else "")
        refusals.append(f"`{command}`: " + (said or (f"exit {res.rc}" if res.rc else "no stamped lines")))
    return KernelLog(None, refused="; ".join(refusals))


def parse(text: str, journal: bool = False) -> list[tuple[float, str]]:
    """(seconds since boot, message) of each stamped line; anything else is left out."""
    out = []
    for raw in text.splitlines():
        if m := _LINE.match(raw):
            message = _JOURNAL_HOST.sub("", m[2], count=1) if journal else m[2]
            out.append((float(m[1]), message))
    return out


@dataclass
class Faults:
    xid: list[str]
    aer_uncorrected: list[str]
    aer_corrected: int

    @property
    def any(self) -> bool:
        return bool(self.xid or self.aer_uncorrected)

    def __str__(self) -> str:
        parts = []
        for kind, found in (("NVRM Xid", self.xid), ("uncorrected PCIe AER", self.aer_uncorrected)):
            shown = "; ".join(found[:SHOWN]) + (f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
            parts.append(f"{len(found)} {kind} line(s)" + (f": {shown}" if found else ""))
        parts.append(f"{self.aer_corrected} corrected PCIe AER line(s) (recorded, not judged)")
        return "; ".join(parts)


def faults(lines: list[tuple[float, str]]) -> Faults:
    stamped = [(text, f"[{t:.3f}] {printable(text)}") for t, text in lines]
    return Faults(xid=[s for text, s in stamped if XID.search(text)],
                  aer_uncorrected=[s for text, s in stamped if AER_UNCORRECTED.search(text)],
                  aer_corrected=sum(1 for text, _ in stamped if AER_CORRECTED.search(text)))
