"""Fixtures for the server tests: a fake node (no processes), a daemon over it, and an API client.

``FakeNode`` has the daemon's ``NodeOps`` methods and records every call; tests play the node's part
by setting ``exits`` (what ``poll`` reports), ``alive`` (PIDs that run), ``used`` (GPU memory per job)
and ``decisions`` (what the graded response answers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from server_helpers import FakeNode, ServerProcess, h100_machine, kill_jobs

from gpuslice.server.daemon import Daemon
from gpuslice.server.store import Store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node() -> FakeNode:
    return FakeNode()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_daemon(tmp_path, node, clock):
    """make_daemon(**kw): a Daemon over a fresh (or the same) store in tmp_path, with the fake node."""
    opened: list[Store] = []

    def build(**kw: Any) -> Daemon:
        store = Store(tmp_path / "state.db")
        opened.append(store)
        kw.setdefault("grace_seconds", 2.0)
        kw.setdefault("monitor_seconds", 0.0)  # every tick: the fake clock does not move by itself
        return Daemon(store, kw.pop("machine", h100_machine()), node, tmp_path, clock=clock, **kw)

    yield build
    for store in opened:
        store.close()


@pytest.fixture
def daemon(make_daemon) -> Daemon:
    return make_daemon()


# -- a real server process, for the end-to-end and crash tests ---------------------------------------


@pytest.fixture
def serve(tmp_path):
    """serve(*args) -> a started ServerProcess on a simulated DGX H100; stopped, its jobs killed, after."""
    started: list[ServerProcess] = []

    def start(*args: str, state_dir: Path | None = None) -> ServerProcess:
        server = ServerProcess(state_dir or tmp_path / "state", "--simulate", "dgx-h100", *args)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
    for server in started:
        kill_jobs(server.state_dir)
