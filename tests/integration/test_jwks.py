"""Tokens of an identity provider, through HTTP: a JWKS server of the test's own
(a real HTTP server on a loopback port) publishes RS256, ES256 and EdDSA keys and
rotates them; the API verifies each token against the key its kid names, checks
iss and aud, binds alg to the key, maps the provider's role and user-id claims,
fetches the set again on an unknown kid (one shared fetch, rate limited), and
keeps the last good set while the provider is down. FastAPI routes (GET
/api/appointments/{id}), the hot path (POST /api/appointments) and the
console's sign-in all take the same tokens."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from pydantic import ValidationError

from reservo.app import create_app
from reservo.bootstrap import build
from reservo.core.kernel.clock import OffsetClock
from reservo.settings import Settings
from tests.helpers.appointments import make_slots
from tests.helpers.auth import auth, new_id, token
from tests.helpers.console import sign_in
from tests.helpers.http import key

ISSUER = "https://idp.example/realms/clinic"
AUDIENCE = "reservo-api"
# Authenticated, then not found: a 404 says the token was accepted, a 401 it was not.
PROBE = "/api/appointments/4611686018427387904"
ACCEPTED = (404, "appointment_not_found")
REFUSED = (401, "unauthenticated")


@dataclass(frozen=True)
class SigningKey:
    kid: str
    alg: str
    private: Any

    def jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        algorithm: Any = {"RS256": RSAAlgorithm, "ES256": ECAlgorithm, "EdDSA": OKPAlgorithm}[
            self.alg
        ]
        # As Entra publishes them: no "alg", the key type decides.
        return {**algorithm.to_jwk(public, as_dict=True), "kid": self.kid, "use": "sig"}

    def sign(
        self, claims: dict[str, Any], *, alg: str | None = None, kid: str | None = None
    ) -> str:
        headers = {"kid": kid or self.kid}
        return jwt.encode(claims, self.private, algorithm=alg or self.alg, headers=headers)


def _rsa(kid: str) -> SigningKey:
    return SigningKey(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))


RSA_1, RSA_2 = _rsa("rsa-2024"), _rsa("rsa-2025")
EC = SigningKey("ec-1", "ES256", ec.generate_private_key(ec.SECP256R1()))
ED = SigningKey("ed-1", "EdDSA", ed25519.Ed25519PrivateKey.generate())


def claims(sub: int | str | None = None, role: Any = "patient", **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": str(sub or new_id()),
        "role": role,
        "iat": now,
        "exp": now + 300,
        **extra,
    }


class JwksServer:
    """The provider's JWKS endpoint: serves ``keys`` while ``up``, drops the
    connection unanswered while down (an unreachable provider), counts requests."""

    def __init__(self, keys: list[dict[str, Any]]) -> None:
        self.keys = keys
        self.up = True
        self.fetches = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.fetches += 1
                if not server.up:
                    self.close_connection = True
                    return
                body = json.dumps({"keys": server.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/certs"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def jwks() -> Iterator[JwksServer]:
    server = JwksServer([RSA_1.jwk(), EC.jwk(), ED.jwk()])
    yield server
    server.close()


@asynccontextmanager
async def provider_api(
    base_settings: Settings, jwks: JwksServer, *, lifespan: bool = False, **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """An API process configured for the provider (``lifespan``: with its
    background tasks running, the periodic key refresh among them)."""
    configured = base_settings.with_(
        **{
            "jwt_jwks_url": jwks.url,
            "jwt_issuer": ISSUER,
            "jwt_audience": AUDIENCE,
            **settings,
        }
    )
    container = build(configured, OffsetClock())
    app = create_app(container, owns_container=False)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(container.close)
        if lifespan:
            await stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=app)
        yield await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://reservo.test")
        )


def _bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


async def _status(api: httpx.AsyncClient, value: str, path: str = PROBE) -> tuple[int, str]:
    r = await api.get(path, headers=_bearer(value))
    return r.status_code, r.json().get("code", "") if r.status_code >= 400 else ""


async def _until(condition: Any, what: str, limit_s: float = 10.0) -> None:
    """Waits for a background task's effect (not a timing assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# -- accepted tokens -----------------------------------------------------------------


async def test_rs256_es256_and_eddsa_tokens_are_accepted_on_fastapi_routes(
    base_settings: Settings, jwks: JwksServer
) -> None:
    async with provider_api(base_settings, jwks) as api:
        for signer in (RSA_1, EC, ED):
            assert await _status(api, signer.sign(claims())) == ACCEPTED, signer.alg
    assert jwks.fetches == 1  # the set once, each kid from it


async def test_a_provider_token_books_on_the_hot_path(
    base_settings: Settings, jwks: JwksServer, client: httpx.AsyncClient
) -> None:
    _, slots = await make_slots(client)  # the demo's HS256 admin, on another app
    patient = new_id()
    async with provider_api(base_settings, jwks) as api:
        for slot, signer in zip(slots[:2], (EC, ED), strict=True):
            r = await api.post(
                "/api/appointments",
                json={"slotId": slot["id"], "patientId": patient},
                headers={**_bearer(signer.sign(claims(patient))), **key()},
            )
            assert r.status_code == 201, r.text
            assert r.json()["patientId"] == patient
        # The owner rule holds for the provider's users too.
        r = await api.post(
            "/api/appointments",
            json={"slotId": slots[2]["id"], "patientId": new_id()},
            headers={**_bearer(EC.sign(claims(patient))), **key()},
        )
        assert (r.status_code, r.json()["code"]) == (403, "forbidden")
        # A refused token on the hot route: the same 401.
        r = await api.post(
            "/api/appointments",
            json={"slotId": slots[2]["id"], "patientId": patient},
            headers={**_bearer(EC.sign(claims(patient, iss="https://evil.example"))), **key()},
        )
        assert (r.status_code, r.json()["code"]) == REFUSED


# -- iss, aud, times -------------------------------------------------------------------


async def test_wrong_issuer_or_audience_is_401(base_settings: Settings, jwks: JwksServer) -> None:
    async with provider_api(base_settings, jwks) as api:
        assert await _status(api, RSA_1.sign(claims())) == ACCEPTED
        for wrong in (
            claims(iss="https://other.example/realms/clinic"),
            claims(aud="another-app"),
            claims(aud=["another-app", "account"]),
            {k: v for k, v in claims().items() if k != "iss"},
            {k: v for k, v in claims().items() if k != "aud"},
        ):
            assert await _status(api, RSA_1.sign(wrong)) == REFUSED, wrong
        # One of several audiences is enough.
        assert await _status(api, RSA_1.sign(claims(aud=["account", AUDIENCE]))) == ACCEPTED


async def test_provider_tokens_keep_the_time_rules(
    base_settings: Settings, jwks: JwksServer
) -> None:
    now = int(time.time())
    async with provider_api(base_settings, jwks) as api:
        for wrong in (
            claims(exp=now - 1),
            claims(exp=now + 2 * 24 * 3600),  # beyond RESERVO_JWT_MAX_LIFETIME_S
            claims(iat=now - 2 * 24 * 3600, exp=now + 60),
            claims(nbf=now + 3600),
            claims(exp="tomorrow"),
            {k: v for k, v in claims().items() if k != "exp"},
        ):
            assert await _status(api, EC.sign(wrong)) == REFUSED, wrong
        assert await _status(api, EC.sign(claims(nbf=now - 5))) == ACCEPTED


# -- alg bound to the key ------------------------------------------------------------


async def test_an_alg_the_key_does_not_sign_with_is_401(
    base_settings: Settings, jwks: JwksServer
) -> None:
    oct_secret = b"a-symmetric-key-someone-published-in-the-set!!"
    jwks.keys.append({"kty": "oct", "kid": "oct-1", "k": _b64(oct_secret), "use": "sig"})
    async with provider_api(base_settings, jwks, jwt_accept_hs256=True) as api:
        assert await _status(api, RSA_1.sign(claims())) == ACCEPTED
        payload = _b64(json.dumps(claims()).encode())
        for forged in (
            # An RSA signature presented under the EC key's kid.
            RSA_1.sign(claims(), kid=EC.kid),
            # RSA-PSS under an RS256 key.
            RSA_1.sign(claims(), alg="PS256"),
            # "none", unsigned.
            f"{_b64(json.dumps({'alg': 'none', 'kid': RSA_1.kid}).encode())}.{payload}.",
            # HS256 keyed with the published RSA key, under its kid.
            _hs256(json.dumps(RSA_1.jwk()).encode(), claims(), RSA_1.kid),
            # A symmetric key in the set is never a provider key.
            _hs256(oct_secret, claims(), "oct-1"),
            # No kid at all.
            jwt.encode(claims(), EC.private, algorithm="ES256"),
        ):
            assert await _status(api, forged) == REFUSED, forged


def _hs256(secret: bytes, body: dict[str, Any], kid: str) -> str:
    """An HS256 token keyed with ``secret`` (PyJWT itself refuses JWK-looking keys)."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    signing_input = f"{head}.{_b64(json.dumps(body).encode())}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(mac)}"


# -- reservo's own tokens ----------------------------------------------------------------


async def test_hs256_tokens_are_refused_beside_a_provider_unless_allowed(
    base_settings: Settings, jwks: JwksServer
) -> None:
    own = token("patient", new_id())
    async with provider_api(base_settings, jwks) as api:
        assert await _status(api, own) == REFUSED
        assert await _status(api, RSA_1.sign(claims())) == ACCEPTED
    async with provider_api(base_settings, jwks, jwt_accept_hs256=True) as api:
        assert await _status(api, own) == ACCEPTED
        assert await _status(api, RSA_1.sign(claims())) == ACCEPTED


# -- where the role and the user id are --------------------------------------------------


async def test_roles_and_user_ids_from_the_providers_claims(
    base_settings: Settings, jwks: JwksServer
) -> None:
    keycloak = {
        "jwt_role_claim": "realm_access.roles",
        "jwt_sub_claim": "reservo_id",
        "jwt_role_map": {"clinic-admin": "admin", "clinic-patient": "patient"},
    }
    admin_only = "/api/ops/dead-letters"

    def kc(roles: Any, reservo_id: Any = None) -> str:
        body = claims(sub=str(uuid.uuid4()), role=None)
        body["realm_access"] = {"roles": roles}
        body["reservo_id"] = new_id() if reservo_id is None else reservo_id
        return ED.sign(body)

    async with provider_api(base_settings, jwks, **keycloak) as api:
        # The first role that maps wins; the provider's own roles are skipped.
        assert await _status(api, kc(["offline_access", "clinic-admin"]), admin_only) == (200, "")
        assert await _status(api, kc(["clinic-patient", "clinic-admin"]), admin_only) == (
            403,
            "forbidden",
        )
        assert await _status(api, kc(["clinic-patient"])) == ACCEPTED
        assert await _status(api, kc("clinic-patient")) == ACCEPTED  # a string claim
        assert await _status(api, kc(["clinic-patient"], str(new_id()))) == ACCEPTED
        for wrong in (
            kc(["admin"]),  # a reservo name the map does not list
            kc(["offline_access"]),
            kc([]),
            kc({"clinic-admin": True}),
            kc(["clinic-patient"], "0042"),
            kc(["clinic-patient"], "٤٢"),
            kc(["clinic-patient"], 0),
            kc(["clinic-patient"], 2**63),
            kc(["clinic-patient"], True),
            kc(["clinic-patient"], 42.0),
            kc(["clinic-patient"], "someone@example.org"),
        ):
            assert await _status(api, wrong) == REFUSED
    # Auth0's namespaced claims are URLs: the exact name wins over the dotted path.
    auth0 = {"jwt_role_claim": "https://reservo.example/roles"}
    async with provider_api(base_settings, jwks, **auth0) as api:
        body = claims(role=None, **{"https://reservo.example/roles": ["admin"]})
        assert await _status(api, RSA_1.sign(body), admin_only) == (200, "")
    # A provider's own subject (a UUID) is no user id.
    async with provider_api(base_settings, jwks) as api:
        assert await _status(api, RSA_1.sign(claims(sub=str(uuid.uuid4())))) == REFUSED


def test_a_role_map_to_an_unknown_role_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="jwt_role_map"):
        Settings(jwt_role_map={"clinic-admin": "superuser"})
    with pytest.raises(ValidationError, match="jwt_jwks_url"):
        Settings(jwt_jwks_url="file:///etc/passwd")


# -- key rotation, the refresh rules, an unreachable provider ---------------------------


async def test_rotated_keys_new_kid_picked_up_old_one_valid_until_it_leaves(
    base_settings: Settings, jwks: JwksServer
) -> None:
    jwks.keys = [RSA_1.jwk()]
    async with provider_api(base_settings, jwks, jwt_jwks_min_interval_s=0.1) as api:
        old = RSA_1.sign(claims())
        assert await _status(api, old) == ACCEPTED
        jwks.keys = [RSA_1.jwk(), RSA_2.jwk()]  # the provider publishes the next key
        await asyncio.sleep(0.15)  # past the refresh interval (a lower bound only)
        new = RSA_2.sign(claims())
        assert await _status(api, new) == ACCEPTED  # no restart
        assert await _status(api, old) == ACCEPTED
        assert await _status(api, RSA_1.sign(claims())) == ACCEPTED
        assert jwks.fetches == 2
        jwks.keys = [RSA_2.jwk()]  # the old key is retired
        await asyncio.sleep(0.15)
        # Anything that makes the API fetch the set again (here a token of a kid
        # it does not know; every refresh period anyway).
        assert await _status(api, RSA_2.sign(claims(), kid="not-yet")) == REFUSED
        assert jwks.fetches == 3
        assert await _status(api, old) == REFUSED  # remembered before: forgotten
        assert await _status(api, RSA_1.sign(claims())) == REFUSED
        assert await _status(api, new) == ACCEPTED


async def test_a_flood_of_unknown_kids_is_one_fetch(
    base_settings: Settings, jwks: JwksServer
) -> None:
    async with provider_api(base_settings, jwks, jwt_jwks_min_interval_s=10.0) as api:
        gate = asyncio.Event()

        async def one(value: str) -> tuple[int, str]:
            await gate.wait()
            return await _status(api, value)

        async def flood() -> list[tuple[int, str]]:
            made_up = [RSA_1.sign(claims(), kid=f"made-up-{i}") for i in range(150)]
            valid = [EC.sign(claims()) for _ in range(50)]
            tasks = [asyncio.ensure_future(one(value)) for value in made_up + valid]
            await asyncio.sleep(0)
            gate.set()
            answers = await asyncio.gather(*tasks)
            gate.clear()
            assert answers[150:] == [ACCEPTED] * 50  # they waited for the one fetch
            return answers[:150]

        # Before any fetch: every request with a kid not in hand shares one fetch.
        assert await flood() == [REFUSED] * 150
        assert jwks.fetches == 1
        # Within the interval: no fetch at all.
        assert await flood() == [REFUSED] * 150
        assert jwks.fetches == 1
    async with provider_api(base_settings, jwks, jwt_jwks_min_interval_s=0.1) as api:
        # An alg no provider key signs with never asks for the set.
        odd = _hs256(b"x" * 32, claims(), "made-up")
        odd = odd.replace(odd.split(".")[0], _b64(b'{"alg":"HS512","kid":"made-up"}'))
        assert await _status(api, odd) == REFUSED
        assert jwks.fetches == 1
        made_up = [RSA_1.sign(claims(), kid=f"made-up-{i}") for i in range(3)]
        assert await _status(api, made_up[0]) == REFUSED
        assert jwks.fetches == 2
        await asyncio.sleep(0.15)  # one fetch per interval, no more
        assert [await _status(api, value) for value in made_up] == [REFUSED] * 3
        assert jwks.fetches == 3


async def test_provider_down_at_start_then_up(base_settings: Settings, jwks: JwksServer) -> None:
    jwks.up = False
    async with provider_api(base_settings, jwks, lifespan=True, jwt_jwks_min_interval_s=0.1) as api:
        await _until(lambda: jwks.fetches >= 1, "the first fetch at start")
        assert await _status(api, RSA_1.sign(claims())) == REFUSED  # cannot be verified
        ready = await api.get("/readyz")
        assert ready.status_code == 200, ready.text  # the provider is not a dependency
        jwks.up = True
        await asyncio.sleep(0.15)
        assert await _status(api, RSA_1.sign(claims())) == ACCEPTED


async def test_provider_down_later_keeps_the_last_good_set(
    base_settings: Settings, jwks: JwksServer
) -> None:
    # A short refresh period (below the setting's floor) so the background refresh
    # runs, and fails, several times within the test.
    async with provider_api(
        base_settings, jwks, lifespan=True, jwt_jwks_refresh_s=0.05, jwt_jwks_min_interval_s=0.05
    ) as api:
        await _until(lambda: jwks.fetches >= 2, "the periodic refresh")
        assert await _status(api, RSA_1.sign(claims())) == ACCEPTED
        jwks.up = False
        failed = jwks.fetches
        await _until(lambda: jwks.fetches >= failed + 3, "refreshes failing")
        # Tokens never seen before, verified against the last good set.
        for signer in (RSA_1, EC, ED):
            assert await _status(api, signer.sign(claims())) == ACCEPTED
        assert await _status(api, RSA_2.sign(claims())) == REFUSED
        jwks.keys = [RSA_2.jwk()]
        jwks.up = True
        await _until(lambda: jwks.fetches >= failed + 6, "refreshes again")
        assert await _status(api, RSA_2.sign(claims())) == ACCEPTED
        assert await _status(api, RSA_1.sign(claims())) == REFUSED


# -- the console ------------------------------------------------------------------------


async def test_the_console_signs_a_providers_admin_in(
    base_settings: Settings, jwks: JwksServer
) -> None:
    async with provider_api(base_settings, jwks) as api:
        assert (await sign_in(api, auth("admin", 1)["Authorization"][7:])).status_code == 401
        r = await sign_in(api, ED.sign(claims(role="patient")))
        assert r.status_code == 403
        r = await sign_in(api, ED.sign(claims(role="admin")))
        assert r.status_code == 303 and r.headers["location"] == "/console"
        assert (await api.get("/console")).status_code == 200
