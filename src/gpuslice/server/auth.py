"""The bearer token: one secret per state directory, created at the first start, readable by its owner only.

Every state-changing call (submit, cancel, tenant quotas) must carry ``Authorization: Bearer <token>``,
and so does every read but /v1/health and /metrics unless the server runs with ``--public-reads``
(guard.py applies both, and the dashboard's read-only cookie).
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from gpuslice.errors import InvalidRequest
from gpuslice.server.errors import NotAuthenticated

__all__ = ["TOKEN_FILE", "check_bearer", "load_or_create_token", "read_token"]

TOKEN_FILE = "token"
_TOKEN_BYTES = 32  # 256 bits, as urlsafe base64 (43 characters)


def load_or_create_token(state_dir: Path) -> str:
    """The token in ``state_dir/token``; created with mode 0600 (never wider, even for an instant)."""
    path = Path(state_dir) / TOKEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_token(state_dir)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(_TOKEN_BYTES) + "\n")
    return read_token(state_dir)


def read_token(state_dir: Path) -> str:
    """The token of an existing state directory; refuses a file others can read."""
    path = Path(state_dir) / TOKEN_FILE
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InvalidRequest(
            f"no token at {path}: start the server with `gpuslice serve --state-dir {state_dir}` "
            "or set GPUSLICE_TOKEN"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidRequest(f"token file {path} is readable by others; run `chmod 600 {path}`")
    token = path.read_text().strip()
    if not token:
        raise InvalidRequest(f"token file {path} is empty; delete it and restart the server")
    return token


def check_bearer(authorization: str | None, token: str) -> None:
    """Raise NotAuthenticated unless ``authorization`` is ``Bearer <token>`` (constant-time compare)."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise NotAuthenticated(
            "this call changes state and needs 'Authorization: Bearer <token>'; the token is in "
            "the server's state directory (file 'token') or GPUSLICE_TOKEN"
        )
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise NotAuthenticated("wrong bearer token; read it again from the server's state directory")
