"""The fast link of a two-node setup, as the box's own tools see it: the link interfaces (those with an RDMA device,
as a DGX Spark's ConnectX-7 ports have, or the ones --link-interface names), the interface the kernel routes a peer's
address by (`ip route get`), its MTU, and whether pings of a size, fragmentation forbidden, come back.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .redact import printable

Run = Callable[[str], Any]  # testinfra's host.run: an object with rc, stdout and stderr

INTERFACE = r"[\w.:-]{1,15}"  # a network interface's name, as the kernel allows it (read as ASCII)
_DEV = re.compile(rf"\bdev ({INTERFACE})(?!\S)", re.ASCII)
_VIA = re.compile(r"\bvia (?:inet6 |inet )?([0-9a-fA-F.:]{2,45})(?!\S)", re.ASCII)  # an address
_MTU = re.compile(r"\bmtu (\d{1,6})\b", re.ASCII)
_SENT = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received", re.ASCII)
# Route types `ip route get` names first when the address is not routed as unicast (a plain route has none).
_NOT_UNICAST = ("local", "unreachable", "blackhole", "prohibit", "throw", "broadcast", "multicast", "anycast", "nat")


def peer_address(text: str) -> str:
    """An address --link-peer accepts: another box's unicast address, without a %scope. Raises ValueError saying
    why not."""
    addr = ipaddress.ip_address(text)  # ValueError: not an address
    if addr.is_loopback or addr.is_unspecified or addr.is_multicast or (addr.version == 4 and addr.is_reserved):
        raise ValueError(f"{text} is not another box's address (loopback, unspecified, multicast or reserved)")
    if addr.version == 6 and (addr.is_link_local or "%" in text):
        raise ValueError(f"{text} is an IPv6 link-local address, which means nothing without its interface: give "
                         "the peer's IPv4 address on the link (NVIDIA's playbook gives it a 169.254.x.x one)")
    return str(addr)


def header_bytes(peer: str) -> int:
    """IP and ICMP headers a ping adds to its payload: the payload that fills a frame is the MTU less these."""
    return 28 if ipaddress.ip_address(peer).version == 4 else 48


@dataclass(frozen=True)
class Route:
    """How the kernel routes `peer`: the interface and gateway of a unicast route, else `kind` ("local": the peer is
    this box's own address; "unreachable", "prohibit", ...) or `error` (what `ip` said: no route at all)."""

    peer: str
    dev: str | None
    via: str | None = None
    kind: str = "unicast"
    error: str = ""


def parse_route(peer: str, text: str) -> Route:
    """`ip -o route get PEER`'s answer, e.g. '10.0.0.2 dev eth1 src 10.0.0.1 uid 0 \\    cache', 'local 10.0.0.1 dev
    lo table local ...', 'unreachable 10.9.0.1 table main ...', or its error."""
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    if first in _NOT_UNICAST:
        return Route(peer, None, kind=first, error=printable(" ".join(text.split()), 200))
    dev, via = _DEV.search(text), _VIA.search(text)
    if dev is None:
        return Route(peer, None, error=printable(" ".join(text.split()), 200) or "no route")
    return Route(peer, dev.group(1), via.group(1) if via else None)


def route_to(run: Run, peer: str) -> Route:
    res = run(f"ip -o route get {shlex.quote(peer)}")
    return parse_route(peer, res.stdout if res.rc == 0 else res.stderr)


def parse_devices(text: str) -> list[str]:
    """Interface names from `ls -d /sys/class/net/*/device/infiniband` (one path a line)."""
    return [m.group(1) for m in re.finditer(rf"^/sys/class/net/({INTERFACE})/device/infiniband/?$", text,
                                            re.M | re.ASCII)]


def rdma_interfaces(run: Run) -> list[str]:
    """The network interfaces backed by an RDMA device (a ConnectX port running RoCE): the link's candidates."""
    return parse_devices(run("ls -d /sys/class/net/*/device/infiniband 2>/dev/null").stdout)


def default_interfaces(run: Run) -> list[str]:
    """The interfaces of the default routes, IPv4 and IPv6, multipath included (the management port, Wi-Fi)."""
    out = run("ip -o route show default; ip -o -6 route show default").stdout
    return list(dict.fromkeys(m.group(1) for m in _DEV.finditer(out)))


def parse_mtu(text: str) -> int | None:
    """`ip -o link show dev DEV`'s answer ('3: eth1@if2: <BROADCAST,...,UP> mtu 9000 qdisc ...')."""
    found = _MTU.search(text)
    return int(found.group(1)) if found else None


def mtu(run: Run, dev: str) -> int | None:
    return parse_mtu(run(f"ip -o link show dev {shlex.quote(dev)}").stdout)


@dataclass(frozen=True)
class Ping:
    size: int  # payload bytes
    sent: int
    received: int
    error: str = ""  # what ping said: why it sent nothing (refused), or the local error of a frame too large
    refused: bool = False  # ping could not run a ping at all: not installed, not permitted, not iputils


def parse_ping(size: int, rc: int, out: str, err: str) -> Ping:
    """iputils ping's output: its summary ('3 packets transmitted, 0 received, +3 errors, ...') and any 'local
    error' line ('ping: local error: message too long, mtu=1500'); no summary: it never pinged, and why."""
    said = printable(" ".join(f"{err} {out}".split()), 300)
    counts = _SENT.search(out)
    if counts is None:
        return Ping(size, 0, 0, said or f"ping exited {rc} and printed nothing", refused=True)
    sent, received = int(counts.group(1)), int(counts.group(2))
    local = re.search(r"local error: [^\n]*", f"{err}\n{out}")
    return Ping(size, sent, received, printable(local.group(0).strip()) if local and not received else "")


def ping(run: Run, peer: str, size: int, count: int = 3) -> Ping:
    """`count` pings of `size` payload bytes, fragmentation forbidden, 0.2 s apart, each waited for 2 s at most.
    Not quiet: only then does iputils print the local error of a frame larger than the path allows."""
    res = run(f"ping -M do -s {size} -c {count} -i 0.2 -W 2 {shlex.quote(peer)}")
    return parse_ping(size, res.rc, res.stdout, res.stderr)
