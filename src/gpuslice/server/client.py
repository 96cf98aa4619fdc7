"""A small httpx client for ``gpuslice serve``, used by the CLI and the benchmarks.

Finds the server through ``url`` / ``GPUSLICE_URL``, else the URL the server wrote into its state
directory (server/url_file.py), else http://127.0.0.1:8787; and the token through ``GPUSLICE_TOKEN`` or
the state directory (``state_dir`` / ``GPUSLICE_STATE_DIR`` / the default one).
An error answer becomes a UserError carrying the server's one-line ``detail``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gpuslice.errors import InternalError, UserError
from gpuslice.server.auth import TOKEN_FILE, read_token
from gpuslice.server.errors import ServerUnavailable
from gpuslice.server.url_file import read_url

__all__ = ["DEFAULT_PORT", "DEFAULT_URL", "ServeClient", "ServerError", "default_state_dir"]

DEFAULT_PORT = 8787
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
_RETRY_SECONDS = 1.0


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
        self._token = token or os.environ.get("GPUSLICE_TOKEN") or None
        # ``http``: an httpx.Client to use instead (tests pass one bound to the app in-process).
        self._owns_http = http is None
        self._http = http or httpx.Client(base_url=self.url, timeout=timeout)

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
            if not (self.state_dir / TOKEN_FILE).exists():
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

    def _send(self, method: str, path: str, *, auth: bool = False, **kw: Any) -> Any:
        if auth:
            headers = {"Authorization": f"Bearer {self.token}"}
        else:
            headers = self._read_headers() if path != "/v1/health" else {}
        if "idempotency_key" in kw:
            headers["Idempotency-Key"] = kw.pop("idempotency_key")
        try:
            response = self._http.request(method, path, headers=headers, **kw)
        except httpx.TransportError as err:
            unavailable = self._unavailable(err)
            unavailable.transport_error = err  # submit() tells a refused connection from a lost answer
            raise unavailable from None
        return _answer(response)

    def _unavailable(self, err: Exception) -> ServerUnavailable:
        return ServerUnavailable(
            f"no gpuslice server at {self.url} ({type(err).__name__}; the URL {self._url_origin}); start "
            "one with `gpuslice serve` (add --simulate dgx-h100 on a machine without GPUs), or point at "
            "a running one with --state-dir / GPUSLICE_STATE_DIR (its state dir) or --url / GPUSLICE_URL"
        )

    def health(self) -> dict[str, Any]:
        return self._send("GET", "/v1/health")

    def submit(
        self, body: dict[str, Any], idempotency_key: str | None = None, *, retries: int = 0
    ) -> dict[str, Any]:
        """Submit a job. With ``idempotency_key``, a submit whose answer was lost (sent, then the
        connection broke: the server crashed) is sent again up to ``retries`` times, 1 s apart: the
        server returns the job the first try made, if it made one, so a retry never makes a second job.
        No server at all (connection refused at the first try) is an error at once."""
        if idempotency_key is None:
            return self._send("POST", "/v1/jobs", auth=True, json=body)
        lost = False
        for attempt in range(retries + 1):
            try:
                return self._send("POST", "/v1/jobs", auth=True, json=body, idempotency_key=idempotency_key)
            except ServerUnavailable as err:
                lost = lost or not isinstance(getattr(err, "transport_error", None), httpx.ConnectError)
                if not lost or attempt == retries:
                    raise
                time.sleep(_RETRY_SECONDS)
        raise AssertionError("unreachable")

    def jobs(self, states: list[str] | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/jobs", params={"state": states or [], "limit": limit})

    def job(self, job_id: str) -> dict[str, Any]:
        return self._send("GET", _job_path(job_id))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._send("POST", f"{_job_path(job_id)}/cancel", auth=True)

    def gpus(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/gpus")

    def set_gpu_health(self, index: int, healthy: bool, reason: str = "") -> dict[str, Any]:
        body = {"healthy": healthy, "reason": reason}
        return self._send("POST", f"/v1/gpus/{index}/health", auth=True, json=body)

    def queue(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/queue")

    def tenants(self) -> list[dict[str, Any]]:
        return self._send("GET", "/v1/tenants")

    def tenant(self, name: str) -> dict[str, Any]:
        return self._send("GET", f"/v1/tenants/{quote(name, safe='')}")

    def put_tenant(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._send("PUT", f"/v1/tenants/{quote(name, safe='')}", auth=True, json=body)

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

    def load_policy(self, filename: str, source: str) -> dict[str, Any]:
        """The server verifies ``source`` itself; a rejection is a ServerError listing the violations."""
        return self._send("POST", "/v1/policies", auth=True, json={"filename": filename, "source": source})

    def unload_policy(self, family: str) -> dict[str, Any]:
        return self._send("DELETE", f"/v1/policies/{quote(family, safe='')}", auth=True)

    def policy_map(self, family: str, name: str) -> dict[str, Any]:
        return self._send("GET", _map_path(family, name))

    def policy_map_get(self, family: str, name: str, key: str) -> dict[str, Any]:
        return self._send("GET", f"{_map_path(family, name)}/{quote(key, safe='')}")

    def policy_map_update(self, family: str, name: str, key: str, value: str) -> dict[str, Any]:
        path = f"{_map_path(family, name)}/{quote(key, safe='')}"
        return self._send("PUT", path, auth=True, json={"value": value})

    def policy_map_delete(self, family: str, name: str, key: str) -> dict[str, Any]:
        return self._send("DELETE", f"{_map_path(family, name)}/{quote(key, safe='')}", auth=True)

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
            raise self._unavailable(err) from None


def _job_path(job_id: str) -> str:
    """The job's URL path: whatever the id holds ('/', spaces, control characters) stays one segment."""
    return f"/v1/jobs/{quote(job_id, safe='')}"


def _map_path(family: str, name: str) -> str:
    return f"/v1/policies/{quote(family, safe='')}/maps/{quote(name, safe='')}"


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
