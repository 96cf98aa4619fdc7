"""The ``gpuslice`` job commands, a client of ``gpuslice serve``: submit, ps, show, cancel, logs, gpus, queue.

Each command builds a ``ServeClient`` (server from --url / GPUSLICE_URL, token from GPUSLICE_TOKEN or the
state directory), makes one call and prints the answer. The server decides; nothing is decided here.
"""

from __future__ import annotations

import sys
import time
import uuid
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gpuslice.cli import estimate as est
from gpuslice.cli import terminal
from gpuslice.cli.options import finite_between
from gpuslice.errors import UserError
from gpuslice.estimate import EstimateOptions, estimate_request_bytes
from gpuslice.hardware.node import MAX_GPU_INDEX
from gpuslice.server.client import MAX_PAGE, ServeClient
from gpuslice.units import format_size
from gpuslice.workload.job import DEFAULT_TENANT

__all__ = ["cancel", "gpus", "logs", "ps", "queue", "show", "submit"]

_out = terminal.console(highlight=False, soft_wrap=True)  # controls made visible, no emoji codes
_ACTIVE = ["PENDING", "RUNNING", "PREEMPTED"]

Url = Annotated[
    str | None,
    typer.Option("--url", help="server URL [env GPUSLICE_URL; else the one written in the state dir]"),
]
StateDir = Annotated[
    Path | None,
    typer.Option("--state-dir", help="server state dir, for the token [env GPUSLICE_STATE_DIR]"),
]


def _client(url: str | None, state_dir: Path | None) -> ServeClient:
    """The one place the commands get their client (tests replace it with one bound to an app)."""
    return ServeClient(url=url, state_dir=state_dir)


def slice_text(job: dict[str, Any]) -> str:
    """'2 GPUs', '20 GiB', '20 GiB · 50%', 'MIG 3g.40gb', '1 GPU exclusive' for a job's spec."""
    spec = job["spec"]
    if spec["mig_profile"]:
        return f"MIG {spec['mig_profile']}"
    parts = []
    if spec["gpu_memory_bytes"]:
        parts.append(format_size(spec["gpu_memory_bytes"]))
    if 0 < spec["compute_percent"] < 100:
        parts.append(f"{spec['compute_percent']}%")
    if not parts:
        parts.append(f"{spec['gpus']} GPU" + ("s" if spec["gpus"] != 1 else ""))
    if spec["exclusive"]:
        parts.append("exclusive")
    return " · ".join(parts)


def host_limits_text(spec: dict[str, Any]) -> str:
    """'8 GiB RAM · 1.5 CPUs' for a job's host limits, or 'none'."""
    parts = []
    if spec.get("host_memory_bytes"):
        parts.append(f"{format_size(spec['host_memory_bytes'])} RAM")
    if spec.get("cpus"):
        parts.append(f"{spec['cpus']:g} CPUs")
    return " · ".join(parts) or "none"


_COMMAND_WIDTH = 80  # characters of a job's command in `ps` (wrapped to its column); `show` prints it whole


def _shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the last one an ellipsis when anything was cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _ago(t: float | None) -> str:
    if t is None:
        return "—"
    s = max(0.0, time.time() - t)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def submit(
    command: Annotated[list[str], typer.Argument(help="the command, after --", show_default=False)],
    gpus: Annotated[
        int, typer.Option(min=1, help="GPUs (whole, unless --mem/--cores make it a share of 1)")
    ] = 1,
    mem: Annotated[
        str | None,
        typer.Option(
            help="GPU memory per GPU with a unit: 20GiB or 20G (2^30 bytes each), 20GB (10^9), 20B (bytes); "
            "a bare number is refused; default: the whole GPU"
        ),
    ] = None,
    cores: Annotated[
        int | None,
        typer.Option(
            min=1, max=100, help="compute share in percent of a GPU's SMs, 1..100; default: no compute limit"
        ),
    ] = None,
    mig: Annotated[str, typer.Option(help="a MIG profile, e.g. 3g.40gb")] = "",
    gpu_model: Annotated[list[str] | None, typer.Option(help="allowed GPU model (repeatable)")] = None,
    exclude_model: Annotated[list[str] | None, typer.Option(help="excluded GPU model (repeatable)")] = None,
    exclusive: Annotated[bool, typer.Option(help="no other job shares its GPUs")] = False,
    topology: Annotated[str, typer.Option(help="any, nvlink or pcie-switch (2+ GPUs)")] = "any",
    priority: Annotated[str, typer.Option(help="realtime, high, normal, low or idle")] = "normal",
    tenant: Annotated[str, typer.Option(help="tenant (team) the job counts against")] = DEFAULT_TENANT,
    preemptible: Annotated[bool, typer.Option(help="may be stopped for a higher priority job")] = True,
    max_runtime: Annotated[str | None, typer.Option(help="stop after this long: 90s, 30m, 1h, 2d")] = None,
    restart: Annotated[str, typer.Option(help="never, on-failure or always")] = "never",
    host_memory: Annotated[
        str | None,
        typer.Option(
            help="host RAM the job may use, e.g. 8GiB; beyond it the kernel OOM-kills inside the job "
            "(needs a cgroup containment mode: see gpuslice serve --help)"
        ),
    ] = None,
    cpus: Annotated[
        float | None,
        typer.Option(
            help="CPU time the job may use, in CPUs (1.5 = one and a half cores), enforced by its cgroup"
        ),
    ] = None,
    estimate_model: Annotated[
        str | None,
        typer.Option(
            "--estimate", help="set --mem from gpuslice estimate of this model (name or config.json)"
        ),
    ] = None,
    params: est.Params = None,
    train: est.Train = False,
    dtype: est.Dtype = "bf16",
    tp: est.TensorParallel = 1,
    context: est.Context = None,
    batch: est.Batch = None,
    zero: est.Zero = None,
    recompute: est.Recompute = None,
    micro_batch: est.MicroBatch = None,
    seq_len: est.SeqLen = None,
    margin: Annotated[
        float,
        typer.Option(
            help="with --estimate: safety margin over the estimate, 0..1", callback=finite_between(0, 1)
        ),
    ] = 0.1,
    url: Url = None,
    state_dir: StateDir = None,
) -> None:
    """Submit a job: gpuslice submit --mem 20GiB -- python train.py"""
    if estimate_model is not None or params is not None:
        if mem is not None:
            raise UserError("--estimate sets --mem from the model; give one of them")
        options = EstimateOptions(
            train=train, dtype=dtype, tp=tp, context=context, batch=batch, gpus=gpus if train else None,
            zero=zero, recompute=recompute, micro_batch=micro_batch, seq_len=seq_len,
        )  # fmt: skip
        mem_bytes, why = estimate_request_bytes(estimate_model, options, params=params, margin=margin)
        mem = f"{mem_bytes}B"
        gpus = gpus if train else tp  # an inference estimate is per GPU over its tensor-parallel GPUs
        _out.print(f"memory from estimate: {terminal.shown(why)}")
    body: dict[str, Any] = {
        "command": command, "gpus": gpus, "memory": mem, "compute_percent": cores or 0, "mig": mig,
        "gpu_models": gpu_model or [], "excluded_gpu_models": exclude_model or [], "exclusive": exclusive,
        "topology": topology, "priority": priority, "tenant": tenant, "preemptible": preemptible,
        "max_runtime": max_runtime, "restart": restart, "cwd": str(Path.cwd()),
        "host_memory": host_memory, "cpus": cpus or 0.0,
    }  # fmt: skip
    check_submit(body)  # every argument before the token is looked for
    with _client(url, state_dir) as client:
        # A key of its own: if the server crashes after taking the job but before answering, the
        # retry returns that job instead of making a second one.
        job = client.submit(body, idempotency_key=str(uuid.uuid4()), retries=5)
    understood = job["spec"]["gpu_memory_bytes"]
    read_as = f"; --mem {mem} read as {understood:,} bytes" if mem is not None and understood else ""
    _out.print(f"job {job['id']} submitted: {job['state']} ({slice_text(job)}{read_as})", markup=False)


# The submit body's fields as the command line spells them, for error messages.
_FLAGS = {
    "command": "the command", "gpus": "--gpus", "memory": "--mem", "compute_percent": "--cores",
    "mig": "--mig", "gpu_models": "--gpu-model", "excluded_gpu_models": "--exclude-model",
    "exclusive": "--exclusive", "topology": "--topology", "priority": "--priority", "tenant": "--tenant",
    "preemptible": "--preemptible", "max_runtime": "--max-runtime", "restart": "--restart",
    "host_memory": "--host-memory", "cpus": "--cpus",
}  # fmt: skip


def check_submit(body: dict[str, Any]) -> None:
    """Validate a submit body as the server will, naming the command-line flag of any problem.

    The server checks again (it is the authority); this only makes a wrong argument say so before the
    token or the server is needed.
    """
    from pydantic import ValidationError

    from gpuslice.server.models import FieldError, SubmitRequest, spec_from_submit

    try:
        spec_from_submit(SubmitRequest.model_validate(body), server_user="")
    except ValidationError as err:
        first = err.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        raise UserError(f"{_FLAGS.get(field, field)}: {first['msg']}") from None
    except FieldError as err:
        message = str(err).removeprefix(f"{err.field}: ")
        for name, flag in _FLAGS.items():  # JobSpec messages may name other fields too
            message = message.replace(f"{name}:", f"{flag}:")
        raise UserError(f"{_FLAGS.get(err.field, err.field)}: {message}") from None


def ps(
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help="include finished jobs")] = False,
    limit: Annotated[int, typer.Option(min=1, max=MAX_PAGE, help="at most this many, newest first")] = 100,
    url: Url = None,
    state_dir: StateDir = None,
) -> None:
    """List jobs: pending, running and preempted ones (--all: finished ones too)."""
    with _client(url, state_dir) as client:
        jobs = client.jobs(None if all_jobs else _ACTIVE, limit=limit)
    # Priority and tenant get a column only where jobs differ in them (else the caption says it), so the
    # command and the reason keep room to wrap at 80 columns; the short columns never wrap.
    shared = {k: {j[k] for j in jobs} for k in ("priority", "tenant")}
    varying = [k for k, values in shared.items() if len(values) > 1]
    caption = ", ".join(f"{k} {escape(next(iter(v)))}" for k, v in shared.items() if len(v) == 1)
    table = Table(box=None, caption=f"all jobs: {caption}" if caption else None, caption_justify="left")
    for header in ("ID", "STATE", *(k.upper() for k in varying), "SLICE", "GPUS", "AGE"):
        table.add_column(header, no_wrap=True)
    table.add_column("COMMAND", overflow="fold", ratio=1, min_width=8)
    table.add_column("REASON", ratio=1, min_width=8)
    for j in jobs:
        gpus_text = ",".join(map(str, j["gpus"])) if j["state"] == "RUNNING" else "—"
        command = escape(_shorten(" ".join(j["command"]), _COMMAND_WIDTH))
        table.add_row(j["id"], j["state"], *(escape(str(j[k])) for k in varying), slice_text(j), gpus_text,
                      _ago(j["submitted_at"]), command, escape(j["reason"]))  # fmt: skip
    _out.print(
        table if jobs else "no jobs" + ("" if all_jobs else " pending or running (--all for finished)")
    )


def show(job_id: str, url: Url = None, state_dir: StateDir = None) -> None:
    """Show one job: its request, state, placement, exit status and events."""
    with _client(url, state_dir) as client:
        job = client.job(job_id)
        events = client.events(job_id=job_id)
    rows = [
        ("state", f"{job['state']} — {job['reason']}"),
        ("command", " ".join(job["command"])),
        ("slice", slice_text(job)),
        ("priority / tenant", f"{job['priority']} / {job['tenant']}"),
        ("gpus", ",".join(map(str, job["gpus"])) or "—"),
        ("pid", str(job["pid"] or "—")),
        ("exit code", "—" if job["exit_code"] is None else str(job["exit_code"])),
        ("attempts", str(job["attempts"])),
        ("host limits", host_limits_text(job["spec"])),
    ]
    if job["stopping"]:
        rows.insert(1, ("stopping", f"{job['stopping']} requested; the job ends when its last process has"))
    contained = [e for e in events if e["kind"] == "containment"]
    if contained:  # the mode its supervisor kept the latest attempt's processes in
        rows.append(("containment", contained[-1]["reason"]))
    for key, value in rows:
        _out.print(f"[bold]{key:>17}[/bold]  {escape(value)}")
    for e in events:
        change = f"{e['old_state'] or ''}→{e['new_state']}" if e["new_state"] else e["kind"]
        stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
        _out.print(f"  {stamp}  {change:<22} {escape(e['reason'])}")


def cancel(job_id: str, url: Url = None, state_dir: StateDir = None) -> None:
    """Cancel a pending job, or stop a running one (SIGTERM, grace period, SIGKILL)."""
    with _client(url, state_dir) as client:
        job = client.cancel(job_id)
    _out.print(f"job {job['id']}: {job['state']}" + (" (stopping)" if job["stopping"] else ""))


class LogStream(StrEnum):
    """A job's outputs ``logs`` can print (checked here, before the server is asked)."""

    STDOUT = "stdout"
    STDERR = "stderr"
    BOTH = "both"


def logs(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    stream: Annotated[LogStream, typer.Option(help="which of the job's outputs")] = LogStream.BOTH,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="the bytes exactly as the job wrote them, escape sequences included (for a file: "
            "gpuslice logs 3 --raw > out.log)",
        ),
    ] = False,
    url: Url = None,
    state_dir: StateDir = None,
) -> None:
    """Print a job's output, with its control characters written out: an escape sequence shows as \\x1b[…,
    a carriage return as \\x0d, so the output cannot retitle, clear or copy into your terminal. The
    same when the output is a pipe or a file (gpuslice logs 3 | grep x still ends on your terminal);
    --raw gives the bytes."""
    shown = None if raw else terminal.VisibleBytes()
    with _client(url, state_dir) as client:
        for chunk in client.logs(job_id, follow=follow, stream=stream.value):
            sys.stdout.buffer.write(chunk if shown is None else shown.feed(chunk))
            sys.stdout.buffer.flush()
    if shown is not None:
        sys.stdout.buffer.write(shown.end())
        sys.stdout.buffer.flush()


def gpus(
    url: Url = None,
    state_dir: StateDir = None,
    mark_unhealthy: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=MAX_GPU_INDEX,
            help="mark this GPU unhealthy: no new jobs go there (injects a fault on --simulate)",
        ),
    ] = None,
    mark_healthy: Annotated[
        int | None, typer.Option(min=0, max=MAX_GPU_INDEX, help="put this GPU back in service")
    ] = None,
    reason: Annotated[str, typer.Option(help='why, with --mark-unhealthy, e.g. "XID 79"')] = "",
) -> None:
    """Each GPU with its slices, free memory and health; --mark-unhealthy / --mark-healthy change health."""
    with _client(url, state_dir) as client:
        if mark_unhealthy is not None and mark_healthy is not None:
            raise UserError("give --mark-unhealthy or --mark-healthy, not both")
        if mark_unhealthy is not None:
            client.set_gpu_health(mark_unhealthy, False, reason)
        elif mark_healthy is not None:
            client.set_gpu_health(mark_healthy, True)
        rows = client.gpus()
    table = Table(box=None)  # the short columns never wrap, so a size stays on one line at 80 columns
    for header in ("GPU", "MODEL", "MEMORY FREE", "COMPUTE\nFREE", "OTHERS"):
        table.add_column(header, no_wrap=True)
    table.add_column("HEALTH")
    table.add_column("SLICES\n(job: memory · compute)", ratio=1)
    for g in rows:
        slices = ", ".join(
            f"{s['id']}: {s['mig'] or format_size(s['memory_bytes'])}"
            + (f" · {s['compute_percent']}%" if s["compute_percent"] else "")
            for s in g["jobs"]
        )
        table.add_row(
            str(g["index"]), g["model"],
            f"{format_size(g['memory_free_bytes'])} / {format_size(g['memory_total_bytes'])}",
            f"{g['compute_free_percent']:.0f}%",
            format_size(g["external_memory_bytes"]) if g["external_memory_bytes"] else "—",
            "ok" if g["healthy"] else f"[red]unhealthy: {escape(g['unhealthy_reason'] or '')}[/]",
            slices or "idle",
        )  # fmt: skip
    _out.print(table)


def queue(url: Url = None, state_dir: StateDir = None) -> None:
    """Pending jobs in the order they would start, each with why it waits."""
    with _client(url, state_dir) as client:
        entries = client.queue()
    table = Table("#", "ID", "PRIORITY", "TENANT", "WAITING", "WHY", box=None)
    for e in entries:
        waited = _ago(e["submitted_at"])
        table.add_row(
            str(e["position"]), e["id"], e["priority"], escape(e["tenant"]), waited, escape(e["reason"])
        )
    _out.print(table if entries else "the queue is empty")
