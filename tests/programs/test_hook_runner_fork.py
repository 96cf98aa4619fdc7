"""A process forked while the policy watchdog held its lock (``gpuslice tune --jobs``, ``sim openb --jobs``
fork worker processes from a process whose watchdog thread polls under that lock) can still guard hooks:
the child gets a fresh lock and no watchdog thread of the parent's."""

from __future__ import annotations

import os
import threading

from gpuslice.programs.hook_runner import WATCHDOG


def test_a_child_forked_while_the_watchdog_held_its_lock_can_take_it():
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with WATCHDOG.lock:  # what the watchdog thread does on every poll
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists; the parent's holder never lets go here
        try:
            os._exit(0 if WATCHDOG.lock.acquire(timeout=5) and WATCHDOG._thread is None else 1)
        except BaseException:
            os._exit(2)  # never back into the parent's pytest
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # 1: the inherited lock stayed taken
