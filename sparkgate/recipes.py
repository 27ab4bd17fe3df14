"""Recipes (one serving configuration each) and hardware profiles, validated on load.

A recipe or profile that does not validate raises RecipeError naming the file and the field, so an operator
with a typo gets one line, not a traceback.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .serveargs import ServeArgs
from .shipped import PROFILES_DIR, RECIPES_DIR


class RecipeError(Exception):
    """A recipe or profile file that cannot be used, with the file and field named."""


class _Strict(BaseModel):
    # An unknown key is a typo until proven otherwise.
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Strict):
    name: str
    compute_capability: str


class Profile(_Strict):
    """What a hardware class must show. Every number says where it comes from."""

    name: str
    description: str
    arch: str | None = Field(None, description="uname -m; null matches any")
    gpu: GpuSpec | None = Field(None, description="null: the class has no NVIDIA GPU")
    min_driver: str | None = None
    memory_gib: float | None = Field(None, description="usable (unified) memory of the class")
    unified_memory: bool = Field(False, description="the GPU and the OS share one pool (GB10): the page cache is in it")
    memory_bandwidth_gbs: float | None = Field(None, description="decode roofline; null: unknown")
    memory_bandwidth_source: str = Field("", description="where the bandwidth figure is published")
    sm_clock_floor_mhz: float | None = Field(None, description="the SM clock a perf figure must be measured at, at "
                                             "least; null: half the maximum the driver states")
    sm_clock_floor_source: str = Field("", description="where the floor comes from (a measurement of the class)")
    os_reserve_gib: float = Field(description="kept free for the OS and other services at start")
    os_reserve_basis: str = Field(description="why this much: the incidents or measurements it is derived from")

    @model_validator(mode="after")
    def _sourced(self) -> Profile:
        if self.memory_bandwidth_gbs and not self.memory_bandwidth_source:
            raise ValueError("`memory_bandwidth_gbs` needs `memory_bandwidth_source` (where it is published)")
        if self.sm_clock_floor_mhz and not self.sm_clock_floor_source:
            raise ValueError("`sm_clock_floor_mhz` needs `sm_clock_floor_source` (where it was measured)")
        return self


class Model(_Strict):
    id: str = Field(description="the checkpoint, as vLLM is given it")
    served_name: str
    source: str | None = Field(None, description="embedded:<name> for weights the suite prepares itself")
    format: Literal["safetensors", "gguf"] = "safetensors"
    quantization: str
    total_params_b: float
    active_params_b: float
    bytes_per_param: float = Field(description="of the weights read per token, for the roofline")
    bytes_per_param_basis: str = Field("", description="the quantization format's layout behind bytes_per_param")
    kv_bytes_per_token: int | None = Field(None, description="KV cache bytes per token of context, as vLLM logged "
                                           "it (GiB / tokens); null: not known yet")
    native_context: int
    disk_gib: float = Field(0, description="weights on disk, what the model cache must hold")
    gdn_hybrid: bool = Field(False, description="Gated DeltaNet hybrid (affected by the cudagraph defect)")
    yarn: bool = Field(False, description="the recipe extends the context past native_context with YaRN")


class Memory(_Strict):
    """What the recipe takes from the host's (unified) memory once serving (a two-node recipe: on each node)."""

    weights_gib: float = Field(description="resident, not on disk: resident runs well above du")
    kv_cache_gib: float = Field(description="pinned with --kv-cache-memory, or what vLLM takes unpinned")
    overhead_gib: float = Field(0.0, description="activations, graphs, runtime, and the margin every budget "
                                "carries (sparkgate.rules.MARGIN)")
    measured_resident_gib: float | None = Field(None, description="what the server was measured to hold, if it "
                                                "was: the budget must cover it with the margin")
    basis: str = Field(description="where the numbers come from")

    @property
    def budget_gib(self) -> float:
        return self.weights_gib + self.kv_cache_gib + self.overhead_gib


class Features(_Strict):
    tools: bool = False
    reasoning: bool = False
    vision: bool = False
    structured_output: bool = True
    mtp: bool = False


# The one rule every floor follows: a fixed share of the figure it derives from, by where that figure comes from.
FLOOR_SHARE = {
    # The guide's box is the same hardware class; its worst single run of a single-stream figure was 9.3% under
    # its mean (natural 21.1 of 23.26), so 85% holds a healthy box and fails a real regression.
    "guide": 0.85,
    # The embedded default's figures come from a 2-core CI machine; other machines differ and share their cores,
    # so its floors catch a gross slowdown only. A healthy engine on the same kind of VM measured 24% of the figure
    # at 4 concurrent (4.96 +/- 0.65 and 4.64 +/- 0.51 tok/s, n=12 each, 2026-12-02, its copy bandwidth 11 to 18 GB/s
    # against the 28 behind the figures) and 40 to 46% at one stream: 35% failed it; 15% holds it with a margin and
    # still fails a server six times slower.
    "measured-here": 0.15,
}


# The floors a recipe can declare, and the check that holds the server to each.
FLOOR_CHECKS = {
    "natural_decode": "PERF-NATURAL", "single_stream_decode": "PERF-CONCURRENT",
    "concurrent_4_decode": "PERF-CONCURRENT", "concurrent_8_decode": "PERF-CONCURRENT",
    "concurrent_16_decode": "PERF-CONCURRENT", "sustained_decode": "PERF-SUSTAINED",
    "long_context_decode": "PERF-LONG-DECODE", "long_context_prefill": "PERF-LONG-PREFILL",
    "usable_decode": "PERF-CAPACITY", "spec_acceptance": "PERF-SPEC-ACCEPT",
}


class Floor(_Strict):
    """A per-request performance floor: a fixed share (FLOOR_SHARE) of a published or measured figure, or a stated
    minimum (an operator's acceptance card) where that is higher."""

    figure: float = Field(description="the mean the floor derives from")
    basis: Literal["guide", "measured-here"] = "guide"
    unit: str = "tok/s"
    measured: str = Field(description="the figure with its n, spread and shape, as published or measured")
    source: str = Field(description="where: the guide's section and line, or the run that measured it")
    stated: float | None = Field(None, description="a minimum stated apart from the figure (an acceptance card); "
                                                   "the floor is the higher of it and the share rule")
    stated_source: str | None = Field(None, description="who stated it, in their words")

    @model_validator(mode="after")
    def _stated_has_source(self) -> Floor:
        if (self.stated is None) != (self.stated_source is None):
            raise ValueError("`stated` and `stated_source` go together: a stated minimum names who stated it")
        return self

    @property
    def share_min(self) -> float:
        return round(self.figure * FLOOR_SHARE[self.basis], 3 if self.unit == "ratio" else 1)  # a ratio is below 1

    @property
    def min(self) -> float:
        return max(self.share_min, self.stated) if self.stated is not None else self.share_min

    @property
    def rule(self) -> str:
        share = f"{FLOOR_SHARE[self.basis]:.0%} of {self.figure:g} {self.unit} ({self.basis})"
        if self.stated is None:
            return share
        return (f"the higher of {self.stated:g} {self.unit} stated ({self.stated_source}) and {share} = "
                f"{self.share_min:g}")

    def expected(self, what: str = "") -> str:
        """The floor as a failure message's `expected`: the minimum, the rule, and where the figure comes from."""
        return f">= {self.min:g} {self.unit}{what} ({self.rule}: {self.measured}; {self.source})"


class StartupBudget(_Strict):
    """How long a start of the recipe may take, from the container's start to serving, with where that comes from."""

    budget_s: float = Field(gt=0, description="seconds from the container's start to vLLM serving")
    measured: str = Field(description="the starts it was set from: their times, n, and the machine")
    source: str = Field(description="the runs that measured them")


class QualityFloor(_Strict):
    """The least share of the quality probes (sparkgate.quality) a recipe answers right, with where it comes from."""

    min_right: float = Field(gt=0, le=1, description="the least share of the probes answered right (0-1)")
    measured: str = Field(description="the share it was set from: right of n, at which level, on what")
    source: str = Field(description="the run that measured it")


class Node(_Strict):
    host: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,252}$", description="the box, as --host names it")
    address: str = Field(description="the node's own address on the link (its ConnectX-7 interface), which Ray, "
                         "NCCL and Gloo use")

    @field_validator("address")
    @classmethod
    def _an_address(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address (the node's address on the link, e.g. "
                             "192.168.100.10)") from None


class Nodes(_Strict):
    """Two Sparks as one: tensor parallel over Ray across their link. The head runs Ray's head and `vllm serve`
    (which waits for the worker's GPU to join, up to vLLM's placement-group timeout); the worker joins Ray."""

    head: Node
    worker: Node
    interface: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,15}$", description="the link's interface on both nodes "
                           "(a Spark's ConnectX-7 port, e.g. enp1s0f1np1): NCCL, Gloo, UCX, TensorPipe and Open MPI "
                           "are pinned to it (LINK_ENV), never the management port")
    ray_port: int = Field(6379, gt=0, lt=65536, description="the port of Ray's head, on the head's link address")

    def peer_of(self, box: str) -> str | None:
        """The other node's address on the link, for the node `box` (as --host names it); None if it is neither."""
        return {self.head.host: self.worker.address, self.worker.host: self.head.address}.get(box)

    @model_validator(mode="after")
    def _two_apart(self) -> Nodes:
        if self.head.host == self.worker.host:
            raise ValueError(f"the head and the worker are both {self.head.host}: two nodes are two boxes")
        if self.head.address == self.worker.address:
            raise ValueError(f"the head and the worker both have the address {self.head.address} on the link")
        return self


# What pins each library's traffic to the link on a node (NVIDIA's two-Spark playbook sets the same), not the
# management port: NCCL, Gloo, UCX, PyTorch's TensorPipe and Open MPI.
LINK_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "TP_SOCKET_IFNAME",
            "OMPI_MCA_btl_tcp_if_include")


class Recipe(_Strict):
    # A name becomes a test id, a file name and a journal field: letters, digits, '.', '_' and '-' only.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                      description="letters, digits, '.', '_', '-' (it becomes a test id, shown in the report)")
    description: str
    profile: str
    model: Model
    launcher: Literal["docker", "process"]
    image: str | None = None
    container_name: str | None = None
    restart: Literal["no", "on-failure", "unless-stopped", "always"] = "unless-stopped"
    env: dict[str, str] = {}
    serve_args: list[str] = Field(description="exactly what follows `vllm serve MODEL`")
    # How the docker launcher runs the container (docker recipes only).
    entrypoint: list[str] | None = Field(None, description="null: the image's own (`vllm serve` upstream)")
    volumes: list[str] = Field([], description="host_path:container_path[:ro], as docker run -v")

    @field_validator("volumes")
    @classmethod
    def _volumes_have_both_sides(cls, value: list[str]) -> list[str]:
        for v in value:
            parts = v.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or (len(parts) == 3 and not re.fullmatch(
                    r"[a-z]+(,[a-z]+)*", parts[2], re.I)):
                raise ValueError(f"{v!r} is not host_path:container_path[:options] (options as docker's -v: ro, z, "
                                 "...)")
        return value
    network: str = Field("host", description="docker network mode")
    ipc: str | None = Field("host", description="docker ipc mode; null: docker's default")
    ports: dict[int, int] = Field({}, description="container port -> host port (not with network host)")
    gpus: Literal["all", "none"] = Field("all", description="GPU request, as docker run --gpus")
    hf_cache: bool = Field(False, description="mount the host's Hugging Face cache (HF_HOME, else "
                           "~/.cache/huggingface of the ssh user) at /root/.cache/huggingface: weights are "
                           "downloaded once and kept, not again in every container")
    mods: list[str] = Field([], description="host folders of container mods (eugr/spark-vllm-docker: a folder with "
                            "a run.sh), applied in the container before `vllm serve`; ~ is the ssh user's home")
    port: int = 8000
    memory: Memory
    features: Features = Features()
    floors: dict[str, Floor] = {}
    startup: StartupBudget | None = Field(None, description="the longest a start may take (CONT-STARTUP-TIME)")
    quality: QualityFloor | None = Field(None, description="the least share of quality probes answered right "
                                         "(QUAL-ANSWERS)")
    nodes: Nodes | None = Field(None, description="two Sparks as one (a head and a worker over their link); null: "
                                "one box")
    source_file: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _launcher_fields(self) -> Recipe:
        if self.launcher == "docker" and not (self.image and self.container_name):
            raise ValueError("a docker recipe needs both `image` and `container_name`")
        if (port := self.args.value("--port")) is not None and port != str(self.port):
            raise ValueError(f"`port` is {self.port} but serve_args say --port {port}")
        if unknown := [f for f in self.floors if f not in FLOOR_CHECKS]:
            raise ValueError(f"unknown floor {', '.join(unknown)} (known: {', '.join(FLOOR_CHECKS)})")
        if self.mods and self.launcher != "docker":
            raise ValueError("`mods` are applied in a container: only a docker recipe has them")
        for flag in ("--tensor-parallel-size", "--pipeline-parallel-size"):
            if not (self.arg(flag) or "1").isdigit():
                raise ValueError(f"`serve_args`: {flag} takes a whole number, not {self.arg(flag)!r}")
        if self.nodes:
            self._two_node_fields()
        try:
            self.args.kv_pin_bytes()
        except ValueError:
            raise ValueError("`serve_args`: the KV pin is not a size vLLM takes (--kv-cache-memory: bytes, or a "
                             "whole number and K/M/G/T, binary (20G is 20 GiB), or a number and k/m/g/t, decimal; "
                             "VLLM_CPU_KVCACHE_SPACE: whole GiB); vLLM would refuse to start") from None
        return self

    def _two_node_fields(self) -> None:
        if self.launcher != "docker" or self.network != "host":
            raise ValueError("`nodes`: a two-node recipe runs a container on each node, on the host's network "
                             "(launcher docker, network host): Ray and NCCL must see the link's interface")
        parallel = self.tensor_parallel * int(self.arg("--pipeline-parallel-size") or 1)
        if parallel != 2:
            raise ValueError(f"`serve_args`: two nodes with one GPU each need --tensor-parallel-size 2 (or "
                             f"--pipeline-parallel-size 2): the args ask for {parallel} GPU(s)")
        if self.arg("--distributed-executor-backend") != "ray":
            raise ValueError("`serve_args`: a two-node recipe needs --distributed-executor-backend ray (the "
                             "worker's GPU joins through Ray)")
        pinned = {k: v for k, v in self.env.items() if k in LINK_ENV and v != self.nodes.interface}
        if pinned:
            raise ValueError(f"`env`: {', '.join(f'{k}={v}' for k, v in pinned.items())} but `nodes.interface` is "
                             f"{self.nodes.interface}: the suite sets these from it on each node")

    @property
    def args(self) -> ServeArgs:
        """The serve arguments (with the recipe's env), read by the one serve-argument reader."""
        return ServeArgs(self.serve_args, self.env)

    def arg(self, flag: str) -> str | None:
        """The value of a serve flag (`--x v` or `--x=v`), '' for a bare switch, None when absent."""
        return self.args.value(flag)

    @property
    def tensor_parallel(self) -> int:
        """GPUs each layer is split across (each reads its share of the weights per token)."""
        return int(self.arg("--tensor-parallel-size") or 1)

    @property
    def max_num_seqs(self) -> int:
        return self.args.max_num_seqs or 256

    @property
    def max_model_len(self) -> int:
        return self.args.max_model_len or self.model.native_context

    @property
    def digest(self) -> str:
        """A hash of the whole recipe (floors, budgets, everything but where its file lies)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def serving_digest(self) -> str:
        """A hash of only what changes the serving: model, image, entrypoint, mods, env, serve args. Two runs with
        equal serving digests served the same thing, whatever floors or notes their recipes carry."""
        what = {"model": self.model.id, "image": self.image, "entrypoint": self.entrypoint, "mods": self.mods,
                "env": self.env, "serve_args": self.serve_args}
        if self.nodes:  # (only then: a one-box recipe's digest stays what earlier results files recorded)
            what["nodes"] = self.nodes.model_dump(mode="json")
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _load(path: Path, model: type[BaseModel]) -> BaseModel:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:  # a directory named like a recipe, a file it may not read
        raise RecipeError(f"{path}: cannot be read: {exc.strerror}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping of fields, found {type(data).__name__}")
    try:
        obj = model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"field `{'.'.join(str(p) for p in e['loc'])}`: {e['msg']}" if e["loc"] else e["msg"]
            for e in exc.errors()
        )
        raise RecipeError(f"{path}: {problems}") from None
    if obj.name != path.stem:
        raise RecipeError(f"{path}: field `name` is {obj.name!r} but the file is named {path.stem!r}")
    return obj


def load_profiles(directory: Path = PROFILES_DIR) -> dict[str, Profile]:
    return {p.stem: _load(p, Profile) for p in sorted(directory.glob("*.yaml"))}


def load_recipes(
    directory: Path = RECIPES_DIR, profiles: dict[str, Profile] | None = None
) -> dict[str, Recipe]:
    profiles = load_profiles() if profiles is None else profiles
    if not directory.is_dir():
        raise RecipeError(f"{directory}: no such folder of recipes (--recipes-dir)")
    recipes: dict[str, Recipe] = {}
    for path in sorted(directory.glob("*.yaml")):
        recipe = _load(path, Recipe).model_copy(update={"source_file": path})
        if recipe.profile not in profiles:
            raise RecipeError(
                f"{path}: field `profile`: {recipe.profile!r} is not a known profile ({', '.join(profiles)})"
            )
        recipes[recipe.name] = recipe
    return recipes


def one_node_twin(recipe: Recipe, recipes: dict[str, Recipe]) -> Recipe | None:
    """A two-node recipe's one-box counterpart: the first recipe (by name) serving the same model on one box, whose
    floors' figures the perf layer prints beside the two-node figures. None for a one-box recipe, or where there is
    none."""
    if not recipe.nodes:
        return None
    return next((r for _, r in sorted(recipes.items()) if r.model.id == recipe.model.id and not r.nodes), None)


def override_images(recipes: dict[str, Recipe], specs: list[str], chosen: list[str] | None = None) -> dict[str, str]:
    """--image, for the upgrade gate: which recipe serves which candidate image, for this run. A spec is WHAT=REF
    (WHAT: a recipe's name, or an image that recipes use today: all of those) or a bare REF, which is allowed only
    when the docker recipes in play (`chosen`, else all) use one image: it never guesses between images. Returns
    recipe name -> image; raises ValueError saying what to write instead."""
    in_play = [recipes[n] for n in (chosen or recipes) if n in recipes]
    docker = [r for r in in_play if r.launcher == "docker"]
    by_image: dict[str, list[str]] = {}
    for r in docker:
        by_image.setdefault(r.image or "", []).append(r.name)
    uses = "; ".join(f"{image}: {', '.join(names)}" for image, names in by_image.items())
    out: dict[str, str] = {}
    for spec in specs:
        what, _, ref = spec.rpartition("=")
        if not ref:
            raise ValueError(f"--image {spec}: no image after '='")
        if not what:
            if len(by_image) != 1:
                raise ValueError(f"--image {ref}: {'no docker recipe is' if not by_image else 'the docker recipes'} "
                                 f"in play {'to serve it' if not by_image else f'use {len(by_image)} images ({uses})'}"
                                 f"; say which it replaces: --image RECIPE={ref} or --image IMAGE={ref}")
            names = next(iter(by_image.values()))
        elif what in recipes:
            if recipes[what].launcher != "docker":
                raise ValueError(f"--image {spec}: {what} runs as a {recipes[what].launcher}, not from an image")
            if what not in {r.name for r in in_play}:
                raise ValueError(f"--image {spec}: {what} is not selected (--recipe)")
            names = [what]
        elif what in by_image:
            names = by_image[what]
        else:
            raise ValueError(f"--image {spec}: {what} is neither a recipe nor an image a selected docker recipe uses "
                             f"({uses or 'none'})")
        for name in names:
            if out.get(name, ref) != ref:
                raise ValueError(f"--image {spec}: {name} is already given {out[name]}")
            out[name] = ref
    return out
