"""What the container runs with, read live: env, restart policy, serve args and the flags the guide requires."""

import pytest

from sparkgate.launch.container_spec import arg_drift, env_drift, required_env
from sparkgate.units import GIB


@pytest.mark.check(
    "CONT-ENV",
    why="some kernels need an environment variable on this hardware and fail or misbehave without it: "
        "CUTE_DSL_ARCH=sm_121a for GB10's cutlass kernels (the nightly image sets it; a generic one does not), "
        "VLLM_MARLIN_USE_ATOMIC_ADD=1 for the int4-AutoRound Marlin kernels",
    fix="recreate the container with the recipe's env (docker run -e NAME=VALUE ...; `docker update` cannot "
        "change env)",
)
def test_the_container_has_the_required_env(check, live, recipe):
    """The container's environment MUST hold every variable the recipe and its image need, with their values."""
    missing = env_drift(recipe, live.attrs)
    want = " ".join(f"{k}={v}" for k, v in required_env(recipe).items()) or "(none required)"
    check.that(not missing, expected=want, found="; ".join(missing))


@pytest.mark.check(
    "CONT-RESTART",
    why="with no policy the served model vanishes after a reboot or an OOM kill until someone notices; with "
        "`always` a deliberate stop does not stay stopped; unless-stopped survives both and obeys a stop",
    fix="docker update --restart=unless-stopped NAME (takes effect with no downtime)",
)
def test_the_restart_policy_is_unless_stopped(check, live):
    """The container's restart policy MUST be unless-stopped (not always, not none)."""
    policy = live.restart_policy
    why = {"always": "always: a deliberate stop is resurrected on the next daemon start",
           "no": "none: not restarted after a reboot or an OOM kill"}.get(policy, policy)
    check.that(policy == "unless-stopped", expected="unless-stopped", found=why)


@pytest.mark.check(
    "CONT-ARGS",
    why="the recipe is what was tested and measured; a container started by hand drifts from it (a flag "
        "dropped, a value changed) and every later number describes something else",
    fix="recreate the container from the recipe (docker rm -f NAME, then run the recipe's command), or update "
        "the recipe to what runs and test it again",
)
def test_the_running_args_are_the_recipes(check, live, recipe):
    """The container's serve arguments MUST equal the recipe's, flag for flag (each difference is listed)."""
    drift = arg_drift(recipe, live.attrs)
    check.that(not drift, expected=f"{recipe.model.id} {' '.join(recipe.serve_args)}",
               found="\n            ".join(drift))


@pytest.mark.check(
    "CONT-KV-PIN",
    why="--gpu-memory-utilization does not bound vLLM on unified memory: it sizes the KV cache from free "
        "memory, so 0.50 took ~101 GiB on a Spark; only --kv-cache-memory binds (the CPU engine: "
        "VLLM_CPU_KVCACHE_SPACE)",
    fix="add --kv-cache-memory=BYTES to the serve args, sized from max_num_seqs x max_model_len x bytes per "
        "token plus prefix-cache headroom (the guide: 20 GiB for Qwen3.8-27B, 16 GiB for Qwen3.6-35B-A3B)",
)
def test_the_kv_cache_is_pinned(check, live, recipe, sparkgate_state):
    """The running server MUST pin its KV cache size with --kv-cache-memory (utilization is not a bound)."""
    gpu = sparkgate_state.profiles[recipe.profile].gpu is not None
    args = live.args(recipe)
    pin = args.kv_pin_bytes(cpu_engine=not gpu)
    util = args.value("--gpu-memory-utilization")
    check.that(pin is not None, expected="--kv-cache-memory=BYTES" + ("" if gpu else " or VLLM_CPU_KVCACHE_SPACE"),
               found=f"{pin / GIB:g} GiB" if pin else
               "no KV pin" + (f"; --gpu-memory-utilization {util} (not a bound)" if util else ""))


@pytest.mark.check(
    "CONT-CUDAGRAPH",
    why="on a Gated DeltaNet hybrid with MTP speculative decoding, vLLM's default FULL_AND_PIECEWISE cudagraph "
        "mode produced garbage output on a warm engine in the guide; PIECEWISE is the mitigation that held",
    fix="""add --compilation-config '{"cudagraph_mode": "PIECEWISE"}' to the serve args""",
)
def test_a_gdn_hybrid_with_mtp_runs_piecewise_graphs(check, live, recipe):
    """A Gated DeltaNet hybrid with MTP speculative decoding MUST run with cudagraph_mode PIECEWISE."""
    args = live.args(recipe)
    mtp = args.mtp or (args.speculative is None and recipe.features.mtp)
    if not (recipe.model.gdn_hybrid and mtp):
        check.cannot_run(f"{recipe.model.id} is not a Gated DeltaNet hybrid served with MTP "
                         f"(gdn_hybrid {recipe.model.gdn_hybrid}, MTP {mtp})")
    flag = args.cudagraph_mode
    logged = live.facts.cudagraph_mode
    ok = flag == "PIECEWISE" and logged in (None, "PIECEWISE")
    check.that(ok, expected="cudagraph_mode PIECEWISE (serve args and vLLM's engine config line)",
               found=f"serve args: {flag or 'not set (default FULL_AND_PIECEWISE)'}; engine log: "
                     f"{logged or 'not seen'}; graphs captured: {', '.join(live.facts.graph_captures) or 'none seen'}")


@pytest.mark.check(
    "CONT-CONTEXT",
    why="past its native window a model without a declared context extension (YaRN) degrades silently, and "
        "the extra length buys KV demand the concurrency limit can never use (the guide's 1M context)",
    fix="set --max-model-len to at most the model's native context, or declare YaRN in the recipe "
        "(model.yarn, with the rope scaling in --hf-overrides)",
)
def test_the_context_is_within_the_native_window(check, live, recipe):
    """--max-model-len MUST be within the model's native context unless the recipe declares YaRN."""
    args = live.args(recipe)
    value = args.max_model_len
    yarn = recipe.model.yarn or "yarn" in " ".join(args.argv).lower()
    native = recipe.model.native_context
    check.that(value is None or value <= native or yarn,
               expected=f"<= {native:,} (native context of {recipe.model.id})" + (", or YaRN" if not yarn else ""),
               found=f"--max-model-len {value:,}" if value else "not set (the model's default)")
