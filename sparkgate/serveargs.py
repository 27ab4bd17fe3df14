"""The one reader of vLLM serve arguments: a recipe's, a running container's and a process's argv alike.

`vllm serve MODEL --flag value --flag=value --switch ...`: every flag maps to the values it was given, in order;
vLLM's argument parser keeps the last one, and so does `value()`. JSON values (`--compilation-config`,
`--speculative-config`, `--hf-overrides`) are read as JSON, so spacing and key order never look like drift.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .units import GIB, parse_flag_bytes, parse_tokens

# Flags whose value is a secret: never printed (sparkgate.redact masks them), sent as the client's key.
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--password", "--ssl-keyfile-password")
# --attention-backend values vLLM takes as "auto" for a model's ordinary layers (MiniMax-M3's sparse-attention ones)
_AUTO_BACKENDS = {"AUTO", "TRITON_MSA", "CUTLASS_MSA"}


def parse_flags(argv: Sequence[str]) -> dict[str, list[str]]:
    """`--flag value`, `--flag=value` and bare `--switch` (value '') into flag -> values, in order; anything
    else under "(positional)"."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                k, v = a, argv[i + 1]
                i += 1
            else:
                k, v = a, ""
            out.setdefault(k, []).append(v)
        else:
            out.setdefault("(positional)", []).append(a)
        i += 1
    return out


def same_value(a: str, b: str) -> bool:
    """Two flag values are the same: equal text, or equal JSON (spacing and key order are not drift)."""
    if a == b:
        return True
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


class ServeArgs:
    """What a vLLM serve command says, read once."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.env = dict(env or {})
        self.flags = parse_flags(self.argv)

    def value(self, flag: str) -> str | None:
        """The value vLLM takes for `flag` (the last given), '' for a bare switch, None when absent."""
        values = self.flags.get(flag)
        return values[-1] if values else None

    def has(self, flag: str) -> bool:
        return flag in self.flags

    def json(self, flag: str) -> Any:
        """A JSON-valued flag, parsed; None when absent or not JSON."""
        raw = self.value(flag)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    @property
    def max_model_len(self) -> int | None:
        raw = self.value("--max-model-len")
        return parse_tokens(raw) if raw else None

    @property
    def max_num_seqs(self) -> int | None:
        raw = self.value("--max-num-seqs")
        return int(raw) if raw else None

    def kv_pin_bytes(self, cpu_engine: bool = True) -> int | None:
        """The KV cache pin: --kv-cache-memory[-bytes], else (on the CPU engine only) VLLM_CPU_KVCACHE_SPACE
        (GiB, from the env given). None: nothing binds the KV cache (--gpu-memory-utilization is a grant, not a
        bound)."""
        for flag in ("--kv-cache-memory", "--kv-cache-memory-bytes"):
            if self.value(flag):
                return parse_flag_bytes(self.value(flag))
        if cpu_engine and self.env.get("VLLM_CPU_KVCACHE_SPACE"):
            return int(self.env["VLLM_CPU_KVCACHE_SPACE"]) * GIB  # whole GiB: vLLM reads it with int()
        return None

    @property
    def cudagraph_mode(self) -> str | None:
        """cudagraph_mode from --compilation-config / -cc / -O JSON, or a dotted `cudagraph_mode=` form."""
        short = [self.argv[i + 1] for i, a in enumerate(self.argv[:-1]) if a in ("-cc", "-O")]
        for raw in [self.value("--compilation-config") or "", *short]:
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            if isinstance(value, dict) and "cudagraph_mode" in value:
                return str(value["cudagraph_mode"]).upper()
        for a in self.argv:
            if "cudagraph_mode=" in a:
                return a.split("cudagraph_mode=", 1)[1].upper()
        return None

    @property
    def speculative(self) -> dict[str, Any] | None:
        spec = self.json("--speculative-config")
        if isinstance(spec, dict):
            return spec
        raw = self.value("--speculative-config")
        return {"method": "mtp" if "mtp" in raw else raw} if raw else None

    @property
    def mtp(self) -> bool:
        return (self.speculative or {}).get("method") == "mtp"

    @property
    def attention_backend(self) -> tuple[str | None, str]:
        """The one attention backend the engine is asked to run (upper case, as vLLM names it), from
        --attention-backend or --attention-config's "backend"; else None, with why."""
        asked = self.value("--attention-backend")
        config = self.json("--attention-config")
        if asked is None and isinstance(config, dict):
            if config.get("backend_per_kind"):
                return None, "--attention-config names a backend per kind of layer"
            asked = config.get("backend") if isinstance(config.get("backend"), str) else None
        if not asked:
            return None, "the engine chooses"
        if asked.upper() in _AUTO_BACKENDS:
            return None, f"its attention backend {asked} is taken as auto"
        return asked.upper(), ""

    @property
    def enforce_eager(self) -> bool:
        return self.has("--enforce-eager")

    @property
    def api_key(self) -> str | None:
        """The key clients must send: --api-key, else the VLLM_API_KEY of the env given."""
        return self.value("--api-key") or self.env.get("VLLM_API_KEY") or None

    @property
    def rope_scaling(self) -> dict[str, Any] | None:
        """The rope scaling a context extension sets through --hf-overrides (YaRN), where it does."""
        overrides = self.json("--hf-overrides")
        if not isinstance(overrides, dict):
            return None
        for holder in (overrides, overrides.get("text_config") or {}):
            for key in ("rope_scaling", "rope_parameters"):
                if isinstance(holder.get(key), dict):
                    return holder[key]
        return None
