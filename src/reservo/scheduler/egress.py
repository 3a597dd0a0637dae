"""Where an outbound call chosen by a client may go: pure rules, no I/O.

A URL a caller stores (an ``http`` job) is called later from inside the network,
so by default it may not reach what only the inside can reach: loopback,
link-local (cloud metadata at 169.254.169.254 and fd00:ec2::254), private,
shared, unspecified, multicast, reserved and documentation ranges, also when
written as an IPv6 address that carries an IPv4 one (``embedded_ipv4``: mapped,
translated, compatible, NAT64, 6to4, ISATAP; Teredo's whole range is refused).
Credentials in a URL are refused outright. An operator allows exceptions with
an allow list of host names, addresses and CIDR networks, each alone (every
port) or with one port (``127.0.0.1:8000``, ``[::1]:8000``,
``callbacks.internal:443``): ``RESERVO_JOBS_HTTP_ALLOW``. Addresses are compared
as addresses, whatever their spelling (``2130706433``, ``0x7f000001``,
``0177.0.0.1``, ``127.1`` and ``::ffff:127.0.0.1`` are all 127.0.0.1), and ports
as numbers.

The rules decide on addresses; the caller resolves names and must check every
address a name resolves to, then connect to the checked one.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# (network, why it is refused). Spelled out rather than read from ipaddress'
# is_private/is_global, whose tables changed between Python releases.
_REFUSED: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared (carrier-grade NAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (cloud metadata)"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved (IETF protocol assignments)"),
        ("192.0.2.0/24", "reserved (documentation)"),
        ("192.88.99.0/24", "reserved (6to4 relay)"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "reserved (benchmarking)"),
        ("198.51.100.0/24", "reserved (documentation)"),
        ("203.0.113.0/24", "reserved (documentation)"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved (includes broadcast)"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        # IPv4-compatible (deprecated); the mapped form ::ffff:0:0/96 is unwrapped instead.
        ("::/96", "reserved (IPv4-compatible)"),
        ("64:ff9b:1::/48", "reserved (local NAT64)"),
        ("100::/64", "reserved (discard)"),
        ("2001::/23", "reserved (IETF protocol assignments, Teredo)"),
        ("2001:db8::/32", "reserved (documentation)"),
        ("3fff::/20", "reserved (documentation)"),
        ("fc00::/7", "private (unique local, includes fd00:ec2::254 metadata)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "reserved (site-local)"),
        ("ff00::/8", "multicast"),
    )
)
# IPv6 forms whose low 32 bits are an IPv4 address a host or gateway forwards
# to: IPv4-translated (RFC 2765 / 6145 SIIT) and well-known NAT64 (RFC 6052).
# IPv4-mapped (::ffff:0:0/96) is read by ``unmapped``; IPv4-compatible
# (::/96) and local NAT64 (64:ff9b:1::/48) are refused whole above.
_LOW_32_FORMS = (
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
    ipaddress.IPv6Network("64:ff9b::/96"),
)
# ISATAP (RFC 5214): the interface id is 0000:5efe or 0200:5efe (the u/l bit
# set for a global IPv4) followed by the IPv4 address, under any /64 prefix.
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_ISATAP_MASK = 0xFDFF_FFFF
_ISATAP_ID = 0x0000_5EFE
_LEGACY_V4 = re.compile(r"^[0-9a-fA-Fx.]+$")
_LABEL = r"(?!-)[a-z0-9_-]{1,63}(?<!-)"
_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


def unmapped(ip: IPAddress) -> IPAddress:
    """The IPv4 address behind an IPv4-mapped IPv6 one (``::ffff:127.0.0.1``): the
    socket connects to that IPv4 address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 one carries for a translator, relay or tunnel
    to forward to, in every form a gateway inside the network may honour: mapped
    (``::ffff:a.b.c.d``), translated (``::ffff:0:a.b.c.d``), NAT64
    (``64:ff9b::a.b.c.d``), 6to4 (``2002:AABB:CCDD::``) and ISATAP
    (``<prefix>::5efe:a.b.c.d``). All of them: a 6to4 prefix may front an ISATAP
    interface id carrying another address."""
    found: list[ipaddress.IPv4Address] = []
    low = ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if any(ip in net for net in _LOW_32_FORMS):
        found.append(low)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if (int(ip) >> 32) & _ISATAP_MASK == _ISATAP_ID:
        found.append(low)
    return tuple(found)


def refused_range(ip: IPAddress) -> str | None:
    """Why the default policy refuses this address, or None for a public one."""
    ip = unmapped(ip)
    for net, why in _REFUSED:
        if ip.version == net.version and ip in net:
            return why
    if isinstance(ip, ipaddress.IPv6Address):
        for inner in embedded_ipv4(ip):
            carried = refused_range(inner)
            if carried is not None:
                return f"{carried} (it carries {inner})"
    return None


@dataclass(frozen=True)
class AllowList:
    """Host names (exact, case-insensitive) and networks an operator allows, each
    with the one port it allows, or None for every port."""

    hosts: frozenset[tuple[str, int | None]] = frozenset()
    networks: tuple[tuple[IPNetwork, int | None], ...] = ()

    def allows_host(self, host: str, port: int) -> bool:
        key = _host_key(host)
        return (key, None) in self.hosts or (key, port) in self.hosts

    def allows_address(self, ip: IPAddress, port: int) -> bool:
        candidates = {ip, unmapped(ip)}
        return any(
            c.version == n.version and c in n and allowed in (None, port)
            for c in candidates
            for n, allowed in self.networks
        )

    def entries(self) -> list[str]:
        """The allowed destinations in one canonical spelling, for ``reservo
        config`` and the start-up log (what the checks compare against)."""
        shown = [_with_port(_network_text(net), port) for net, port in self.networks]
        shown += [
            _with_port(name, port)
            for name, port in sorted(self.hosts, key=lambda h: (h[0], h[1] or 0))
        ]
        return shown

    def __str__(self) -> str:
        return ",".join(self.entries())


def _unmapped_network(net: IPNetwork) -> IPNetwork:
    """``::ffff:127.0.0.1`` (and ``::ffff:10.0.0.0/104``) as the IPv4 network it
    is, so the allow list shows one spelling for one destination."""
    if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(_MAPPED) and net.prefixlen >= 96:
        v4 = unmapped(net.network_address)
        return ipaddress.IPv4Network((int(v4), net.prefixlen - 96))
    return net


def _network_text(net: IPNetwork) -> str:
    text = str(net.network_address) if net.num_addresses == 1 else str(net)
    return f"[{text}]" if net.version == 6 else text


def _with_port(host: str, port: int | None) -> str:
    return host if port is None else f"{host}:{port}"


def _host_key(host: str) -> str:
    return host.strip().rstrip(".").lower()


def _split_port(entry: str) -> tuple[str, int | None]:
    """``host:port``, ``[v6]:port`` or ``a.b.c.d/n:port`` into host and port; an
    entry without one (an IPv6 address or network unbracketed included) has None."""
    if entry.startswith("["):
        inside, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"bad entry {entry!r} in the allow list")
        return inside, _port(entry, rest[1:]) if rest else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    return entry, None


def _port(entry: str, text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"bad port in {entry!r} in the allow list (1-65535)")
    return int(text)


def parse_allow(text: str) -> AllowList:
    """``"127.0.0.1:8000, 10.0.0.0/8, callbacks.internal:443"``: addresses, CIDR
    networks and host names, each optionally with a port, comma separated.
    Raises ValueError on an entry that is none of those."""
    hosts: set[tuple[str, int | None]] = set()
    networks: list[tuple[IPNetwork, int | None]] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        host, port = _split_port(entry)
        try:
            networks.append((_unmapped_network(ipaddress.ip_network(host, strict=True)), port))
            continue
        except ValueError as exc:
            if "/" in host:
                raise ValueError(f"bad network {entry!r} in the allow list: {exc}") from exc
        ip = literal_address(host)
        if ip is not None:
            # "127.1" and friends: allow the address they denote, not a "name".
            networks.append((ipaddress.ip_network(unmapped(ip)), port))
            continue
        name = _host_key(host)
        if not _NAME.match(name):
            raise ValueError(f"bad host name {entry!r} in the allow list")
        hosts.add((name, port))
    return AllowList(frozenset(hosts), tuple(dict.fromkeys(networks)))


def literal_address(host: str) -> IPAddress | None:
    """The address a host written as an IP literal denotes, including the legacy
    IPv4 forms the system resolver accepts without DNS (``127.1``, ``0x7f.1``,
    ``2130706433``); None for a name that needs DNS."""
    h = host.strip().strip("[]")
    h = h.split("%", 1)[0]  # an IPv6 zone id
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if h and _LEGACY_V4.match(h):
        try:
            # inet_aton parses numbers only (no lookup): what getaddrinfo would do.
            return ipaddress.IPv4Address(socket.inet_aton(h))
        except OSError:
            return None
    return None


def address_refusal(allow: AllowList, ip: IPAddress, port: int) -> str | None:
    """Why a call to ``ip`` on ``port`` is refused, or None when it may go."""
    if allow.allows_address(ip, port):
        return None
    why = refused_range(ip)
    return None if why is None else f"{unmapped(ip)} is {why}"


@dataclass(frozen=True)
class Target:
    """A parsed outbound URL: what the caller resolves and connects to."""

    url: httpx.URL
    host: str
    port: int


def parse_target(url: str) -> Target:
    """Parses like the HTTP client will; raises ValueError when the URL is
    refused whatever it resolves to (credentials, scheme, no host)."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"invalid URL: {exc}") from exc
    if parsed.scheme not in ("http", "https"):
        raise ValueError("only http and https URLs are allowed")
    if parsed.userinfo:
        raise ValueError("URLs with credentials (user:password@) are not allowed")
    if not parsed.host:
        raise ValueError("the URL has no host")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return Target(parsed, parsed.host, port)


def static_refusal(allow: AllowList, url: str) -> str | None:
    """The check that needs no DNS (at request time): credentials, scheme, and a
    host written as an address in a refused range. A host name passes here; its
    addresses are checked when the call is made."""
    try:
        target = parse_target(url)
    except ValueError as exc:
        return str(exc)
    if allow.allows_host(target.host, target.port):
        return None
    ip = literal_address(target.host)
    return None if ip is None else address_refusal(allow, ip, target.port)
