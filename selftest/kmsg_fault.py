"""A plugin for one suite run (-p selftest.kmsg_fault): just before HOST-KERNEL-LOG runs, it writes into this
machine's kernel log (the test host's kernel is this machine's) a GPU fault as NVIDIA's driver reports it and a PCIe
link error as the kernel's AER driver does, each line marked as the self-test's own so nobody reading this machine's
dmesg later takes it for a real fault."""

MARK = "sparkgate-selftest (not a real fault): "
LINES = [
    "NVRM: Xid (PCI:0000:0f:01): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "pcieport 000f:00:00.0: AER: Uncorrected (Fatal) error message received from 000f:01:00.0",
    "pcieport 000f:00:00.0: AER: Corrected error message received from 000f:01:00.0",
]


def pytest_runtest_setup(item):
    if item.name.startswith("test_the_kernel_logged_no_gpu_or_pcie_fault"):
        with open("/dev/kmsg", "w") as kmsg:
            for line in LINES:
                kmsg.write(f"<3>{MARK}{line}\n")
                kmsg.flush()  # one record per write
