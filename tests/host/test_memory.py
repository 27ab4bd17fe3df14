"""Unified memory: the GPU and the OS share one pool, so free memory is read from /proc/meminfo."""

import pytest

from sparkgate.hostfacts import GIB


@pytest.mark.check(
    "HOST-MEM-FREE",
    why="vLLM sizes its KV cache from free memory; starting into too little livelocked a Spark (sshd "
        "unreachable, every container OOM-killed) in the guide",
    fix="stop other model servers (nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv), "
        "or pin a smaller KV cache with --kv-cache-memory in the recipe",
)
def test_available_memory_covers_every_selected_recipe(check, host_facts, selected_recipes, sparkgate_state):
    """MemAvailable MUST cover each selected recipe's memory budget plus the profile's OS reserve."""
    if not selected_recipes:
        check.cannot_run("no recipe selected for this host", "--recipe NAME")
    have = host_facts.mem_available_bytes / GIB
    short = []
    for r in selected_recipes:
        reserve = sparkgate_state.profiles[r.profile].os_reserve_gib
        if r.memory.budget_gib + reserve > have:
            short.append(f"{r.name} needs {r.memory.budget_gib:.1f} + {reserve:g} GiB reserve")
    check.that(not short, expected="each recipe's budget + OS reserve <= MemAvailable",
               found=f"MemAvailable {have:.1f} GiB; " + "; ".join(short))
