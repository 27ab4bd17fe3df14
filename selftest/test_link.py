"""Two test hosts joined by a real link (a veth pair between their network namespaces, each end the host's eth1),
each checked by the host layer with the other's link address, at once, as an owner checks both nodes: real pings
with fragmentation forbidden, real routes."""

import os
import re
import subprocess
from contextlib import contextmanager

import pytest

from selftest.testhost.spark01 import NET_PREFIX, HostSpec, TestHost

from .helpers import beside_its_one_box_twin, node_id, run_suites_at_once

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the test hosts need root (network namespaces)")
LINK = {"spark01": f"{NET_PREFIX}.250.1", "spark02": f"{NET_PREFIX}.250.2"}  # each node's address on the link
PEER = {"spark01": LINK["spark02"], "spark02": LINK["spark01"]}


def ip(host, *args):
    subprocess.run(["ip", "-n", host.netns, *args], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def nodes():
    """spark01 and spark02, their eth1s one link at MTU 9000, as two Sparks' ConnectX-7 ports cabled together."""
    with TestHost(HostSpec(), "spark01", 0) as a, TestHost(HostSpec(), "spark02", 1) as b:
        subprocess.run(["ip", "link", "add", "eth1", "netns", a.netns, "mtu", "9000", "type", "veth", "peer", "name",
                        "eth1", "netns", b.netns, "mtu", "9000"], check=True, capture_output=True, text=True)
        for host in (a, b):  # the netns takes the pair along when the host stops
            ip(host, "addr", "add", f"{LINK[host.name]}/24", "dev", "eth1")
            ip(host, "link", "set", "eth1", "up")
        yield {"spark01": a, "spark02": b}


@contextmanager
def changed(host, do, undo):
    """The link broken one way on one node for one test, then mended."""
    for args in do:
        ip(host, *args)
    try:
        yield
    finally:
        for args in undo:
            ip(host, *args)


def link_layer(nodes, test, tmp, only=None, args=None):
    """The link checks on each node (or `only` one) at once, toward the other over eth1 (a veth has no RDMA device:
    named with --link-interface); name -> the run."""
    return run_suites_at_once(
        {h.name: (node_id(__name__, test), ["-m", "host", f"--host={h.name}", f"--ssh-config={h.ssh_config}",
                                            "-k", "link", *(args or [f"--link-peer={PEER[h.name]}",
                                                                     "--link-interface=eth1"])])
         for h in nodes.values() if only in (None, h.name)}, tmp)


def outcomes(run):
    return {k: v for k, v in run.parseoutcomes().items() if k != "deselected"}


def failed(run):
    return re.findall(r"^\[(HOST-[A-Z-]+)\] ", run.stdout.str(), re.M)


def test_two_nodes_joined_at_jumbo_mtu_pass_both_link_checks(nodes, tmp_path):
    """A link up at MTU 9000 on both ends: both link checks MUST pass on both nodes."""
    runs = link_layer(nodes, "test_two_nodes_joined_at_jumbo_mtu_pass_both_link_checks", tmp_path)
    for name, run in runs.items():
        assert run.ret == 0 and outcomes(run) == {"passed": 2}, (name, run.stdout.str()[-3000:])


def test_both_nodes_are_checked_in_one_fleet_run_each_toward_its_own_peer(nodes, tmp_path):
    """One command, a pytest-xdist worker per node, each given its own peer (--link-peer BOX=ADDR): both link checks
    MUST pass on both nodes, and spark02's end at 1500 bytes MUST fail HOST-LINK-MTU on both, each named."""
    config = tmp_path / "ssh_config"
    config.write_text("".join(h.ssh_config.read_text() for h in nodes.values()))
    test = node_id(__name__, "test_both_nodes_are_checked_in_one_fleet_run_each_toward_its_own_peer")
    args = ["-m", "host", "-k", "link", "--host=spark01", "--host=spark02", f"--ssh-config={config}",
            "--link-interface=eth1", *(f"--link-peer={name}={peer}" for name, peer in PEER.items())]
    good = run_suites_at_once({"good": (test, args)}, tmp_path)["good"]
    assert good.ret == 0 and outcomes(good) == {"passed": 4}, good.stdout.str()[-3000:]
    with changed(nodes["spark02"], [("link", "set", "eth1", "mtu", "1500")], [("link", "set", "eth1", "mtu", "9000")]):
        short = run_suites_at_once({"short": (test, args)}, tmp_path)["short"]
    failed_ids = sorted(line.split(" - ")[0] for line in short.outlines if line.startswith("FAILED "))
    assert failed_ids == [f"FAILED tests/host/test_link.py::test_every_link_carries_jumbo_frames_end_to_end@{name}"
                          for name in ("spark01", "spark02")], short.stdout.str()[-3000:]


def test_a_two_node_recipe_names_each_nodes_peer_and_link_so_one_fleet_run_checks_its_link(nodes, tmp_path):
    """No --link-peer and no --link-interface: the recipe's nodes (spark01 and spark02, their eth1 addresses) MUST
    give each node its peer and interface, so both link checks pass on both (without them they could not run: the
    box-on-its-own test below). The checks judge a recipe's peers as they judge --link-peer's (the tests around)."""
    config = tmp_path / "ssh_config"
    config.write_text("".join(h.ssh_config.read_text() for h in nodes.values()))

    def on_this_link(d):
        d["nodes"] = {"head": {"host": "spark01", "address": LINK["spark01"]},
                      "worker": {"host": "spark02", "address": LINK["spark02"]}, "interface": "eth1"}

    recipes = beside_its_one_box_twin(tmp_path, change=on_this_link)
    test = node_id(__name__, "test_a_two_node_recipe_names_each_nodes_peer_and_link_so_one_fleet_run_checks_its_link")
    args = ["-m", "host", "-k", "link", "--host=spark01", "--host=spark02", f"--ssh-config={config}",
            f"--recipes-dir={recipes}", "--recipe=smollm2-cpu-2node"]
    good = run_suites_at_once({"good": (test, args)}, tmp_path)["good"]
    assert good.ret == 0 and outcomes(good) == {"passed": 4}, good.stdout.str()[-3000:]


def test_one_end_left_at_1500_fails_the_jumbo_frame_check_on_both_nodes_each_naming_its_end(nodes, tmp_path):
    """spark02's end at 1500 bytes: HOST-LINK-MTU MUST fail on spark02 naming its interface's MTU, and on spark01
    naming the 8972-byte pings that went unanswered; the route check MUST stay green."""
    test = "test_one_end_left_at_1500_fails_the_jumbo_frame_check_on_both_nodes_each_naming_its_end"
    with changed(nodes["spark02"], [("link", "set", "eth1", "mtu", "1500")], [("link", "set", "eth1", "mtu", "9000")]):
        runs = link_layer(nodes, test, tmp_path)
    for run in runs.values():
        assert run.ret == 1 and failed(run) == ["HOST-LINK-MTU"], run.stdout.str()[-3000:]
    runs["spark02"].stdout.fnmatch_lines(["*expected: MTU >= 9000 on the link interface toward every peer, and pings "
                                          "that fill it answered", f"*found:    spark02's eth1 (toward "
                                          f"{LINK['spark01']}) has MTU 1500", "*sudo ip link set DEV mtu 9000*"])
    runs["spark01"].stdout.fnmatch_lines([f"*found:    8972-byte pings (MTU 9000) from spark01's eth1 to "
                                          f"{LINK['spark02']}, fragmentation forbidden: none of 3 answered, while "
                                          f"small ones are; the MTU of {LINK['spark02']}'s end or of a switch between "
                                          "is smaller"])


def test_a_peer_reached_only_through_the_management_port_fails_the_route_check(nodes, tmp_path):
    """spark01's link down and its default route through eth0, the management port: the peer's address falls to the
    default route, so HOST-LINK-ROUTE MUST fail naming eth0 and the gateway; HOST-LINK-MTU MUST say it could not run
    and point at it."""
    a = nodes["spark01"]
    with changed(a, [("link", "set", "eth1", "down"), ("route", "add", "default", "via", a.gateway)],
                 [("route", "del", "default"), ("link", "set", "eth1", "up")]):
        run = link_layer(nodes, "test_a_peer_reached_only_through_the_management_port_fails_the_route_check",
                         tmp_path, only="spark01")["spark01"]
    assert run.ret == 1 and failed(run) == ["HOST-LINK-ROUTE"], run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines([
        "*expected: every peer answering through a link interface (eth1)",
        f"*found:    spark01 reaches {LINK['spark02']} through eth0, the interface of the default route, via the "
        f"gateway {a.gateway}, not a link interface (eth1)",
        "*40-cx7.yaml*NCCL_SOCKET_IFNAME*",
        "SKIPPED*[[]HOST-LINK-MTU[]] could not run: no link peer answers through a link interface: HOST-LINK-ROUTE "
        "says why"])


def test_a_box_on_its_own_could_not_run_the_link_checks_and_says_which_option_would(nodes, tmp_path):
    run = link_layer(nodes, "test_a_box_on_its_own_could_not_run_the_link_checks_and_says_which_option_would",
                     tmp_path, only="spark01", args=["--link-interface=eth1"])["spark01"]
    assert run.ret == 5 and outcomes(run) == {"skipped": 2}, run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines(["SKIPPED*[[]HOST-LINK-*[]] could not run: no --link-peer given, and no recipe of the run "
                              "names this box as a node: a box on its own has no link to check (to run it: --link-peer "
                              "ADDR, the other node's address on the link, or --recipe NAME of a two-node recipe)*"])


def test_a_box_with_no_rdma_interface_and_none_named_could_not_run_the_link_checks(nodes, tmp_path):
    """The link interfaces are those an RDMA device backs (a ConnectX port): a box with none, and none named, MUST
    say the link checks could not run, naming --link-interface; never judge its management port as the link."""
    run = link_layer(nodes, "test_a_box_with_no_rdma_interface_and_none_named_could_not_run_the_link_checks",
                     tmp_path, only="spark01", args=[f"--link-peer={PEER['spark01']}"])["spark01"]
    assert run.ret == 5 and outcomes(run) == {"skipped": 2}, run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines(["SKIPPED*[[]HOST-LINK-*[]] could not run: no link interface on spark01: none is backed "
                              "by an RDMA device (/sys/class/net/*/device/infiniband) and no --link-interface was "
                              "given (to run it: --link-interface DEV, the interface the link's cable is in)*"])


def test_the_nodes_own_address_given_as_its_peer_fails_the_route_check_saying_so(nodes, tmp_path):
    """The two addresses swapped (the node's own link address as --link-peer): the kernel routes it to itself, and a
    ping to oneself always answers; HOST-LINK-ROUTE MUST fail saying whose address it is."""
    run = link_layer(nodes, "test_the_nodes_own_address_given_as_its_peer_fails_the_route_check_saying_so", tmp_path,
                     only="spark01", args=[f"--link-peer={LINK['spark01']}", "--link-interface=eth1"])["spark01"]
    assert run.ret == 1 and failed(run) == ["HOST-LINK-ROUTE"], run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines([f"*found:    {LINK['spark01']} is spark01's own address: give --link-peer the other "
                              "node's"])


def test_a_box_whose_ssh_user_cannot_ping_could_not_run_the_link_checks(nodes, tmp_path):
    """ping gone from the box: both checks MUST say they could not run, naming iputils-ping; neither fails."""
    a = nodes["spark01"]
    a.ssh("mv /usr/bin/ping /usr/bin/ping.away", timeout=30).check_returncode()
    try:
        run = link_layer(nodes, "test_a_box_whose_ssh_user_cannot_ping_could_not_run_the_link_checks", tmp_path,
                         only="spark01")["spark01"]
    finally:
        a.ssh("mv /usr/bin/ping.away /usr/bin/ping", timeout=30).check_returncode()
    assert run.ret == 5 and outcomes(run) == {"skipped": 2}, run.stdout.str()[-3000:]
    run.stdout.fnmatch_lines(["SKIPPED*[[]HOST-LINK-*[]] could not run: ping * on spark01: *ping*not found* (to run "
                              "it: iputils-ping on the box*"])
