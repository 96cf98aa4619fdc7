"""Jobs that try to outlive themselves, for the containment tests (node and server): each is one Python
program, ``python -c ESCAPER OUT KIND SECONDS MAIN``.

KIND       what the job starts before its main process goes on
setsid     a daemon in a session of its own that ignores SIGTERM and lives SECONDS
double     the same daemon, but double-forked: its parent exits at once, so it is nobody's child
refork     a process that ignores SIGTERM and forks a new child every millisecond, the parent exiting
           each time; it touches OUT/beat every 20 forks and stops when OUT/stop appears
bomb       2^7 processes (each forks at each of 7 levels), that sleep SECONDS; OUT/refused appears when
           the kernel refuses a fork (pids.max)

MAIN is "exit" (the main process exits 0 once the escape is in place) or "stay" (it sleeps until it is
stopped). The escaper writes its PID to OUT/escaper.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil
import pytest

from gpuslice.node import containment

__all__ = ["ESCAPER", "ESCAPES", "MODES", "alive", "beating", "escaper_pid", "release", "works"]


def works(mode: str) -> bool:
    """Whether containment ``mode`` can run on this machine."""
    try:
        containment.detect(mode)
        return True
    except containment.ContainmentUnavailable:
        return False


ESCAPES = pytest.mark.xfail(
    strict=True, reason="a process group is escaped by setsid: kept to show the test fails"
)
# Every containment mode that works here, and the process group, which each escape test must fail.
MODES = [m for m in ("cgroup2", "cgroup1", "subreaper") if works(m)] + [pytest.param("pgroup", marks=ESCAPES)]

ESCAPER = r"""
import os, signal, sys, time
out, kind, seconds, main = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
def note(name, text=None):
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        f.write(text or str(os.getpid()))
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
def daemon():
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    note("escaper")
    time.sleep(seconds)
    os._exit(0)
if kind == "setsid":
    if os.fork() == 0:
        daemon()
elif kind == "double":
    if os.fork() == 0:
        if os.fork() == 0:
            daemon()
        os._exit(0)
elif kind == "refork":
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        note("beat", "0")
        note("escaper")
        n = 0
        while not os.path.exists(os.path.join(out, "stop")):
            if os.fork():
                os._exit(0)
            n += 1
            if n % 20 == 0:
                os.utime(os.path.join(out, "beat"))
            time.sleep(0.001)
        os._exit(0)
elif kind == "bomb":
    note("escaper")
    for level in range(7):
        try:
            os.fork()
        except OSError:
            note("refused", "1")
    time.sleep(seconds)
    if os.getpid() != int(open(os.path.join(out, "escaper")).read()):
        os._exit(0)
while not os.path.exists(os.path.join(out, "escaper")):
    time.sleep(0.01)
if main == "stay":
    note("main")
    time.sleep(600)
"""


def escaper_pid(out: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int((out / "escaper").read_text())
    return None


def alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie does not: it holds nothing but its number)."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def beating(out: Path, seconds: float = 1.0) -> bool:
    """Whether a re-forking escaper still runs: its beat file is touched within ``seconds``."""
    beat = out / "beat"
    if not beat.exists():
        return False
    before = beat.stat().st_mtime_ns
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if beat.stat().st_mtime_ns != before:
            return True
    return False


def release(out: Path) -> None:
    """Whatever escaped (a test of a mode that does not contain it): the re-forker stops by its file, a
    daemon by its PID."""
    (out / "stop").touch()
    pid = escaper_pid(out)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)  # type: ignore[arg-type]
