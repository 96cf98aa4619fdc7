"""The API's front door, before any route: Host, token, body size, and the dashboard's sign-in.

```text
every request   Host not one of the server's own names (and not in --allow-host)  -> 400 HostNotAllowed
                (and so is a request with two Host headers, whichever comes last)
GET /?token=T   T the one-time sign-in token printed by `serve` (or the API token) -> 303 to / with a
                read-only cookie (HttpOnly, SameSite=Strict); a wrong T -> 401
writes          POST/PUT/PATCH/DELETE need ``Authorization: Bearer <token>``, checked *before* the body
                is read -> 401 (no bearer: "needs 'Authorization: Bearer <token>'"; a wrong one, or none
                on the server now: "token rejected"); a body over the cap -> 413, never buffered past it
reads           GET /v1/* (except /v1/health) need the bearer or the dashboard cookie -> 401, unless the
                server runs with --public-reads; /metrics, /v1/health, the schema and the dashboard's
                static files stay open (they hold no job's data)
```

This is Jupyter's model: the token proves you are the server's user, the Host check stops DNS rebinding
(a page on evil.example that resolves to 127.0.0.1 arrives with ``Host: evil.example``), and the cookie
lets a browser read without ever holding the write token. The cookie is an HMAC of the token, so it
survives a restart of the server and cannot be turned back into the token. The token is asked for at
each request (``token`` may be a function: auth.TokenFile's, re-read when the file changes), so a
replaced token, and every cookie made from it, is refused from then on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from gpuslice.server.auth import NEEDS_BEARER, bearer_problem

__all__ = ["MAX_BODY_BYTES", "Guard", "cookie_value", "host_name", "new_sign_in_token"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The largest body any route takes: a policy file of 1,000,000 characters sent as JSON with \uXXXX
# escapes is at most ~6 MB. Submits are bounded far lower by their own limits (models.py).
MAX_BODY_BYTES = 8 * 1024 * 1024
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_OPEN_READS = frozenset({"/v1/health"})
_SIGN_IN_PATHS = frozenset({"/", "/dashboard"})
_READ_HINT = (
    "reading jobs needs the token: send 'Authorization: Bearer <token>' (the file 'token' in the server's "
    "state directory, or GPUSLICE_TOKEN), or open the dashboard URL that `gpuslice serve` printed"
)


def cookie_value(token: str) -> str:
    """The dashboard cookie for ``token``: proves the token was shown once, does not reveal it."""
    return hmac.new(token.encode(), b"gpuslice dashboard read", hashlib.sha256).hexdigest()


def host_name(header: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower case: "[::1]:8787" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    name, sep, port = header.rpartition(":")
    return name if sep and port.isdigit() and ":" not in name else header


class Guard:
    """ASGI middleware applying the rules in the module docstring to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | Callable[[], str | None],
        sign_in_token: str,
        hosts: Iterable[str] | None,
        public_reads: bool = False,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.app = app
        self._token = token if callable(token) else lambda: token
        self._cookies: dict[str, bytes] = {}  # token -> its cookie (one HMAC per token, not per request)
        self._sign_in: bytes | None = sign_in_token.encode()  # one use, then None
        self.hosts = None if hosts is None else frozenset(h.lower() for h in hosts)
        self.public_reads = public_reads
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        if sum(k.lower() == b"host" for k, _ in scope["headers"]) > 1:  # which one would a proxy believe?
            await _error(send, 400, "HostNotAllowed", "the request has more than one Host header; send one")
            return
        if self.hosts is not None and "*" not in self.hosts:
            host = host_name(headers.get("host", ""))
            if host not in self.hosts:
                why = f"Host {host[:100]!r} is not a name of this server; behind a proxy or under another "
                await _error(send, 400, "HostNotAllowed", why + "name, start it with --allow-host NAME")
                return
        authorization = headers.get("authorization", "")
        problem = bearer_problem(authorization, self._token())
        bearer = problem is None
        if method in _SAFE_METHODS:
            if path in _SIGN_IN_PATHS and scope.get("query_string"):
                given = parse_qs(scope["query_string"].decode("latin-1")).get("token")
                if given:
                    await self._sign_in_with(given[0], scope, send)
                    return
            if self._read_needs_token(path) and not (bearer or self._has_cookie(scope, headers)):
                why = _READ_HINT if problem == NEEDS_BEARER else problem  # a wrong bearer is told so
                await _error(send, 401, "NotAuthenticated", why, {"WWW-Authenticate": "Bearer"})
                return
            await self.app(scope, receive, send)
            return
        if problem is not None:
            await _error(send, 401, "NotAuthenticated", problem, {"WWW-Authenticate": "Bearer"})
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await self._too_large(send)
            return
        body = bytearray()
        more = True
        while more:  # read to the cap, never past it; a chunked body has no length to check first
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                await self._too_large(send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _cookie(self) -> bytes | None:
        """The cookie of the current token; None while the server has no token."""
        token = self._token()
        if token is None:
            return None
        if token not in self._cookies:
            self._cookies = {token: cookie_value(token).encode()}  # the old token's cookie is forgotten
        return self._cookies[token]

    def _read_needs_token(self, path: str) -> bool:
        return not self.public_reads and path.startswith("/v1/") and path not in _OPEN_READS

    def _cookie_name(self, scope: Scope) -> str:
        # Cookies are per host, not per port: two servers on one machine must not overwrite each other's.
        server = scope.get("server") or ("", 0)
        return f"gpuslice_{server[1]}"

    def _has_cookie(self, scope: Scope, headers: dict[str, str]) -> bool:
        wanted, cookie = self._cookie_name(scope), self._cookie()
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if cookie is not None and name == wanted and hmac.compare_digest(value.encode(), cookie):
                return True
        return False

    async def _sign_in_with(self, given: str, scope: Scope, send: Send) -> None:
        candidate, token, cookie = given.encode(), self._token(), self._cookie()
        one_time = self._sign_in is not None and hmac.compare_digest(candidate, self._sign_in)
        right = token is not None and (one_time or hmac.compare_digest(candidate, token.encode()))
        if not right or cookie is None:
            why = (
                "this sign-in link is used up or wrong; open the dashboard URL that `gpuslice serve` printed"
            )
            await _error(send, 401, "NotAuthenticated", why + ", or pass ?token=<the token file>")
            return
        if one_time:
            self._sign_in = None
        cookie = f"{self._cookie_name(scope)}={cookie.decode()}; Path=/; HttpOnly; SameSite=Strict"
        await send({"type": "http.response.start", "status": 303, "headers": [
            (b"location", scope["path"].encode()), (b"set-cookie", cookie.encode()),
            (b"cache-control", b"no-store"), (b"referrer-policy", b"no-referrer"), (b"content-length", b"0"),
        ]})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})

    async def _too_large(self, send: Send) -> None:
        await _error(send, 413, "BodyTooLarge", f"the request body is over {self.max_body_bytes} bytes")


async def _error(
    send: Send, status: int, kind: str, detail: str, headers: dict[str, str] | None = None
) -> None:
    """An ``ErrorBody`` answer (the API's one error format), sent before any route runs."""
    body = json.dumps({"detail": detail, "field": None, "type": kind}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if status == 413:
        raw.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def new_sign_in_token() -> str:
    """A fresh one-time sign-in token for the dashboard URL."""
    return secrets.token_urlsafe(24)
