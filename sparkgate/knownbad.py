"""The known-bad list (known_bad.yaml, shipped with the suite): library releases that break serving on this hardware
while everything starts and answers, each with its source; and how a container's Python packages are read against it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter

LIST = Path(__file__).with_name("known_bad.yaml")
# The throwaway container that lists the packages is named after the server's, so `docker ps` says what it is.
LISTER_SUFFIX = ".sparkgate-packages"
LISTER_TIMEOUT_S = 120  # Python's start and one pass over site-packages: seconds, even from a cold disk

# Runs in the container (POSIX sh): the system's NCCL as dpkg knows it, "DEB libnccl2 version" (NGC's images install
# it from NVIDIA's apt repository, not as a wheel); then the Python that runs the server ($1, the container's command:
# a python, or a console script whose #! line names one; else python3), listing every distribution it can import as
# "PKG name version".
PACKAGES_SCRIPT = r"""
command -v dpkg-query >/dev/null 2>&1 &&
  dpkg-query -W -f='DEB ${db:Status-Abbrev} ${Package} ${Version}\n' libnccl2 2>/dev/null
exe="$1"; py=""
case "$exe" in
  */python*|python*) py="$exe" ;;
  *) p=$(command -v "$exe" 2>/dev/null) && py=$(sed -n '1s/^#![[:space:]]*\([^[:space:]]*\).*/\1/p' "$p") ;;
esac
case "$py" in */env|"") py=$(command -v python3 || command -v python) ;; esac
[ -n "$py" ] || { echo NOPYTHON; exit 0; }
exec "$py" -c 'import importlib.metadata as m
for d in m.distributions():
    print("PKG", d.metadata["Name"], d.version)'
"""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]{0,49}$")
_DEB_VERSION = re.compile(r"^[0-9][A-Za-z0-9.+~:_-]{0,49}$")  # [epoch:]upstream[-revision], as dpkg writes them


class KnownBad(BaseModel):
    model_config = ConfigDict(extra="forbid")

    package: str
    versions: list[str]
    fixed_in: str
    effect: str
    source: str


@cache
def entries() -> tuple[KnownBad, ...]:
    return tuple(TypeAdapter(list[KnownBad]).validate_python(yaml.safe_load(LIST.read_text())))


def normalized(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(output: str, kind: str = "PKG") -> dict[str, str]:
    """PACKAGES_SCRIPT's output: normalized name -> version, of the Python distributions (kind PKG) or of the system
    packages dpkg lists (DEB). A line that is not a plain name and version (anything in an image can print anything)
    is left out."""
    found = {}
    for line in output.splitlines():
        cells = line.split()
        if kind == "DEB":  # "DEB ii NAME VERSION": installed only (a package removed bar its config keeps a version)
            entry, valid = (cells[2:] if len(cells) == 4 and cells[:2] == ["DEB", "ii"] else []), _DEB_VERSION
        else:
            entry, valid = (cells[1:] if len(cells) == 3 and cells[0] == "PKG" else []), _VERSION
        if entry and _NAME.match(entry[0]) and valid.match(entry[1]):
            found.setdefault(normalized(entry[0]), entry[1])  # the first on the path is the one Python imports
    return found


# The libraries the nodes of a fleet, or the two of a two-node recipe, must share: a collective between two builds
# of NCCL, or kernels of two builds, may hang or disagree. fact name -> the distributions that carry it.
SHARED_LIBRARIES = {
    "nccl": ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "libnccl2"),
    "torch": ("torch",),
    "triton": ("triton",),
    "flashinfer": ("flashinfer-python",),
    "cutlass-dsl": ("nvidia-cutlass-dsl",),
}


def shared_libraries(installed: dict[str, str]) -> dict[str, str]:
    """SHARED_LIBRARIES found among `installed` (the Python distributions and the system packages read): fact name ->
    'distribution version', every one present (an image may carry NCCL's wheels for two CUDA versions, or a wheel
    and the system's)."""
    found = {fact: ", ".join(f"{d} {installed[d]}" for d in dists if d in installed)
             for fact, dists in SHARED_LIBRARIES.items()}
    return {fact: releases for fact, releases in found.items() if releases}


def held(installed: dict[str, str]) -> list[tuple[KnownBad, str]]:
    """The known-bad releases among `installed`, with the version found."""
    return [(e, installed[normalized(e.package)]) for e in entries()
            if installed.get(normalized(e.package)) in e.versions]
