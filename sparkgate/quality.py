"""Answer quality: a probe set whose answers a program checks, and the paired statistics the upgrade gate reads.

An upgrade that answers wrongly in fluent English passes every speed figure and the garbage detector. The probe set
asks questions with one checkable answer (sums, conversions, facts, extraction into JSON, a program's output, a needle
in a long context, instructions with a checkable form), greedy, so the same server answers the same way. Two runs are
compared probe by probe:

- worse: McNemar's exact test on the paired outcomes, one-sided. Of the probes whose outcome differs, how many went
  from right to wrong (b) against wrong to right (c); under "nothing changed" each flip goes either way with
  probability 1/2, so p = P(X >= b) for X ~ Binomial(b + c, 1/2). Worse is b > c at p < ALPHA.
- moved: how far the answers' token distributions moved, over the common prefix of each answer (where both runs
  saw the same text, their next-token distributions are comparable): identical answers, where the first
  divergence came, top-1 agreement and the mean KL divergence of the top-k log-probabilities. Shown beside the
  engine's own rerun noise (the same run answering a subset again), never judged: greedy decoding on a batched engine
  is not bit-exact, and a new kernel moves numbers without making answers worse.

Pure code: no requests and no verdicts (tests/serving/test_quality.py asks and judges).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .probes import said

SEED = 20261205
ALPHA = 0.01  # as the speed gate's (sparkgate.compare.ALPHA)
TOP_K = 5  # top log-probabilities recorded per generated token
STEPS_KEPT = 32  # generated tokens recorded per answer: answers part within a few tokens (README), and a thinking
# model's 1,000 would not fit a results file
DECIMALS = 3  # log-probabilities are recorded to this many decimals
RERUN_SHARE = 8  # the check answers every RERUN_SHARE-th probe twice: the engine's own rerun noise
# The fewest right-to-wrong flips (and none the other way) McNemar's exact test calls worse: 2^-k < ALPHA. A baseline
# with fewer right answers than this cannot show a loss at all.
SMALLEST_LOSS = math.ceil(math.log2(1 / ALPHA))


@dataclass(frozen=True)
class QualityProbe:
    """A question with one checkable answer."""

    id: str  # stable: family and a number; the gate pairs probes by it
    family: str
    prompt: str
    expected: str  # what a right answer contains, for the message
    judge: Callable[[str], bool]
    max_tokens: int = 24

    def right(self, text: str) -> bool:
        return self.judge(text)


def _says(answer: str) -> Callable[[str], bool]:
    return lambda text: said(answer, text)


def _json_objects(text: str) -> Iterable[dict[str, Any]]:
    """Every JSON object in `text`, in order (a model may wrap one in a code fence or a sentence, or write a draft
    first)."""
    for match in re.finditer(r"\{", text):
        try:
            value, _ = json.JSONDecoder().raw_decode(text[match.start():])
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def _json_with(name: str, age: int) -> Callable[[str], bool]:
    def judge(text: str) -> bool:
        return any(str(obj.get("name", "")).strip() == name and str(obj.get("age", "")).strip() == str(age)
                   for obj in _json_objects(text))
    return judge


CAPITALS = (("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
            ("Russia", "Moscow"), ("China", "Beijing"), ("Egypt", "Cairo"), ("Greece", "Athens"),
            ("England", "London"), ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Ireland", "Dublin"),
            ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("Canada", "Ottawa"),
            ("Kenya", "Nairobi"), ("Thailand", "Bangkok"), ("Argentina", "Buenos Aires"), ("Peru", "Lima"),
            ("Cuba", "Havana"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Belgium", "Brussels"),
            ("Hungary", "Budapest"), ("Turkey", "Ankara"), ("Australia", "Canberra"), ("India", "New Delhi"),
            ("Mexico", "Mexico City"))
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
WORDS = ("apple", "river", "garden", "window", "silver", "pencil", "orange", "planet", "castle", "dragon", "forest",
         "rocket", "yellow", "bridge", "candle", "marble", "winter", "summer", "button", "circle", "basket", "tunnel",
         "mirror", "pillow", "violin", "lemon", "tiger", "cloud", "stone", "music")
NAMES = ("Maria", "John", "Aiko", "Omar", "Lena", "Carlos", "Priya", "Tom", "Sofia", "Ivan", "Grace", "Ahmed")
FILLER = ("The meeting notes say the team reviewed the quarterly plan, agreed to move the launch by a week, and asked "
          "for a short summary of open questions. ")


def _family_add(rng: random.Random) -> Iterable[QualityProbe]:
    pairs = [(a, b) for a in range(1, 10) for b in range(1, 10) if a <= b]
    rng.shuffle(pairs)
    for i, (a, b) in enumerate(pairs):
        yield QualityProbe(f"add-{i}", "arithmetic", f"What is {a} + {b}? Answer with the number only.", str(a + b),
                           _says(str(a + b)))


def _family_convert(rng: random.Random) -> Iterable[QualityProbe]:
    units = [("minutes", "hours", 60), ("days", "weeks", 7), ("hours", "days", 24), ("months", "years", 12),
             ("seconds", "minutes", 60), ("centimetres", "metres", 100), ("grams", "kilograms", 1000)]
    items = [(small, big, per, n) for small, big, per in units for n in range(1, 6)]
    rng.shuffle(items)
    for i, (small, big, per, n) in enumerate(items):
        question = f"How many {small} are in {n} {big if n > 1 else big[:-1]}? Answer with the number only."
        yield QualityProbe(f"convert-{i}", "conversion", question, str(per * n), _says(str(per * n)))


def _family_capital(rng: random.Random) -> Iterable[QualityProbe]:
    items = list(CAPITALS)
    rng.shuffle(items)
    for i, (country, city) in enumerate(items):
        yield QualityProbe(f"capital-{i}", "fact", f"What is the capital of {country}? Answer with the city only.",
                           city, _says(city))


def _family_next_day(rng: random.Random) -> Iterable[QualityProbe]:
    order = list(range(7))
    rng.shuffle(order)
    for i, d in enumerate(order):
        after = DAYS[(d + 1) % 7]
        yield QualityProbe(f"day-{i}", "fact", f"Which day of the week comes after {DAYS[d]}? Answer with one word.",
                           after, _says(after))


def _family_repeat(rng: random.Random) -> Iterable[QualityProbe]:
    words = list(WORDS)
    rng.shuffle(words)
    for i, w in enumerate(words):
        yield QualityProbe(f"repeat-{i}", "instruction", f"Repeat this word exactly once and nothing else: {w}", w,
                           _says(w))


def _family_upper(rng: random.Random) -> Iterable[QualityProbe]:
    words = list(WORDS)
    rng.shuffle(words)
    for i, w in enumerate(words):
        big = w.upper()
        yield QualityProbe(f"upper-{i}", "instruction", f"Write the word {w} in capital letters only.", big,
                           lambda text, big=big: re.search(rf"\b{big}\b", text) is not None)


def _family_json(rng: random.Random) -> Iterable[QualityProbe]:
    items = [(name, age) for name in NAMES for age in (7, 21, 34, 46, 58, 63)]
    rng.shuffle(items)
    for i, (name, age) in enumerate(items):
        prompt = (f"Extract the person's name and age from this sentence as a JSON object with the keys \"name\" and "
                  f"\"age\", and reply with the JSON only: {name} is {age} years old.")
        yield QualityProbe(f"json-{i}", "extraction", prompt, f'{{"name": "{name}", "age": {age}}}',
                           _json_with(name, age), max_tokens=40)


def _family_code(rng: random.Random) -> Iterable[QualityProbe]:
    items = [(a, b) for a in range(2, 10) for b in range(2, 10) if a <= b]
    rng.shuffle(items)
    for i, (a, b) in enumerate(items):
        prompt = f"What does this Python code print?\n\nprint({a} * {b})\n\nAnswer with the output only."
        yield QualityProbe(f"code-{i}", "code", prompt, str(a * b), _says(str(a * b)))


def _family_needle(rng: random.Random) -> Iterable[QualityProbe]:
    for i in range(40):
        secret = rng.randrange(1000, 10000)
        before, after = rng.randrange(2, 12), rng.randrange(2, 12)
        text = FILLER * before + f"The secret number is {secret}. " + FILLER * after
        prompt = f"{text}\n\nWhat is the secret number in the notes above? Answer with the number only."
        yield QualityProbe(f"needle-{i}", "retrieval", prompt, str(secret), _says(str(secret)))


FAMILIES = (_family_add, _family_capital, _family_repeat, _family_code, _family_convert, _family_json,
            _family_next_day, _family_upper, _family_needle)


def probe_set(n: int | None = None) -> list[QualityProbe]:
    """The first `n` probes (all of them: None) of one fixed order that takes the families in turn, so every size
    asks every family; a larger size only adds probes. Seeded: the same probes on every machine and version."""
    families = [list(make(random.Random(f"{SEED}-{make.__name__}"))) for make in FAMILIES]
    order: list[QualityProbe] = []
    for i in range(max(map(len, families))):
        order += [f[i] for f in families if i < len(f)]
    return order[:n] if n else order


def digest(prompt: str) -> str:
    """The prompt's hash, by which results files pair answers: the same id asked differently does not pair."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def by_kind(answers: Iterable[Any]) -> str:
    """How many of `answers` (each with .probe and .right) are right, by the kind of probe (the id's family part)."""
    kinds: dict[str, list[bool]] = {}
    for a in answers:
        kinds.setdefault(a.probe.rsplit("-", 1)[0], []).append(a.right)
    return ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in kinds.items())


# ---- what a server returned, for the record --------------------------------------------------------------


def steps_of(choice: Mapping[str, Any]) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """Each generated token of a chat choice with `logprobs`: (text, log-probability, top-k [(text, logprob)]). A
    server's answer is untrusted: what is not shaped as OpenAI's API says is left out, never raised on."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    out = []
    for item in content if isinstance(content, list) else []:
        if not isinstance(item, Mapping) or (lp := _number(item.get("logprob"))) is None:
            break  # the tokens after one left out would be compared at the wrong positions
        top = item.get("top_logprobs")
        pairs = [(str(t.get("token", "")), v) for t in (top if isinstance(top, list) else [])
                 if isinstance(t, Mapping) and (v := _number(t.get("logprob"))) is not None]
        out.append((str(item.get("token", "")), lp, pairs[:TOP_K]))
    return out[:STEPS_KEPT]


def _number(value: Any) -> float | None:
    """A log-probability: a finite number at most 0 (vLLM sends -9999.0 for minus infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value > 0:
        return None
    return round(max(float(value), -9999.0), DECIMALS)


# ---- the paired statistics --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flips:
    """McNemar's exact test on two runs' outcomes of the same probes."""

    n: int  # probes in both
    right_before: int
    right_after: int
    worse: int  # right before, wrong after (b)
    better: int  # wrong before, right after (c)
    p_value: float  # P(at least `worse` of the worse + better flips go the wrong way | no change)

    @property
    def significantly_worse(self) -> bool:
        return self.worse > self.better and self.p_value < ALPHA

    @property
    def can_show_loss(self) -> bool:
        """Whether losing every right answer would be significant: with fewer right before, the test cannot fail."""
        return self.right_before >= SMALLEST_LOSS

    def describe(self) -> str:
        blind = "" if self.can_show_loss else \
            f"; {self.right_before} right before cannot show a loss ({SMALLEST_LOSS} needed)"
        return (f"{self.right_before}/{self.n} right before, {self.right_after}/{self.n} after: {self.worse} went "
                f"from right to wrong, {self.better} from wrong to right (McNemar's exact test, one-sided, "
                f"p={self.p_value:.2g}{blind})")


def flips(before: Mapping[str, bool], after: Mapping[str, bool]) -> Flips:
    """Pair the outcomes probe by probe (probes in only one of them are left out)."""
    common = sorted(set(before) & set(after))
    worse = sum(1 for p in common if before[p] and not after[p])
    better = sum(1 for p in common if after[p] and not before[p])
    n = worse + better
    # P(X >= worse), X ~ Binomial(n, 1/2), exactly: the sum of the upper tail.
    p_value = sum(math.comb(n, k) for k in range(worse, n + 1)) / 2**n if n else 1.0
    return Flips(len(common), sum(before[p] for p in common), sum(after[p] for p in common), worse, better, p_value)


Step = tuple[str, float, Sequence[tuple[str, float]]]


LOGPROB_FLOOR = -50.0  # e^-50: nothing a sampler would ever pick; keeps a broken model's -inf (-9999) computable


def _normalised(logprobs: dict[str, float]) -> dict[str, float]:
    top = max(logprobs.values())
    total = top + math.log(sum(math.exp(v - top) for v in logprobs.values()))
    return {t: v - total for t, v in logprobs.items()}


def _kl(p_top: Sequence[tuple[str, float]], q_top: Sequence[tuple[str, float]]) -> float:
    """KL(P || Q) of two next-token distributions known by their top-k: over the union of their tokens, a token one
    side does not list gets that side's smallest listed log-probability (it is at most that likely), then both are
    renormalised over the union. In log space, every value held to [LOGPROB_FLOOR, 0]: a file's values are
    untrusted and a broken model's are extreme."""
    if not p_top or not q_top:
        return 0.0
    p = {t: min(0.0, max(LOGPROB_FLOOR, v)) for t, v in p_top}
    q = {t: min(0.0, max(LOGPROB_FLOOR, v)) for t, v in q_top}
    floor_p, floor_q = min(p.values()), min(q.values())
    tokens = set(p) | set(q)
    lp = _normalised({t: p.get(t, floor_p) for t in tokens})
    lq = _normalised({t: q.get(t, floor_q) for t in tokens})
    return max(0.0, sum(math.exp(lp[t]) * (lp[t] - lq[t]) for t in tokens))


@dataclass(frozen=True)
class Movement:
    """How far the answers moved between two runs of the same probes."""

    n: int  # probes compared (both with their tokens)
    identical: int  # answers identical token for token
    first_divergence: float | None  # mean token index of the first difference, over the answers that differ
    top1_agreement: float  # share of compared positions whose most likely next token is the same
    mean_kl: float  # mean KL(before || after) of the top-k over the common prefixes, in nats

    def describe(self) -> str:
        where = f", first divergence at token {self.first_divergence:.1f} on average" \
            if self.first_divergence is not None else ""
        return (f"{self.identical}/{self.n} answers identical{where}, top-1 agreement {self.top1_agreement:.1%}, "
                f"mean KL of the top-{TOP_K} {self.mean_kl:.4f} nats")


def movement(before: Mapping[str, Sequence[Step]], after: Mapping[str, Sequence[Step]]) -> Movement | None:
    """Over the common prefix of each pair of answers (and the position where they part): the next-token
    distributions compared while both runs had seen the same text. None: no probe has tokens on both sides."""
    common = [p for p in sorted(set(before) & set(after)) if before[p] and after[p]]
    if not common:
        return None
    identical, divergences, agree, positions, kls = 0, [], 0, 0, []
    for probe in common:
        a, b = before[probe], after[probe]
        split = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x[0] != y[0]), min(len(a), len(b)))
        if split == len(a) == len(b):
            identical += 1
        else:
            divergences.append(split)
        for i in range(min(split + 1, len(a), len(b))):  # the common prefix, and the position where they part
            top_a, top_b = a[i][2], b[i][2]
            if top_a and top_b:
                positions += 1
                agree += max(top_a, key=lambda t: t[1])[0] == max(top_b, key=lambda t: t[1])[0]
                kls.append(_kl(top_a, top_b))
    return Movement(len(common), identical, statistics.fmean(divergences) if divergences else None,
                    agree / positions if positions else 1.0, statistics.fmean(kls) if kls else 0.0)
