"""The bearer token: one secret per state directory, created at the first start, readable by its owner only.

Every state-changing call (submit, cancel, tenant quotas) must carry ``Authorization: Bearer <token>``,
and so does every read but /v1/health and /metrics unless the server runs with ``--public-reads``
(guard.py applies both, and the dashboard's read-only cookie).

The server reads the file again on SIGHUP and when it changes (``TokenFile.poll``: its inode, size or
mtime, looked at every ``POLL_SECONDS``): a replaced token takes effect within a second and the old one
is refused from then on, dashboard cookies made from it too. While the file is missing, or is not a
regular file of the server's user with mode 0600 (read without following a link), the server has no
token and refuses every call that needs one, until a good file is back. A call without a bearer is told
it needs one; a call with a wrong one is told "token rejected".
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import secrets
import stat
import threading
from pathlib import Path

from gpuslice.errors import InvalidRequest
from gpuslice.server.errors import NotAuthenticated

__all__ = [
    "POLL_SECONDS", "TOKEN_FILE", "TokenFile", "bearer_problem", "check_bearer", "load_or_create_token",
    "read_token",
]  # fmt: skip

_log = logging.getLogger("gpuslice.server")

TOKEN_FILE = "token"
_TOKEN_BYTES = 32  # 256 bits, as urlsafe base64 (43 characters)
_MAX_FILE_BYTES = 4096  # a token is 43 characters; a bigger file is not a token file
POLL_SECONDS = 0.5  # how often the server looks at the token file: a replaced token is refused within this
NEEDS_BEARER = (
    "this call needs 'Authorization: Bearer <token>'; the token is in the server's state directory "
    "(file 'token') or GPUSLICE_TOKEN"
)


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
    """The token of an existing state directory, read safely (``_read_token_file``)."""
    path = Path(state_dir) / TOKEN_FILE
    try:
        return _read_token_file(path)
    except FileNotFoundError:
        raise InvalidRequest(
            f"no token at {path}: start the server with `gpuslice serve --state-dir {state_dir}` "
            "or set GPUSLICE_TOKEN"
        ) from None


def _read_token_file(path: Path) -> str:
    """The token in ``path``: opened without following a link, and only from a regular file of this
    user that others cannot read or write; FileNotFoundError when there is none, InvalidRequest when it
    is unusable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise  # no file: the callers say what to do about it
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise InvalidRequest(f"token file {path} is a symbolic link; write the token into it") from None
        raise InvalidRequest(f"token file {path} cannot be read ({err.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InvalidRequest(f"token file {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise InvalidRequest(f"token file {path} belongs to user id {info.st_uid}, not to you")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InvalidRequest(f"token file {path} is readable by others; run `chmod 600 {path}`")
        data = f.read(_MAX_FILE_BYTES + 1)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        token = ""
    if len(data) > _MAX_FILE_BYTES or not token or any(c.isspace() for c in token):
        raise InvalidRequest(f"token file {path} does not hold one token; delete it and restart the server")
    return token


class TokenFile:
    """The server's token as its file holds it now; None while there is no usable file (every call that
    needs the token is then refused). ``reload`` reads it again (SIGHUP); ``start`` watches the file."""

    def __init__(self, state_dir: Path, poll_seconds: float = POLL_SECONDS) -> None:
        self.path = Path(state_dir) / TOKEN_FILE
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # the first read is the start, not a change worth a log line; ``problem``: why there is no token
        # now, for the refusal's message ("" while there is one)
        self._seen, self._current, self.problem = self._read()

    @property
    def current(self) -> str | None:
        return self._current

    def _read(self) -> tuple[tuple[int, ...] | None, str | None, str]:
        """The file's stamp (``_stamp``), then its token (None when there is no usable one) and why not."""
        seen = self._stamp()
        try:
            return seen, _read_token_file(self.path), ""
        except FileNotFoundError:
            return seen, None, f"the token file {self.path} is missing"
        except InvalidRequest as err:
            return seen, None, str(err)

    def reload(self) -> None:
        """Read the file now; a change is logged (never the token)."""
        self._seen, token, problem = self._read()
        if token != self._current or problem != self.problem:
            _log.warning("token: %s", problem or f"read again from {self.path}; the previous one is refused")
        self._current, self.problem = token, problem

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="gpuslice-token", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _stamp(self) -> tuple[int, ...] | None:
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return None
        return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_mode, info.st_uid)

    def poll(self) -> bool:
        """Read the file again if it changed since the last read (its inode, size, mtime, mode or owner,
        or a link put in its place); True when it did. The watcher started by ``start`` calls this."""
        if self._stamp() == self._seen:
            return False
        self.reload()
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            self.poll()


def bearer_problem(authorization: str | None, token: str | None) -> str | None:
    """Why ``authorization`` does not carry ``token`` (constant-time compare), or None when it does:
    no bearer at all, a wrong one ("token rejected"), or no token on the server now."""
    header = (authorization or "").strip()
    if not header:
        return NEEDS_BEARER
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        # A header was sent, so the caller holds something it believes is the token: tell it that this is
        # refused and how it must be sent, never what was expected.
        return (
            "token rejected: the Authorization header must read 'Bearer <token>', with the token from the "
            "server's state directory (file 'token') or GPUSLICE_TOKEN"
        )
    if token is None:
        return "token rejected: the server has no usable token file now; write one (mode 0600) or restart it"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return "token rejected: read it again from the server's state directory (file 'token')"
    return None


def check_bearer(authorization: str | None, token: str | None) -> None:
    """Raise NotAuthenticated unless ``authorization`` is ``Bearer <token>`` (``bearer_problem``)."""
    problem = bearer_problem(authorization, token)
    if problem is not None:
        raise NotAuthenticated(problem)
