"""The kernel log's reader: the lines dmesg and journalctl print, what counts as a fault, and what a hostile line
becomes in a message."""

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from sparkgate import kernellog

# The real H200's boot lines (shared/hosts/h200-vm/under-load/logs.txt): NVRM lines, none of them a fault.
H200_BOOT = """[    0.405425] nvidia: loading out-of-tree module taints kernel.
[    0.477631] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)
[    0.956089] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt detected. Clearing it.
[    3.733040] NVRM: Persistence mode is deprecated and will be removed in a future release.
"""
LATER = """[ 4711.000001] NVRM: Xid (PCI:0000:0f:01): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[ 4711.100000] pcieport 000f:00:00.0: AER: Corrected error message received from 000f:01:00.0
[ 4711.200000] nvidia 000f:01:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer
[ 4711.300000] pcieport 000f:00:00.0: AER: Multiple Uncorrected (Fatal) error message received from 000f:01:00.0
"""


def run_with(outputs):
    """A host's run that answers each command with (rc, stdout, stderr) in turn."""
    answers = iter(outputs)
    return lambda command: SimpleNamespace(**dict(zip(("rc", "stdout", "stderr"), next(answers), strict=True)))


def test_a_boot_of_nvidia_driver_lines_is_no_fault():
    log = kernellog.read(run_with([(0, H200_BOOT, "")]))
    assert log.source == "dmesg" and log.mark == 3.73304
    assert not kernellog.faults(log.lines).any


def test_only_lines_after_the_mark_are_judged_and_each_kind_is_counted():
    log = kernellog.read(run_with([(0, H200_BOOT + LATER, "")]))
    found = kernellog.faults(log.since(3.73304))
    assert len(found.xid) == 1 and len(found.aer_uncorrected) == 2 and found.aer_corrected == 1
    assert found.xid[0].startswith("[4711.000] NVRM: Xid (PCI:0000:0f:01): 79")


def test_a_restricted_dmesg_falls_back_to_the_journal_and_strips_its_host_name():
    journal = "[ 4711.000001] spark01 kernel: NVRM: Xid (PCI:0000:0f:01): 13, Graphics Exception\n"
    log = kernellog.read(run_with([(1, "", "dmesg: read kernel buffer failed: Operation not permitted"),
                                   (0, journal, "")]))
    assert log.source.startswith("journalctl") and log.lines == [(4711.000001, "NVRM: Xid (PCI:0000:0f:01): 13, "
                                                                               "Graphics Exception")]


def test_a_log_nobody_may_read_says_why_for_each_command():
    log = kernellog.read(run_with([(1, "", "dmesg: read kernel buffer failed: Operation not permitted"),
                                   (0, "", "Hint: You are currently not seeing messages from other users")]))
    assert log.source is None
    assert log.refused == ("`dmesg`: dmesg: read kernel buffer failed: Operation not permitted; `journalctl -k -b -o "
                           "short-monotonic --no-pager -q`: Hint: You are currently not seeing messages from other "
                           "users")


@given(st.text())
def test_any_line_goes_into_a_message_as_short_printable_ascii(text):
    """A kernel line is anyone's text (root can write one): control characters and other scripts become '?', and a
    line is cut at 240 characters (escaping markup is the report's, on output)."""
    (line,) = kernellog.faults([(1.0, "NVRM: Xid (" + text)]).xid
    assert line.isascii() and line.isprintable() and len(line) <= len("[1.000] ") + 240 + len("...")
