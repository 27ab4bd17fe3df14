"""Recipes and profiles load, and a malformed one is one clear error naming its file and field."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from selftest.helpers import beside_its_one_box_twin, broken_recipe, two_node
from sparkgate.recipes import (
    RECIPES_DIR,
    Floor,
    RecipeError,
    load_profiles,
    load_recipes,
    one_node_twin,
    override_images,
)
from sparkgate.rules import static_rules


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
    assert coder.arg("--kv-cache-memory") == str(24 * 1024**3)  # the flag that binds, on every GB10 recipe
    assert coder.mods == ["~/spark-vllm-docker/mods/fix-qwen3-next-autoround"] and coder.hf_cache


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
        (lambda d: d["serve_args"].extend(["--kv-cache-memory", "16GiB"]), "serve_args"),
    ],
    ids=["missing", "wrong-type", "bad-choice", "unknown-key", "unknown-profile", "name-vs-file", "port-vs-args",
         "a-pin-vllm-refuses"],
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


# ---- every shipped recipe passes its own checks (the rules the container checks hold a live container to) --------

SHIPPED = load_recipes()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_recipe_passes_its_own_static_rules(name):
    recipe = SHIPPED[name]
    verdicts = static_rules(recipe, load_profiles()[recipe.profile])
    failed = {rule: f"expected {v.expected}, found {v.found}" for rule, v in verdicts.items() if not v.ok}
    assert failed == {}, f"{name} would fail its own checks: {failed}"


def _with_args(recipe, drop=(), add=()):
    """The recipe with the flags `drop` (and their values) taken out of its serve args and `add` appended."""
    args, value_of_dropped = [], False
    for a in recipe.serve_args:
        if value_of_dropped:
            value_of_dropped = False
        elif a in drop:
            value_of_dropped = True
        elif not any(a.startswith(d + "=") for d in drop):
            args.append(a)
    return recipe.model_copy(update={"serve_args": [*args, *add]})


Q36, Q38, CODER = SHIPPED["qwen36-35b-a3b-nvfp4"], SHIPPED["qwen38-27b-nvfp4"], SHIPPED["qwen3-coder-next-int4"]
BROKEN = {
    # the shipped qwen36 before this rule existed: a GDN hybrid with MTP on the default graphs
    "gdn-hybrid-with-mtp-default-graphs": (_with_args(Q36, drop=["--compilation-config"]), "CONT-CUDAGRAPH"),
    # the shipped Coder-Next before: no --kv-cache-memory, KV sized by the utilization grant
    "no-kv-pin": (_with_args(CODER, drop=["--kv-cache-memory"]), "CONT-KV-PIN"),
    # the shipped qwen38 before: a budget equal to the measured resident, no margin
    "budget-without-margin": (Q38.model_copy(update={"memory": Q38.memory.model_copy(update={"overhead_gib": 0})}),
                              "MEMORY-MARGIN"),
    "eager-on-gb10": (_with_args(Q38, add=["--enforce-eager"]), "CONT-EAGER"),
    "restart-always": (Q38.model_copy(update={"restart": "always"}), "CONT-RESTART"),
    "marlin-env-missing": (CODER.model_copy(update={"env": {}}), "CONT-ENV"),
    # the guide's livelock: 1M context by static YaRN (factor 4 of 262,144 is 1,048,576, not 1,000,000), and
    # past the native window without a declared YaRN
    "yarn-factor-off": (_with_args(Q38.model_copy(update={"model": Q38.model.model_copy(update={"yarn": True})}),
                                   drop=["--max-model-len"], add=[
                                       "--max-model-len", "1000000", "--hf-overrides",
                                       '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, '
                                       '"original_max_position_embeddings": 262144}}']), "CONT-CONTEXT"),
    "past-native-without-yarn": (_with_args(Q38, drop=["--max-model-len"], add=["--max-model-len", "524288"]),
                                 "CONT-CONTEXT"),
    "yarn-window-the-pin-cannot-hold": (
        _with_args(Q38.model_copy(update={"model": Q38.model.model_copy(update={"yarn": True})}),
                   drop=["--max-model-len"], add=[
                       "--max-model-len", "1048576", "--hf-overrides",
                       '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, '
                       '"original_max_position_embeddings": 262144}}']), "CONT-CONTEXT"),
}


@pytest.mark.parametrize("variant", BROKEN)
def test_a_recipe_that_breaks_a_rule_fails_exactly_that_rule(variant):
    recipe, rule = BROKEN[variant]
    verdicts = static_rules(recipe, load_profiles()[recipe.profile])
    assert sorted(r for r, v in verdicts.items() if not v.ok) == [rule], {r: v for r, v in verdicts.items()
                                                                          if not v.ok}


def test_the_floors_table_in_the_docs_is_the_generated_one():
    generated = subprocess.run([sys.executable, "-m", "sparkgate.cli", "recipes", "floors"], capture_output=True,
                               text=True, check=True).stdout
    assert (Path(__file__).resolve().parent.parent / "docs" / "FLOORS.md").read_text() == generated, \
        "docs/FLOORS.md is stale: sparkgate recipes floors > docs/FLOORS.md"


def test_image_replaces_only_the_recipes_it_names_by_name_or_by_the_image_they_use():
    """The upgrade candidate on a mixed set (the community GB10 image and upstream's nightly): --image MUST replace
    exactly what it names, and refuse a bare image it would have to guess for."""
    recipes = load_recipes(profiles=load_profiles())
    community = {"qwen36-35b-a3b-nvfp4", "qwen3-coder-next-int4"}
    assert override_images(recipes, ["vllm-node=cand:1"]) == dict.fromkeys(community, "cand:1")
    assert override_images(recipes, ["qwen38-27b-nvfp4=cand:2"]) == {"qwen38-27b-nvfp4": "cand:2"}
    both = override_images(recipes, ["vllm-node=cand:1", "qwen38-27b-nvfp4=cand:2"])
    assert both == {**dict.fromkeys(community, "cand:1"), "qwen38-27b-nvfp4": "cand:2"}
    assert override_images(recipes, ["cand:3"], ["qwen38-27b-nvfp4"]) == {"qwen38-27b-nvfp4": "cand:3"}
    for specs, chosen, words in [
        (["cand:3"], None, "the docker recipes in play use 2 images"),
        (["nope=cand:3"], None, "nope is neither a recipe nor an image a selected docker recipe uses"),
        (["qwen38-27b-nvfp4=cand:2"], ["qwen36-35b-a3b-nvfp4"], "qwen38-27b-nvfp4 is not selected"),
        (["vllm-node=a:1", "qwen36-35b-a3b-nvfp4=b:2"], None, "qwen36-35b-a3b-nvfp4 is already given a:1"),
    ]:
        with pytest.raises(ValueError, match=words):
            override_images(recipes, specs, chosen)


def test_a_stated_minimum_above_the_share_rule_is_the_floor_and_says_whose_it_is():
    """The 27B's natural floor MUST be the card's 20 tok/s (above 85% of the guide's 23.26 = 19.8), with its source."""
    floor = load_recipes(profiles=load_profiles())["qwen38-27b-nvfp4"].floors["natural_decode"]
    assert (floor.share_min, floor.min) == (19.8, 20)
    assert floor.expected().startswith('>= 20 tok/s (the higher of 20 tok/s stated (the operators\' acceptance card '
                                       'for the 27B: ">= 20 tok/s natural for 27B, per-request not aggregate")')
    with pytest.raises(ValidationError, match="a stated minimum names who stated it"):
        Floor(figure=10, measured="m", source="s", stated=12)


def test_a_recipe_name_that_could_carry_markup_or_a_command_is_refused_naming_file_and_field(tmp_path):
    """A recipe's name becomes a test id in the report and a field of the run journal: anything but letters,
    digits, '.', '_' and '-' MUST be a clear error naming the file and the field."""
    folder = broken_recipe(tmp_path, lambda d: d.update(name="<img src=x onerror=alert(1)>"))
    with pytest.raises(RecipeError, match=r"smollm2-cpu.yaml: field `name`: String should match pattern"):
        load_recipes(Path(folder), load_profiles())


@pytest.mark.parametrize(("make", "words"), [
    (lambda d: (d / "smollm2-cpu.yaml").write_text(yaml.safe_dump({**yaml.safe_load(
        (RECIPES_DIR / "smollm2-cpu.yaml").read_text()), "volumes": ["/models"]})),
     "smollm2-cpu.yaml: field `volumes`: Value error, '/models' is not host_path:container_path[:options]"),
    (lambda d: (d / "broken.yaml").write_bytes(b"name: \xff\xfe\n"), "broken.yaml: not UTF-8 text (byte 6)"),
    (lambda d: (d / "a-folder.yaml").mkdir(), "a-folder.yaml: cannot be read: Is a directory"),
], ids=["volume-without-colon", "not-utf8", "a-directory"])
def test_a_recipe_folder_with_bad_entries_is_one_error_naming_the_file(tmp_path, make, words):
    make(tmp_path)
    with pytest.raises(RecipeError, match=re.escape(words)):
        load_recipes(tmp_path, load_profiles())


def test_a_recipes_dir_that_does_not_exist_is_an_error_not_an_empty_run(tmp_path):
    with pytest.raises(RecipeError, match="no such folder of recipes"):
        load_recipes(tmp_path / "nowhere", load_profiles())


# ---- two Sparks as one ---------------------------------------------------------------------------------------------

def test_a_two_node_recipe_loads_with_its_head_worker_and_link(tmp_path):
    folder = broken_recipe(tmp_path, lambda d: two_node(d), name="qwen36-35b-a3b-nvfp4")
    recipe = load_recipes(Path(folder), load_profiles())["qwen36-35b-a3b-nvfp4"]
    assert (recipe.nodes.head.host, recipe.nodes.worker.address, recipe.tensor_parallel) == ("spark01",
                                                                                            "192.168.100.11", 2)
    # The other port of the card (its twin) serves differently: the serving digest says so.
    twin = recipe.model_copy(update={"nodes": recipe.nodes.model_copy(update={"interface": "enP2p1s0f1np1"})})
    assert twin.serving_digest != recipe.serving_digest


def _unpinned(d):
    d["env"] = {**d.get("env", {}), "NCCL_SOCKET_IFNAME": "enP7s7"}  # the management port


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d["nodes"]["worker"].update(host="spark01"), "the head and the worker are both spark01"),
    (lambda d: d["nodes"]["worker"].update(address="192.168.100.10"), "both have the address 192.168.100.10"),
    (lambda d: d["nodes"]["head"].update(address="spark01"), "field `nodes.head.address`: Value error, 'spark01' is "
                                                             "not an IP address"),
    (lambda d: d["nodes"].update(interface="enp1s0f1np1; reboot"), "field `nodes.interface`: String should match"),
    (lambda d: d["serve_args"].remove("ray"), "`serve_args`: a two-node recipe needs --distributed-executor-backend "
                                              "ray"),
    (lambda d: d["serve_args"].__setitem__(d["serve_args"].index("--tensor-parallel-size") + 1, "1"),
     "`serve_args`: two nodes with one GPU each need --tensor-parallel-size 2 (or --pipeline-parallel-size 2): the "
     "args ask for 1 GPU(s)"),
    (lambda d: d["serve_args"].__setitem__(d["serve_args"].index("--tensor-parallel-size") + 1, "two"),
     "`serve_args`: --tensor-parallel-size takes a whole number, not 'two'"),
    (lambda d: d.update(network="bridge"), "`nodes`: a two-node recipe runs a container on each node, on the host's "
                                           "network"),
    (_unpinned, "`env`: NCCL_SOCKET_IFNAME=enP7s7 but `nodes.interface` is enp1s0f1np1"),
], ids=["one-box-twice", "one-address-twice", "a-name-for-an-address", "a-command-for-an-interface", "no-ray",
        "one-gpu", "not-a-number", "bridge-network", "nccl-on-another-port"])
def test_a_malformed_two_node_recipe_names_its_file_and_field(tmp_path, change, words):
    def make(d):
        two_node(d)
        change(d)

    folder = broken_recipe(tmp_path, make, name="qwen36-35b-a3b-nvfp4")
    with pytest.raises(RecipeError, match=re.escape("qwen36-35b-a3b-nvfp4.yaml: ") + ".*" + re.escape(words)):
        load_recipes(Path(folder), load_profiles())


def test_a_two_node_recipes_one_box_twin_is_the_same_model_on_one_box(tmp_path):
    folder = beside_its_one_box_twin(tmp_path, "qwen36-35b-a3b-nvfp4")
    shutil.copy(RECIPES_DIR / "qwen38-27b-nvfp4.yaml", folder)  # another model on one box: no twin of it
    recipes = load_recipes(folder, load_profiles())
    assert one_node_twin(recipes["qwen36-35b-a3b-nvfp4-2node"], recipes).name == "qwen36-35b-a3b-nvfp4"
    assert one_node_twin(recipes["qwen36-35b-a3b-nvfp4"], recipes) is None  # one box: no twin to stand beside
