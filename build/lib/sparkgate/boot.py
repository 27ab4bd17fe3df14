"""Which kernel the box boots next, and what it needs to come back with a GPU. Pure functions on what the host's
files say (tested on recorded contents); gathering them is hostfacts.py's.

GRUB on Ubuntu boots the first menu entry by default (GRUB_DEFAULT=0), and its menu lists the installed kernels
newest first, so after an upgrade that pulled in a newer kernel, the next boot is that newer kernel (`/boot/vmlinuz`
points at it too). GRUB_DEFAULT=saved boots the entry grubenv's saved_entry names; an entry title or id names a
kernel directly ("Advanced options for Ubuntu>Ubuntu, with Linux 6.17.0-1029-nvidia").
"""

from __future__ import annotations

import re

_KERNEL = re.compile(r"(\d+\.\d+\.\d+-\d+(?:-[a-z0-9]+)+)")


def kernel_key(kernel: str) -> tuple[int, ...]:
    """6.17.0-1029-nvidia -> (6, 17, 0, 1029): the order GRUB lists kernels in."""
    return tuple(int(p) for p in re.findall(r"\d+", kernel))


def grub_default(default_grub: str) -> str:
    """GRUB_DEFAULT from /etc/default/grub (the last assignment wins, as the shell reads it); "0" when unset."""
    value = "0"
    for line in default_grub.splitlines():
        m = re.match(r"\s*GRUB_DEFAULT=(.*)", line)
        if m:
            value = m.group(1).strip().strip("\"'")
    return value


def grubenv_saved_entry(grubenv: str) -> str:
    """saved_entry from /boot/grub/grubenv ("" when unset)."""
    for line in grubenv.splitlines():
        if line.startswith("saved_entry="):
            return line.split("=", 1)[1].strip()
    return ""


def next_kernel(boot_kernels: list[str], default: str, saved_entry: str = "") -> tuple[str | None, str]:
    """The kernel the next boot runs, and how that was decided (for messages)."""
    if not boot_kernels:
        return None, "no kernel images in /boot"
    newest = max(boot_kernels, key=kernel_key)
    choice = saved_entry if default == "saved" else default
    if choice in ("", "0"):
        return newest, f"GRUB_DEFAULT={default or '0'}: the first menu entry, the newest installed kernel"
    m = _KERNEL.search(choice)
    if m and m.group(1) in boot_kernels:
        return m.group(1), f"GRUB_DEFAULT={default}" + (f", saved_entry={saved_entry}" if default == "saved" else "")
    return newest, (f"GRUB_DEFAULT={default}" + (f", saved_entry={saved_entry!r}" if default == "saved" else "")
                    + " names no installed kernel this suite can read; assumed the newest installed")
