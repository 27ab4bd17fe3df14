"""The memory arithmetic, written once: does a recipe fit what the host has free?

On unified memory (GB10) the GPU and the OS share one pool, so what counts is /proc/meminfo's MemAvailable.
A recipe needs its budget (resident weights + pinned KV cache + overhead) plus the profile's OS reserve.
Memory held by a container the recipe would replace counts as free: it is given back before the recipe starts.
The pre-flight (refuse before anything is touched) and HOST-MEM-FREE both ask `fit()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .recipes import Profile, Recipe
from .units import GIB


@dataclass(frozen=True)
class Fit:
    recipe: Recipe
    reserve_gib: float
    available_gib: float
    reclaimable_gib: float = 0.0
    reclaimable_from: str = ""  # what holds the reclaimable memory ("container qwen3.8-27b-nvfp4")

    @property
    def need_gib(self) -> float:
        return self.recipe.memory.budget_gib + self.reserve_gib

    @property
    def have_gib(self) -> float:
        return self.available_gib + self.reclaimable_gib

    @property
    def ok(self) -> bool:
        return self.need_gib <= self.have_gib

    def needs(self) -> str:
        m = self.recipe.memory
        return (f"{m.budget_gib:.1f} GiB (weights {m.weights_gib:g} + KV cache {m.kv_cache_gib:g} + overhead "
                f"{m.overhead_gib:g}) plus {self.reserve_gib:g} GiB kept for the OS = {self.need_gib:.1f} GiB")

    def has(self) -> str:
        text = f"{self.available_gib:.1f} GiB available (MemAvailable)"
        if self.reclaimable_gib:
            text += f" + {self.reclaimable_gib:.1f} GiB held by {self.reclaimable_from}, which it replaces"
        return text

    def refusal(self) -> str:
        """Why the recipe is refused, with the numbers, for an operator at 2 a.m."""
        r = self.recipe
        return (f"refusing to start {r.name}: it needs {self.needs()} ({r.memory.basis.strip()}), and the host has "
                f"{self.has()}. On unified memory the GPU and the OS share one pool: starting anyway risks the "
                f"livelock the guide describes (sshd unreachable, other containers OOM-killed). Nothing was "
                f"stopped or started. Free memory first (another model server? nvidia-smi --query-compute-apps="
                f"pid,process_name,used_memory --format=csv), or pin a smaller KV cache with --kv-cache-memory.")


def fit(recipe: Recipe, profile: Profile, mem_available_bytes: int, reclaimable_bytes: int = 0,
        reclaimable_from: str = "") -> Fit:
    return Fit(recipe, profile.os_reserve_gib, mem_available_bytes / GIB, reclaimable_bytes / GIB, reclaimable_from)
