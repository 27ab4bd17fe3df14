"""The request shapes of the perf layer, as the guide measured them. Bodies only: timing is measure.py's."""

from __future__ import annotations

import random
from typing import Any

from .probes import chat_body
from .recipes import Recipe

# Prose and code, reported apart: speculative decoding accepts more drafts on code (25.8 vs 21.6 tok/s).
PROSE = [
    "Explain in a few paragraphs how a refrigerator keeps food cold.",
    "Describe the water cycle to a curious ten-year-old.",
]
CODE = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and an example.",
    "Write a shell script that counts the lines of every .py file under the current directory.",
]
FILLER = ("The committee reviewed the quarterly logistics report, noted the delays at the northern depot, "
          "and asked for a revised schedule covering deliveries, staffing and maintenance windows. ")


def chat(recipe: Recipe, prompt: str, max_tokens: int, temperature: float = 0.3, **extra: Any) -> dict[str, Any]:
    """The measurements' chat body: the one chat body (probes.chat_body), sampled at the guide's temperature."""
    return chat_body(recipe.model.served_name, prompt, max_tokens, temperature, **extra)


def forced(recipe: Recipe, prompt: str, tokens: int) -> dict[str, Any]:
    """Exactly `tokens` out (min_tokens + ignore_eos): for comparing engines on identical lengths, never for
    how fast it feels (it pushes past the natural stop and, under MTP, depresses draft acceptance)."""
    return chat(recipe, prompt, tokens, temperature=0.0, min_tokens=tokens, ignore_eos=True)


def long_prompt(words: int, seed: int) -> str:
    """About `words` words of filler behind a unique prefix, so no prefix cache can serve any of it."""
    rng = random.Random(seed)
    head = f"Reference {rng.getrandbits(64):016x}. "
    body = (FILLER * (words // len(FILLER.split()) + 1)).split()[:words]
    return head + " ".join(body) + "\n\nWrite a detailed report on the above, section by section."


def long_context_words(recipe: Recipe, target_tokens: int = 30_000, max_tokens: int = 256) -> int:
    """Words for a prompt of about `target_tokens`, capped to what the recipe's context admits
    (about 1.3 tokens per English word; 10% margin)."""
    budget = min(target_tokens, int((recipe.max_model_len - max_tokens) * 0.9))
    return int(budget / 1.3)
