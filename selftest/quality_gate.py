"""How the quality gate behaves on the real engine: its false alarms on reruns of one unchanged model, and the damage
at which it turns red against the damage at which the garbage detector does.

    python -m selftest.quality_gate [--probes 135] [--reruns 3] [--strengths 0.02 0.05 0.1 0.2] [--dtypes bfloat16]

The embedded default answers the first N quality probes (sparkgate.quality; 135 is the standard level's) `--reruns`
times on one server, each time in another order and at another concurrency (other batches), and every pair of reruns
is compared as the gate compares (McNemar's exact test, p < 0.01). Then the same model with Gaussian noise in every
weight matrix (the garbage corpus's damage, a share of each matrix's own standard deviation) answers the probes, and
the corpus's ordinary prompts go through the garbage detector: what share of its answers it flags. `--dtypes` serves
the clean weights in another dtype (a serving change the CPU engine allows): how far that moves the answers, and
whether the gate calls it worse.
About 2 minutes a model on two cores. Prints a Markdown table (README, "Answers: an upgrade that makes answers worse
is red").
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sparkgate import embedded, quality, sanity
from sparkgate.launch import serving
from sparkgate.probes import chat_body
from sparkgate.proc import cache_dir
from sparkgate.recipes import load_profiles, load_recipes

from .garbage.corpus import PROMPTS, perturbed
from .helpers import broken_recipe, local_mem_available, move_port

PORT = 18064


def answers(url: str, model: str, probes: list[quality.QualityProbe], threads: int) -> dict[str, tuple]:
    """probe id -> (right, steps): greedy, seeded, with top-k log-probabilities, as QUAL-ANSWERS asks."""
    def ask(probe):
        body = chat_body(model, probe.prompt, max_tokens=probe.max_tokens, seed=0, logprobs=True,
                         top_logprobs=quality.TOP_K)
        choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        return probe.id, (probe.right(choice["message"].get("content") or ""), quality.steps_of(choice))
    with httpx.Client(base_url=url, timeout=600) as client, ThreadPoolExecutor(threads) as pool:
        return dict(pool.map(ask, probes))


def flagged_share(url: str, model: str) -> float:
    """The share of answers to ordinary prompts the garbage detector flags (64 tokens each, as SERVE-SANITY asks)."""
    def ask(prompt):
        body = chat_body(model, prompt, max_tokens=64)
        message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        return bool(sanity.scan_message(message, prompt))
    with httpx.Client(base_url=url, timeout=600) as client, ThreadPoolExecutor(4) as pool:
        flags = list(pool.map(ask, PROMPTS))
    return sum(flags) / len(flags)


def compared(before: dict[str, tuple], after: dict[str, tuple]) -> tuple[quality.Flips, quality.Movement | None]:
    return (quality.flips({p: v[0] for p, v in before.items()}, {p: v[0] for p, v in after.items()}),
            quality.movement({p: v[1] for p, v in before.items()}, {p: v[1] for p, v in after.items()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", type=int, default=135)
    ap.add_argument("--reruns", type=int, default=3)
    ap.add_argument("--strengths", type=float, nargs="*", default=[0.02, 0.05, 0.1, 0.2])
    ap.add_argument("--dtypes", nargs="*", default=[], help="serve the clean weights in each (e.g. bfloat16)")
    args = ap.parse_args()
    if args.reruns < 2:
        ap.error("--reruns: at least 2 (the false alarms are pairs of reruns)")
    probes = quality.probe_set(args.probes)
    profile = load_profiles()["cpu"]
    tmp = Path(tempfile.mkdtemp(prefix="quality-gate-"))
    rows = []
    try:
        def recipe(strength: float, dtype: str | None = None):
            where = tmp / f"noise-{strength}-{dtype}-{len(list(tmp.iterdir()))}"

            def change(data):
                move_port(data, PORT)
                if dtype:
                    data["serve_args"][data["serve_args"].index("--dtype") + 1] = dtype
                if strength:
                    perturbed(lambda name: True, strength)(embedded.prepare("embedded:smollm2", cache_dir()),
                                                           where / "weights")
                    data["model"] = {**data["model"], "id": str(where / "weights"), "source": None}
            where.mkdir(parents=True)
            return load_recipes(Path(broken_recipe(where, change)))["smollm2-cpu"]

        with serving(recipe(0), profile, local_mem_available, print, 600) as srv:
            runs = []
            for i in range(args.reruns):
                order = probes if i % 2 == 0 else list(reversed(probes))
                t = time.monotonic()
                runs.append(answers(srv.base_url, srv.served_name, order, threads=(4, 1, 2)[i % 3]))
                print(f"clean run {i + 1}: {time.monotonic() - t:.0f} s", flush=True)
            clean_flags = flagged_share(srv.base_url, srv.served_name)
        alarms = [compared(a, b) for a, b in itertools.permutations(runs, 2)]
        worst = max(alarms, key=lambda fm: fm[0].worse)
        rows.append(("none (reruns)", f"{sum(v[0] for v in runs[0].values())}/{len(probes)}",
                     f"{sum(f.significantly_worse for f, _ in alarms)} of {len(alarms)} ordered pairs flagged; most "
                     f"flips {worst[0].worse} right-to-wrong, {worst[0].better} back",
                     worst[1].describe() if worst[1] else "-", f"{clean_flags:.0%}"))
        print(rows[-1], flush=True)
        for strength, dtype in [(s, None) for s in args.strengths] + [(0, d) for d in args.dtypes]:
            with serving(recipe(strength, dtype), profile, local_mem_available, print, 600) as srv:
                damaged = answers(srv.base_url, srv.served_name, probes, threads=4)
                flags = flagged_share(srv.base_url, srv.served_name)
            flips, moved = compared(runs[0], damaged)
            rows.append((f"served in {dtype}" if dtype else f"{strength:g} x std", f"{flips.right_after}/{len(probes)}",
                         f"{'WORSE' if flips.significantly_worse else 'not worse'}: {flips.worse} right-to-wrong, "
                         f"{flips.better} back, p={flips.p_value:.2g}", moved.describe() if moved else "-",
                         f"{flags:.0%}"))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n| noise in every weight matrix | right (of {len(probes)} probes) | the gate against the clean run | "
          f"how far the answers moved | garbage detector: ordinary prompts flagged (of {len(PROMPTS)}) |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
