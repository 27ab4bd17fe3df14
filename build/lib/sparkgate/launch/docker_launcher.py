"""The docker launcher: a recipe's server as a container on the target's docker engine.

Every change it makes to the box is written to the run journal (on the host) before it is made, and undone at
teardown by `undo()`, which works from the journal and the engine's state alone, so the same code restores the
box after this run, after an interrupt at any point, and after a run that died (the next run calls it):

- `set-aside`: a container of the recipe's name that differs from the recipe (production, usually) is stopped
  and renamed `<name>.sparkgate-saved`. Undo: rename it back (removing ours if it holds the name) and start it
  again if it was running.
- `create`: the recipe's container is created (labelled io.sparkgate.*), then started. Undo: remove it, and
  anything else carrying the suite's labels (`docker rm -f`: a restart policy resurrects a merely stopped one).

What it decides before touching anything (`plan()`): reuse a container that runs exactly the recipe at the
image the tag names now, else replace it; the memory it holds counts as free for the pre-flight, which runs
between plan() and start(), so a refused recipe never interrupts production. Never pulls unless asked.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..hostlock import Journal
from ..recipes import Recipe
from ..vllmlog import parse as parse_log
from .base import Progress, Server, StartError, wait_ready
from .container_spec import (
    LABEL,
    SAVED_SUFFIX,
    HostPaths,
    config_drift,
    docker_run,
    resident_bytes,
    run_kwargs,
)
from .docker_engine import DockerEngine

RETRIES = 5  # per undo step, reconnecting between attempts


class Refused(StartError):
    """An undo step the box's state rules out (not a connection problem): retrying would not help."""


@dataclass
class Plan:
    """What start() will do, decided before anything is touched."""

    reuse: Any = None  # a container already running exactly the recipe: tested as it is, left running
    replace: Any = None  # a container of the recipe's name that differs: set aside, restored at teardown
    drift: list[str] = field(default_factory=list)
    reclaimable_bytes: int = 0  # what `replace` holds, given back before the recipe starts
    notes: list[str] = field(default_factory=list)


@dataclass
class HostSide:
    """What the launcher needs to know of the host itself (not its engine): where its paths are, whether a path
    exists there, and the GPU memory (MiB) a container's processes hold (on unified memory: what its removal
    gives back)."""

    paths: HostPaths = field(default_factory=HostPaths)
    exists: Callable[[str], bool] = lambda _path: True
    gpu_mib: Callable[[str], int] = lambda _container_id: 0


class DockerLauncher:
    def __init__(self, recipe: Recipe, engine: DockerEngine, journal: Journal, host: HostSide | None = None) -> None:
        if not (recipe.image and recipe.container_name):
            raise StartError(f"{recipe.name}: a docker recipe needs `image` and `container_name`")
        self.recipe = recipe
        self.engine = engine
        self.journal = journal
        self.host = host or HostSide()
        self.run_id = uuid.uuid4().hex[:12]
        self.reused = False
        self.restored: str | None = None  # what stop() brought back, for the progress line
        self.progress: Progress = lambda _msg: None

    # ---- before anything is touched ----

    def plan(self, progress: Progress) -> Plan:
        import docker.errors

        r, client = self.recipe, self.engine.client
        name = r.container_name
        where = f"the docker engine of {self.engine.target}"
        try:
            tag_id = client.images.get(r.image).id
        except docker.errors.ImageNotFound:
            if not self.engine.pull:
                raise StartError(f"image {r.image} is not on {where}, and the suite never pulls unless asked: "
                                 f"`docker pull {r.image}` on the host, or run with --docker-pull") from None
            tag_id = None
        missing = [m for m in r.mods if not self.host.exists(f"{self.host.paths.expand(m.rstrip('/'))}/run.sh")]
        if missing:
            raise StartError(f"{r.name} needs the mod{'s' * (len(missing) > 1)} {', '.join(missing)} (a folder with "
                             f"a run.sh) on {self.engine.target}, and it is not there. Nothing was stopped or "
                             f"started. Clone https://github.com/eugr/spark-vllm-docker into ~/spark-vllm-docker "
                             f"on the host, or set the recipe's `mods` to where its mods are")
        try:
            left = client.containers.get(name + SAVED_SUFFIX)
        except docker.errors.NotFound:
            left = None
        if left is not None:
            raise StartError(f"a container {left.name} is on {where}: a run set {name} aside and did not bring "
                             f"it back, and no run journal says how. Restore it first: {restore_commands(name)}")
        try:
            existing = client.containers.get(name)
        except docker.errors.NotFound:
            existing = None
        if not _may_hold_port(existing, r.ports.get(r.port, r.port)) and self._port_answers():
            port = r.ports.get(r.port, r.port)
            raise StartError(f"port {port} already answers on {self.engine.address}: something other than "
                             f"{name} is serving there, and the recipe's server could not bind it. Nothing was "
                             f"stopped or started. Test it with --base-url http://{self.engine.address}:{port} "
                             f"--recipe {r.name}, or stop it first")
        if existing is None:
            return Plan()
        drift = config_drift(r, existing.attrs, tag_id)
        if not drift and existing.status == "running":
            return Plan(reuse=existing)
        held = 0
        if existing.status == "running":
            held = resident_bytes(existing.stats(stream=False)) or 0
            held += self.host.gpu_mib(existing.id) * 2**20
        return Plan(replace=existing, drift=drift or [f"status {existing.status}"], reclaimable_bytes=held)

    def _port_answers(self) -> bool:
        port = self.recipe.ports.get(self.recipe.port, self.recipe.port)
        with socket.socket() as s:
            s.settimeout(5)
            return s.connect_ex((self.engine.address, port)) == 0

    # ---- start ----

    def start(self, plan: Plan, progress: Progress, timeout_s: float) -> Server:
        import docker.errors

        r, client = self.recipe, self.engine.client
        self.progress = progress
        base_url = f"http://{self.engine.address}:{r.ports.get(r.port, r.port)}"
        if plan.reuse is not None:
            progress(f"{r.name}: container {r.container_name} already runs this recipe at the image its tag names "
                     "now; using it (it stays up)")
            self.reused = True
            server = self._server(base_url, plan.reuse)
            wait_ready(base_url, r.model.served_name, timeout_s, self._watch(plan.reuse, ours=False), progress,
                       r.name, server.api_key)
            return self._with_facts(server, plan.reuse)
        try:
            client.images.get(r.image)
        except docker.errors.ImageNotFound:
            progress(f"{r.name}: pulling {r.image} (--docker-pull)")
            client.images.pull(r.image)
        if plan.replace is not None:
            self._set_aside(plan.replace, plan.drift, progress)
        progress(f"{r.name}: {docker_run(r, self.host.paths)}")
        entry = self.journal.record("create", name=r.container_name, run=self.run_id, id=None)
        try:
            container = client.containers.create(**run_kwargs(r, self.run_id, self.host.paths))
            self.journal.update(entry, id=container.id)
            container.start()
        except docker.errors.APIError as exc:  # a port taken, a missing GPU runtime, a bad entrypoint
            raise StartError(f"the docker engine of {self.engine.target} would not start {r.container_name}: "
                             f"{exc.explanation or exc}") from None
        server = self._server(base_url, container)
        wait_ready(base_url, r.model.served_name, timeout_s, self._watch(container, ours=True), progress, r.name,
                   server.api_key)
        return self._with_facts(server, container)

    def _set_aside(self, existing: Any, drift: list[str], progress: Progress) -> None:
        name = existing.name
        running = existing.status in ("running", "restarting")  # a crash-looping one goes back to looping
        progress(f"{self.recipe.name}: container {name} ({existing.id[:12]}, {existing.status}) differs from the "
                 f"recipe ({'; '.join(drift)}): setting it aside as {name}{SAVED_SUFFIX}, restored at teardown")
        # Intent first: if the run dies between these steps, undo() finds it by id and puts it back as it was.
        self.journal.record("set-aside", name=name, id=existing.id, running=running)
        if running:
            existing.stop(timeout=30)  # a deliberate stop: unless-stopped leaves it stopped (and renamable)
        existing.rename(name + SAVED_SUFFIX)

    def _server(self, base_url: str, container: Any) -> Server:
        image = container.image
        facts = {"container": container.name, "container_id": container.id[:12], "image": self.recipe.image or "",
                 "image_id": image.id if image else "",
                 "image_digest": ", ".join(image.attrs.get("RepoDigests") or []) if image else ""}
        return Server(base_url=base_url, served_name=self.recipe.model.served_name, recipe=self.recipe,
                      started=not self.reused, facts=facts, container=container.name,
                      logs=lambda: self._get(container.id).logs(stdout=True, stderr=True).decode(errors="replace"),
                      api_key=self.recipe.args.api_key)

    def _with_facts(self, server: Server, container: Any) -> Server:
        server.facts.update(parse_log(container.logs().decode(errors="replace")).summary())
        return server

    def _get(self, container_id: str) -> Any:
        """The container by id on the engine's current connection (a dropped forward is reopened once)."""
        import requests

        try:
            return self.engine.client.containers.get(container_id)
        except (requests.ConnectionError, OSError) as exc:
            self.progress(f"{self.recipe.name}: the docker engine of {self.engine.target} did not answer "
                          f"({type(exc).__name__}); reconnecting")
            return self.engine.reconnect().containers.get(container_id)

    def _watch(self, container: Any, ours: bool) -> Callable[[], str | None]:
        """alive() for wait_ready: why the container is gone or looping, or None. Ours is removed at once."""
        import docker.errors

        def alive() -> str | None:
            nonlocal container
            try:
                container = self._get(container.id)
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
                what += f"; container {container.name} removed (docker rm -f)"
            return f"{what}; last lines of its log:\n{tail}"

        return alive

    # ---- teardown ----

    def stop(self, progress: Progress) -> bool:
        """Undo what this run did (from its journal), clear the journal. True if there was anything to undo."""
        entries = list(self.journal.entries)
        if not entries:
            return False
        done = undo(self.engine, entries, progress)
        self.restored = "; ".join(done) or None
        self.journal.clear()
        return True


def _may_hold_port(container: Any, port: int) -> bool:
    """Whether a running container could be what answers on the host's `port` (so replacing it frees it)."""
    if container is None or container.status != "running":
        return False
    host = container.attrs.get("HostConfig") or {}
    if host.get("NetworkMode") == "host":
        return True
    return any(str(b.get("HostPort")) == str(port) for binds in (host.get("PortBindings") or {}).values()
               for b in binds or [])


def restore_commands(name: str, ours_holds_name: bool = True, was_running: bool = True) -> str:
    """The commands that put a set-aside container back, for an operator to paste when the suite cannot."""
    cmds = ([f"docker rm -f {name}"] if ours_holds_name else []) + [f"docker rename {name}{SAVED_SUFFIX} {name}"]
    return "; ".join(cmds + ([f"docker start {name}"] if was_running else []))


def undo(engine: DockerEngine, entries: list[dict[str, Any]], progress: Progress) -> list[str]:
    """Put the box back as the journal says it was, newest change first, reconnecting and retrying each step.
    Returns what was done; raises StartError with the exact commands when a step truly cannot be done (the
    journal then stays on the host, for the next run)."""
    done: list[str] = []
    for entry in reversed(entries):
        if entry["kind"] == "create":
            _retry(engine, progress, lambda client, e=entry: _remove_ours(client, e), f"removing {entry['name']}")
            done.append(f"the recipe's container {entry['name']} removed")
        elif entry["kind"] == "set-aside":
            what = _retry(engine, progress, lambda client, e=entry: _put_back(client, e), f"restoring {entry['name']}",
                          give_up=restore_commands(entry["name"], was_running=entry["running"]))
            done.append(what)
    # Anything else a run created (a create interrupted before the journal heard its id); never what was restored.
    restored = {e["id"] for e in entries if e["kind"] == "set-aside"}
    leftovers = _retry(engine, progress, lambda client: _remove_labelled(client, restored),
                       "removing the suite's containers")
    if leftovers:
        done.append(f"removed left-over sparkgate containers: {', '.join(leftovers)}")
    return done


def _retry(engine: DockerEngine, progress: Progress, step: Callable[[Any], Any], what: str, give_up: str = "") -> Any:
    import docker.errors
    import requests

    last: Exception | None = None
    for attempt in range(RETRIES):
        try:
            return step(engine.client)
        except docker.errors.APIError as exc:
            if exc.status_code is not None and exc.status_code < 500:  # the engine said no: retrying won't help
                raise Refused(f"{what}: the docker engine refused: {exc.explanation or exc}"
                                 + (f". By hand: {give_up}" if give_up else "")) from None
            last = exc
        except Refused:
            raise
        except (requests.RequestException, OSError, StartError) as exc:  # the connection: reconnect, retry
            last = exc
        progress(f"{what}: the docker engine of {engine.target} did not answer ({type(last).__name__}); "
                 f"reconnecting, attempt {attempt + 2} of {RETRIES}")
        time.sleep(min(2**attempt, 8))
        try:
            engine.reconnect()
        except StartError as exc:
            last = exc
    raise StartError(f"{what} failed {RETRIES} times ({type(last).__name__}: {last}); the run journal stays on "
                     f"the host for the next run to finish it" + (f". By hand: {give_up}" if give_up else ""))


def _remove_ours(client: Any, entry: dict[str, Any]) -> None:
    import docker.errors

    for ref in filter(None, (entry.get("id"), entry["name"])):
        try:
            c = client.containers.get(ref)
        except docker.errors.NotFound:
            continue
        if ref == entry.get("id") or (c.labels or {}).get(f"{LABEL}.run") == entry.get("run"):
            c.remove(force=True)


def _put_back(client: Any, entry: dict[str, Any]) -> str:
    """The set-aside container back under its name, started again if it was running (idempotent)."""
    import docker.errors

    name = entry["name"]
    try:
        saved = client.containers.get(entry["id"])
    except docker.errors.NotFound:
        return (f"container {name} ({entry['id'][:12]}) was removed by someone else while set aside: nothing to "
                "restore")
    if saved.name != name:
        try:
            occupant = client.containers.get(name)
        except docker.errors.NotFound:
            occupant = None
        if occupant is not None and occupant.id != saved.id:
            if f"{LABEL}.run" not in (occupant.labels or {}):
                raise Refused(f"{name} is taken by a container the suite did not start ({occupant.id[:12]}); "
                              f"{saved.name} cannot be renamed back. By hand: {restore_commands(name)}")
            occupant.remove(force=True)
        saved.rename(name)
    saved.reload()
    if entry["running"] and saved.status != "running":
        saved.start()
        return f"container {name} ({saved.id[:12]}) restored and started again"
    return f"container {name} ({saved.id[:12]}) restored" + ("" if entry["running"] else " (it was not running)")


def _remove_labelled(client: Any, keep: set[str]) -> list[str]:
    found = [c for c in client.containers.list(all=True, filters={"label": f"{LABEL}.run"}) if c.id not in keep]
    for c in found:
        c.remove(force=True)
    return [c.name for c in found]
