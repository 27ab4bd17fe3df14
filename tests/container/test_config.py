"""What the container runs with, read live: env, restart policy, serve args and the flags the guide requires."""

import pytest

from sparkgate import rules
from sparkgate.launch.container_spec import arg_drift


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
    check.holds(rules.env_rule(recipe, live.env))


@pytest.mark.check(
    "CONT-RESTART",
    why="with no policy the served model vanishes after a reboot or an OOM kill until someone notices; with "
        "`always` a deliberate stop does not stay stopped; unless-stopped survives both and obeys a stop",
    fix="docker update --restart=unless-stopped NAME (takes effect with no downtime)",
)
def test_the_restart_policy_is_unless_stopped(check, live):
    """The container's restart policy MUST be unless-stopped (not always, not none)."""
    check.holds(rules.restart_rule(live.restart_policy))


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
def test_the_kv_cache_is_pinned(check, live, recipe, recipe_profile):
    """The running server MUST pin its KV cache size with --kv-cache-memory (utilization is not a bound)."""
    check.holds(rules.kv_pin_rule(recipe_profile, live.args(recipe)))


@pytest.mark.check(
    "CONT-CUDAGRAPH",
    why="on a Gated DeltaNet hybrid with MTP speculative decoding, vLLM's default FULL_AND_PIECEWISE cudagraph "
        "mode produced garbage output on a warm engine in the guide; PIECEWISE is the mitigation that held",
    fix="""add --compilation-config '{"cudagraph_mode": "PIECEWISE"}' to the serve args""",
)
def test_a_gdn_hybrid_with_mtp_runs_piecewise_graphs(check, live, recipe):
    """A Gated DeltaNet hybrid with MTP speculative decoding MUST run with cudagraph_mode PIECEWISE."""
    check.holds(rules.cudagraph_rule(recipe, live.args(recipe), live.facts.cudagraph_mode,
                                     ", ".join(live.facts.graph_captures)))


@pytest.mark.check(
    "CONT-CONTEXT",
    why="past its native window a model without a declared context extension (YaRN) degrades silently; a YaRN "
        "factor that does not match --max-model-len stretches positions wrongly; and a window the KV pin cannot "
        "hold one sequence of buys KV demand the concurrency limit can never use (the guide's 1M static YaRN, "
        "which reserved ~80 GB of KV for 1-4% occupancy and livelocked the box)",
    fix="set --max-model-len to at most the model's native context (the guide went back to the native 262,144), "
        "or declare YaRN in the recipe (model.yarn) with --hf-overrides rope_scaling factor x native = "
        "--max-model-len, and a --kv-cache-memory that holds a sequence that long",
)
def test_the_context_is_the_native_window_or_a_consistent_yarn(check, live, recipe):
    """--max-model-len MUST be within the native context, or a declared YaRN whose factor x native equals it and
    whose one full sequence fits the KV pin."""
    check.holds(rules.context_rule(recipe, live.args(recipe)))


@pytest.mark.check(
    "CONT-EAGER",
    why=rules.EAGER_COST,
    fix="remove --enforce-eager from the serve args; if CUDA graph capture crashes (`an illegal instruction` in "
        "_capture_cudagraphs), the driver is older than 590: upgrade it (HOST-DRIVER-MIN) rather than run eager",
)
def test_cuda_graphs_are_on_where_the_driver_supports_them(check, live, recipe, recipe_profile):
    """On a profile whose driver supports CUDA graphs, the server MUST NOT run with --enforce-eager."""
    check.holds(rules.eager_rule(recipe_profile, live.args(recipe),
                                 live.facts.enforce_eager, live.facts.device))
