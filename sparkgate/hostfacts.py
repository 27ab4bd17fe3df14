"""The facts of a host, gathered once over testinfra and parsed from what the real tools print.

Parsing is kept apart from gathering so it can be tested on recorded outputs. Absent tools are facts too
(None), never crashes: a host without nvidia-smi or mokutil is described, not rejected here.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pydantic import BaseModel

from .boot import grub_default, grubenv_saved_entry, kernel_key, next_kernel
from .recipes import Profile
from .redact import mask
from .units import GIB, KIB, parse_bytes

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


class KernelModule(BaseModel):
    """An nvidia.ko on disk, as modinfo reads it (signer None: unsigned; modinfo None: not installed)."""

    kernel: str
    path: str
    version: str | None
    signer: str | None


class ComputeApp(BaseModel):
    pid: int
    name: str
    used_mib: int | None


class Container(BaseModel):
    """A running docker container, as `docker stats` shows it."""

    id: str
    name: str
    resident_bytes: int


class HostFacts(BaseModel):
    target: str
    hostname: str
    arch: str
    kernel: str
    os: str
    cpus: int
    cpu_model: str = ""  # lscpu's "Model name"
    mem_total_bytes: int
    mem_available_bytes: int
    mem_free_bytes: int | None = None  # MemFree: what vLLM's start check sees as free on unified memory
    nvidia_smi: str | None = None  # path, None when not installed
    nvidia_smi_error: str | None = None  # what nvidia-smi said when it failed
    gpus: list[Gpu] = []
    nvidia_module_version: str | None = None  # /sys/module/nvidia/version
    secure_boot: bool | None = None  # mokutil --sb-state; None: could not tell
    secure_boot_note: str = ""
    modinfo: bool = False
    modules: list[KernelModule] = []  # nvidia.ko of every kernel under /lib/modules
    kernel_images: list[str] = []  # installed linux-image-* package versions (dpkg), else /boot/vmlinuz-*
    initramfs: list[str] = []  # kernels with /boot/initrd.img-*
    boot_kernels: list[str] = []  # kernels GRUB can boot (/boot/vmlinuz-*), newest first
    next_kernel: str | None = None  # the one the next boot runs
    next_kernel_basis: str = ""  # how that was decided (GRUB_DEFAULT, saved_entry)
    dpkg_problems: list[str] = []  # dpkg --audit and apt-get check findings; [] is clean (where packages_read)
    kernel_packages: list[str] = []  # linux-* and *nvidia* packages dpkg has installed, fully or half
    # Whether the two above were read: only for a run that selects HOST-DPKG, because apt-get check alone takes
    # seconds where apt keeps no package cache. (A new field, not None in the lists: older readers ignore it.)
    packages_read: bool = True
    compute_apps: list[ComputeApp] = []
    model_processes: list[str] = []  # "pid args" of processes that look like model servers
    ps_error: str | None = None  # why the process list could not be read (model_processes then says nothing)
    container_of: dict[int, str] = {}  # pid of a model server or GPU process -> the docker container it runs in
    docker: str | None = None  # server version, None: not reachable
    docker_error: str | None = None
    containers: list[Container] = []  # running containers (docker stats), when the engine answers
    user: str = ""
    groups: list[str] = []
    disk_free_bytes: int | None = None  # on the filesystem holding the model cache
    disk_path: str = ""
    home: str = ""  # the ssh user's home on the host
    hf_cache: str = ""  # the Hugging Face cache the docker recipes mount (HF_HOME, else ~/.cache/huggingface)

    @property
    def has_nvidia(self) -> bool:
        return bool(self.nvidia_smi or self.nvidia_module_version)

    @property
    def driver_version(self) -> str | None:
        """The userspace driver: nvidia-smi's, or NVML's own word when the module does not match it."""
        if self.gpus:
            return self.gpus[0].driver_version
        found = re.search(r"NVML library version: ([\d.]+)", self.nvidia_smi_error or "")
        return found.group(1) if found else None

    @property
    def nvml_mismatch(self) -> bool:
        return "Driver/library version mismatch" in (self.nvidia_smi_error or "")

    def container(self, name: str | None) -> Container | None:
        return next((c for c in self.containers if c.name == name), None) if name else None

    def module_for(self, kernel: str) -> KernelModule | None:
        return next((m for m in self.modules if m.kernel == kernel), None)

    def role(self, kernel: str) -> str:
        """What a kernel is to this box: the running one, the next boot, a fallback."""
        roles = (["running"] if kernel == self.kernel else []) + (
            [f"the next boot: {self.next_kernel_basis}"] if kernel == self.next_kernel else [])
        return ", ".join(roles) or "a fallback in the GRUB menu"

    @property
    def boot_order(self) -> list[str]:
        """Every bootable kernel, the next boot's first, then the running one, then the fallbacks."""
        first = [k for k in (self.next_kernel, self.kernel) if k in self.boot_kernels]
        return list(dict.fromkeys([*first, *self.boot_kernels]))

    def summary(self) -> dict[str, str]:
        """One line per fact, for the report header and the HTML environment table."""
        gpu = ", ".join(f"{g.name} (driver {g.driver_version}, cc {g.compute_cap})" for g in self.gpus)
        return {
            "Host": f"{self.hostname} ({self.target})",
            "Kernel": f"{self.kernel} {self.arch}, {self.os}" + (
                f"; next boot {self.next_kernel}" if self.next_kernel and self.next_kernel != self.kernel else ""),
            "Memory": f"{self.mem_available_bytes / GIB:.1f} GiB available of {self.mem_total_bytes / GIB:.1f}",
            "GPU": gpu or (f"nvidia-smi failed: {self.nvidia_smi_error}" if self.nvidia_smi_error else "none"),
            "NVIDIA module": f"{self.nvidia_module_version or 'not loaded'}; Secure Boot "
            + {True: "enabled", False: "disabled", None: f"unknown ({self.secure_boot_note})"}[self.secure_boot],
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


COMPUTE_APPS = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"


def compute_apps(host: Any) -> list[ComputeApp] | None:
    """The processes holding GPU memory now, with nvidia-smi's per-process MiB; None where nvidia-smi does not
    answer."""
    res = host.run(COMPUTE_APPS)
    return parse_compute_apps(res.stdout) if res.rc == 0 else None


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader`."""
    apps = []
    for line in text.strip().splitlines():
        pid, name, used = (c.strip() for c in line.rsplit(",", 2)) if line.count(",") >= 2 else ("", "", "")
        if pid.isdigit():
            apps.append(ComputeApp(pid=int(pid), name=name, used_mib=_mib(used)))
    return apps


PS_MEMORY = "ps -eo pid=,rss=,etimes=,comm="
_PRINTABLE_NAME = re.compile(r"^[\x21-\x7e][\x20-\x7e]*$")


def processes_started_within(ps_output: str, seconds: float, min_bytes: int = 64 * 2**20) -> list[str]:
    """From `PS_MEMORY`: the processes started in the last `seconds` that hold at least `min_bytes` resident, largest
    first, as "pid PID NAME (X GiB resident, started N s ago)". The name only (a command line may hold a secret), and
    only when it is printable (anyone can name a process)."""
    found = []
    for line in ps_output.splitlines():
        cells = line.split(None, 3)
        if len(cells) == 4 and cells[0].isdigit() and cells[1].isdigit() and cells[2].isdigit():
            rss, age = int(cells[1]) * KIB, int(cells[2])
            if age <= seconds and rss >= min_bytes:
                name = cells[3].strip() if _PRINTABLE_NAME.match(cells[3].strip()) else "(a name with odd characters)"
                found.append((rss, f"pid {cells[0]} {name} ({rss / GIB:.2f} GiB resident, started {age} s ago)"))
    return [text for _, text in sorted(found, key=lambda f: -f[0])]


def parse_docker_stats(text: str) -> list[Container]:
    """`docker stats --no-stream --no-trunc --format '{{.ID}}\t{{.Name}}\t{{.MemUsage}}'`: "43.2GiB / 121.7GiB"."""
    found = []
    for line in text.splitlines():
        cells = line.split("\t")
        if len(cells) == 3 and "/" in cells[2]:
            try:
                found.append(Container(id=cells[0], name=cells[1], resident_bytes=parse_bytes(cells[2].split("/")[0])))
            except ValueError:
                continue
    return found


def parse_lscpu_model(text: str) -> str:
    """lscpu's "Model name" lines (a GB10 has two kinds of cores: Cortex-X925 and Cortex-A725), joined."""
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("Model name:")]
    return " + ".join(dict.fromkeys(names))


def parse_sb_state(text: str) -> bool | None:
    """`mokutil --sb-state`: 'SecureBoot enabled' / 'SecureBoot disabled' (anything else: unknown)."""
    if "SecureBoot enabled" in text:
        return True
    if "SecureBoot disabled" in text:
        return False
    return None


# Executables of model servers that hold memory on a serving box (the guide's `grep -iE 'llama|ollama|vllm'`).
MODEL_SERVER = re.compile(r"(^|/)(ollama|llama-server|llama-cli|vllm|sglang|text-generation-launcher|"
                          r"tritonserver|trtllm-serve)(\s|$)|\bvllm serve\b|vllm\.entrypoints")


def model_processes(ps_output: str, exclude_pids: set[int] = frozenset()) -> list[str]:
    """From `ps -eo pid=,args=`: the lines whose command is a model server."""
    found = []
    for line in ps_output.splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit() and int(pid) not in exclude_pids and MODEL_SERVER.search(args.strip()):
            found.append(f"{pid} {args.strip()}")
    return found


def gather(host: Any, target: str, packages: bool = True) -> HostFacts:
    """Read the facts of a testinfra host (dpkg's and apt's state only with `packages`). Raises on a host that cannot
    run a command at all."""

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
        cpu_model=parse_lscpu_model(host.run("lscpu").stdout),
        mem_total_bytes=meminfo["MemTotal"],
        mem_available_bytes=meminfo["MemAvailable"],
        mem_free_bytes=meminfo.get("MemFree"),
        nvidia_smi=host.find_command("nvidia-smi") if host.exists("nvidia-smi") else None,
    )
    module_version = host.file("/sys/module/nvidia/version")
    if module_version.exists:
        facts["nvidia_module_version"] = module_version.content_string.strip()
    if facts["nvidia_smi"]:
        res = host.run(f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader")
        if res.rc == 0:
            facts["gpus"] = parse_gpu_csv(res.stdout)
            facts["compute_apps"] = compute_apps(host) or []
        else:
            facts["nvidia_smi_error"] = (res.stdout + res.stderr).strip() or f"exit status {res.rc}"
    facts.update(_secure_boot(host))
    facts.update(_kernels(host, facts["kernel"]))
    facts["packages_read"] = packages
    if packages:
        facts.update(_packages(host))
    ps = host.run("ps -eww -o pid=,args=")
    facts["model_processes"] = [mask(p) for p in model_processes(ps.stdout)]
    if ps.rc != 0 or not ps.stdout.strip():  # ps lists at least itself: nothing listed is nothing read
        facts["ps_error"] = mask(" ".join((ps.stderr or ps.stdout).split())[:300]) or f"exit status {ps.rc}"
    pids = {a.pid for a in facts.get("compute_apps", [])} | {int(p.split()[0]) for p in facts["model_processes"]}
    facts["container_of"] = containers_of(host, pids)
    facts.update(_docker_and_user(host))
    facts.update(_disk(host))
    return HostFacts(**facts)


def _secure_boot(host: Any) -> dict[str, Any]:
    if not host.exists("mokutil"):
        return {"secure_boot": None, "secure_boot_note": "mokutil not installed"}
    res = host.run("mokutil --sb-state")
    state = parse_sb_state(res.stdout + res.stderr)
    return {"secure_boot": state, "secure_boot_note": "" if state is not None else (res.stdout + res.stderr).strip()}


def _kernels(host: Any, running: str) -> dict[str, Any]:
    out: dict[str, Any] = {"modinfo": host.exists("modinfo") or host.file("/sbin/modinfo").exists}
    modinfo = "modinfo" if host.exists("modinfo") else "/sbin/modinfo"
    modules = []
    res = host.run("find /lib/modules -mindepth 1 -maxdepth 1 -type d -printf '%f\\n'")
    for kernel in sorted(res.stdout.split()) if res.rc == 0 else []:
        found = host.run(f"find /lib/modules/{shlex.quote(kernel)} -name 'nvidia.ko*' -print -quit")
        path = found.stdout.strip()
        if not path:
            continue
        version = signer = None
        if out["modinfo"]:
            version = host.run(f"{modinfo} -F version {shlex.quote(path)}").stdout.strip() or None
            signer = host.run(f"{modinfo} -F signer {shlex.quote(path)}").stdout.strip() or None
        modules.append(KernelModule(kernel=kernel, path=path, version=version, signer=signer))
    out["modules"] = modules
    dpkg = host.run("dpkg-query -W -f='${Status} ${Package}\\n' 'linux-image-[0-9]*'")
    if dpkg.rc == 0 and dpkg.stdout.strip():
        out["kernel_images"] = sorted(line.split()[-1].removeprefix("linux-image-")
                                      for line in dpkg.stdout.splitlines() if line.startswith("install ok installed"))
    else:
        boot = host.run("ls /boot")
        out["kernel_images"] = sorted(f.removeprefix("vmlinuz-") for f in boot.stdout.split()
                                      if f.startswith("vmlinuz-"))
    boot = host.run("ls /boot")
    out["initramfs"] = sorted(f.removeprefix("initrd.img-") for f in boot.stdout.split()
                              if f.startswith("initrd.img-"))
    out["boot_kernels"] = sorted((f.removeprefix("vmlinuz-") for f in boot.stdout.split() if f.startswith("vmlinuz-")),
                                 key=kernel_key, reverse=True)
    grub = host.run("cat /etc/default/grub /etc/default/grub.d/*.cfg 2>/dev/null").stdout
    grubenv = host.run("cat /boot/grub/grubenv 2>/dev/null").stdout
    out["next_kernel"], out["next_kernel_basis"] = next_kernel(out["boot_kernels"], grub_default(grub),
                                                               grubenv_saved_entry(grubenv))
    return out


def _packages(host: Any) -> dict[str, Any]:
    """What dpkg and apt say is unfinished or broken (the guide's hung DKMS/MOK install leaves it so), and which
    linux and nvidia packages dpkg has: none, and there is no driver or kernel install to judge."""
    problems, packages = [], []
    audit = host.run("dpkg --audit")
    if audit.stdout.strip():
        problems.append(f"dpkg --audit: {' '.join(audit.stdout.split())}")
    states = host.run("dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 'linux-*' '*nvidia*'")
    for line in states.stdout.splitlines():
        abbrev, _, package = line.partition(" ")
        abbrev, package = abbrev.strip(), package.strip()
        if package and abbrev not in ("un", "rc", ""):
            packages.append(package)
        if abbrev not in ("ii", "un", "rc", "") and package and package not in audit.stdout:
            problems.append(f"{package} is {abbrev} (dpkg-query: not fully installed)")
    if host.exists("apt-get"):
        check = host.run("apt-get check -q")
        if check.rc != 0:
            problems.append(f"apt-get check: {' '.join((check.stderr or check.stdout).split())[:300]}")
    return {"dpkg_problems": problems, "kernel_packages": packages}


def _docker_and_user(host: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"user": host.check_output("id -un"), "groups": host.check_output("id -Gn").split()}
    if not host.exists("docker"):
        out["docker_error"] = "docker CLI not installed"
        return out
    res = host.run("docker version --format '{{.Server.Version}}'")
    if res.rc == 0 and res.stdout.strip():
        out["docker"] = res.stdout.strip()
        stats = host.run("docker stats --no-stream --no-trunc --format '{{.ID}}\t{{.Name}}\t{{.MemUsage}}'")
        out["containers"] = parse_docker_stats(stats.stdout) if stats.rc == 0 else []
    else:
        out["docker_error"] = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit status {res.rc}"]
        out["docker_error"] = out["docker_error"][0]
    return out


def _disk(host: Any) -> dict[str, Any]:
    # Weights land in the Hugging Face cache (the docker recipes mount it); measure the filesystem that holds it
    # (or would: its nearest existing folder).
    res = host.run("echo \"$HOME\"; h=${HF_HOME:-$HOME/.cache/huggingface}; echo \"$h\"; p=$h; "
                   "while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; echo \"$p\"; "
                   "df -B1 --output=avail \"$p\" | tail -1")
    lines = res.stdout.split("\n")
    if res.rc != 0 or len(lines) < 4 or not lines[3].strip().isdigit():
        return {}
    return {"home": lines[0], "hf_cache": lines[1], "disk_path": lines[2], "disk_free_bytes": int(lines[3])}


def containers_of(host: Any, pids: set[int]) -> dict[int, str]:
    """pid -> the id of the docker container it runs in, from /proc/PID/cgroup: the 64-hex id in its cgroup path
    (/docker/<id> with cgroupfs, /system.slice/docker-<id>.scope with systemd, /<cgroup-parent>/<id>)."""
    if not pids:
        return {}
    res = host.run("for p in " + " ".join(map(str, sorted(pids))) + "; do echo \"$p $(cat /proc/$p/cgroup "
                   "2>/dev/null | tr '\\n' ' ')\"; done")
    found = {}
    for line in res.stdout.splitlines():
        pid, _, cgroup = line.partition(" ")
        if m := re.search(r"[/-]([0-9a-f]{64})(?:\.scope)?\b", cgroup):
            found[int(pid)] = m.group(1)
    return found


def gpu_mib_of_container(host: Any, apps: list[ComputeApp], container_id: str) -> int:
    """GPU memory (MiB, nvidia-smi's per-process figure in `apps`) held by the processes of a docker container: on
    unified memory it comes back to MemAvailable when the container goes. 0 without nvidia-smi's figures."""
    pids = [a.pid for a in apps if a.used_mib]
    if not pids or not container_id:
        return 0
    res = host.run("grep -l " + shlex.quote(container_id) + " " + " ".join(f"/proc/{p}/cgroup" for p in pids))
    inside = {int(line.split("/")[2]) for line in res.stdout.split() if line.startswith("/proc/")}
    return sum(a.used_mib or 0 for a in apps if a.pid in inside)


def version_tuple(version: str) -> tuple[int, ...]:
    """'595.84' -> (595, 84), for comparing driver versions numerically."""
    return tuple(int(p) for p in re.findall(r"\d+", version))


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
