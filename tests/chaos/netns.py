"""A network of the test's own on this machine, to partition, slow and drop.

Each *host* is a Linux network namespace with one veth into a bridge that lives
in a namespace of its own (the *hub*); the machine's own namespace joins the hub
too, as the gateway ``10.x.y.1``, so the test process (and anything it started
outside a namespace, such as Redis on 127.0.0.1) reaches every host and every
host reaches it. Every address is the lab's own (``10.<a>.<b>.0/24``, a subnet
picked per lab); nothing is routed off the machine.

Faults are applied to a host's side:

- ``partition(host, peers)``: nftables in the host's namespace drops everything
  between it and those peers (both ways); ``drop_from(host, peers)`` drops only
  what the host *receives* from them: it can still send, and its connections hang
  instead of failing (the one-way partition);
- ``netem(host, delay_ms=..., jitter_ms=..., loss_pct=...)``: loss by nftables
  (``numgen random``) on what the host sends and receives; delay by ``tc netem``
  on the host's interface and its bridge port, where the kernel has ``sch_netem``
  (``has_netem()``; some VM kernels do not: ``NetemUnavailable`` then, and a test
  puts a userspace delay line on the path instead: ``delay_line(host, ...)``
  starts tests/chaos/delayline.py in the host, a TCP forwarder that holds each
  chunk delay ± jitter ms while it is on);
- ``heal()`` lifts every fault (and turns every delay line off).

Needs root, ``ip`` (iproute2), ``tc`` and ``nft``; ``missing()`` says why not,
and the tests that use a lab skip loudly with that reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

_TOOLS = ("ip", "tc", "nft")
_DELAY_LINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delayline.py")


class NetemUnavailable(RuntimeError):
    """The kernel has no ``sch_netem``: ``tc`` cannot delay packets here."""


def has_netem() -> bool:
    """Whether ``tc netem`` works on this kernel (tried on a throwaway namespace)."""
    probe = f"rsvprobe{uuid.uuid4().hex[:6]}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode:
        return False
    try:
        tried = subprocess.run(
            ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
             "delay", "1ms"],
            capture_output=True,
        )  # fmt: skip
        return tried.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def missing() -> str | None:
    """Why no lab can be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    absent = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not found (Debian: iproute2, nftables)"
    probe = f"rsvprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False)
    if made.returncode:
        return f"cannot create a network namespace: {made.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _sh(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.decode().strip()}")


@dataclass
class Host:
    name: str
    netns: str
    address: str  # its address in the lab
    interface: str  # its end of the veth, inside its namespace
    port: str  # the other end, a bridge port inside the hub


@dataclass
class DelayLine:
    """A TCP forwarder in a lab host (tests/chaos/delayline.py): connect to
    ``address:port`` to reach its target; ``on()`` holds every chunk, either way,
    delay ± jitter ms (order kept), ``off()`` forwards at once again."""

    process: subprocess.Popen[bytes]
    address: str
    port: int

    def on(self) -> None:
        self.process.send_signal(signal.SIGUSR1)

    def off(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGUSR2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@dataclass
class Lab:
    """Make one with ``with lab() as net:``; every namespace goes with it."""

    tag: str
    subnet: ipaddress.IPv4Network
    hub: str
    hosts: dict[str, Host] = field(default_factory=dict)
    _faulted: set[str] = field(default_factory=set)
    lines: list[DelayLine] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        """The machine's own address in the lab (reach the test process here)."""
        return str(self.subnet.network_address + 1)

    def add(self, name: str) -> Host:
        """A new host, reachable from the machine and from every other host."""
        index = len(self.hosts) + 2
        netns = f"rsv{self.tag}{name}"
        inner, port = f"v{self.tag}{index}", f"b{self.tag}{index}"
        address = str(self.subnet.network_address + index)
        _sh("ip", "netns", "add", netns)
        _sh("ip", "-n", netns, "link", "set", "lo", "up")
        _sh("ip", "link", "add", inner, "netns", netns, "type", "veth",
            "peer", port, "netns", self.hub)  # fmt: skip
        _sh("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
        _sh("ip", "-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", inner)
        _sh("ip", "-n", netns, "link", "set", inner, "up")
        _sh("ip", "-n", netns, "route", "add", "default", "via", self.gateway)
        host = Host(name, netns, address, inner, port)
        self.hosts[name] = host
        return host

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``name``'s namespace (give it to Popen)."""
        return ["ip", "netns", "exec", self.hosts[name].netns, *argv]

    def partition(self, name: str, peers: Sequence[str]) -> None:
        """Nothing passes between host ``name`` and ``peers`` (names, or
        ``"machine"`` for the machine's own namespace), either way."""
        self._drop(name, peers, directions=("saddr", "daddr"))

    def drop_from(self, name: str, peers: Sequence[str]) -> None:
        """Host ``name`` hears nothing from ``peers`` but can still send to them:
        their TCP connections hang rather than fail."""
        self._drop(name, peers, directions=("saddr",))

    def netem(
        self, name: str, *, delay_ms: int = 0, jitter_ms: int = 0, loss_pct: float = 0.0
    ) -> None:
        """Loss (both ways) and delay (± jitter) on everything host ``name`` sends
        and receives. Raises NetemUnavailable for a delay on a kernel without
        ``sch_netem``."""
        host = self.hosts[name]
        self._faulted.add(name)
        if loss_pct:
            nft = self._table(host)
            # numgen counts 0-9999: loss in hundredths of a percent (100 %: every
            # packet). On the host's wire only: what it says to itself (a delay
            # line's hop) is not lost.
            below = round(loss_pct * 100)
            odds = ["numgen", "random", "mod", "10000", "<", str(below)] if below < 10000 else []
            for chain, match in (("in", "iifname"), ("out", "oifname")):
                _sh(*nft, "add", "rule", "inet", "lab", chain, match, host.interface, *odds, "drop")
        if not delay_ms:
            return
        spec = ["delay", f"{delay_ms}ms", f"{jitter_ms}ms"]
        for ns, dev in ((host.netns, host.interface), (self.hub, host.port)):
            done = subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "netem",
                 *spec],
                capture_output=True,
            )  # fmt: skip
            if done.returncode:
                raise NetemUnavailable(done.stderr.decode().strip())

    def delay_line(
        self, name: str, port: int, target: str, *, delay_ms: int, jitter_ms: int = 0
    ) -> DelayLine:
        """A delay line in host ``name`` listening on its address at ``port`` and
        forwarding to ``target`` (``"addr:port"``, e.g. ``127.0.0.1:5432`` for a
        server in the same host). Starts off; ready when this returns."""
        host = self.hosts[name]
        argv = [sys.executable, _DELAY_LINE, "--listen", f"{host.address}:{port}", "--to", target,
                "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms)]  # fmt: skip
        line = DelayLine(subprocess.Popen(self.command(name, argv)), host.address, port)
        self.lines.append(line)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection((host.address, port), 1):
                return line
            if line.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the delay line in {name} did not start")
            time.sleep(0.05)

    def heal(self) -> None:
        """Every partition, drop and netem lifted, every delay line off."""
        for line in self.lines:
            line.off()
        for name in sorted(self._faulted):
            host = self.hosts[name]
            subprocess.run(
                ["ip", "netns", "exec", host.netns, "nft", "delete", "table", "inet", "lab"],
                capture_output=True,
                check=False,
            )
            for ns, dev in ((host.netns, host.interface), (self.hub, host.port)):
                subprocess.run(
                    ["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                    capture_output=True,
                    check=False,
                )
        self._faulted.clear()

    def _address(self, peer: str) -> str:
        return self.gateway if peer == "machine" else self.hosts[peer].address

    def _table(self, host: Host) -> list[str]:
        """The host's nftables table ``lab`` (made on first use), as a command prefix."""
        nft = ["ip", "netns", "exec", host.netns, "nft"]
        if subprocess.run([*nft, "list", "table", "inet", "lab"], capture_output=True).returncode:
            _sh(*nft, "add", "table", "inet", "lab")
            for chain, hook in (("in", "input"), ("out", "output")):
                _sh(*nft, "add", "chain", "inet", "lab", chain,
                    f"{{ type filter hook {hook} priority 0; policy accept; }}")  # fmt: skip
        return nft

    def _drop(self, name: str, peers: Sequence[str], *, directions: Sequence[str]) -> None:
        host = self.hosts[name]
        nft = self._table(host)
        for peer in peers:
            address = self._address(peer)
            if "saddr" in directions:
                _sh(*nft, "add", "rule", "inet", "lab", "in", "ip", "saddr", address, "drop")
            if "daddr" in directions:
                _sh(*nft, "add", "rule", "inet", "lab", "out", "ip", "daddr", address, "drop")
        self._faulted.add(name)


@contextlib.contextmanager
def lab() -> Iterator[Lab]:
    """A lab with no host yet: ``net.add("pg")``. Torn down on exit, processes
    inside its namespaces are the caller's to stop first."""
    tag = uuid.uuid4().hex[:4]
    # A /24 of 10.0.0.0/8 picked from the tag, so two labs at once do not meet.
    octets = bytes.fromhex(tag)
    subnet = ipaddress.IPv4Network(f"10.{100 + octets[0] % 100}.{octets[1]}.0/24")
    hub = f"rsv{tag}hub"
    net = Lab(tag, subnet, hub)
    uplink, downlink = f"u{tag}", f"d{tag}"
    try:
        _sh("ip", "netns", "add", hub)
        _sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", hub, "link", "set", "br0", "up")
        _sh("ip", "link", "add", uplink, "type", "veth", "peer", downlink, "netns", hub)
        _sh("ip", "-n", hub, "link", "set", downlink, "master", "br0", "up")
        _sh("ip", "addr", "add", f"{net.gateway}/{subnet.prefixlen}", "dev", uplink)
        _sh("ip", "link", "set", uplink, "up")
        yield net
    finally:
        net.heal()
        for line in net.lines:
            line.stop()
        for host in net.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", uplink], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", hub], capture_output=True, check=False)
