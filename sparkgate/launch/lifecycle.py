"""A recipe's lifecycle: refuse before touching, start, wait until it serves, and always put the box back.

1. Refuse what can never serve: a GGUF of a Gated DeltaNet hybrid (dequantised to bf16, it cannot fit).
2. Decide before touching: the docker launcher plans (test what serves in place, replace it when the run may take
   it over, or start fresh) and the memory arithmetic runs on that plan (what a replaced container holds counts as
   free), so a refused recipe never interrupts production.
3. Start through the recipe's launcher and wait for /v1/models, watching the launcher: a server that dies or
   loops fails at once with its log tail.
4. Teardown always runs, shielded from Ctrl-C/SIGTERM/SIGHUP until it has finished, and removes what was
   started. What was set aside stays aside for the run's next recipe: the run (sparkgate.session) brings it back
   after the last one and waits until it serves. A restore that cannot be done is an error with the commands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..hostlock import Journal
from ..memory import fit
from ..proc import shielded
from ..recipes import Profile, Recipe
from ..vllmlog import parse as parse_log
from .base import Progress, Server, StartError, masked
from .docker_engine import DockerEngine
from .docker_launcher import DockerLauncher, HostSide
from .process_launcher import ProcessLauncher


def gguf_of_gdn_hybrid(recipe: Recipe) -> str | None:
    """Why the recipe cannot be served, when it would serve a GGUF of a Gated DeltaNet hybrid; else None."""
    m = recipe.model
    gguf = (m.format == "gguf" or m.id.lower().endswith(".gguf") or recipe.arg("--quantization") == "gguf"
            or recipe.arg("--load-format") == "gguf")
    if not (gguf and m.gdn_hybrid):
        return None
    return (f"refusing to start {recipe.name}: it serves a GGUF of {m.id}, a Gated DeltaNet hybrid. vLLM has no "
            f"GGUF support for GDN hybrids (in-tree GGUF was removed in v0.24.0; vllm-gguf-plugin does not know "
            f"the architecture), so the weights are dequantised to bf16 (about 160 GB for the 80B model): it "
            f"cannot fit, and under a restart policy it OOMs, restarts and livelocks the box. Serve a natively "
            f"quantized checkpoint (int4-AutoRound, AWQ, FP8, NVFP4) instead, or a GGUF with llama.cpp.")


@contextmanager
def serving(recipe: Recipe, profile: Profile, read_mem_available: Callable[[], int], progress: Progress,
            timeout_s: float, *, docker: Callable[[], DockerEngine] | None = None, journal: Journal | None = None,
            host: HostSide | None = None, take_over: bool = False,
            last_start: Callable[[str], float | None] = lambda _name: None) -> Iterator[Server]:
    """Bring `recipe` up, hand it out, and always put the box back as it was."""
    progress = masked(progress)
    if why := gguf_of_gdn_hybrid(recipe):
        raise StartError(why)
    launcher: Any
    if recipe.launcher == "process":
        launcher = ProcessLauncher(recipe)
    elif docker is not None and journal is not None:
        launcher = DockerLauncher(recipe, docker(), journal, host, take_over=take_over, last_start=last_start)
    else:
        raise StartError(f"{recipe.name}: the {recipe.launcher} launcher needs the target's docker engine")
    try:
        if isinstance(launcher, DockerLauncher):
            plan = launcher.plan(progress)
            if plan.reuse is None and not plan.in_place:
                _preflight(recipe, profile, read_mem_available(), plan.reclaimable_bytes,
                           f"container {recipe.container_name}")
            server = launcher.start(plan, progress, timeout_s)
        elif (found := launcher.in_place(progress)) is not None:
            server = found
        else:
            _preflight(recipe, profile, read_mem_available())
            server = launcher.start(progress, timeout_s)
        if server.log_path is not None:  # the startup facts of vLLM's log, for the results file
            server.facts.update(parse_log(server.log_text()).summary())
        yield server
    finally:
        with shielded(progress, f"the teardown of {recipe.name}"):
            try:
                if launcher.stop(progress):
                    restored = getattr(launcher, "restored", None)
                    progress(f"{recipe.name}: stopped and removed" + (f"; {restored}" if restored else ""))
            except StartError as exc:
                progress(f"{recipe.name}: COULD NOT PUT THE BOX BACK: {exc}")
                raise


def _preflight(recipe: Recipe, profile: Profile, available: int, reclaimable: int = 0, holder: str = "") -> None:
    verdict = fit(recipe, profile, available, reclaimable, holder)
    if not verdict.ok:
        raise StartError(verdict.refusal())
