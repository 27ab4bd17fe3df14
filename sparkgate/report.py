"""What a person reads after a run: a summary first (every figure as a row, the failures grouped by their cause,
the skips grouped by reason), plots where a picture says it faster, and the same as Markdown for an issue.

Pure functions of what the run recorded (outcomes, figures, facts); the plugin feeds them into pytest-html's report
and `--summary-md`. Plots are drawn with matplotlib and embedded as PNG, so the report stays one file.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections import defaultdict
from dataclasses import dataclass, field

from . import quality
from .compare import answers_verdict, compare_answers, first_answers, paired
from .measure import Figure
from .redact import mask, md_text
from .results import Answer, CheckResult, Measurement


def _esc(text: str) -> str:
    """Masked, then escaped: a secret holding `&<>"` is found before escaping changes it."""
    return html.escape(mask(text))


def verdict(m: Measurement) -> str:
    if m.floor is None:
        return "recorded"
    met = m.mean >= m.floor if m.higher_is_better else m.mean <= m.floor
    return "meets its floor" if met else "BELOW ITS FLOOR"


@dataclass
class Cause:
    """Several failures with one defect behind them, named by the check that diagnoses it."""

    check: str
    recipe: str | None
    what: str
    also: list[str] = field(default_factory=list)


# A failure that says "the same defect as X's" belongs to X's cause (the detector's checks point at SERVE-SANITY).
_SAME = re.compile(r"the same defect as ([A-Z]+-[A-Z-]+)'s")


def causes(outcomes: list[CheckResult]) -> tuple[list[Cause], list[CheckResult]]:
    """The failures grouped: each group under the check that diagnoses its defect; and the failures that stand
    alone."""
    failed = [o for o in outcomes if o.outcome == "failed"]
    by_check = {(o.recipe, o.id): o for o in failed}
    groups: dict[tuple[str | None, str], Cause] = {}
    alone = []
    for o in failed:
        m = _SAME.search(o.message)
        root = (o.recipe, m.group(1)) if m else None
        if root and root in by_check and root != (o.recipe, o.id):
            cause = groups.setdefault(root, Cause(root[1], o.recipe, first_line(by_check[root].message)))
            cause.also.append(o.id)
        elif root and root not in by_check:  # the diagnosing check did not run: still one cause, named
            cause = groups.setdefault(root, Cause(root[1], o.recipe, first_line(o.message)))
            cause.also.append(o.id)
        else:
            alone.append(o)
    grouped = set(groups)
    return list(groups.values()), [o for o in alone if (o.recipe, o.id) not in grouped]


def first_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    found = next((line for line in lines if line.startswith("found:")), "")
    return (lines[0] if lines else "") + (f" ({found})" if found else "")


def skips_by_reason(outcomes: list[CheckResult]) -> dict[str, list[str]]:
    """Skip reason -> the checks skipped for it (a reason shared by many is one line)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for o in outcomes:
        if o.outcome == "skipped":
            reason = re.sub(r"^\[[A-Z-]+\] could not run: ", "", o.message.strip())
            groups[reason].append(o.id)
    return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))


def _fmt(m: Measurement) -> list[str]:
    share = f"{m.roofline_share:.0%}" if m.roofline_share is not None else ""
    floor = f"{m.floor:g}" if m.floor is not None else ""
    return [m.recipe, m.check, m.name, f"{m.mean:.2f} ± {m.std:.2f} {m.unit}", str(m.n), floor, verdict(m), share]


FIGURE_COLUMNS = ["recipe", "check", "figure", "mean ± std", "n", "floor", "verdict", "roofline share"]


# ---- plots -----------------------------------------------------------------------------------------------

def _png(fig: object) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")  # type: ignore[attr-defined]
    import matplotlib.pyplot as plt

    plt.close(fig)  # type: ignore[arg-type]
    return base64.b64encode(buf.getvalue()).decode()


def _level(figure: Figure) -> int | None:
    return figure.shape.concurrency


def plots(measured: list[Measurement]) -> dict[str, str]:
    """title -> base64 PNG, for each plot the figures allow (none when the run measured nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    for recipe in dict.fromkeys(m.recipe for m in measured):
        mine = [m for m in measured if m.recipe == recipe]
        per_request = [m for m in mine if m.check == "PERF-CONCURRENT" and "per request" in m.name]
        aggregate = [m for m in mine if m.check == "PERF-CONCURRENT" and "aggregate" in m.name]
        if per_request:
            fig, ax = plt.subplots(figsize=(6.4, 3.4))
            xs = [_level(m) for m in per_request]
            ax.errorbar(xs, [m.mean for m in per_request], yerr=[m.std for m in per_request],
                        marker="o", capsize=3, label="decode per request (mean ± std)")
            floors = [(x, m.floor) for x, m in zip(xs, per_request, strict=True) if m.floor is not None]
            if floors:
                ax.scatter(*zip(*floors, strict=True), marker="_", s=400, color="crimson", label="floor", zorder=3)
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel("tok/s per request")
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            if aggregate:
                twin = ax.twinx()
                twin.plot([_level(m) for m in aggregate], [m.mean for m in aggregate], "s--",
                          color="grey", label="aggregate (capacity, not a speed)")
                twin.set_ylabel("tok/s, all requests summed")
                twin.legend(loc="upper right", fontsize=8)
            ax.legend(loc="lower left", fontsize=8)
            ax.set_title(f"{recipe}: per-request decode under concurrency")
            out[f"{recipe}: decode per request against concurrency"] = _png(fig)
        sweep = [m for m in mine if m.check == "PERF-CAPACITY" and "decode" in m.name]
        ttft = {_level(m): m.mean for m in mine if m.check == "PERF-CAPACITY" and "TTFT" in m.name}
        if sweep:
            fig, ax = plt.subplots(figsize=(6.4, 3.4))
            xs = [_level(m) for m in sweep]
            ax.plot(xs, [m.mean for m in sweep], "o-", label="decode per request")
            if sweep[0].floor is not None:
                ax.axhline(sweep[0].floor, color="crimson", linestyle=":", label="usable")
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel("concurrent requests")
            ax.set_ylabel("tok/s per request")
            if ttft:
                twin = ax.twinx()
                twin.plot(list(ttft), list(ttft.values()), "^--", color="darkorange", label="worst TTFT")
                twin.set_ylabel("seconds to first token")
                twin.legend(loc="upper right", fontsize=8)
            ax.legend(loc="lower left", fontsize=8)
            ax.set_title(f"{recipe}: capacity sweep")
            out[f"{recipe}: capacity sweep with time to first token"] = _png(fig)
        rated = [m for m in mine if m.unit == "tok/s" and m.roofline and "aggregate" not in m.name
                 and m.check in ("PERF-NATURAL", "PERF-CONCURRENT", "PERF-FORCED", "PERF-LONG-DECODE")]
        if rated:
            fig, ax = plt.subplots(figsize=(6.4, 3.4))
            for i, m in enumerate(rated):
                ax.scatter(m.raw, [i] * len(m.raw), alpha=0.7)
            ax.axvline(rated[0].roofline, color="black", linestyle="--", label="roofline (memory bandwidth)")
            ax.set_yticks(range(len(rated)), [m.name for m in rated], fontsize=7)
            ax.set_xlabel("tok/s per request (every request)")
            ax.legend(fontsize=8)
            ax.set_title(f"{recipe}: per-request decode against the roofline")
            out[f"{recipe}: per-request decode against the roofline"] = _png(fig)
    return out


# ---- the summary ---------------------------------------------------------------------------------------

ANSWER_COLUMNS = ["recipe", "check", "right", "by family", "against the baseline", "wrong (first 3)"]


def answer_rows(answers: list[Answer], baseline: list[Answer] | None = None) -> list[list[str]]:
    """One row per recipe and check of the answers (quality probes, agent episodes): how many right, by family, and
    (with a baseline) the paired verdict of sparkgate.compare."""
    now, before = first_answers(answers), first_answers(baseline or [])
    rows = []
    for (recipe, check), first in now.items():
        gate = "no baseline" if baseline is None else "the baseline has no answers to pair with these"
        if pairs := paired(before.get((recipe, check), {}), first):
            c = compare_answers(recipe, check, pairs, first,
                                [a for a in baseline or [] if (a.recipe, a.check) == (recipe, check)])
            gate = f"{answers_verdict(c.flips)}: {c.flips.describe()}"
        wrong = [f"{a.probe}: {a.text[:40]!r}" for a in first.values() if not a.right][:3]
        rows.append([recipe, check, f"{sum(a.right for a in first.values())}/{len(first)}",
                     quality.by_kind(first.values()), gate, "; ".join(wrong)])
    return rows


def html_table(columns: list[str], rows: list[list[str]], id_: str | None = None) -> str:
    """A table of masked, escaped cells."""
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    ident = f' id="{id_}"' if id_ else ""
    return f'<table class="sparkgate-table"{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


STYLE = """<style>
.sparkgate-summary{font-family:sans-serif;margin:1em 0}.sparkgate-summary h2{margin:.8em 0 .3em}
.sparkgate-table{border-collapse:collapse;font-size:13px}.sparkgate-table td,.sparkgate-table th{border:1px solid #ccc;
padding:3px 6px;text-align:left}.sparkgate-table th{background:#eee}.sparkgate-cause{color:#a00}
.sparkgate-plots img{max-width:640px;margin:4px;border:1px solid #ddd}
</style>"""


def summary_html(outcomes: list[CheckResult], measured: list[Measurement], answers: list[list[str]] = (),
                 title: str = "sparkgate", anchor: str = "") -> str:
    """The section that opens the report (in a fleet's, one per box: `title` is the box, and `anchor` ends each of
    the section's ids, which must be unique in the page)."""
    counts = {k: sum(1 for o in outcomes if o.outcome == k) for k in ("passed", "failed", "skipped")}
    parts = [STYLE, f'<div class="sparkgate-summary" id="sparkgate-summary{anchor}">',
             f"<h2>{_esc(title)}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} could not "
             "run</h2>"]
    grouped, alone = causes(outcomes)
    if grouped or alone:
        parts.append(f'<h2 id="sparkgate-failures{anchor}">Failures</h2><ul>')
        for c in grouped:
            parts.append(f'<li class="sparkgate-cause"><b>One cause, diagnosed by {_esc(c.check)}</b>'
                         f"{' on ' + _esc(c.recipe) if c.recipe else ''}: {_esc(c.what)}; it also "
                         f"fails {_esc(', '.join(dict.fromkeys(c.also)))}</li>")
        for o in alone:
            parts.append(f"<li><b>{_esc(o.id)}</b>{' on ' + _esc(o.recipe) if o.recipe else ''}: "
                         f"{_esc(first_line(o.message))}</li>")
        parts.append("</ul>")
    if measured:
        parts.append(f'<h2 id="sparkgate-figures{anchor}">Figures (per request unless named aggregate)</h2>')
        parts.append(html_table(FIGURE_COLUMNS, [_fmt(m) for m in measured]))
        images = plots(measured)
        if images:
            parts.append('<h2>Plots</h2><div class="sparkgate-plots">' + "".join(
                f'<img alt="{_esc(t)}" title="{_esc(t)}" src="data:image/png;base64,{b}">'
                for t, b in images.items()) + "</div>")
    if answers:
        parts.append(f'<h2 id="sparkgate-answers{anchor}">Answers (quality probes, agent episodes)</h2>')
        parts.append(html_table(ANSWER_COLUMNS, [list(r) for r in answers]))
    skips = skips_by_reason(outcomes)
    if skips:
        parts.append(f'<details id="sparkgate-skips{anchor}"><summary><b>Could not run</b> '
                     f"({counts['skipped']} checks, {len(skips)} reasons)</summary>")
        parts.append(html_table(["reason", "checks"], [[r, ", ".join(dict.fromkeys(c))] for r, c in skips.items()]))
        parts.append("</details>")
    parts.append("</div>")
    return "".join(parts)


def summary_markdown(outcomes: list[CheckResult], measured: list[Measurement], env: dict[str, str],
                     answers: list[list[str]] = (), title: str = "sparkgate") -> str:
    """The same, short enough to paste into an issue."""
    counts = {k: sum(1 for o in outcomes if o.outcome == k) for k in ("passed", "failed", "skipped")}
    lines = [f"## {md_text(title)}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} could "
             "not run", ""]
    grouped, alone = causes(outcomes)
    if grouped or alone:
        lines += ["### Failures", ""]
        lines += [f"- **One cause, diagnosed by {md_text(c.check)}**{' on ' + md_text(c.recipe) if c.recipe else ''}: "
                  f"{md_text(c.what)}; it also fails {md_text(', '.join(dict.fromkeys(c.also)))}" for c in grouped]
        lines += [f"- **{md_text(o.id)}**{' on ' + md_text(o.recipe) if o.recipe else ''}: "
                  f"{md_text(first_line(o.message))}" for o in alone]
        lines.append("")
    if measured:
        lines += ["### Figures", "", "| " + " | ".join(FIGURE_COLUMNS) + " |",
                  "|" + " --- |" * len(FIGURE_COLUMNS)]
        lines += ["| " + " | ".join(md_text(c) for c in _fmt(m)) + " |" for m in measured]
        lines.append("")
    if answers:
        lines += ["### Answers (quality probes, agent episodes)", "", "| " + " | ".join(ANSWER_COLUMNS) + " |",
                  "|" + " --- |" * len(ANSWER_COLUMNS)]
        lines += ["| " + " | ".join(md_text(c) for c in r) + " |" for r in answers]
        lines.append("")
    lines += ["### Environment", ""] + [f"- {md_text(k)}: {md_text(str(v))}" for k, v in env.items()] + [""]
    skips = skips_by_reason(outcomes)
    if skips:
        lines += [f"<details><summary>Could not run: {counts['skipped']} checks, {len(skips)} reasons</summary>", ""]
        lines += [f"- {md_text(r)}: {md_text(', '.join(dict.fromkeys(c)))}" for r, c in skips.items()]
        lines += ["", "</details>", ""]
    return "\n".join(lines)
