"""A plugin for a suite run (-p selftest.hold_check): the driver check of each box waits, as a long check would, with
the box's run lock held, after saying so in a file named after the box in $SG_HELD_DIR: the moment a Ctrl-C lands."""

import os
import time
from pathlib import Path


def pytest_runtest_setup(item):
    if item.name.startswith("test_the_driver_is_at_least"):
        item.config.pluginmanager.get_plugin("sparkgate-reporting").say("holding the driver check")
        (Path(os.environ["SG_HELD_DIR"]) / item.config.option.sg_host).write_text(str(os.getpid()))
        time.sleep(600)
