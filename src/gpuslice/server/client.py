"""A small httpx client for ``gpuslice serve``, used by the CLI and the benchmarks.

Finds the server through ``url`` / ``GPUSLICE_URL``, else the URL the server wrote into its state
directory (server/url_file.py), else http://127.0.0.1:8787; and the token through ``GPUSLICE_TOKEN`` or
the state directory (``state_dir`` / ``GPUSLICE_STATE_DIR`` / the default one).
An error answer becomes a UserError carrying the server's one-line ``detail``.

A request that fails in transport is told apart by whether it reached a server (``_transport_failed``,
the one place that decides): refused, or no connection within the connect timeout, is ServerUnavailable
("no gpuslice server at …"); a connection that took the request but gave no answer (a read timeout, a
reset, a close) is OutcomeUnknown for a request that changes state (it was sent; the server may still
apply it; the message names the command that shows what happened; exit 4), and ServerUnavailable saying
the server is there but did not answer for a read.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gpuslice.errors import InternalError, UserError
from gpuslice.inputs import file_kind
from gpuslice.server.auth import TOKEN_FILE, read_token
from gpuslice.server.errors import OutcomeUnknown, ServerUnavailable
from gpuslice.server.url_file import read_url

__all__ = ["DEFAULT_PORT", "DEFAULT_URL", "MAX_PAGE", "ServeClient", "ServerError", "default_state_dir"]

DEFAULT_PORT = 8787
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
MAX_PAGE = 10_000  # the most rows one list call (GET /v1/jobs, /v1/events) returns: the server's limit
_RETRY_SECONDS = 1.0
_CONNECT_SECONDS = 5.0  # the least time given to open the connection, however short the wait for the answer
# Transport errors after the connection was open: the request (or part of it) went to a server.
_AFTER_CONNECT = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.ReadError, httpx.WriteError,
                  httpx.RemoteProtocolError)  # fmt: skip
_READS = ("GET", "HEAD")
_TOKEN_TEXT = re.compile(r"[A-Za-z0-9._~+/-]+=*")  # what a bearer token may hold (RFC 6750's b64token)


class ServerError(UserError):
    """The server refused a request (4xx); the message is its ``detail``."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.field = field


def default_state_dir() -> Path:
    """``$GPUSLICE_STATE_DIR``, else ``$XDG_DATA_HOME/gpuslice``, else ``~/.local/share/gpuslice``."""
    if os.environ.get("GPUSLICE_STATE_DIR"):
        return Path(os.environ["GPUSLICE_STATE_DIR"]).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser() / "gpuslice"


class ServeClient:
    """One server. ``token`` is looked up lazily and sent with every call but health; a server started
    with --public-reads answers reads without one, so a read goes without when none can be found."""

    def __init__(
        self,
        url: str | None = None,
        state_dir: Path | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        written = read_url(self.state_dir)  # where the server of that state dir said it listens
        self.url = (url or os.environ.get("GPUSLICE_URL") or written or DEFAULT_URL).rstrip("/")
        # Where each came from, for the errors: a user who gets discovery wrong is told what was used.
        self._state_dir_origin = (
            "given with --state-dir" if state_dir
            else "from GPUSLICE_STATE_DIR" if os.environ.get("GPUSLICE_STATE_DIR")
            else "the default"
        )  # fmt: skip
        self._url_origin = (
            "given with --url" if url
            else "from GPUSLICE_URL" if os.environ.get("GPUSLICE_URL")
            else f"written by the server in {self.state_dir}" if written
            else f"the default: no server wrote its URL in {self.state_dir}"
        )  # fmt: skip
        _check_url(self.url, self._url_origin)
        self._token = token or os.environ.get("GPUSLICE_TOKEN") or None
        if self._token is not None and not _TOKEN_TEXT.fullmatch(self._token):
            # Sent as is, a space or a non-ASCII letter breaks the request before it leaves (a traceback,
            # or "no server"); the token itself is never echoed.
            where = "the token given" if token else "GPUSLICE_TOKEN"
            raise UserError(
                f"{where} is not a gpuslice token (it holds white space or characters a token never has): "
                "copy it from the file 'token' in the server's state directory"
            )
        # ``http``: an httpx.Client to use instead (tests pass one bound to the app in-process).
        self._owns_http = http is None
        self.timeout = timeout
        self._http = http or httpx.Client(base_url=self.url, timeout=_timeouts(timeout))

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> ServeClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def token(self) -> str:
        if self._token is None:
            if file_kind(self.state_dir / TOKEN_FILE) == "missing":  # a name too long to look up too
                raise UserError(
                    f"no token in {self.state_dir} (the state dir {self._state_dir_origin}): point at the "
                    "one `gpuslice serve` printed with --state-dir DIR or GPUSLICE_STATE_DIR=DIR, or set "
                    "GPUSLICE_TOKEN"
                )
            self._token = read_token(self.state_dir)
        return self._token

    def _read_headers(self) -> dict[str, str]:
        """The token for a read, when there is one to send (else the server says what is missing)."""
        try:
            return {"Authorization": f"Bearer {self.token}"}
        except UserError:
            return {}

    def _send(
        self,
        method: str,
        path: str,
        *,
        auth: bool = False,
        wait: float | None = None,
        see: str | None = None,
        **kw: Any,
    ) -> Any:
        """One request. ``wait``: seconds to wait for its answer (default: the client's timeout; an
        ``http`` client given to the constructor keeps its own); ``see``: the gpuslice command that shows
        whether a change was applied, for when its answer never comes."""
        if wait is not None and self._owns_http:
            kw["timeout"] = _timeouts(wait)
        if auth:
            headers = {"Authorization": f"Bearer {self.token}"}
        else:
            headers = self._read_headers() if path != "/v1/health" else {}
        if "idempotency_key" in kw:
            headers["Idempotency-Key"] = kw.pop("idempotency_key")
        try:
            response = self._http.request(method, path, headers=headers, **kw)
        except httpx.TransportError as err:
            raise self._transport_failed(method, path, err, wait, see) from None
        return _answer(response)

    def _transport_failed(
        self, method: str, path: str, err: httpx.TransportError, wait: float | None, see: str | None
    ) -> ServerUnavailable | OutcomeUnknown:
        """What a failed request tells the user: no server only when none took the connection."""
        if not isinstance(err, _AFTER_CONNECT):
            return self._unavailable(err)
        waited = wait if wait is not None and self._owns_http else self.timeout
        what = (
            f"no answer came within {waited:g} s" if isinstance(err, httpx.TimeoutException)
            else f"the connection broke before the answer ({type(err).__name__})"
        )  # fmt: skip
        if method in _READS:
            return ServerUnavailable(
                f"the gpuslice server at {self.url} took the connection, but {what} to {method} {path}; "
                "it may be busy: try again"
            )
        check = f"`{see}{self._where()}`" if see else "the server's state"
        return OutcomeUnknown(
            f"the request was sent to the gpuslice server at {self.url} ({method} {path}), but {what}: "
            f"the server may still apply it, so the outcome is unknown; check with {check} before "
            "trying again"
        )

    def _where(self) -> str:
        """The options a follow-up command needs to reach the same server, as the user gave them."""
        where = ""
        if self._state_dir_origin == "given with --state-dir":
            where += f" --state-dir {shlex.quote(str(self.state_dir))}"
        if self._url_origin == "given with --url":
            where += f" --url {shlex.quote(self.url)}"
        return where

    def _unavailable(self, err: Exception) -> ServerUnavailable:
        if self._url_origin.startswith("the default"):  # nothing was named: most likely none was started
            return ServerUnavailable(
                "no gpuslice server is running here: start one with `gpuslice serve` (or give --url)"
            )
        return ServerUnavailable(
            f"no gpuslice server at {self.url} (the URL {self._url_origin}): start one with "
            "`gpuslice serve`, or point at a running one with --url or --state-dir"
        )

    def health(self) -> dict[str, Any]:
        return self._send("GET", "/v1/health")

    def submit(
        self, body: dict[str, Any], idempotency_key: str | None = None, *, retries: int = 0
    ) -> dict[str, Any]:
        """Submit a job. With ``idempotency_key``, a submit whose answer was lost (sent, then the
        connection broke: the server crashed) is sent again up to ``retries`` times, 1 s apart: the
        server returns the job the first try made, if it made one, so a retry never makes a second job.
        No server at all (connection refused at the first try) is an error at once; once a try has reached
        the server, the last error is OutcomeUnknown, whatever the later tries met."""
        see = "gpuslice ps --all"
        if idempotency_key is None:
            return self._send("POST", "/v1/jobs", auth=True, json=body, see=see)
        lost: OutcomeUnknown | None = None
        for attempt in range(retries + 1):
            try:
                return self._send(
                    "POST", "/v1/jobs", auth=True, json=body, idempotency_key=idempotency_key, see=see
                )
            except (ServerUnavailable, OutcomeUnknown) as err:
                lost = err if isinstance(err, OutcomeUnknown) else lost
                if lost is None:
                    raise  # never reached a server: nothing was sent
                if attempt == retries:
                    raise lost from None  # sent once at least: whatever the last try met, unknown
                time.sleep(_RETRY_SECONDS)
        raise AssertionError("unreachable")

    def jobs(self, states: list[str] | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/jobs", params={"state": states or [], "limit": limit})

    def job(self, job_id: str) -> dict[str, Any]:
        return self._send("GET", _job_path(job_id))

    def cancel(self, job_id: str) -> dict[str, Any]:
        see = f"gpuslice show {shlex.quote(job_id)}"
        return self._send("POST", f"{_job_path(job_id)}/cancel", auth=True, see=see)

    def gpus(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/gpus")

    def set_gpu_health(self, index: int, healthy: bool, reason: str = "") -> dict[str, Any]:
        body = {"healthy": healthy, "reason": reason}
        return self._send("POST", f"/v1/gpus/{index}/health", auth=True, json=body, see="gpuslice gpus")

    def queue(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/queue")

    def tenants(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/tenants")

    def tenant(self, name: str) -> dict[str, Any]:
        return self._send("GET", f"/v1/tenants/{quote(name, safe='')}")

    def put_tenant(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        see = f"gpuslice tenants show {shlex.quote(name)}"
        return self._send("PUT", f"/v1/tenants/{quote(name, safe='')}", auth=True, json=body, see=see)

    def events(
        self, job_id: str | None = None, after: int = 0, kind: str | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"after": after, "limit": limit}
        if job_id is not None:
            params["job_id"] = job_id
        if kind is not None:
            params["kind"] = kind
        return self._send("GET", "/v1/events", params=params)

    # -- policies as programs ------------------------------------------------------------------------

    def policies(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/policies")

    def load_policy(self, filename: str, source: str, *, wait: float | None = None) -> dict[str, Any]:
        """The server verifies ``source`` itself; a rejection is a ServerError listing the violations."""
        body = {"filename": filename, "source": source}
        return self._send("POST", "/v1/policies", auth=True, json=body, wait=wait, see=_POLICY_LIST)

    def unload_policy(self, family: str, *, wait: float | None = None) -> dict[str, Any]:
        path = f"/v1/policies/{quote(family, safe='')}"
        return self._send("DELETE", path, auth=True, wait=wait, see=_POLICY_LIST)

    def policy_map(self, family: str, name: str) -> dict[str, Any]:
        return self._send("GET", _map_path(family, name))

    def policy_map_get(self, family: str, name: str, key: str) -> dict[str, Any]:
        return self._send("GET", f"{_map_path(family, name)}/{quote(key, safe='')}")

    def policy_map_update(
        self, family: str, name: str, key: str, value: str, *, wait: float | None = None
    ) -> dict[str, Any]:
        path = f"{_map_path(family, name)}/{quote(key, safe='')}"
        see = _map_get_command(family, name, key)
        return self._send("PUT", path, auth=True, json={"value": value}, wait=wait, see=see)

    def policy_map_delete(
        self, family: str, name: str, key: str, *, wait: float | None = None
    ) -> dict[str, Any]:
        path = f"{_map_path(family, name)}/{quote(key, safe='')}"
        return self._send("DELETE", path, auth=True, wait=wait, see=_map_get_command(family, name, key))

    def logs(self, job_id: str, follow: bool = False, stream: str = "both") -> Iterator[bytes]:
        """The job's output as it comes; with ``follow`` until the job ends."""
        params = {"follow": follow, "stream": stream}
        try:
            path = f"{_job_path(job_id)}/logs"
            headers = self._read_headers()
            with self._http.stream("GET", path, params=params, headers=headers, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    _answer(r)
                yield from r.iter_bytes()
        except httpx.TransportError as err:
            raise self._transport_failed("GET", path, err, None, None) from None


def _check_url(url: str, origin: str) -> None:
    """UserError naming ``url`` and where it came from unless it is an http(s) URL with a host and, if
    given, a TCP port: httpx raises its own InvalidURL for some (a line break, a bad port) and takes
    others (no scheme, ftp://, port 99999) only to fail at the connection, far from the mistake."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError, TypeError):
        parsed, port = None, None
    if (
        parsed is None
        or parsed.scheme not in ("http", "https")
        or not parsed.host
        or not (port is None or 0 < port < 65536)
    ):
        raise UserError(
            f"invalid server URL {url[:200]!r} (the URL {origin}): give http://HOST:PORT, e.g. {DEFAULT_URL}"
        )


def _job_path(job_id: str) -> str:
    """The job's URL path: whatever the id holds ('/', spaces, control characters) stays one segment."""
    return f"/v1/jobs/{quote(job_id, safe='')}"


def _map_path(family: str, name: str) -> str:
    return f"/v1/policies/{quote(family, safe='')}/maps/{quote(name, safe='')}"


_POLICY_LIST = "gpuslice policy list"  # shows whether a load or an unload took


def _map_get_command(family: str, name: str, key: str) -> str:
    """The command that shows one map entry as it is now (after an update or delete of unknown outcome)."""
    return f"gpuslice policy map get {shlex.quote(name)} {shlex.quote(key)} --family {shlex.quote(family)}"


def _timeouts(wait: float) -> httpx.Timeout:
    """``wait`` seconds for the answer (and to send the request); the connection itself gets at least
    _CONNECT_SECONDS, so that a short wait never reads a slow connect as no server."""
    return httpx.Timeout(wait, connect=max(wait, _CONNECT_SECONDS))


def _answer(response: httpx.Response) -> Any:
    if response.status_code < 400:
        return response.json()
    try:
        body = response.json()
        detail, field = str(body.get("detail")), body.get("field")
    except ValueError:
        detail, field = response.text.strip()[:500] or response.reason_phrase, None
    if response.status_code >= 500:
        raise InternalError(f"server error {response.status_code}: {detail}")
    raise ServerError(response.status_code, detail, field)
