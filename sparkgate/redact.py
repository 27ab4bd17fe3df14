"""One formatter between the suite and everything it writes: no secret leaves the box.

Every message, progress line, report section, results file and `sparkgate recipes show` goes through `mask()`.
It hides:
- the values of environment variables whose names look like secrets (`HF_TOKEN=...`, `"OPENAI_API_KEY": "..."`),
  judged by the parts of the name (TOKEN, KEY, SECRET, PASSWORD, ...; TOKENIZERS_PARALLELISM is not one);
- the value after a secret flag (`--api-key`, `--hf-token`, ...), `Authorization:`/`Bearer` values, the password
  of a URL (`scheme://user:password@host`) and well-known token shapes (`hf_...`, `sk-...`, `nvapi-...`);
- every secret value registered with `secret()` wherever it appears (a recipe's, a container's, --api-key's).

`--redact` adds stable placeholders for what identifies a box or a person (hostname, ssh target, user, home
paths, PCI ids) in the report and the results file, so they can be shared.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from .serveargs import SECRET_FLAGS

HIDDEN = "***"
_SECRET_PARTS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PASSPHRASE", "KEY", "APIKEY", "CREDENTIAL",
                 "CREDENTIALS", "AUTH", "AUTHORIZATION", "PAT", "COOKIE", "SESSION"}
_VALUE = r"""("[^"]*"|'[^']*'|[^\s'",;\]\)}]+)"""
_ASSIGN = re.compile(rf"\b([A-Za-z_][A-Za-z0-9_]*)=({_VALUE[1:-1]})")
_QUOTED_PAIR = re.compile(r"""(["'])([A-Za-z_][A-Za-z0-9_]*)\1(\s*:\s*)(["'])(.*?)\4""")
_FLAG = re.compile(rf"({'|'.join(map(re.escape, SECRET_FLAGS))})(=|\s+|['\"]\s*,\s*['\"])({_VALUE[1:-1]})")
_AUTH = re.compile(r"(?i)\b(authorization\s*[:=]\s*(?:bearer\s+|basic\s+)?|bearer\s+)([^\s'\",;]+)")
_URL_CREDENTIALS = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)")  # scheme://user:PASSWORD@
_SHAPES = re.compile(r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|nvapi-[A-Za-z0-9_-]{20,}"
                     r"|gh[pousr]_[A-Za-z0-9]{30,})")


def secret_name(name: str) -> bool:
    """An environment variable whose value is a secret, by the parts of its name. A quantity per something
    (`kv_bytes_per_token`) is a measurement: what follows PER is not judged."""
    parts = re.split(r"[_\W]+", name.upper())
    if "PER" in parts[1:]:
        parts = parts[:parts.index("PER", 1)]
    return bool(set(parts) & _SECRET_PARTS) or "_".join(parts).endswith(("APIKEY", "TOKEN", "SECRET", "PASSWORD"))


class Masker:
    """The formatter. One per process (`MASKER`); secrets are registered as they are found."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()
        self.placeholders: dict[str, str] = {}  # --redact: value -> placeholder

    def secret(self, value: str | None) -> None:
        if value and len(value) >= 4 and value != HIDDEN:
            self.secrets.add(value)

    def secrets_of(self, env: Mapping[str, str] | None = None, argv: Iterable[str] = ()) -> None:
        """Register the secret values of an environment and of a command line."""
        for k, v in (env or {}).items():
            if secret_name(k):
                self.secret(v)
        args = list(argv)
        for i, a in enumerate(args):
            for flag in SECRET_FLAGS:
                if a == flag and i + 1 < len(args):
                    self.secret(args[i + 1])
                elif a.startswith(flag + "="):
                    self.secret(a.split("=", 1)[1])

    def redact(self, value: str | None, placeholder: str) -> None:
        """--redact: show `placeholder` wherever `value` appears."""
        if value and len(value) >= 3 and value not in self.placeholders:
            self.placeholders[value] = placeholder

    def __call__(self, text: str) -> str:
        if not text:
            return text
        for value in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(value, HIDDEN)
        text = _ASSIGN.sub(lambda m: f"{m[1]}={HIDDEN}" if secret_name(m[1]) else m[0], text)
        text = _QUOTED_PAIR.sub(lambda m: f"{m[1]}{m[2]}{m[1]}{m[3]}{m[4]}{HIDDEN}{m[4]}" if secret_name(m[2])
                                else m[0], text)
        text = _FLAG.sub(lambda m: f"{m[1]}{m[2]}{HIDDEN}", text)
        text = _AUTH.sub(lambda m: f"{m[1]}{HIDDEN}", text)
        text = _URL_CREDENTIALS.sub(lambda m: f"{m[1]}{HIDDEN}{m[3]}", text)
        text = _SHAPES.sub(HIDDEN, text)
        for value, placeholder in sorted(self.placeholders.items(), key=lambda kv: len(kv[0]), reverse=True):
            text = text.replace(value, placeholder)
        return text


MASKER = Masker()


def mask(text: str) -> str:
    """`text` as it may be shown or stored: secrets hidden (and, under --redact, identities replaced)."""
    return MASKER(text)


def secret(value: str | None) -> None:
    MASKER.secret(value)


def secrets_of(env: Mapping[str, str] | None = None, argv: Iterable[str] = ()) -> None:
    MASKER.secrets_of(env, argv)


def mask_argv(argv: Iterable[str]) -> list[str]:
    """A command line masked token by token, before it is quoted (a quote inside a secret would otherwise split
    it, and half of it would show): the value after a secret flag, `--flag=value`, `NAME=value` of a secret name."""
    out: list[str] = []
    for token in argv:
        flag, eq, value = token.partition("=")
        if out and out[-1] in SECRET_FLAGS:
            out.append(HIDDEN)
        elif eq and value and (flag in SECRET_FLAGS or (flag.isidentifier() and secret_name(flag))):
            out.append(f"{flag}={HIDDEN}")
        else:
            out.append(mask(token))
    return out


_SENTINEL = "SPARKGATEHIDDENVALUE"  # shlex would quote the stars; there is nothing left to hide in a placeholder


def join_masked(argv: Iterable[str], env: Mapping[str, str] | None = None) -> str:
    """A command line to show, led by its environment (`NAME=value`, which a shell reads only unquoted): masked
    token by token (mask_argv), then shell-quoted; a hidden value shows as `***`."""
    assigns = [f"{k}={shlex.quote(_SENTINEL if secret_name(k) else mask(v).replace(HIDDEN, _SENTINEL))}"
               for k, v in (env or {}).items()]
    line = shlex.join(t.replace(HIDDEN, _SENTINEL) for t in mask_argv(argv))
    return " ".join([*assigns, line]).replace(_SENTINEL, HIDDEN)


def mask_json(value: Any) -> Any:
    """A JSON-able value with every string in it masked (keys and values, at any depth), before it is serialised:
    masking the serialised text misses a secret holding a quote or a backslash, and can break the JSON."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, Mapping):  # under a secret's name (`api-key`, `HF_TOKEN`, any case): hidden whole
        return {mask(str(k)): _hidden(v) if secret_name(str(k)) else mask_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_json(v) for v in value]
    return value


# ---- what it writes into documents others open ------------------------------------------------------------------

_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")


_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def printable(text: str, limit: int = 240) -> str:
    """What a box or a server said, as it may go into a message: printable ASCII (anything else, a terminal's escape
    included, becomes `?`), at most `limit` characters."""
    text = _UNPRINTABLE.sub("?", text)
    return text if len(text) <= limit else text[:limit] + "..."


def md_text(text: str) -> str:
    """Text for a Markdown table cell or list item: masked, on one line, `|` escaped, and no raw HTML (GitHub renders
    it): a server's or a contributor's string stays text."""
    one_line = " ".join(mask(text).split())
    return one_line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def csv_text(text: str) -> str:
    """Text for a CSV cell: masked, and never a formula a spreadsheet would run (`=`, `+`, `-`, `@`, a tab or a
    carriage return first: prefixed with `'`, as OWASP advises); plain numbers stay numbers."""
    text = mask(text)
    if text[:1] in ("=", "+", "-", "@", "\t", "\r") and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def _hidden(value: Any) -> Any:
    """A value under a secret's name: strings hidden, in lists too; numbers, booleans and objects kept as they are
    (masked inside)."""
    if isinstance(value, str):
        return HIDDEN if value else value
    if isinstance(value, list | tuple):
        return [_hidden(v) for v in value]
    return mask_json(value)
