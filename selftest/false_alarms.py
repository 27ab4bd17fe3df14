"""How often `sparkgate compare` cries wolf: K runs of one unchanged server, every ordered pair of runs compared,
and the figure comparisons it flags counted. A benchmark that prints its figures, not a self-test (it takes K runs):

    .venv/bin/python -m selftest.false_alarms --runs 6
    .venv/bin/python -m selftest.false_alarms /tmp/sparkgate-false-alarms-*/run*.json   # judge earlier runs again

Every flag here is a false alarm: nothing changed between the runs but time.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from sparkgate.compare import ALPHA, TOLERANCE_PCT, compare
from sparkgate.hostfacts import parse_meminfo
from sparkgate.launch import serving
from sparkgate.recipes import load_profiles, load_recipes
from sparkgate.results import Results, load

from .helpers import SUITE_PLUGINS, embedded_recipe_dir

ROOT = Path(__file__).resolve().parent.parent
# Every check whose figures a gate tests (two or more repetitions); the capacity sweep's are one round per level.
SELECTION = "natural or forced or decode_under_concurrency"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--port", type=int, default=18006)
    parser.add_argument("files", type=Path, nargs="*", help="results files of earlier runs: judge these, run nothing")
    args = parser.parse_args()
    files = [load(path) for path in args.files] or measure(args.runs, args.port)
    pairs = list(itertools.permutations(files, 2))  # either run may be the baseline
    figures = [f for a, b in pairs for f in compare(a, b).figures if f.p_value is not None]
    significant = [f for f in figures if f.p_value < ALPHA and f.worse_by > 0]
    print(f"\n{len(files)} runs of one server, {len(pairs)} ordered pairs, {len(figures)} figure comparisons (two or "
          f"more repetitions on both sides); Welch's one-sided p < {ALPHA:g} and slower by more than the tolerance:")
    for tolerance in (TOLERANCE_PCT, 10, 20, 30, 40, 50, 75, 100):
        flagged = [f for f in significant if f.worse_by * 100 > tolerance]
        print(f"  tolerance {tolerance:g}%: {len(flagged)} flagged ({len(flagged) / max(len(figures), 1):.1%})")
    by_figure = Counter(f"[{f.check}] {f.name}" for f in significant if f.worse_by * 100 > TOLERANCE_PCT)
    for name, count in by_figure.most_common():
        print(f"  {count:3d} at {TOLERANCE_PCT:g}%: {name}")
    worst = max(significant, key=lambda f: f.worse_by, default=None)
    print(f"largest significant drift: {worst.describe()}" if worst else "no significant drift at all")
    return 0


def measure(runs: int, port: int) -> list[Results]:
    """`runs` runs of SELECTION against one server started for them; their files stay in a temporary folder."""
    work = Path(tempfile.mkdtemp(prefix="sparkgate-false-alarms-"))
    recipe = load_recipes(embedded_recipe_dir(work / "recipes", port))["smollm2-cpu"]
    files = []
    mem = lambda: parse_meminfo(Path("/proc/meminfo").read_text())["MemAvailable"]  # noqa: E731
    with serving(recipe, load_profiles()["cpu"], mem, print, 600) as srv:
        for i in range(runs):
            path = work / f"run{i}.json"
            run = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests"), "-q", *SUITE_PLUGINS,
                                  "-m", "perf", "--recipe=smollm2-cpu", f"--base-url={srv.base_url}", "-k", SELECTION,
                                  f"--results-json={path}"], cwd=ROOT, capture_output=True, text=True)
            print(f"run {i + 1}/{runs}: exit {run.returncode}, {path}", flush=True)
            files.append(load(path))
    return files


if __name__ == "__main__":
    sys.exit(main())
