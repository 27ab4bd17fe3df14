"""Whether a model's files in the Hugging Face cache are whole, checked on the box with no network.

The cache keeps each file of a model once, under blobs/, named by its hash: a weights file (stored with Git LFS on
the hub) by the SHA-256 of its content, a small file by its git blob id (SHA-1 of "blob <size>\\0" and its content).
snapshots/<revision>/<path> are links to those blobs. A file whose content no longer hashes to its name was cut
short or damaged after it was written (hub downloads go to <hash>.incomplete and are renamed only when complete).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

# Runs on the box (POSIX sh, coreutils): one line per blob, smallest first, hashing until `budget` bytes are hashed
# (0: all); then one line per snapshot link. A blob name that is not a hash is counted, never printed or hashed.
_SCRIPT = r"""
set -f
d="$1"; budget="$2"; done=0
command -v sha256sum >/dev/null && command -v sha1sum >/dev/null || { echo NOTOOLS; exit 0; }
[ -d "$d" ] || { echo ABSENT; exit 0; }
cd "$d/blobs" 2>/dev/null || { echo NOBLOBS; exit 0; }
ls -Sr | while IFS= read -r f; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  n=$(stat -c %s -- "$f")
  case "$f" in
    *.incomplete) echo "INCOMPLETE $f $n"; continue;;
    *[!0-9a-f]*) echo "OTHER $n"; continue;;
  esac
  if [ "$budget" -gt 0 ] && [ $((done + n)) -gt "$budget" ]; then echo "SAMPLED-OUT $f $n"; continue; fi
  case ${#f} in
    64) h=$(sha256sum < "$f");;
    40) h=$({ printf 'blob %s\000' "$n"; cat "$f"; } | sha1sum);;
    *) echo "OTHER $n"; continue;;
  esac
  done=$((done + n)); echo "BLOB $f ${h%% *} $n"
done
cd "$d" && find snapshots -type l 2>/dev/null | while read -r l; do echo "LINK $(basename "$(readlink "$l")") $l"; done
"""

_HASH = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
# A snapshot path as it goes into a message: no control characters, nothing markup or a shell would read.
_PATH = re.compile(r"^snapshots/[^\x00-\x1f\x7f<>&\"'`$\\]+$")


def model_dir(hf_cache: str, model_id: str) -> str:
    """Where the cache keeps `model_id` (org/name): <cache>/hub/models--org--name."""
    return f"{hf_cache.rstrip('/')}/hub/models--{model_id.replace('/', '--')}"


def command(hf_cache: str, model_id: str, budget_bytes: int = 0) -> str:
    """The shell command that hashes the model's blobs on the box (`budget_bytes`: hash the smallest files up to
    that many bytes, 0: every file)."""
    return f"sh -c {shlex.quote(_SCRIPT)} sparkgate-hfcache {shlex.quote(model_dir(hf_cache, model_id))} " \
           f"{int(budget_bytes)}"


@dataclass
class Blob:
    name: str  # the hash the cache names it by
    size: int
    actual: str | None = None  # its content's hash; None: not hashed (sampled out)
    files: list[str] = field(default_factory=list)  # snapshots/<revision>/<path> that link to it

    @property
    def whole(self) -> bool | None:
        return None if self.actual is None else self.actual == self.name

    def __str__(self) -> str:
        return f"{', '.join(self.files) or 'blobs/' + self.name} ({self.size:,} bytes)"


@dataclass
class CachedModel:
    present: bool
    unreadable: str = ""  # why the box could not hash it (no sha256sum)
    blobs: list[Blob] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # downloads never finished (<hash>.incomplete)
    unnamed: int = 0  # files under blobs/ whose name is not a hash

    @property
    def damaged(self) -> list[Blob]:
        return [b for b in self.blobs if b.whole is False]

    @property
    def hashed(self) -> list[Blob]:
        return [b for b in self.blobs if b.actual is not None]


def parse(output: str) -> CachedModel:
    """What command() printed. Lines that are not its own are ignored; a hash that is not one is never trusted."""
    lines = output.splitlines()
    if lines and lines[0].strip() == "NOTOOLS":
        return CachedModel(present=False, unreadable="the box has no sha256sum and sha1sum (coreutils)")
    if not lines or lines[0].strip() in ("ABSENT", "NOBLOBS"):
        return CachedModel(present=False)
    model, by_name = CachedModel(present=True), {}
    for line in lines:
        kind, _, rest = line.partition(" ")
        parts = rest.split(" ")
        try:
            if kind == "BLOB" and len(parts) == 3 and _HASH.match(parts[0]):
                blob = Blob(parts[0], int(parts[2]), parts[1] if _HASH.match(parts[1]) else "")
            elif kind == "SAMPLED-OUT" and len(parts) == 2 and _HASH.match(parts[0]):
                blob = Blob(parts[0], int(parts[1]))
            elif kind == "INCOMPLETE" and len(parts) == 2:
                model.incomplete.append(parts[0])
                continue
            elif kind == "OTHER":
                model.unnamed += 1
                continue
            elif kind == "LINK" and len(parts) >= 2 and parts[0] in by_name:
                path = " ".join(parts[1:])
                by_name[parts[0]].files.append(path if _PATH.match(path) else "snapshots/(a path with odd characters)")
                continue
            else:
                continue
        except ValueError:
            continue
        by_name[blob.name] = blob
        model.blobs.append(blob)
    return model
