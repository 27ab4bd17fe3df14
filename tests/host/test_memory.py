"""Unified memory: the GPU and the OS share one pool, so free memory is read from /proc/meminfo."""

import pytest

from sparkgate.hostfacts import gpu_mib_of_container
from sparkgate.memory import fit
from sparkgate.units import GIB, MIB


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
        held = host_facts.container(r.container_name)
        reclaimable = 0 if held is None else held.resident_bytes + gpu_mib_of_container(
            target_host, host_facts, held.id) * MIB
        verdict = fit(r, profiles[r.profile], host_facts.mem_available_bytes, reclaimable,
                      f"container {r.container_name}")
        if not verdict.ok:
            remedy = verdict.grant_remedy()
            short.append(f"{r.name} needs {verdict.needs()}" + (f": {remedy}" if remedy else ""))
    check.that(not short, expected="each recipe's budget + OS reserve, and on a GPU its --gpu-memory-utilization "
                                   "grant, <= MemAvailable (+ what it replaces)",
               found=f"MemAvailable {host_facts.mem_available_bytes / GIB:.1f} GiB; " + "; ".join(short))


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
