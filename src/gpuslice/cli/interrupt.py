"""Ctrl-C during work spread over worker processes: the workers stop at once, not after the queue drains.

The terminal sends SIGINT to the whole process group, but a process pool's worker turns the
KeyboardInterrupt raised inside a task into that task's result and takes the next task, and the pool's
shutdown then waits for every task still queued (56 s for ``sim openb --jobs 2``). Terminating this
process's worker children first breaks the pool, so its shutdown returns at once and the
KeyboardInterrupt reaches the command, which says what was kept.

A worker terminated in the middle of sending its result can leave the pool's reader waiting for the
rest of that message; so if the process is still alive ``grace_s`` after Ctrl-C, it prints the command's
last words and exits 130 without unwinding (only for work that writes nothing before it ends).

```python
with workers_stop_on_interrupt(lambda: f"error: interrupted after {done} runs; nothing was written"):
    results = run_sweep(..., jobs)     # Ctrl-C: workers terminated, KeyboardInterrupt raised here
```
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["workers_stop_on_interrupt"]


@contextmanager
def workers_stop_on_interrupt(last_words: Callable[[], str], grace_s: float = 5.0) -> Iterator[None]:
    """Inside the block, SIGINT terminates this process's multiprocessing children, then raises
    KeyboardInterrupt as Python's own handler would; if the process has not ended ``grace_s`` later,
    ``last_words()`` goes to stderr and it exits 130 at once. The previous handler is restored on the way
    out. Call it from the main thread (signal handlers live there)."""
    parent = os.getpid()  # a forked worker inherits this handler: there it only raises
    timers: list[threading.Timer] = []

    def stuck() -> None:
        sys.stderr.write(last_words() + "\n")
        sys.stderr.flush()
        os._exit(130)

    def stop(signum: int, frame: FrameType | None) -> None:
        if os.getpid() == parent:
            for child in multiprocessing.active_children():
                child.terminate()
            timer = threading.Timer(grace_s, stuck)
            timer.daemon = True  # a process that ends in time is not held up by it
            timer.start()
            timers.append(timer)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        for timer in timers:  # the pool let go in time: the command says the rest itself
            timer.cancel()
