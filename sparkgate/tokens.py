"""Counting a model's tokens here, for servers whose streams carry no usage (llama-benchy's fallback).

The tokenizer is the model's own, loaded offline: the embedded default's from its prepared folder, any other
from the local Hugging Face cache. None when it is not at hand: nothing is downloaded at run time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache

from .recipes import Recipe


@cache
def _load(path_or_id: str, gguf_file: str | None = None) -> Callable[[str], int] | None:
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path_or_id, gguf_file=gguf_file, local_files_only=True)
    except Exception:  # not installed, not cached, not a tokenizer: all mean "not at hand"
        return None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def counter_for(recipe: Recipe) -> Callable[[str], int] | None:
    """The recipe's model's tokenizer as a token counter, or None when it is not at hand here."""
    if recipe.model.source:
        from . import embedded
        from .proc import cache_dir

        folder = embedded.path(recipe.model.source, cache_dir())
        if (folder / "tokenizer_config.json").exists():
            return _load(str(folder))
        gguf = embedded.gguf(recipe.model.source)  # the tokenizer ships inside the GGUF too
        return _load(str(gguf.parent), gguf.name)
    return _load(recipe.model.id)
