"""One run per host, and a record of what a run changed there, kept on the host itself.

The lock: two runs against one box would both pass the memory pre-flight on the same MemAvailable and start two
models into one pool of unified memory, the livelock this suite exists to prevent. So a run holds an exclusive
`flock` on the target for its whole session, through a shell that lives as long as the run's ssh session: when
the run ends, however it ends (even SIGKILL), that session closes and the kernel releases the lock. A second
run is refused with who holds it. A holder record left by a run that died is reported and taken over.

The journal: before the docker launcher changes anything on the box (sets a production container aside, creates
its own), it writes down what it is about to do, on the host (`~/.cache/sparkgate-lock/journal.json`). Teardown
undoes it and clears it. If a run dies before that, the next run (from any machine) finds the journal and
restores the box before doing anything else. Both live in the run's user's own folder on the target
(`~/.cache/sparkgate-lock`, mode 0700, refused when it is a link or anyone else's), and the journal is validated
as a schema on read: another user on the box can neither plant one nor steer the cleanup.
"""

from __future__ import annotations

import base64
import datetime as dt
import getpass
import json
import os
import select
import shlex
import socket
import subprocess
import sys
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .proc import die_with_parent
from .redact import mask
from .target import is_local, ssh_argv

# The run's user's own folder on the target (mode 0700): nobody else can plant a journal there or steer the cleanup.
# A shell word: "$HOME" expands on the target, quoted against spaces.
LOCK_SUBPATH = ".cache/sparkgate-lock"
LOCK_DIR = f'"$HOME"/{LOCK_SUBPATH}'
JOURNAL = f"{LOCK_DIR}/journal.json"
OLD_JOURNAL = "/tmp/sparkgate-lock/journal.json"  # where earlier versions kept it, in a folder anyone could write

_HOLD = r"""
d="$HOME"/%(sub)s
[ -L "$d" ] && { echo "UNSAFE $d is a symbolic link"; exit 0; }
[ -e "$d" ] || { mkdir -p "$(dirname "$d")" && mkdir -m 700 "$d"; } 2>/dev/null
[ -d "$d" ] || { echo "NODIR $d"; exit 0; }
[ -O "$d" ] || { echo "UNSAFE $d is owned by uid $(ls -ldn "$d" | awk '{print $3}'), not by this user" \
  "(uid $(id -u))"; exit 0; }
[ -z "$(find "$d" -maxdepth 0 -perm /022)" ] || {
  echo "UNSAFE $d is $(ls -ld "$d" | cut -c1-10): other users can write into it"; exit 0; }
command -v flock >/dev/null 2>&1 || { echo NOFLOCK; exit 0; }
exec 9<"$d" || { echo "NODIR $d"; exit 0; }
flock -n 9 || {
  for f in "$d"/holder-*; do [ -f "$f" ] && [ ! -L "$f" ] && { printf 'HOLDER '; cat "$f"; }; done; echo BUSY; exit 0; }
for f in "$d"/holder-*; do [ -f "$f" ] && [ ! -L "$f" ] && { printf 'STALE '; cat "$f"; rm -f "$f"; }; done
printf '%%s
' "$1" > "$d/holder-$(id -u)"
echo LOCKED
cat >/dev/null
rm -f "$d/holder-$(id -u)"
"""


class LockError(Exception):
    """The host is in use by another run, or cannot be locked; the message says by whom or why."""


def holder_text(raw: str) -> str:
    try:
        h = json.loads(raw)
        return f"{h['user']}@{h['client']}, pid {h['pid']}, since {h['started']}: {h['command']}"
    except (ValueError, KeyError, TypeError):
        return raw.strip()


class HostLock:
    def __init__(self, target: str, ssh_config: str | None = None, identity_file: str | None = None) -> None:
        self.target = target
        self.ssh_config, self.identity_file = ssh_config, identity_file
        self.proc: subprocess.Popen[bytes] | None = None
        self.stale: list[str] = []  # holders of a lock whose run died, taken over
        self.warning = ""  # a lock that could not be taken for a reason that is not another run

    def acquire(self, timeout_s: float = 40) -> None:
        """Hold the lock until release() or the end of this process; raise LockError if another run holds it."""
        holder = json.dumps({"user": getpass.getuser(), "client": socket.gethostname(), "pid": os.getpid(),
                             "started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                             "command": mask(shlex.join(sys.argv))[:300]})
        script = _HOLD % {"sub": LOCK_SUBPATH}
        remote = f"sh -c {shlex.quote(script)} sparkgate-lock {shlex.quote(holder)}"
        argv = ["sh", "-c", script, "sparkgate-lock", holder] if is_local(self.target) else [
            *ssh_argv(self.target, self.ssh_config, self.identity_file), remote]
        # Its own session: the terminal's Ctrl-C must not drop the lock while teardown still works on the box.
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=die_with_parent)
        lines = self._read_until(("LOCKED", "BUSY", "NOFLOCK", "NODIR", "UNSAFE"), timeout_s)
        head = lines[-1] if lines else ""
        if head == "LOCKED":
            self.stale = [holder_text(line[6:]) for line in lines if line.startswith("STALE ")]
            return
        _, err = self._drain()
        self.release()
        if head == "BUSY":
            # The records come before BUSY: what follows the head line in the same read would be lost.
            who = "; ".join(holder_text(line[7:]) for line in lines if line.startswith("HOLDER ")) or \
                "a run that left no record"
            raise LockError(f"{self.target} is in use by another sparkgate run: held by {who}. One run per host: "
                            "two at once would both pass the memory pre-flight on the same free memory. Wait for "
                            "it to finish (or stop it: its teardown restores the box)")
        if head.startswith("UNSAFE"):
            raise LockError(f"the run lock folder on {self.target} is not safe to use: {head[7:]}. It holds the run "
                            "journal, which the next run acts on (it removes and renames containers from it): only "
                            "the user who runs the suite may write there. Nothing was touched. Look at what is in it "
                            "and who made it, remove it (the suite makes it itself, mode 0700), and run again")
        if head.startswith(("NOFLOCK", "NODIR")):
            self.warning = (f"{self.target} has no flock (util-linux)" if head == "NOFLOCK" else
                            f"{head[6:]} cannot be opened on {self.target}") + ": runs there are not serialised"
            return
        raise LockError(f"cannot reach {self.target} to take its run lock: "
                        f"{err.strip() or f'no answer within {timeout_s:.0f} s'}")

    def _read_until(self, heads: tuple[str, ...], timeout_s: float) -> list[str]:
        assert self.proc and self.proc.stdout
        lines: list[str] = []
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.append(line.decode(errors="replace"))
                if lines[-1].startswith(heads):
                    return lines
        return lines

    def _drain(self) -> tuple[list[str], str]:
        """What the holding shell still says (stdout lines, stderr), once it has ended."""
        assert self.proc is not None
        try:
            out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            return [], ""
        return out.decode(errors="replace").splitlines(), err.decode(errors="replace")

    @property
    def held(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def release(self) -> None:
        """Give the lock back: the holding shell reads end-of-input, removes its record and exits."""
        if self.proc is None:
            return
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class JournalError(Exception):
    """The run journal on the host cannot be trusted or read; the message names it and says what to do."""


# What a journal entry may hold: exactly what the docker launcher writes, nothing a shell or the engine could
# misread (container names as docker allows them, ids as docker makes them).
_NAME = r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$"
_ID = r"^[0-9a-f]{64}$"


class _Create(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["create"]
    name: str = Field(pattern=_NAME)
    run: str = Field(pattern=r"^[0-9a-f]{12}$")
    id: str | None = Field(None, pattern=_ID)


class _SetAside(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["set-aside"]
    name: str = Field(pattern=_NAME)
    id: str = Field(pattern=_ID)
    running: bool
    recipe: str = Field("", pattern=r"^[a-zA-Z0-9_.-]*$")
    served: list[str] = []
    port: int = Field(8000, ge=1, le=65535)
    load_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    down_at: float = Field(0, ge=0, allow_inf_nan=False)


_ENTRIES = TypeAdapter(list[Annotated[_Create | _SetAside, Field(discriminator="kind")]])


class Journal:
    """What this run is about to change on the box (or changed), on the host, so that it can be undone by this
    run's teardown or, if this run dies, by the next one. Entries are plain dicts with a `kind`."""

    def __init__(self, host: Any) -> None:
        self.host = host  # a testinfra host: the same connection the host layer uses
        self.entries: list[dict[str, Any]] = []

    def load(self) -> list[dict[str, Any]]:
        """What a previous run left (it died before undoing it); [] when it left nothing. A journal this suite did not
        write (it fails the entry schema) is an error that names it, and it stays where it is for the operator."""
        res = self.host.run(f"cat {JOURNAL} 2>/dev/null")
        if res.rc != 0 or not res.stdout.strip():
            return []
        try:
            return [e.model_dump() for e in _ENTRIES.validate_json(res.stdout)]
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise JournalError(f"the run journal {JOURNAL} on the host is not one this suite wrote ({where}: "
                               f"{first['msg']}); nothing was touched and it is left as it is. Read it: if a run "
                               "set a container aside (NAME.sparkgate-saved), put it back by hand, then remove the "
                               "journal") from None

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write down an intent before acting on it; raises if it cannot be written (then nothing is done)."""
        entry = {"kind": kind, **fields}
        self.entries.append(entry)
        self.save()
        return entry

    def update(self, entry: dict[str, Any], **fields: Any) -> None:
        entry.update(fields)
        self.save()

    def drop(self, done: list[dict[str, Any]]) -> None:
        """Forget entries that were undone (by identity), keeping the rest on the host."""
        self.entries = [e for e in self.entries if not any(e is d for d in done)]
        self.save()

    def save(self) -> None:
        if not self.entries:
            self.clear()
            return
        blob = base64.b64encode(json.dumps(self.entries).encode()).decode()
        res = self.host.run(f"mkdir -p -m 700 {LOCK_DIR} && printf %s {blob} | base64 -d > {JOURNAL}.tmp && "
                            f"mv -f {JOURNAL}.tmp {JOURNAL}")
        if res.rc != 0:
            raise OSError(f"cannot write the run journal {JOURNAL} on the host: {(res.stderr or res.stdout).strip()}")

    def clear(self) -> None:
        self.entries = []
        self.host.run(f"rm -f {JOURNAL}")
