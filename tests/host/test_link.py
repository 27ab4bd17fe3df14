"""The fast link of a two-node setup (--link-peer): collectives take it, and it carries jumbo frames end to end.

Run the host layer on each node with the other's link address: each run judges its own end, so a defect is named
by the node and interface it is on.
"""

import pytest

from sparkgate import link

NO_PEER = ("no --link-peer given: a box on its own has no link to check",
           "--link-peer ADDR, the other node's address on the link")
NO_PING = "iputils-ping on the box (`sudo apt install iputils-ping`)"
SMALL = 56  # ping's default payload: answered by any link that is up at all


def peers(check, pytestconfig):
    if not pytestconfig.option.sg_link_peers:
        check.cannot_run(*NO_PEER)
    return pytestconfig.option.sg_link_peers


@pytest.mark.check(
    "HOST-LINK-ROUTE",
    why="software picks no interface by itself: a link that is down, unaddressed or misnamed sends the collectives "
        "between two Sparks through the 1 GbE management port, at a fraction of the 200 Gb/s link's speed and with no "
        "error; a two-node model then serves slower than one node",
    fix="bring the link up and address it on both nodes (NVIDIA's Connect Two Sparks playbook: the netplan file "
        "/etc/netplan/40-cx7.yaml, then `sudo netplan apply`; `ibdev2netdev` says which enp1s0f* interface is the "
        "cabled port), give --link-peer the peer's address on that link, and name the link's interface to the "
        "collectives (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA)",
)
def test_every_link_peer_answers_over_the_link_not_the_management_port(check, target_host, host_facts, pytestconfig,
                                                                       record_property):
    """Every link peer MUST answer pings through a link interface, not through the management port."""
    run, node = target_host.run, host_facts.hostname
    management = link.management_interfaces(run)
    problems, seen = [], []
    for peer in peers(check, pytestconfig):
        route = link.route_to(run, peer)
        if route.dev is None:
            problems.append(f"{node} has no route to {peer} ({route.error})")
        elif route.dev in management:
            problems.append(f"{node} reaches {peer} through {route.dev}, {management[route.dev]}"
                            + (f", via the gateway {route.via}" if route.via else ""))
        else:
            answer = link.ping(run, peer, SMALL)
            if answer.missing:
                check.cannot_run(f"ping is not installed on {node} ({answer.error})", NO_PING)
            seen.append(f"{peer} via {route.dev}: {answer.received} of {answer.sent} answered")
            if not answer.received:
                problems.append(f"{peer} answered none of {answer.sent or 3} pings through {node}'s {route.dev}"
                                + (f" ({answer.error})" if answer.error else ""))
    record_property("link routes", "; ".join(seen))
    others = ", ".join(f"{dev} ({why})" for dev, why in management.items()) or "none found"
    check.that(not problems, expected=f"every peer answering through a link interface (management: {others})",
               found="; ".join(problems))


@pytest.mark.check(
    "HOST-LINK-MTU",
    why="a link whose one end (or a switch between) keeps the 1500-byte default drops every frame larger than that, "
        "fragmentation forbidden as RDMA and NCCL send them: large transfers stall or fall back, and nothing "
        "says why",
    fix="set the MTU on the link's interface of both nodes and on any switch between them (netplan: `mtu: 9000` "
        "under the interface in /etc/netplan/40-cx7.yaml, then `sudo netplan apply`; until the next boot: "
        "`sudo ip link set DEV mtu 9000`), then run the host layer on each node with the other's address as "
        "--link-peer",
)
def test_every_link_carries_jumbo_frames_end_to_end(check, target_host, host_facts, pytestconfig, record_property):
    """Every link interface MUST have at least --link-mtu bytes of MTU, and pings that fill it MUST come back
    unfragmented."""
    run, node, want = target_host.run, host_facts.hostname, pytestconfig.option.sg_link_mtu
    management = link.management_interfaces(run)
    problems, seen = [], []
    for peer in peers(check, pytestconfig):
        route = link.route_to(run, peer)
        if route.dev is None or route.dev in management:
            continue  # HOST-LINK-ROUTE judges it
        size = link.mtu(run, route.dev) or 0
        if size < want:
            problems.append(f"{node}'s {route.dev} (toward {peer}) has MTU {size or 'unknown'}")
            continue
        payload = size - link.header_bytes(peer)
        full = link.ping(run, peer, payload)
        if full.missing:
            check.cannot_run(f"ping is not installed on {node} ({full.error})", NO_PING)
        if not full.received and not link.ping(run, peer, SMALL).received:
            continue  # no answer at all: HOST-LINK-ROUTE says so
        seen.append(f"{peer} via {route.dev} (MTU {size}): {full.received} of {full.sent} {payload}-byte pings")
        if not full.received:
            problems.append(f"{payload}-byte pings (MTU {size}) from {node}'s {route.dev} to {peer}, fragmentation "
                            f"forbidden: none of {full.sent or 3} answered, while small ones are"
                            + (f" ({full.error})" if full.error else "")
                            + f"; the MTU of {peer}'s end or of a switch between is smaller")
    if not seen and not problems:
        check.cannot_run("no --link-peer answers through a link interface: HOST-LINK-ROUTE says why")
    record_property("link mtu", "; ".join(seen))
    check.that(not problems, expected=f"MTU >= {want} on every link interface, and pings that fill it answered",
               found="; ".join(problems))
