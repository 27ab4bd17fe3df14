"""Many results files as one table, for an issue or a leaderboard; and the same figures in llama-benchy's own
formats, so a sparkgate run stands beside llama-benchy results on the boards Spark owners already use.

One row per system x recipe x image; the key figures as columns, each with its spread and n. llama-benchy's rows are
named by its shapes (`pp{prompt tokens}`, `tg{generated tokens}`, ` @ d{depth}`, ` (c{concurrency})`) with its own
columns and units (t/s, and ms for times); `read_llama_benchy` reads both its CSV and its JSON, whoever wrote them.
"""

from __future__ import annotations

import csv
import html
import io
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .measure import Figure
from .redact import csv_text, md_text
from .results import Results

# The key figures, by (check, name as the suite writes it): the column each one fills.
KEY_FIGURES = {
    ("PERF-NATURAL", "natural decode, per request"): "natural decode (tok/s)",
    ("PERF-CONCURRENT", "decode per request at 1 concurrent"): "decode @1 (tok/s)",
    ("PERF-CONCURRENT", "decode per request at 4 concurrent"): "decode @4 per request (tok/s)",
    ("PERF-CONCURRENT", "decode per request at 8 concurrent"): "decode @8 per request (tok/s)",
    ("PERF-CONCURRENT", "decode per request at 16 concurrent"): "decode @16 per request (tok/s)",
    ("PERF-LONG-DECODE", "long-context decode, per request"): "long-context decode (tok/s)",
    ("PERF-LONG-PREFILL", "long-context prefill"): "long-context prefill (tok/s)",
    ("PERF-LONG-PREFILL", "long-context TTFT"): "long-context TTFT (s)",
    ("PERF-FORCED", "forced-length decode, per request (not a feel figure)"): "forced-length decode (tok/s)",
}
IDENTITY = ["system", "gpu", "driver", "recipe", "image", "vLLM", "suite", "submitter"]


def _cell(f: Figure | None) -> str:
    return "" if f is None else f"{f.mean:.2f} ± {f.std:.2f} (n={f.n})"


def rows(files: Iterable[Results]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows): one row per system x recipe x image."""
    columns = IDENTITY + list(dict.fromkeys(KEY_FIGURES.values()))
    out = []
    for r in files:
        for run in r.recipes:
            figures = {KEY_FIGURES[(m.check, m.name)]: m for m in r.measurements
                       if m.recipe == run.recipe and (m.check, m.name) in KEY_FIGURES}
            sysinfo = r.system
            ident = [sysinfo.hostname if sysinfo else "", ", ".join(sysinfo.gpus) if sysinfo else "",
                     (sysinfo.driver or "") if sysinfo else "", run.recipe,
                     f"{run.image or '(process)'}" + (f" {run.image_id[:19]}" if run.image_id else ""),
                     run.vllm_version or "", f"{r.suite.version} ({r.suite.commit})", r.submitter.name or ""]
            out.append(ident + [_cell(figures.get(c)) for c in columns[len(IDENTITY):]])
    return columns, out


def markdown(columns: list[str], table: list[list[str]]) -> str:
    esc = [[md_text(c) for c in row] for row in table]
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns),
                      *("| " + " | ".join(r) + " |" for r in esc)]) + "\n"


def as_csv(columns: list[str], table: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(columns)
    writer.writerows([[csv_text(c) for c in row] for row in table])
    return buf.getvalue()


def as_html(columns: list[str], table: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in table)
    return ('<!doctype html><meta charset="utf-8"><title>sparkgate results</title><style>table{border-collapse:'
            'collapse;font:13px sans-serif}td,th{border:1px solid #ccc;padding:3px 6px}th{background:#eee}</style>'
            f'<h1>sparkgate results</h1><table id="results"><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table>\n')


# ---- llama-benchy's formats --------------------------------------------------------------------------
# Its rows: `pp{prompt tokens}` (prefill) and `tg{generated tokens}` (decode), ` @ d{depth}` for context before the
# prompt, ` (c{concurrency})` on every row once any test ran concurrently. Speeds in t/s (t_s: the batch's total,
# t_s_req: per request), times in ms; std is numpy's default, the population's (ddof=0), where sparkgate's is the
# sample's: converted on the way out.

LLAMA_BENCHY_CSV = ["model", "test_name", "t_s_mean", "t_s_std", "t_s_req_mean", "t_s_req_std", "peak_ts_mean",
                    "peak_ts_std", "peak_ts_req_mean", "peak_ts_req_std", "ttfr_mean", "ttfr_std", "est_ppt_mean",
                    "est_ppt_std", "e2e_ttft_mean", "e2e_ttft_std"]


@dataclass
class Metric:
    """llama-benchy's metric: mean, population std, raw values."""

    mean: float
    std: float
    values: list[float]

    @classmethod
    def of(cls, f: Figure, scale: float = 1.0) -> Metric:
        values = [v * scale for v in f.raw]
        return cls(f.mean * scale, statistics.pstdev(values), values)


@dataclass
class BenchyRow:
    """One llama-benchy row: a test (pp or tg at a shape), its throughput (t/s) and time to first token (ms)."""

    model: str
    test: str  # pp512, tg128
    depth: int = 0
    concurrency: int = 1
    t_s: Metric | None = None  # the batch's total
    t_s_req: Metric | None = None  # per request
    e2e_ttft: Metric | None = None  # ms

    def name(self, concurrent_file: bool) -> str:
        return self.test + (f" @ d{self.depth}" if self.depth else "") + \
            (f" (c{self.concurrency})" if concurrent_file else "")

    @property
    def prefill(self) -> bool:
        return self.test.startswith("pp")


def benchy_rows(r: Results) -> list[BenchyRow]:
    """The figures a run measured on llama-benchy's shapes, as llama-benchy names them: prefill (pp) from the
    long-context runs, generation (tg) from PERF-FORCED (its --exact-tg), PERF-CONCURRENT (max_tokens, natural
    stop: its default) and the decode after a long prompt (the prompt counted as depth)."""
    model = {run.recipe: run.model for run in r.recipes}
    by = {(m.recipe, m.check, m.name): m for m in r.measurements}
    out = []
    for m in r.measurements:
        s, name = m.shape, model.get(m.recipe, m.recipe)
        if m.check == "PERF-LONG-PREFILL" and m.name == "long-context prefill" and s.prompt_tokens:
            ttft = by.get((m.recipe, m.check, "long-context TTFT"))
            out.append(BenchyRow(name, f"pp{s.prompt_tokens}", 0, s.concurrency, Metric.of(m), Metric.of(m),
                                 Metric.of(ttft, 1000) if ttft else None))
        elif m.check in ("PERF-FORCED", "PERF-CONCURRENT", "PERF-LONG-DECODE") and "per request" in m.name \
                and m.unit == "tok/s" and s.max_tokens:
            c = s.concurrency
            total = by.get((m.recipe, m.check, f"aggregate at {c} concurrent (capacity: {c} requests summed, "
                                                 "not a speed)")) if c > 1 else m
            depth = (s.prompt_tokens or 0) if m.check == "PERF-LONG-DECODE" else 0
            out.append(BenchyRow(name, f"tg{s.max_tokens}", depth, c, Metric.of(total) if total else None,
                                 Metric.of(m)))
    return out


def benchy_csv(rows_: list[BenchyRow]) -> str:
    concurrent = any(row.concurrency > 1 for row in rows_)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=LLAMA_BENCHY_CSV)
    writer.writeheader()
    for row in rows_:
        out: dict[str, Any] = {c: None for c in LLAMA_BENCHY_CSV}
        out.update(model=row.model, test_name=row.name(concurrent))
        for field_ in ("t_s", "t_s_req", "e2e_ttft"):
            if (metric := getattr(row, field_)) is not None:
                out[f"{field_}_mean"], out[f"{field_}_std"] = metric.mean, metric.std
        writer.writerow(out)
    return buf.getvalue()


def benchy_json(r: Results, rows_: list[BenchyRow]) -> str:
    """llama-benchy's JSON report: its metadata, then one benchmark per measured shape."""
    def metric(m: Metric | None) -> dict[str, Any] | None:
        return None if m is None else {"mean": m.mean, "std": m.std, "values": m.values}

    benchmarks = [{"concurrency": row.concurrency, "context_size": row.depth,
                   "prompt_size": int(row.test[2:]) if row.prefill else 0,
                   "response_size": 0 if row.prefill else int(row.test[2:]), "is_context_prefill_phase": False,
                   "pp_throughput": metric(row.t_s) if row.prefill else None,
                   "pp_req_throughput": metric(row.t_s_req) if row.prefill else None,
                   "tg_throughput": None if row.prefill else metric(row.t_s),
                   "tg_req_throughput": None if row.prefill else metric(row.t_s_req),
                   "e2e_ttft": metric(row.e2e_ttft)} for row in rows_]
    meta = {"version": f"sparkgate {r.suite.version}", "timestamp": r.started, "latency_mode": "none",
            "latency_ms": 0.0, "model": rows_[0].model if rows_ else "", "prefix_caching_enabled": False,
            "max_concurrency": max((row.concurrency for row in rows_), default=1)}
    return json.dumps({**meta, "benchmarks": benchmarks}, indent=2) + "\n"


def read_llama_benchy(path: Path) -> dict[str, BenchyRow]:
    """llama-benchy's CSV or JSON (its own, or sparkgate's in its format), by test name: one reader for both."""
    text = Path(path).read_text()
    out: dict[str, BenchyRow] = {}
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        concurrent = data.get("max_concurrency", 1) > 1

        def metric(m: dict[str, Any] | None) -> Metric | None:
            return Metric(m["mean"], m["std"], m.get("values", [])) if m else None

        for b in data["benchmarks"]:
            if b.get("is_context_prefill_phase"):
                continue
            common = dict(model=data["model"], depth=b["context_size"], concurrency=b["concurrency"])
            rows_ = []
            if b.get("pp_throughput"):
                rows_.append(BenchyRow(test=f"pp{b['prompt_size']}", t_s=metric(b["pp_throughput"]),
                                       t_s_req=metric(b.get("pp_req_throughput")), e2e_ttft=metric(b.get("e2e_ttft")),
                                       **common))
            if b.get("tg_throughput") or b.get("tg_req_throughput"):
                rows_.append(BenchyRow(test=f"tg{b['response_size']}", t_s=metric(b.get("tg_throughput")),
                                       t_s_req=metric(b.get("tg_req_throughput")), **common))
            out.update({row.name(concurrent): row for row in rows_})
        return out
    for row in csv.DictReader(io.StringIO(text)):
        def metric_(k: str, row: dict[str, str] = row) -> Metric | None:
            mean = row.get(f"{k}_mean")
            return Metric(float(mean), float(row.get(f"{k}_std") or 0), []) if mean not in (None, "") else None

        test, _, rest = row["test_name"].partition(" ")
        depth = int(rest.split("@ d")[1].split()[0]) if "@ d" in rest else 0
        conc = int(rest.split("(c")[1].rstrip(")")) if "(c" in rest else 1
        out[row["test_name"]] = BenchyRow(row["model"], test, depth, conc, metric_("t_s"), metric_("t_s_req"),
                                          metric_("e2e_ttft"))
    return out


def render(loaded: list[Results], fmt: str) -> str:
    """The files as one table in `fmt`: md, csv, html, or (one file) llama-benchy-csv or llama-benchy-json."""
    if fmt.startswith("llama-benchy"):
        if len(loaded) != 1:
            raise ValueError("llama-benchy's formats hold one run: give one results file")
        results = loaded[0]
        rows_ = benchy_rows(results)
        return benchy_csv(rows_) if fmt == "llama-benchy-csv" else benchy_json(results, rows_)
    columns, table = rows(loaded)
    return {"md": markdown, "csv": as_csv, "html": as_html}[fmt](columns, table)

