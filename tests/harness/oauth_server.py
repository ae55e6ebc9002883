"""A real OAuth 2.1 authorization server for the tests, on Authlib (its Flask
integration) and joserfc, run in a thread of the test process.

What the MCP Python SDK's OAuth client needs, and what the api checks:
- RFC 8414 metadata at `/.well-known/oauth-authorization-server<issuer path>`
  (and OpenID discovery at `<issuer>/.well-known/openid-configuration`);
- RFC 7591 dynamic client registration (open: anyone may register);
- authorization code with PKCE (S256, required), approved at once for the one
  user (`alice`): `GET /authorize` answers the redirect with the code, so a
  test's redirect handler only has to follow the URL;
- the token endpoint: RFC 9068 JWT access tokens (header `typ: at+jwt`, which
  Authlib's generator writes) signed RS256 with the current key, `aud` the
  RFC 8707 `resource` the client asked for;
- the JWKS with the current key and the ones rotated out (as real issuers keep
  them published a while); `rotate()` makes a new current key with a new kid.

`mint(...)` signs tokens with chosen claims (wrong audience, expired, ...) for
the negative tests; the signing is joserfc's, the same as the token endpoint's.
Nothing here is hardened: it is a test fixture bound to 127.0.0.1.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2 import OAuth2Error
from authlib.oauth2.rfc6749 import grants
from authlib.oauth2.rfc6749.models import AuthorizationCodeMixin, ClientMixin
from authlib.oauth2.rfc7591 import ClientMetadataClaims, ClientRegistrationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from flask import Flask, jsonify, request
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from werkzeug.serving import WSGIRequestHandler, make_server

USER = "alice"
SCOPES = ("run", "read", "kill")


class _Quiet(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass
class Client(ClientMixin):
    client_id: str
    client_secret: str | None
    metadata: dict[str, Any]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        uris = self.metadata.get("redirect_uris") or []
        return uris[0] if uris else None

    def get_allowed_scope(self, scope: str | None) -> str:
        return " ".join(s for s in (scope or "").split() if s in SCOPES)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in (self.metadata.get("redirect_uris") or [])

    def check_client_secret(self, client_secret: str) -> bool:
        return self.client_secret is not None and secrets.compare_digest(client_secret, self.client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        if endpoint == "token":
            return method == self.metadata.get("token_endpoint_auth_method", "client_secret_basic")
        return True

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in (self.metadata.get("grant_types") or ["authorization_code"])


@dataclass
class AuthorizationCode(AuthorizationCodeMixin):
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    code_challenge: str | None
    code_challenge_method: str | None
    resource: str | None
    user: str
    created: float = field(default_factory=time.time)

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope


@dataclass
class User:
    name: str

    def get_user_id(self) -> str:
        return self.name


class OAuthServer:
    """The server on 127.0.0.1:<free port>; `issuer` has a path (`/oauth`), as
    most real issuers do (Keycloak's `/realms/<name>`), so path-aware discovery
    is what gets exercised."""

    def __init__(self, token_lifetime: int = 600) -> None:
        self.clients: dict[str, Client] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.keys: list[RSAKey] = []  # current last; rotated-out ones stay published
        self.lock = threading.Lock()
        self.rotate()
        self.app = Flask("oauth-test-server")
        self.server = make_server("127.0.0.1", 0, self.app, threaded=True, request_handler=_Quiet)
        self.port = self.server.server_port
        self.origin = f"http://127.0.0.1:{self.port}"
        self.issuer = f"{self.origin}/oauth"
        self.token_lifetime = token_lifetime
        self.tokens_issued: list[str] = []
        self._build()
        self.thread = threading.Thread(target=self.server.serve_forever, name="oauth-server", daemon=True)

    # -- keys

    @property
    def current_key(self) -> RSAKey:
        return self.keys[-1]

    def rotate(self) -> str:
        """A new signing key with a new kid; the old ones stay in the JWKS.
        Returns the new kid."""
        key = RSAKey.generate_key(2048, parameters={"kid": secrets.token_hex(8), "use": "sig", "alg": "RS256"})
        with self.lock:
            self.keys.append(key)
        return key.kid

    def jwks(self) -> dict[str, Any]:
        with self.lock:
            return {"keys": [k.as_dict(private=False) for k in self.keys]}

    def mint(self, *, key: RSAKey | None = None, header: dict[str, Any] | None = None, **claims: Any) -> str:
        """A token signed by joserfc with the current key (or `key`), with the
        header (`typ: at+jwt`) and claims the token endpoint would give `alice`
        for `aud`, overridden by `header` and `claims` (a value of None drops
        the header parameter or the claim)."""
        now = int(time.time())
        body: dict[str, Any] = {
            "iss": self.issuer,
            "sub": USER,
            "aud": claims.pop("aud", None),
            "iat": now,
            "exp": now + self.token_lifetime,
            "scope": " ".join(SCOPES),
            "client_id": "minted",
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        key = key or self.current_key
        head = {"alg": "RS256", "typ": "at+jwt", "kid": key.kid} | (header or {})
        head = {k: v for k, v in head.items() if v is not None}
        return jwt.encode(head, body, key)

    def id_token(self, aud: str, typ: str | None = "JWT", key: RSAKey | None = None) -> str:
        """An OpenID Connect ID token of this issuer for `alice`, as an issuer
        signs them (same keys as its access tokens), addressed to `aud`: what a
        client could present in place of an access token when its client id is
        the resource's URL, or the issuer puts it in `aud`."""
        return self.mint(
            key=key,
            header={"typ": typ},
            aud=aud,
            scope=None,
            client_id=None,
            azp="some-client",
            nonce=secrets.token_hex(8),
            auth_time=int(time.time()),
        )

    # -- the Flask app

    def _build(self) -> None:
        outer = self

        class TokenGenerator(JWTBearerTokenGenerator):
            def get_jwks(self) -> KeySet:
                return KeySet([outer.current_key])

            def get_audiences(self, client: Client, user: User | None, scope: str) -> str | list[str]:
                # RFC 8707: the resource the client asked for, at the token
                # request (or, failing that, at the authorization request).
                resource = request.form.get("resource") or getattr(request, "sr_code_resource", None)
                return resource or client.get_client_id()

            def access_token_generator(self, client: Client, grant_type: str, user: User | None, scope: str) -> str:
                token = super().access_token_generator(client, grant_type, user, scope)
                outer.tokens_issued.append(token)
                return token

        class CodeGrant(grants.AuthorizationCodeGrant):
            TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none"]

            def save_authorization_code(self, code: str, req: Any) -> AuthorizationCode:
                ac = AuthorizationCode(
                    code=code,
                    client_id=req.client.get_client_id(),
                    redirect_uri=req.payload.redirect_uri,
                    scope=req.payload.scope or "",
                    code_challenge=req.payload.data.get("code_challenge"),
                    code_challenge_method=req.payload.data.get("code_challenge_method"),
                    resource=req.payload.data.get("resource"),
                    user=req.user.name,
                )
                with outer.lock:
                    outer.codes[code] = ac
                return ac

            def query_authorization_code(self, code: str, client: Client) -> AuthorizationCode | None:
                with outer.lock:
                    ac = outer.codes.get(code)
                if ac and ac.client_id == client.get_client_id() and time.time() - ac.created < 60:
                    request.sr_code_resource = ac.resource  # type: ignore[attr-defined]
                    return ac
                return None

            def delete_authorization_code(self, authorization_code: AuthorizationCode) -> None:
                with outer.lock:
                    outer.codes.pop(authorization_code.code, None)

            def authenticate_user(self, authorization_code: AuthorizationCode) -> User:
                return User(authorization_code.user)

        server = AuthorizationServer(self.app, query_client=self.clients.get, save_token=lambda token, req: None)
        server.register_grant(CodeGrant, [CodeChallenge(required=True)])
        lifetime = lambda client, grant_type: self.token_lifetime  # noqa: E731
        server.register_token_generator("default", TokenGenerator(issuer=self.issuer, expires_generator=lifetime))

        def metadata() -> dict[str, Any]:
            return {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.issuer}/authorize",
                "token_endpoint": f"{self.issuer}/token",
                "registration_endpoint": f"{self.issuer}/register",
                "jwks_uri": f"{self.issuer}/jwks",
                "response_types_supported": ["code"],
                # refresh_token only so that registrations asking for it (the
                # SDK's do) pass; no refresh token is ever issued.
                "grant_types_supported": ["authorization_code", "refresh_token"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"],
                "scopes_supported": list(SCOPES),
            }

        class Registration(ClientRegistrationEndpoint):
            def authenticate_token(self, req: Any) -> bool:
                return True  # open registration, as MCP clients expect

            def resolve_public_key(self, req: Any) -> None:
                return None

            def get_server_metadata(self) -> dict[str, Any]:
                return metadata()

            def save_client(self, client_info: dict[str, Any], client_metadata: dict[str, Any], req: Any) -> Client:
                secret = client_info.get("client_secret")
                if client_metadata.get("token_endpoint_auth_method") == "none":
                    secret = None
                client = Client(client_info["client_id"], secret, client_metadata)
                with outer.lock:
                    outer.clients[client.client_id] = client
                return client

        server.register_endpoint(Registration(claims_classes=[ClientMetadataClaims]))
        path = urlsplit(self.issuer).path

        @self.app.get(f"/.well-known/oauth-authorization-server{path}")
        @self.app.get(f"{path}/.well-known/openid-configuration")
        def as_metadata() -> Any:
            return jsonify(metadata())

        @self.app.get(f"{path}/jwks")
        def jwks() -> Any:
            return jsonify(self.jwks())

        @self.app.post(f"{path}/register")
        def register() -> Any:
            return server.create_endpoint_response(ClientRegistrationEndpoint.ENDPOINT_NAME)

        @self.app.get(f"{path}/authorize")
        def authorize() -> Any:
            # Approved at once for the one user: no login page, no consent.
            user = User(USER)
            try:
                grant = server.get_consent_grant(end_user=user)
            except OAuth2Error as error:
                return server.handle_error_response(None, error)
            return server.create_authorization_response(grant_user=user, grant=grant)

        @self.app.post(f"{path}/token")
        def token() -> Any:
            return server.create_token_response()

    # -- life cycle

    def __enter__(self) -> OAuthServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)
