"""A plugin for a suite run (-p selftest.hold_check): the driver check of each box waits, as a long check would, with
the box's run lock held, after saying so on the run's terminal and in a file named after the box in $SG_HELD_DIR:
the moment a Ctrl-C lands. Its teardown then takes $SG_TEARDOWN_S seconds, as putting production back does, and
writes BOX.put-back there when it is done."""

import os
import time
from pathlib import Path

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    result = yield  # the check is set up: its teardown can be added to
    if item.name.startswith("test_the_driver_is_at_least"):
        held, box = Path(os.environ["SG_HELD_DIR"]), item.config.option.sg_host

        def put_back():
            time.sleep(float(os.environ.get("SG_TEARDOWN_S", "0")))
            (held / f"{box}.put-back").write_text("done")

        item.addfinalizer(put_back)
        item.config.pluginmanager.get_plugin("sparkgate-reporting").say("holding the driver check")
        (held / box).write_text(str(os.getpid()))
        time.sleep(600)
    return result
