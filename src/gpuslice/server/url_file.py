"""Where a running server can be reached, kept in its state directory beside the token.

``gpuslice serve`` writes its URL to ``STATE_DIR/url`` when it starts; a client that finds the state
directory (``--state-dir``, ``GPUSLICE_STATE_DIR`` or the default one) reads it there, so a server on a
non-default ``--port`` or ``--host`` needs no ``--url``. ``--url`` and ``GPUSLICE_URL`` still win.
The file stays after the server stops: a client then says the server at that URL does not answer.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuslice.inputs import InvalidInput, read_text

__all__ = ["URL_FILE", "read_url", "write_url"]

URL_FILE = "url"
_MAX_URL_BYTES = 4096  # a URL, and room to spare


def write_url(state_dir: Path, url: str) -> None:
    """Replace ``state_dir/url`` with ``url`` (mode 0600, written whole: a reader never sees half)."""
    path = Path(state_dir) / URL_FILE
    partial = path.with_name(f".{URL_FILE}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(url + "\n")
    os.replace(partial, path)


def read_url(state_dir: Path) -> str | None:
    """The URL a server in ``state_dir`` wrote, or None when there is none (or it is not an http URL)."""
    try:
        # read_text: a FIFO or a device in its place is refused, not read for ever
        text = read_text(Path(state_dir) / URL_FILE, "server URL file", max_bytes=_MAX_URL_BYTES).strip()
    except InvalidInput:
        return None
    return text if text.startswith(("http://", "https://")) and "\n" not in text else None
