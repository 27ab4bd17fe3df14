"""How often `sparkgate compare` cries wolf: K runs of one unchanged server, every pair of runs compared, and the
figure comparisons it flags counted. A benchmark that prints its figures, not a self-test (it takes K runs):

    .venv/bin/python -m selftest.false_alarms --runs 6

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
from sparkgate.results import load

from .conftest import embedded_recipe_dir

ROOT = Path(__file__).resolve().parent.parent
SELECTION = "natural or forced or concurrency"  # every figure a gate compares with n >= 2 in the default run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--port", type=int, default=18006)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sparkgate-false-alarms-"))
    recipe = load_recipes(embedded_recipe_dir(work / "recipes", args.port))["smollm2-cpu"]
    files = []
    mem = lambda: parse_meminfo(Path("/proc/meminfo").read_text())["MemAvailable"]  # noqa: E731
    with serving(recipe, load_profiles()["cpu"], mem, print, 600) as srv:
        for i in range(args.runs):
            path = work / f"run{i}.json"
            run = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests"), "-q", "-p", "no:cacheprovider",
                                  "-m", "perf", "--recipe=smollm2-cpu", f"--base-url={srv.base_url}", "-k", SELECTION,
                                  f"--results-json={path}"], cwd=ROOT, capture_output=True, text=True)
            print(f"run {i + 1}/{args.runs}: exit {run.returncode}, {path}", flush=True)
            files.append(load(path))
    compared = flagged = 0
    by_figure: Counter[str] = Counter()
    for a, b in itertools.combinations(files, 2):
        result = compare(a, b)
        testable = [f for f in result.figures if f.p_value is not None]
        compared += len(testable)
        for f in result.regressions:
            flagged += 1
            by_figure[f"[{f.check}] {f.name}"] += 1
            print(f"  false alarm: {f.describe()}")
    pairs = args.runs * (args.runs - 1) // 2
    print(f"\n{args.runs} runs of one server, {pairs} pairs, {compared} figure comparisons (n >= 2 on both sides), "
          f"rule: worse by > {TOLERANCE_PCT:g}% and Welch's one-sided p < {ALPHA:g}")
    print(f"flagged: {flagged} ({flagged / compared:.1%} of comparisons)" if compared else "nothing compared")
    for name, count in by_figure.most_common():
        print(f"  {count:3d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
