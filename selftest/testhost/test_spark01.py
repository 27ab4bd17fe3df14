"""The test host itself, checked over real ssh: a good GB10 shows what a Spark shows, a broken one differs
exactly where it was broken, and nothing is left behind."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import testinfra

from .spark01 import CANONICAL_SIGNER, HostSpec, TestHost, alive

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a test host needs root (network namespaces, mounts)"
)

GPU_QUERY = (
    "nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,memory.used,memory.free,pci.bus_id"
)
RUNNING_MODULE = "$(find /lib/modules/$(uname -r) -name 'nvidia.ko*' | head -1)"


def ssh_host(host: TestHost, backend: str = "ssh"):
    return testinfra.get_host(f"{backend}://{host.name}", ssh_config=str(host.ssh_config))


@pytest.fixture(scope="class")
def spark():
    """A good spark01, up for the tests of one class."""
    with TestHost(HostSpec()) as host:
        yield host


@pytest.fixture(scope="class")
def host(spark):
    return ssh_host(spark)


class TestGoodSpark:
    def test_its_hostname_is_spark01(self, host):
        assert host.check_output("hostname") == "spark01"

    def test_uname_says_aarch64_and_the_nvidia_kernel(self, host):
        assert host.check_output("uname -m") == "aarch64"
        assert host.check_output("uname -r") == "6.17.0-1029-nvidia"
        assert host.system_info.arch == "aarch64"

    def test_nvidia_smi_csv_prints_the_gb10_row_with_na_memory(self, host):
        out = host.check_output(f"{GPU_QUERY} --format=csv,noheader")
        assert out == "NVIDIA GB10, 595.84, 12.1, [N/A], [N/A], [N/A], 0000000F:01:00.0"

    def test_nvidia_smi_table_says_not_supported_for_memory(self, host):
        table = host.check_output("nvidia-smi")
        assert (
            "| NVIDIA-SMI 595.84                 Driver Version: 595.84         CUDA Version: 13.2     |"
            in table
        )
        assert (
            "|   0  NVIDIA GB10                    On  |   0000000F:01:00.0 Off |                  N/A |"
            in table
        )
        assert "| Not Supported          |" in table
        assert "No running processes found" in table

    def test_nvidia_smi_xml_states_the_recorded_clock_elements_nested_as_recorded(self, host):
        """Every element the stand-in's `-q -x` prints is in the real driver's document at the same path."""
        import xml.etree.ElementTree as ET

        def paths(el, at=""):
            return {f"{at}/{el.tag}"} | {p for child in el for p in paths(child, f"{at}/{el.tag}")}

        recorded = Path(__file__).parents[1] / "data" / "hosts" / "h200-vm" / "under-load" / "load-q.xml"
        printed = paths(ET.fromstring(host.check_output("nvidia-smi -q -x")))
        real = paths(ET.fromstring(recorded.read_text()))
        assert printed <= real, printed - real
        counters = "/nvidia_smi_log/gpu/clocks_event_reasons_counters/clocks_event_reasons_counters_"
        assert {f"{counters}{c}" for c in ("sw_therm_slowdown", "hw_therm_slowdown", "hw_power_brake")} <= printed

    def test_running_kernels_module_is_canonical_signed_595_84(self, host):
        assert host.check_output(f"modinfo -F signer {RUNNING_MODULE}") == CANONICAL_SIGNER
        assert host.check_output(f"modinfo -F version {RUNNING_MODULE}") == "595.84"
        assert host.check_output("modinfo -F signer nvidia") == CANONICAL_SIGNER  # by name, as on a real box
        assert host.file("/sys/module/nvidia/version").content_string.strip() == "595.84"

    def test_fallback_kernel_is_installed_with_initramfs_and_a_signed_module(self, host):
        listed = host.check_output("dpkg-query -W -f='${Status} ${Package}\\n' 'linux-image-*'").splitlines()
        assert listed == [f"install ok installed linux-image-6.17.0-{abi}-nvidia" for abi in (1008, 1029)]
        assert host.file("/boot/initrd.img-6.17.0-1008-nvidia").exists
        signer = host.check_output("modinfo -k 6.17.0-1008-nvidia -F signer nvidia")
        assert signer == CANONICAL_SIGNER

    def test_secure_boot_is_enabled(self, host):
        assert host.check_output("mokutil --sb-state") == "SecureBoot enabled"

    def test_proc_meminfo_shows_the_specs_memory(self, host):
        meminfo = host.file("/proc/meminfo").content_string
        assert re.search(r"^MemTotal: +127600748 kB$", meminfo, re.M)
        assert re.search(r"^MemAvailable: +118566368 kB$", meminfo, re.M)
        assert host.run("free -k").rc == 0

    def test_ps_sees_only_the_hosts_processes(self, host):
        comms = host.check_output("ps -eo comm=").split()
        assert comms[0] == "init" and "sshd" in comms

    def test_run_inside_matches_ssh(self, spark, host):
        assert spark.run("hostname").stdout.strip() == host.check_output("hostname")

    def test_paramiko_backend_sees_the_same_host(self, spark):
        host = ssh_host(spark, "paramiko")
        assert host.check_output("hostname; uname -m") == "spark01\naarch64"

    def test_ten_commands_over_a_reused_connection_are_fast(self, spark, capsys):
        """The numbers of the report: OpenSSH with ControlMaster (as testinfra's ssh backend uses it, through
        the host's ssh_config), OpenSSH with a new connection each time, and paramiko's one connection."""

        def ten(run) -> float:
            started = time.monotonic()
            for _ in range(10):
                run()
            return time.monotonic() - started

        cfg = str(spark.ssh_config)
        subprocess.run(["ssh", "-F", cfg, "-O", "exit", spark.name], capture_output=True)
        fresh = ssh_host(spark)
        first = ten(lambda: fresh.check_output("true"))  # the first command opens the master
        mux = ten(lambda: fresh.check_output("true"))
        assert (
            subprocess.run(["ssh", "-F", cfg, "-O", "check", spark.name], capture_output=True).returncode == 0
        )
        no_mux = ["ssh", "-F", cfg, "-o", "ControlMaster=no", "-o", "ControlPath=none", spark.name, "true"]
        plain = ten(lambda: subprocess.run(no_mux, check=True))
        paramiko_host = ssh_host(spark, "paramiko")
        paramiko = ten(lambda: paramiko_host.check_output("true"))
        with capsys.disabled():
            print(
                f"\n10 x `true`: testinfra ssh, ControlMaster: first 10 {first:.3f} s, next 10 {mux:.3f} s;"
                f" ssh, no ControlMaster: {plain:.3f} s; testinfra paramiko: {paramiko:.3f} s"
            )
        assert mux < plain


class TestBrokenSparks:
    """One defect each; everything else as on the good host."""

    def test_driver_580_shows_in_nvidia_smi_and_modinfo(self):
        with TestHost(HostSpec(driver_version="580.159.03")) as spark:
            host = ssh_host(spark)
            assert host.check_output(f"{GPU_QUERY} --format=csv,noheader").split(", ")[1] == "580.159.03"
            assert "CUDA Version: 13.0" in host.check_output("nvidia-smi")
            assert host.check_output(f"modinfo -F version {RUNNING_MODULE}") == "580.159.03"

    def test_unsigned_dkms_module_has_no_signer(self):
        with TestHost(HostSpec(module_signer=None)) as spark:
            host = ssh_host(spark)
            module = host.check_output(f"echo {RUNNING_MODULE}")
            assert module == "/lib/modules/6.17.0-1029-nvidia/updates/dkms/nvidia.ko"
            assert host.check_output(f"modinfo -F signer {module}") == ""
            assert host.check_output(f"modinfo -F version {module}") == "595.84"

    def test_locally_signed_module_names_its_signer(self):
        with TestHost(HostSpec(module_signer="sparkgate test MOK")) as spark:
            assert ssh_host(spark).check_output(f"modinfo -F signer {RUNNING_MODULE}") == "sparkgate test MOK"

    def test_loaded_module_older_than_userspace_fails_nvml(self):
        with TestHost(HostSpec(sys_module_version="590.48")) as spark:
            res = ssh_host(spark).run(GPU_QUERY + " --format=csv")
            assert res.rc == 18
            assert (
                res.stdout == "Failed to initialize NVML: Driver/library version mismatch\n"
                "NVML library version: 595.84\n"
            )

    def test_fallback_kernel_with_an_unsigned_dkms_module(self):
        with TestHost(HostSpec(other_kernel_modules={"6.17.0-1008-nvidia": None})) as spark:
            host = ssh_host(spark)
            assert host.check_output("modinfo -k 6.17.0-1008-nvidia -F filename nvidia").endswith(
                "/updates/dkms/nvidia.ko"
            )
            assert host.check_output("modinfo -k 6.17.0-1008-nvidia -F signer nvidia") == ""
            assert host.check_output(f"modinfo -F signer {RUNNING_MODULE}") == CANONICAL_SIGNER

    def test_no_module_loaded(self):
        with TestHost(HostSpec(module_loaded=False)) as spark:
            host = ssh_host(spark)
            res = host.run("nvidia-smi")
            assert res.rc == 9 and "couldn't communicate with the NVIDIA driver" in res.stdout
            assert not host.file("/sys/module/nvidia/version").exists
            assert not host.file("/proc/driver/nvidia/version").exists

    def test_no_mokutil_no_fallback_less_memory(self):
        spec = HostSpec(secure_boot=None, fallback_kernels=[], mem_available_kb=24_000_000)
        with TestHost(spec) as spark:
            host = ssh_host(spark)
            assert not host.exists("mokutil")
            assert host.check_output("dpkg -l 'linux-image-*' | grep -c '^ii'") == "1"
            assert "MemAvailable:   24000000 kB" in host.file("/proc/meminfo").content_string

    def test_competing_model_servers_run_and_hold_gpu_memory(self):
        with TestHost(HostSpec(model_servers=["ollama", "vllm"])) as spark:
            host = ssh_host(spark)
            ps = dict(line.split(None, 1) for line in host.check_output("ps -eo pid=,args=").splitlines())
            apps = host.check_output(
                "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"
            )
            rows = apps.splitlines()
            assert rows[0] == "pid, process_name, used_gpu_memory [MiB]"
            by_name = {r.split(", ")[1]: r.split(", ") for r in rows[1:]}
            ollama = by_name["/usr/local/bin/ollama"]
            assert ps[ollama[0]] == "/usr/local/bin/ollama serve" and ollama[2] == "5210 MiB"
            vllm = by_name["/opt/vllm/bin/python3"]
            assert "vllm serve" in ps[vllm[0]]
            assert host.check_output("pgrep -x ollama") == ollama[0]
            assert " C   /usr/local/bin/ollama " in host.check_output("nvidia-smi")


def test_two_hosts_at_once_have_their_own_names_and_addresses():
    with (
        TestHost(HostSpec(), name="spark01", index=0) as a,
        TestHost(HostSpec(driver_version="580.159.03"), name="spark02", index=1) as b,
    ):
        assert (a.address, b.address) == ("10.213.0.2", "10.213.1.2")
        assert ssh_host(a).check_output("hostname") == "spark01"
        assert ssh_host(b).check_output("hostname") == "spark02"
        assert ssh_host(b).check_output(f"{GPU_QUERY} --format=csv,noheader").split(", ")[1] == "580.159.03"
        assert ssh_host(a).check_output(f"{GPU_QUERY} --format=csv,noheader").split(", ")[1] == "595.84"


def _traces(host: TestHost, pids: list[int]) -> list[str]:
    """What of `host` is still there, as seen from the root namespaces."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    if host.netns in (line.split()[0] for line in netns.splitlines() if line.strip()):
        found.append(f"netns {host.netns}")
    if Path(f"/sys/class/net/{host.veth}").exists():
        found.append(f"veth {host.veth}")
    if host.rundir.exists():
        found.append(str(host.rundir))
    if f"{host.rundir}/" in Path("/proc/self/mountinfo").read_text().replace(" ", "/ "):
        found.append("a mount of the host")
    found += [f"pid {pid}" for pid in pids if alive(pid)]  # a zombie is dead: its parent has yet to reap it
    for proc in Path("/proc").glob("[0-9]*"):  # (other test hosts may be running: only this one's count)
        try:
            cmdline = (proc / "cmdline").read_bytes() + b"\0"  # spark01's dir is a prefix of spark01d's: whole names
            if any(f"{host.rundir}{end}".encode() in cmdline for end in ("/", "\0")):
                found.append(f"process {proc.name}")
        except OSError:
            pass
    return found


def test_stop_leaves_nothing_behind_and_can_be_called_twice():
    host = TestHost(HostSpec(model_servers=["ollama", "llama-server"]))
    host.start()
    ssh_host(host).check_output("true")  # leaves a ControlPersist master on this side
    masters = subprocess.run(["pgrep", "-f", f"^ssh: {host.rundir}/"], capture_output=True, text=True).stdout
    pids = [host._init_pid, host._proc.pid, *map(int, masters.split())]
    assert masters, "no ssh ControlMaster was started"
    host.stop()
    assert _traces(host, pids) == []
    host.stop()
    assert _traces(host, pids) == []


def test_a_leftover_of_a_crashed_run_is_cleaned_at_start():
    crashed = TestHost(HostSpec(), die_with_parent=False)
    crashed.start()
    left = [crashed._init_pid, crashed._proc.pid]
    # A new run knows nothing of the old TestHost object: only the netns, veth and per-host dir remain.
    with TestHost(HostSpec(driver_version="580.159.03")) as again:
        assert not any(alive(pid) for pid in left)
        assert ssh_host(again).check_output("cat /sys/module/nvidia/version") == "580.159.03"
    crashed._proc.wait()
    assert _traces(again, left) == []
