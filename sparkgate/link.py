"""The fast link of a two-node setup, as the box's own tools see it: the interface traffic to a peer leaves by
(`ip route get`), that interface's MTU, and whether pings of a size, fragmentation forbidden, come back.

Two DGX Sparks joined by their ConnectX-7 ports run collectives over that link; software picks no interface by
itself, so a link that is down, unaddressed or misnamed sends the traffic out of the 1 GbE management port with no
error, and a link whose one end keeps the 1500-byte default drops every jumbo frame.
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

_DEV = re.compile(r"\bdev ([\w.:-]{1,15})(?!\S)", re.ASCII)  # an interface name, as the kernel allows it
_VIA = re.compile(r"\bvia ([0-9a-fA-F.:]{2,45})(?!\S)")  # an address
_SENT = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received", re.ASCII)


def header_bytes(peer: str) -> int:
    """IP and ICMP headers a ping adds to its payload: the payload that fills a frame is the MTU less these."""
    return 28 if ipaddress.ip_address(peer).version == 4 else 48


@dataclass(frozen=True)
class Route:
    """How traffic to `peer` leaves this box: its interface and gateway, or why there is none."""

    peer: str
    dev: str | None
    via: str | None = None
    error: str = ""


def parse_route(peer: str, text: str) -> Route:
    """`ip -o route get PEER`'s answer (e.g. '10.0.0.2 dev eth1 src 10.0.0.1 uid 0 \\    cache')."""
    dev, via = _DEV.search(text), _VIA.search(text)
    if dev is None:
        return Route(peer, None, error=printable(" ".join(text.split()), 200) or "no route")
    return Route(peer, dev.group(1), via.group(1) if via else None)


def route_to(run: Run, peer: str) -> Route:
    res = run(f"ip -o route get {shlex.quote(peer)}")
    return parse_route(peer, res.stdout if res.rc == 0 else res.stderr)


def management_interfaces(run: Run) -> dict[str, str]:
    """The interfaces that are not the link, each with why it counts: the default route's (a Spark's 1 GbE or Wi-Fi
    port), else, on a box with no default route, the one this ssh session came in by. Not the ssh session's where a
    default route exists: an operator may reach a node over the link itself."""
    found: dict[str, str] = {}
    for line in run("ip -o route show default").stdout.splitlines():
        if dev := _DEV.search(line):
            found.setdefault(dev.group(1), "the interface of the default route")
    client = run('echo "${SSH_CONNECTION%% *}"').stdout.strip()
    if not found and client:
        ssh = route_to(run, client)
        if ssh.dev:
            found[ssh.dev] = "the interface this ssh session came in by (the box has no default route)"
    return found


def parse_mtu(text: str) -> int | None:
    """`ip -o link show dev DEV`'s answer ('3: eth1@if2: <BROADCAST,...,UP> mtu 9000 qdisc ...')."""
    found = re.search(r"\bmtu (\d+)", text, re.ASCII)
    return int(found.group(1)) if found else None


def mtu(run: Run, dev: str) -> int | None:
    return parse_mtu(run(f"ip -o link show dev {shlex.quote(dev)}").stdout)


@dataclass(frozen=True)
class Ping:
    size: int  # payload bytes
    sent: int
    received: int
    error: str = ""  # what ping said when it sent nothing or is missing (rc 127)
    missing: bool = False


def parse_ping(size: int, rc: int, out: str, err: str) -> Ping:
    """iputils ping's summary ('3 packets transmitted, 0 received, ...'), or what it said instead."""
    said = printable(" ".join(f"{err} {out}".split()), 300)
    if rc == 127:
        return Ping(size, 0, 0, said or "ping: not found", missing=True)
    counts = _SENT.search(out)
    if counts is None:
        return Ping(size, 0, 0, said or f"ping exited {rc} and printed nothing")
    sent, received = int(counts.group(1)), int(counts.group(2))
    local = re.search(r"ping: local error: [^\n]*", f"{err}\n{out}")  # e.g. 'message too long, mtu=1500'
    return Ping(size, sent, received, printable(local.group(0).strip()) if local and not received else "")


def ping(run: Run, peer: str, size: int, count: int = 3) -> Ping:
    """`count` pings of `size` payload bytes, fragmentation forbidden, a second apart at most."""
    res = run(f"ping -M do -s {size} -c {count} -i 0.2 -W 2 -q {shlex.quote(peer)}")
    return parse_ping(size, res.rc, res.stdout, res.stderr)
