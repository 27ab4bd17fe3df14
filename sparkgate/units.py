"""Units, defined once: binary sizes and the byte counts serve flags and logs write."""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3

_UNITS = {"ki": KIB, "mi": MIB, "gi": GIB, "ti": 1024**4, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_flag_bytes(text: str) -> int:
    """A byte count as vLLM's flags take it (--kv-cache-memory-bytes): plain bytes, or one letter k/m/g/t, decimal in
    lower case (1k = 1,000) and binary in upper case (1K = 1,024, whole numbers only). "20G" pins 20 GiB, not 20e9
    bytes; anything else is a ValueError, as vLLM refuses it."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text.strip())
    if m is None:
        return int(text)
    number, suffix = m.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)


def parse_bytes(text: str) -> int:
    """A byte count as tools print it (docker stats): plain bytes, or a k/M/G/T (decimal) or Ki/Mi/Gi/Ti (binary)
    suffix, with or without a trailing B ("16GiB", "1.5GB", "21474836480")."""
    t = text.strip()
    if len(t) > 1 and t[-1] in "bB":  # 16GiB, 16GB, 0B: the B is the unit's
        t = t[:-1]
    for suffix, mult in _UNITS.items():
        if t.lower().endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(float(t))


def parse_tokens(text: str) -> int:
    """A token count as vLLM writes lengths: 131072, 128k (x1000), 128K (x1024), 1m, 1M."""
    mult = {"k": 1000, "K": 1024, "m": 10**6, "M": 1024**2}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)
