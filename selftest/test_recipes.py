"""Recipes and profiles load, and a malformed one is one clear error naming its file and field."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkgate.recipes import RECIPES_DIR, RecipeError, load_profiles, load_recipes


def test_every_shipped_recipe_and_profile_validates():
    recipes = load_recipes()
    assert set(recipes) == {"qwen38-27b-nvfp4", "qwen36-35b-a3b-nvfp4", "qwen3-coder-next-int4", "smollm2-cpu"}
    assert set(load_profiles()) == {"gb10", "cpu"}


def test_the_guides_flags_are_in_the_recipes():
    r = load_recipes()
    q38 = r["qwen38-27b-nvfp4"]
    assert q38.arg("--kv-cache-memory") == str(20 * 1024**3)
    assert q38.arg("--compilation-config") == '{"cudagraph_mode": "PIECEWISE"}'
    assert q38.env == {"CUTE_DSL_ARCH": "sm_121a"} and q38.image == "vllm/vllm-openai:nightly-aarch64"
    assert q38.restart == "unless-stopped" and q38.max_num_seqs == 4 and q38.max_model_len == 262144
    q36 = r["qwen36-35b-a3b-nvfp4"]
    assert q36.arg("--kv-cache-memory") == str(16 * 1024**3) and q36.arg("--kv-cache-dtype") == "fp8"
    assert '"num_speculative_tokens":3' in q36.arg("--speculative-config")
    coder = r["qwen3-coder-next-int4"]
    assert coder.env == {"VLLM_MARLIN_USE_ATOMIC_ADD": "1"} and coder.max_num_seqs == 16
    assert coder.arg("--enable-prefix-caching") == ""  # a bare switch
    assert coder.arg("--kv-cache-memory") is None


def test_the_digest_changes_with_what_the_recipe_starts():
    r = load_recipes()["smollm2-cpu"]
    changed = r.model_copy(update={"serve_args": [*r.serve_args, "--seed", "1"]})
    assert r.digest == load_recipes()["smollm2-cpu"].digest != changed.digest


@pytest.fixture
def recipes_dir(tmp_path):
    d = tmp_path / "recipes"
    d.mkdir()
    shutil.copy(RECIPES_DIR / "smollm2-cpu.yaml", d)
    return d


def edit(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["memory"].pop("kv_cache_gib"), "memory.kv_cache_gib"),
        (lambda d: d["model"].update(active_params_b="three"), "model.active_params_b"),
        (lambda d: d.update(launcher="podman"), "launcher"),
        (lambda d: d.update(restrat="always"), "restrat"),
        (lambda d: d.update(profile="h100"), "profile"),
        (lambda d: d.update(name="other"), "name"),
        (lambda d: d.update(port=9999), "port"),
    ],
    ids=["missing", "wrong-type", "bad-choice", "unknown-key", "unknown-profile", "name-vs-file", "port-vs-args"],
)
def test_a_malformed_recipe_names_its_file_and_field(recipes_dir, change, field):
    path = recipes_dir / "smollm2-cpu.yaml"
    edit(path, change)
    with pytest.raises(RecipeError) as err:
        load_recipes(recipes_dir)
    assert str(path) in str(err.value)
    assert f"`{field}`" in str(err.value) or (field == "port" and "`port`" in str(err.value))


def test_invalid_yaml_names_its_file(recipes_dir):
    path = recipes_dir / "smollm2-cpu.yaml"
    path.write_text("name: smollm2-cpu\nmodel: [unclosed\n")
    with pytest.raises(RecipeError, match=f"{path}: not valid YAML"):
        load_recipes(recipes_dir)


def test_two_processes_preparing_the_embedded_weights_at_once_both_get_it(tmp_path):
    """Each writes aside under a name of its own and renames; the one that finishes second keeps the first's."""
    env = {**os.environ, "SPARKGATE_CACHE": str(tmp_path)}
    runs = [subprocess.Popen([sys.executable, "-m", "sparkgate.embedded"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], [err[-2000:] for _, err in outs]
    folder = tmp_path / "models" / "smollm2"
    assert {out.strip() for out, _ in outs} == {str(folder)}
    assert (folder / "config.json").exists() and list(folder.glob("*.safetensors"))
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["smollm2"], "a partial folder was left"
