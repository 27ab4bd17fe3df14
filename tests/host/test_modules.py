"""Kernel modules: of the userspace driver's version for every bootable kernel, and signed by Canonical under
Secure Boot, for the running kernel, the next boot and every fallback."""

import pytest

CANONICAL = "Canonical Ltd. Kernel Module Signing"
PRESIGNED = ("install Canonical's pre-signed modules for that kernel: `apt-cache search "
             "'linux-modules-nvidia-595-open' | grep -- '-nvidia'`, then `sudo apt-get install "
             "linux-modules-nvidia-595-open-<kernel>`; verify `modinfo -F signer` prints '" + CANONICAL + "'")


def module_facts(check, host_facts, profile):
    """The nvidia.ko modules when Secure Boot makes their signer matter, else skip with why not."""
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} expects no NVIDIA GPU", "--profile gb10")
    if host_facts.secure_boot is None:
        check.cannot_run(f"Secure Boot state unknown: {host_facts.secure_boot_note} (apt-get install mokutil)")
    if not host_facts.modinfo:
        check.cannot_run("modinfo is not installed on the host (apt-get install kmod)")


@pytest.mark.check(
    "HOST-MODULE-SIGNED",
    why="under Secure Boot an unsigned (DKMS-built) or MOK-signed nvidia.ko depends on a key enrolled at "
        "the physical console; unenrolled, it is rejected at boot and the GPU does not come back",
    fix=PRESIGNED,
)
def test_the_running_kernels_module_is_signed_by_canonical(check, host_facts, profile):
    """With Secure Boot enabled, the running kernel's nvidia.ko MUST be signed by Canonical."""
    module_facts(check, host_facts, profile)
    if not host_facts.secure_boot:
        check.cannot_run("Secure Boot is disabled: the kernel loads unsigned modules")
    module = host_facts.module_for(host_facts.kernel)
    check.that(module is not None and module.signer == CANONICAL, expected=f"signer '{CANONICAL}'",
               found=f"{module.path}: signer {module.signer or 'none (unsigned, a DKMS build)'}" if module
               else f"no nvidia.ko under /lib/modules/{host_facts.kernel}")


@pytest.mark.check(
    "HOST-MODULE-FILE",
    why="the nvidia.ko on disk is what loads at the next boot; another version than userspace gives "
        "`Driver/library version mismatch` after that reboot, and a newer kernel pulled in by an upgrade may carry "
        "an older module",
    fix="install linux-modules-nvidia-<branch>-open-<kernel> of the userspace driver's version for each kernel "
        "named, in the same apt transaction as the driver",
)
def test_every_bootable_kernels_module_is_the_userspace_version(check, host_facts, profile):
    """The nvidia.ko of every bootable kernel, the next boot's first, MUST be the userspace driver's version."""
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} expects no NVIDIA GPU", "--profile gb10")
    if not host_facts.modinfo:
        check.cannot_run("modinfo is not installed on the host (apt-get install kmod)")
    userspace = host_facts.driver_version
    if userspace is None:
        check.cannot_run("no userspace driver version could be read")
    kernels = host_facts.boot_order
    modules = check.every([m for k in kernels if (m := host_facts.module_for(k))], "nvidia.ko of a bootable kernel",
                          f"/lib/modules for the kernels in /boot ({', '.join(kernels) or 'none'}; HOST-BOOT-MODULE "
                          "says which lack one)")
    bad = [m for m in modules if m.version != userspace]
    branch = userspace.split(".")[0]
    check.that(not bad, expected=f"nvidia.ko version {userspace} for every bootable kernel",
               found="; ".join(f"{m.kernel} ({host_facts.role(m.kernel)}): {m.path} version {m.version}" for m in bad),
               fix="; ".join(f"sudo apt-get install linux-modules-nvidia-{branch}-open-{m.kernel}"
                             for m in bad) or None)


@pytest.mark.check(
    "HOST-FALLBACK-MODULES",
    why="DKMS may have built unsigned (or MOK-signed) modules for the other bootable kernels, the next boot's "
        "included: under Secure Boot, booting one of them loses the GPU. The fallback is the pre-signed "
        "combination, not the previous one",
    fix=PRESIGNED + "; or remove that kernel's DKMS build (`sudo dkms remove nvidia/<version> -k <kernel>`)",
)
def test_every_other_kernels_module_is_signed_by_canonical(check, host_facts, profile):
    """With Secure Boot enabled, the nvidia.ko of every other bootable kernel (the next boot's first) MUST be
    signed by Canonical."""
    module_facts(check, host_facts, profile)
    if not host_facts.secure_boot:
        check.cannot_run("Secure Boot is disabled: the kernel loads unsigned modules")
    kernels = [k for k in host_facts.boot_order if k != host_facts.kernel]
    others = check.every([m for k in kernels if (m := host_facts.module_for(k))], "nvidia.ko of another bootable "
                         "kernel", f"/lib/modules for the other kernels in /boot ({', '.join(kernels) or 'none'}; "
                         "HOST-FALLBACK-KERNEL and HOST-BOOT-MODULE say what is missing)")
    bad = [f"{m.kernel} ({host_facts.role(m.kernel)}): {m.path} signer {m.signer or 'none (unsigned)'}"
           for m in others if m.signer != CANONICAL]
    check.that(not bad, expected=f"every other bootable kernel's nvidia.ko signed '{CANONICAL}'",
               found="; ".join(f"booting {b}" for b in bad) + " — would come up without a GPU")
