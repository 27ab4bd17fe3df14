"""The docker launcher: a recipe's server as a container on the target's docker engine.

Every change it makes to the box is written to the run journal (on the host) before it is made, and undone at
teardown by `undo()`, which works from the journal and the engine's state alone, so the same code restores the
box after this run, after an interrupt at any point, and after a run that died (the next run calls it):

- `set-aside` (only with --take-over, or for a container that is not running): what holds the recipe's name or
  port and differs from it (production, usually) is stopped and renamed `<name>.sparkgate-saved`, once per run:
  it stays aside until the run's last recipe is done. Undo: rename it back (removing ours if it holds the name),
  start it again if it was running, and (the run's) wait until it serves again.
- `create`: the recipe's container is created (labelled io.sparkgate.*), then started. Undo: remove it, and
  anything else carrying the suite's labels (`docker rm -f`: a restart policy resurrects a merely stopped one).

What it decides before touching anything (`plan()`): what serves the recipe's model on its port is tested in place
(never stopped, restarted or renamed); a recipe that could only run with production down is NeedsTakeOver (could
not run, with the downtime it would cost) unless the run may take over; a replaced container's memory counts as
free for the pre-flight, which runs between plan() and start(), so a refused recipe never interrupts production.
Never pulls unless asked.
"""

from __future__ import annotations

import shlex
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..hostlock import Journal
from ..recipes import Recipe
from ..vllmlog import parse as parse_log
from .base import NeedsTakeOver, Occupied, Progress, Server, StartError, first_token, served_names, wait_ready
from .container_spec import (
    LABEL,
    SAVED_SUFFIX,
    HostPaths,
    config_drift,
    docker_run,
    live_argv,
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

    reuse: Any = None  # a running container tested in place (exactly the recipe, or serving its model): left running
    in_place: bool = False  # what serves the recipe's model on its port (a container, or a process) is tested as is
    replace: Any = None  # a container of the recipe's name or port that differs: set aside until the run's end
    served: list[str] | None = None  # what `replace` served on the port (None: nothing answered)
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
    def __init__(self, recipe: Recipe, engine: DockerEngine, journal: Journal, host: HostSide | None = None, *,
                 take_over: bool = False, last_start: Callable[[str], float | None] = lambda _name: None) -> None:
        if not (recipe.image and recipe.container_name):
            raise StartError(f"{recipe.name}: a docker recipe needs `image` and `container_name`")
        self.recipe = recipe
        self.engine = engine
        self.journal = journal
        self.host = host or HostSide()
        self.take_over = take_over
        self.last_start = last_start  # seconds the suite last took to bring a recipe to serving here, if known
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
        if left is not None and left.id not in self._set_aside_ids():
            raise StartError(f"a container {left.name} is on {where}: a run set {name} aside and did not bring "
                             f"it back, and no run journal says how. Restore it first: {restore_commands(name)}")
        try:
            existing = client.containers.get(name)
        except docker.errors.NotFound:
            existing = None
        drift = config_drift(r, existing.attrs, tag_id) if existing is not None else []
        if existing is not None and existing.status == "running" and not drift:
            return Plan(reuse=existing)
        port = self.port
        holder = existing if _may_hold_port(existing, port) else self._port_holder(port)
        if holder is not None and holder is not existing:
            drift = config_drift(r, holder.attrs, tag_id)
        serves = served_names(self.base_url, r.args.api_key)
        if serves is not None:  # something serves on the recipe's port
            # In place only when it is the recipe's model on the recipe's image (never for a candidate --image or a
            # newer build of the tag: the old one would be measured as the new); a process is always tested in place.
            same_image = holder is None or not any(d.startswith("image ") for d in drift)
            if r.model.served_name in serves and same_image and (not self.take_over or holder is None):
                return Plan(reuse=holder, in_place=True, drift=drift if holder is not None else [])
            if holder is None:
                raise Occupied(f"port {port} on {self.engine.address} is served by a process, not a container of "
                               f"{where} (it serves {', '.join(serves) or 'no model list'}, not "
                               f"{r.model.served_name}): the suite never stops what it did not start. Nothing was "
                               "stopped or started")
            if not self.take_over:
                raise NeedsTakeOver(self._downtime(holder, serves))
            return Plan(replace=holder, drift=drift if holder is existing else [f"serves {serves} on port {port}"],
                        reclaimable_bytes=self._held(holder), served=serves)
        if holder is not None and holder is not existing:  # loading, or in restart back-off: it will want the port
            if not self.take_over:
                raise NeedsTakeOver(self._downtime(holder, None))
            return Plan(replace=holder, drift=[f"holds port {port} ({holder.status}), not serving yet"],
                        reclaimable_bytes=self._held(holder))
        if existing is None:
            return Plan()
        if existing.status in ("running", "restarting") and not self.take_over:
            raise NeedsTakeOver(self._downtime(existing, None))
        return Plan(replace=existing, drift=drift or [f"status {existing.status}"],
                    reclaimable_bytes=self._held(existing) if existing.status == "running" else 0)

    @property
    def port(self) -> int:
        return self.recipe.ports.get(self.recipe.port, self.recipe.port)

    @property
    def base_url(self) -> str:
        return f"http://{self.engine.address}:{self.port}"

    def _set_aside_ids(self) -> set[str]:
        return {e["id"] for e in self.journal.entries if e.get("kind") == "set-aside"}

    def _port_holder(self, port: int) -> Any:
        """The running container that serves on the host's `port`: one publishing it, or one on the host network
        whose vLLM command names it (vLLM's default is 8000); None when no container does."""
        for c in self.engine.client.containers.list():
            if not _may_hold_port(c, port):
                continue
            if (c.attrs.get("HostConfig") or {}).get("NetworkMode") != "host" or _vllm_port(c.attrs) == port:
                return c
        return None

    def _held(self, container: Any) -> int:
        """The memory a running container holds (its cgroup's, plus its processes' GPU memory), in bytes."""
        return (resident_bytes(container.stats(stream=False)) or 0) + self.host.gpu_mib(container.id) * 2**20

    def _downtime(self, holder: Any, serves: list[str] | None) -> str:
        """Why the recipe could not run in place, and what taking production over would cost."""
        r = self.recipe
        if serves is None:
            what = f"holds port {self.port} or the recipe's container name ({holder.status}, not serving yet)"
        elif r.model.served_name in serves:
            image = "; ".join(d for d in config_drift(r, holder.attrs) if d.startswith("image "))
            what = f"serves {r.model.served_name} on port {self.port}, not on the recipe's image ({image})"
        else:
            what = (f"serves {', '.join(serves) or 'something that is no model list'} on port {self.port}, not "
                    f"{r.model.served_name}")
        return f"container {holder.name} ({holder.id[:12]}) {what}: {self._cost(holder)}. Nothing was stopped"

    def _cost(self, holder: Any) -> str:
        """How long serving this recipe keeps `holder` down: this recipe's start (as last measured here, else its
        weights) and the holder's own start again (from its log)."""
        r = self.recipe
        own = startup_seconds(holder)
        last = self.last_start(r.name)
        theirs = (f"{last:.0f} s when this suite last brought it up here" if last is not None else
                  f"not measured here yet: {r.model.disk_gib:g} GiB of weights to load, then graph capture (on a "
                  "Spark, minutes)")
        back = f"{own:.0f} s, its own last start (its log)" if own is not None else "unknown (its log does not say)"
        total = f"about {(last + own) / 60:.1f} min" if last is not None and own is not None else "several minutes"
        return (f"serving {r.name} would take {holder.name} down for at least {total} plus {r.name}'s checks "
                f"(and the run's later recipes': it comes back after the last; {r.name}'s start: {theirs}; "
                f"{holder.name}'s start again: {back})")

    def _port_answers(self) -> bool:
        with socket.socket() as s:
            s.settimeout(5)
            return s.connect_ex((self.engine.address, self.port)) == 0

    def _wait_port_free(self, timeout_s: float = 60) -> None:
        """The recipe's server must be the only one on its port: its readiness then comes from it alone."""
        deadline = time.monotonic() + timeout_s
        while self._port_answers():
            if time.monotonic() > deadline:
                raise StartError(f"port {self.port} on {self.engine.address} still answers after {timeout_s:.0f} s "
                                 f"of waiting for it to be free: a server the suite does not know holds it. Nothing "
                                 f"of {self.recipe.name} was started")
            time.sleep(1)

    # ---- start ----

    def start(self, plan: Plan, progress: Progress, timeout_s: float) -> Server:
        import docker.errors

        r, client = self.recipe, self.engine.client
        self.progress = progress
        base_url = self.base_url
        if plan.in_place:
            held = f"container {plan.reuse.name} ({plan.reuse.id[:12]})" if plan.reuse is not None else "a process"
            progress(f"{r.name}: {held} serves {r.model.served_name} on port {self.port}: testing it in place as it "
                     "runs (not stopped, restarted or renamed)" + (
                         f"; it differs from the recipe ({'; '.join(plan.drift)}): --take-over serves the recipe "
                         "exactly instead" if plan.drift else ""))
        elif plan.reuse is not None:
            progress(f"{r.name}: container {r.container_name} already runs this recipe at the image its tag names "
                     "now; using it (it stays up)")
        if plan.reuse is not None or plan.in_place:
            self.reused = True
            server = self._server(base_url, plan.reuse)
            alive = self._watch(plan.reuse, ours=False) if plan.reuse is not None else lambda: None
            wait_ready(base_url, r.model.served_name, timeout_s, alive, progress, r.name, server.api_key)
            return self._with_facts(server, plan.reuse)
        try:
            client.images.get(r.image)
        except docker.errors.ImageNotFound:
            self._pull(progress)
        if plan.replace is not None:
            self._set_aside(plan.replace, plan.drift, plan.served, progress)
        self._wait_port_free()
        progress(f"{r.name}: {docker_run(r, self.host.paths)}")
        entry = self.journal.record("create", name=r.container_name, run=self.run_id, id=None)
        try:
            container = client.containers.create(**run_kwargs(r, self.run_id, self.host.paths))
            self.journal.update(entry, id=container.id)
            started = time.monotonic()
            container.start()
        except docker.errors.APIError as exc:  # a port taken, a missing GPU runtime, a bad entrypoint
            raise StartError(f"the docker engine of {self.engine.target} would not start {r.container_name}: "
                             f"{exc.explanation or exc}") from None
        server = self._server(base_url, container)
        took = wait_ready(base_url, r.model.served_name, timeout_s, self._watch(container, ours=True), progress, r.name,
                          server.api_key, log=server.log_text)
        server.facts["load_s"] = f"{took:.1f}"
        seconds, why = first_token(server, started)
        if seconds is not None:
            server.facts["first_answer_s"] = f"{seconds:.1f}"  # no "token" in a key: the results mask those
            progress(f"  {r.name}: the first token of a streamed answer came {seconds:.0f} s after the start")
        else:
            server.facts["first_answer"] = f"none after the start: {why}"
        return self._with_facts(server, container)

    def _pull(self, progress: Progress) -> None:
        """docker pull, saying how far it is (bytes of all layers) every 10 s: a Spark image is ~20 GB."""
        image = self.recipe.image or ""
        repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
        progress(f"{self.recipe.name}: pulling {image} (--docker-pull)")
        start = last = time.monotonic()
        layers: dict[str, tuple[int, int]] = {}
        for event in self.engine.client.api.pull(repo, tag=tag, stream=True, decode=True):
            if "error" in event:
                raise StartError(f"docker pull {image} failed: {event['error']}")
            detail = event.get("progressDetail") or {}
            if event.get("id") and detail.get("total"):
                layers[event["id"]] = (int(detail.get("current", 0)), int(detail["total"]))
            if time.monotonic() - last >= 10 and layers:
                last = time.monotonic()
                done, total = sum(c for c, _ in layers.values()), sum(t for _, t in layers.values())
                progress(f"  {self.recipe.name}: pulling {image}: {done / 1e9:.2f} of {total / 1e9:.2f} GB in "
                         f"{len(layers)} layers ({last - start:.0f} s)")
        progress(f"{self.recipe.name}: pulled {image} in {time.monotonic() - start:.0f} s")

    def _set_aside(self, existing: Any, drift: list[str], served: list[str] | None, progress: Progress) -> None:
        existing.reload()  # as it is now: a pull may have taken minutes since the plan
        name = existing.name
        running = existing.status in ("running", "restarting")  # a crash-looping one goes back to looping
        progress(f"{self.recipe.name}: container {name} ({existing.id[:12]}, {existing.status}) differs from the "
                 f"recipe ({'; '.join(drift)}): setting it aside as {name}{SAVED_SUFFIX} until the run's last recipe "
                 f"is done (--take-over): {self._cost(existing)}")
        # Intent first: if the run dies between these steps, undo() finds it by id and puts it back as it was. What
        # it served, on which port, and its own start time: the run waits for it to serve again, as long as that.
        self.journal.record("set-aside", name=name, id=existing.id, running=running, recipe=self.recipe.name,
                            served=served or [], port=self.port, load_s=startup_seconds(existing),
                            down_at=time.time())
        if running:
            existing.stop(timeout=30)  # a deliberate stop: unless-stopped leaves it stopped (and renamable)
        existing.rename(name + SAVED_SUFFIX)

    def _server(self, base_url: str, container: Any) -> Server:
        if container is None:  # a process serves on the port: tested in place, nothing of it is the suite's
            return Server(base_url=base_url, served_name=self.recipe.model.served_name, recipe=self.recipe,
                          started=False, api_key=self.recipe.args.api_key)
        image = container.image
        facts = {"container": container.name, "container_id": container.id[:12], "image": self.recipe.image or "",
                 "image_id": image.id if image else "",
                 "image_digest": ", ".join(image.attrs.get("RepoDigests") or []) if image else ""}
        return Server(base_url=base_url, served_name=self.recipe.model.served_name, recipe=self.recipe,
                      started=not self.reused, facts=facts, container=container.name,
                      logs=lambda: self._get(container.id).logs(stdout=True, stderr=True).decode(errors="replace"),
                      api_key=self.recipe.args.api_key)

    def _with_facts(self, server: Server, container: Any) -> Server:
        if container is None:
            return server
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

        before = container.attrs.get("RestartCount", 0)  # production may have restarted long ago: only new ones count

        def alive() -> str | None:
            nonlocal container
            try:
                container = self._get(container.id)
            except docker.errors.NotFound:
                return "the container was removed"
            state, restarts = container.attrs["State"], container.attrs.get("RestartCount", 0)
            if state["Status"] not in ("exited", "dead") and not state.get("Restarting") and restarts <= before:
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
        """Remove what this recipe started (from the journal). What was set aside stays aside for the run's next
        recipe; the run puts it back after its last one. True if there was anything to undo."""
        mine = [e for e in self.journal.entries if e.get("kind") == "create" and e.get("run") == self.run_id]
        if not mine:
            return False
        done = undo(self.engine, mine, progress, keep=self._set_aside_ids())
        self.restored = "; ".join(done) or None
        self.journal.drop(mine)
        return True


def startup_seconds(container: Any) -> float | None:
    """How long the container's server took from its start to serving, from its own log (the time of uvicorn's
    'Application startup complete.' after the container's StartedAt); None when its log does not say."""
    import datetime as dt

    started = _when((container.attrs.get("State") or {}).get("StartedAt", ""))
    if started is None:
        return None
    try:
        text = container.logs(timestamps=True, since=started, until=started + dt.timedelta(hours=2)).decode(
            errors="replace")
    except Exception:  # a log driver that cannot be read back: not known
        return None
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        if "Application startup complete" in rest and (at := _when(stamp)) is not None:
            return max((at - started).total_seconds(), 0.0)
    return None


def _when(stamp: str) -> Any:
    """docker's RFC 3339 time (nanoseconds, Z) as an aware datetime; None for none or docker's zero time."""
    import datetime as dt

    if not stamp or stamp.startswith("0001-"):
        return None
    head, _, frac = stamp.rstrip("Z").partition(".")
    try:
        return dt.datetime.fromisoformat(f"{head}.{(frac or '0')[:6]:0<6}+00:00")
    except ValueError:
        return None


def _vllm_port(attrs: dict[str, Any]) -> int | None:
    """The port a container's vLLM command serves on (8000 when it names none); None for a command that is no vLLM."""
    argv = live_argv(attrs)
    if not any("vllm" in a for a in argv):
        return None
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith("--port=") and a[7:].isdigit():
            return int(a[7:])
    return 8000


def _may_hold_port(container: Any, port: int) -> bool:
    """Whether a running (or restarting) container could be what answers on the host's `port`."""
    if container is None or container.status not in ("running", "restarting"):
        return False
    host = container.attrs.get("HostConfig") or {}
    if host.get("NetworkMode") == "host":
        return True
    return any(str(b.get("HostPort")) == str(port) for binds in (host.get("PortBindings") or {}).values()
               for b in binds or [])


def restore_commands(name: str, ours_holds_name: bool = True, was_running: bool = True) -> str:
    """The commands that put a set-aside container back, for an operator to paste when the suite cannot (every
    name shell-quoted: whatever a name holds, it stays one word)."""
    q, saved = shlex.quote(name), shlex.quote(name + SAVED_SUFFIX)
    cmds = ([f"docker rm -f {q}"] if ours_holds_name else []) + [f"docker rename {saved} {q}"]
    return "; ".join(cmds + ([f"docker start {q}"] if was_running else []))


def undo(engine: DockerEngine, entries: list[dict[str, Any]], progress: Progress,
         keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Put the box back as the journal says it was, newest change first, reconnecting and retrying each step.
    Returns what was done; raises StartError with the exact commands when a step truly cannot be done (the
    journal then stays on the host, for the next run). `keep`: containers set aside that stay aside for now."""
    done: list[str] = []
    for entry in reversed(entries):
        if entry["kind"] == "create":
            done.append(_retry(engine, progress, lambda client, e=entry: _remove_ours(client, e),
                               f"removing {entry['name']}"))
        elif entry["kind"] == "set-aside":
            what = _retry(engine, progress, lambda client, e=entry: _put_back(client, e), f"restoring {entry['name']}",
                          give_up=restore_commands(entry["name"], was_running=entry["running"]))
            done.append(what)
    # Anything else a run created (a create interrupted before the journal heard its id); never what was restored.
    restored = {e["id"] for e in entries if e["kind"] == "set-aside"} | set(keep)
    runs = {e["run"] for e in entries if e["kind"] == "create"}  # never another run's (another user's, at once)
    leftovers = _retry(engine, progress, lambda client: _remove_labelled(client, runs, restored),
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


def _remove_ours(client: Any, entry: dict[str, Any]) -> str:
    """Remove the container a `create` entry recorded: only one that carries this run's label, found by id or name
    (a journal can name anything; what the suite created says so itself). Says what it did."""
    import docker.errors

    name, found = entry["name"], {}
    for ref in filter(None, (entry.get("id"), name)):
        try:
            c = client.containers.get(ref)
        except docker.errors.NotFound:
            continue
        found.setdefault(c.id, c)  # by id and by name: often the same container
    ours = [c for c in found.values() if (c.labels or {}).get(f"{LABEL}.run") == entry["run"]]
    for c in ours:
        c.remove(force=True)
    if ours:
        return f"the recipe's container {name} removed"
    if found:
        other = next(iter(found.values())).name
        return f"{other} left as it is: it does not carry run {entry['run']}'s label (not the suite's)"
    return f"the recipe's container {name} already gone"


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


def _remove_labelled(client: Any, runs: set[str], keep: set[str]) -> list[str]:
    """Remove what the given runs created (by their label), except `keep`."""
    found = [c for run in sorted(runs)
             for c in client.containers.list(all=True, filters={"label": f"{LABEL}.run={run}"}) if c.id not in keep]
    for c in found:
        c.remove(force=True)
    return [c.name for c in found]
