"""The lab itself (tests/chaos/netns.py): hosts reach each other and the machine,
and each fault does what it says, before any scenario relies on it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.chaos import netns

pytestmark = pytest.mark.partition

SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 7000))
while True:
    c, _ = s.accept()
    c.sendall(c.recv(64))
    c.close()
"""
CLIENT = """
import socket, sys, time
start = time.monotonic()
try:
    with socket.create_connection((sys.argv[1], 7000), timeout=1.0) as c:
        c.sendall(b"ping"); c.recv(64)
    print(round((time.monotonic() - start) * 1000))
except OSError:
    print("unreachable")
"""


@pytest.fixture
def net() -> Iterator[netns.Lab]:
    why = netns.missing()
    if why:
        pytest.skip(f"SKIPPED LOUDLY: no network lab here: {why}")
    with netns.lab() as lab:
        yield lab


def talk(net: netns.Lab, source: str, target: str) -> str:
    argv = [sys.executable, "-c", CLIENT, target]
    if source != "machine":
        argv = net.command(source, argv)
    return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()


def test_hosts_reach_each_other_until_partitioned_and_again_once_healed(net: netns.Lab) -> None:
    a = net.add("a")
    net.add("b")
    server = subprocess.Popen(net.command("a", [sys.executable, "-c", SERVER, a.address]))
    try:
        time.sleep(0.5)
        assert talk(net, "b", a.address) != "unreachable"
        assert talk(net, "machine", a.address) != "unreachable"
        net.partition("a", ["b"])
        assert talk(net, "b", a.address) == "unreachable"
        assert talk(net, "machine", a.address) != "unreachable", "the partition cut too much"
        net.heal()
        assert talk(net, "b", a.address) != "unreachable"
        net.drop_from("a", ["machine"])  # a hears nothing from the machine
        assert talk(net, "machine", a.address) == "unreachable"
        assert talk(net, "b", a.address) != "unreachable"
        net.heal()
        assert talk(net, "machine", a.address) != "unreachable"
    finally:
        server.kill()
        server.wait()


def test_the_lab_leaves_no_namespace_behind() -> None:
    why = netns.missing()
    if why:
        pytest.skip(f"SKIPPED LOUDLY: no network lab here: {why}")
    with netns.lab() as lab:
        lab.add("a")
        names = {lab.hub, lab.hosts["a"].netns}
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not names & {line.split()[0] for line in left.splitlines() if line}
    with pytest.raises(OSError):
        socket.if_nametoindex(f"u{lab.tag}")


COUNTER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 7001)); s.settimeout(1.0)
n = 0
try:
    while True:
        s.recv(16); n += 1
except TimeoutError:
    print(n)
"""


def test_loss_drops_about_its_share_of_packets(net: netns.Lab) -> None:
    a = net.add("a")
    net.netem("a", loss_pct=50)
    counter = subprocess.Popen(
        net.command("a", [sys.executable, "-c", COUNTER, a.address]),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for _ in range(400):
            udp.sendto(b"x", (a.address, 7001))
            time.sleep(0.001)
    received = int(counter.communicate(timeout=10)[0])
    # 400 packets at 50 %: fewer than 120 or more than 280 is beyond 8 sigma.
    assert 120 <= received <= 280, received


ECHO = """
import socket
s = socket.create_server(("127.0.0.1", 7000))
while True:
    c, _ = s.accept()
    while data := c.recv(64):
        c.sendall(data)
    c.close()
"""


def test_a_delay_line_holds_each_chunk_while_on_and_heal_turns_it_off(net: netns.Lab) -> None:
    a = net.add("a")
    server = subprocess.Popen(net.command("a", [sys.executable, "-c", ECHO]))
    try:
        time.sleep(0.5)
        line = net.delay_line("a", 7100, "127.0.0.1:7000", delay_ms=150)
        with socket.create_connection((a.address, 7100), timeout=5) as conn:

            def round_trip() -> float:
                t0 = time.monotonic()
                conn.sendall(b"ping")
                assert conn.recv(64) == b"ping"
                return time.monotonic() - t0

            assert round_trip() < 0.1
            line.on()
            time.sleep(0.2)  # the signal handled
            assert round_trip() >= 0.3  # 150 ms each way
            net.heal()  # off again; the connection across it stays up
            time.sleep(0.2)
            assert round_trip() < 0.1
    finally:
        server.kill()
        server.wait()


def test_loss_is_on_the_wire_not_on_the_hosts_loopback(net: netns.Lab) -> None:
    """A delay line forwards over the host's loopback: loss there would count twice."""
    net.add("a")
    net.netem("a", loss_pct=100)
    server = subprocess.Popen(net.command("a", [sys.executable, "-c", ECHO]))
    try:
        time.sleep(0.5)
        local = net.command("a", [sys.executable, "-c", CLIENT, "127.0.0.1"])
        answer = subprocess.run(local, capture_output=True, text=True, timeout=10).stdout
        assert answer.strip() != "unreachable"
        assert talk(net, "machine", net.hosts["a"].address) == "unreachable"  # the wire: all lost
    finally:
        server.kill()
        server.wait()
