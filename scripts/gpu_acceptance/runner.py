"""Stages with time limits: each one's failure is recorded and the rest still run; JSON and table at the end.

```text
for stage in stages:                      # in order; later stages may read earlier records (ctx.records)
    out of overall time?  -> "skipped"
    run it in a thread, limit = min(its timeout, time left overall)
        returns a record with "checks"     -> "ok" if every check holds, else "failed"
        raises NotAvailable                -> "not available" (the mode or tool does not exist here)
        raises anything else               -> "error" with the message
        still running at the limit         -> "timeout" (its subprocesses are killed by run_command)
write JSON (every record) + a markdown table, print the table
```
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Command", "Context", "NotAvailable", "Stage", "render_table", "run_command", "run_stages"]


class NotAvailable(Exception):
    """What a stage tests does not exist on this machine (a sharing mode, a tool); not a failure."""


@dataclass
class Context:
    """What every stage may use. ``env`` is the environment for subprocesses (PATH with nvidia-smi,
    PYTHONPATH with gpuslice's sources); ``records`` holds the finished stages' records by name."""

    repo: Path
    out_dir: Path
    python: str
    env: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    stage_deadline: float = float("inf")
    cancelled: threading.Event = field(default_factory=threading.Event)

    def remaining(self) -> float:
        """Seconds left to the running stage."""
        return self.stage_deadline - time.monotonic()


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Context], dict[str, Any]]
    timeout_s: float
    summary: Callable[[dict[str, Any]], str] = lambda record: ""


@dataclass(frozen=True)
class Command:
    """A finished subprocess; ``timed_out`` when it was killed at its limit."""

    args: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool


_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()


def run_command(
    ctx: Context,
    args: Sequence[str],
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Command:
    """Run ``args`` with its output captured, for at most ``timeout_s`` and never past the stage's limit.
    It gets its own process group, so a timeout kills what it started as well."""
    limit = max(0.1, min(timeout_s, ctx.remaining(), 86_400.0))
    start = time.monotonic()
    with subprocess.Popen(
        list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or ctx.env,
        cwd=cwd or ctx.repo,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    ) as proc:  # closes the pipes and reaps the process whatever happens
        with _live_lock:
            _live.add(proc)
        try:
            out, err = proc.communicate(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            timed_out = True
        except BaseException:
            kill_group(proc)
            raise
        finally:
            with _live_lock:
                _live.discard(proc)
    return Command(
        tuple(args), None if timed_out else proc.returncode, out, err, time.monotonic() - start, timed_out
    )


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (it was started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_live() -> None:
    with _live_lock:
        for proc in list(_live):
            kill_group(proc)


def _status(record: dict[str, Any]) -> str:
    checks = record.get("checks", [])
    return "ok" if all(c.get("ok") for c in checks) else "failed"


def run_stages(
    ctx: Context, stages: Sequence[Stage], budget_s: float, progress: Callable[[str], None]
) -> dict:
    """Run ``stages`` in order within ``budget_s`` seconds overall; every stage gets a record."""
    end = time.monotonic() + budget_s
    for stage in stages:
        left = end - time.monotonic()
        if left < 1.0:
            ctx.records[stage.name] = {"status": "skipped", "reason": "out of time (overall budget spent)"}
            progress(f"{stage.name}: skipped (out of time)")
            continue
        limit = min(stage.timeout_s, left)
        ctx.stage_deadline = time.monotonic() + limit
        progress(f"{stage.name}: running (limit {limit:.0f} s)")
        box: dict[str, Any] = {}

        def work(stage: Stage = stage, box: dict[str, Any] = box) -> None:
            try:
                box["record"] = stage.run(ctx)
            except NotAvailable as e:
                box["record"] = {"status": "not available", "reason": str(e)}
            except Exception as e:  # a stage's crash is its record, never the end of the run
                box["record"] = {
                    "status": "error",
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(limit=6),
                }

        started = time.monotonic()
        thread = threading.Thread(target=work, name=f"stage-{stage.name}", daemon=True)
        thread.start()
        thread.join(limit + 2.0)  # run_command already stops at the limit; 2 s to wrap up
        if thread.is_alive():
            ctx.cancelled.set()
            _kill_live()
            thread.join(5.0)
            record = {"status": "timeout", "reason": f"still running after {limit:.0f} s"}
            ctx.cancelled = threading.Event()
        else:
            record = box["record"]
            record.setdefault("status", _status(record))
        record["seconds"] = round(time.monotonic() - started, 2)
        ctx.records[stage.name] = record
        progress(f"{stage.name}: {record['status']} ({record['seconds']:.1f} s)")
    return ctx.records


def render_table(records: dict[str, dict[str, Any]], stages: Sequence[Stage]) -> str:
    """A markdown table: stage, status, seconds, the stage's one-line summary (or why it did not pass)."""
    lines = ["| stage | status | s | summary |", "|---|---|---:|---|"]
    for stage in stages:
        r = records.get(stage.name, {"status": "not run"})
        if r["status"] in ("ok", "failed"):
            text = stage.summary(r)
            failed = [c["name"] for c in r.get("checks", []) if not c.get("ok")]
            if failed:
                text = (text + "; " if text else "") + "failed: " + ", ".join(failed[:6])
        else:
            text = r.get("reason") or r.get("error") or ""
        text = " ".join(str(text).split()).replace("|", "/")
        lines.append(f"| {stage.name} | {r['status']} | {r.get('seconds', 0):.1f} | {text[:160]} |")
    return "\n".join(lines) + "\n"


def write_outputs(path: Path, document: dict[str, Any], table: str) -> Path:
    """The JSON at ``path`` and the table beside it (same name, ``.md``); returns the table's path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    md = path.with_suffix(".md")
    md.write_text(table)
    return md
