"""The test host `spark01`: a real host, reached over real ssh, that acts as an NVIDIA DGX Spark (GB10).

A host is a network namespace (`sg-<name>`) joined to the root namespace by a veth pair (10.213.<index>.1
here, 10.213.<index>.2 there, /30), with its own hostname, mounts and pids, running a real sshd chrooted into
an overlay of a cached Debian rootfs (one upper dir per host, so variants never mix). What cannot exist here
(a GB10, its driver and tools) is played by the stand-ins in files/, which print what real machines printed
(shared/hosts), and by kernel-module-shaped files that the real `modinfo` reads.

    with TestHost(HostSpec(driver_version="580.159.03")) as host:
        testinfra.get_host("ssh://spark01", ssh_config=str(host.ssh_config))

Root only. From a shell: python -m selftest.testhost.spark01 up|down [--driver 580.159.03 ...]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hfmodel

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FILES = HERE / "files"

CANONICAL_SIGNER = "Canonical Ltd. Kernel Module Signing"
DEFAULT_DRIVER = "595.84"
SUITE = "bookworm"
MIRROR = os.environ.get("SPARKGATE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_PACKAGES = ("openssh-server", "procps", "kmod", "iproute2", "iputils-ping")  # more: HostSpec.extra_packages
# What building and running hosts needs on this (the root) side, as Debian packages.
BUILD_TOOLS = ("debootstrap", "debian-archive-keyring", "openssl", "binutils", "gcc", "libc6-dev")
BUILD_TOOLS += ("openssh-client", "iproute2", "util-linux")
ROOTFS_LAYOUT = 1  # bump when what build_rootfs() makes changes
NET_PREFIX = os.environ.get("SPARKGATE_TESTHOST_NET", "10.213")
PATH_IN_HOST = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

UBUNTU_NOBLE = """\
PRETTY_NAME="Ubuntu 24.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.4 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
"""


@dataclass(frozen=True)
class ModelServer:
    """A competing model server: a real idle process under the server's executable and argv."""

    exe: str
    args: str  # after the executable; no argument has a space
    gpu_mib: int  # what nvidia-smi --query-compute-apps says it holds


MODEL_SERVERS = {
    "ollama": ModelServer("/usr/local/bin/ollama", "serve", 5210),
    "llama-server": ModelServer(
        "/usr/local/bin/llama-server", "-m /models/Qwen3-Coder-30B-A3B-Q5_K_M.gguf --port 8080 -np 2", 23456
    ),
    "vllm": ModelServer(
        "/opt/vllm/bin/python3", "/opt/vllm/bin/vllm serve Qwen/Qwen3-Coder-Next-FP8 --port 8000", 97350
    ),
}


# The shipped GB10 recipes' models, in root's Hugging Face cache: the config as the hub serves it and stand-ins for the
# weights (tens of GB cannot be here): one shard large enough to be an LFS file (named by its SHA-256), one small.
HF_MODELS = ("Intel/Qwen3-Coder-Next-int4-AutoRound", "nvidia/Qwen3.6-35B-A3B-NVFP4", "unsloth/Qwen3.8-27B-NVFP4")


def _stand_in_shard(model_id: str, size: int) -> bytes:
    """A safetensors file of one uint8 tensor, `size` bytes of data derived from the model's name."""
    header = json.dumps({"stand_in": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}).encode()
    seed = hashlib.sha256(model_id.encode()).digest()
    return len(header).to_bytes(8, "little") + header + (seed * (size // len(seed) + 1))[:size]


def hf_model_files(model_id: str) -> dict[str, bytes]:
    config = json.dumps({"_name_or_path": model_id, "architectures": ["Qwen3ForCausalLM"]}, indent=2).encode()
    return {"config.json": config, "model-00001-of-00002.safetensors": _stand_in_shard(model_id, 3 << 20),
            "model-00002-of-00002.safetensors": _stand_in_shard(model_id, 4096)}


@dataclass
class HostSpec:
    """What the test host shows. The defaults are a GOOD DGX Spark; change one field to break it one way."""

    arch: str = "aarch64"  # uname -m
    kernel: str = "6.17.0-1029-nvidia"  # the running kernel: uname -r, /proc/version
    # False: the running kernel is not installed (no /boot/vmlinuz-*, dpkg entry or /lib/modules for it), as in a VM
    # booted from a kernel image outside it: the H200 VM's /boot listed no kernel at all.
    kernel_installed: bool = True
    fallback_kernels: list[str] = field(default_factory=lambda: ["6.17.0-1008-nvidia"])  # also installed
    # Installed and newer than the running kernel: GRUB's default (GRUB_DEFAULT=0) boots the newest next.
    newer_kernels: list[str] = field(default_factory=list)
    kernels_without_initramfs: list[str] = field(default_factory=list)  # installed, no /boot/initrd.img-*
    kernels_without_module: list[str] = field(default_factory=list)  # installed, no nvidia.ko at all
    module_versions: dict[str, str] = field(default_factory=dict)  # kernel -> its nvidia.ko's version
    half_configured: list[str] = field(default_factory=list)  # packages dpkg left half-configured
    driver_version: str | None = DEFAULT_DRIVER  # userspace (nvidia-smi, NVML); None: not installed
    # The loaded module (/sys/module/nvidia/version, /proc/driver/nvidia/version) and nvidia.ko on disk
    # (modinfo -F version, every kernel); None: the same as driver_version, as after a clean install.
    sys_module_version: str | None = None
    module_version: str | None = None
    module_loaded: bool = True  # False: no /sys/module/nvidia, nvidia-smi cannot reach the driver
    module_signer: str | None = CANONICAL_SIGNER  # of the running kernel's nvidia.ko; None: unsigned
    # Other kernels' nvidia.ko: kernel -> signer (None: unsigned). Left None: a Canonical-signed one for each
    # fallback kernel. A module not signed by Canonical lies where DKMS puts it (updates/dkms/), a Canonical
    # one where linux-modules-nvidia-<branch>-open puts it (kernel/nvidia-<branch>-open/).
    other_kernel_modules: dict[str, str | None] | None = None
    secure_boot: bool | None = True  # mokutil --sb-state; None: mokutil not installed
    gpu_name: str = "NVIDIA GB10"
    gpu_uuid: str = "GPU-d51f1f69-4063-9beb-b3e9-734334ec9006"
    compute_cap: str = "12.1"
    pci_bus_id: str = "0000000F:01:00.0"
    gpu_memory_mib: int | None = None  # None: unified memory, nvidia-smi prints [N/A] and Not Supported
    cuda_version: str | None = None  # nvidia-smi's "CUDA Version"; None: the driver branch's
    nvml_mismatch: bool | None = None  # None: as on a real box, when the loaded module != driver_version
    mem_total_kb: int = 127600748  # /proc/meminfo, recorded from an idle Spark
    mem_available_kb: int = 118566368
    mem_free_kb: int | None = None  # None: an idle box's; less: page cache holds the rest (a model read once)
    model_servers: list[str] = field(default_factory=list)  # keys of MODEL_SERVERS, running in the host
    os_release: str | None = UBUNTU_NOBLE  # /etc/os-release; None: the rootfs's own (Debian 12)
    extra_packages: tuple[str, ...] = ()  # more Debian packages in the rootfs (e.g. docker.io); own cache
    setup_hook: str | None = None  # sh run in the host's namespaces before its init; $1 is the host's root
    hf_models: tuple[str, ...] = HF_MODELS  # in root's Hugging Face cache (/root/.cache/huggingface)
    hf_cut: tuple[str, str] | None = None  # (model, file) whose blob lost its second half
    # A real docker engine (Debian's docker.io) in the host: cgroups bound in, a data root that is not on the
    # overlay, dockerd started by init (no bridge, no iptables: containers use the host's network).
    docker: bool = False
    binds: tuple[str, ...] = ()  # paths of this machine bound read-only at the same path in the host

    @property
    def packages(self) -> tuple[str, ...]:
        return (*self.extra_packages, "docker.io") if self.docker else self.extra_packages

    @property
    def loaded_version(self) -> str | None:
        if not self.module_loaded:
            return None
        return self.sys_module_version or self.driver_version or DEFAULT_DRIVER

    @property
    def ko_version(self) -> str:
        return self.module_version or self.driver_version or DEFAULT_DRIVER

    @property
    def kernels(self) -> list[str]:
        """Every installed kernel."""
        return [*([self.kernel] if self.kernel_installed else []), *self.fallback_kernels, *self.newer_kernels]

    def modules(self) -> dict[str, str | None]:
        """kernel -> signer of its nvidia.ko (None: unsigned), for every installed kernel that has one."""
        others = self.other_kernel_modules
        if others is None:
            others = {k: CANONICAL_SIGNER for k in [*self.fallback_kernels, *self.newer_kernels]}
        found = {**others, self.kernel: self.module_signer}
        return {k: v for k, v in found.items() if k in self.kernels and k not in self.kernels_without_module}


def cache_dir() -> Path:
    return Path(os.environ.get("SPARKGATE_CACHE", REPO / ".cache")) / "testhost"


# -- the rootfs and the files of a host ----------------------------------------------------------------------


def ensure_build_tools() -> None:
    """apt-get install what this side lacks, running apt-get update only when installing fails."""
    fmt = "-f=${Package} ${Status}\n"
    res = subprocess.run(["dpkg-query", "-W", fmt, *BUILD_TOOLS], capture_output=True, text=True)
    installed = {line.split()[0] for line in res.stdout.splitlines() if line.endswith(" installed")}
    missing = [p for p in BUILD_TOOLS if p not in installed]
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        # Its status does not decide: some other source of this machine's apt may be unreachable.
        subprocess.run(["apt-get", "update"], env=env, capture_output=True)
        _run(install, env=env)


def build_rootfs(extra_packages: Sequence[str] = ()) -> Path:
    """The Debian rootfs of the test hosts, debootstrapped once into the cache, then reused.

    Built into a temporary directory under a lock and renamed when complete, so that a crash leaves nothing
    a later call would take for a rootfs (and the later call removes what it left).
    """
    packages = sorted(set(BASE_PACKAGES) | set(extra_packages))
    key = hashlib.sha256(f"{SUITE} {MIRROR} {packages} {ROOTFS_LAYOUT}".encode()).hexdigest()[:12]
    root = cache_dir() / f"rootfs-{SUITE}-{key}"
    stamp = root / ".sparkgate-rootfs.json"
    if stamp.exists():
        return root
    ensure_build_tools()
    with _locked(cache_dir() / "build.lock"):
        if stamp.exists():
            return root
        for stale in root.parent.glob(f"{root.name}*"):
            _rm_tree(stale)
        tmp = root.with_name(f"{root.name}.tmp{os.getpid()}")
        started = time.monotonic()
        include = f"--include={','.join(packages)}"
        debootstrap = ["debootstrap", "--variant=minbase", include, SUITE, str(tmp), MIRROR]
        _run(debootstrap, preexec_fn=_die_with_parent)
        _rm_tree(tmp / "var/cache/apt/archives")
        (tmp / "var/cache/apt/archives/partial").mkdir(parents=True)
        info = dict(suite=SUITE, mirror=MIRROR, packages=packages, seconds=round(time.monotonic() - started))
        (tmp / stamp.name).write_text(json.dumps(info) + "\n")  # last: it makes the directory a rootfs
        os.rename(tmp, root)
    return root


def make_module(path: Path, kernel: str, version: str, signer: str | None, arch: str = "aarch64") -> None:
    """A kernel-module-shaped ELF object that the real modinfo reads: a .modinfo section and, when signed, a
    PKCS#7 signature appended as the kernel's scripts/sign-file appends it (no signed attributes, no
    certificates, signer by issuer and serial), then struct module_signature and the magic string."""
    srcversion = hashlib.md5(f"nvidia {version}".encode()).hexdigest()[:23].upper()
    fields = [f"version={version}", "license=Dual MIT/GPL"]
    fields += [f"firmware=nvidia/{version}/gsp_ga10x.bin", f"firmware=nvidia/{version}/gsp_tu10x.bin"]
    fields += [f"srcversion={srcversion}", "alias=pci:v000010DEd*sv*sd*bc03sc02i00*"]
    fields += ["alias=pci:v000010DEd*sv*sd*bc03sc00i00*", "depends=", "name=nvidia"]
    fields += [f"vermagic={kernel} SMP preempt mod_unload modversions {arch}"]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "modinfo").write_bytes(b"".join(f.encode() + b"\0" for f in fields))
        _run(["as", "-o", str(t / "empty.o"), "/dev/null"])
        section = [f"--add-section=.modinfo={t / 'modinfo'}", "--set-section-flags=.modinfo=alloc,readonly"]
        _run(["objcopy", *section, str(t / "empty.o"), str(t / "nvidia.ko")])
        data = (t / "nvidia.ko").read_bytes()
        if signer is not None:
            key, cert = _signing_key(signer)
            sign = "openssl cms -sign -binary -noattr -nocerts -md sha512 -outform DER".split()
            _run(
                [*sign, "-in", f"{t}/nvidia.ko", "-signer", str(cert), "-inkey", str(key), "-out", f"{t}/sig"]
            )
            sig = (t / "sig").read_bytes()
            # struct module_signature: algo, hash, id_type (2: PKCS#7), signer_len, key_id_len, pad[3], length
            data += sig + bytes([0, 0, 2, 0, 0, 0, 0, 0]) + len(sig).to_bytes(4, "big")
            data += b"~Module signature appended~\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _signing_key(signer: str) -> tuple[Path, Path]:
    """A key made here and a self-signed certificate whose CN is `signer`, cached.

    A Canonical name on such a certificate is a test fixture: modinfo prints the CN of the signature's
    issuer, which is all the suite reads; nothing here is, or verifies as, Canonical's key.
    """
    slug = hashlib.sha256(signer.encode()).hexdigest()[:12]
    key = cache_dir() / "tools" / f"signer-{slug}.key"

    def make(cert: Path) -> None:
        subj = "/CN=" + signer.replace("/", r"\/")
        new = "openssl req -new -x509 -newkey rsa:2048 -nodes -days 36500".split()
        _run([*new, "-subj", subj, "-keyout", str(key), "-out", str(cert)])

    return key, _cached_file(f"signer-{slug}.crt", make)  # the key is complete once its cert is in place


def _idle_binary() -> Path:
    src = FILES / "idle.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    return _cached_file(
        f"idle-{digest}", lambda out: _run(["gcc", "-static", "-Os", "-o", str(out), str(src)])
    )


def _cached_file(name: str, make: Callable[[Path], Any]) -> Path:
    """cache/tools/name, made once by make(temporary path) and renamed into place."""
    path = cache_dir() / "tools" / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.with_name(f".{name}.lock")):
            if not path.exists():
                tmp = path.with_name(f".{name}.{os.getpid()}")
                make(tmp)
                os.rename(tmp, path)
    return path


MEMINFO = """\
MemTotal {total}|MemFree {free}|MemAvailable {avail}|Buffers 105316|Cached {cached}|SwapCached 0
Active {active}|Inactive {inactive}|Active(anon) {anon}|Inactive(anon) 0|Active(file) {active_file}
Inactive(file) {inactive}|Unevictable 30720|Mlocked 27648|SwapTotal 0|SwapFree 0|Zswap 0|Zswapped 0
Dirty 412|Writeback 0|AnonPages {anon}|Mapped 618424|Shmem 40212|KReclaimable {sreclaim}|Slab {slab}
SReclaimable {sreclaim}|SUnreclaim 402118|KernelStack 19872|PageTables 25304|SecPageTables 0
NFS_Unstable 0|Bounce 0|WritebackTmp 0|CommitLimit {commit_limit}|Committed_AS {anon}
VmallocTotal 135288315904|VmallocUsed 98112|VmallocChunk 0|Percpu 14720|AnonHugePages 0
ShmemHugePages 0|ShmemPmdMapped 0|FileHugePages 0|FilePmdMapped 0|Balloon 0|HugePages_Total 0
HugePages_Free 0|HugePages_Rsvd 0|HugePages_Surp 0|Hugepagesize 2048|Hugetlb 0"""


def meminfo(total_kb: int, available_kb: int, free_kb: int | None = None) -> str:
    """A /proc/meminfo in the kernel's format (all the usual lines, in kB) with these MemTotal and
    MemAvailable (and MemFree, if given: the rest of what is available is page cache); the other values are made up
    to agree with them."""
    cached, sreclaim = min(available_kb // 20, 5_893_120), min(available_kb // 60, 1_412_332)
    free = max(available_kb - cached // 2 - sreclaim // 2 - 105_316, 0)
    if free_kb is not None:
        free, cached = free_kb, max(available_kb - free_kb - 105_316, 0)
    anon = max(total_kb - free - cached - 105_316, 0)
    values = dict(total=total_kb, free=free, avail=available_kb, cached=cached, sreclaim=sreclaim)
    values |= dict(active=anon + cached // 3, inactive=cached - cached // 3, active_file=cached // 3)
    values |= dict(anon=anon, slab=sreclaim + 402_118, commit_limit=total_kb // 2)
    lines = []
    for item in MEMINFO.format(**values).replace("\n", "|").split("|"):
        key, value = item.split()
        unit = "" if key.startswith("HugePages_") else " kB"
        lines.append(f"{key + ':':<16}{int(value):>8}{unit}\n")
    return "".join(lines)


DPKG_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
DPKG_STANZA = """\
Package: {package}
Status: install ok installed
Priority: optional
Section: {section}
Installed-Size: 4096
Maintainer: Ubuntu Kernel Team <kernel-team@lists.ubuntu.com>
Architecture: {arch}
Source: {source}
Version: {version}
Description: {description}
 Stand-in entry of the sparkgate test host."""


def _stanza(package: str, version: str, source: str, description: str, section: str = "kernel") -> str:
    return DPKG_STANZA.format(arch=DPKG_ARCH, **locals())  # dpkg's own architecture: dpkg is this box's


def _kernel_parts(kernel: str) -> tuple[str, int]:
    """6.17.0-1029-nvidia -> ("6.17.0", 1029)."""
    base, _, rest = kernel.partition("-")
    abi = rest.split("-")[0]
    return base, int(abi) if abi.isdigit() else 0


def _uname_v(kernel: str) -> str:
    return f"#{_kernel_parts(kernel)[1] % 1000}-Ubuntu SMP PREEMPT_DYNAMIC Thu Oct 23 14:02:11 UTC 2025"


def _cuda_version(driver: str) -> str:
    branch = int(driver.split(".")[0])
    return "13.2" if branch >= 595 else "13.1" if branch >= 590 else "13.0" if branch >= 580 else "12.8"


# -- the host ------------------------------------------------------------------------------------------------


class TestHost:
    """A live test host: `with TestHost(spec) as host:`, or start() and stop()."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        spec: HostSpec | None = None,
        name: str = "spark01",
        index: int = 0,
        die_with_parent: bool = True,
    ) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,11}", name) or not 0 <= index <= 255:
            raise ValueError(f"name {name!r} (a-z0-9-, at most 12) or index {index} (0..255) is not usable")
        self.spec = spec or HostSpec()
        self.name = name
        self.index = index
        self.netns = f"sg-{name}"
        self.veth = f"sg{index}-{name}"[:15]  # this side; the host's side is its eth0
        self.gateway = f"{NET_PREFIX}.{index}.1"
        self.address = f"{NET_PREFIX}.{index}.2"
        self.rundir = cache_dir() / "run" / name  # upper dir, keys, ssh_config, log
        self.ssh_config = self.rundir / "ssh_config"
        self.identity = self.rundir / "id_ed25519"
        self.log = self.rundir / "host.log"  # hostinit.sh, init and sshd -e
        self.die_with_parent = die_with_parent  # False: the host outlives this process (the CLI's `up`)
        self._proc: subprocess.Popen[bytes] | None = None  # unshare
        self._init_pid: int | None = None  # pid 1 of the host, as seen from here
        self._control_dir: Path | None = None

    def __enter__(self) -> TestHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> TestHost:
        if os.geteuid() != 0:
            raise PermissionError("a sparkgate test host needs root (network namespaces, mounts)")
        try:
            self.stop()  # what a crashed run of the same name left
            rootfs = build_rootfs(self.spec.packages)
            self._prepare(rootfs)
            self._network()
            self._launch(rootfs)
            self._wait_for_sshd(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill what start() started (by pid), delete the netns and veth, remove the per-host dir.
        Safe to call twice, after a failed start, and on what a crashed run left."""
        if self.ssh_config.exists():  # a ControlPersist master outlives its ssh clients
            ssh = ["ssh", "-F", str(self.ssh_config), "-O"]
            check = subprocess.run([*ssh, "check", self.name], capture_output=True, text=True, timeout=10)
            if master := re.search(r"pid=(\d+)", check.stderr):
                subprocess.run([*ssh, "exit", self.name], capture_output=True, timeout=10)
                _wait_gone(int(master[1]))
        self._stop_docker()
        self._kill()
        self._remove_cgroups()
        if Path(f"/run/netns/{self.netns}").exists():
            _run(["ip", "netns", "delete", self.netns])
        # The netns takes the veth pair along (a moment later); a crashed run's may still be there.
        res = subprocess.run(["ip", "link", "delete", self.veth], capture_output=True, text=True)
        if res.returncode != 0 and Path(f"/sys/class/net/{self.veth}").exists():
            raise RuntimeError(f"ip link delete {self.veth}: {res.stderr}")
        _rm_tree(self.rundir)
        if self._control_dir:
            _rm_tree(self._control_dir)
            self._control_dir = None

    @property
    def cgroup_parent(self) -> str:
        return f"sparkgate-testhost-{self.name}"

    def _stop_docker(self) -> None:
        """Remove the host's containers and stop its dockerd while they can still clean up after themselves."""
        if not self.spec.docker or self._init_pid is None:
            return
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.run('ids=$(docker ps -aq 2>/dev/null); [ -z "$ids" ] || docker rm -f $ids >/dev/null 2>&1; '
                     'pid=$(cat /run/docker.pid 2>/dev/null) && kill "$pid" && '
                     'for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done', timeout=40)

    def _remove_cgroups(self) -> None:
        """The host engine's cgroups (empty once its processes are gone), in every hierarchy."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / self.cgroup_parent
            if top.is_dir():
                for d in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                    if d.is_dir():
                        with contextlib.suppress(OSError):
                            d.rmdir()
                with contextlib.suppress(OSError):
                    top.rmdir()

    def _kill(self) -> None:
        pids: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            pids = json.loads((self.rundir / "pids.json").read_text())
        if pids.get("control_dir"):
            self._control_dir = Path(pids["control_dir"])
        # A recorded pid is killed only while it is still ours: init by its root (our overlay), unshare by its
        # command line (it names our rundir).
        init = self._init_pid or pids.get("init")
        if init and _proc_root(init) == str(self.rundir / "merged"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)  # pid 1 of the host's pid namespace: the kernel kills the rest
        if self._proc:  # our child: its pid is ours until we reap it
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
        elif (unshare := pids.get("unshare")) and str(self.rundir).encode() in _proc_cmdline(unshare):
            with contextlib.suppress(ProcessLookupError):
                os.kill(unshare, signal.SIGKILL)
            _wait_gone(unshare)
        if init:
            _wait_gone(init)
        self._proc = self._init_pid = None

    def _prepare(self, rootfs: Path) -> None:
        """The per-host dir: the upper dir (all this host changes on the rootfs), the files bound over /proc,
        the ssh key and config."""
        spec = self.spec
        for d in ("upper", "work", "merged", "proc"):
            (self.rundir / d).mkdir(parents=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", str(self.identity)])
        upper = _Upper(rootfs, self.rundir / "upper")

        upper.write("etc/hostname", f"{self.name}\n")
        upper.write("etc/hosts", f"127.0.0.1\tlocalhost\n{self.address}\t{self.name}\n")
        if spec.os_release is not None:
            upper.write("usr/lib/os-release", spec.os_release)
        upper.write("root/.ssh/authorized_keys", Path(f"{self.identity}.pub").read_text(), mode=0o600)
        upper.path("root/.ssh").chmod(0o700)
        upper.write(
            "etc/ssh/sshd_config.d/sparkgate.conf",
            f"ListenAddress {self.address}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nUseDNS no\nMaxSessions 64\nMaxStartups 64:30:128\n",
        )
        upper.copy(FILES / "init", "usr/local/lib/sparkgate-testhost/init")
        for model_id in spec.hf_models:
            cut = spec.hf_cut[1] if spec.hf_cut and spec.hf_cut[0] == model_id else None
            blobs, links = hfmodel.layout(model_id, hf_model_files(model_id), cut)
            for rel, content in blobs.items():
                upper.path(f"root/.cache/huggingface/{rel}").write_bytes(content)
            for rel, target in links.items():
                upper.path(f"root/.cache/huggingface/{rel}").symlink_to(target)
        if spec.setup_hook:
            (self.rundir / "hook").write_text(spec.setup_hook)
        if spec.binds:
            (self.rundir / "binds").write_text("".join(f"{os.path.abspath(p)}\n" for p in spec.binds))
        if spec.docker:
            (self.rundir / "docker-data").mkdir()
            # Its own cgroup parent, so that stop() removes exactly this engine's cgroups.
            args = f"--bridge=none --iptables=false --ip-masq=false --cgroup-parent=/{self.cgroup_parent}"
            upper.write("etc/sparkgate-testhost/dockerd.args", args + "\n")

        # The stand-ins, and what they print.
        upper.write("etc/sparkgate-testhost/standin.env", self._standin_env())
        upper.copy(FILES / "uname", "usr/local/bin/uname")
        if spec.driver_version is not None:
            upper.copy(FILES / "nvidia-smi", "usr/bin/nvidia-smi")
        if spec.secure_boot is not None:
            upper.copy(FILES / "mokutil", "usr/bin/mokutil")
        servers = ""
        for server in spec.model_servers:
            s = MODEL_SERVERS[server]
            upper.copy(_idle_binary(), s.exe)
            servers += f"{s.gpu_mib}|{s.exe}|{s.exe} {s.args}\n"
        upper.write("etc/sparkgate-testhost/model-servers", servers)

        # Kernels, their nvidia.ko, and dpkg's view of them.
        stanzas = [(rootfs / "var/lib/dpkg/status").read_text().strip()]
        for kernel in spec.kernels:
            base, abi = _kernel_parts(kernel)
            upper.write(f"boot/vmlinuz-{kernel}", "stand-in kernel image\n", mode=0o600)
            if kernel not in spec.kernels_without_initramfs:
                upper.write(f"boot/initrd.img-{kernel}", "stand-in initramfs\n", mode=0o600)
            image = f"Signed kernel image {kernel.rsplit('-', 1)[-1]}"
            stanzas.append(
                _stanza(f"linux-image-{kernel}", f"{base}-{abi}.{abi % 1000}", "linux-signed", image)
            )
        branch = spec.ko_version.split(".")[0]
        for kernel, signer in spec.modules().items():
            if signer == CANONICAL_SIGNER:
                rel = f"kernel/nvidia-{branch}-open/nvidia.ko"
                base, abi = _kernel_parts(kernel)
                package, version = (
                    f"linux-modules-nvidia-{branch}-open-{kernel}",
                    f"{base}-{abi}.{abi % 1000}+1",
                )
                stanzas.append(
                    _stanza(package, version, "linux-restricted-modules", "Linux kernel nvidia modules")
                )
            else:
                rel = "updates/dkms/nvidia.ko"
            version = spec.module_versions.get(kernel, spec.ko_version)
            make_module(upper.path(f"lib/modules/{kernel}/{rel}"), kernel, version, signer, spec.arch)
            for empty in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):  # for depmod
                upper.write(f"lib/modules/{kernel}/{empty}", "")
        if spec.driver_version is not None:
            ubranch = spec.driver_version.split(".")[0]
            package, version = f"nvidia-driver-{ubranch}-open", f"{spec.driver_version}-0ubuntu1"
            source = f"nvidia-graphics-drivers-{ubranch}"
            stanzas.append(_stanza(package, version, source, "NVIDIA driver metapackage", "restricted/misc"))
        for package in spec.half_configured:
            stanzas.append(_stanza(package, "595.84-0ubuntu1", "nvidia-graphics-drivers-595", "NVIDIA DKMS "
                                   "module source", "restricted/misc").replace("install ok installed",
                                                                               "install ok half-configured"))
        upper.write("var/lib/dpkg/status", "\n\n".join(stanzas) + "\n")
        for stanza in stanzas[1:]:  # what dpkg --audit wants of an installed package: its file list and sums
            package = stanza.split("\n", 1)[0].removeprefix("Package: ")
            upper.write(f"var/lib/dpkg/info/{package}.list", "/.\n")
            upper.write(f"var/lib/dpkg/info/{package}.md5sums", "")
        # GRUB boots its first entry, the newest kernel, and /boot/vmlinuz points there (as on Ubuntu).
        upper.write("etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_TIMEOUT_STYLE=hidden\nGRUB_TIMEOUT=0\n'
                    'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n')
        if spec.kernels:
            newest = max(spec.kernels, key=lambda k: tuple(int(p) for p in re.findall(r"\d+", k)))
            upper.path("boot/vmlinuz").symlink_to(f"vmlinuz-{newest}")

        # The loaded module (sys stays a plain directory), and the files hostinit.sh binds over /proc.
        proc = self.rundir / "proc"
        (proc / "meminfo").write_text(meminfo(spec.mem_total_kb, spec.mem_available_kb, spec.mem_free_kb))
        (proc / "osrelease").write_text(f"{spec.kernel}\n")
        buildd = "bos03-arm64-047" if spec.arch == "aarch64" else "lcy02-amd64-051"
        (proc / "version").write_text(
            f"Linux version {spec.kernel} (buildd@{buildd}) ({spec.arch}-linux-gnu-gcc-13 (Ubuntu "
            f"13.3.0-6ubuntu2~24.04) 13.3.0, GNU ld (GNU Binutils for Ubuntu) 2.42) {_uname_v(spec.kernel)}\n"
        )
        modules = "ipv6 651264 30 - Live 0x0000000000000000\n"
        if spec.loaded_version is not None:
            upper.write("sys/module/nvidia/version", f"{spec.loaded_version}\n")
            taint = "(O)" if spec.module_signer else "(OE)"
            modules = f"nvidia 14290944 0 - Live 0x0000000000000000 {taint}\n" + modules
            (proc / "driver/nvidia").mkdir(parents=True)
            (proc / "driver/nvidia/version").write_text(
                f"NVRM version: NVIDIA UNIX Open Kernel Module for {spec.arch}  {spec.loaded_version}  "
                "Release Build  (dvs-builder@U22-I3-AM02-24-3)  Wed Jan  7 22:51:36 UTC 2026\n"
                "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04.1) \n"
            )
        (proc / "modules").write_text(modules)
        self._write_ssh_config()

    def _standin_env(self) -> str:
        spec = self.spec
        driver = spec.driver_version or ""
        env = {
            "ARCH": spec.arch,
            "KERNEL_RELEASE": spec.kernel,
            "KERNEL_VERSION": _uname_v(spec.kernel),
            "SECURE_BOOT": "enabled" if spec.secure_boot else "disabled",
            "GPU_NAME": spec.gpu_name,
            "GPU_UUID": spec.gpu_uuid,
            "DRIVER_VERSION": driver,
            "CUDA_VERSION": spec.cuda_version or (_cuda_version(driver) if driver else ""),
            "COMPUTE_CAP": spec.compute_cap,
            "PCI_BUS_ID": spec.pci_bus_id,
            "MEMORY_TOTAL_MIB": "" if spec.gpu_memory_mib is None else str(spec.gpu_memory_mib),
            # An idle GB10 as in FACTS.md; a discrete GPU would have ECC 0, MIG Disabled and a power cap.
            "TEMP": "41",
            "PSTATE": "P8",
            "POWER_W": "4",
            "POWER_CAP_W": "",
            "MIG_MODE": "N/A",
            "NVML_MISMATCH": {None: "auto", True: "yes", False: "no"}[spec.nvml_mismatch],
        }
        return "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items())

    def _write_ssh_config(self) -> None:
        control = self.rundir / "cm"
        if len(str(control)) > 80:  # a socket path has 108 bytes, and ssh first adds a 17-byte suffix
            self._control_dir = Path(tempfile.mkdtemp(prefix=f"sg-{self.index}-"))
            control = self._control_dir / "cm"
        self.ssh_config.write_text(
            f"Host {self.name}\n  HostName {self.address}\n  User root\n  IdentityFile {self.identity}\n"
            "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n  BatchMode yes\n  ConnectTimeout 10\n"
            f"  ControlMaster auto\n  ControlPath {control}\n  ControlPersist 60\n"
        )

    def _network(self) -> None:
        _run(["ip", "netns", "add", self.netns])
        _run(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns])
        _run(["ip", "addr", "add", f"{self.gateway}/30", "dev", self.veth])
        _run(["ip", "link", "set", self.veth, "up"])
        _run(["ip", "-n", self.netns, "addr", "add", f"{self.address}/30", "dev", "eth0"])
        _run(["ip", "-n", self.netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", self.netns, "link", "set", "lo", "up"])

    def _launch(self, rootfs: Path) -> None:
        enter = f"nsenter --net=/run/netns/{self.netns} --".split()
        # --kill-child: pid 1 of the host dies with unshare, and with it (the kernel sees to it) all the host.
        new = "unshare --uts --ipc --mount --pid --fork --kill-child --propagation private".split()
        cmd = [*enter, *new, "/bin/sh", str(HERE / "hostinit.sh"), str(rootfs), str(self.rundir), self.name]
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": PATH_IN_HOST, "LANG": "C.UTF-8"},
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        deadline = time.monotonic() + 10
        children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children")
        while self._init_pid is None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                self._init_pid = int(children.read_text().split()[0])
            if self._init_pid is None:
                self._check_alive(deadline)
                time.sleep(0.01)
        pids = {
            "unshare": self._proc.pid,
            "init": self._init_pid,
            "control_dir": str(self._control_dir or ""),
        }
        (self.rundir / "pids.json").write_text(json.dumps(pids))

    def _wait_for_sshd(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection((self.address, 22), timeout=1) as s:
                if s.recv(4) == b"SSH-":
                    return
            self._check_alive(deadline)
            time.sleep(0.05)

    def _check_alive(self, deadline: float) -> None:
        assert self._proc is not None
        if self._proc.poll() is not None or time.monotonic() > deadline:
            what = "exited" if self._proc.poll() is not None else "did not come up"
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"test host {self.name} {what}; {self.log}:\n{tail}")

    def run(self, cmd: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `sh -c cmd` inside the host, in its namespaces and root (not over ssh)."""
        if self._init_pid is None:
            raise RuntimeError(f"test host {self.name} is not running")
        enter = ["nsenter", "-t", str(self._init_pid), *"-m -u -i -n -p -r -w --".split()]
        env = {"PATH": PATH_IN_HOST, "HOME": "/root", "LANG": "C.UTF-8"}
        argv = [*enter, "/bin/sh", "-c", cmd]
        return subprocess.run(argv, capture_output=True, text=True, env=env, check=check, timeout=timeout)

    def ssh(self, cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run cmd over real ssh, with the host's ssh config."""
        argv = ["ssh", "-F", str(self.ssh_config), self.name, cmd]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def testinfra_host(self, backend: str = "ssh") -> Any:
        """A testinfra Host for this host: over `ssh` (OpenSSH, multiplexed) or `paramiko`."""
        import testinfra

        return testinfra.get_host(f"{backend}://{self.name}", ssh_config=str(self.ssh_config))


class _Upper:
    """Writes into an overlay upper dir, following the lower dir's directory symlinks (merged /usr: /lib is
    usr/lib) and giving the directories it creates the lower dir's mode (/root stays 0700)."""

    def __init__(self, lower: Path, upper: Path) -> None:
        self.lower, self.upper = lower, upper

    def path(self, rel: str) -> Path:
        resolved = self._resolve(Path(rel.lstrip("/")))
        for part in reversed(resolved.parents[:-1]):  # parents, outermost first, without "."
            if not (self.upper / part).exists():
                lower = self.lower / part
                (self.upper / part).mkdir()
                (self.upper / part).chmod(lower.stat().st_mode & 0o7777 if lower.is_dir() else 0o755)
        return self.upper / resolved

    def write(self, rel: str, text: str, mode: int = 0o644) -> None:
        p = self.path(rel)
        p.write_text(text)
        p.chmod(mode)

    def copy(self, src: Path, rel: str, mode: int = 0o755) -> None:
        p = self.path(rel)
        shutil.copyfile(src, p)
        p.chmod(mode)

    def _resolve(self, rel: Path) -> Path:
        out = Path()
        for i, part in enumerate(rel.parts):
            link = self.lower / out / part
            if link.is_symlink() and i < len(rel.parts) - 1:
                target = Path(os.readlink(link))
                out = self._resolve(target.relative_to("/") if target.is_absolute() else out / target)
            else:
                out = out / part
        return out


# -- processes and files -------------------------------------------------------------------------------------


def _run(cmd: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a command; raise with its output when it fails."""
    res = subprocess.run(list(cmd), capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {res.returncode}:\n{res.stdout}{res.stderr}")
    return res


def _rm_tree(path: Path) -> None:
    """rm -rf that never crosses into a mount (a killed debootstrap leaves proc mounted in its target)."""
    if not path.exists():
        return
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    for point in sorted((p for p in points if p == str(path) or p.startswith(f"{path}/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG; SIGKILL, because unshare --fork ignores SIGTERM (its child is meant to handle it).
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _proc_cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _proc_root(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/root")
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie (a killed child stays one until its parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


# -- for humans ----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m selftest.testhost.spark01", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["up", "down", "build"])
    parser.add_argument("--name", default="spark01")
    parser.add_argument("--index", type=int, default=0, help="the host is at 10.213.INDEX.2")
    parser.add_argument("--driver", dest="driver_version", help="userspace driver version (nvidia-smi)")
    parser.add_argument("--module-version", help="nvidia.ko version on disk")
    parser.add_argument("--sys-module-version", help="loaded module version (/sys/module/nvidia/version)")
    parser.add_argument("--signer", dest="module_signer", help="signer of the running kernel's nvidia.ko")
    parser.add_argument("--unsigned", action="store_true", help="the running kernel's nvidia.ko is unsigned")
    parser.add_argument("--module-not-loaded", action="store_true")
    parser.add_argument("--kernel", help="the running kernel release")
    parser.add_argument("--arch", help="uname -m")
    parser.add_argument("--no-fallback", action="store_true", help="no fallback kernel")
    parser.add_argument("--secure-boot", choices=["enabled", "disabled", "absent"])
    parser.add_argument("--mem-available-kb", type=int)
    parser.add_argument("--model-server", action="append", choices=sorted(MODEL_SERVERS), default=[])
    parser.add_argument("--docker", action="store_true", help="a real docker engine in the host (docker.io)")
    args = parser.parse_args(argv)
    if args.action == "build":
        print(build_rootfs())
        return 0

    spec = HostSpec(model_servers=args.model_server, docker=args.docker)
    for attr in ("driver_version", "module_version", "sys_module_version", "module_signer", "kernel", "arch"):
        if getattr(args, attr) is not None:
            setattr(spec, attr, getattr(args, attr))
    if args.mem_available_kb is not None:
        spec.mem_available_kb = args.mem_available_kb
    if args.unsigned:
        spec.module_signer = None
    spec.module_loaded = not args.module_not_loaded
    if args.no_fallback:
        spec.fallback_kernels = []
    if args.secure_boot:
        spec.secure_boot = {"enabled": True, "disabled": False, "absent": None}[args.secure_boot]

    host = TestHost(spec, name=args.name, index=args.index, die_with_parent=False)
    if args.action == "down":
        host.stop()
        print(f"{host.name} is down")
        return 0
    started = time.monotonic()
    host.start()
    print(f"{host.name} is up at {host.address} in {time.monotonic() - started:.1f} s:")
    print(f"  ssh -F {host.ssh_config} {host.name}")
    print(f"  python -m selftest.testhost.spark01 down --name {host.name} --index {host.index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
