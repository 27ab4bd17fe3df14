"""The serving configuration rules the container checks hold a live container to, as pure functions of the
configuration, so the same code holds each shipped recipe to them before it ships (the recipe must pass its
own checks).

Each rule takes what a configuration says (its serve args, env, restart policy; and what vLLM logged, when there
is a live server) and returns a Verdict: whether it applies, and if so expected / found.
"""

from __future__ import annotations

from dataclasses import dataclass

from .recipes import Profile, Recipe
from .serveargs import ServeArgs
from .units import GIB

EAGER_COST = ("--enforce-eager turns CUDA graphs off: on GB10 that measured 25 tok/s against 70 with graphs, ~2.8x "
              "slower single-stream (the guide); graphs need driver >= 590, which the profile requires")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    expected: str = ""
    found: str = ""
    not_applicable: str = ""  # why the rule does not apply to this configuration ("" when it does)

    @classmethod
    def skip(cls, why: str) -> Verdict:
        return cls(True, not_applicable=why)


def required_env(recipe: Recipe) -> dict[str, str]:
    """The recipe's env plus what its image and quantization need on this hardware (the guide's findings)."""
    env = dict(recipe.env)
    if recipe.image and "vllm-openai:nightly" in recipe.image:
        env.setdefault("CUTE_DSL_ARCH", "sm_121a")  # GB10's cutlass kernels; a generic image lacks it
    if recipe.model.quantization.lower().replace("_", "-").startswith("int4-autoround"):
        env.setdefault("VLLM_MARLIN_USE_ATOMIC_ADD", "1")  # the int4-AutoRound Marlin kernels
    return env


def env_rule(recipe: Recipe, env: dict[str, str]) -> Verdict:
    """CONT-ENV: every variable the recipe, its image and its quantization need, with its value."""
    want = required_env(recipe)
    if not want:  # every variable of none would pass any environment
        return Verdict.skip(f"{recipe.name} requires no environment variable (its env is empty, and neither its "
                            f"image {recipe.image or '(a process)'} nor its {recipe.model.quantization} quantization "
                            "needs one)")
    wrong = [f"{k} missing (want {k}={v})" if k not in env else f"{k}={env[k]} (want {k}={v})"
             for k, v in want.items() if env.get(k) != v]
    return Verdict(not wrong, " ".join(f"{k}={v}" for k, v in want.items()), "; ".join(wrong))


def restart_rule(policy: str) -> Verdict:
    """CONT-RESTART: unless-stopped (survives a reboot or an OOM kill, obeys a deliberate stop)."""
    why = {"always": "always: a deliberate stop is resurrected on the next daemon start",
           "no": "none: not restarted after a reboot or an OOM kill"}.get(policy, policy)
    return Verdict(policy == "unless-stopped", "unless-stopped", why)


def kv_pin_rule(profile: Profile, args: ServeArgs) -> Verdict:
    """CONT-KV-PIN: the KV cache is pinned (--gpu-memory-utilization is a grant, not a bound, on unified memory)."""
    gpu = profile.gpu is not None
    pin = args.kv_pin_bytes(cpu_engine=not gpu)
    util = args.value("--gpu-memory-utilization")
    return Verdict(pin is not None, "--kv-cache-memory=BYTES" + ("" if gpu else " or VLLM_CPU_KVCACHE_SPACE"),
                   f"{pin / GIB:g} GiB" if pin else
                   "no KV pin" + (f"; --gpu-memory-utilization {util} (not a bound)" if util else ""))


def cudagraph_rule(recipe: Recipe, args: ServeArgs, logged_mode: str | None = None,
                   captured: str = "") -> Verdict:
    """CONT-CUDAGRAPH: a Gated DeltaNet hybrid with MTP runs PIECEWISE graphs (the guide's garbage mitigation)."""
    mtp = args.mtp or (args.speculative is None and recipe.features.mtp)
    if not (recipe.model.gdn_hybrid and mtp):
        return Verdict.skip(f"{recipe.model.id} is not a Gated DeltaNet hybrid served with MTP "
                            f"(gdn_hybrid {recipe.model.gdn_hybrid}, MTP {mtp})")
    flag = args.cudagraph_mode
    ok = flag == "PIECEWISE" and logged_mode in (None, "PIECEWISE")
    found = f"serve args: {flag or 'not set (default FULL_AND_PIECEWISE)'}"
    if logged_mode is not None or captured:
        found += f"; engine log: {logged_mode or 'not seen'}; graphs captured: {captured or 'none seen'}"
    return Verdict(ok, "cudagraph_mode PIECEWISE (serve args and vLLM's engine config line)", found)


def context_rule(recipe: Recipe, args: ServeArgs) -> Verdict:
    """CONT-CONTEXT: --max-model-len within the native window, or a declared YaRN whose factor times the native
    window is exactly --max-model-len; and one sequence of that length fits the pinned KV cache."""
    native, length = recipe.model.native_context, args.max_model_len
    if length is None:
        return Verdict(True, f"<= {native:,}", "not set (the model's default)")
    rope = args.rope_scaling
    if length <= native and not rope:
        problem = ""
    elif rope is None:
        problem = f"--max-model-len {length:,} past the native {native:,} with no YaRN in --hf-overrides"
    elif not recipe.model.yarn:
        problem = f"--max-model-len {length:,} with rope scaling {rope}, but the recipe does not declare YaRN"
    elif round(float(rope.get("factor", 0)) * int(rope.get("original_max_position_embeddings", native))) != length:
        factor = rope.get("factor")
        problem = (f"YaRN factor {factor} x native {rope.get('original_max_position_embeddings', native):,} = "
                   f"{float(factor or 0) * int(rope.get('original_max_position_embeddings', native)):,.0f}, "
                   f"not --max-model-len {length:,}")
    else:
        problem = ""
    pin, per_token = args.kv_pin_bytes(), recipe.model.kv_bytes_per_token
    if not problem and pin and per_token and length * per_token > pin:
        problem = (f"one {length:,}-token sequence needs {length * per_token / GIB:.1f} GiB of KV cache "
                   f"({per_token:,} bytes per token) and the pin is {pin / GIB:g} GiB")
    want = f"<= {native:,} (native context of {recipe.model.id})" + (
        "" if recipe.model.yarn else ", or a declared YaRN with factor x native = --max-model-len")
    return Verdict(not problem, want, problem or f"--max-model-len {length:,}")


def eager_rule(profile: Profile, args: ServeArgs, logged_eager: bool | None = None,
               engine_device: str | None = None) -> Verdict:
    """CONT-EAGER: CUDA graphs on, where the profile's driver supports them (GB10 with driver >= 590)."""
    if profile.gpu is None:
        return Verdict.skip(f"profile {profile.name} has no GPU: there are no CUDA graphs to keep")
    if engine_device == "CPU":
        return Verdict.skip("the engine runs on the CPU (its log sizes a CPU KV cache): there are no CUDA graphs")
    eager = args.enforce_eager or bool(logged_eager)
    return Verdict(not eager, "CUDA graphs on (no --enforce-eager)",
                   "--enforce-eager" + (" (and the engine log says eager)" if logged_eager else "") if eager else
                   "graphs on")


def memory_margin_rule(recipe: Recipe) -> Verdict:
    """The recipe's memory budget covers what it was measured to hold, with the margin every budget carries."""
    m = recipe.memory
    if m.measured_resident_gib is None:
        return Verdict.skip(f"{recipe.name} states no measured resident memory")
    want = m.measured_resident_gib * (1 + MARGIN)
    return Verdict(m.budget_gib >= round(want, 1), f">= {want:.1f} GiB (measured {m.measured_resident_gib:g} GiB "
                   f"resident + {MARGIN:.0%})", f"budget {m.budget_gib:.1f} GiB")


MARGIN = 0.10  # every memory budget: measured resident + 10% (allocator growth, graph capture, request spikes)


def static_rules(recipe: Recipe, profile: Profile) -> dict[str, Verdict]:
    """Every rule a recipe's own configuration must pass, by the check ID that holds a live container to it."""
    args = recipe.args
    rules = {"CONT-ENV": env_rule(recipe, recipe.env), "CONT-CUDAGRAPH": cudagraph_rule(recipe, args),
             "CONT-CONTEXT": context_rule(recipe, args), "MEMORY-MARGIN": memory_margin_rule(recipe)}
    if recipe.launcher == "docker":  # a process has no restart policy, and the CPU engine no graphs to keep
        rules |= {"CONT-RESTART": restart_rule(recipe.restart), "CONT-KV-PIN": kv_pin_rule(profile, args),
                  "CONT-EAGER": eager_rule(profile, args)}
    return rules
