"""Feedback on long work (``cli/progress.py``): plain lines on stderr where no terminal shows a bar, one as
the work starts and one every few seconds with how far, the time spent and the time left."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from gpuslice.cli.progress import WorkProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_without_a_terminal_a_line_every_few_seconds_says_how_far_and_how_long_is_left() -> None:
    clock, out = Clock(), io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=False)
    with WorkProgress(console, "sim replay", 1_000, "pods", every_s=5, clock=clock, stream=out) as work:
        work.say("sim replay: 2 runs, 1,000 pods")
        work.describe("default fifo load 1")
        clock.now += 1
        work.update(100)  # 1 s in: too soon for a line
        clock.now += 4
        work.update(250)  # 5 s in: 250 of 1,000 done, so 15 s left at this pace
        clock.now += 2
        work.update(400)  # 2 s after the last line: none
        clock.now += 5
        work.update(2_000)  # more than the total reads as the total
    assert out.getvalue().splitlines() == [
        "sim replay: 2 runs, 1,000 pods",
        "sim replay: 250/1,000 pods (25 %), 5 s, about 15 s left (default fifo load 1)",
        "sim replay: 1,000/1,000 pods (100 %), 12 s, about 0 s left (default fifo load 1)",
    ]


def test_on_a_terminal_the_bar_shows_it_and_stderr_gets_no_lines() -> None:
    clock, out = Clock(), io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=True)
    with WorkProgress(console, "sim replay", 10, "pods", every_s=0, clock=clock, stream=out) as work:
        work.say("starting")
        clock.now += 10
        work.update(5)
    assert out.getvalue() == ""
    assert "starting" in console.file.getvalue()  # type: ignore[attr-defined]


def test_a_total_learnt_on_the_way_counts_from_then_on() -> None:
    clock, out = Clock(), io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=False)
    with WorkProgress(console, "reading trace big", 0, "MiB", every_s=5, clock=clock, stream=out) as work:
        clock.now += 5
        work.update(18, 73)  # the reader has opened the file: 73 MiB in all
        clock.now += 5
        work.update(36)
    assert out.getvalue().splitlines() == [
        "reading trace big: 18/73 MiB (25 %), 5 s, about 15 s left",
        "reading trace big: 36/73 MiB (49 %), 10 s, about 10 s left",
    ]


def test_work_that_cannot_count_says_every_few_seconds_that_it_is_still_working() -> None:
    clock, out = Clock(), io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=False)
    with WorkProgress(console, "predict", 0, "pods", every_s=0.01, clock=clock, stream=out) as work:
        with work.waiting("training the model"):
            clock.now += 5
            deadline = time.monotonic() + 10  # the beat comes from a thread: wait for it, however busy
            while len(out.getvalue().splitlines()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        said = len(out.getvalue().splitlines())
        time.sleep(0.1)  # ten beats' time after the work ended: no more lines
    lines = out.getvalue().splitlines()
    assert len(lines) == said >= 2, lines
    assert all(re.fullmatch(r"predict: training the model, \d+ s", line) for line in lines), lines
    assert lines[-1] == "predict: training the model, 5 s"


def test_on_a_terminal_work_that_cannot_count_writes_no_lines() -> None:
    out = io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=True)
    work = WorkProgress(console, "predict", 0, "pods", every_s=0.01, stream=out)
    with work, work.waiting("training the model"):
        time.sleep(0.1)
    assert out.getvalue() == ""
