"""Where boxes that should agree do not: a fleet's results files (one per box, `--results-json`), compared field by
field. Owners of several Sparks run the suite on each box in turn; a box on another driver, kernel, image build,
vLLM version or recipe than the rest serves differently, and its figures do not compare with theirs.

    sparkgate fleet spark01.json spark02.json spark03.json

names, for each field the boxes do not share, the box that differs (the one not holding the value most boxes hold)
and what it has; with no majority (two boxes, or a tie) every box is named with its value. Exit 0: the boxes agree
on every field they all recorded; 1: they differ; 2: a file could not be read, or fewer than two boxes.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .knownbad import SHARED_LIBRARIES
from .redact import printable
from .results import Results


@dataclass(frozen=True)
class Difference:
    field: str
    values: dict[str, list[str]]  # value -> the boxes that hold it, the most held first

    @property
    def majority(self) -> bool:
        """One value is held by more boxes than any other."""
        counts = [len(b) for b in self.values.values()]
        return counts.count(counts[0]) == 1

    @property
    def odd(self) -> list[str]:
        """The boxes not holding the value most boxes hold; all of them when there is no such value."""
        held = list(self.values.values())
        return [box for boxes in (held[1:] if self.majority else held) for box in boxes]


# What a server said of itself that boxes serving one recipe should share: its libraries (read from its image by
# CONT-KNOWN-BAD), the attention backend and graph mode it chose. (Not the field its thinking arrives in: that is
# SERVE-REASONING's verdict, and a box where it failed would differ twice for one defect.)
SHARED_FACTS = (*SHARED_LIBRARIES, "attention_backend", "graph_mode")


def fields(r: Results) -> dict[str, str]:
    """What a box should share with the others of its fleet, by field name: the box, its driver stack, the suite,
    and per recipe it ran: the recipe file, what it served (model, image, flags), the image build and vLLM."""
    out: dict[str, str] = {"sparkgate": r.suite.version}
    if s := r.system:
        out |= {"arch": s.arch, "os": s.os, "kernel": s.kernel, "GPUs": ", ".join(s.gpus) or "none",
                "driver": s.driver or "none"}
    if h := r.host:
        out |= {"NVIDIA kernel module": h.nvidia_module_version or "none", "docker": h.docker or "none"}
    for run in r.recipes:
        name = printable(run.recipe, 64)
        out |= {f"{name}: recipe digest": run.recipe_digest,
                f"{name}: serving digest": run.serving_digest,
                f"{name}: image": run.image or "none (a process)",
                f"{name}: image id": run.image_id or "none",
                f"{name}: image digest": run.image_digest or "none",
                f"{name}: vLLM version": run.vllm_version or "none"}
        out |= {f"{name}: {fact}": run.server[fact] for fact in SHARED_FACTS if fact in run.server}
    return out


def names(files: list[tuple[Path, Results]]) -> dict[str, Results]:
    """Each box by its hostname, in the files' order: where two files name one host, the file's name beside it;
    a file that records no host, by its file name; a name still taken, numbered. Every file is a box of its own."""
    hosts = [printable(r.system.hostname, 64) if r.system else f"({printable(path.name, 64)})" for path, r in files]
    taken = Counter(hosts)
    out: dict[str, Results] = {}
    for i, ((path, r), host) in enumerate(zip(files, hosts, strict=True)):
        label = host if taken[host] == 1 else f"{host} ({printable(path.name, 64)})"
        while label in out:  # a hostname that reads like another's label, or two files of one name
            label = f"{label} #{i + 1}"
        out[label] = r
    return out


def differences(boxes: dict[str, Results]) -> tuple[list[Difference], list[str], dict[str, list[str]]]:
    """(the fields the boxes differ in, the fields they agree in, the fields not every box recorded -> the boxes
    that did): a field is compared among the boxes that recorded it, when at least two did."""
    per_box = {box: fields(r) for box, r in boxes.items()}
    order = list(dict.fromkeys(k for f in per_box.values() for k in f))
    differ, agree, partial = [], [], {}
    for field in order:
        held = {box: f[field] for box, f in per_box.items() if field in f}
        if len(held) < len(boxes):
            partial[field] = list(held)
        if len(held) < 2:
            continue
        counts = Counter(held.values())
        if len(counts) == 1:
            agree.append(field)
            continue
        values = {v: [b for b, x in held.items() if x == v] for v, _ in counts.most_common()}
        differ.append(Difference(field, values))
    return differ, agree, partial


def _holding(boxes: list[str], value: str) -> str:
    return f"{', '.join(boxes)} {'has' if len(boxes) == 1 else 'have'} {value}"


def report(boxes: dict[str, Results], differ: list[Difference], agree: list[str],
           partial: dict[str, list[str]]) -> str:
    lines = [f"fleet of {len(boxes)} boxes: {', '.join(boxes)}"]
    for d in differ:
        shown = [(printable(v, 1000), b) for v, b in d.values.items()]
        if d.majority:
            (most, held), rest = shown[0], shown[1:]
            lines.append(f"DIFFERS {d.field}: {'; '.join(_holding(b, v) for v, b in rest)}; the other {len(held)} "
                         f"({', '.join(held)}) have {most}")
        else:
            lines.append(f"DIFFERS {d.field} (no value most boxes share): "
                         + "; ".join(_holding(b, v) for v, b in shown))
    if differ:
        lines.append(f"{len({b for d in differ for b in d.odd})} box(es) differ in {len(differ)} field(s): figures "
                     "compare across boxes only where these do not matter; align what should be the same (driver, "
                     "kernel module, the recipe's image pulled on every box, one version of the suite) and run again")
    lines.append(f"agree ({len(agree)}): " + (", ".join(agree) or "nothing"))
    some = {k: v for k, v in partial.items() if len(v) > 1}
    one = {k: v for k, v in partial.items() if len(v) == 1}
    if some:
        lines.append("not recorded by every box, compared among those that did: "
                     + "; ".join(f"{k} ({', '.join(v)})" for k, v in some.items()))
    if one:
        lines.append("recorded by one box only, not compared: " + "; ".join(f"{k} ({v[0]})" for k, v in one.items()))
    return "\n".join(lines) + "\n"


# ---- one run over several boxes (`--host` repeated, `--inventory`): one pytest-xdist worker per box ----------------

TARGET = re.compile(r"([a-z][a-z0-9+]*://)?[A-Za-z0-9._@:%/\[\]-]+", re.ASCII)  # an ssh name or a testinfra URL
RANGE = re.compile(r"\[[0-9A-Za-z]+:[0-9A-Za-z]+(:[0-9]+)?\]")  # Ansible's spark[01:03] (not an IPv6 [fd00::1])


def read_inventory(path: str) -> list[str]:
    """The boxes an inventory file names: one target per line (an ssh name, or ssh://user@host:port), as an Ansible
    INI inventory lists its hosts. `[group]` headers, the group names of `[group:children]`, blank lines and `#`/`;`
    comments are skipped. What sparkgate would misread is an error naming its line: a host or group variable
    (`ansible_user=ops`: sparkgate reaches a box by its ssh config, and a variable it ignored would point the run at
    another user or machine), a range (`spark[01:03]`), or more than one word."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--inventory {path}: cannot be read: {exc}") from None
    hosts, section = [], ""
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#")[0].split(";")[0].split()
        where = f"--inventory {path}, line {n}: {printable(line.strip(), 120)!r}"
        if len(words) == 1 and words[0].startswith("[") and words[0].endswith("]"):
            section = words[0][1:-1]
            continue
        if not words or section.endswith(":children"):
            continue
        if len(words) > 1 or "=" in words[0]:
            raise ValueError(f"{where} says more than a box (variables are not read): one target per line; put the "
                             "user, port and address in your ssh config (Host NAME)")
        if words[0].endswith(":"):
            raise ValueError(f"{where} reads as YAML: sparkgate reads an inventory in Ansible's INI form, one box per "
                             "line")
        if RANGE.search(words[0]):
            raise ValueError(f"{where} is a range, which sparkgate does not expand: one box per line")
        hosts.append(words[0])
    if not hosts:
        raise ValueError(f"--inventory {path}: names no box (one ssh name or ssh://user@host:port per line)")
    return hosts


def fleet_hosts(given: list[str] | None, inventory: str | None) -> list[str]:
    """Every box of the run, in order: --host (repeatable) then --inventory's; local when none is named."""
    hosts = [*(given or []), *(read_inventory(inventory) if inventory else [])] or ["local"]
    if odd := [h for h in hosts if not TARGET.fullmatch(h)]:
        raise ValueError(f"{printable(odd[0], 120)!r} is not a box to reach: an ssh name from your ssh config, "
                         "ssh://user@host:port, or local")
    twice = [h for h, n in Counter(hosts).items() if n > 1]
    if twice:
        raise ValueError(f"{', '.join(twice)} named twice: one run per box (the box's run lock allows no other)")
    if len(hosts) > 1 and "local" in hosts:
        raise ValueError("local in a fleet: a fleet is boxes reached over ssh (name this machine by its ssh name)")
    return hosts


def file_label(host: str) -> str:
    """A box's name as a part of a file name: `ssh://ops@spark01:2222` -> `ops_spark01_2222`."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in host.removeprefix("ssh://"))


def per_host(path: str, host: str) -> str:
    """Where a box of a fleet writes what one run writes to PATH: `run.json` -> `run.spark01.json`."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{file_label(host)}{p.suffix}"))
