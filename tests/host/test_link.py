"""The fast link of a two-node setup (--link-peer): the kernel routes the peer by the link, not the management port,
and the link carries jumbo frames end to end.

Run the host layer on each node with the other's link address: each run judges its own end, so a defect is named
by the node and interface it is on.
"""

import pytest

from sparkgate import link

NO_PING = "iputils-ping on the box, runnable by the ssh user (`sudo apt install iputils-ping`; an unprivileged user "\
          "also needs `sysctl net.ipv4.ping_group_range` to include its group)"
SMALL = 56  # ping's default payload: answered by any link that is up at all


@pytest.fixture
def link_routes(check, target_host, host_facts, link_of_box):
    """Each link peer's route (--link-peer, or the other node of a two-node recipe), with why it does not take a
    link interface (None where it does), and the link interfaces; could not run without a peer or a link interface."""
    (peers, named), run, node = link_of_box, target_host.run, host_facts.hostname
    if not peers:
        check.cannot_run("no --link-peer given, and no recipe of the run names this box as a node: a box on its own "
                         "has no link to check", "--link-peer ADDR, the other node's address on the link, or "
                         "--recipe NAME of a two-node recipe")
    links = named or link.rdma_interfaces(run)
    if not links:
        check.cannot_run(f"no link interface on {node}: none is backed by an RDMA device "
                         "(/sys/class/net/*/device/infiniband) and no --link-interface was given",
                         "--link-interface DEV, the interface the link's cable is in")
    defaults, routes = link.default_interfaces(run), [link.route_to(run, peer) for peer in peers]
    return [(route, off_the_link(node, route, links, defaults)) for route in routes], links


def off_the_link(node, route, links, defaults):
    """Why traffic to route.peer does not take a link interface, or None where it does."""
    if route.kind == "local":
        return f"{route.peer} is {node}'s own address: give --link-peer the other node's"
    if route.dev is None:
        return f"{node} has no route to {route.peer} ({route.error})"
    if route.dev not in links:
        how = ", the interface of the default route" if route.dev in defaults else ""
        via = f", via the gateway {route.via}" if route.via else ""
        return f"{node} reaches {route.peer} through {route.dev}{how}{via}, not a link interface ({', '.join(links)})"
    return None


@pytest.mark.check(
    "HOST-LINK-ROUTE",
    why="the kernel sends the peer's traffic by its route table: a link that is down, unaddressed or given the wrong "
        "address sends it through the management port (the 10 GbE RJ-45 or Wi-Fi), and NCCL or Gloo told to use the "
        "link's interface finds no peer there; a two-node model then serves slower than one node, or not at all, "
        "with no error that names the link",
    fix="bring the link up and address it on both nodes (NVIDIA's Connect Two Sparks playbook: the netplan file "
        "/etc/netplan/40-cx7.yaml, then `sudo netplan apply`; `ibdev2netdev` says which interface, enp1s0f* or its "
        "enP2p1s0f* twin, is the cabled port), give --link-peer the peer's address on that link, and name the link's "
        "interface to the collectives (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA)",
)
def test_every_link_peer_answers_over_the_link_not_the_management_port(check, target_host, host_facts, link_routes,
                                                                       record_property):
    """Every link peer MUST answer pings through a link interface, not through the management port."""
    (routes, links), run, node = link_routes, target_host.run, host_facts.hostname
    problems, unable, seen = [], [], []
    for route, off in routes:
        if off:
            problems.append(off)
            continue
        peer = route.peer
        answer = link.ping(run, peer, SMALL)
        if answer.refused:
            unable.append(f"ping {peer} on {node}: {answer.error}")
            continue
        seen.append(f"{peer} via {route.dev}: {answer.received} of {answer.sent} answered")
        if not answer.received:
            problems.append(f"{peer} answered none of {answer.sent} pings through {node}'s {route.dev}"
                            + (f" ({answer.error})" if answer.error else ""))
    record_property("link routes", "; ".join(seen))
    if unable and not problems:
        check.cannot_run("; ".join(unable), NO_PING)
    check.that(not problems, expected=f"every peer answering through a link interface ({', '.join(links)})",
               found="; ".join(problems))


@pytest.mark.check(
    "HOST-LINK-MTU",
    why="a link whose other end (or a switch between) has a smaller MTU than this end drops every frame larger than "
        "it, fragmentation forbidden as RDMA and NCCL send them: large transfers stall or fall back, and nothing "
        "says why",
    fix="set one MTU on the link's interface of both nodes and on any switch between them (netplan: `mtu: 9000` "
        "under the interface in /etc/netplan/40-cx7.yaml, then `sudo netplan apply`; until the next boot: "
        "`sudo ip link set DEV mtu 9000`), then run the host layer on each node with the other's address as "
        "--link-peer",
)
def test_every_link_carries_jumbo_frames_end_to_end(check, target_host, host_facts, link_routes, pytestconfig,
                                                    record_property):
    """The link interface toward every peer MUST have an MTU of at least --link-mtu, and pings that fill it MUST come
    back unfragmented."""
    (routes, _), run, node = link_routes, target_host.run, host_facts.hostname
    want = pytestconfig.option.sg_link_mtu
    problems, unable, seen = [], [], []
    for route, off in routes:
        if off:
            continue  # HOST-LINK-ROUTE judges it
        peer = route.peer
        size = link.mtu(run, route.dev) or 0
        if size < want:
            problems.append(f"{node}'s {route.dev} (toward {peer}) has MTU {size or 'unknown'}")
            continue
        payload = size - link.header_bytes(peer)
        full = link.ping(run, peer, payload)
        if full.refused:
            unable.append(f"ping {peer} on {node}: {full.error}")
            continue
        if not full.received and not link.ping(run, peer, SMALL).received:
            continue  # no answer at all: HOST-LINK-ROUTE says so
        seen.append(f"{peer} via {route.dev} (MTU {size}): {full.received} of {full.sent} {payload}-byte pings")
        if not full.received:
            problems.append(f"{payload}-byte pings (MTU {size}) from {node}'s {route.dev} to {peer}, fragmentation "
                            f"forbidden: none of {full.sent} answered, while small ones are"
                            + (f" ({full.error})" if full.error else "")
                            + f"; the MTU of {peer}'s end or of a switch between is smaller")
    record_property("link mtu", "; ".join(seen))
    if not problems and unable:
        check.cannot_run("; ".join(unable), NO_PING)
    if not problems and not seen:
        check.cannot_run("no link peer answers through a link interface: HOST-LINK-ROUTE says why")
    check.that(not problems, expected=f"MTU >= {want} on the link interface toward every peer, and pings that fill "
                                      "it answered", found="; ".join(problems))
