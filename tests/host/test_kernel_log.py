"""The kernel log over the run: what the GPU driver and the PCIe links reported while the suite used the box."""

import pytest

from sparkgate import kernellog

READ_IT = ("dmesg (util-linux) or journalctl on the box, read as root or as a user in the adm or systemd-journal "
           "group (who may read `journalctl -k`): --host user@box")


@pytest.mark.run_end
@pytest.mark.check(
    "HOST-KERNEL-LOG",
    why="an Xid is the NVIDIA driver reporting a GPU fault (a memory error, a hung engine, a GPU fallen off the bus), "
        "an uncorrected AER error a PCIe link that lost data: what the run measured while one happened says nothing "
        "of the box's health or speed, and the next run may not start at all",
    fix="look the Xid number up in NVIDIA's catalogue (docs.nvidia.com/deploy/xid-errors) and read `nvidia-smi -q -d "
        "ECC,ROW_REMAPPER`; for AER, `sudo lspci -vvv -s DEVICE` names the link; reboot, run the suite again, and if "
        "the lines come back, take the box out of service and open a case with its vendor",
)
def test_the_kernel_logged_no_gpu_or_pcie_fault_during_the_run(check, target_host, host_facts, profile,
                                                               kernel_log_at_start, record_property):
    """The kernel log MUST hold no NVIDIA Xid and no uncorrected PCIe AER line from the run's start to its end."""
    if kernel_log_at_start is None or kernel_log_at_start.source is None:
        check.cannot_run("the kernel log could not be read on the box ("
                         + (kernel_log_at_start.refused if kernel_log_at_start else "the run never reached it") + ")",
                         READ_IT)
    if profile.gpu is not None and host_facts.nvidia_module_version is None:
        check.cannot_run("the nvidia module is not loaded (/sys/module/nvidia absent), so no Xid could be logged: "
                         "HOST-NVIDIA-SMI says why")
    now = kernellog.read(target_host.run)
    if now.source != kernel_log_at_start.source:  # lines of two sources are stamped alike but are not one log
        check.cannot_run(f"the kernel log was read with `{kernel_log_at_start.source}` when the run began, and at its "
                         f"end {now.refused or f'with `{now.source}`'}", READ_IT)
    mark = kernel_log_at_start.mark
    since = now.since(mark)
    found = kernellog.faults(since)
    record_property("kernel log", f"`{now.source}`, {len(since)} line(s) after [{mark:.3f}]: {found}")
    check.that(not found.any,
               expected=f"no NVRM Xid and no uncorrected PCIe AER line after [{mark:.3f}] (the run's start, "
                        f"`{now.source}`)",
               found=found)
