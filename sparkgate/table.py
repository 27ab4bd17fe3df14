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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .measure import Figure
from .results import Measurement, Results

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


def load(path: Path) -> Results:
    return Results.model_validate_json(Path(path).read_text())


def _cell(f: Figure | None) -> str:
    return "" if f is None else f"{f.mean:.2f} ± {f.std:.2f} (n={f.n})"


def rows(files: Iterable[tuple[str, Results]]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows): one row per system x recipe x image."""
    columns = IDENTITY + list(dict.fromkeys(KEY_FIGURES.values()))
    out = []
    for _, r in files:
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
    esc = [[c.replace("|", "\\|") for c in row] for row in table]
    return "\n".join(["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns),
                      *("| " + " | ".join(r) + " |" for r in esc)]) + "\n"


def as_csv(columns: list[str], table: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(columns)
    writer.writerows(table)
    return buf.getvalue()


def as_html(columns: list[str], table: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in table)
    return ('<!doctype html><meta charset="utf-8"><title>sparkgate results</title><style>table{border-collapse:'
            'collapse;font:13px sans-serif}td,th{border:1px solid #ccc;padding:3px 6px}th{background:#eee}</style>'
            f'<h1>sparkgate results</h1><table id="results"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n')


# ---- llama-benchy's formats --------------------------------------------------------------------------

LLAMA_BENCHY_CSV = ["model", "test_name", "t_s_mean", "t_s_std", "t_s_req_mean", "t_s_req_std", "peak_ts_mean",
                    "peak_ts_std", "peak_ts_req_mean", "peak_ts_req_std", "ttfr_mean", "ttfr_std", "est_ppt_mean",
                    "est_ppt_std", "e2e_ttft_mean", "e2e_ttft_std"]


@dataclass
class BenchyRow:
    """One llama-benchy row: a test (pp or tg at a shape) and its throughput (t/s) and times (ms)."""

    model: str
    test_name: str
    t_s: tuple[float, float] | None = None  # (mean, std); total over the batch when concurrent
    t_s_req: tuple[float, float] | None = None  # per request
    e2e_ttft: tuple[float, float] | None = None  # ms

    def as_csv_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {c: None for c in LLAMA_BENCHY_CSV}
        row.update(model=self.model, test_name=self.test_name)
        for name in ("t_s", "t_s_req", "e2e_ttft"):
            value = getattr(self, name)
            if value is not None:
                row[f"{name}_mean"], row[f"{name}_std"] = value
        return row


def _suffix(depth: int, concurrency: int) -> str:
    return (f" @ d{depth}" if depth else "") + (f" (c{concurrency})" if concurrency > 1 else "")


def benchy_rows(r: Results) -> list[BenchyRow]:
    """The figures a run measured on llama-benchy's shapes, as llama-benchy names and measures them: prefill (pp)
    from the long-context runs, generation (tg) from every decode figure at a known output length."""
    model = {run.recipe: run.model for run in r.recipes}
    by = {(m.recipe, m.check, m.name): m for m in r.measurements}
    out = []
    for m in r.measurements:
        s, name = m.shape, model.get(m.recipe, m.recipe)
        c = s.concurrency
        ms = (lambda f: (f.mean * 1000, f.std * 1000))  # noqa: E731 (llama-benchy's times are ms)
        if m.check == "PERF-LONG-PREFILL" and m.name == "long-context prefill" and s.prompt_tokens:
            ttft = by.get((m.recipe, m.check, "long-context TTFT"))
            out.append(BenchyRow(name, f"pp{s.prompt_tokens}{_suffix(0, c)}", (m.mean, m.std), (m.mean, m.std),
                                 ms(ttft) if ttft else None))
        elif m.unit == "tok/s" and "decode" in m.name and "aggregate" not in m.name and s.max_tokens \
                and m.check in ("PERF-FORCED", "PERF-CONCURRENT", "PERF-LONG-DECODE"):
            total = by.get((m.recipe, m.check, f"aggregate at {c} concurrent (capacity: {c} requests summed, "
                                                 "not a speed)")) if c > 1 else m
            depth = s.prompt_tokens or 0 if m.check == "PERF-LONG-DECODE" else 0
            out.append(BenchyRow(name, f"tg{s.max_tokens}{_suffix(depth, c)}",
                                 (total.mean, total.std) if total else None, (m.mean, m.std)))
    return out


def benchy_csv(rows_: list[BenchyRow]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=LLAMA_BENCHY_CSV)
    writer.writeheader()
    writer.writerows(r.as_csv_row() for r in rows_)
    return buf.getvalue()


def benchy_json(r: Results, rows_: list[BenchyRow]) -> str:
    """llama-benchy's JSON report: its metadata, then one benchmark per measured shape."""
    def metric(v: tuple[float, float] | None) -> dict[str, Any] | None:
        return None if v is None else {"mean": v[0], "std": v[1], "values": [v[0]]}

    benchmarks = []
    for row in rows_:
        test = row.test_name.split(" ")[0]
        depth = int(row.test_name.split(" @ d")[1].split(" ")[0]) if " @ d" in row.test_name else 0
        conc = int(row.test_name.split("(c")[1].rstrip(")")) if "(c" in row.test_name else 1
        pp = test.startswith("pp")
        benchmarks.append({"concurrency": conc, "context_size": depth, "prompt_size": int(test[2:]) if pp else 0,
                           "response_size": 0 if pp else int(test[2:]), "is_context_prefill_phase": False,
                           "pp_throughput": metric(row.t_s) if pp else None,
                           "pp_req_throughput": metric(row.t_s_req) if pp else None,
                           "tg_throughput": None if pp else metric(row.t_s),
                           "tg_req_throughput": None if pp else metric(row.t_s_req),
                           "e2e_ttft": metric(row.e2e_ttft)})
    meta = {"version": f"sparkgate {r.suite.version}", "timestamp": r.started, "latency_mode": "none",
            "latency_ms": 0.0, "model": rows_[0].model if rows_ else "", "prefix_caching_enabled": False,
            "max_concurrency": max((b["concurrency"] for b in benchmarks), default=1)}
    return json.dumps({**meta, "benchmarks": benchmarks}, indent=2) + "\n"


def read_llama_benchy(path: Path) -> list[BenchyRow]:
    """llama-benchy's CSV or JSON (its own, or sparkgate's in its format), as rows: the one reader for both."""
    text = Path(path).read_text()
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        out = []
        for b in data["benchmarks"]:
            suffix = _suffix(b["context_size"], b["concurrency"])
            pair = (lambda m: (m["mean"], m["std"]) if m else None)  # noqa: E731
            if b.get("pp_throughput"):
                out.append(BenchyRow(data["model"], f"pp{b['prompt_size']}{suffix}", pair(b["pp_throughput"]),
                                     pair(b.get("pp_req_throughput")), pair(b.get("e2e_ttft"))))
            if b.get("tg_throughput") or b.get("tg_req_throughput"):
                out.append(BenchyRow(data["model"], f"tg{b['response_size']}{suffix}", pair(b.get("tg_throughput")),
                                     pair(b.get("tg_req_throughput"))))
        return out
    rows_ = []
    for row in csv.DictReader(io.StringIO(text)):
        pair = (lambda k: (float(row[f"{k}_mean"]), float(row[f"{k}_std"] or 0))  # noqa: E731
                if row.get(f"{k}_mean") not in (None, "") else None)
        rows_.append(BenchyRow(row["model"], row["test_name"], pair("t_s"), pair("t_s_req"), pair("e2e_ttft")))
    return rows_


def render(files: list[Path], fmt: str) -> str:
    loaded = [(str(p), load(p)) for p in files]
    if fmt.startswith("llama-benchy"):
        if len(loaded) != 1:
            raise ValueError("llama-benchy's formats hold one run: give one results file")
        results = loaded[0][1]
        rows_ = benchy_rows(results)
        return benchy_csv(rows_) if fmt == "llama-benchy-csv" else benchy_json(results, rows_)
    columns, table = rows(loaded)
    return {"md": markdown, "csv": as_csv, "html": as_html}[fmt](columns, table)


__all__ = ["Measurement", "render", "read_llama_benchy"]
