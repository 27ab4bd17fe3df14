"""Results that compare: two runs of one server, the same engine slowed down, a check newly failing; many files as
one table; llama-benchy's formats read beside llama-benchy's own; the upgrade gate in one pytest command.

All against the session's embedded server (the real vLLM engine on the CPU). The slowed engine is that same server
held to a third of this machine's CPU time by a cgroup quota: a real slowdown, of every figure at once.

This machine is a shared VM: two runs of one unchanged server drift apart far more than on a Spark, so its gates
and comparisons use the tolerance its own drift needs (TOLERANCE, from `python -m selftest.false_alarms`), and the
slowed engine is well beyond it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from sparkgate.compare import compare_figure
from sparkgate.measure import Figure
from sparkgate.results import Measurement
from sparkgate.table import read_llama_benchy
from sparkgate.workloads import FILLER

from .helpers import ARTIFACTS, ROOT, SUITE_PLUGINS, TESTS, cpu_quota, server_group

# The figures an upgrade gate holds most dearly, each over several requests: about a minute a run here (quick).
SELECTION = "forced or decode_under_concurrency"
# Same-server drift on this VM, measured (README): 2 figure comparisons in 200 more than 50% slower (natural decode,
# 55%), none beyond 75%; a CI run once saw 52%. Twice as slow is well beyond that drift, and the engine held to a
# third of the CPU well beyond twice as slow (its decode figures at a quarter: 4.3 to 4.8 times as slow; at half:
# 2.0 to 2.7).
TOLERANCE = 100
SLOWED_SHARE = 3  # the slowed engine gets 1/SLOWED_SHARE of this machine's CPU time
DECODE_FIGURES = ["forced-length decode, per request (not a feel figure)", "decode per request at 1 concurrent",
                  "decode per request at 4 concurrent", "inter-token latency at 1 concurrent",
                  "inter-token latency at 4 concurrent"]


def suite(srv, results, *args):
    """The perf checks of SELECTION against `srv`, as an operator runs them, their results kept in `results`: at the
    quick level, whose 3 repetitions a side see the slowed engine (at least twice as slow) at p < 0.01; how often
    the standard level's gate cries wolf is measured apart (selftest.false_alarms, README)."""
    return subprocess.run([sys.executable, "-m", "pytest", TESTS, *SUITE_PLUGINS, "-rA", "-s", "-m", "perf",
                           "--level=quick", "--recipe=smollm2-cpu", f"--base-url={srv.base_url}", "-k", SELECTION,
                           f"--results-json={results}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "sparkgate.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def runs(embedded_server, tmp_path_factory):
    """before: the good engine; again: the same engine, gated on before; slowed: the engine held to a third of the
    CPU, gated on before; narrower: the good engine gated on before, measuring less (-k forced). (name -> (results
    file, the pytest run))."""
    d = tmp_path_factory.mktemp("runs")
    out = {"before": (d / "before.json", suite(embedded_server, d / "before.json", "--submitter=selftest",
                                               "--notes=the good engine"))}
    assert out["before"][1].returncode == 0, out["before"][1].stdout[-3000:]
    gate = (f"--baseline={d / 'before.json'}", f"--tolerance={TOLERANCE}")
    out["again"] = (d / "again.json", suite(embedded_server, d / "again.json", *gate))
    with cpu_quota(server_group(embedded_server), (os.cpu_count() or 2) / SLOWED_SHARE):
        out["slowed"] = (d / "slowed.json", suite(embedded_server, d / "slowed.json", *gate))
    out["narrower"] = (d / "narrower.json", suite(embedded_server, d / "narrower.json", *gate, "-k", "forced"))
    return out


def test_a_second_run_of_the_same_engine_passes_the_baseline_gate(runs):
    _, run = runs["again"]
    assert run.returncode == 0, run.stdout[-4000:]
    assert "against the baseline: smollm2-cpu [PERF-FORCED] forced-length decode" in run.stdout


def test_a_candidate_that_measured_less_than_the_baseline_fails_the_gate_naming_what_it_left_out(runs):
    """Every check it ran passed; the concurrency figures and check of the baseline it never measured MUST fail the
    gate, each named, with how the selections differ."""
    _, run = runs["narrower"]
    assert run.returncode == 1, run.stdout[-4000:]
    assert "FAILED " not in run.stdout and " passed" in run.stdout.splitlines()[-1]
    gate = run.stdout.split("sparkgate: the gate fails on what the candidate did not measure")[1]
    assert "figure(s) of the baseline" in gate, gate
    assert "  smollm2-cpu [PERF-CONCURRENT] decode per request at 4 concurrent" in gate, gate
    assert "1 check(s) that passed in the baseline and neither passed nor failed here:\n  smollm2-cpu " \
           "[PERF-CONCURRENT]" in gate, gate
    assert ("the selections differ: the baseline ran -m 'perf' -k 'forced or decode_under_concurrency' --recipe "
            "smollm2-cpu, this run -m 'perf' -k 'forced' --recipe smollm2-cpu") in gate, gate
    compared = cli("compare", "--tolerance", TOLERANCE, runs["before"][0], runs["narrower"][0])
    assert compared.returncode == 1, compared.stdout
    assert "  not measured: smollm2-cpu [PERF-CONCURRENT] decode per request at 4 concurrent" in compared.stdout


def test_two_runs_of_one_server_compare_green(runs):
    result = cli("compare", "--tolerance", TOLERANCE, runs["before"][0], runs["again"][0])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"no regression: no figure slower by more than {TOLERANCE}% beyond the noise" in result.stdout


def test_the_baseline_gate_turns_a_slowed_engine_red_in_one_command(runs):
    """PERF-FORCED holds no speed floor: on the slowed engine only the baseline can turn it red, and does; the gate
    judges every decode figure REGRESSED, each named."""
    _, run = runs["slowed"]
    assert run.returncode == 1, run.stdout[-4000:]
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 2 and all("forced" in f or "concurrency" in f for f in failed), failed
    forced = run.stdout.split("= FAILURES =")[1].split("test_forced_length_generates_exactly_the_forced_tokens")[1]
    assert "expected: no figure significantly worse than in the baseline" in forced, forced
    assert "found:    smollm2-cpu [PERF-FORCED] forced-length decode, per request (not a feel figure): " in forced
    judged = [line for line in run.stdout.splitlines() if line.strip().startswith("against the baseline: ")]
    for name in DECODE_FIGURES:
        assert any(f"{name}: " in line and line.endswith(": REGRESSED") for line in judged), (name, judged)


def test_a_slowed_engine_compares_red_on_every_decode_figure_naming_each(runs):
    result = cli("compare", "--tolerance", TOLERANCE, runs["before"][0], runs["slowed"][0])
    assert result.returncode == 1, result.stdout + result.stderr
    head = result.stdout.split("\n\n")[0]
    assert "REGRESSED: " in head, result.stdout
    for name in DECODE_FIGURES:
        assert f"[{'PERF-FORCED' if 'forced' in name else 'PERF-CONCURRENT'}] {name}: " in head, (name, head)
    assert "confidence" in head


def test_a_speed_and_its_latency_slowed_alike_get_one_verdict():
    """Decode speed and inter-token latency are one slowdown seen twice (CI once saw it as -34% and +51%): the same
    "slower by", the same p, the same verdict."""
    def figure(unit, values):
        return Measurement(**Figure.of("decode", unit, values, {"prompt": "short"}).model_dump(), recipe="r",
                           check="PERF-CONCURRENT")

    before, after = [19.1, 20.9, 19.4], [13.0, 13.2, 13.1]  # tok/s
    speed = compare_figure(figure("tok/s", before), figure("tok/s", after), tolerance_pct=40)
    latency = compare_figure(figure("ms", [1000 / v for v in before]), figure("ms", [1000 / v for v in after]),
                             tolerance_pct=40)
    assert speed.worse_by == pytest.approx(latency.worse_by, rel=0.01) and speed.worse_by > 0.5
    assert speed.p_value == pytest.approx(latency.p_value) and speed.p_value < 0.01
    assert speed.regressed and latency.regressed


def test_a_check_newly_failing_compares_red(runs, tmp_path):
    """The candidate is the baseline itself with one check failing: only that check can make it red."""
    data = json.loads(runs["before"][0].read_text())
    forced = next(c for c in data["checks"] if c["id"] == "PERF-FORCED")
    forced.update(outcome="failed", message="[PERF-FORCED] A forced-length request MUST return exactly ...")
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps(data))
    result = cli("compare", "--tolerance", TOLERANCE, runs["before"][0], candidate)
    assert result.returncode == 1
    assert "1 check(s) newly failing" in result.stdout and "newly failing: PERF-FORCED (tests/perf/" in result.stdout


def test_files_that_measured_differently_are_refused_with_the_reason(runs, tmp_path):
    data = json.loads(runs["again"][0].read_text())
    for m in data["measurements"]:
        if m["check"] == "PERF-FORCED":
            m["shape"]["max_tokens"] = m["shape"]["min_tokens"] = 32
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps(data))
    result = cli("compare", runs["before"][0], candidate)
    assert result.returncode == 2
    assert "do not compare: these figures were measured differently" in result.stderr
    assert '"max_tokens":64' in result.stderr and '"max_tokens":32' in result.stderr


def test_figures_of_two_levels_are_never_compared_as_like_for_like(runs, tmp_path):
    """The same figures, measured at another --level: compare refuses them, and so does the gate, before it runs."""
    data = json.loads(runs["again"][0].read_text())
    assert data["level"] == "quick"
    data["level"] = "extended"
    extended = tmp_path / "extended.json"
    extended.write_text(json.dumps(data))
    result = cli("compare", runs["before"][0], extended)
    assert result.returncode == 2
    assert "the baseline ran at --level quick and the candidate at --level extended" in result.stderr
    gate = subprocess.run([sys.executable, "-m", "pytest", TESTS, *SUITE_PLUGINS, "--collect-only", "-q",
                           f"--baseline={extended}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert gate.returncode == pytest.ExitCode.USAGE_ERROR
    assert f"--baseline {extended} was measured at --level extended and this run is at --level standard" in gate.stderr


def test_validate_names_what_keeps_a_file_from_being_a_submission(runs, tmp_path):
    before = runs["before"][0]
    # -k forced or concurrency: complete for what it selected (PERF-NATURAL's floor was not its to measure)...
    selected = cli("validate", before)
    assert selected.returncode == 0, selected.stdout
    assert "complete for what it selected: -m 'perf' -k 'forced or decode_under_concurrency'" in selected.stdout
    # ...and not once a figure of a check it ran is missing
    data = json.loads(before.read_text())
    data["measurements"] = [m for m in data["measurements"] if m.get("floor_name") != "concurrent_4_decode"]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(data))
    result = cli("validate", partial)
    assert result.returncode == 1
    assert "smollm2-cpu: no figure for its concurrent_4_decode floor (PERF-CONCURRENT passed)" in result.stdout
    truncated = tmp_path / "truncated.json"
    truncated.write_text(before.read_text()[:2000])
    result = cli("validate", truncated)
    assert result.returncode == 2 and "is not a sparkgate results file" in result.stderr, result.stderr
    data = json.loads(before.read_text())
    data["measurements"][0]["method"] = "sparkgate.stream/0: decode=N/t_total"
    other = tmp_path / "other-method.json"
    other.write_text(json.dumps(data))
    result = cli("validate", other)
    assert result.returncode == 1
    assert "method 'sparkgate.stream/0: decode=N/t_total' is not one this sparkgate measures with" in result.stdout


def test_many_files_make_one_table_in_markdown_csv_and_html(runs, tmp_path):
    files = [runs[k][0] for k in ("before", "again", "slowed")]
    md = cli("table", *files)
    assert md.returncode == 0, md.stderr
    lines = md.stdout.splitlines()
    assert len(lines) == 2 + 3 and lines[0].startswith("| system | gpu | driver | recipe | image | vLLM |")
    assert "| smollm2-cpu | (process) |" in lines[2] and "selftest" in lines[2]
    rows = list(csv.DictReader(io.StringIO(cli("table", "--format", "csv", *files).stdout)))
    assert len(rows) == 3 and all(r["forced-length decode (tok/s)"].endswith("(n=3)") for r in rows), rows
    page = tmp_path / "table.html"
    assert cli("table", "--format", "html", "-o", page, *files).returncode == 0
    _look_at_the_table(page)


def _look_at_the_table(page_file):
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("no chromium: the table was written but not opened (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=browser, args=["--no-sandbox", "--disable-gpu"])
        page = chromium.new_page(viewport={"width": 1600, "height": 600})
        page.goto(page_file.as_uri())
        assert page.is_visible("#results")
        assert page.locator("#results tbody tr").count() == 3
        assert "decode @4 per request (tok/s)" in page.inner_text("#results thead")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "table.png"), full_page=True)
        chromium.close()


def test_llama_benchy_and_sparkgate_write_one_format_read_by_one_reader(runs, embedded_server, tmp_path):
    """llama-benchy itself (from PyPI) against the same server, on PERF-FORCED's shape (64 tokens, exactly, at the
    quick level), and
    sparkgate's figures in llama-benchy's CSV and JSON: one reader reads both, and the speeds agree."""
    home = tmp_path / "home"  # llama-benchy reads its prompts from a book it downloads once: give it one
    book = "https://www.gutenberg.org/files/1661/1661-0.txt"  # its default --book-url (nothing is downloaded)
    cache = home / ".cache" / "llama-benchy"
    cache.mkdir(parents=True)
    (cache / f"{hashlib.md5(book.encode()).hexdigest()}.txt").write_text(FILLER * 400)
    theirs = tmp_path / "llama-benchy.csv"
    run = subprocess.run([sys.executable, "-m", "llama_benchy", "--base-url", f"{embedded_server.base_url}/v1",
                          "--model", "smollm2-135m-instruct", "--tokenizer", str(ROOT / ".cache/models/smollm2"),
                          "--pp", "64", "--tg", "64", "--exact-tg", "--runs", "3", "--latency-mode", "none",
                          "--skip-coherence", "--format", "csv", "--save-result", str(theirs)],
                         env={**os.environ, "HOME": str(home)}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ours = tmp_path / "sparkgate.csv"
    assert cli("table", "--format", "llama-benchy-csv", "-o", ours, runs["before"][0]).returncode == 0
    ours_json = cli("table", "--format", "llama-benchy-json", runs["before"][0]).stdout
    from llama_benchy.results import BenchmarkReport

    BenchmarkReport.model_validate_json(ours_json)  # llama-benchy's own schema of its JSON
    (tmp_path / "sparkgate.json").write_text(ours_json)

    def tg64(rows):
        return next(r for r in rows.values() if r.test == "tg64" and r.concurrency == 1 and not r.depth)

    theirs_row, ours_row = tg64(read_llama_benchy(theirs)), tg64(read_llama_benchy(ours))
    assert tg64(read_llama_benchy(tmp_path / "sparkgate.json")).t_s_req.mean == pytest.approx(ours_row.t_s_req.mean)
    ratio = ours_row.t_s_req.mean / theirs_row.t_s_req.mean
    print(f"tg64 per request: sparkgate {ours_row.t_s_req.mean:.2f} t/s, llama-benchy {theirs_row.t_s_req.mean:.2f} "
          f"t/s (ratio {ratio:.2f})")
    assert 0.7 < ratio < 1.4, (ours_row, theirs_row)
