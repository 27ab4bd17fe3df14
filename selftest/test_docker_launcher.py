"""What the docker launcher and the container checks make of a recipe and of a container's inspect data, on the
shipped GB10 recipes (no engine needed; test_container_layer.py runs them against a real one)."""

import argparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selftest.helpers import two_node
from sparkgate.launch.container_spec import (
    arg_drift,
    config_drift,
    env_drift,
    live_serve_args,
    required_env,
    run_kwargs,
)
from sparkgate.launch.lifecycle import gguf_of_gdn_hybrid
from sparkgate.recipes import LINK_ENV, Recipe, load_recipes
from sparkgate.serveargs import ServeArgs
from sparkgate.units import GIB, parse_flag_bytes

RECIPES = load_recipes()
QWEN38, CODER = RECIPES["qwen38-27b-nvfp4"], RECIPES["qwen3-coder-next-int4"]


def inspect_of(recipe, **change):
    """docker inspect of the container the launcher would start for `recipe`, with `change` applied."""
    kw = run_kwargs(recipe)
    attrs = {"Config": {"Image": kw["image"], "Entrypoint": kw.get("entrypoint") or ["vllm", "serve"],
                        "Cmd": kw["command"], "Env": [f"{k}={v}" for k, v in kw["environment"].items()]},
             "HostConfig": {"RestartPolicy": kw["restart_policy"], "NetworkMode": kw["network_mode"]}}
    for key, value in change.items():
        section, field = key.split("__")
        attrs[section][field] = value
    return attrs


def test_the_launcher_runs_exactly_the_recipe():
    kw = run_kwargs(QWEN38)
    assert kw["image"] == "vllm/vllm-openai:nightly-aarch64" and kw["name"] == "qwen3.8-27b-nvfp4"
    assert kw["command"][:3] == ["unsloth/Qwen3.8-27B-NVFP4", "--served-model-name", "qwen38-27b-unsloth-nvfp4"]
    assert kw["restart_policy"] == {"Name": "unless-stopped"} and kw["init"] is True
    assert kw["device_requests"][0]["Count"] == -1 and kw["ipc_mode"] == "host" and kw["network_mode"] == "host"
    assert config_drift(QWEN38, inspect_of(QWEN38)) == []


def test_required_env_follows_the_image_and_the_quantization():
    assert required_env(QWEN38)["CUTE_DSL_ARCH"] == "sm_121a"
    assert required_env(CODER)["VLLM_MARLIN_USE_ATOMIC_ADD"] == "1"
    no_env = inspect_of(CODER, Config__Env=["PATH=/usr/bin"])
    assert env_drift(CODER, no_env) == ["VLLM_MARLIN_USE_ATOMIC_ADD missing (want VLLM_MARLIN_USE_ATOMIC_ADD=1)"]


def test_arg_drift_lists_each_difference_and_ignores_json_spacing():
    cmd = run_kwargs(QWEN38)["command"]
    cmd = [a.replace('{"cudagraph_mode": "PIECEWISE"}', '{"cudagraph_mode":"PIECEWISE"}') for a in cmd]
    assert arg_drift(QWEN38, inspect_of(QWEN38, Config__Cmd=cmd)) == []
    drifted = [a for a in cmd if not a.startswith("--kv-cache-memory")]
    drifted[drifted.index("--max-num-seqs") + 1] = "8"
    drifted += ["--enforce-eager"]
    assert arg_drift(QWEN38, inspect_of(QWEN38, Config__Cmd=drifted)) == [
        "--max-num-seqs: recipe '4', running '8'",
        "--kv-cache-memory: recipe '21474836480', not in the running command",
        "--enforce-eager: not in the recipe, running with ''",
    ]


def test_a_shell_wrapped_command_is_read_as_the_shell_would():
    line = "vllm serve Intel/Qwen3-Coder-Next-int4-AutoRound " + " ".join(CODER.serve_args)
    attrs = inspect_of(CODER, Config__Entrypoint=None, Config__Cmd=["bash", "-c", line])
    assert live_serve_args(CODER, attrs) == CODER.serve_args


@pytest.mark.parametrize("args, env, pinned", [
    (["--kv-cache-memory=21474836480"], {}, 20 * GIB),
    (["--kv-cache-memory", "16G"], {}, 16 * GIB),  # upper case is binary to vLLM: 16 GiB, not 16e9 bytes
    (["--kv-cache-memory-bytes", "8g"], {}, 8 * 10**9),  # lower case is decimal
    (["--gpu-memory-utilization", "0.5"], {}, None),
    ([], {"VLLM_CPU_KVCACHE_SPACE": "1"}, GIB),
])
def test_the_kv_pin(args, env, pinned):
    assert ServeArgs(args, env).kv_pin_bytes() == pinned


SIZES = st.one_of(st.from_regex(r"\A[0-9]{1,6}(\.[0-9]{1,3})?[kmgtKMGTiB]{0,2}\Z"), st.text(max_size=8))


@settings(max_examples=300, deadline=None)
@given(SIZES)
def test_a_pin_is_read_as_vllm_reads_it(text):
    """vLLM's own parser is the oracle: the same bytes for what it takes, a ValueError for what it refuses."""
    from vllm.utils.argparse_utils import human_readable_int

    try:
        want = human_readable_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        with pytest.raises(ValueError):
            parse_flag_bytes(text)
        return
    assert parse_flag_bytes(text) == want


def test_a_gguf_of_a_gdn_hybrid_is_refused_and_native_checkpoints_are_not():
    gguf = CODER.model_copy(update={"model": CODER.model.model_copy(update={"format": "gguf"})})
    assert "about 160 GB" in gguf_of_gdn_hybrid(gguf)
    assert gguf_of_gdn_hybrid(CODER) is None


@pytest.mark.parametrize("args, asked", [
    (["--attention-backend", "triton_attn"], ("TRITON_ATTN", "")),
    (["--attention-backend=FLASHINFER"], ("FLASHINFER", "")),
    (["--attention-config", '{"backend": "triton_attn"}'], ("TRITON_ATTN", "")),
    (["--attention-config", '{"backend_per_kind": {"full": "FLASHINFER"}}'],
     (None, "--attention-config names a backend per kind of layer")),
    (["--attention-backend", "auto"], (None, "its attention backend auto is taken as auto")),
    (["--attention-backend", "TRITON_MSA"], (None, "its attention backend TRITON_MSA is taken as auto")),
    (["--max-num-seqs", "4"], (None, "the engine chooses")),
])
def test_the_attention_backend_a_recipe_asks_for_is_read_as_vllm_reads_it(args, asked):
    assert ServeArgs(["m", *args]).attention_backend == asked


def _two_node_qwen38():
    data = QWEN38.model_dump(mode="json", exclude={"source_file"})
    two_node(data)
    return Recipe.model_validate(data)


def test_a_two_node_recipes_head_serves_after_rays_head_and_its_worker_joins_it_both_pinned_to_the_link():
    recipe = _two_node_qwen38()
    head, worker = run_kwargs(recipe), run_kwargs(recipe, role="worker")
    assert head["entrypoint"][:2] == ["bash", "-c"] and "ray start --head --port=6379 --node-ip-address=" \
        "192.168.100.10; exec \"$@\"" in head["entrypoint"][2]
    assert head["entrypoint"][3:] == ["sparkgate-head", "vllm", "serve"] and head["command"][0] == QWEN38.model.id
    assert worker["command"] == ["ray", "start", "--block", "--address=192.168.100.10:6379",
                                 "--node-ip-address=192.168.100.11"]
    assert (head["name"], worker["name"]) == ("qwen3.8-27b-nvfp4", "qwen3.8-27b-nvfp4-worker")
    for kw, address in ((head, "192.168.100.10"), (worker, "192.168.100.11")):
        assert kw["environment"]["VLLM_HOST_IP"] == address
        assert {kw["environment"][k] for k in LINK_ENV} == {"enp1s0f1np1"}
        assert kw["environment"]["CUTE_DSL_ARCH"] == "sm_121a"  # the recipe's own env, on both nodes
    # The container checks read the head's serve args through the Ray wrapper, as they read a one-box container's.
    assert config_drift(recipe, inspect_of(recipe)) == []
    one_box = inspect_of(recipe, Config__Entrypoint=["vllm", "serve"])
    assert config_drift(recipe, one_box) == [f"entrypoint ['vllm', 'serve'] (recipe {head['entrypoint']})"]
