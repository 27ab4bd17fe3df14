"""The host layer over real ssh against the test host spark01: green on a good GB10, and on each host broken
one way, exactly the check that guards against it fails, with its ID and remedy.

spark01's GPU, driver and tools are stand-ins printing outputs recorded from real machines (selftest/testhost).
"""

import glob
import os
import re
import time

import pytest

from selftest.testhost.spark01 import CANONICAL_SIGNER, HostSpec, TestHost

from .helpers import ROOT, broken_recipe, run_suite

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test host needs root (network namespaces)")
NEXT = "6.17.0-1031-nvidia"  # a newer kernel an upgrade installed: GRUB boots it next
DOCKER = "not docker_engine"  # spark01 runs no engine: HOST-DOCKER is red here, green in test_container_layer
# The host's clock 95 s ahead of this machine's for every command its sshd runs: libfaketime (Debian's, installed by
# bootstrap.sh --selftest) preloaded through sshd's SetEnv. The host shares this machine's kernel, so its real clock
# cannot be set apart.
FAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), "/usr/lib/faketime/libfaketime.so.1")
CLOCK_AHEAD = (f'echo "SetEnv LD_PRELOAD={FAKETIME} FAKETIME=+95s FAKETIME_DONT_FAKE_MONOTONIC=1" '
               '>> "$1/etc/ssh/sshd_config.d/sparkgate.conf"')
SMALL_DISK = 'mkdir -p "$1/root/.cache" && mount -t tmpfs -o size=64m tmpfs "$1/root/.cache"'  # the model cache


def host_layer(pytester, host, *args):
    result = run_suite(pytester, "-m", "host", f"--host={host.name}", f"--ssh-config={host.ssh_config}", *args)
    failed = re.findall(r"^\[(HOST-[A-Z-]+)\] ", result.stdout.str(), re.M)
    return result, failed


def test_a_good_spark_passes_every_host_check(pytester):
    with TestHost(HostSpec()) as host:
        start = time.monotonic()
        # The host layer alone starts and measures nothing, so HOST-MEM-BACK and HOST-GPU-CLOCK-FLOOR could not run
        # (proven both ways in test_suite.py and test_container_layer.py); a box on its own has no link (test_link.py).
        alone = "not memory_is_back and not sm_clock_held and not link"
        result, failed = host_layer(pytester, host, "-k", f"{DOCKER} and {alone}")
        took = time.monotonic() - start
    assert failed == [], result.stdout.str()[-3000:]
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] >= 14 and "skipped" not in outcomes, outcomes
    result.stdout.fnmatch_lines(["Host: spark01 (spark01)", "*NVIDIA GB10 (driver 595.84, cc 12.1)*",
                                 "*Secure Boot enabled*", "Recipes: qwen3-coder-next-int4, *"])
    print(f"host layer on a good spark01 over ssh: {took:.1f} s for the whole pytest run")


VARIANTS = {
    # another NVIDIA GPU than the profile's (the recorded H200 VM's name and compute capability)
    "another-gpu": (HostSpec(gpu_name="NVIDIA H200", compute_cap="9.0"), "HOST-GPU",
                    ["*expected: NVIDIA GB10 (compute capability 12.1)*",
                     "*found:    NVIDIA H200 (compute capability 9.0)*"]),
    # guide: driver 580 crashes CUDA graph capture on GB10
    "driver-580": (HostSpec(driver_version="580.159.03"), "HOST-DRIVER-MIN",
                   ["*expected: >= 590 (profile gb10)*", "*found:    580.159.03*", "*linux-modules-nvidia-595-open*"]),
    "module-signed-by-local-mok": (HostSpec(module_signer="sparkgate test MOK"), "HOST-MODULE-SIGNED",
                                   ["*signer sparkgate test MOK*", "*pre-signed modules*"]),
    "unsigned-dkms-module": (HostSpec(module_signer=None), "HOST-MODULE-SIGNED",
                             ["*signer none (unsigned, a DKMS build)*"]),
    "loaded-module-mismatch": (HostSpec(sys_module_version="590.48"), "HOST-MODULE-MATCH",
                               ["*expected: module 595.84*",
                                "*found:    module 590.48 loaded*Driver/library version mismatch*"]),
    "module-file-other-version": (HostSpec(module_version="590.48"), "HOST-MODULE-FILE",
                                  ["*expected: nvidia.ko version 595.84*", "*version 590.48*"]),
    "module-not-loaded": (HostSpec(module_loaded=False), "HOST-NVIDIA-SMI", [
        "*found:    NVIDIA-SMI has failed*", "SKIPPED*[[]HOST-NO-COMPETITOR[]] could not run: no model server among "
        "the host's processes, but what holds GPU memory could not be listed (NVIDIA-SMI has failed*"]),
    "no-fallback-kernel": (HostSpec(fallback_kernels=[]), "HOST-FALLBACK-KERNEL",
                           ["*found:    installed: 6.17.0-1029-nvidia*",
                            "SKIPPED*[[]HOST-FALLBACK-MODULES[]] could not run: no nvidia.ko of another bootable "
                            "kernel found in /lib/modules for the other kernels in /boot (none;*"]),
    "no-initramfs": (HostSpec(kernels_without_initramfs=["6.17.0-1029-nvidia"]), "HOST-INITRAMFS",
                     ["*found:    no /boot/initrd.img-6.17.0-1029-nvidia (running, the next boot*",
                      "*update-initramfs -c -k 6.17.0-1029-nvidia*"]),
    "unsigned-dkms-module-for-fallback": (HostSpec(other_kernel_modules={"6.17.0-1008-nvidia": None}),
                                          "HOST-FALLBACK-MODULES",
                                          ["*booting 6.17.0-1008-nvidia (a fallback*): */updates/dkms/nvidia.ko "
                                           "signer none*"]),
    "ollama-running": (HostSpec(model_servers=["ollama"]), "HOST-NO-COMPETITOR",
                       ["*pid * /usr/local/bin/ollama holds 5210 MiB*"]),
    "little-memory-available": (HostSpec(mem_available_kb=60 * 1024**2), "HOST-MEM-FREE",
                                ["*MemAvailable 60.0 GiB; qwen3-coder-next-int4 needs 75.6 GiB (weights 44.7 + KV "
                                 "cache 24 + overhead 6.9) plus 24 GiB kept for the OS = 99.6 GiB; "
                                 "qwen36-35b-a3b-nvfp4 needs 68.4 GiB*; qwen38-27b-nvfp4 needs 47.6 GiB*"]),
    # The next boot (guide: the driver metapackage pulls in a newer kernel; GRUB boots the newest).
    "newer-kernel-without-module": (HostSpec(newer_kernels=[NEXT], kernels_without_module=[NEXT]), "HOST-BOOT-MODULE",
                                    [f"*found:    no nvidia.ko for {NEXT} (the next boot: GRUB_DEFAULT=0*",
                                     f"*fix:      sudo apt-get install linux-modules-nvidia-595-open-{NEXT}*"]),
    "newer-kernel-without-initramfs": (HostSpec(newer_kernels=[NEXT], kernels_without_initramfs=[NEXT]),
                                       "HOST-INITRAMFS", [f"*found:    no /boot/initrd.img-{NEXT} (the next boot*",
                                                          f"*fix:      sudo update-initramfs -c -k {NEXT}*"]),
    "newer-kernel-module-of-another-driver": (HostSpec(newer_kernels=[NEXT], module_versions={NEXT: "590.48.01"}),
                                              "HOST-MODULE-FILE", [f"*found:    {NEXT} (the next boot*version "
                                                                   "590.48.01*"]),
    "mok-signed-module-for-the-next-kernel": (
        HostSpec(newer_kernels=[NEXT], other_kernel_modules={"6.17.0-1008-nvidia": CANONICAL_SIGNER,
                                                             NEXT: "sparkgate test MOK"}),
        "HOST-FALLBACK-MODULES", [f"*booting {NEXT} (the next boot*signer sparkgate test MOK*without a GPU*"]),
    "half-configured-dpkg": (HostSpec(half_configured=["nvidia-dkms-595-open"]), "HOST-DPKG",
                             ["*only half configured*nvidia-dkms-595-open*", "*sudo dpkg --configure -a*"]),
    # What the guide says is fine raises no alarm.
    "secure-boot-off-with-dkms-modules": (HostSpec(secure_boot=False, module_signer=None,
                                                   other_kernel_modules={"6.17.0-1008-nvidia": None}), "", []),
    "driver-at-exactly-the-minimum": (HostSpec(driver_version="590.48.01"), "", []),
    "less-total-memory": (HostSpec(mem_total_kb=64 * 1024**2, mem_available_kb=60 * 1024**2), None, []),
    # The guide's refusal: "Free memory on device cuda:0 (24.7/121.69 GiB)", with the rest of what MemAvailable counts
    # held by the page cache (an earlier model's weights, read once): MemAvailable covers every grant, MemFree none.
    "page-cache-holds-a-model": (HostSpec(mem_free_kb=int(24.7 * 1024**2)), "HOST-MEM-CACHE",
                                 ["*found:    MemFree 24.7 GiB of MemAvailable 113.1 GiB: 88.4 GiB is page cache and "
                                  "kernel memory the kernel would reclaim, which vLLM counts as used; "
                                  "qwen3-coder-next-int4's grant is 0.65 x 121.69 = 79.1 GiB; qwen36-35b-a3b-nvfp4's "
                                  "grant is 0.5 x 121.69 = 60.8 GiB; qwen38-27b-nvfp4's grant is 0.65 x 121.69 = 79.1 "
                                  "GiB*", "*sync && echo 3 | sudo tee /proc/sys/vm/drop_caches*"]),
    # A shard that lost its second half after it was written (a download cut short and renamed by hand, a bad disk).
    "weights-cut-short": (HostSpec(hf_cut=("unsloth/Qwen3.8-27B-NVFP4", "model-00001-of-00002.safetensors")),
                          "HOST-WEIGHTS-WHOLE",
                          ["*found:    unsloth/Qwen3.8-27B-NVFP4: snapshots/*/model-00001-of-00002.safetensors "
                           "(1,572,9* bytes) hashes to *, not to its name *; Intel/Qwen3-Coder-Next-int4-AutoRound: "
                           "3 of 3 files, 0.00 GiB hashed*"]),
    "clock-95-s-ahead": (HostSpec(binds=(os.path.dirname(FAKETIME),), setup_hook=CLOCK_AHEAD), "HOST-CLOCK",
                         ["*found:    spark01's clock is 95.0 s ahead of the clock of the machine running the suite "
                          "(± 0.0* s, half the round trip); timedatectl on spark01 could not say whether it is "
                          "synchronised*",
                          "*sudo timedatectl set-ntp true*"]),
    "small-model-cache-disk": (HostSpec(setup_hook=SMALL_DISK), "HOST-DISK-FREE",
                               ["*expected: >= 41 GiB (qwen3-coder-next-int4)*", "*/root/.cache*",
                                "SKIPPED*[[]HOST-WEIGHTS-WHOLE[]] could not run: none of the selected models is in the "
                                "Hugging Face cache at /root/.cache/huggingface yet (Intel/Qwen3-Coder-Next-int4-"
                                "AutoRound, *): the first start downloads them*"]),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_broken_spark_fails_exactly_the_guarding_check(pytester, variant):
    spec, guard, lines = VARIANTS[variant]
    with TestHost(spec) as host:
        result, failed = host_layer(pytester, host, "-k", DOCKER)
    if guard is None:  # less MemTotal also leaves less available: both memory checks guard it
        assert sorted(failed) == ["HOST-MEM-FREE", "HOST-MEM-TOTAL"], result.stdout.str()[-3000:]
        return
    assert failed == ([guard] if guard else []), result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines(lines)


def test_a_gpu_fault_the_kernel_logged_during_the_run_fails_exactly_the_kernel_log_check(pytester):
    """An Xid and an uncorrected AER error written into the kernel log (this machine's, which is the test host's) after
    the run began, as NVIDIA's driver and the kernel print them: the kernel log check fails quoting both, counts the
    corrected AER line without failing on it, and no other check moves."""
    with TestHost(HostSpec()) as host:
        result, failed = host_layer(pytester, host, "-k", DOCKER, "-p", "selftest.kmsg_fault")
    assert failed == ["HOST-KERNEL-LOG"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines([
        "*expected: no NVRM Xid and no uncorrected PCIe AER line after [[]*[]] (the run's start, `dmesg`)*",
        "*found:    1 NVRM Xid line(s): [[]*[]] sparkgate-selftest (not a real fault): NVRM: Xid (PCI:0000:0f:01): 79, "
        "*GPU has fallen off the bus.; 1 uncorrected PCIe AER line(s): [[]*[]] *AER: Uncorrected (Fatal) error message "
        "received from 000f:01:00.0; 1 corrected PCIe AER line(s) (recorded, not judged)*",
        "*docs.nvidia.com/deploy/xid-errors*"])


def test_a_gpu_slowed_for_heat_and_on_the_power_brake_during_the_run_fails_exactly_the_clocks_check(pytester):
    """The GPU's clock event reason counters grow after the run began (the stand-in nvidia-smi told so mid-run, in the
    form the real driver's `-q -x` states them): the clocks check fails naming the seconds of heat and power brake,
    counts the time at the power cap without failing on it, and no other check moves."""
    with TestHost(HostSpec()) as host:
        result, failed = host_layer(pytester, host, "-k", DOCKER, "-p", "selftest.clock_fault")
    assert failed == ["HOST-GPU-CLOCKS"], result.stdout.str()[-4000:]
    result.stdout.fnmatch_lines([
        "*expected: no thermal or power-brake slowdown over the run's * s (`nvidia-smi -q -x`'s clock event reason "
        "counters)",
        "*found:    SW thermal slowdown 4.2 s, HW power brake slowdown 1.5 s (counted, not judged: SW power cap 9.0 s)",
        "*unplug the box from AC*"])


def test_a_box_whose_kernel_log_no_command_can_read_could_not_run_the_kernel_log_check(pytester):
    """Without dmesg and journalctl (a minimal image) the kernel log check could not run, naming what it tried and who
    may read the log; it never passes on a log it did not read."""
    no_reader = 'rm -f "$1/usr/bin/dmesg" "$1/bin/dmesg" "$1/usr/bin/journalctl" "$1/bin/journalctl"'
    with TestHost(HostSpec(setup_hook=no_reader)) as host:
        result, failed = host_layer(pytester, host, "-k", "kernel_log")
    assert failed == [] and result.parseoutcomes().get("skipped") == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["SKIPPED*[[]HOST-KERNEL-LOG[]] could not run: the kernel log could not be read on the "
                                 "box (`dmesg`: *dmesg: *not found; `journalctl -k -b *`: *not found) (to run it: "
                                 "dmesg (util-linux) or journalctl on the box, read as root or as a user in the adm*"])


def test_a_grant_bigger_than_what_is_free_fails_the_memory_check(pytester, tmp_path):
    """vLLM will not start unless its --gpu-memory-utilization grant is free (the guide: 'Free memory on device ...
    is less than desired GPU memory utilization (0.8, 97.35 GiB)'): the 27B's budget fits 100 GiB available, its
    grant at the guide's 0.85 does not, and HOST-MEM-FREE says so with the most the grant may be."""
    def grant_085(data):
        args = data["serve_args"]
        args[args.index("--gpu-memory-utilization") + 1] = "0.85"

    recipes = broken_recipe(tmp_path, grant_085, "qwen38-27b-nvfp4")
    with TestHost(HostSpec(mem_available_kb=100 * 1024**2)) as host:
        result, failed = host_layer(pytester, host, "-k", "mem", f"--recipes-dir={recipes}",
                                    "--recipe=qwen38-27b-nvfp4")
    assert failed == ["HOST-MEM-FREE"], result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*MemAvailable 100.0 GiB; qwen38-27b-nvfp4 needs 47.6 GiB*, and vLLM will not start "
                                 "unless its --gpu-memory-utilization grant is free: 0.85 x 121.69 = 103.4 GiB: "
                                 "lower --gpu-memory-utilization to at most 0.82*"])


def test_a_host_without_docker_fails_the_docker_check_for_docker_recipes(pytester):
    with TestHost(HostSpec()) as host:
        result, failed = host_layer(pytester, host, "-k", "docker_engine")
    assert failed == ["HOST-DOCKER"]
    result.stdout.fnmatch_lines(["*expected: docker engine reachable by root (for qwen3-coder-next-int4, *",
                                 "*engine unreachable: docker CLI not installed*"])


# ---- no check passes on nothing: an "every X" check over no X could not run --------------------------------------

HOST_CHECKS = re.findall(r"^\| `(HOST-[A-Z-]+)` \| host \|", (ROOT / "docs" / "CHECKS.md").read_text(), re.M)
SKIPPED = re.compile(r"^SKIPPED \[\d+\] \S+ \[(HOST-[A-Z-]+)\] could not run", re.M)


def outcomes_by_check(result):
    """HOST-* ID -> failed / could not run (from its failure message and the -rA summary), and how many passed."""
    out = result.stdout.str()
    found = {i: "failed" for i in re.findall(r"^\[(HOST-[A-Z-]+)\] ", out, re.M)}
    found |= {i: "could not run" for i in SKIPPED.findall(out)}
    return found, len(re.findall(r"^PASSED tests/host/", out, re.M))


# A host with nothing of a Spark: another architecture than the profile's, no kernel in /boot, dpkg or /lib/modules,
# no GPU, driver, loaded module or mokutil, no ps or date, 1 GiB of memory, a 64 MiB model cache, no docker engine.
EMPTY = HostSpec(arch="x86_64", kernel_installed=False, fallback_kernels=[], driver_version=None, module_loaded=False,
                 secure_boot=None, mem_total_kb=1024**2, mem_available_kb=512 * 1024,
                 setup_hook=f'{SMALL_DISK} && rm "$1/usr/bin/ps" "$1/usr/bin/date"')
EVERY_X = {  # the checks over a set, and what each found none of; and the clock, with no date to read it
    "HOST-INITRAMFS": "no bootable kernel found in /boot (vmlinuz-*)",
    "HOST-BOOT-MODULE": "no bootable kernel found in /boot (vmlinuz-*)",
    "HOST-DPKG": "no linux or nvidia package found in dpkg's database*",
    "HOST-NO-COMPETITOR": "the host's processes could not be listed (ps -eww -o pid=,args=: *not found)",
    "HOST-WEIGHTS-WHOLE": "no selected recipe loads its weights from the Hugging Face cache (hf_cache: true)*",
    "HOST-CLOCK": "spark01's clock could not be read: `date +%s.%N` on the box printed *not found* (exit 127)",
}


def test_an_empty_host_passes_no_host_check(pytester):
    """Held to gb10 (as the H200 VM was), a host with nothing passes nothing: each check fails or could not run, and
    each check over a set (kernels, packages, processes) could not run, saying what it found none of and where."""
    with TestHost(EMPTY) as host:
        result, _ = host_layer(pytester, host, "--profile=gb10")
    found, passed = outcomes_by_check(result)
    out = result.stdout.str()
    assert passed == 0 and "passed" not in result.parseoutcomes(), out[-6000:]
    assert sorted(found) == sorted(HOST_CHECKS), out[-6000:]  # each one failed or could not run, by its own ID
    assert {k: found[k] for k in EVERY_X} == dict.fromkeys(EVERY_X, "could not run"), out[-6000:]
    result.stdout.fnmatch_lines_random([f"SKIPPED*[[]{k}[]] could not run: {why}" for k, why in EVERY_X.items()])


def test_a_gpu_box_whose_boot_lists_no_kernel_judges_no_kernel(pytester):
    """The H200 VM's case (shared/hosts/h200-vm/host-layer-2026-12-01: HOST-INITRAMFS passed on a /boot with no
    kernel): GPU, driver, Secure Boot and modinfo all there, but no kernel installed. Every check over the bootable
    kernels or their modules could not run; the ones that look for one kernel or module fail."""
    with TestHost(HostSpec(kernel_installed=False, fallback_kernels=[])) as host:
        result, _ = host_layer(pytester, host, "-k", DOCKER)
    found, _ = outcomes_by_check(result)
    every = ("HOST-INITRAMFS", "HOST-BOOT-MODULE", "HOST-MODULE-FILE", "HOST-FALLBACK-MODULES")
    assert {k: found.get(k) for k in every} == dict.fromkeys(every, "could not run"), result.stdout.str()[-6000:]
    assert sorted(k for k, v in found.items() if v == "failed") == ["HOST-FALLBACK-KERNEL", "HOST-MODULE-SIGNED"]
    result.stdout.fnmatch_lines_random([
        "SKIPPED*[[]HOST-INITRAMFS[]] could not run: no bootable kernel found in /boot (vmlinuz-*)",
        "SKIPPED*[[]HOST-MODULE-FILE[]] could not run: no nvidia.ko of a bootable kernel found in /lib/modules for "
        "the kernels in /boot (none; HOST-BOOT-MODULE says which lack one)",
        "*found:    installed: none found (dpkg, /boot)*",
        "*found:    no nvidia.ko under /lib/modules/6.17.0-1029-nvidia*"])
