"""Levels by time budget (`--level`), DCGM's run levels as the model: every level runs every layer's checks; a level
sets how much of each perf check runs (repetitions, how far the capacity sweep goes, whether the long shapes run),
never whether a layer is judged.

Repetitions are the samples of the upgrade gate's test (sparkgate.compare): a level with fewer of them gives a
verdict on the floors sooner and a weaker comparison. Figures measured at one level are compared only with
figures of the same level (their shape carries it).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_OUTPUT = 64  # tokens: enough steps of decode for a rate with a spread; the detector judges 80 (serving layer)
# Quality probes (QUAL-ANSWERS): McNemar's exact test flags k right-to-wrong flips and none the other way at p < 0.01
# from k = 7. Quick's 3 of each family sees gross damage only; standard's saw 88 right answers of 135 fall to 75
# (README: noise at 0.03 of the weights' spread) and not to 86 (0.02).
QUICK_PROBES = 27
STANDARD_PROBES = 135
# Agent tasks (QUAL-AGENT-*): the same test needs 7 episodes right in the baseline to see them all lost; quick's 16 gave
# the embedded model 11 with clean calls (sparkgate.agent has 29 tasks in all).
QUICK_AGENT_TASKS = 16
LONG_SHAPE_CHECKS = ("PERF-LONG-DECODE", "PERF-LONG-PREFILL", "PERF-SUSTAINED")


@dataclass(frozen=True)
class Level:
    name: str
    summary: str
    output_share: float  # of each perf shape's output length (max_tokens, forced tokens); at least MIN_OUTPUT
    natural_requests: int  # PERF-NATURAL: timed natural requests after the warm-up, prose and code alike
    forced_rounds: int  # PERF-FORCED: forced-length requests
    single_rounds: int  # PERF-CONCURRENT at 1: requests (each one sample)
    batch_rounds: int  # PERF-CONCURRENT at c > 1: bursts (a burst shares a batch: one sample)
    counted_requests: int  # PERF-SERVER-*: requests timed against /metrics
    capacity_past_max_seqs: bool  # PERF-CAPACITY: one doubling past --max-num-seqs (requests queue: TTFT shows it)
    long_shapes: bool  # PERF-LONG-*, PERF-SUSTAINED: a ~30K-token prompt, sustained load
    quality_probes: int = 0  # QUAL-ANSWERS: the first N of the probe set (sparkgate.quality); 0: all of them
    agent_tasks: int = 0  # QUAL-AGENT-*: the first N agent tasks (sparkgate.agent); 0: all of them
    weights_gib: float = 0  # HOST-WEIGHTS-WHOLE: hash the smallest files of the cached model up to this; 0: every file

    def runs(self, check: str) -> bool:
        """Whether the check measures anything at this level (a long-shape check runs at extended only)."""
        return self.long_shapes or check not in LONG_SHAPE_CHECKS

    def tokens(self, standard: int) -> int:
        """A perf shape's output length at this level, from its standard length."""
        return standard if self.output_share >= 1 else max(MIN_OUTPUT, round(standard * self.output_share))

    def capacity_limit(self, max_num_seqs: int) -> int:
        return 2 * max_num_seqs if self.capacity_past_max_seqs else max_num_seqs


LEVELS = {
    # 3 a side: the fewest with which Welch's test on the logarithms sees twice as slow at p < 0.01 through a noisy
    # round (the project's self-tests gate a slowed engine at this level).
    "quick": Level("quick", "every layer; the fewest repetitions a verdict needs, a quarter of the output lengths; "
                            "no long shapes; the cached weights sampled (4 GiB of them hashed)",
                   output_share=0.25, natural_requests=2, forced_rounds=3, single_rounds=3, batch_rounds=3,
                   counted_requests=2, capacity_past_max_seqs=False, long_shapes=False, quality_probes=QUICK_PROBES,
                   agent_tasks=QUICK_AGENT_TASKS, weights_gib=4),
    # The gate's level, for regressions smaller than twice as slow: PERF-CONCURRENT's 5 bursts at c > 1 are the fewest
    # that flagged a 63% drop at 4 concurrent on the project's CI VM (3 bursts: p = 0.018, not flagged).
    "standard": Level("standard", "every layer, the repetitions the upgrade gate's statistic needs; no long shapes",
                      output_share=1.0, natural_requests=4, forced_rounds=5, single_rounds=3, batch_rounds=5,
                      counted_requests=3, capacity_past_max_seqs=False, long_shapes=False,
                      quality_probes=STANDARD_PROBES),
    "extended": Level("extended", "standard, plus the long shapes (a ~30K-token prompt, sustained load) and the "
                                  "capacity sweep one doubling past --max-num-seqs",
                      output_share=1.0, natural_requests=4, forced_rounds=5, single_rounds=3, batch_rounds=5,
                      counted_requests=3, capacity_past_max_seqs=True, long_shapes=True),
}
DEFAULT = "standard"
