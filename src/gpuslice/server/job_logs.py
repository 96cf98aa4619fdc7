"""A job's output for the API's log route: its log files read whole, or followed until the job ends.

```text
open_logs(daemon, job_id, names)   each log opened now through node.private_files (never through a
                                   link; a regular file of ours in the job's folder); JobLogRefused (409)
                                   names the file and why, before any byte is sent; None: not there yet
follow(daemon, job_id, logs, stop) the bytes: whole (stop None), or in turns, a chunk at a time, until
                                   the job has ended and nothing is new, or the server stops
```

The descriptors stay open while a follower reads, so a log swapped for a link afterwards changes nothing
for it; a log that appears later (a pending job starts) is opened with the same checks, and a refusal
then ends the stream with one ``gpuslice:`` line saying why.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Sequence
from typing import BinaryIO

from gpuslice.node import private_files
from gpuslice.server.daemon import Daemon
from gpuslice.server.errors import JobLogRefused
from gpuslice.workload.job import TERMINAL_STATES

__all__ = ["Log", "follow", "open_logs"]

_FOLLOW_POLL_SECONDS = 0.2
_CHUNK_BYTES = 64 * 1024


class Log:
    """One log stream of a job: its path, its open file (None until it exists) and how far it was read."""

    def __init__(self, daemon: Daemon, job_id: str, name: str) -> None:
        self.job_id = job_id
        self.path = daemon.log_path(job_id, name)
        self.file: BinaryIO | None = None
        self.offset = 0

    def open(self) -> BinaryIO | None:
        """The file, opened now if it was not; JobLogRefused when what is there must not be read."""
        if self.file is None:
            try:
                self.file = private_files.open_for_reading(self.path)
            except private_files.UnsafeFile as err:
                raise JobLogRefused(
                    f"the {self.path.stem} log of job {self.job_id} is refused: {err}. The job changed its "
                    "log file; nothing outside the job's folder is read"
                ) from None
        return self.file

    def has_more(self) -> bool:
        return self.file is not None and os.fstat(self.file.fileno()).st_size > self.offset

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def open_logs(daemon: Daemon, job_id: str, names: Sequence[str]) -> list[Log]:
    """The job's logs ``names`` ("stdout", "stderr"), each opened if it exists; JobLogRefused for one that
    is a link or not a regular file of ours (the others are closed again)."""
    logs = [Log(daemon, job_id, name) for name in names]
    try:
        for log in logs:
            log.open()
    except JobLogRefused:
        for log in logs:
            log.close()
        raise
    return logs


async def follow(
    daemon: Daemon, job_id: str, logs: list[Log], stop: threading.Event | None
) -> AsyncIterator[bytes]:
    """The logs' bytes; with ``stop`` (the server's stopping event), keep reading until the job is
    finished and nothing is new, or the server stops (the client follows again after its restart).

    Both streams are read in turns, a chunk at a time, so a follower sees stderr lines as they come;
    without ``stop`` stdout comes whole, then stderr. The files are closed at the end.
    """
    try:
        while True:
            got = False
            for log in logs:
                try:
                    file = log.open()
                except JobLogRefused as err:
                    yield f"\ngpuslice: {err}\n".encode()
                    return
                if file is None:
                    continue
                file.seek(log.offset)
                while chunk := file.read(_CHUNK_BYTES):
                    log.offset += len(chunk)
                    got = True
                    yield chunk
                    if stop is not None:
                        break
            if stop is None or stop.is_set():
                return
            if not got:
                ended = daemon.store.get(job_id).state in TERMINAL_STATES
                if ended and not any(log.has_more() for log in logs):
                    return
                await asyncio.sleep(_FOLLOW_POLL_SECONDS)
    finally:
        for log in logs:
            log.close()
