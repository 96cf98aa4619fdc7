"""Helpers the server tests share (a module, not conftest, so test files can import them by name)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on (just released by the OS)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
