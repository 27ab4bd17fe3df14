"""The memory arithmetic, written once: does a recipe fit what the host has free?

On unified memory (GB10) the GPU and the OS share one pool, so what counts is /proc/meminfo's MemAvailable.
A recipe needs its budget (resident weights + pinned KV cache + overhead) plus the profile's OS reserve.
Memory held by a container the recipe would replace counts as free: it is given back before the recipe starts.
On a GPU, vLLM itself also refuses to start unless its --gpu-memory-utilization grant (that share of the device's
total, 0.9 when the flag is absent) is free ("Free memory on device ... is less than desired GPU memory
utilization"): the grant does not bound the KV cache, but it must be free at start. A recipe fits when both are.
The pre-flight (refuse before anything is touched) and HOST-MEM-FREE both ask `fit()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .recipes import Profile, Recipe
from .units import GIB

VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization when the flag is absent


@dataclass(frozen=True)
class Fit:
    recipe: Recipe
    reserve_gib: float
    available_gib: float
    reclaimable_gib: float = 0.0
    reclaimable_from: str = ""  # what holds the reclaimable memory ("container qwen3.8-27b-nvfp4")
    utilization: float | None = None  # the --gpu-memory-utilization grant's share, on a GPU profile
    device_gib: float | None = None  # the device's total, as vLLM reports it (the profile's memory_gib)

    @property
    def grant_gib(self) -> float | None:
        if self.utilization is None or self.device_gib is None:
            return None
        return self.utilization * self.device_gib

    @property
    def need_gib(self) -> float:
        return self.recipe.memory.budget_gib + self.reserve_gib

    @property
    def have_gib(self) -> float:
        return self.available_gib + self.reclaimable_gib

    @property
    def grant_ok(self) -> bool:
        return self.grant_gib is None or self.grant_gib <= self.have_gib

    @property
    def grant_binds(self) -> bool:
        """The grant, not the budget, is what does not fit (freeing the budget's shortfall would not be enough)."""
        return not self.grant_ok and self.grant_gib > self.need_gib

    @property
    def ok(self) -> bool:
        return self.need_gib <= self.have_gib and self.grant_ok

    def needs(self) -> str:
        m = self.recipe.memory
        text = (f"{m.budget_gib:.1f} GiB (weights {m.weights_gib:g} + KV cache {m.kv_cache_gib:g} + overhead "
                f"{m.overhead_gib:g}) plus {self.reserve_gib:g} GiB kept for the OS = {self.need_gib:.1f} GiB")
        if self.grant_binds:
            text += (f", and vLLM will not start unless its --gpu-memory-utilization grant is free: "
                     f"{self.utilization:g} x {self.device_gib:g} = {self.grant_gib:.1f} GiB")
        return text

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
                f"pid,process_name,used_memory --format=csv), or pin a smaller KV cache with --kv-cache-memory."
                + (f" The grant is what does not fit: {self.grant_remedy()}." if self.grant_binds else ""))

    def grant_remedy(self) -> str:
        """When the grant binds: the most it may be, for what is free."""
        if not self.grant_binds:
            return ""
        return (f"lower --gpu-memory-utilization to at most {self.have_gib / self.device_gib:.2f} (with "
                f"--kv-cache-memory pinning the KV cache, the grant bounds nothing else)")


def fit(recipe: Recipe, profile: Profile, mem_available_bytes: int, reclaimable_bytes: int = 0,
        reclaimable_from: str = "") -> Fit:
    utilization = None
    if profile.gpu is not None and profile.memory_gib is not None:
        given = recipe.arg("--gpu-memory-utilization")
        try:
            utilization = float(given) if given is not None else VLLM_DEFAULT_UTILIZATION
        except ValueError:  # not a number: vLLM refuses the flag itself, with its own message
            utilization = None
    return Fit(recipe, profile.os_reserve_gib, mem_available_bytes / GIB, reclaimable_bytes / GIB, reclaimable_from,
               utilization, profile.memory_gib)
