"""A plugin for one suite run (-p selftest.mem_holder): just before HOST-MEM-BACK runs, it leaves behind a process that
holds 3 GiB and does not exit (as an engine that outlived its server does), in a session of its own. Its pid goes to
the file named by $SPARKGATE_SELFTEST_HOLDER, for the self-test to stop it; it exits by itself after ten minutes."""

import os
import subprocess
import sys
import time

import pytest

HOLD = "import time; held = b'\\x01' * (3 * 2**30); time.sleep(600)"  # every page written: resident, really


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.name == "test_memory_is_back_after_the_run":
        holder = subprocess.Popen([sys.executable, "-c", HOLD], start_new_session=True)
        with open(os.environ["SPARKGATE_SELFTEST_HOLDER"], "w") as f:
            f.write(str(holder.pid))
        for _ in range(100):  # until it holds it all
            with open(f"/proc/{holder.pid}/status") as status:
                if any(line.startswith("VmRSS:") and int(line.split()[1]) >= 3 * 2**20 for line in status):
                    return
            time.sleep(0.1)
