"""Where the shipped checks, recipes, profiles and repro bodies are.

In a clone they are the repository's own folders (tests/, recipes/, profiles/); in an installed wheel the same files
sit inside the package (sparkgate/suite, sparkgate/data/recipes, sparkgate/data/profiles), mapped there at build
time (pyproject.toml). Whichever exists is used.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _first(*candidates: Path) -> Path:
    return next((c for c in candidates if c.is_dir()), candidates[-1])


SUITE_DIR = _first(_PACKAGE / "suite", _PACKAGE.parent / "tests")
RECIPES_DIR = _first(_PACKAGE / "data" / "recipes", _PACKAGE.parent / "recipes")
PROFILES_DIR = _first(_PACKAGE / "data" / "profiles", _PACKAGE.parent / "profiles")
REPRO_DIR = SUITE_DIR / "data" / "repro"
LAYERS = ("host", "container", "serving", "perf")


def layer_of(path: Path) -> str | None:
    """The layer a check file belongs to: its folder, under the suite (tests/<layer>/, or sparkgate/suite/<layer>/
    in the wheel)."""
    folder = Path(path).parent
    return folder.name if folder.name in LAYERS and folder.parent.name in ("tests", "suite") else None
