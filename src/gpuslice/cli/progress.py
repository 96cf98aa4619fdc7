"""Feedback on long work: rich's bar on a terminal; elsewhere (piped, in CI) plain lines on stderr.

A command that can run for more than a couple of seconds says what it does as it starts, and then, when
no terminal shows a bar, a line every ``every_s`` seconds with how far it is, the time spent and an
estimate of the time left, so a log shows a run that is working apart from one that hangs:

```text
sim replay: 5 runs, 40,760 pods
sim replay: 12,000/40,760 pods (29 %), 5 s, about 12 s left (default-every20 bestfit fifo load 30)
```
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpuslice.sim.timed_trace import TimedTrace, load_timed_trace

__all__ = ["WorkProgress", "read_timed_trace"]


class WorkProgress:
    """``with WorkProgress(console, "sim replay", total, "pods") as p: p.describe(...); p.update(done)``."""

    def __init__(
        self,
        console: Console,
        what: str,
        total: int,
        unit: str,
        *,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        stream: TextIO | None = None,
    ) -> None:
        self.what, self.total, self.unit, self.every_s = what, max(0, total), unit, every_s
        self._clock, self._stream = clock, stream
        self._done, self._description = 0, ""
        self._bar: Progress | None = None
        if console.is_terminal:
            label = TextColumn("{task.description}")
            columns = (label, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._bar = Progress(*columns, console=console, transient=True)
            self._task = self._bar.add_task(what, total=self.total)
        self._started = self._last = 0.0

    def __enter__(self) -> Self:
        self._started = self._last = self._clock()
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def say(self, text: str) -> None:
        """A line of what the work is, as it starts (on stderr; on a terminal above the bar)."""
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, style="dim")
        else:
            self._write(text)

    def describe(self, text: str) -> None:
        """What is being done now (the bar's label, and the end of each line)."""
        self._description = text
        if self._bar is not None:
            self._bar.update(self._task, description=text)

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` of ``total`` units finished (``total``: a new total, where it is learnt on the way,
        e.g. a file's size once its reader has opened it)."""
        if total is not None and total != self.total:
            self.total = max(0, total)
            if self._bar is not None:
                self._bar.update(self._task, total=self.total)
        self._done = min(max(0, done), self.total) if self.total else max(0, done)
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done)
            return
        now = self._clock()
        if now - self._last >= self.every_s:
            self._last = now
            self._write(self._line(now - self._started))

    @contextmanager
    def waiting(self, text: str) -> Iterator[None]:
        """Work that cannot count how far it is (a model's fit): ``text`` describes it, and where no
        terminal shows a bar a line every ``every_s`` seconds says the time spent, so that a log tells it
        from a hang."""
        self.describe(text)
        if self._bar is not None:  # the bar's clock runs on its own
            yield
            return
        stop, started = threading.Event(), self._clock()

        def beat() -> None:
            while not stop.wait(self.every_s):
                self._write(f"{self.what}: {text}, {self._clock() - started:.0f} s")

        beating = threading.Thread(target=beat, name="progress", daemon=True)
        beating.start()
        try:
            yield
        finally:
            stop.set()
            beating.join()

    def _line(self, elapsed: float) -> str:
        text = f"{self.what}: {self._done:,}/{self.total:,} {self.unit}"
        if self.total:
            text += f" ({100 * self._done / self.total:.0f} %)"
        text += f", {elapsed:.0f} s"
        if self._done and self.total:
            text += f", about {elapsed * (self.total - self._done) / self._done:.0f} s left"
        return text + (f" ({self._description})" if self._description else "")

    def _write(self, text: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()


def read_timed_trace(console: Console, name: str, trace_dir: Path | None) -> TimedTrace:
    """``load_timed_trace`` with feedback: a million-pod trace takes tens of seconds to read and check."""
    with WorkProgress(console, f"reading trace {name}", 0, "MiB") as progress:
        return load_timed_trace(name, trace_dir, lambda done, size: progress.update(done >> 20, size >> 20))
