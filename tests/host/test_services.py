"""What else the box runs and has: other model servers, the docker engine, disk for the weights."""

import pytest

from sparkgate import hfcache
from sparkgate.units import GIB


@pytest.mark.check(
    "HOST-NO-COMPETITOR",
    why="on unified memory every other model server's weights and KV cache come out of the same pool: "
        "vLLM refuses to start ('Free memory on device ... is less than desired') or starves the box",
    fix="stop them first (`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`, "
        "`systemctl list-units --type=service --state=running | grep -iE 'llama|ollama|vllm'`); stop a "
        "container with `docker rm -f`, a service with `systemctl stop`, a process by its pid",
)
def test_no_other_model_server_holds_memory(check, host_facts, pytestconfig, selected_recipes, profiles):
    """No other model server MUST be running or holding GPU memory before a recipe starts (the container a
    selected docker recipe replaces is not another: the launcher sets it aside, and counts its memory as free)."""
    if pytestconfig.option.sg_base_url:
        check.cannot_run("--base-url names a server that is meant to be running")
    replaced = {c.id: c.name for r in selected_recipes if (c := host_facts.container(r.container_name))}
    ours = {pid for pid, cid in host_facts.container_of.items() if cid in replaced}
    found = [f"pid {a.pid} {a.name} holds {a.used_mib} MiB" for a in host_facts.compute_apps if a.pid not in ours]
    found += [f"pid {p}" for p in host_facts.model_processes
              if int(p.split()[0]) not in ours and not any(f"pid {p.split()[0]} " in f for f in found)]
    if not found and host_facts.ps_error:  # none found among processes never listed is no verdict
        check.cannot_run(f"the host's processes could not be listed (ps -eww -o pid=,args=: {host_facts.ps_error})")
    # Where a GPU is in play, a server may hold GPU memory under any name (python3): only nvidia-smi lists those.
    gpu = host_facts.has_nvidia or any(profiles[r.profile].gpu for r in selected_recipes)
    if not found and gpu and (host_facts.nvidia_smi is None or host_facts.nvidia_smi_error):
        smi = (host_facts.nvidia_smi_error or "nvidia-smi is not installed").splitlines()[0]
        check.cannot_run(f"no model server among the host's processes, but what holds GPU memory could not be listed "
                         f"({smi}): HOST-NVIDIA-SMI says why")
    check.that(not found, expected="no model server running" + (
        f" (besides {', '.join(sorted(set(replaced.values())))}, which a recipe replaces)" if ours else ""),
               found="; ".join(found))


@pytest.mark.check(
    "HOST-DOCKER",
    why="the docker recipes start their server on this host's docker engine",
    fix="start the engine (`sudo systemctl start docker`) and add the ssh user to the docker group "
        "(`sudo usermod -aG docker $USER`, then log in again)",
)
def test_the_docker_engine_answers_for_docker_recipes(check, host_facts, selected_recipes):
    """When a docker recipe is selected, the docker engine MUST answer the ssh user."""
    docker = [r.name for r in selected_recipes if r.launcher == "docker"]
    if not docker:
        check.cannot_run("no docker recipe is selected", "--recipe qwen38-27b-nvfp4")
    allowed = host_facts.user == "root" or "docker" in host_facts.groups
    check.that(host_facts.docker is not None and allowed,
               expected=f"docker engine reachable by {host_facts.user} (for {', '.join(docker)})",
               found=f"engine {host_facts.docker or 'unreachable: ' + str(host_facts.docker_error)}; "
                     f"user {host_facts.user} in groups {' '.join(host_facts.groups)}")


@pytest.mark.check(
    "HOST-DISK-FREE",
    why="weights are read from (and first downloaded into) the model cache; a full disk fails the load "
        "half-way",
    fix="free space on that filesystem, or point HF_HOME at one with room",
)
def test_the_model_cache_has_room_for_the_weights(check, host_facts, selected_recipes):
    """The model cache's filesystem MUST have room for the largest selected recipe's weights."""
    if not selected_recipes:
        check.cannot_run("no recipe selected for this host", "--recipe NAME")
    if host_facts.disk_free_bytes is None:
        check.cannot_run("free space of the model cache could not be read (df)")
    largest = max(selected_recipes, key=lambda r: r.model.disk_gib)
    free = host_facts.disk_free_bytes / GIB
    check.that(free >= largest.model.disk_gib, expected=f">= {largest.model.disk_gib:g} GiB ({largest.name})",
               found=f"{free:.1f} GiB free on {host_facts.disk_path}")


@pytest.mark.check(
    "HOST-WEIGHTS-WHOLE",
    why="a download cut short, or a file damaged on disk, is loaded as weights that are not the model's (answers that "
        "are wrong, or a load that fails after minutes); the Hugging Face cache names every file by the hash of its "
        "content, so the box can check each one without a network",
    fix="download the named files again: remove the blob and the snapshot link named, then `hf download MODEL` (or "
        "`huggingface-cli download MODEL`) as the user whose cache the recipe mounts",
)
def test_the_cached_weights_are_whole(check, target_host, host_facts, selected_recipes, level):
    """Every file of each selected recipe's model in the Hugging Face cache MUST hash to the name the cache keeps it
    under (--level quick hashes the smallest files up to its sample)."""
    cached = [r for r in selected_recipes if r.hf_cache]
    if not cached:
        check.cannot_run("no selected recipe loads its weights from the Hugging Face cache (hf_cache: true)",
                         "--recipe qwen38-27b-nvfp4")
    if not host_facts.hf_cache:
        check.cannot_run("the Hugging Face cache's path could not be read on the box (HF_HOME, else "
                         "~/.cache/huggingface)")
    budget = int(level.weights_gib * GIB)
    damaged, checked, absent, notes = [], [], [], []
    for model_id in dict.fromkeys(r.model.id for r in cached):
        res = target_host.run(hfcache.command(host_facts.hf_cache, model_id, budget))
        model = hfcache.parse(res.stdout)
        if res.rc != 0 or model.unreadable:
            check.cannot_run(f"{model_id}'s files could not be hashed on the box: "
                             + (model.unreadable or f"exit {res.rc}: {res.stderr.strip()[:200]}"))
        if not model.present:
            absent.append(model_id)
            continue
        damaged += [f"{model_id}: {b} hashes to {b.actual or 'nothing'}, not to its name {b.name}"
                    for b in model.damaged]
        hashed = model.hashed
        checked.append(f"{model_id}: {len(hashed)} of {len(model.blobs)} files, "
                       f"{sum(b.size for b in hashed) / GIB:.2f} GiB hashed")
        if model.incomplete:
            notes.append(f"{model_id}: {len(model.incomplete)} download(s) never finished (blobs/*.incomplete)")
    if not checked:
        check.cannot_run(f"none of the selected models is in the Hugging Face cache at {host_facts.hf_cache} yet "
                         f"({', '.join(absent)}): the first start downloads them")
    check.that(not damaged, expected="every file of the cached models hashes to its name",
               found="; ".join(damaged + checked + notes + [f"{m}: not in the cache yet" for m in absent]))
