"""What the box's tools print about its link, read back: outputs recorded from iproute2 6.1 and iputils 20221126 in
network namespaces joined by a veth pair (one end at MTU 9000, the other at 1500)."""

import pytest

from sparkgate import link

ROUTE = {  # `ip -o route get ADDR`: stdout, or stderr where it exits 2
    "link": ("10.77.0.2 dev vx src 10.77.0.1 uid 0 \\    cache ", link.Route("10.77.0.2", "vx")),
    "gateway": ("10.99.1.1 via 10.77.0.2 dev vx src 10.77.0.1 uid 0 \\    cache ",
                link.Route("10.99.1.1", "vx", "10.77.0.2")),
    "own": ("local 10.77.0.1 dev lo src 10.77.0.1 uid 0 \\    cache <local> ",
            link.Route("10.77.0.1", None, kind="local",
                       error="local 10.77.0.1 dev lo src 10.77.0.1 uid 0 \\ cache <local>")),
    "unreachable": ("RTNETLINK answers: No route to host",
                    link.Route("10.88.1.1", None, error="RTNETLINK answers: No route to host")),
    "no-route": ("RTNETLINK answers: Network is unreachable",
                 link.Route("10.88.1.1", None, error="RTNETLINK answers: Network is unreachable")),
}


@pytest.mark.parametrize("case", list(ROUTE))
def test_a_route_is_read_as_its_interface_and_gateway_or_why_there_is_none(case):
    text, route = ROUTE[case]
    assert link.parse_route(route.peer, text) == route


JUMBO_TO_1500 = """PING 10.77.0.2 (10.77.0.2) 8972(9000) bytes of data.

--- 10.77.0.2 ping statistics ---
3 packets transmitted, 0 received, 100% packet loss, time 4212ms
"""
FROM_1500 = ("PING 10.77.0.1 (10.77.0.1) 8972(9000) bytes of data.\n\n--- 10.77.0.1 ping statistics ---\n"
             "3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 407ms\n")
FROM_1500_ERR = ("ping: sendmsg: No buffer space available\nping: sendmsg: No buffer space available\n"
                 "ping: local error: message too long, mtu=1500\nping: local error: message too long, mtu=1500\n"
                 "ping: local error: message too long, mtu=1500\n")
SMALL = """PING 10.77.0.2 (10.77.0.2) 56(84) bytes of data.
64 bytes from 10.77.0.2: icmp_seq=1 ttl=64 time=0.059 ms
64 bytes from 10.77.0.2: icmp_seq=2 ttl=64 time=0.042 ms
64 bytes from 10.77.0.2: icmp_seq=3 ttl=64 time=0.044 ms

--- 10.77.0.2 ping statistics ---
3 packets transmitted, 3 received, 0% packet loss, time 406ms
rtt min/avg/max/mdev = 0.042/0.048/0.059/0.007 ms
"""
NOT_PERMITTED = ("ping: socktype: SOCK_RAW\nping: socket: Operation not permitted\n"
                 "ping: => missing cap_net_raw+p capability or setuid?\n")


@pytest.mark.parametrize(("rc", "out", "err", "ping"), [
    (0, SMALL, "", link.Ping(56, 3, 3)),
    (1, JUMBO_TO_1500, "", link.Ping(8972, 3, 0)),
    (1, FROM_1500, FROM_1500_ERR, link.Ping(8972, 3, 0, "local error: message too long, mtu=1500")),
    (2, "", NOT_PERMITTED, link.Ping(56, 0, 0, " ".join(NOT_PERMITTED.split()), refused=True)),
    (2, "", "ping: connect: Network is unreachable",
     link.Ping(56, 0, 0, "ping: connect: Network is unreachable", refused=True)),
    (127, "", "bash: line 1: ping: command not found",
     link.Ping(56, 0, 0, "bash: line 1: ping: command not found", refused=True)),
], ids=["answered", "jumbo-dropped-by-the-peer", "too-long-for-this-end", "not-permitted", "no-route", "not-installed"])
def test_a_ping_is_read_as_what_came_back_or_why_it_never_pinged(rc, out, err, ping):
    assert link.parse_ping(ping.size, rc, out, err) == ping


def test_the_link_interfaces_are_those_an_rdma_device_backs_and_the_default_routes_all_theirs():
    listed = "/sys/class/net/enP2p1s0f1np1/device/infiniband\n/sys/class/net/enp1s0f1np1/device/infiniband\n"
    assert link.parse_devices(listed) == ["enP2p1s0f1np1", "enp1s0f1np1"]
    assert link.parse_devices("/sys/class/net/x y/device/infiniband\nls: cannot access") == []
    mtu = "3: eth1@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc noqueue state UP mode DEFAULT group default"
    assert link.parse_mtu(mtu) == 9000 and link.parse_mtu("Device \"eth9\" does not exist.") is None


@pytest.mark.parametrize(("text", "why"), [
    ("127.0.0.1", "loopback"), ("0.0.0.0", "unspecified"), ("224.0.0.1", "multicast"), ("255.255.255.255", "reserved"),
    ("fe80::1", "link-local"), ("fe80::1%eth1", "link-local"), ("spark02", "does not appear to be"),
])
def test_an_address_that_is_no_other_box_is_refused_saying_why(text, why):
    with pytest.raises(ValueError, match=why):
        link.peer_address(text)
    assert link.peer_address("169.254.12.2") == "169.254.12.2" and link.peer_address("fd00::2") == "fd00::2"
