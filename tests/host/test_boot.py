"""The next boot: the kernel GRUB boots next, the running one and every fallback must each come back with a GPU.

The guide's worst harm is the reboot: the driver metapackage pulls in a newer kernel, and a kernel without a
Canonical-signed nvidia.ko of the userspace driver's version (under Secure Boot), or without its initramfs,
comes back without a GPU, recoverable only at the console. So every bootable kernel is checked, the next boot's
first, and a kernel with no module at all is a finding, never skipped. A /boot that lists no kernel at all (a VM
booted from a kernel outside it) leaves each "every kernel" check nothing to judge: it could not run.
"""

import pytest


def branch(host_facts):
    driver = host_facts.driver_version
    return driver.split(".")[0] if driver else "<branch>"


def presigned(host_facts, kernel):
    """The guide's remedy for one kernel: Canonical's pre-signed modules of the userspace driver's branch."""
    return (f"sudo apt-get install linux-modules-nvidia-{branch(host_facts)}-open-{kernel}, then "
            f"`modinfo -F signer` and `modinfo -F version` of its nvidia.ko before rebooting")


def gpu_box(check, profile):
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} is not a box this suite upgrades", "--profile gb10")


def bootable(check, host_facts):
    """Every bootable kernel, the next boot's first; could not run when /boot lists none."""
    return check.every(host_facts.boot_order, "bootable kernel", "/boot (vmlinuz-*)")


@pytest.mark.check(
    "HOST-FALLBACK-KERNEL",
    why="a driver or kernel upgrade that goes wrong needs another kernel to boot into, from the GRUB menu",
    fix="keep the previous kernel installed (`dpkg -l | grep '^ii  linux-image-6'` should list two); do not "
        "autoremove it before the new one has booted with a working GPU",
)
def test_a_fallback_kernel_is_installed(check, host_facts, profile):
    """A kernel image other than the running one MUST be installed."""
    gpu_box(check, profile)
    others = [k for k in host_facts.kernel_images if k != host_facts.kernel]
    check.that(bool(others), expected=f"a linux-image other than {host_facts.kernel}",
               found=f"installed: {', '.join(host_facts.kernel_images) or 'none found (dpkg, /boot)'}")


@pytest.mark.check(
    "HOST-INITRAMFS",
    why="a kernel without its initramfs does not boot; after a driver install it must have been rebuilt, for the "
        "kernel the box boots next above all",
    fix="sudo update-initramfs -c -k <kernel> for each kernel named, then `ls -la /boot/initrd.img-<kernel>` "
        "before rebooting",
)
def test_every_bootable_kernel_has_its_initramfs(check, host_facts, profile):
    """/boot/initrd.img-<kernel> MUST exist for every bootable kernel, the next boot's first."""
    gpu_box(check, profile)
    kernels = bootable(check, host_facts)
    missing = [k for k in kernels if k not in host_facts.initramfs]
    check.that(not missing, expected="/boot/initrd.img-<kernel> for " + ", ".join(kernels),
               found="; ".join(f"no /boot/initrd.img-{k} ({host_facts.role(k)})" for k in missing),
               fix="; ".join(f"sudo update-initramfs -c -k {k}" for k in missing) or None)


@pytest.mark.check(
    "HOST-BOOT-MODULE",
    why="a bootable kernel with no nvidia.ko at all comes back without a GPU: the driver metapackage can pull in a "
        "newer kernel that GRUB boots next, with no module built or installed for it",
    fix="install Canonical's pre-signed modules for that kernel: `apt-cache search 'linux-modules-nvidia-' | grep "
        "-- -nvidia` shows what exists; install it in the same transaction as the driver",
)
def test_every_bootable_kernel_has_an_nvidia_module(check, host_facts, profile):
    """Every bootable kernel, the next boot's first, MUST have an nvidia.ko installed."""
    gpu_box(check, profile)
    kernels = bootable(check, host_facts)
    missing = [k for k in kernels if host_facts.module_for(k) is None]
    check.that(not missing, expected="an nvidia.ko under /lib/modules/<kernel> for " + ", ".join(kernels),
               found="; ".join(f"no nvidia.ko for {k} ({host_facts.role(k)}): that boot has no GPU" for k in missing),
               fix="; ".join(presigned(host_facts, k) for k in missing) or None)


@pytest.mark.check(
    "HOST-DPKG",
    why="the driver install can hang on the Secure Boot password prompt (DKMS's update-secureboot-policy waits for "
        "a console nobody has); killed, it leaves packages half-configured, and the next apt run or reboot finishes "
        "them unpredictably",
    fix="find the hung processes by pid (`ps -eo pid,cmd | grep -E 'update-secureboot|apt-get install'`; never "
        "`pkill -f`, it matches your own ssh command), `sudo kill -9 <PIDs>`, then `sudo dpkg --configure -a` and "
        "`sudo apt-get check`; install the pre-signed modules before rebooting",
)
def test_no_package_is_left_half_installed(check, host_facts, profile):
    """dpkg --audit and apt-get check MUST be clean, with no linux or nvidia package half-installed."""
    gpu_box(check, profile)
    if not host_facts.dpkg_problems:  # a problem found is a finding whatever else dpkg lists
        check.every(host_facts.kernel_packages, "linux or nvidia package",
                    "dpkg's database (dpkg-query -W 'linux-*' '*nvidia*'): no driver or kernel install to judge")
    check.that(not host_facts.dpkg_problems, expected="dpkg --audit and apt-get check clean",
               found="; ".join(host_facts.dpkg_problems))

