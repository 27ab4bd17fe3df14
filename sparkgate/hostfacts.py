"""The facts of a host, gathered once over testinfra and parsed from what the real tools print.

Parsing is kept apart from gathering so it can be tested on recorded outputs. Absent tools are facts too
(None), never crashes: a host without nvidia-smi or mokutil is described, not rejected here.
"""

from __future__ import annotations

import shlex
from typing import Any

from pydantic import BaseModel

from .recipes import Profile

KIB = 1024
GIB = 1024**3

# nvidia-smi prints these for a value it does not have; GB10 prints them for every memory field.
_MISSING = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", ""}
GPU_FIELDS = ("name", "driver_version", "compute_cap", "memory.total", "memory.used", "memory.free", "pci.bus_id")


class Gpu(BaseModel):
    name: str
    driver_version: str
    compute_cap: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    memory_free_mib: int | None
    pci_bus_id: str | None


class HostFacts(BaseModel):
    target: str
    hostname: str
    arch: str
    kernel: str
    os: str
    cpus: int
    mem_total_bytes: int
    mem_available_bytes: int
    nvidia_smi: str | None = None  # path, None when not installed
    nvidia_smi_error: str | None = None  # what nvidia-smi said when it failed
    gpus: list[Gpu] = []
    nvidia_module_version: str | None = None  # /sys/module/nvidia/version

    @property
    def has_nvidia(self) -> bool:
        return bool(self.nvidia_smi or self.nvidia_module_version)

    @property
    def driver_version(self) -> str | None:
        return self.gpus[0].driver_version if self.gpus else None

    def summary(self) -> dict[str, str]:
        """One line per fact, for the report header and the HTML environment table."""
        gpu = ", ".join(f"{g.name} (driver {g.driver_version}, cc {g.compute_cap})" for g in self.gpus)
        return {
            "Host": f"{self.hostname} ({self.target})",
            "Kernel": f"{self.kernel} {self.arch}, {self.os}",
            "Memory": f"{self.mem_available_bytes / GIB:.1f} GiB available of {self.mem_total_bytes / GIB:.1f}",
            "GPU": gpu or (f"nvidia-smi failed: {self.nvidia_smi_error}" if self.nvidia_smi_error else "none"),
        }


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes per key."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (KIB if parts[1:] == ["kB"] else 1)
    return out


def _value(raw: str) -> str | None:
    raw = raw.strip()
    return None if raw in _MISSING else raw


def _mib(raw: str) -> int | None:
    value = _value(raw)
    return None if value is None else int(value.split()[0])


def parse_gpu_csv(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader`: one GPU per line."""
    gpus = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(GPU_FIELDS):
            raise ValueError(f"nvidia-smi printed {len(cells)} fields, expected {len(GPU_FIELDS)}: {line!r}")
        name, driver, cc, total, used, free, bus = cells
        gpus.append(
            Gpu(
                name=name,
                driver_version=driver,
                compute_cap=_value(cc),
                memory_total_mib=_mib(total),
                memory_used_mib=_mib(used),
                memory_free_mib=_mib(free),
                pci_bus_id=_value(bus),
            )
        )
    return gpus


def parse_os_release(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return shlex.split(line.partition("=")[2])[0]
    return "unknown"


def gather(host: Any, target: str) -> HostFacts:
    """Read the facts of a testinfra host. Raises on a host that cannot run a command at all."""

    def out(cmd: str) -> str:
        return host.check_output(cmd)

    meminfo = parse_meminfo(host.file("/proc/meminfo").content_string)
    facts: dict[str, Any] = dict(
        target=target,
        hostname=out("hostname"),
        arch=out("uname -m"),
        kernel=out("uname -r"),
        os=parse_os_release(host.file("/etc/os-release").content_string),
        cpus=int(out("nproc")),
        mem_total_bytes=meminfo["MemTotal"],
        mem_available_bytes=meminfo["MemAvailable"],
        nvidia_smi=host.find_command("nvidia-smi") if host.exists("nvidia-smi") else None,
    )
    module_version = host.file("/sys/module/nvidia/version")
    if module_version.exists:
        facts["nvidia_module_version"] = module_version.content_string.strip()
    if facts["nvidia_smi"]:
        res = host.run(f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader")
        if res.rc == 0:
            facts["gpus"] = parse_gpu_csv(res.stdout)
        else:
            facts["nvidia_smi_error"] = (res.stdout + res.stderr).strip() or f"exit status {res.rc}"
    return HostFacts(**facts)


def matching_profile(facts: HostFacts, profiles: dict[str, Profile]) -> Profile | None:
    """The hardware class this host belongs to: by architecture and by whether an NVIDIA driver is present.

    Deliberately not by GPU name or driver version: a Spark with a broken driver must still be recognised
    as a Spark, so its checks run and fail rather than being skipped.
    """
    for profile in profiles.values():
        if profile.arch not in (None, facts.arch):
            continue
        if (profile.gpu is not None) == facts.has_nvidia:
            return profile
    return None
