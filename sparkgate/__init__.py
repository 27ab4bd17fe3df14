"""sparkgate: acceptance tests that tell an operator whether an LLM serving box is fit to serve."""

from __future__ import annotations

import subprocess
from pathlib import Path

try:  # written by setuptools-scm when the package is built or installed
    from ._version import version as __version__
except ImportError:  # pragma: no cover (a source tree never installed)
    __version__ = "0.0.0+unknown"


def commit() -> str:
    """The commit the running suite is: live from git in a clone, else the one the wheel was built from."""
    clone = Path(__file__).resolve().parent.parent
    if (clone / ".git").exists():
        try:
            out = subprocess.run(["git", "-C", str(clone), "describe", "--always", "--dirty", "--abbrev=12",
                                  "--match", "NOTAG"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    local = __version__.partition("+")[2]  # setuptools-scm: 0.1.devN+g<commit>[.dYYYYMMDD]
    return next((p[1:] for p in local.split(".") if p.startswith("g")), "unknown")
