"""Bearer tokens and webhook signatures are untrusted input: whatever their bytes,
parsing them ends in a Principal that satisfies every rule or in a 401, never in
another exception (which the app would answer with a 500)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reservo.core.http.auth import (
    _MINTED_HEADER,
    DEFAULT_MAX_LIFETIME_S,
    MAX_SUB,
    ROLES,
    Principal,
    TokenVerifier,
    _minted_claims,
    _verify,
    mint_token,
    parse_signature,
    sign_webhook,
    verify_webhook,
)
from reservo.core.kernel.errors import DomainError
from tests.helpers.auth import JWT_SECRET, forge_token

NOW = datetime(2026, 6, 1, tzinfo=UTC)
LATER = int(NOW.timestamp()) + 3600
WEBHOOK_SECRET = "webhook-secret"
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode(token: str) -> Principal:
    return TokenVerifier(JWT_SECRET, max_entries=0).principal(f"Bearer {token}", NOW)


def refused(call: Any, *args: Any, code: str) -> DomainError:
    with pytest.raises(DomainError) as info:
        call(*args)
    assert (info.value.status, info.value.code) == (401, code)
    return info.value


def claims(sub: str = '"7"', role: str = '"bettor"', exp: str = str(LATER), extra: str = "") -> str:
    """A payload written by hand, so any JSON literal (NaN, 1e400) can be a claim."""
    return f'{{"sub":{sub},"role":{role},"exp":{exp}{extra}}}'


# -- tokens, case by case ------------------------------------------------------------


def test_a_well_formed_token_names_its_caller() -> None:
    assert decode(forge_token(claims())) == Principal(sub=7, role="bettor")
    assert decode(forge_token(claims(sub=f'"{MAX_SUB}"'))).sub == MAX_SUB
    assert decode(forge_token(claims(exp=f"{LATER}.5"))).sub == 7


@pytest.mark.parametrize(
    "sub",
    [
        '"0"',  # owner 0 is the system accounts' owner
        '"01"',  # aliases user 1
        '"\u0660"',  # Arabic-Indic zero: str.isdigit() and int() take it
        '"\u0661"',  # Arabic-Indic one
        '"\uff11"',  # fullwidth one
        '"-1"',
        '"+1"',
        '" 1"',
        '"1 "',
        '"1\\n"',
        '"1_000"',
        '"1e3"',
        f'"{MAX_SUB + 1}"',
        '"99999999999999999999"',
        '"' + "9" * 5000 + '"',  # int() refuses this many digits by raising
        "7",  # a number, not a string
        "null",
        "[7]",
        '{"id": 7}',
        '""',
    ],
)
def test_sub_must_be_a_canonical_ascii_user_id(sub: str) -> None:
    refused(decode, forge_token(claims(sub=sub)), code="unauthenticated")


@pytest.mark.parametrize(
    "role", ['["admin"]', '{"admin": true}', "1", "true", "null", '"Admin"', '"root"']
)
def test_role_must_be_a_known_role_string(role: str) -> None:
    refused(decode, forge_token(claims(role=role)), code="unauthenticated")


@pytest.mark.parametrize(
    "exp",
    ["NaN", "Infinity", "-Infinity", "true", "null", f'"{LATER}"', f"[{LATER}]", "1e400", "0"],
)
def test_exp_must_be_a_finite_number_in_the_future(exp: str) -> None:
    refused(decode, forge_token(claims(exp=exp)), code="unauthenticated")


@pytest.mark.parametrize(
    "extra",
    [
        ',"iat":Infinity',
        ',"iat":NaN',
        ',"iat":1e400',
        ',"nbf":Infinity',
        ',"nbf":"soon"',
        ',"iat":' + "9" * 5000,
        ',"aud":[1,[2]]',
        ',"aud":NaN',
        ',"deep":' + "[" * 5000 + "]" * 5000,
    ],
)
def test_odd_registered_claims_are_refused_not_crashed_on(extra: str) -> None:
    refused(decode, forge_token(claims(extra=extra)), code="unauthenticated")


@pytest.mark.parametrize(
    "header",
    [
        '{"alg":"none","typ":"JWT"}',
        '{"alg":"HS512"}',
        '{"alg":"RS256"}',
        '{"alg":["HS256"]}',
        '{"alg":"HS256","kid":NaN}',
        '{"alg":"HS256","crit":Infinity}',
        '{"alg":"HS256","b64":false}',
        '{"alg":"HS256","x":' + "9" * 5000 + "}",
        '["HS256"]',
        "null",
        "not json",
        '{"alg":"HS256","x":' + "[" * 5000 + "]" * 5000 + "}",
    ],
)
def test_odd_headers_are_refused(header: str) -> None:
    refused(decode, forge_token(claims(), header=header), code="unauthenticated")


def test_alg_none_wrong_secret_and_expiry_stay_refused() -> None:
    unsigned = jwt.encode({"sub": "1", "role": "admin", "exp": LATER}, key=None, algorithm="none")
    refused(decode, unsigned, code="unauthenticated")
    refused(decode, forge_token(claims(), secret="another-secret"), code="unauthenticated")
    refused(decode, forge_token(claims(exp=str(int(NOW.timestamp())))), code="unauthenticated")


@pytest.mark.parametrize("sub", [0, -1, MAX_SUB + 1])
def test_mint_token_refuses_ids_no_user_has(sub: int) -> None:
    with pytest.raises(ValueError, match="sub"):
        mint_token(JWT_SECRET, "bettor", sub, timedelta(hours=1), NOW)


# -- tokens, fuzzed -------------------------------------------------------------------

# JSON literals no encoder writes by default, and values that broke parsers before.
raw_literals = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",
        "-1e400",
        "9" * 5000,
        "[" * 2000 + "]" * 2000,
        '"\u0660"',
        '"\u0661\u0662"',
        '"\uff11"',
        '"01"',
        '"0"',
        '"-1"',
        f'"{MAX_SUB}"',
        f'"{MAX_SUB + 1}"',
        "true",
        "null",
    ]
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.from_regex(r"\A[0-9\u0660-\u0669\uff10-\uff19+\- ]{1,25}\Z"),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
claim_literal = (
    raw_literals
    | json_values.map(json.dumps)
    | st.sampled_from([f'"{r}"' for r in sorted(ROLES)] + [str(LATER), '"7"'])
)


def usually(good: str) -> st.SearchStrategy[str]:
    """Mostly a valid claim, so the fuzz reaches the checks after the others."""
    return st.one_of(st.just(good), st.just(good), claim_literal)


@st.composite
def payloads(draw: st.DrawFn) -> str:
    fields = [
        f'"sub":{draw(usually(chr(34) + "7" + chr(34)))}',
        f'"role":{draw(usually(chr(34) + "bettor" + chr(34)))}',
        f'"exp":{draw(usually(str(LATER)))}',
    ]
    names = st.sampled_from(["sub", "role", "exp", "iat", "nbf", "aud", "jti"]) | st.text(
        max_size=6
    )
    fields += [
        f"{json.dumps(draw(names))}:{draw(claim_literal)}" for _ in range(draw(st.integers(0, 3)))
    ]
    fields = draw(st.permutations(fields))
    whole = "{" + ",".join(fields) + "}"
    return draw(st.sampled_from([whole, whole, whole, draw(claim_literal)]))


@st.composite
def headers(draw: st.DrawFn) -> str:
    alg = draw(
        st.sampled_from(['"HS256"', '"HS256"', '"none"', '"RS256"', '"ES256"', '"HS384"'])
        | claim_literal
    )
    extra = draw(
        st.lists(
            st.sampled_from(["kid", "typ", "crit", "b64", "jku", "x5u", "cty"])
            .map(json.dumps)
            .flatmap(lambda k: claim_literal.map(lambda v: f",{k}:{v}")),
            max_size=3,
        )
    )
    structured = '{"alg":' + alg + "".join(extra) + "}"
    return draw(st.sampled_from([structured, structured, draw(claim_literal)]))


def check_principal(p: Principal) -> None:
    assert 1 <= p.sub <= MAX_SUB and p.role in ROLES


@FUZZ
@given(payload=payloads(), header=headers())
def test_any_signed_claims_give_a_valid_principal_or_401(payload: str, header: str) -> None:
    try:
        principal = decode(forge_token(payload, header=header))
    except DomainError as err:
        assert (err.status, err.code) == (401, "unauthenticated")
    else:
        check_principal(principal)
        data = json.loads(payload)
        exp = data["exp"]
        assert isinstance(data["sub"], str) and data["sub"] == str(principal.sub)
        assert not isinstance(exp, bool) and isinstance(exp, int | float)
        assert math.isfinite(exp) and exp > NOW.timestamp()


@FUZZ
@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
def test_any_authorization_header_is_401(value: str) -> None:
    # Starlette hands header values over as latin-1 text.
    with pytest.raises(DomainError) as info:
        TokenVerifier(JWT_SECRET, max_entries=0).principal(value, NOW)
    assert (info.value.status, info.value.code) == (401, "unauthenticated")
    with pytest.raises(DomainError) as info:
        TokenVerifier(JWT_SECRET, max_entries=0).principal(f"Bearer {value}", NOW)
    assert (info.value.status, info.value.code) == (401, "unauthenticated")


# -- webhook signatures ----------------------------------------------------------------

BODY = b'{"ok":true}'
T = int(NOW.timestamp())


def verify(header: str | None, body: bytes = BODY) -> None:
    verify_webhook(WEBHOOK_SECRET, header, body, NOW, 300)


def test_a_good_signature_passes_with_or_without_spaces() -> None:
    good = sign_webhook(WEBHOOK_SECRET, BODY, T)
    t_part, v1_part = good.split(",")
    mac = v1_part.removeprefix("v1=")
    for header in (good, f" {t_part} ,  {v1_part} ", f"{v1_part},{t_part},v0=ignored"):
        # The same timestamp and MAC read from each spelling, and they verify.
        assert parse_signature(header) == (str(T), mac), header
        verify(header)


MAC = sign_webhook(WEBHOOK_SECRET, BODY, T).split("v1=")[1]


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        f"t={'9' * 300},v1={MAC}",
        f"t={'9' * 400},v1={MAC}",  # int() of it overflowed the float comparison
        f"t={'9' * 5000},v1={MAC}",
        f"t={str(T).translate(str.maketrans('0123456789', '٠١٢٣٤٥٦٧٨٩'))},v1={MAC}",
        f"t={T},v1={'é' * 64}",  # hmac.compare_digest refused non-ASCII str
        f"t={T},v1={MAC.upper()}",
        f"t={T},v1={MAC[:-1]}",
        f"t={T},v1={MAC}0",
        f"t=+{T},v1={MAC}",
        f"t=-{T},v1={MAC}",
        f"t={T}.0,v1={MAC}",
        f"t={T},v1={MAC},v1={MAC}",
        f"t={T},t={T},v1={MAC}",
        f"t={T}",
        f"v1={MAC}",
        f"t={T - 301},v1={sign_webhook(WEBHOOK_SECRET, BODY, T - 301).split('v1=')[1]}",
        f"t={T},v1={'0' * 64}",
    ],
)
def test_malformed_or_wrong_signatures_are_bad_signature(header: str | None) -> None:
    refused(verify, header, code="bad_signature")


@FUZZ
@given(
    header=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
    body=st.binary(max_size=64),
)
def test_any_signature_header_is_bad_signature(header: str, body: bytes) -> None:
    refused(verify, header, body, code="bad_signature")


@FUZZ
@given(
    t=st.text(max_size=40) | st.integers(-(10**400), 10**400).map(str),
    v1=st.text(max_size=80) | st.text("0123456789abcdefABCDEF", min_size=60, max_size=68),
    junk=st.text(max_size=20),
)
def test_structured_but_bad_signatures_are_bad_signature(t: str, v1: str, junk: str) -> None:
    refused(verify, f"{junk},t={t},v1={v1}", code="bad_signature")


# -- the fast check of minted tokens ----------------------------------------------------


def answer(call: Any, *args: Any) -> Any:
    """What a call answers: its result, or the refusal it raises."""
    try:
        return call(*args)
    except DomainError as err:
        return (err.status, err.code, err.detail)


def test_minted_tokens_take_the_fast_check() -> None:
    token = mint_token(JWT_SECRET, "patient", 7, timedelta(hours=1), NOW)
    assert token.startswith(_MINTED_HEADER.decode() + ".")
    assert _minted_claims(JWT_SECRET.encode(), token) == {
        "sub": "7",
        "role": "patient",
        "exp": LATER,
    }
    assert _minted_claims(b"another secret", token) is None


_B64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def respelled(segment: str, how: str) -> str:
    """Another spelling of a base64url segment that PyJWT's lenient decoder reads
    as the same bytes: padded, a trailing bit set, or the standard alphabet."""
    if how == "bits" and len(segment) % 4 in (2, 3):
        # The last character's lowest bit encodes nothing at these lengths.
        last = _B64URL_ALPHABET[_B64URL_ALPHABET.index(segment[-1]) ^ 1]
        return segment[:-1] + last
    if how == "std":
        return segment.replace("-", "+").replace("_", "/")
    return segment + "=" * (-len(segment) % 4 or 2)


def respelled_token(token: str, segment: int, how: str) -> str:
    """``token`` with one segment respelled; a respelled header or payload is
    signed again as spelled (a holder of the secret can write any spelling)."""
    parts = token.split(".")
    parts[segment] = respelled(parts[segment], how)
    if segment < 2:
        signing_input = f"{parts[0]}.{parts[1]}".encode()
        mac = hmac.new(JWT_SECRET.encode(), signing_input, hashlib.sha256).digest()
        parts[2] = base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    return ".".join(parts)


def pyjwt_answer(token: str) -> Any:
    """PyJWT's answer, the reference: the path every token took before the fast
    check (segments canonical, then ``jwt.decode``, then the claim rules)."""
    return answer(lambda t: _verify(JWT_SECRET, t, NOW, DEFAULT_MAX_LIFETIME_S)[0], token)


@FUZZ
@given(
    payload=payloads(),
    header=headers() | st.just('{"alg":"HS256","typ":"JWT"}'),
    change=st.sampled_from(["", "signature", "secret", "dots", "spelling"]),
    segment=st.sampled_from([0, 1, 2]),
    how=st.sampled_from(["pad", "bits", "std"]),
)
def test_the_verifier_answers_as_pyjwt_whatever_the_token(
    payload: str, header: str, change: str, segment: int, how: str
) -> None:
    """TokenVerifier checks tokens of the minted shape itself: its answer (cache
    off) must be PyJWT's, principal or refusal with the same detail, for every
    spelling of every segment."""
    token = forge_token(
        payload, header=header, secret="x" * 40 if change == "secret" else JWT_SECRET
    )
    if change == "signature":
        token = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    elif change == "dots":
        token = token.replace(".", "..", 1)
    elif change == "spelling":
        token = respelled_token(token, segment, how)
    verifier = TokenVerifier(JWT_SECRET, max_entries=0)
    assert answer(verifier.principal, f"Bearer {token}", NOW) == pyjwt_answer(token)


@pytest.mark.parametrize("segment", [0, 1, 2])
@pytest.mark.parametrize("how", ["pad", "bits", "std"])
def test_a_minted_token_respelled_is_refused_as_pyjwt_refuses_it(segment: int, how: str) -> None:
    """Every other spelling of a valid minted token's segments is a 401, the
    same one the PyJWT path gives; the token as minted passes."""
    token = mint_token(JWT_SECRET, "patient", 123456, timedelta(hours=1), NOW)
    assert decode(token) == Principal(sub=123456, role="patient")
    other = respelled_token(token, segment, how)
    if other == token:  # no - or _ in this segment to respell
        return
    verifier = TokenVerifier(JWT_SECRET, max_entries=0)
    refusal = answer(verifier.principal, f"Bearer {other}", NOW)
    assert refusal == (
        401,
        "unauthenticated",
        "invalid token: segments must be unpadded canonical base64url",
    )
    assert refusal == pyjwt_answer(other)


def test_the_verified_cache_keeps_the_newest_tokens_and_never_grows() -> None:
    """Bounded memory whatever tokens callers send: once full, each new token
    replaces the oldest; a replaced token is verified afresh, same answer."""
    verifier = TokenVerifier(JWT_SECRET, max_entries=3)
    tokens = [
        mint_token(JWT_SECRET, "patient", sub, timedelta(hours=1), NOW) for sub in range(1, 8)
    ]
    for token in tokens:
        verifier.verify(token, NOW)
        assert len(verifier) <= 3
    assert list(verifier._verified) == tokens[-3:]
    assert verifier.verify(tokens[0], NOW) == Principal(sub=1, role="patient")
    assert list(verifier._verified) == [*tokens[-2:], tokens[0]]
