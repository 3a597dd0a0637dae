"""The destination policy of outbound calls a client chooses (scheduler.egress)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reservo.scheduler.egress import (
    AllowList,
    address_refusal,
    literal_address,
    parse_allow,
    refused_range,
    static_refusal,
)

REFUSED = [
    "127.0.0.1",
    "127.255.255.254",
    "10.1.2.3",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "169.254.0.1",
    "0.0.0.0",
    "100.64.0.1",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "240.0.0.1",
    "192.0.2.1",
    "::",
    "::1",
    "fe80::1",
    "fd00:ec2::254",  # AWS metadata over IPv6
    "fc00::1",
    "ff02::1",
    "::ffff:127.0.0.1",  # IPv4-mapped forms
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "::127.0.0.1",  # IPv4-compatible (deprecated)
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2001:db8::1",
    "::ffff:0:127.0.0.1",  # IPv4-translated (RFC 2765) forms
    "::ffff:0:a9fe:a9fe",
    "::ffff:0:10.0.0.1",
    "::169.254.169.254",
    "64:ff9b::10.0.0.1",
    "64:ff9b:1::a00:1",  # local-use NAT64, refused whole
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "2a00:1450::5efe:127.0.0.1",  # ISATAP, private IPv4 id
    "2a00:1450::200:5efe:169.254.169.254",  # ISATAP, u/l bit set
    "2002:808:808::5efe:10.0.0.1",  # public 6to4 in front of an ISATAP id
]
PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "172.15.255.255",
    "172.32.0.1",
    "192.169.0.1",
    "100.128.0.1",
    "::ffff:8.8.8.8",
    "2606:4700:4700::1111",
    "2a00:1450:4001:80b::200e",
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
    "::ffff:0:8.8.8.8",  # IPv4-translated 8.8.8.8
    "2002:808:808::1",  # 6to4 of 8.8.8.8
    "2a00:1450::200:5efe:8.8.8.8",  # ISATAP of 8.8.8.8
]


@pytest.mark.parametrize("address", REFUSED)
def test_inside_addresses_are_refused_by_default(address: str) -> None:
    ip = ipaddress.ip_address(address)
    assert refused_range(ip) is not None
    assert address_refusal(AllowList(), ip, 80) is not None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_may_be_called(address: str) -> None:
    assert refused_range(ipaddress.ip_address(address)) is None


def test_parse_allow_reads_addresses_networks_and_names() -> None:
    allow = parse_allow(" 127.0.0.1, 10.0.0.0/8 ,Callbacks.Internal., [::1], 127.2 ,")
    assert allow.hosts == frozenset({("callbacks.internal", None)})
    assert {(str(net), port) for net, port in allow.networks} == {
        ("127.0.0.1/32", None),
        ("10.0.0.0/8", None),
        ("::1/128", None),
        ("127.0.0.2/32", None),
    }
    assert allow.allows_host("CALLBACKS.internal", 8443)
    assert not allow.allows_host("other.internal", 80)
    assert parse_allow("") == AllowList()


def test_parse_allow_reads_ports_and_shows_one_spelling_per_destination() -> None:
    allow = parse_allow(
        "0x7f.1:8000, [::ffff:127.0.0.2]:81, [::1]:82, 10.0.0.0/8:443, "
        "[fd00::/8]:9, cb.internal:443, cb.internal, 192.168.1.1"
    )
    assert allow.entries() == [
        "127.0.0.1:8000",
        "127.0.0.2:81",
        "[::1]:82",
        "10.0.0.0/8:443",
        "[fd00::/8]:9",
        "192.168.1.1",
        "cb.internal",
        "cb.internal:443",
    ]
    # What `reservo config` shows reads back as the same allow list.
    assert parse_allow(str(allow)) == allow


@pytest.mark.parametrize(
    "entry",
    [
        "10.0.0.1/8",
        "10.0.0.0/33",
        "not a host",
        "-bad.example",
        "a..b",
        "http://x/",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:http",
        "127.0.0.1:",
        "[::1",
        "[::1]8000",
        "a:b:c",
    ],
)
def test_parse_allow_refuses_what_it_cannot_read(entry: str) -> None:
    with pytest.raises(ValueError):
        parse_allow(entry)


def test_allow_list_lifts_the_refusal_of_its_addresses_only() -> None:
    allow = parse_allow("127.0.0.1,10.0.0.0/8")
    for allowed in ("127.0.0.1", "::ffff:127.0.0.1", "10.200.0.1"):
        assert address_refusal(allow, ipaddress.ip_address(allowed), 5432) is None
    for refused in ("127.0.0.2", "::1", "169.254.169.254", "192.168.0.1"):
        assert address_refusal(allow, ipaddress.ip_address(refused), 5432) is not None


# 127.0.0.1 as a URL may write it: every spelling is the same address.
LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "2130706433",
    "0x7f000001",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "017700000001",
    "127.1",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_an_address_allowed_with_a_port_is_allowed_on_that_port_only(host: str) -> None:
    allow = parse_allow("127.0.0.1:8000")
    assert static_refusal(allow, f"http://{host}:5432/") is not None
    assert static_refusal(allow, f"http://{host}:6379/") is not None
    assert static_refusal(allow, f"http://{host}/") is not None  # port 80
    if not host.startswith("0177"):  # httpx refuses a leading-zero octet as a URL
        assert static_refusal(allow, f"http://{host}:8000/healthz") is None
        assert static_refusal(allow, f"http://{host}:08000/healthz") is None
    ip = literal_address(host)
    assert ip is not None
    assert address_refusal(allow, ip, 8000) is None
    assert address_refusal(allow, ip, 5432) is not None


def test_a_name_allowed_with_a_port_is_allowed_on_that_port_only() -> None:
    allow = parse_allow("callbacks.internal:443,any.internal")
    assert allow.allows_host("Callbacks.Internal.", 443)
    assert not allow.allows_host("callbacks.internal", 80)
    assert allow.allows_host("any.internal", 6379)  # no port given: every port


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
        ("fe80::1%eth0", "fe80::1"),
    ],
)
def test_literal_address_reads_every_numeric_form(host: str, address: str) -> None:
    assert literal_address(host) == ipaddress.ip_address(address)


@pytest.mark.parametrize("host", ["example.com", "localhost", "deadbeef", "1.2.3.4.example"])
def test_names_are_not_literals(host: str) -> None:
    assert literal_address(host) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pw@example.com/hook",
        "http://user@example.com/hook",
        "https://:pw@example.com/",
        "ftp://example.com/",
        "http://127.0.0.1:8080/hook",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://2130706433/",
        "http://0x7f.1/",
        "http://10.0.0.1/",
        "http://[fd00:ec2::254]/",
    ],
)
def test_static_check_refuses_credentials_and_inside_literals(url: str) -> None:
    assert static_refusal(AllowList(), url) is not None


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/hook?x=1",
        "http://8.8.8.8/",
        # Names are resolved, and checked, when the call is made.
        "http://localhost:8080/",
        "http://metadata.google.internal/",
    ],
)
def test_static_check_passes_public_literals_and_names(url: str) -> None:
    assert static_refusal(AllowList(), url) is None


def test_static_check_honours_the_allow_list_but_never_credentials() -> None:
    allow = parse_allow("127.0.0.1,callbacks.internal")
    assert static_refusal(allow, "http://127.0.0.1:9000/hook") is None
    assert static_refusal(allow, "http://callbacks.internal/hook") is None
    assert static_refusal(allow, "http://u:p@127.0.0.1/") is not None
    assert static_refusal(allow, "http://u:p@callbacks.internal/") is not None


ipv4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
ipv6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)


@given(ipv4)
def test_mapped_ipv6_forms_get_the_ipv4_decision(ip: ipaddress.IPv4Address) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{ip}")
    assert (refused_range(mapped) is None) == (refused_range(ip) is None)


# Every IPv6 form carrying an IPv4 address a gateway inside may forward to.
EMBEDDINGS = {
    "IPv4-mapped": lambda v4: f"::ffff:{v4}",
    "IPv4-translated": lambda v4: f"::ffff:0:{v4}",
    "IPv4-compatible": lambda v4: f"::{v4}",
    "NAT64": lambda v4: f"64:ff9b::{v4}",
    "6to4": lambda v4: "2002:{:04x}:{:04x}::1".format(*divmod(int(v4), 1 << 16)),
    "ISATAP": lambda v4: f"2a00:1450:4001:80b:0:5efe:{v4}",
    "ISATAP (global)": lambda v4: f"2a00:1450:4001:80b:200:5efe:{v4}",
}


@pytest.mark.parametrize("form", sorted(EMBEDDINGS))
@given(ipv4)
def test_every_embedded_ipv4_form_refuses_a_refused_ipv4(
    form: str, ip: ipaddress.IPv4Address
) -> None:
    wrapped = ipaddress.IPv6Address(EMBEDDINGS[form](ip))
    if refused_range(ip) is not None:
        assert refused_range(wrapped) is not None, (form, str(wrapped))
        assert address_refusal(AllowList(), wrapped, 80) is not None


@pytest.mark.parametrize("form", sorted(EMBEDDINGS))
@pytest.mark.parametrize("inside", ["127.0.0.1", "169.254.169.254", "10.0.0.1", "192.168.1.1"])
def test_every_embedded_form_of_an_inside_address_is_refused_at_the_static_check(
    form: str, inside: str
) -> None:
    url = f"http://[{EMBEDDINGS[form](ipaddress.IPv4Address(inside))}]:8080/hook"
    assert static_refusal(AllowList(), url) is not None, url


@given(ipv4)
def test_every_accepted_ipv4_is_global_unicast(ip: ipaddress.IPv4Address) -> None:
    if refused_range(ip) is None:
        assert ip.is_global and not ip.is_multicast


@given(ipv6)
def test_every_accepted_ipv6_is_global_unicast(ip: ipaddress.IPv6Address) -> None:
    if refused_range(ip) is None and ip.ipv4_mapped is None:
        assert ip.is_global and not ip.is_multicast and not ip.is_link_local


@given(st.sampled_from(["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8"]), st.data())
def test_an_allowed_network_lifts_exactly_its_own_addresses(net: str, data: st.DataObject) -> None:
    network = ipaddress.IPv4Network(net)
    inside = ipaddress.IPv4Address(
        data.draw(st.integers(int(network.network_address), int(network.broadcast_address)))
    )
    allow = parse_allow(net)
    assert refused_range(inside) is not None
    assert address_refusal(allow, inside, 80) is None
    assert address_refusal(AllowList(), inside, 80) is not None
