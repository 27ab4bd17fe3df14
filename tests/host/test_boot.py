"""A way back: a second kernel to boot, and an initramfs for the running one."""

import pytest


@pytest.mark.check(
    "HOST-FALLBACK-KERNEL",
    why="a driver or kernel upgrade that goes wrong needs another kernel to boot into, from the GRUB menu",
    fix="keep the previous kernel installed (`dpkg -l | grep '^ii  linux-image-6'` should list two); do not "
        "autoremove it before the new one has booted with a working GPU",
)
def test_a_fallback_kernel_is_installed(check, host_facts, profile):
    """A kernel image other than the running one MUST be installed."""
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} is not a box this suite upgrades", "--profile gb10")
    others = [k for k in host_facts.kernel_images if k != host_facts.kernel]
    check.that(bool(others), expected=f"a linux-image other than {host_facts.kernel}",
               found=f"installed: {', '.join(host_facts.kernel_images) or 'none found (dpkg, /boot)'}")


@pytest.mark.check(
    "HOST-INITRAMFS",
    why="a kernel without its initramfs does not boot; after a driver install it must have been rebuilt",
    fix="sudo update-initramfs -c -k $(uname -r), then `ls -la /boot/initrd.img-$(uname -r)` before rebooting",
)
def test_the_running_kernel_has_its_initramfs(check, host_facts, profile):
    """/boot/initrd.img-<running kernel> MUST exist."""
    if profile.gpu is None:
        check.cannot_run(f"profile {profile.name} is not a box this suite upgrades", "--profile gb10")
    check.that(host_facts.kernel in host_facts.initramfs, expected=f"/boot/initrd.img-{host_facts.kernel}",
               found=f"initramfs for: {', '.join(host_facts.initramfs) or 'no kernel'}")
