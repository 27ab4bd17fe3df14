"""The docker launcher: a recipe's server as a container on the target's docker engine, through the docker SDK.

- Never pulls an image unless the operator asks (--docker-pull): an image that is not on the engine refuses.
- Runs exactly what the recipe says: name, image, entrypoint, [model, *serve_args], env, restart policy, GPU
  request, ipc, network, ports, volumes, with an init (so a stop is prompt) and sparkgate labels.
- A container of the recipe's name that already runs with the recipe's live config is reused and left running.
  Any other container of that name is recorded, stopped, renamed aside (`<name>.sparkgate-saved`) and, at
  teardown, renamed back and started again if it was running.
- The memory arithmetic (weights + pinned KV + overhead against MemAvailable) runs before the recipe's container
  is created, after a container it replaces has stopped; a refused recipe starts nothing, and what was set
  aside is brought back.
- While waiting for readiness, a container that exits or restarts fails at once with its log tail and is
  removed with force: a restart policy resurrects a merely stopped container.

The engine of a remote --host is reached through OpenSSH with the suite's own ssh options (--ssh-config,
--ssh-identity-file): the engine's unix socket is forwarded to a local socket (`ssh -L local.sock:remote.sock`),
which the SDK uses. The SDK's own ssh:// support reads only ~/.ssh/config, so it would miss those options;
`--docker-host` (any DOCKER_HOST URL, ssh:// included) overrides the forward.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .recipes import GIB, Recipe
from .server import Progress, Server, StartError, wait_ready
from .vllmlog import StartupFacts
from .vllmlog import parse as parse_log

SAVED_SUFFIX = ".sparkgate-saved"
LABEL = "io.sparkgate"
DOCKER_ARCH = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "amd64", "amd64": "amd64"}


# ---- the engine ------------------------------------------------------------------------------------------

class DockerEngine:
    """The docker engine of the box under test, opened on first use and closed by close()."""

    def __init__(self, target: str, ssh_config: str | None = None, identity_file: str | None = None,
                 docker_host: str | None = None, pull: bool = False, remote_socket: str = "/var/run/docker.sock"):
        self.target = target
        self.ssh_config, self.identity_file = ssh_config, identity_file
        self.docker_host = docker_host
        self.pull = pull
        self.remote_socket = remote_socket
        self._tunnel: subprocess.Popen[bytes] | None = None
        self._tmp: str | None = None

    @property
    def local(self) -> bool:
        return self.target in ("local", "local://")

    def _ssh_base(self) -> list[str]:
        cmd = ["ssh"]
        if self.ssh_config:
            cmd += ["-F", self.ssh_config]
        if self.identity_file:
            cmd += ["-i", self.identity_file]
        if self.target.startswith("ssh://"):
            rest = self.target[len("ssh://"):]
            hostport = rest.rsplit("@", 1)[-1]
            if ":" in hostport:
                host, port = hostport.rsplit(":", 1)
                return [*cmd, "-p", port, rest[: len(rest) - len(hostport)] + host]
            return [*cmd, rest]
        return [*cmd, self.target]

    @cached_property
    def address(self) -> str:
        """Where the host's published ports answer, from here."""
        if self.docker_host and "://" in self.docker_host and not self.docker_host.startswith(("unix:", "npipe:")):
            host = self.docker_host.split("://", 1)[1].rsplit("@", 1)[-1].split("/")[0]
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        if self.local:
            return "127.0.0.1"
        base = self._ssh_base()
        out = subprocess.run([*base[:-1], "-G", base[-1]], capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key == "hostname":
                return value.strip()
        return base[-1].rsplit("@", 1)[-1]

    @cached_property
    def client(self) -> Any:
        import docker

        try:
            if self.docker_host:
                client = docker.DockerClient(base_url=self.docker_host, use_ssh_client=True)
            elif self.local:
                client = docker.from_env()
            else:
                client = docker.DockerClient(base_url=f"unix://{self._forward()}")
            client.ping()
        except Exception as exc:  # the SDK raises several kinds; one message says which engine and why
            self.close()
            raise StartError(f"cannot reach the docker engine of {self.target}: {type(exc).__name__}: {exc}") from None
        return client

    def _forward(self) -> str:
        """A local unix socket forwarded by OpenSSH to the engine's socket on the target."""
        self._tmp = tempfile.mkdtemp(prefix="sparkgate-docker-")
        sock = os.path.join(self._tmp, "docker.sock")
        base = self._ssh_base()
        # Its own connection (no ControlMaster): the forward lives exactly as long as this process.
        cmd = [*base[:-1], "-N", "-o", "ExitOnForwardFailure=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none",
               "-o", "StreamLocalBindUnlink=yes", "-L", f"{sock}:{self.remote_socket}", base[-1]]
        self._tunnel = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not os.path.exists(sock):
            if self._tunnel.poll() is not None:
                err = self._tunnel.stderr.read().decode(errors="replace") if self._tunnel.stderr else ""
                raise StartError(f"ssh could not forward the docker socket of {self.target}: {err.strip()}")
            if time.monotonic() > deadline:
                raise StartError(f"ssh did not forward the docker socket of {self.target} within 30 s")
            time.sleep(0.05)
        return sock

    def close(self) -> None:
        if "client" in self.__dict__:
            with contextlib.suppress(Exception):
                self.__dict__.pop("client").close()
        if self._tunnel is not None:
            if self._tunnel.poll() is None:
                self._tunnel.terminate()
                try:
                    self._tunnel.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._tunnel.kill()
                    self._tunnel.wait()
            self._tunnel = None
        if self._tmp:
            with contextlib.suppress(OSError):
                for f in os.listdir(self._tmp):
                    os.unlink(os.path.join(self._tmp, f))
                os.rmdir(self._tmp)
            self._tmp = None


# ---- what a recipe means for a container -----------------------------------------------------------------

def expected_args(recipe: Recipe) -> list[str]:
    """What follows the entrypoint: the model, then the serve args."""
    return [recipe.model.id, *recipe.serve_args]


def required_env(recipe: Recipe) -> dict[str, str]:
    """The recipe's env plus what its image and quantization need on this hardware (the guide's findings)."""
    env = dict(recipe.env)
    if recipe.image and "vllm-openai:nightly" in recipe.image:
        env.setdefault("CUTE_DSL_ARCH", "sm_121a")  # GB10's cutlass kernels; a generic image lacks it
    if recipe.model.quantization.lower().replace("_", "-").startswith("int4-autoround"):
        env.setdefault("VLLM_MARLIN_USE_ATOMIC_ADD", "1")  # the int4-AutoRound Marlin kernels
    return env


def run_kwargs(recipe: Recipe) -> dict[str, Any]:
    """docker SDK containers.run() arguments for the recipe (never pulls: run() is called on a present image)."""
    from docker.types import DeviceRequest

    binds: dict[str, dict[str, str]] = {}
    for spec in recipe.volumes:
        parts = spec.split(":")
        binds[parts[0]] = {"bind": parts[1], "mode": parts[2] if len(parts) > 2 else "rw"}
    kw: dict[str, Any] = dict(
        image=recipe.image, name=recipe.container_name, command=expected_args(recipe), environment=recipe.env,
        restart_policy={"Name": recipe.restart} if recipe.restart != "no" else {"Name": ""},
        network_mode=recipe.network, volumes=binds, init=True, detach=True,
        labels={LABEL + ".recipe": recipe.name, LABEL + ".digest": recipe.digest},
    )
    if recipe.entrypoint is not None:
        kw["entrypoint"] = recipe.entrypoint
    if recipe.ipc:
        kw["ipc_mode"] = recipe.ipc
    if recipe.ports:
        kw["ports"] = {f"{c}/tcp": h for c, h in recipe.ports.items()}
    if recipe.gpus == "all":
        kw["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return kw


def docker_run(recipe: Recipe) -> str:
    """The `docker run` that run_kwargs() stands for, for an operator to read before anything starts (the
    launcher's bookkeeping labels left out)."""
    ep = recipe.entrypoint or []
    parts = ["docker", "run", "-d", "--name", recipe.container_name or "", "--restart", recipe.restart, "--init"]
    if recipe.ipc:
        parts += ["--ipc", recipe.ipc]
    parts += ["--network", recipe.network]
    if recipe.gpus == "all":
        parts += ["--gpus", "all"]
    for container_port, host_port in recipe.ports.items():
        parts += ["-p", f"{host_port}:{container_port}"]
    for volume in recipe.volumes:
        parts += ["-v", volume]
    if ep:
        parts += ["--entrypoint", ep[0]]  # the rest of the entrypoint leads the command
    for key, value in recipe.env.items():
        parts += ["-e", f"{key}={value}"]
    return shlex.join([*parts, recipe.image or "", *ep[1:], *expected_args(recipe)])


def _flags(argv: list[str]) -> dict[str, list[str]]:
    """`--flag value`, `--flag=value` and bare `--switch` (value '') into flag -> values, in order."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                k, v = a, argv[i + 1]
                i += 1
            else:
                k, v = a, ""
            out.setdefault(k, []).append(v)
        else:
            out.setdefault("(positional)", []).append(a)
        i += 1
    return out


def _same(a: str, b: str) -> bool:
    if a == b:
        return True
    try:  # JSON values compare as values: spacing and key order are not drift
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


def live_argv(attrs: dict[str, Any]) -> list[str]:
    """The container's full command: entrypoint + cmd (a `sh -c "..."` command is split as the shell would)."""
    cfg = attrs.get("Config") or {}
    argv = [*(cfg.get("Entrypoint") or []), *(cfg.get("Cmd") or [])]
    for i, a in enumerate(argv):
        if a == "-c" and i + 1 < len(argv) and os.path.basename(argv[i - 1] if i else "") in ("sh", "bash"):
            return shlex.split(argv[i + 1])
    return argv


def live_serve_args(recipe: Recipe, attrs: dict[str, Any]) -> list[str] | None:
    """What follows the model in the running command; None when the model is not in it."""
    argv = live_argv(attrs)
    for i, a in enumerate(argv):
        if a == recipe.model.id:
            return argv[i + 1:]
    if "--model" in argv:  # `python -m ... --model M args` with the model as a flag
        i = argv.index("--model")
        return argv[i + 2:] if argv[i + 1:i + 2] == [recipe.model.id] else None
    return None


def arg_drift(recipe: Recipe, attrs: dict[str, Any]) -> list[str]:
    """Each difference between the recipe's serve args and the running container's, one line each."""
    live = live_serve_args(recipe, attrs)
    if live is None:
        return [f"model: recipe {recipe.model.id}, running command {shlex.join(live_argv(attrs))}"]
    want, have = _flags(recipe.serve_args), _flags(live)
    out = []
    for flag in dict.fromkeys([*want, *have]):
        w, h = want.get(flag), have.get(flag)
        if w is None:
            out.append(f"{flag}: not in the recipe, running with {' '.join(map(repr, h or []))}")
        elif h is None:
            out.append(f"{flag}: recipe {' '.join(map(repr, w))}, not in the running command")
        elif len(w) != len(h) or not all(_same(a, b) for a, b in zip(w, h, strict=True)):
            out.append(f"{flag}: recipe {' '.join(map(repr, w))}, running {' '.join(map(repr, h))}")
    return out


def env_of(attrs: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in (attrs.get("Config") or {}).get("Env") or []:
        k, _, v = item.partition("=")
        env[k] = v
    return env


def env_drift(recipe: Recipe, attrs: dict[str, Any]) -> list[str]:
    live = env_of(attrs)
    out = []
    for k, v in required_env(recipe).items():
        if k not in live:
            out.append(f"{k} missing (want {k}={v})")
        elif live[k] != v:
            out.append(f"{k}={live[k]} (want {k}={v})")
    return out


def config_drift(recipe: Recipe, attrs: dict[str, Any]) -> list[str]:
    """Every way the live container differs from what the launcher would start (decides reuse)."""
    cfg, host = attrs.get("Config") or {}, attrs.get("HostConfig") or {}
    out = []
    if cfg.get("Image") != recipe.image:
        out.append(f"image {cfg.get('Image')} (recipe {recipe.image})")
    if recipe.entrypoint is not None and (cfg.get("Entrypoint") or []) != recipe.entrypoint:
        out.append(f"entrypoint {cfg.get('Entrypoint')} (recipe {recipe.entrypoint})")
    out += [f"serve args: {d}" for d in arg_drift(recipe, attrs)]
    out += [f"env {d}" for d in env_drift(recipe, attrs)]
    policy = (host.get("RestartPolicy") or {}).get("Name") or "no"
    if policy != recipe.restart:
        out.append(f"restart policy {policy} (recipe {recipe.restart})")
    if host.get("NetworkMode") != recipe.network:
        out.append(f"network {host.get('NetworkMode')} (recipe {recipe.network})")
    return out


def kv_pin_bytes(args: list[str], env: dict[str, str]) -> int | None:
    """The KV cache pin: --kv-cache-memory[-bytes] (bytes, k/M/G/T or Ki/Mi/Gi/Ti suffixes), else the CPU
    engine's VLLM_CPU_KVCACHE_SPACE (GiB). None: nothing binds the KV cache."""
    flags = _flags(args)
    for flag in ("--kv-cache-memory", "--kv-cache-memory-bytes"):
        if flags.get(flag):
            return _bytes(flags[flag][-1])
    if env.get("VLLM_CPU_KVCACHE_SPACE"):
        return int(float(env["VLLM_CPU_KVCACHE_SPACE"]) * GIB)
    return None


def _bytes(text: str) -> int:
    t = text.strip()
    if len(t) > 2 and t[-1] in "bB" and t[-2].isalpha():  # 16GiB, 16GB: the B is the unit's
        t = t[:-1]
    units = {"ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4, "k": 10**3, "m": 10**6, "g": 10**9,
             "t": 10**12}
    for suffix, mult in units.items():
        if t.lower().endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(float(t))


def gguf_of_gdn_hybrid(recipe: Recipe) -> str | None:
    """Why the recipe cannot be served, when it would serve a GGUF of a Gated DeltaNet hybrid; else None."""
    m = recipe.model
    gguf = (m.format == "gguf" or m.id.lower().endswith(".gguf") or recipe.arg("--quantization") == "gguf"
            or recipe.arg("--load-format") == "gguf")
    if not (gguf and m.gdn_hybrid):
        return None
    return (f"refusing to start {recipe.name}: it serves a GGUF of {m.id}, a Gated DeltaNet hybrid. vLLM has no "
            f"GGUF support for GDN hybrids (in-tree GGUF was removed in v0.24.0; vllm-gguf-plugin does not know "
            f"the architecture), so the weights are dequantised to bf16 (about 160 GB for the 80B model): it "
            f"cannot fit, and under a restart policy it OOMs, restarts and livelocks the box. Serve a natively "
            f"quantized checkpoint (int4-AutoRound, AWQ, FP8, NVFP4) instead, or a GGUF with llama.cpp.")


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
    server: Server | None = None  # the server it runs, as the tests were handed it

    @property
    def restart_policy(self) -> str:
        return ((self.attrs.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "no"

    @property
    def env(self) -> dict[str, str]:
        return env_of(self.attrs)

    @property
    def memory_bytes(self) -> int | None:
        """Resident memory of the container's cgroup, page cache excluded (as docker stats shows it)."""
        mem = (self.stats or {}).get("memory_stats") or {}
        if "usage" not in mem:
            return None
        s = mem.get("stats") or {}
        cache = s.get("total_inactive_file", s.get("inactive_file", s.get("cache", 0)))
        return int(mem["usage"]) - int(cache)


def read_live(client: Any, name: str, stats: bool = False) -> LiveContainer | None:
    """The container `name` as it runs now, with its image, log and startup facts; None if there is none."""
    import docker.errors

    try:
        c = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    try:
        image = client.images.get(c.attrs["Image"]).attrs
    except docker.errors.ImageNotFound:
        image = {}
    logs = c.logs(stdout=True, stderr=True).decode(errors="replace")
    live = LiveContainer(name=name, attrs=c.attrs, image=image, logs=logs, facts=parse_log(logs))
    if stats:
        live.stats = c.stats(stream=False)
    return live


# ---- the launcher ----------------------------------------------------------------------------------------

class DockerLauncher:
    def __init__(self, recipe: Recipe, engine: DockerEngine, preflight: Callable[[], None] | None = None) -> None:
        if not (recipe.image and recipe.container_name):
            raise StartError(f"{recipe.name}: a docker recipe needs `image` and `container_name`")
        self.recipe = recipe
        self.engine = engine
        self.preflight = preflight
        self.container: Any = None  # the one we started
        self.reused = False
        self.saved: dict[str, Any] | None = None  # the one we set aside, to bring back
        self.restored: str | None = None  # what stop() brought back, for the progress line

    def start(self, progress: Progress, timeout_s: float) -> Server:
        import docker.errors

        r = self.recipe
        name = r.container_name
        if why := gguf_of_gdn_hybrid(r):
            raise StartError(why)
        client = self.engine.client
        where = f"the docker engine of {self.engine.target}"
        try:
            client.images.get(r.image)
        except docker.errors.ImageNotFound:
            if not self.engine.pull:
                raise StartError(f"image {r.image} is not on {where}, and the suite never pulls unless asked: "
                                 f"`docker pull {r.image}` on the host, or run with --docker-pull") from None
            progress(f"{r.name}: pulling {r.image} (--docker-pull)")
            client.images.pull(r.image)
        with contextlib.suppress(docker.errors.NotFound):
            left = client.containers.get(name + SAVED_SUFFIX)
            raise StartError(
                f"a container {left.name} is on {where}: an earlier run set aside {name} and did not bring it "
                f"back. Restore it first: docker rm -f {name}; docker rename {left.name} {name}; docker start {name}")
        existing = None
        with contextlib.suppress(docker.errors.NotFound):
            existing = client.containers.get(name)
        base_url = f"http://{self.engine.address}:{r.ports.get(r.port, r.port)}"
        if existing is not None:
            drift = config_drift(r, existing.attrs)
            if not drift and existing.status == "running":
                progress(f"{r.name}: container {name} already runs this recipe; using it (it stays up)")
                self.reused = True
                server = self._server(base_url, existing)
                wait_ready(base_url, r.model.served_name, timeout_s, self._watch(existing, ours=False),
                           progress, r.name)
                return self._with_facts(server, existing)
        if existing is not None:
            self._set_aside(existing, drift or [f"status {existing.status}"], progress)
        if self.preflight:
            # The memory arithmetic, before anything starts; after what it replaces has stopped (that one's
            # memory is free again), which stop() restores if the recipe is refused.
            self.preflight()
        progress(f"{r.name}: {docker_run(r)}")
        try:
            self.container = client.containers.run(**run_kwargs(r))
        except docker.errors.APIError as exc:  # a bad volume path, a missing GPU runtime, a name taken meanwhile
            raise StartError(f"{where} would not start {name}: {exc.explanation or exc}") from None
        server = self._server(base_url, self.container)
        wait_ready(base_url, r.model.served_name, timeout_s, self._watch(self.container, ours=True), progress,
                   r.name)
        return self._with_facts(server, self.container)

    def _server(self, base_url: str, container: Any) -> Server:
        image = container.image
        facts = {"container": container.name, "container_id": container.id[:12], "image": self.recipe.image or "",
                 "image_id": image.id if image else "",
                 "image_digest": ", ".join(image.attrs.get("RepoDigests") or []) if image else ""}
        return Server(base_url=base_url, served_name=self.recipe.model.served_name, recipe=self.recipe,
                      started=not self.reused, facts=facts, container=container.name,
                      logs=lambda: container.logs(stdout=True, stderr=True).decode(errors="replace"))

    def _with_facts(self, server: Server, container: Any) -> Server:
        server.facts.update(parse_log(container.logs().decode(errors="replace")).summary())
        return server

    def _watch(self, container: Any, ours: bool) -> Callable[[], str | None]:
        """alive() for wait_ready: why the container is gone or looping, or None. Ours is removed at once."""
        import docker.errors

        def alive() -> str | None:
            try:
                container.reload()
            except docker.errors.NotFound:
                return "the container was removed"
            state, restarts = container.attrs["State"], container.attrs.get("RestartCount", 0)
            if state["Status"] not in ("exited", "dead") and not state.get("Restarting") and not restarts:
                return None
            tail = container.logs(tail=30).decode(errors="replace")
            what = (f"status {state['Status']}, exit code {state.get('ExitCode')}, restart count {restarts} "
                    f"(restart policy {(container.attrs['HostConfig'].get('RestartPolicy') or {}).get('Name')})")
            if ours:
                container.remove(force=True)  # docker rm -f: a stopped one would be resurrected
                self.container = None
                what += f"; container {container.name} removed (docker rm -f)"
            return f"{what}; last lines of its log:\n{tail}"

        return alive

    def _set_aside(self, existing: Any, drift: list[str], progress: Progress) -> None:
        name = existing.name
        running = existing.status == "running"
        self.saved = {"id": existing.id, "name": name, "running": running,
                      "image": (existing.attrs.get("Config") or {}).get("Image")}
        progress(f"{self.recipe.name}: container {name} ({existing.id[:12]}, {existing.status}) differs from the "
                 f"recipe ({'; '.join(drift)}): setting it aside as {name}{SAVED_SUFFIX}, restored at teardown")
        if running:
            existing.stop(timeout=30)  # a deliberate stop: unless-stopped leaves it stopped
        existing.rename(name + SAVED_SUFFIX)

    def stop(self) -> bool:
        """Remove what start() started, then bring back what it set aside. True if anything was done."""
        import docker.errors

        did = False
        if self.container is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self.container.remove(force=True)
            self.container = None
            did = True
        if self.saved is not None:
            c = self.engine.client.containers.get(self.saved["id"])
            c.rename(self.saved["name"])
            if self.saved["running"]:
                c.start()
            self.restored = (f"container {self.saved['name']} ({c.id[:12]}) restored"
                             + (" and started again" if self.saved["running"] else " (it was not running)"))
            self.saved = None
            did = True
        return did

