"""The NVIDIA driver: new enough for CUDA graphs on GB10, and one version from userspace to the loaded module."""

import pytest

from sparkgate.hostfacts import version_tuple

INSTALL = ("sudo apt-get install -y nvidia-driver-595-open linux-modules-nvidia-595-open-$(uname -r) "
           "(Canonical's pre-signed modules, never the DKMS build under Secure Boot), then verify "
           "`modinfo -F signer` and `modinfo -F version` of the new nvidia.ko before rebooting")


def needs_gpu(check, profile):
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} expects no NVIDIA GPU", "--profile gb10")


@pytest.mark.check(
    "HOST-NVIDIA-SMI",
    why="nvidia-smi failing means the driver cannot be reached: no model can load on the GPU",
    fix="`nvidia-smi` by hand shows the error; if the module is not loaded: `sudo modprobe nvidia`, and "
        "check `dmesg | grep -i nvidia` for a module rejected by Secure Boot",
)
def test_nvidia_smi_answers(check, host_facts, profile):
    """nvidia-smi MUST be installed and answer on a host whose profile has an NVIDIA GPU."""
    needs_gpu(check, profile)
    if host_facts.nvml_mismatch:
        check.cannot_run("nvidia-smi reports a driver/library version mismatch: HOST-MODULE-MATCH says which")
    check.that(host_facts.nvidia_smi is not None and not host_facts.nvidia_smi_error,
               expected="nvidia-smi lists the GPU",
               found=host_facts.nvidia_smi_error or "nvidia-smi is not installed")


@pytest.mark.check(
    "HOST-DRIVER-MIN",
    why="on drivers before 590, CUDA graph capture crashes on GB10 (`CUDA error: an illegal instruction`); "
        "--enforce-eager works around it at ~2.8x the single-stream cost (25 vs 70 tok/s measured)",
    fix=INSTALL,
)
def test_the_driver_is_at_least_the_profiles_minimum(check, host_facts, profile):
    """The userspace NVIDIA driver MUST be at least the profile's minimum version (590 on gb10)."""
    needs_gpu(check, profile)
    found = host_facts.driver_version
    if found is None:
        check.cannot_run(f"no driver version could be read ({host_facts.nvidia_smi_error or 'no nvidia-smi'})")
    check.that(version_tuple(found) >= version_tuple(profile.min_driver),
               expected=f">= {profile.min_driver} (profile {profile.name})", found=found)


@pytest.mark.check(
    "HOST-MODULE-MATCH",
    why="a loaded kernel module of another version than userspace gives `Failed to initialize NVML: "
        "Driver/library version mismatch` and a GPU nothing can use",
    fix="reboot into the kernel whose nvidia.ko matches userspace (after an upgrade, the reboot is the fix); "
        "if none does, install linux-modules-nvidia-<branch>-open-$(uname -r) of the userspace version",
)
def test_the_loaded_module_is_the_userspace_version(check, host_facts, profile):
    """/sys/module/nvidia/version MUST equal the userspace driver version."""
    needs_gpu(check, profile)
    loaded, userspace = host_facts.nvidia_module_version, host_facts.driver_version
    if loaded is None:
        check.cannot_run("the nvidia module is not loaded (/sys/module/nvidia absent): HOST-NVIDIA-SMI fails")
    if userspace is None:
        check.cannot_run("no userspace driver version could be read")
    check.that(loaded == userspace, expected=f"module {userspace} (userspace, nvidia-smi/NVML)",
               found=f"module {loaded} loaded" + (" — nvidia-smi: " + host_facts.nvidia_smi_error.splitlines()[0]
                                                  if host_facts.nvidia_smi_error else ""))
