"""OAuth 2.1 resource-server mode (docs/oauth.md), against a real authorization
server run in the test (tests/harness/oauth_server.py: Authlib and joserfc) and
an api replica with OAUTH_ISSUER and OAUTH_RESOURCE set, sharing the session's
Redis and worker. The session's own api has OAuth off and shows what stays
unchanged there; a second OAuth replica has OAUTH_REQUIRE_AT_JWT=false and
OAUTH_DEFAULT_SCOPES=read.

The replica logs at debug for its own crate, so the last test's scan of its log
for every token it saw covers the refusal reasons too.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import pytest
from conftest import Stack
from harness.oauth_server import SCOPES, USER, OAuthServer
from harness.procs import free_port
from harness.stack import Api
from joserfc.jwk import RSAKey
from mcp import Client
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.auth.oauth2 import AuthorizationCodeResult
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from test_api_keys import every_value
from test_mcp_sdk import call_ok, run, wait_for

pytestmark = pytest.mark.anyio

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


class OAuthApi:
    """The authorization server and an api replica that trusts it."""

    def __init__(self, server: OAuthServer, api: Api, resource: str, presented: list[str]) -> None:
        self.server = server
        self.api = api
        self.resource = resource
        self.metadata_url = f"{api.base_url}/.well-known/oauth-protected-resource/mcp"
        self.presented = presented  # every token sent to either replica, for the log scan

    async def post(self, token: str | None, body: dict[str, Any] = TOOLS_LIST) -> httpx2.Response:
        headers = dict(HEADERS)
        if token is not None:
            self.presented.append(token)
            headers["Authorization"] = f"Bearer {token}"
        async with httpx2.AsyncClient(timeout=15) as http:
            return await http.post(self.api.mcp_url, json=body, headers=headers)


@pytest.fixture(scope="module")
def auth_server() -> Iterator[OAuthServer]:
    with OAuthServer() as server:
        yield server


PRESENTED: list[str] = []  # every token the module sends to an OAuth replica


@contextlib.contextmanager
def oauth_replica(stack: Stack, server: OAuthServer, short: str, env: dict[str, str]) -> Iterator[OAuthApi]:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    env = {
        "OAUTH_ISSUER": server.issuer,
        "OAUTH_RESOURCE": resource,
        # The api's own debug lines (why a token was refused) are in the log
        # the last test scans.
        "RUST_LOG": "info,script_runner_api=debug",
    } | env
    stack.add_api(short, env, port=port)
    api = stack.start_api(short)
    try:
        yield OAuthApi(server, api, resource, PRESENTED)
    finally:
        api.proc.stop()


@pytest.fixture(scope="module")
def oauth(stack: Stack, auth_server: OAuthServer) -> Iterator[OAuthApi]:
    """The replica with the defaults: at+jwt required, no scope without a claim."""
    with oauth_replica(stack, auth_server, "api-oauth", {}) as replica:
        yield replica


@pytest.fixture(scope="module")
def lenient(stack: Stack, auth_server: OAuthServer) -> Iterator[OAuthApi]:
    """The replica with the options: any typ, and `read` for a token without a claim."""
    env = {"OAUTH_REQUIRE_AT_JWT": "false", "OAUTH_DEFAULT_SCOPES": "read"}
    with oauth_replica(stack, auth_server, "api-oauth-lenient", env) as replica:
        yield replica


def first_key(replica: OAuthApi) -> RSAKey:
    """The issuer's first key, which every key set it publishes holds: a token
    signed with it never waits on a key refetch (at most every 5 s), whenever
    the replica fetched the keys and whatever `rotate()` did since."""
    return replica.server.keys[0]


def challenge(response: httpx2.Response) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer k="v", ...` header."""
    value = response.headers.get("www-authenticate", "")
    assert value.startswith("Bearer "), response.headers
    return dict(re.findall(r'(\w+)="([^"]*)"', value))


# --------------------------------------------------------------------------- discovery


async def test_metadata_is_served_at_both_paths_and_the_401_points_at_it(stack: Stack, oauth: OAuthApi) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        for url in (oauth.metadata_url, f"{oauth.api.base_url}/.well-known/oauth-protected-resource"):
            r = await http.get(url)  # open: no token
            assert r.status_code == 200, (url, r.text)
            meta = r.json()
            assert meta["resource"] == oauth.resource
            assert meta["authorization_servers"] == [oauth.server.issuer]
            assert meta["bearer_methods_supported"] == ["header"]
            assert set(meta["scopes_supported"]) == set(SCOPES)
        # OAuth off (the session's api): no metadata (an unknown path, behind the
        # token like every path but /healthz), and the 401 as before.
        r = await http.get(f"{stack.base_url}/.well-known/oauth-protected-resource/mcp")
        assert r.status_code == 401, r.text
        r = await http.post(stack.mcp_url, json=TOOLS_LIST, headers=HEADERS)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Bearer realm="script-runner"'

    no_token = await oauth.post(None)
    assert no_token.status_code == 401
    params = challenge(no_token)
    assert params["resource_metadata"] == oauth.metadata_url
    assert params["realm"] == "script-runner"
    assert "error" not in params, "no token was presented, so none was invalid"

    wrong = await oauth.post("0" * 64)  # neither the admin token nor a JWT
    assert wrong.status_code == 401
    assert challenge(wrong)["error"] == "invalid_token"

    # The admin token keeps working beside OAuth.
    admin = await oauth.post(stack.token)
    assert admin.status_code == 200, admin.text


# --------------------------------------------------------------------------- validation


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged(header: dict[str, Any], claims: dict[str, Any], hmac_key: bytes | None = None) -> str:
    """An attacker's token, built by hand since no JOSE library will make one:
    `alg: none` (no signature), or HS256 keyed with the issuer's public key
    (the classic algorithm confusion; joserfc refuses such a key)."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    if hmac_key is None:
        return f"{signing_input}."
    mac = hmac.new(hmac_key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(mac)}"


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def bad_token(case: str, server: OAuthServer, aud: str) -> str:
    now = int(time.time())
    valid_claims = {"iss": server.issuer, "sub": USER, "aud": aud, "exp": now + 600}
    kid = server.current_key.kid
    match case:
        case "wrong-audience":
            return server.mint(aud="http://127.0.0.1:1/mcp")
        case "no-audience":
            return server.mint()
        case "wrong-issuer":
            return server.mint(aud=aud, iss=f"{server.origin}/other")
        case "expired":
            return server.mint(aud=aud, iat=now - 1200, exp=now - 600)
        case "not-yet-valid":
            return server.mint(aud=aud, nbf=now + 600)
        case "bad-signature":  # the issuer's kid, another key
            return server.mint(aud=aud, key=RSAKey.generate_key(2048, parameters={"kid": kid}))
        case "unknown-key":
            return server.mint(aud=aud, key=RSAKey.generate_key(2048), header={"kid": "not-published"})
        case "alg-none":
            return forged({"alg": "none", "typ": "at+jwt"}, valid_claims)
        case "hs256-keyed-with-the-public-key":
            public_pem = server.current_key.as_pem(private=False)
            return forged({"alg": "HS256", "typ": "at+jwt", "kid": kid}, valid_claims, public_pem)
        case "no-subject":
            return server.mint(aud=aud, sub=None)
        case "id-token":  # RFC 9068 §4: an ID token is no access token, whatever its aud
            return server.id_token(aud)
        case "id-token-without-typ":
            return server.id_token(aud, typ=None)
        case "typ-jwt":  # an access token's claims, but not typed as one
            return server.mint(aud=aud, header={"typ": "JWT"})
    raise AssertionError(case)


BAD_TOKENS = [
    "wrong-audience", "no-audience", "wrong-issuer", "expired", "not-yet-valid", "bad-signature",
    "unknown-key", "alg-none", "hs256-keyed-with-the-public-key", "no-subject", "id-token",
    "id-token-without-typ", "typ-jwt",
]  # fmt: skip


async def test_a_token_of_the_issuer_for_this_resource_passes_on_mcp_only(oauth: OAuthApi) -> None:
    token = oauth.server.mint(aud=oauth.resource)
    r = await oauth.post(token)
    assert r.status_code == 200, r.text[:200]
    # RFC 9068's media type in full, in any case, is an access token's typ too.
    for typ in ("application/at+jwt", "AT+JWT"):
        r = await oauth.post(oauth.server.mint(aud=oauth.resource, header={"typ": typ}))
        assert r.status_code == 200, (typ, r.text[:200])
    # /metrics stays the operator's (auth::require_admin): an access token is refused.
    async with httpx2.AsyncClient(timeout=10) as http:
        r = await http.get(f"{oauth.api.base_url}/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 403, r.text[:200]


@pytest.mark.parametrize("case", BAD_TOKENS)
async def test_a_bad_token_is_refused(oauth: OAuthApi, case: str) -> None:
    r = await oauth.post(bad_token(case, oauth.server, oauth.resource))
    assert r.status_code == 401, f"{case}: HTTP {r.status_code} {r.text[:200]}"
    params = challenge(r)
    assert params.get("error") == "invalid_token", r.headers
    assert params["resource_metadata"] == oauth.metadata_url
    if case.startswith("id-token") or case == "typ-jwt":
        assert "not a JWT access token" in params["error_description"], params


async def test_with_the_typ_check_off_a_plain_jwt_passes(lenient: OAuthApi) -> None:
    """OAUTH_REQUIRE_AT_JWT=false, for issuers that type their access tokens
    `JWT` or not at all: such tokens pass, and so, then, does an ID token of
    the issuer whose `aud` is this server (which the check is there to refuse)."""
    key = first_key(lenient)
    for token in (
        lenient.server.mint(aud=lenient.resource, key=key, header={"typ": "JWT"}),
        lenient.server.mint(aud=lenient.resource, key=key, header={"typ": None}),
        lenient.server.id_token(lenient.resource, key=key),
    ):
        r = await lenient.post(token)
        assert r.status_code == 200, (claims_of(f"x.{token.split('.')[0]}"), r.text[:200])
    # The rest of the checks still hold.
    r = await lenient.post(lenient.server.mint(aud="http://127.0.0.1:1/mcp", key=key, header={"typ": "JWT"}))
    assert r.status_code == 401, r.text[:200]


async def test_a_key_rotation_at_the_issuer_is_picked_up(oauth: OAuthApi) -> None:
    server = oauth.server
    before = server.mint(aud=oauth.resource)
    r = await oauth.post(before)
    assert r.status_code == 200, r.text  # the api holds the current key set
    kid = server.rotate()
    after = server.mint(aud=oauth.resource)
    assert claims_of(f"x.{after.split('.')[0]}")["kid"] == kid  # the header, decoded as claims are
    # The new kid makes the api fetch the keys again, at most every 5 s: the
    # first tries may fall inside that gap.
    deadline = time.monotonic() + 20
    while True:
        r = await oauth.post(after)
        if r.status_code == 200:
            break
        assert r.status_code == 401, r.text
        assert time.monotonic() < deadline, "a token signed with the rotated-in key was never accepted"
        await anyio.sleep(0.5)
    # The old key is still published, so its tokens still pass.
    assert (await oauth.post(before)).status_code == 200


# --------------------------------------------------------------------------- the SDK's own flow


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@contextlib.asynccontextmanager
async def oauth_client(oauth: OAuthApi, statuses: list[int]) -> AsyncIterator[tuple[Client, MemoryStorage]]:
    """The SDK's OAuthClientProvider on its own: it finds the metadata from the
    401, registers, sends the user to /authorize (the handler follows the URL,
    as a browser would; the server approves at once) and exchanges the code."""
    redirect = "http://127.0.0.1:9/callback"  # never contacted: the handler reads the Location
    landed: dict[str, str] = {}

    async def redirect_handler(url: str) -> None:
        async with httpx2.AsyncClient(timeout=10, follow_redirects=False) as http:
            r = await http.get(url)
        assert r.status_code == 302, r.text
        location = r.headers["location"]
        assert location.startswith(redirect), location
        landed.update({k: v[0] for k, v in parse_qs(urlsplit(location).query).items()})

    async def callback_handler() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=landed["code"], state=landed.get("state"), iss=landed.get("iss"))

    storage = MemoryStorage()
    provider = OAuthClientProvider(
        server_url=oauth.api.mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="script-runner tests",
            redirect_uris=[redirect],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            scope=" ".join(SCOPES),
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )

    async def record(response: httpx2.Response) -> None:
        if response.request.url.path == "/mcp":
            statuses.append(response.status_code)

    timeout = httpx2.Timeout(30.0, read=60.0)
    async with httpx2.AsyncClient(auth=provider, timeout=timeout, event_hooks={"response": [record]}) as http:
        async with Client(streamable_http_client(oauth.api.mcp_url, http_client=http)) as client:
            yield client, storage


async def test_the_sdk_oauth_client_completes_the_flow_and_runs_a_task(stack: Stack, oauth: OAuthApi) -> None:
    statuses: list[int] = []
    async with oauth_client(oauth, statuses) as (client, storage):
        queued = await run(client, "python3.13", "echo hello from oauth")
        status = await wait_for(client, queued["task_id"])
        assert status["state"] == "succeeded", status
        assert "hello from oauth" in status["stdout_tail"]
        await call_ok(client, "list_tasks", {})
    assert statuses[0] == 401 and statuses[-1] == 200, statuses
    # The token's subject owns the task.
    assert stack.redis.hget(stack.keys.task(queued["task_id"]), "owner") == f"oauth:{USER}"
    assert storage.tokens is not None
    token = storage.tokens.access_token
    oauth.presented.append(token)
    claims = claims_of(token)
    # The SDK asked for this server as the resource (RFC 8707), and the token is bound to it.
    assert claims["aud"] == oauth.resource, claims
    assert claims["iss"] == oauth.server.issuer
    # Authlib's token endpoint types its tokens as RFC 9068 asks, which the api
    # requires by default (OAUTH_REQUIRE_AT_JWT).
    assert claims_of(f"x.{token.split('.')[0]}")["typ"] == "at+jwt"


async def test_an_access_token_without_run_can_watch_but_not_run(oauth: OAuthApi) -> None:
    token = oauth.server.mint(aud=oauth.resource, sub="watcher", scope="read openid")
    body = {
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_script", "arguments": {"runtime": "python3.13", "command_base64": "dHJ1ZQ=="}},
    }  # fmt: skip
    r = await oauth.post(token, body)
    assert r.status_code == 200, r.text[:200]
    result = r.json()["result"]
    assert result["isError"] and result["structuredContent"]["code"] == "missing_scope", result
    body["params"] = {"name": "list_tasks", "arguments": {}}
    r = await oauth.post(token, body)
    assert not r.json()["result"]["isError"], r.text[:300]


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


RUN_TRUE = tool_call("run_script", {"runtime": "python3.13", "command_base64": "dHJ1ZQ=="})


async def test_a_token_without_a_scope_claim_can_do_nothing(oauth: OAuthApi) -> None:
    """No `scope` (nor `scp`) claim is no scope (OAUTH_DEFAULT_SCOPES is empty
    by default), not every scope: the token is valid, and each tool call is
    refused naming the scope it lacks."""
    token = oauth.server.mint(aud=oauth.resource, sub="no-claim", scope=None)
    assert "scope" not in claims_of(token) and "scp" not in claims_of(token)
    r = await oauth.post(token)  # tools/list needs no scope
    assert r.status_code == 200, r.text[:200]
    for body, scope in ((RUN_TRUE, "run"), (tool_call("list_tasks", {}), "read")):
        r = await oauth.post(token, body)
        assert r.status_code == 200, r.text[:200]
        result = r.json()["result"]
        assert result["isError"] and result["structuredContent"]["code"] == "missing_scope", result
        text = result["content"][0]["text"]
        assert f"lacks the {scope} scope" in text and "has: none" in text, text
        assert "access token" in text and "OAUTH_DEFAULT_SCOPES" in text, text


async def test_oauth_default_scopes_is_what_a_token_without_a_claim_may_do(lenient: OAuthApi) -> None:
    token = lenient.server.mint(aud=lenient.resource, key=first_key(lenient), sub="no-claim-lenient", scope=None)
    r = await lenient.post(token, tool_call("list_tasks", {}))
    assert not r.json()["result"]["isError"], r.text[:300]
    r = await lenient.post(token, RUN_TRUE)
    result = r.json()["result"]
    assert result["isError"] and result["structuredContent"]["code"] == "missing_scope", result
    assert "lacks the run scope" in result["content"][0]["text"], result


# --------------------------------------------------------------------------- no token in the logs


async def test_no_token_appears_in_the_api_log_or_in_redis(stack: Stack, oauth: OAuthApi, lenient: OAuthApi) -> None:
    """Runs last in this module: every token sent above (accepted or refused),
    and those the issuer handed out, must be absent from the replicas' logs and
    from every key and value in Redis (tasks ran with them above)."""
    tokens = set(oauth.presented) | set(oauth.server.tokens_issued)
    assert len(tokens) >= 10, "the tests above should have sent tokens"
    logs = [replica.api.proc.log_path.read_text(errors="replace") for replica in (oauth, lenient)]
    assert "refused an OAuth access token" in logs[0], "the debug log should say why tokens were refused"
    log = "\n".join(logs)
    stored = "\n".join(every_value(stack))
    assert "oauth:" in stored, "the scan reads the tasks the tokens' owners ran"
    for token in tokens:
        for piece in [token, *token.split(".")[1:2]]:  # the whole token, and its claims part alone
            assert piece not in log, "a token (or its claims) appears in the api's log"
            assert piece not in stored, "a token (or its claims) is kept in Redis"

