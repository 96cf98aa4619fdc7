"""``gpuslice top``: a live terminal view of a ``gpuslice serve`` machine — GPUs, their slices, jobs, queue.

For people who live in SSH: the web dashboard's picture in rich, redrawn every ``--interval`` seconds.
It reads the server's read-only API through ``ServeClient`` (with the token from the state dir or
GPUSLICE_TOKEN, as every read needs it unless the server runs with --public-reads); ``--once`` prints one
frame and exits (scripts, tests). If the server stops answering while it runs, the last frame stays on
screen under a red line saying so, and it keeps trying.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpuslice.cli import jobs as job_cli
from gpuslice.cli import terminal
from gpuslice.cli.options import finite_between
from gpuslice.errors import GpusliceError
from gpuslice.server.client import ServeClient
from gpuslice.units import format_size

__all__ = ["Snapshot", "memory_bar", "next_frame", "render", "snapshot", "top"]

_out = terminal.console(highlight=False)
BAR_WIDTH = 20
WIDE_COLUMNS = 120  # from this terminal width on, the GPU table lists each GPU's slices too
# A job keeps its colour on the memory bar, in the slice list and in the job table.
_JOB_COLOURS = ("blue", "dark_orange", "green", "magenta", "red", "cyan", "yellow", "purple")
_ACTIVE = ["RUNNING", "PENDING", "PREEMPTED"]
_sleep = time.sleep  # between frames (tests replace it)


@dataclass(frozen=True)
class Snapshot:
    """What one frame shows: the API's answers, fetched together, and when."""

    health: dict[str, Any]
    gpus: list[dict[str, Any]]
    jobs: list[dict[str, Any]]  # running, pending and preempted ones
    queue: list[dict[str, Any]]
    taken_at: float


def snapshot(client: ServeClient) -> Snapshot:
    """Read the server once; ServerUnavailable (one line) when it does not answer."""
    return Snapshot(
        health=client.health(),
        gpus=client.gpus(),
        jobs=client.jobs(_ACTIVE, limit=10_000),
        queue=client.queue(),
        taken_at=time.time(),
    )


def _colour(job_id: str) -> str:
    return _JOB_COLOURS[zlib.crc32(job_id.encode()) % len(_JOB_COLOURS)]


def _job_id(job_id: str) -> Text:
    return Text(job_id, style=f"bold {_colour(job_id)}")


def _command(job: dict[str, Any] | None) -> Text:
    """The program's file name and its arguments, as plain text (commands are user input, not markup;
    their control characters are written out)."""
    if job is None:
        return Text("")
    program, *args = job["command"]
    return Text(terminal.visible(" ".join([program.rsplit("/", 1)[-1], *args])))


def memory_bar(gpu: dict[str, Any], width: int = BAR_WIDTH) -> Text:
    """One cell per 1/width of the GPU's memory: each slice in its job's colour, memory held by processes
    gpuslice did not start as ▒, free memory as ·. Boundaries are rounded from the running total, so the
    segments always add up to ``width``."""
    total = gpu["memory_total_bytes"]
    bar = Text()
    taken = 0
    drawn = 0
    parts = [(s["memory_bytes"], "█", _colour(s["id"])) for s in gpu["jobs"]]
    parts.append((gpu["external_memory_bytes"], "▒", "grey50"))
    for size, char, style in parts:
        taken += size
        end = min(width, round(width * taken / total)) if total else 0
        bar.append(char * (end - drawn), style=style)
        drawn = max(drawn, end)
    bar.append("·" * (width - drawn), style="grey37")
    return bar


def _health(gpu: dict[str, Any]) -> Text:
    # The reason can be long: it gets a line of its own under the table (_unhealthy_lines).
    return Text("ok", style="green") if gpu.get("healthy", True) else Text("UNHEALTHY", style="bold red")


def _table() -> Table:
    """A borderless table as wide as the terminal, so that ``ratio`` columns share what is left."""
    return Table(box=None, pad_edge=False, header_style="bold", expand=True)


def _optional(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:.0f}{unit}"


def _slices(gpu: dict[str, Any], jobs: dict[str, dict[str, Any]]) -> Text:
    lines = []
    for s in gpu["jobs"]:
        amount = f"MIG {s['mig']}" if s["mig"] else format_size(s["memory_bytes"])
        if s["compute_percent"] and not s["mig"]:
            amount += f" · {s['compute_percent']}%"
        if s["used_memory_bytes"] is not None:
            amount += f" (uses {format_size(s['used_memory_bytes'])})"
        lines.append(Text.assemble(_job_id(s["id"]), " ", amount, "  ", _command(jobs.get(s["id"]))))
    return Text("\n").join(lines) if lines else Text("idle", style="grey50")


def _unhealthy_lines(gpus: list[dict[str, Any]]) -> list[Text]:
    return [
        Text(f"GPU {g['index']} is unhealthy: {terminal.visible(g.get('unhealthy_reason') or 'no reason')}; "
             "no new jobs are placed there", style="bold red")
        for g in gpus
        if not g.get("healthy", True)
    ]  # fmt: skip


def _gpu_table(snap: Snapshot, jobs: dict[str, dict[str, Any]], wide: bool) -> Table:
    # Telemetry columns only when the server reports telemetry (real GPUs, or a simulation that has it).
    telemetry = [
        (key, title, unit)
        for key, title, unit in (
            ("utilization_percent", "UTIL", "%"),
            ("temperature_celsius", "TEMP", "°C"),
            ("power_watts", "POWER", "W"),
        )
        if any(g.get(key) is not None for g in snap.gpus)
    ]
    # Every column but the slices keeps its width (no_wrap); the slices take what is left (ratio) and end
    # in an ellipsis. A narrow terminal leaves them out: the running-jobs table has the same facts.
    models = len({g["model"] for g in snap.gpus}) > 1  # one model: it is in the header line instead
    table = _table()
    table.add_column("GPU", justify="right", no_wrap=True)
    if models:
        table.add_column("MODEL", no_wrap=True, max_width=14, overflow="ellipsis")
    table.add_column("MEMORY", no_wrap=True)
    table.add_column("FREE", justify="right", no_wrap=True)
    table.add_column("SM FREE", justify="right", no_wrap=True)
    for _, title, _ in telemetry:
        table.add_column(title, justify="right", no_wrap=True)
    table.add_column("HEALTH", no_wrap=True)
    if wide:
        table.add_column("SLICES: job memory · compute  command", overflow="ellipsis", no_wrap=True, ratio=1)
    for g in snap.gpus:
        table.add_row(
            str(g["index"]),
            *([Text(g["model"])] if models else []),
            memory_bar(g),
            format_size(g["memory_free_bytes"]),
            f"{g['compute_free_percent']:.0f}%",
            *(_optional(g.get(key), unit) for key, _, unit in telemetry),
            _health(g),
            *([_slices(g, jobs)] if wide else []),
            style=None if g.get("healthy", True) else "on grey15",
        )
    return table


def _running_table(snap: Snapshot) -> Table | Text:
    running = sorted((j for j in snap.jobs if j["state"] == "RUNNING"), key=lambda j: j["started_at"] or 0)
    if not running:
        return Text("no job is running", style="grey50")
    table = _table()
    for title in ("JOB", "SLICE", "GPUS", "TENANT", "PRIORITY", "FOR"):
        table.add_column(title, no_wrap=True)
    table.add_column("COMMAND", overflow="ellipsis", no_wrap=True, ratio=1)
    for j in running:
        note = " stopping" if j["stopping"] else " suspended" if j["suspended"] else ""
        table.add_row(_job_id(j["id"]), job_cli.slice_text(j), ",".join(map(str, j["gpus"])),
                      Text(terminal.visible(j["tenant"])), j["priority"],
                      job_cli._ago(j["started_at"]) + note, _command(j))  # fmt: skip
    return table


def _queue_table(snap: Snapshot, jobs: dict[str, dict[str, Any]]) -> Table | Text:
    if not snap.queue:
        return Text("the queue is empty", style="grey50")
    table = _table()
    for title in ("#", "JOB", "SLICE", "PRIORITY", "TENANT", "WAITING"):
        table.add_column(title, no_wrap=True)
    table.add_column("WHY IT WAITS", ratio=2, min_width=20)
    table.add_column("COMMAND", overflow="ellipsis", no_wrap=True, ratio=1)
    for q in snap.queue:
        job = jobs.get(q["id"])
        table.add_row(str(q["position"]), _job_id(q["id"]), job_cli.slice_text(job) if job else "",
                      q["priority"], Text(terminal.visible(q["tenant"])), job_cli._ago(q["submitted_at"]),
                      Text(terminal.visible(q["reason"]), style="yellow"), _command(job))  # fmt: skip
    return table


def render(snap: Snapshot, interval: float | None = None, width: int | None = None) -> RenderableType:
    """One frame: a header line, the GPUs with their slices, running jobs, the queue. ``width``: the
    terminal's columns (default: this one's); below WIDE_COLUMNS the GPU table leaves out the slices."""
    h = snap.health
    jobs = {j["id"]: j for j in snap.jobs}
    kind = "simulated" if h["simulated"] else "real"
    models = sorted({g["model"] for g in snap.gpus})
    gpus = f"{h['gpus']} × {models[0]}" if len(models) == 1 else f"{h['gpus']} GPUs"
    counts = " · ".join(f"{h['jobs'].get(s, 0)} {s.lower()}" for s in ("RUNNING", "PENDING"))
    free = sum(g["memory_free_bytes"] for g in snap.gpus)
    total = sum(g["memory_total_bytes"] for g in snap.gpus)
    sick = sum(1 for g in snap.gpus if not g.get("healthy", True))
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.taken_at))
    header = Text.assemble(
        ("gpuslice top", "bold"),
        f"  {h['machine']} · {gpus} ({kind}) · sharing {h['sharing']} · {counts} · "
        f"{format_size(free)} of {format_size(total)} free",
        (f" · {sick} UNHEALTHY" if sick else "", "bold red"),
        (f"  {stamp}" + (f" (every {interval:g} s, Ctrl-C quits)" if interval else ""), "grey50"),
    )
    return Group(
        header,
        Text(""),
        _gpu_table(snap, jobs, wide=(width or _out.width) >= WIDE_COLUMNS),
        *_unhealthy_lines(snap.gpus),
        Text(""),
        Text(f"RUNNING ({sum(1 for j in snap.jobs if j['state'] == 'RUNNING')})", style="bold underline"),
        _running_table(snap),
        Text(""),
        Text(f"QUEUE ({len(snap.queue)})", style="bold underline"),
        _queue_table(snap, jobs),
    )


def next_frame(
    client: ServeClient, last: Snapshot | None, interval: float
) -> tuple[RenderableType, Snapshot]:
    """The next frame and the snapshot it shows. If the server does not answer, the last snapshot under a
    red line that says so (a server that never answered raises, as with --once)."""
    try:
        snap = snapshot(client)
    except GpusliceError as err:
        if last is None:
            raise
        since = time.strftime("%H:%M:%S", time.localtime(last.taken_at))
        banner = Text(f"{err} — showing {since}; retrying every {interval:g} s", style="bold white on red")
        return Group(banner, render(last, interval)), last
    return render(snap, interval), snap


def top(
    interval: Annotated[
        float, typer.Option(help="seconds between refreshes, 0.2..3600", callback=finite_between(0.2, 3600))
    ] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
    url: job_cli.Url = None,
    state_dir: job_cli.StateDir = None,
) -> None:
    """A live view of the server's GPUs, slices, running jobs and queue (like top; Ctrl-C quits)."""
    with job_cli._client(url, state_dir) as client:  # reads need the token too: found in the state dir
        if once:
            _out.print(render(snapshot(client)))
            return
        frame, last = next_frame(client, None, interval)
        # In a terminal the alternate screen, like top: the scrollback is left as it was when it quits.
        # Piped, rich prints the last frame when it stops.
        with Live(frame, console=_out, screen=_out.is_terminal, auto_refresh=False) as live:
            try:
                while True:
                    _sleep(interval)
                    frame, last = next_frame(client, last, interval)
                    live.update(frame, refresh=True)
            except KeyboardInterrupt:
                pass
