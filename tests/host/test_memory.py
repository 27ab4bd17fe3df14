"""Unified memory: the GPU and the OS share one pool, so free memory is read from /proc/meminfo."""

import time

import pytest

from sparkgate.hostfacts import PS_MEMORY, gpu_mib_of_container, processes_started_within
from sparkgate.memory import fit
from sparkgate.units import GIB, MIB


def _held_by_the_replaced(target_host, host_facts, recipe) -> int:
    """What the container a recipe replaces holds (resident and on the GPU): given back before the recipe starts."""
    held = host_facts.container(recipe.container_name)
    if held is None:
        return 0
    return held.resident_bytes + gpu_mib_of_container(target_host, host_facts.compute_apps, held.id) * MIB


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


SETTLE_S = 30  # memory a removed server gives back returns within seconds; this long is waited before judging


@pytest.mark.run_end
@pytest.mark.check(
    "HOST-MEM-BACK",
    why="memory a run does not give back is memory the next start lacks: on unified memory a process left behind (an "
        "engine that outlived its server), or memory the driver keeps after a hard-stopped container, starves or "
        "refuses the next model until someone finds it (owners report memory trapped until a reboot)",
    fix="stop a process named here by its pid (never by pattern), remove a container left behind (`docker rm -f "
        "NAME`) and stale files in /dev/shm; if no process holds it, the kernel or the driver keeps it: reboot the "
        "box before the next start",
)
def test_memory_is_back_after_the_run(check, after_the_recipes, target_host, host_facts, record_property):
    """After the run's servers are removed (and what --take-over set aside serves again), MemAvailable MUST be back
    within 1 GiB or 2% of MemTotal (the larger) of what it was when the run began."""
    run = after_the_recipes
    if not run.started_any:
        check.cannot_run("the run started no server on the box (--base-url, or what serves was tested in place), so "
                         "it took no memory to give back", "a run that starts a recipe")
    before, margin = host_facts.mem_available_bytes, max(GIB, 0.02 * host_facts.mem_total_bytes)
    deadline = time.monotonic() + SETTLE_S
    while (after := run.mem_available()) < before - margin and time.monotonic() < deadline:
        time.sleep(2)
    figures = (f"MemAvailable {after / GIB:.2f} GiB after the run, {before / GIB:.2f} GiB when it began "
               f"({(after - before) / GIB:+.2f} GiB)")
    record_property("memory back", figures)
    holders = []
    if after < before - margin:
        holders = processes_started_within(target_host.run(PS_MEMORY).stdout, time.time() - run.began)
    check.that(after >= before - margin,
               expected=f"at least {(before - margin) / GIB:.2f} GiB available ({margin / GIB:.2f} GiB below the "
                        f"run's start at most), {SETTLE_S} s after the run's last server was removed",
               found=f"{figures}; " + ("started during the run and still running: " + "; ".join(holders[:5])
                                        if holders else "no process started during the run holds it"))
