"""The box keeps time: its clock agrees with the clock of the machine running the suite.

Run the nodes of a two-node setup in one run from one machine (--host=a --host=b): each is judged against the same
clock, so two nodes that pass are within twice --clock-skew of each other.
"""

import pytest

from sparkgate import wallclock


@pytest.mark.check(
    "HOST-CLOCK",
    why="a clock that has wandered means time sync is not running on the box: its logs, its containers' times and "
        "its results file then disagree with the other node's and with this machine's, so events cannot be put in "
        "order across the two nodes of a model; the drift grows day by day, and a clock minutes off fails "
        "certificate checks (an image pull, a model download) and makes apt refuse a Release file 'not valid yet'",
    fix="turn time sync on: `sudo timedatectl set-ntp true` (systemd-timesyncd, Ubuntu 24.04's own), then "
        "`timedatectl status` must say 'System clock synchronized: yes'; a network that blocks NTP (UDP 123) needs "
        "an NTP server it can reach in /etc/systemd/timesyncd.conf (NTP=); if every box is off by the same amount, "
        "the machine running the suite is the one off",
)
def test_the_clock_agrees_with_the_clock_of_the_machine_running_the_suite(check, target_name, target_host, host_facts,
                                                                           pytestconfig, record_property):
    """The box's clock MUST be within --clock-skew of the clock of the machine running the suite."""
    if target_name == "local":
        check.cannot_run("the box is the machine running the suite: one clock, nothing to compare it with",
                         "--host BOX, run from another machine")
    limit, box = pytestconfig.option.sg_clock_skew, host_facts.hostname
    reading = wallclock.offset(target_host.run)
    if reading.seconds is None:
        check.cannot_run(f"{box}'s clock could not be read: {reading.error}")
    if reading.within > limit:
        check.cannot_run(f"the round trip to {box} took {2 * reading.within:.2f} s, more than --clock-skew "
                         f"({limit} s) can be judged through", "--clock-skew S, above half the round trip")
    said = {True: "says it is synchronised", False: "says it is NOT synchronised",
            None: "could not say whether it is synchronised"}[wallclock.synchronized(target_host.run)]
    found = (f"{box}'s clock is {wallclock.describe(reading.seconds)} this machine's (± {reading.within:.3f} s, "
             f"half the round trip); timedatectl on {box} {said}")
    record_property("clock", found)
    check.that(not reading.beyond(limit), expected=f"within {limit} s of this machine's clock", found=found)
