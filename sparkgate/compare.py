"""Two results files side by side: which figures regressed, by how much, with what confidence, and which checks
newly fail. One rule, used by `sparkgate compare` and by a run's `--baseline` alike:

A figure regressed when it got slower by more than the tolerance AND the move is beyond the noise of both samples:
Welch's t-test (scipy), one-sided, on the logarithms, at p < 0.01 (ALPHA). A bare ratio of means would cry wolf on every
noisy pair; a test alone would flag drops too small to matter. The test's samples are the independent repetitions: one
request at concurrency 1, one round (the mean of its c requests) at concurrency c, since the requests of one round share
one batch and rise and fall together; counting them as c samples would read a run-to-run drift as a significant change.
A figure with fewer than two repetitions on a side (an aggregate, a server-side counter, a sweep's single round per
level) cannot be tested and is shown, never judged. A check that passed in the baseline and fails in the candidate is a
regression.

"Slower by X%" is one measure for times and rates alike: a time X% longer, or a rate at which the same work takes X%
longer (tok/s falling from 100 to 100 / (1 + X/100)). Judged on the change of a rate instead, a decode speed and its
inter-token latency, one slowdown seen twice, would get two verdicts (-34% against +51%), and no tolerance of 100% or
more could ever flag a rate.

Figures are matched by recipe, check and name; a pair whose shape or method differs is not comparable, and the
comparison is refused with the reason rather than judged.

Answers (schema 3) are compared beside the figures, probe by probe (sparkgate.quality): worse is McNemar's exact test
on the paired outcomes at p < ALPHA; how far the answers moved is shown beside the baseline's own rerun noise, not
judged.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from . import quality
from .measure import Figure
from .results import Answer, Measurement, Results

TOLERANCE_PCT = 5.0
ALPHA = 0.01


class NotComparable(Exception):
    """The two files measured different things (shape, method); the message lists them."""


@dataclass
class FigureComparison:
    recipe: str
    check: str
    name: str
    unit: str
    base: Figure
    cand: Figure
    change: float  # candidate / baseline - 1 (signed)
    worse_by: float  # how much slower, as a fraction of the baseline's time for the same work (negative: faster)
    p_value: float | None  # None: not testable (fewer than 2 repetitions on a side, or no spread at all)
    regressed: bool

    @property
    def verdict(self) -> str:
        if self.regressed:
            return "REGRESSED"
        if self.p_value is None:
            return "not tested (one repetition)"
        return "no significant change"

    def describe(self) -> str:
        conf = f", confidence {1 - self.p_value:.1%} (p={self.p_value:.2g})" if self.p_value is not None else ""
        slower = f", {self.worse_by:.0%} slower" if self.base.higher_is_better and self.worse_by > 0 else ""
        return (f"{self.recipe} [{self.check}] {self.name}: {self.base.mean:.2f} -> {self.cand.mean:.2f} {self.unit} "
                f"({self.change:+.1%}{slower}{conf})")


@dataclass
class AnswersComparison:
    """One recipe's answers to one check's probes (QUAL-ANSWERS' questions, QUAL-AGENT-*'s episodes), before and
    after."""

    recipe: str
    check: str
    flips: quality.Flips
    moved: quality.Movement | None  # how far the answers moved from the baseline's
    noise: quality.Movement | None  # how far the baseline's own rerun moved (the engine's noise)
    lost: list[str]  # probe: before -> after, right to wrong

    @property
    def worse(self) -> bool:
        return self.flips.significantly_worse

    def describe(self) -> str:
        moved = f"; moved: {self.moved.describe()}" if self.moved else ""
        noise = f" (the baseline's own rerun: {self.noise.describe()})" if self.noise else ""
        return f"{self.recipe} [{self.check}] {self.flips.describe()}{moved}{noise}"


@dataclass
class Comparison:
    figures: list[FigureComparison] = field(default_factory=list)
    answers: list[AnswersComparison] = field(default_factory=list)
    new_failures: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # in the baseline, absent from the candidate

    @property
    def regressions(self) -> list[FigureComparison]:
        return [f for f in self.figures if f.regressed]

    @property
    def worse_answers(self) -> list[AnswersComparison]:
        return [a for a in self.answers if a.worse]

    @property
    def regressed(self) -> bool:
        """A figure significantly worse, answers significantly worse, a check newly failing, or a figure or answers
        the candidate did not measure (what it left out is not what it passed)."""
        return bool(self.regressions or self.worse_answers or self.new_failures or self.missing)


def p_worse(base: list[float], cand: list[float], higher_is_better: bool) -> float | None:
    """One-sided Welch's t-test: the probability of a move this far the wrong way if nothing changed.

    On the logarithms of the repetitions: a slowdown multiplies a time and divides a rate, so on a log scale a rate
    and its time (decode speed, inter-token latency) get the same p, as they get the same "slower by"."""
    if len(base) < 2 or len(cand) < 2:
        return None
    from scipy import stats

    if min(base) > 0 and min(cand) > 0:
        base, cand = [math.log(v) for v in base], [math.log(v) for v in cand]
    if max(base) == min(base) and max(cand) == min(cand):  # no spread at all: the test is undefined
        return None
    result = stats.ttest_ind(cand, base, equal_var=False, alternative="less" if higher_is_better else "greater")
    p = float(result.pvalue)
    return None if math.isnan(p) else p


def repetitions(m: Measurement) -> list[float]:
    """The independent samples of a figure: its raw values, or at concurrency c the mean of each round of c."""
    c = m.shape.concurrency
    return [statistics.fmean(m.raw[i:i + c]) for i in range(0, len(m.raw), c)]


def slower_by(base: float, cand: float, higher_is_better: bool) -> float:
    """How much longer the same work takes in the candidate, as a fraction (negative: faster). A time compares as it
    is; a rate through its reciprocal, the time of one unit of work."""
    if higher_is_better:
        base, cand = cand, base  # the times' cand / base is the rates' base / cand
    if base <= 0:
        return 0.0 if cand <= 0 else math.inf
    return cand / base - 1


def compare_figure(base: Measurement, cand: Measurement, tolerance_pct: float = TOLERANCE_PCT,
                   alpha: float = ALPHA) -> FigureComparison:
    change = cand.mean / base.mean - 1 if base.mean else 0.0
    worse_by = slower_by(base.mean, cand.mean, base.higher_is_better)
    p = p_worse(repetitions(base), repetitions(cand), base.higher_is_better)
    regressed = p is not None and p < alpha and worse_by * 100 > tolerance_pct
    return FigureComparison(base.recipe, base.check, base.name, base.unit, base, cand, change, worse_by, p,
                            regressed)


def key(m: Measurement) -> tuple[str, str, str]:
    return (m.recipe, m.check, m.name)


def compare(base: Results, cand: Results, tolerance_pct: float = TOLERANCE_PCT, alpha: float = ALPHA) -> Comparison:
    """Every figure of the baseline against the candidate's, and every check that newly fails."""
    if base.measured_level != cand.measured_level:
        raise NotComparable(f"the baseline ran at --level {base.measured_level} and the candidate at --level "
                            f"{cand.measured_level}: a level sets the repetitions and shapes, so their figures are "
                            "not like for like; compare two runs of one level")
    cands = {key(m): m for m in cand.measurements}
    out = Comparison()
    mismatched = []
    for b in base.measurements:
        c = cands.get(key(b))
        if c is None:
            out.missing.append(f"{b.recipe} [{b.check}] {b.name}")
            continue
        if b.shape != c.shape:
            mismatched.append(f"{b.recipe} [{b.check}] {b.name}: shape {b.shape.key()} against {c.shape.key()}")
        elif b.method != c.method or b.unit != c.unit:
            mismatched.append(f"{b.recipe} [{b.check}] {b.name}: method {b.method!r} ({b.unit}) against "
                              f"{c.method!r} ({c.unit})")
        else:
            out.figures.append(compare_figure(b, c, tolerance_pct, alpha))
    answered = first_answers(cand.answers)
    for (recipe, check), before in first_answers(base.answers).items():
        if not (pairs := paired(before, answered.get((recipe, check), {}))):
            # None answered, or all asked differently (another version of the probes or episodes): nothing to pair.
            out.missing.append(f"{recipe} [{check}] answers to the baseline's probes or episodes, asked the same way")
            continue
        out.answers.append(compare_answers(recipe, check, pairs, answered[(recipe, check)],
                                           [a for a in base.answers if (a.recipe, a.check) == (recipe, check)]))
    if mismatched:
        raise NotComparable("these figures were measured differently, so their numbers do not compare:\n  "
                            + "\n  ".join(mismatched))
    passed = {c.test for c in base.checks if c.outcome == "passed"}
    out.new_failures = [f"{c.id} ({c.test}): {c.message}" for c in cand.checks
                        if c.outcome == "failed" and c.test in passed]
    return out


def first_answers(answers: list[Answer]) -> dict[tuple[str, str], dict[str, Answer]]:
    """(recipe, check) -> each probe's first answer (the reruns are the noise, not the outcome): each check's probes
    are paired and tested on their own."""
    out: dict[tuple[str, str], dict[str, Answer]] = {}
    for a in answers:
        if not a.rerun:
            out.setdefault((a.recipe, a.check), {}).setdefault(a.probe, a)
    return out


def paired(before: dict[str, Answer], after: dict[str, Answer]) -> dict[str, Answer]:
    """The answers of `before` to probes `after` answered too, asked the same way (the same prompt)."""
    return {p: a for p, a in before.items() if p in after and a.prompt_digest == after[p].prompt_digest}


def _steps(a: Answer) -> list[quality.Step]:
    return [(s.text, s.logprob, s.top) for s in a.steps]


def rerun_noise(answers: list[Answer]) -> quality.Movement | None:
    """How far one run's reruns moved from its first answers to the same probes: the engine's own noise."""
    first = {a.probe: _steps(a) for a in answers if not a.rerun}
    again = {a.probe: _steps(a) for a in answers if a.rerun and a.probe in first}
    return quality.movement(first, again) if again else None


def compare_answers(recipe: str, check: str, before: dict[str, Answer], after: dict[str, Answer],
                    base_all: list[Answer] | None = None) -> AnswersComparison:
    """Paired outcomes (McNemar), how far the answers moved, and the baseline's own rerun noise (of `base_all`,
    the baseline's answers to the same check with its reruns)."""
    flips = quality.flips({p: a.right for p, a in before.items()}, {p: a.right for p, a in after.items()})
    moved = quality.movement({p: _steps(a) for p, a in before.items()}, {p: _steps(a) for p, a in after.items()})
    noise = rerun_noise(base_all or [])
    lost = [f"{p}: {before[p].text[:40]!r} -> {after[p].text[:40]!r}" for p in sorted(set(before) & set(after))
            if before[p].right and not after[p].right]
    return AnswersComparison(recipe, check, flips, moved, noise, lost)


def answers_verdict(flips: quality.Flips) -> str:
    """The paired verdict in words; a baseline too weak to show a loss is not called 'not worse'."""
    if flips.significantly_worse:
        return "WORSE"
    return "not significantly worse" if flips.can_show_loss else "not judged: too few right in the baseline"


def report(comparison: Comparison, tolerance_pct: float = TOLERANCE_PCT, alpha: float = ALPHA) -> str:
    """The comparison as a person reads it: the verdict first, then every figure side by side."""
    lines = []
    if comparison.regressed:
        lines.append(f"REGRESSED: {len(comparison.regressions)} figure(s) slower by more than {tolerance_pct:g}% "
                     f"beyond the noise (Welch's t-test, p < {alpha:g}), {len(comparison.worse_answers)} recipe(s) "
                     f"answering worse (McNemar's exact test, p < {quality.ALPHA:g}), "
                     f"{len(comparison.new_failures)} check(s) newly failing, {len(comparison.missing)} figure(s) or "
                     "answers of the baseline not measured")
        lines += [f"  {f.describe()}" for f in comparison.regressions]
        for a in comparison.worse_answers:
            lines.append(f"  answers worse: {a.describe()}")
            lines += [f"    right to wrong: {lost}" for lost in a.lost[:10]]
        lines += [f"  newly failing: {f}" for f in comparison.new_failures]
        lines += [f"  not measured: {m}" for m in comparison.missing]
    else:
        lines.append(f"no regression: no figure slower by more than {tolerance_pct:g}% beyond the noise "
                     f"(p < {alpha:g}), no answers significantly worse, no check newly failing")
    if comparison.answers:
        lines.append("")
        lines.append("answers (quality probes and agent episodes, paired):")
        lines += [f"  {a.describe()}: {answers_verdict(a.flips)}" for a in comparison.answers]
    lines.append("")
    lines.append(f"{'figure':70} {'baseline':>22} {'candidate':>22} {'change':>8} {'p':>8}  verdict")
    for f in comparison.figures:
        b = f"{f.base.mean:.2f} ± {f.base.std:.2f} (n={f.base.n})"
        c = f"{f.cand.mean:.2f} ± {f.cand.std:.2f} (n={f.cand.n})"
        p = f"{f.p_value:.2g}" if f.p_value is not None else "-"
        lines.append(f"{(f.recipe + ' [' + f.check + '] ' + f.name)[:70]:70} {b:>22} {c:>22} {f.change:>+8.1%} "
                     f"{p:>8}  {f.verdict}")
    return "\n".join(lines) + "\n"
