"""Ending a test's jobs the way the product does, so that nothing is left behind: the job's container
first (``launcher.kill``), then its supervisor records the exit, removes its cgroup (waiting up to 10 s for
it to empty) and ends; only a supervisor still there after ``grace_s`` is killed (SIGKILL to its group).
Killing the supervisor first would leave its job cgroup behind (``no_cgroup_left_behind`` names it)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from gpuslice.node import launcher


def end_job(pgid: int, state_dir: Path | None = None, grace_s: float = 30.0) -> None:
    start = launcher.process_start(pgid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        launcher.kill(pgid, state_dir)
    deadline = time.monotonic() + grace_s
    while start is not None and launcher.is_alive(pgid, start) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
