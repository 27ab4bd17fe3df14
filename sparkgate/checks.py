"""Check identity and verdicts: every acceptance test carries a stable ID, one MUST statement (the first
line of its docstring), why it matters and what to do. A failure reads, in order: expected, found, why,
what to do. A check that cannot run skips with the reason and the option that would enable it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from .rules import Verdict

T = TypeVar("T")


@dataclass(frozen=True)
class Check:
    id: str
    must: str
    why: str
    fix: str

    @classmethod
    def of(cls, item: pytest.Item) -> Check | None:
        marker = item.get_closest_marker("check")
        if marker is None:
            return None
        doc = (getattr(item, "function", None).__doc__ or "").strip()
        return cls(
            id=marker.args[0],
            must=" ".join(doc.split("\n\n")[0].split()),  # the first paragraph, however it is wrapped
            why=marker.kwargs.get("why", ""),
            fix=marker.kwargs.get("fix", ""),
        )

    def message(self, expected: Any, found: Any, why: str | None = None, fix: str | None = None) -> str:
        lines = [
            f"[{self.id}] {self.must}",
            f"  expected: {expected}",
            f"  found:    {found}",
            f"  why:      {why or self.why}",
            f"  fix:      {fix or self.fix}",
        ]
        return "\n".join(lines)

    def that(self, ok: bool, *, expected: Any, found: Any, why: str | None = None,
             fix: str | None = None) -> None:
        """Fail the check with the full verdict unless `ok`."""
        __tracebackhide__ = True
        if not ok:
            pytest.fail(self.message(expected, found, why, fix), pytrace=False)

    def holds(self, verdict: Verdict, fix: str | None = None) -> None:
        """Apply a configuration rule's verdict (sparkgate.rules): could not run where the rule does not apply."""
        __tracebackhide__ = True
        if verdict.not_applicable:
            self.cannot_run(verdict.not_applicable)
        self.that(verdict.ok, expected=verdict.expected, found=verdict.found, fix=fix)

    def every(self, items: Iterable[T], what: str, where: str, enable: str | None = None) -> list[T]:
        """The set an "every X" check judges, as a list; could not run when it is empty: a verdict over no X at all
        would pass on a host that has none to judge (as HOST-INITRAMFS once did on a /boot with no kernel)."""
        __tracebackhide__ = True
        found = list(items)  # a generator is truthy even when it yields nothing
        if not found:
            self.cannot_run(f"no {what} found in {where}", enable)
        return found

    def cannot_run(self, reason: str, enable: str | None = None) -> None:
        """Skip: the check could not run here. Never a failure, never a silent pass."""
        __tracebackhide__ = True
        pytest.skip(f"[{self.id}] could not run: {reason}" + (f" (to run it: {enable})" if enable else ""))
