"""What a recipe means for a container, and how a live container differs from it.

- `run_kwargs()`: the docker SDK's create() arguments for the recipe; `docker_run()`: the same as the `docker run`
  an operator reads first. Both say exactly what the recipe says: name, image, entrypoint, [model, *serve_args],
  env, restart policy, GPU request, ipc, network, ports, volumes, with an init (so a stop is prompt).
- `config_drift()`: every way a live container differs from what the launcher would start (decides reuse),
  including an older build of a moving tag (`nightly-aarch64` pulled again since the container started).
- `LiveContainer` / `read_live()`: the container as the container checks read it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from ..recipes import LINK_ENV, Recipe
from ..redact import join_masked, mask, secrets_of
from ..rules import required_env
from ..serveargs import SECRET_FLAGS, ServeArgs, same_value
from ..vllmlog import StartupFacts
from ..vllmlog import parse as parse_log

LABEL = "io.sparkgate"  # every container the suite creates carries LABEL.recipe, LABEL.digest and LABEL.run
SAVED_SUFFIX = ".sparkgate-saved"
DOCKER_ARCH = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "amd64", "amd64": "amd64"}


HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
MODS_IN_CONTAINER = "/sparkgate-mods"
# Applies each mounted mod (a folder with run.sh, as eugr/spark-vllm-docker's --apply-mod does), then runs the
# server: `bash -c SCRIPT sparkgate-mods vllm serve MODEL ARGS...`.
_MODS = f'for m in {MODS_IN_CONTAINER}/*/; do echo "sparkgate: applying mod $m"; (cd "$m" && bash ./run.sh); done; '
APPLY_MODS = f'set -e; {_MODS}exec "$@"'
# A two-node recipe's containers (both: mods first): the head starts Ray's head, then the server, whose placement
# group waits for the worker's GPU; the worker joins Ray and stays in the foreground (`ray start --block`).
Role = Literal["head", "worker"]


@dataclass(frozen=True)
class HostPaths:
    """Where the recipe's host-side paths are on the target: its home (for `~`) and its Hugging Face cache."""

    home: str = "$HOME"
    hf_cache: str = "$HOME/.cache/huggingface"

    def expand(self, path: str) -> str:
        return self.home + path[1:] if path == "~" or path.startswith("~/") else path


def expected_args(recipe: Recipe, role: Role = "head") -> list[str]:
    """What follows the entrypoint: the model, then the serve args (a worker node: Ray's join)."""
    if role == "worker" and recipe.nodes:
        n = recipe.nodes
        return ["ray", "start", "--block", f"--address={n.head.address}:{n.ray_port}",
                f"--node-ip-address={n.worker.address}"]
    return [recipe.model.id, *recipe.serve_args]


def entrypoint(recipe: Recipe, role: Role = "head") -> list[str] | None:
    """The container's entrypoint: the recipe's (None: the image's own), wrapped to apply its mods first, and on
    a two-node recipe's head to start Ray's head first."""
    serve = recipe.entrypoint or ["vllm", "serve"]
    mods = _MODS if recipe.mods else ""
    if recipe.nodes:
        n = recipe.nodes
        if role == "worker":
            return ["bash", "-c", f'set -e; {mods}exec "$@"', "sparkgate-worker"]
        ray_head = f"ray start --head --port={n.ray_port} --node-ip-address={n.head.address}; "
        return ["bash", "-c", f'set -e; {mods}{ray_head}exec "$@"', "sparkgate-head", *serve]
    if not recipe.mods:
        return recipe.entrypoint
    return ["bash", "-c", APPLY_MODS, "sparkgate-mods", *serve]


def container_name(recipe: Recipe, role: Role = "head") -> str:
    return f"{recipe.container_name}-worker" if role == "worker" and recipe.nodes else recipe.container_name or ""


def container_env(recipe: Recipe, role: Role = "head") -> dict[str, str]:
    """The recipe's env; on a two-node recipe's node, with the node's link address and every library pinned to
    the link's interface (NVIDIA's two-Spark playbook sets the same)."""
    if not recipe.nodes:
        return dict(recipe.env)
    node = recipe.nodes.head if role == "head" else recipe.nodes.worker
    return {**recipe.env, "VLLM_HOST_IP": node.address, **dict.fromkeys(LINK_ENV, recipe.nodes.interface)}


def mounts(recipe: Recipe, paths: HostPaths) -> list[tuple[str, str, str]]:
    """(host path, container path, mode) of every volume: the recipe's, the Hugging Face cache, the mods."""
    out = []
    for spec in recipe.volumes:
        parts = spec.split(":")
        out.append((paths.expand(parts[0]), parts[1], parts[2] if len(parts) > 2 else "rw"))
    if recipe.hf_cache:
        out.append((paths.hf_cache, HF_CACHE_IN_CONTAINER, "rw"))
    for mod in recipe.mods:
        out.append((paths.expand(mod.rstrip("/")), f"{MODS_IN_CONTAINER}/{os.path.basename(mod.rstrip('/'))}", "ro"))
    return out


def labels(recipe: Recipe, run_id: str) -> dict[str, str]:
    """The suite's labels; `LABEL.run` (the run that created it) only on what a run creates, which teardown and the
    next run may remove as the suite's own."""
    return {f"{LABEL}.recipe": recipe.name, f"{LABEL}.digest": recipe.digest} | (
        {f"{LABEL}.run": run_id} if run_id else {})


def run_kwargs(recipe: Recipe, run_id: str = "", paths: HostPaths = HostPaths(), role: Role = "head"
               ) -> dict[str, Any]:
    """docker SDK containers.create() arguments for the recipe (the image must be on the engine: never pulls);
    on a two-node recipe, for the node of `role`."""
    from docker.types import DeviceRequest

    kw: dict[str, Any] = dict(
        image=recipe.image, name=container_name(recipe, role), command=expected_args(recipe, role),
        environment=container_env(recipe, role),
        restart_policy={"Name": recipe.restart} if recipe.restart != "no" else {"Name": ""},
        network_mode=recipe.network, init=True, detach=True, labels=labels(recipe, run_id),
        volumes={host: {"bind": inside, "mode": mode} for host, inside, mode in mounts(recipe, paths)},
    )
    if (ep := entrypoint(recipe, role)) is not None:
        kw["entrypoint"] = ep
    if recipe.ipc:
        kw["ipc_mode"] = recipe.ipc
    if recipe.ports:
        kw["ports"] = {f"{c}/tcp": h for c, h in recipe.ports.items()}
    if recipe.gpus == "all":
        kw["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return kw


def docker_run(recipe: Recipe, paths: HostPaths = HostPaths(), role: Role = "head") -> str:
    """The `docker run` that run_kwargs() stands for, for an operator to read before anything starts (the
    launcher's bookkeeping labels left out, secrets masked); on a two-node recipe, for the node of `role`."""
    ep = entrypoint(recipe, role) or []
    parts = ["docker", "run", "-d", "--name", container_name(recipe, role), "--restart", recipe.restart, "--init"]
    if recipe.ipc:
        parts += ["--ipc", recipe.ipc]
    parts += ["--network", recipe.network]
    if recipe.gpus == "all":
        parts += ["--gpus", "all"]
    for container_port, host_port in recipe.ports.items():
        parts += ["-p", f"{host_port}:{container_port}"]
    for host, inside, mode in mounts(recipe, paths):
        parts += ["-v", f"{host}:{inside}" + (":ro" if mode == "ro" else "")]
    if ep:
        parts += ["--entrypoint", ep[0]]  # the rest of the entrypoint leads the command
    for key, value in container_env(recipe, role).items():
        parts += ["-e", f"{key}={value}"]
    # Masked token by token, then quoted: never the other way round (a quote in a secret would split it). A
    # $HOME the operator's shell is to expand stays outside the quotes.
    line = join_masked([*parts, recipe.image or "", *ep[1:], *expected_args(recipe, role)])
    return line.replace("'$HOME/", "\"$HOME\"'/")


def live_argv(attrs: dict[str, Any]) -> list[str]:
    """The container's full command: entrypoint + cmd (a `sh -c "..."` command is split as the shell would)."""
    cfg = attrs.get("Config") or {}
    argv = [*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])]
    for i, a in enumerate(argv):
        if a == "-c" and i + 1 < len(argv) and os.path.basename(argv[i - 1] if i else "") in ("sh", "bash"):
            try:
                return shlex.split(argv[i + 1])
            except ValueError:  # a script the shell reads but shlex cannot (an unbalanced quote): as docker has it
                return argv
    return argv


def live_serve_args(recipe: Recipe, attrs: dict[str, Any]) -> list[str] | None:
    """What follows the model in the running command; None when the model is not in it. The command as docker
    runs it is read first (`bash -c SCRIPT name vllm serve MODEL ...` passes the model as an argument), then a
    `sh -c "..."` command as the shell would split it."""
    cfg = attrs.get("Config") or {}
    for argv in ([*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])], live_argv(attrs)):
        for i, a in enumerate(argv):
            if a == recipe.model.id:
                return argv[i + 1:]
        if "--model" in argv:  # `python -m ... --model M args` with the model as a flag
            i = argv.index("--model")
            if argv[i + 1:i + 2] == [recipe.model.id]:
                return argv[i + 2:]
    return None


def env_of(attrs: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in (attrs.get("Config") or {}).get("Env") or []:
        k, _, v = item.partition("=")
        env[k] = v
    return env


def live_args(recipe: Recipe, attrs: dict[str, Any]) -> ServeArgs:
    """The running container's serve arguments (with its env), by the one serve-argument reader."""
    return ServeArgs(live_serve_args(recipe, attrs) or [], env_of(attrs))


def _shown(flag: str, values: list[str]) -> str:
    return " ".join("'***'" if flag in SECRET_FLAGS else repr(v) for v in values)


def arg_drift(recipe: Recipe, attrs: dict[str, Any]) -> list[str]:
    """Each difference between the recipe's serve args and the running container's, one line each."""
    live = live_serve_args(recipe, attrs)
    if live is None:
        return [mask(f"model: recipe {recipe.model.id}, running command {shlex.join(live_argv(attrs))}")]
    want, have = recipe.args.flags, ServeArgs(live).flags
    out = []
    for flag in dict.fromkeys([*want, *have]):
        w, h = want.get(flag), have.get(flag)
        if w is None:
            out.append(f"{flag}: not in the recipe, running with {_shown(flag, h or [])}")
        elif h is None:
            out.append(f"{flag}: recipe {_shown(flag, w)}, not in the running command")
        elif len(w) != len(h) or not all(same_value(a, b) for a, b in zip(w, h, strict=True)):
            out.append(f"{flag}: recipe {_shown(flag, w)}, running {_shown(flag, h)}")
    return out


def env_drift(recipe: Recipe, attrs: dict[str, Any]) -> list[str]:
    live = env_of(attrs)
    out = []
    for k, v in required_env(recipe).items():
        if k not in live:
            out.append(mask(f"{k} missing (want {k}={v})"))
        elif live[k] != v:
            out.append(mask(f"{k}={live[k]} (want {k}={v})"))
    return out


def config_drift(recipe: Recipe, attrs: dict[str, Any], tag_image_id: str | None = None) -> list[str]:
    """Every way the live container differs from what the launcher would start (decides reuse). With
    `tag_image_id` (what the recipe's image reference names on the engine now), an older build of a moving
    tag is drift too."""
    cfg, host = attrs.get("Config") or {}, attrs.get("HostConfig") or {}
    out = []
    if cfg.get("Image") != recipe.image:
        out.append(f"image {cfg.get('Image')} (recipe {recipe.image})")
    elif tag_image_id and attrs.get("Image") and attrs["Image"] != tag_image_id:
        out.append(f"image {recipe.image} at {attrs['Image'][:19]}, an older build: the tag names {tag_image_id[:19]} "
                   "now (pulled or rebuilt since the container started)")
    if (ep := entrypoint(recipe)) is not None and (cfg.get("Entrypoint") or []) != ep:
        out.append(f"entrypoint {cfg.get('Entrypoint')} (recipe {ep})")
    out += [f"serve args: {d}" for d in arg_drift(recipe, attrs)]
    out += [f"env {d}" for d in env_drift(recipe, attrs)]
    policy = (host.get("RestartPolicy") or {}).get("Name") or "no"
    if policy != recipe.restart:
        out.append(f"restart policy {policy} (recipe {recipe.restart})")
    if host.get("NetworkMode") != recipe.network:
        out.append(f"network {host.get('NetworkMode')} (recipe {recipe.network})")
    return out


# ---- the live container, as the checks read it ----------------------------------------------------------

@dataclass
class LiveContainer:
    name: str
    attrs: dict[str, Any]
    image: dict[str, Any]
    logs: str = ""
    facts: StartupFacts = field(default_factory=StartupFacts)
    stats: dict[str, Any] | None = None
    tag_image_id: str | None = None  # the image the recipe's reference names now, when looked up
    server: Any = None  # the server it runs, as the tests were handed it

    @property
    def restart_policy(self) -> str:
        return ((self.attrs.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "no"

    @property
    def env(self) -> dict[str, str]:
        return env_of(self.attrs)

    def args(self, recipe: Recipe) -> ServeArgs:
        return live_args(recipe, self.attrs)

    @property
    def memory_bytes(self) -> int | None:
        return resident_bytes(self.stats)


def resident_bytes(stats: dict[str, Any] | None) -> int | None:
    """Resident memory of a container's cgroup, page cache excluded (as docker stats shows it)."""
    mem = (stats or {}).get("memory_stats") or {}
    if "usage" not in mem:
        return None
    s = mem.get("stats") or {}
    cache = s.get("total_inactive_file", s.get("inactive_file", s.get("cache", 0)))
    return int(mem["usage"]) - int(cache)


def read_live(client: Any, name: str, stats: bool = False) -> LiveContainer | None:
    """The container `name` as it runs now, with its image, log and startup facts; None if there is none.
    Its secrets (env, --api-key) are registered with the masking formatter before anything quotes it."""
    import docker.errors

    try:
        c = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    secrets_of(env_of(c.attrs), live_argv(c.attrs))
    try:
        image = client.images.get(c.attrs["Image"]).attrs
    except docker.errors.ImageNotFound:
        image = {}
    logs = c.logs(stdout=True, stderr=True).decode(errors="replace")
    live = LiveContainer(name=name, attrs=c.attrs, image=image, logs=logs, facts=parse_log(logs))
    if stats:
        live.stats = c.stats(stream=False)
    return live
