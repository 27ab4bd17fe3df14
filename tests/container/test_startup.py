"""What the server said about itself while it started (its log), and what it holds now (its cgroup)."""

import pytest

from sparkgate import vllmlog
from sparkgate.hostfacts import compute_apps, gpu_mib_of_container
from sparkgate.units import GIB, MIB


@pytest.mark.check(
    "CONT-LOG-FACTS",
    why="the vLLM version, the KV cache vLLM actually sized (GiB and tokens, hence bytes per token) and the "
        "concurrency it allows are what make two boxes' results comparable, and what the memory budget is "
        "checked against; a log that does not state them hides a failed or unfinished start",
    fix="read the container's log (docker logs NAME): a start that stopped before sizing the KV cache shows why",
)
def test_the_startup_log_states_the_servers_facts(check, live, record_property):
    """The server's startup log MUST state its vLLM version and the KV cache it sized (GiB and tokens)."""
    f = live.facts
    summary = f.summary()
    live.server.facts.update({f"startup_{k}": v for k, v in summary.items()})
    for key in ("version", "kv_cache_gib", "kv_tokens", "kv_bytes_per_token", "max_concurrency", "graph_mode",
                "attention_backend", "attention_refused", "kv_unit_scale", "fp8_attention_unit_scales", "unknown_env"):
        if key in summary:
            record_property(key, summary[key])
    missing = [k for k in ("version", "kv_cache_gib", "kv_tokens") if getattr(f, k) is None]
    check.that(not missing, expected="version, KV cache GiB and tokens in the log",
               found=(f"missing {', '.join(missing)}; " if missing else "")
               + ", ".join(f"{k} {v}" for k, v in summary.items()))


@pytest.mark.check(
    "CONT-STARTUP-TIME",
    why="every restart of the box's server is downtime as long as its start; a start that takes far longer than the "
        "recipe's (a compile cache lost, a graph capture or a profiling pass grown by an image or flag change, a "
        "compile that hung for 44 minutes in an owner's report) is found here, at the gate, not at 3 a.m. when the "
        "box restarts",
    fix="read the longest wait named here in the container's log (docker logs -t NAME): torch.compile reuses its "
        "cache (~/.cache/vllm in the container, VLLM_CACHE_ROOT) only where that folder is mounted from the host and "
        "the image and flags are unchanged, while CUDA graphs are captured at every start; a vision model's profiling "
        "pass is skipped with --skip-mm-profiling (the guide); if the new time is the price of the change, measure "
        "three starts and set the recipe's startup.budget_s from them",
)
def test_the_last_start_served_within_the_recipes_startup_budget(check, live, recipe, docker_engine, earlier_start,
                                                                   record_property):
    """The container's last start MUST have served (its first streamed token, where this run timed it) within the
    recipe's startup budget, or, where the recipe states none, within twice the start an earlier run measured here."""
    import docker.errors

    state = live.attrs.get("State") or {}
    started = vllmlog.stamp(str(state.get("StartedAt", "")))
    if started is None:
        check.cannot_run(f"docker states no start time for {live.name}")
    try:
        log = docker_engine.client.containers.get(live.name).logs(timestamps=True, since=started)
    except docker.errors.DockerException as exc:
        check.cannot_run(f"the log of {live.name} could not be read with its times: {str(exc)[:300]}")
    times = vllmlog.startup_times(log.decode(errors="replace"), started)
    token = live.server.facts.get("first_answer_s")
    if live.server.started and token and not live.attrs.get("RestartCount"):  # this run's start, timed by it
        times.first_token_s = float(token)
    record_property("startup", str(times))
    if times.serving_s is None:
        check.cannot_run(f"the log of its last start ({started:%Y-%m-%d %H:%M:%S} UTC) says no server started "
                         "serving: CONT-LOG-FACTS reads what it did say")
    if recipe.startup is not None:
        budget, basis = recipe.startup.budget_s, f"the recipe's startup.budget_s: {recipe.startup.measured}"
    elif earlier_start is not None:
        budget = 2 * earlier_start  # a lost compile cache, a profiling pass grown: the slower starts this catches
        basis = (f"the recipe states no startup.budget_s: twice the {earlier_start:.0f} s an earlier run took to bring "
                 "it to serving here")
    else:
        check.cannot_run(f"recipe {recipe.name} states no startup budget and no earlier run timed its start here "
                         f"(its last start: {times})", "startup.budget_s in the recipe, from three starts measured on "
                         "the box; or a run that starts it (--take-over), which the next run is held to")
    what = "its first streamed token" if times.first_token_s is not None else "serving"
    check.that(times.reached_s <= budget,
               expected=f"{what} within {budget:g} s of the container's start ({basis})",
               found=f"{times}; the longest wait: {times.longest}")


@pytest.mark.check(
    "CONT-RESTART-COUNT",
    why="docker restarts a container whose server exited (its restart policy), and it comes back looking healthy: a "
        "server that crashed or was OOM-killed is the defect, not the restart; on unified memory a restart loop after "
        "an OOM left memory trapped on each restart until a reboot, and figures measured across a restart are of two "
        "servers",
    fix="read why it died: the container's log before its last start (docker logs NAME) and the kernel's OOM killer "
        "lines (dmesg); fix the cause (the recipe's memory.*, a smaller --kv-cache-memory), then recreate the "
        "container (docker rm -f NAME, start the recipe again) so that its count starts from zero",
)
def test_the_container_has_not_restarted_since_it_was_created(check, live):
    """The container MUST NOT have been restarted by docker since it was created, nor been OOM-killed."""
    state = live.attrs.get("State") or {}
    count, oom = live.attrs.get("RestartCount") or 0, bool(state.get("OOMKilled"))
    times = f"{count} time" + "s" * (count != 1)
    check.that(count == 0 and not oom, expected="restarted 0 times since it was created, never OOM-killed",
               found=f"restarted {times} by its restart policy ({live.restart_policy}) since it was created at "
                     f"{str(live.attrs.get('Created', '?'))[:19]}; its server last died at "
                     f"{str(state.get('FinishedAt', '?'))[:19]}" + (", killed by the OOM killer" if oom else "")
                     + f"; its log holds {live.facts.starts} starts")


# Variables vLLM once read and now ignores, and what took their place: an image upgrade turns them into no-ops.
_REPLACED = {
    "VLLM_ATTENTION_BACKEND": "the serve arg --attention-backend (the guide's: triton_attn)",
    "VLLM_USE_V1": "nothing: the V1 engine is the only one; remove it",
}


@pytest.mark.check(
    "CONT-ENV-KNOWN",
    why="vLLM ignores a VLLM_ variable it does not know, with one warning in its log: the setting the recipe relies "
        "on (an attention backend, a kernel switch, a KV cache pin) is silently not made, and every figure is of a "
        "server configured otherwise; a variable renamed or removed by a vLLM upgrade does this on a box that "
        "served well the day before",
    fix="correct the variable to one this vLLM reads (in the image: python3 -c \"import vllm.envs as e; "
        "print(*sorted(e.environment_variables), sep=chr(10))\"), or set what replaced it, and recreate the container",
)
def test_every_vllm_variable_is_one_vllm_reads(check, live, recipe):
    """vLLM MUST NOT log that a VLLM_ variable of the server is unknown to it (a setting silently not made)."""
    f = live.facts
    if f.version is None:
        check.cannot_run("the container's log does not state the server's start (see CONT-LOG-FACTS)")
    check.that(not f.unknown_env, expected="no \"Unknown vLLM environment variable\" in the log of the last start",
               found="vLLM " + (f.version or "") + " ignores " + "; ".join(
                   f"{var} ({'the recipe sets it' if var in recipe.env else 'not the recipe: the image or the box'}"
                   + (f"; replaced by {_REPLACED[var]}" if var in _REPLACED else "") + ")"
                   for var in f.unknown_env))


@pytest.mark.check(
    "CONT-ATTN-BACKEND",
    why="the attention backend is part of what the recipe was tuned and measured on; on GB10 (sm_121) it is often "
        "not a choice: the guide's Qwen3.8 recipe needs triton_attn because FlashAttention-2 cannot serve its FP8 KV "
        "cache; a backend asked for and not run (refused by the platform, or dropped by an upgrade) serves with "
        "other kernels, whose speed, memory and answers are not the recipe's",
    fix="read the backend lines of the container's log (docker logs NAME 2>&1 | grep -i backend) and name in "
        "--attention-backend a backend this platform and vLLM build run (vLLM's GPU platform refuses at start one "
        "it cannot run; the CPU engine runs CPU_ATTN alone), or take the flag out and let the engine choose",
)
def test_the_engine_runs_the_attention_backend_the_recipe_asks_for(check, live, recipe):
    """The attention backend the engine runs MUST be the one the recipe's --attention-backend asks for."""
    asked, why_not = recipe.args.attention_backend
    if asked is None:
        check.cannot_run(f"recipe {recipe.name} holds the engine to no one attention backend ({why_not})",
                         "name the backend the recipe needs with --attention-backend in its serve_args")
    f = live.facts
    if f.version is None:
        check.cannot_run("the container's log does not state the server's start (see CONT-LOG-FACTS)")
    if not f.attention_backends:
        check.cannot_run(f"the log of the last start names no attention backend (vLLM {f.version})")
    runs = ", ".join(f.attention_backends)
    found = runs
    if f.attention_refused:
        found = (f"{runs}: the engine would not run {f.attention_refused} (\"Cannot use "
                 f"AttentionBackendEnum.{f.attention_refused} backend on CPU.\" in its log) and runs {runs} instead")
    check.that(f.attention_backends == [asked] and not f.attention_refused,
               expected=f"{asked} (asked for by the recipe's serve args), and no other", found=found)


@pytest.mark.check(
    "CONT-KV-BYTES",
    why="the recipe's KV bytes per token turns a context and a concurrency into memory (CONT-CONTEXT, the memory "
        "budget); the guide: derive it by dividing the logged GiB by the logged token count, never from the layer "
        "count, and a figure for another dtype, model or engine build sizes every one of those wrongly",
    fix="set model.kv_bytes_per_token in the recipe to the figure logged here (`sparkgate recipes show` the recipe "
        "after a run), or find why the engine sizes the cache differently (--kv-cache-dtype, the model revision, "
        "the image)",
)
def test_the_kv_bytes_per_token_logged_are_the_recipes(check, live, recipe):
    """The KV cache bytes per token vLLM logged MUST be the recipe's kv_bytes_per_token (within 2%)."""
    declared, logged = recipe.model.kv_bytes_per_token, live.facts.bytes_per_token
    if declared is None:
        check.cannot_run(f"recipe {recipe.name} declares no model.kv_bytes_per_token to compare with",
                         "set model.kv_bytes_per_token from a run's CONT-LOG-FACTS")
    if logged is None:
        check.cannot_run("the container's log does not state the KV cache size and tokens (see CONT-LOG-FACTS)")
    # vLLM logs the cache in GiB to two places: that rounding, or 2%, whichever is wider.
    tolerance = max(0.02, 0.006 / live.facts.kv_cache_gib)
    check.that(abs(logged - declared) <= tolerance * declared,
               expected=f"{declared:,} bytes per token (model.kv_bytes_per_token), within {tolerance:.0%}",
               found=f"{logged:,.0f} bytes per token logged ({live.facts.kv_cache_gib:g} GiB for "
                     f"{live.facts.kv_tokens:,} tokens), {logged / declared:.2f}x the recipe's")


@pytest.mark.check(
    "CONT-KV-SIZE",
    why="the KV cache is the recipe's memory budget's largest free term; a cache other than the pinned size "
        "(a pin ignored, a different engine build) changes both what fits and what the speed numbers mean",
    fix="pin the KV cache with --kv-cache-memory (CPU: VLLM_CPU_KVCACHE_SPACE) at the recipe's kv_cache_gib, "
        "or correct memory.kv_cache_gib in the recipe to what the box needs",
)
def test_the_kv_cache_in_use_is_the_pinned_size(check, live, recipe, recipe_profile):
    """The KV cache vLLM sized MUST be the pinned size (unpinned: at most the recipe's KV budget)."""
    f = live.facts
    if f.kv_cache_gib is None:
        check.cannot_run("the container's log does not state the KV cache size (see CONT-LOG-FACTS)")
    gpu = recipe_profile.gpu is not None
    args = live.args(recipe)
    pin = args.kv_pin_bytes(cpu_engine=not gpu)
    found = (f"{f.kv_cache_gib:g} GiB ({f.kv_cache_basis}), {f.kv_tokens or '?'} tokens"
             + (f", {f.bytes_per_token:.0f} bytes per token" if f.bytes_per_token else ""))
    if pin is not None:
        want = pin / GIB
        ok = abs(f.kv_cache_gib - want) <= max(0.02 * want, 0.01)  # vLLM prints GiB rounded to 2 places
        space = args.env.get("VLLM_CPU_KVCACHE_SPACE", "")
        # The CPU engine sets its KV size from this variable over --kv-cache-memory-bytes (vLLM's CPU platform).
        overridden = not gpu and space.isdigit() and args.kv_pin_bytes(cpu_engine=False) not in (None,
                                                                                                 int(space) * GIB)
        check.that(ok and f.kv_cache_basis == "pinned", expected=f"{want:g} GiB, pinned", found=found,
                   why=f"VLLM_CPU_KVCACHE_SPACE={space} is set as well, and vLLM's CPU engine takes it over "
                       f"--kv-cache-memory-bytes: the flag's pin is ignored" if overridden else None,
                   fix="pin the KV cache once: drop VLLM_CPU_KVCACHE_SPACE from the env, or the flag from the serve "
                       "args, and recreate the container" if overridden else None)
    else:
        budget = recipe.memory.kv_cache_gib
        check.that(f.kv_cache_gib <= budget * 1.02, expected=f"<= {budget:g} GiB (the recipe's KV budget; "
                   "nothing pins it)", found=found)


@pytest.mark.check(
    "CONT-RESIDENT",
    why="the recipe's memory budget (weights + KV + overhead) is what the pre-flight arithmetic let start; "
        "a server resident above it eats the OS reserve, and on unified memory that livelocked a Spark; what CUDA "
        "allocates there is counted by the driver per process and may not be charged to the container's cgroup, "
        "so both sides are read and the larger judged",
    fix="measure what the server holds (docker stats NAME; nvidia-smi --query-compute-apps=pid,used_memory "
        "--format=csv) and correct memory.* in the recipe, or pin a smaller KV cache",
)
def test_resident_memory_stays_inside_the_budget(check, live, recipe, target_host, host_facts):
    """The container's resident memory, the larger of its cgroup's and the GPU memory the driver counts for its
    processes, MUST stay inside the recipe's memory budget."""
    cgroup = live.memory_bytes
    apps = compute_apps(target_host) if host_facts.gpus else None
    container_id = str(live.attrs.get("Id", ""))
    gpu = None if apps is None else gpu_mib_of_container(target_host, apps, container_id) * MIB
    if cgroup is None and not gpu:  # nvidia-smi listing none of its processes is no figure of it
        check.cannot_run("neither docker stats nor nvidia-smi give a memory figure for the container")
    sides = [f"{cgroup / GIB:.2f} GiB in its cgroup (usage less inactive page cache)" if cgroup is not None
             else "its cgroup: no figures (docker stats)",
             f"{gpu / GIB:.2f} GiB on the GPU (nvidia-smi, its processes)" if gpu is not None
             else "on the GPU: not read (no NVIDIA GPU answers)" if not host_facts.gpus
             else "on the GPU: not read (nvidia-smi --query-compute-apps failed)"]
    used = max(cgroup or 0, gpu or 0)
    budget = recipe.memory.budget_gib
    check.that(used / GIB <= budget, expected=f"<= {budget:.2f} GiB (weights {recipe.memory.weights_gib:g} + KV "
               f"{recipe.memory.kv_cache_gib:g} + overhead {recipe.memory.overhead_gib:g})",
               found=f"{used / GIB:.2f} GiB resident, the larger of " + " and ".join(sides))
