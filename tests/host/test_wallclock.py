"""The box keeps time: its clock agrees with the clock of the machine running the suite.

Run the nodes of a two-node setup in one run from one machine (--host=a --host=b): each is judged against the same
clock, so two nodes that pass are within twice --clock-skew of each other.
"""

import pytest

from sparkgate import wallclock
from sparkgate.target import is_local


@pytest.mark.check(
    "HOST-CLOCK",
    why="a clock that has wandered means time sync is not running on the box: its logs, its containers' times and "
        "its results file then disagree with the other node's and with the machine running the suite, so events "
        "cannot be put in order across the two nodes of a model; the drift grows day by day, and a clock minutes "
        "off fails certificate checks (an image pull, a model download) and makes apt refuse a Release file 'not "
        "valid yet'",
    fix="turn time sync on: `sudo timedatectl set-ntp true` (systemd-timesyncd, Ubuntu 24.04's own), then "
        "`timedatectl status` must say 'System clock synchronized: yes'; a network that blocks NTP (UDP 123) needs "
        "an NTP server it can reach in /etc/systemd/timesyncd.conf (NTP=); if every box is off by the same amount, "
        "the machine running the suite is the one off",
)
def test_the_clock_agrees_with_the_clock_of_the_machine_running_the_suite(check, target_name, target_host, host_facts,
                                                                           pytestconfig, record_property):
    """The box's clock MUST be within --clock-skew of the clock of the machine running the suite."""
    if is_local(target_name):
        check.cannot_run("the box is the machine running the suite: one clock, nothing to compare it with",
                         "--host BOX, run from another machine")
    limit, box = pytestconfig.option.sg_clock_skew, host_facts.hostname
    reading = wallclock.offset(target_host.run)
    if reading.seconds is None:
        check.cannot_run(f"{box}'s clock could not be read: {reading.error}")
    synced = wallclock.synchronized(target_host.run)
    said = {True: "says it is synchronised", False: "says it is NOT synchronised",
            None: "could not say whether it is synchronised"}[synced]
    found = (f"{box}'s clock is {wallclock.describe(reading.seconds)} the clock of the machine running the suite "
             f"(± {reading.within:.3f} s, half the round trip); timedatectl on {box} {said}")
    if synced and reading.beyond(limit):
        found += ", so the machine running the suite may be the one off (its own `timedatectl status`)"
    record_property("clock", found)
    if not reading.beyond(limit) and not reading.inside(limit):
        check.cannot_run(f"{found}: the round trip is too long to tell whether that is within --clock-skew ({limit} s)",
                         "--clock-skew S, above the offset and half the round trip together")
    check.that(reading.inside(limit), expected=f"within {limit} s of the clock of the machine running the suite",
               found=found)
