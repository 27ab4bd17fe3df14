"""Unified memory: the GPU and the OS share one pool, so free memory is read from /proc/meminfo."""

import pytest

from sparkgate.hostfacts import gpu_mib_of_container
from sparkgate.memory import fit
from sparkgate.units import GIB, MIB


def _held_by_the_replaced(target_host, host_facts, recipe) -> int:
    """What the container a recipe replaces holds (resident and on the GPU): given back before the recipe starts."""
    held = host_facts.container(recipe.container_name)
    return 0 if held is None else held.resident_bytes + gpu_mib_of_container(target_host, host_facts, held.id) * MIB


@pytest.mark.check(
    "HOST-MEM-FREE",
    why="vLLM sizes its KV cache from free memory; starting into too little livelocked a Spark (sshd "
        "unreachable, every container OOM-killed) in the guide",
    fix="stop other model servers (nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv), "
        "pin a smaller KV cache with --kv-cache-memory in the recipe, or lower --gpu-memory-utilization (vLLM "
        "wants its grant free at start, though the grant bounds nothing)",
)
def test_available_memory_covers_every_selected_recipe(check, target_host, host_facts, selected_recipes,
                                                       profiles):
    """MemAvailable (plus what a container the recipe replaces holds) MUST cover each selected recipe's memory
    budget plus the profile's OS reserve, and its --gpu-memory-utilization grant, which vLLM wants free at start."""
    if not selected_recipes:
        check.cannot_run("no recipe selected for this host", "--recipe NAME")
    short = []
    for r in selected_recipes:
        verdict = fit(r, profiles[r.profile], host_facts.mem_available_bytes,
                      _held_by_the_replaced(target_host, host_facts, r), f"container {r.container_name}")
        if not verdict.ok:
            remedy = verdict.grant_remedy()
            short.append(f"{r.name} needs {verdict.needs()}" + (f": {remedy}" if remedy else ""))
    check.that(not short, expected="each recipe's budget + OS reserve, and on a GPU its --gpu-memory-utilization "
                                   "grant, <= MemAvailable (+ what it replaces)",
               found=f"MemAvailable {host_facts.mem_available_bytes / GIB:.1f} GiB; " + "; ".join(short))


@pytest.mark.check(
    "HOST-MEM-CACHE",
    why="on unified memory vLLM's start check counts the page cache as used (vLLM #35313, in the guide): with an "
        "earlier model's weights still cached it refuses to start ('Free memory on device ... is less than desired "
        "GPU memory utilization') though MemAvailable covers its grant",
    fix="drop the clean page cache just before the start: `sync && echo 3 | sudo tee /proc/sys/vm/drop_caches` (it "
        "frees only copies of files that are on disk; they are read again when needed); or lower "
        "--gpu-memory-utilization (the guide: 0.72 to 0.85) with --kv-cache-memory pinning the KV cache",
)
def test_free_memory_without_the_page_cache_covers_every_grant(check, target_host, host_facts, selected_recipes,
                                                              profiles):
    """On unified memory, MemFree (what vLLM's start check sees: the page cache counted as used) MUST cover each
    selected recipe's --gpu-memory-utilization grant."""
    unified = [r for r in selected_recipes if profiles[r.profile].unified_memory]
    if not unified:
        check.cannot_run("no selected recipe runs on unified memory (a profile with unified_memory: true)",
                         "--profile gb10")
    if host_facts.mem_free_bytes is None:
        check.cannot_run("/proc/meminfo on the box has no MemFree")
    judged, short = [], []
    for r in unified:
        held = _held_by_the_replaced(target_host, host_facts, r)
        if not fit(r, profiles[r.profile], host_facts.mem_available_bytes, held).grant_ok:
            continue  # MemAvailable itself does not cover it: HOST-MEM-FREE's failure, not the page cache's
        judged.append(r.name)
        seen = fit(r, profiles[r.profile], host_facts.mem_free_bytes, held)
        if not seen.grant_ok:
            short.append(f"{r.name}'s grant is {seen.utilization:g} x {seen.device_gib:g} = {seen.grant_gib:.1f} GiB")
    if not judged:
        check.cannot_run("MemAvailable does not cover any selected recipe's grant: HOST-MEM-FREE says by how much")
    free, available = host_facts.mem_free_bytes / GIB, host_facts.mem_available_bytes / GIB
    check.that(not short, expected="each grant <= MemFree (+ what the recipe replaces), the page cache not counted",
               found=f"MemFree {free:.1f} GiB of MemAvailable {available:.1f} GiB: {available - free:.1f} GiB is page "
                     "cache and kernel memory the kernel would reclaim, which vLLM counts as used; " + "; ".join(short))


@pytest.mark.check(
    "HOST-MEM-TOTAL",
    why="the recipes' memory budgets are written for this much unified memory; less means a different "
        "machine or memory taken away (a VM limit, a carve-out)",
    fix="run the recipes on a host of their profile, or write recipes for this memory size",
)
def test_total_memory_is_the_profiles(check, host_facts, profile):
    """MemTotal MUST be at least 95% of the profile's memory (nvidia-smi has no memory figure on GB10)."""
    if profile.memory_gib is None:
        check.cannot_run(f"profile {profile.name} names no memory size", "--profile gb10")
    total = host_facts.mem_total_bytes / GIB
    check.that(total >= 0.95 * profile.memory_gib, expected=f">= {0.95 * profile.memory_gib:.1f} GiB "
               f"(95% of {profile.memory_gib:g}, profile {profile.name})", found=f"MemTotal {total:.2f} GiB")
