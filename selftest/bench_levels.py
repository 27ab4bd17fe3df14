"""What each --level costs on this machine: the whole suite on the embedded default, from start to report (the
model's load included), run N times a level, with what it ran.

    python -m selftest.bench_levels --runs 3 [--levels quick standard extended]

Prints, per level: wall time (mean, sample std, min..max over the runs), the decode speed this VM gave the embedded
model (PERF-NATURAL's mean, per request: these VMs differ by 3x, so a time means little without it), and how many
checks passed, failed or could not run in each layer.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparkgate.levels import LEVELS
from sparkgate.reporting import what_ran
from sparkgate.results import Results

from .helpers import ROOT, SUITE_PLUGINS, TESTS


def one_run(level: str, results: Path) -> tuple[float, int]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", TESTS, *SUITE_PLUGINS, "-q", f"--level={level}",
                           f"--results-json={results}", f"--html={results.with_suffix('.html')}",
                           "--self-contained-html"], cwd=ROOT, capture_output=True, text=True)
    return time.monotonic() - start, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--levels", nargs="+", choices=list(LEVELS), default=list(LEVELS))
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sparkgate-levels-") as tmp:
        for level in args.levels:
            times, speeds, what, codes = [], [], "", []
            for i in range(args.runs):
                results = Path(tmp) / f"{level}-{i}.json"
                seconds, rc = one_run(level, results)
                data = Results.model_validate_json(results.read_text())
                natural = next((m.mean for m in data.measurements if m.name == "natural decode, per request"), None)
                times.append(seconds)
                speeds.append(natural)
                codes.append(rc)
                what = what_ran(data.checks)
                print(f"{level} run {i + 1}: {seconds:.0f} s, exit {rc}, natural decode "
                      f"{natural or float('nan'):.1f} tok/s", flush=True)
            spread = statistics.stdev(times) if len(times) > 1 else 0.0
            decode = [s for s in speeds if s]
            rows.append(f"| {level} | {len(times)} | {statistics.mean(times):.0f} +/- {spread:.0f} s "
                        f"({min(times):.0f}..{max(times):.0f}) | "
                        f"{statistics.mean(decode) if decode else float('nan'):.1f} tok/s | "
                        f"{', '.join(map(str, codes))} | {what} |")
    print("\n| level | n | wall time, start to report | natural decode (this VM) | exit | what ran (last run) |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
