"""Models made here from the embedded weights (selftest/thinker.py reasons, selftest/seer.py sees): each built once
per version of its recipe into the cache (its digest is stamped beside the weights), one builder at a time, and
written beside the old one and moved into its place only once complete, so that a reader never sees half a model.

    python -m selftest.madehere NAME... [--force]

builds the named models in turn (smollm2-think, smollm2-see) and prints where. The self-tests start that in the
background while work that neither times anything nor starts an engine runs (selftest/conftest.py).
"""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkgate.proc import cache_dir, die_with_parent

# name -> the module whose MADE builds it
MODULES = {"smollm2-think": "selftest.thinker", "smollm2-see": "selftest.seer"}


@dataclass(frozen=True)
class Made:
    """A model made here: `train(folder, log)` writes it into an empty folder and returns what its stamp records
    beside the digest (steps, seed, what it measured of itself)."""

    name: str
    digest: Callable[[], str]
    train: Callable[[Path, Callable[[str], None]], dict]

    @property
    def folder(self) -> Path:
        return cache_dir() / "models" / self.name

    def built(self) -> bool:
        try:
            stamp = json.loads((self.folder / "sparkgate-build.json").read_text())
        except (OSError, ValueError):  # none yet, or the folder is being replaced this moment
            return False
        return stamp.get("digest") == self.digest()

    def build(self, force: bool = False, log: Callable[[str], None] = print) -> Path:
        """The model's folder, built if it is not; a build started in the background is waited for while it may
        still make this model, and its failure raised with its log."""
        out = self.folder
        if _background is not None and not force:
            proc, names, printed = _background
            while self.name in names and proc.poll() is None and not self.built():
                time.sleep(1)
            if self.name in names and proc.returncode and not self.built():
                raise RuntimeError(f"the build of {self.name} (python -m selftest.madehere {' '.join(names)}) exited "
                                   f"{proc.returncode}; its log, last:\n{printed.read_text(errors='replace')[-4000:]}")
        if not force and self.built():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.with_name(f"{out.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process's build of it is waited for, and used
            if not force and self.built():
                return out
            for stale in [*out.parent.glob(f"{out.name}.*.tmp"), *out.parent.glob(f"{out.name}.*.old")]:
                shutil.rmtree(stale, ignore_errors=True)  # what a build killed half-way left
            tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
            tmp.mkdir()
            t0 = time.monotonic()
            stamp = {"digest": self.digest(), **self.train(tmp, log), "seconds": round(time.monotonic() - t0)}
            (tmp / "sparkgate-build.json").write_text(json.dumps(stamp))
            old = out.with_name(f"{out.name}.{os.getpid()}.old")
            if out.exists():
                out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
            return out


def made(name: str) -> Made:
    return importlib.import_module(MODULES[name]).MADE


_background: tuple[subprocess.Popen, list[str], Path] | None = None  # the builds started, their names and log
_asked = False  # whether build_in_background has looked (the models wanted are known once collection ends)


def build_in_background(names: list[str]) -> None:
    """Start building, in a process of its own, those of `names` not built yet (once): it has the CPU for minutes,
    and work that neither times anything nor starts an engine can share the machine with it. Each Made.build waits
    for it; it dies with this process."""
    global _background, _asked
    if _asked:
        return
    _asked = True
    wanted = [name for name in names if not made(name).built()]
    if wanted:
        log = cache_dir() / "models" / "made-here.build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        # Its threads sleep, not spin, while they wait (OMP_WAIT_POLICY: spinning took the CPU the work beside it
        # needed: both ran twice as long), and it yields to that work (nice 19: about 1.5% of a core that work
        # wants, all of one it leaves idle); neither changes the weights.
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}  # a killed build leaves its log
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "selftest.madehere", *wanted], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_nice_child,
                                    cwd=Path(__file__).parent.parent)
        _background = (proc, wanted, log)


def _nice_child() -> None:
    die_with_parent()
    os.nice(19)


def stop_background() -> None:
    """A build still running when the session ends (its model not asked for) is stopped, not left behind."""
    if _background is not None and _background[0].poll() is None:
        _background[0].kill()
        _background[0].wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    failed = []
    for name in [a for a in args if a != "--force"] or list(MODULES):
        try:  # one model's failure is its own: the next is still built
            print(made(name).build(force="--force" in args), flush=True)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        sys.exit(f"not built: {', '.join(failed)}")
