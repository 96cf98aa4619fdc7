"""``gpuslice serve``: run the GPU job queue and sharing daemon for this machine (server/run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuslice.cli import terminal
from gpuslice.cli.options import port_option, target_workload_option
from gpuslice.errors import UserError
from gpuslice.inputs import writable_folder
from gpuslice.node.enforcement import DEFAULT_SHARING
from gpuslice.policies import DEFAULT_PLACEMENT, PLACEMENT
from gpuslice.policies.queue import DEFAULT_QUEUE_POLICY, QUEUE
from gpuslice.server.client import DEFAULT_PORT, default_state_dir
from gpuslice.server.store import DEFAULT_BUSY_SECONDS
from gpuslice.workload.job import DEFAULT_GRACE_SECONDS

__all__ = ["serve"]

# Linux's most processes and threads (the kernel's PID_MAX_LIMIT on 64-bit): no pids.max is above it.
PID_MAX_LIMIT = 2**22

_out = terminal.console(highlight=False, soft_wrap=True, markup=False)  # paths are text, never markup


def serve(
    host: Annotated[
        str, typer.Option(help="address to bind; 127.0.0.1 keeps it on this machine")
    ] = "127.0.0.1",
    port: port_option("TCP port") = DEFAULT_PORT,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="jobs database, token, logs [env GPUSLICE_STATE_DIR; ~/.local/share/gpuslice]"),
    ] = None,
    simulate: Annotated[
        str | None, typer.Option(help="simulate a machine (dgx-h100, pcie-4x-l4, …) instead of reading NVML")
    ] = None,
    sharing: Annotated[
        str,
        typer.Option(
            help="enforcement: soft (a PyTorch cap; the default: needs nothing on the machine), mps (an "
            "MPS daemon enforces memory and compute), mig, or shim (a preloaded library fences memory and "
            "compute in any CUDA process)"
        ),
    ] = DEFAULT_SHARING.value,
    grace: Annotated[
        str, typer.Option(help="SIGTERM-to-SIGKILL grace when stopping a job: 30s, 2m")
    ] = f"{DEFAULT_GRACE_SECONDS:g}s",
    busy_timeout: Annotated[
        str,
        typer.Option(
            help="how long a call waits while another process holds the state file's lock (an sqlite3 "
            "shell, a backup) before it is answered 503 with Retry-After: 0.5s, 2s"
        ),
    ] = f"{DEFAULT_BUSY_SECONDS:g}s",
    queue_policy: Annotated[
        str,
        typer.Option(
            help=f"queue policy: {', '.join(QUEUE)}, or a policy file (.py; verified, guarded, swappable "
            "with `gpuslice policy load`)"
        ),
    ] = DEFAULT_QUEUE_POLICY,
    placement: Annotated[
        str,
        typer.Option(
            help=f"placement policy that chooses each job's GPUs: {', '.join(PLACEMENT)}, or a policy file "
            "(.py; verified and guarded): the same policies as sim and the Kubernetes extender",
        ),
    ] = DEFAULT_PLACEMENT,
    policy_memory: Annotated[
        str,
        typer.Option(
            help="address-space limit of each policy file's worker process (queue and placement files run "
            "in one of their own; a hook past it costs a fault, never the server's memory): 512MiB, 1GiB",
        ),
    ] = "512MiB",
    target_workload: target_workload_option("the shapes of the jobs the server knows") = None,
    public_reads: Annotated[
        bool,
        typer.Option(
            "--public-reads",
            help="let anyone who reaches the port read jobs, logs and the queue without the token (env "
            "values stay masked); only for a machine whose every user may see every job",
        ),
    ] = False,
    containment: Annotated[
        str,
        typer.Option(
            envvar="GPUSLICE_CONTAINMENT",
            help="how each job's processes are kept together: auto (the first that works of cgroup2, "
            "cgroup1 as root, systemd when not root), cgroup2, cgroup1, systemd, subreaper, or pgroup "
            "(none: only to compare); see above",
        ),
    ] = "auto",
    pids_max: Annotated[
        int,
        typer.Option(
            min=0,
            max=PID_MAX_LIMIT,
            help="processes and threads one job may have (its cgroup's pids.max; a fork "
            "bomb stops there); 0: no limit",
        ),
    ] = 0,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            help="also accept requests for this Host name (a reverse proxy's); repeatable; '*' = any. "
            "The server's own names and addresses are always accepted",
        ),
    ] = None,
) -> None:
    """Serve the GPU job queue on this machine until Ctrl-C; jobs keep running across restarts.

    The token is STATE_DIR/token (made at the first start, mode 0600). The server reads it again on
    SIGHUP and within a second of a change: replace the file to rotate the token, and the old one is
    refused from then on. While the file is missing or unusable (not a regular 0600 file of yours), every
    call that needs the token is refused, until a good file is back.

    Each job runs in a container that its supervisor makes before the job's first exec; the job ends,
    and its GPUs are given back, only when its last process has ended (a setsid daemon too: processes
    left when the main one exits get SIGTERM, then SIGKILL after --grace). --containment:

    cgroup2: a cgroup v2 per job; cancel and max runtime kill it at once (cgroup.kill); host limits
    (--host-memory, --cpus, --pids-max) where the server's cgroup delegates those controllers.

    cgroup1 (root): freezer cgroup per job; a kill freezes, SIGKILLs every member, thaws; host limits
    through the memory, cpu and pids controllers.

    systemd (not root, systemd as PID 1): a transient scope (systemd-run --user --scope) per job,
    killed as a cgroup; host limits as MemoryMax, CPUQuota, TasksMax.

    subreaper (anywhere): the supervisor is the child subreaper of the job and finds every descendant,
    and, once it is gone, every process carrying the job's GPUSLICE_JOB_SCOPE; a kill stops them all
    first. No host limits. A process that wipes its environment is found only while its supervisor lives.

    pgroup: no containment (a setsid child escapes and keeps its GPUs); only to measure the others.
    """
    # Imported here: FastAPI and uvicorn take ~1 s to import, which the client commands should not pay.
    from gpuslice.server.models import parse_duration
    from gpuslice.server.run import ServeOptions, check_pids_max, run
    from gpuslice.sim.trace import load_target_workload

    busy_seconds = parse_duration(busy_timeout, "busy-timeout")
    if busy_seconds <= 0:
        raise UserError(f"--busy-timeout {busy_timeout}: use a positive duration, e.g. 2s")
    policy_memory_bytes = _policy_memory(policy_memory)
    _check_names(simulate, sharing, queue_policy, placement)
    state_dir = writable_folder(state_dir or default_state_dir(), "--state-dir")  # before anything is made
    if sharing == "mig":
        _check_mig(simulate)
    from gpuslice.node import containment as contain

    try:
        mode = contain.detect(containment)
    except contain.ContainmentUnavailable as err:
        raise UserError(f"--containment: {err}") from None
    check_pids_max(mode, pids_max)  # before the state folder is made (the server checks again)
    options = ServeOptions(
        state_dir=state_dir,
        host=host,
        port=port,
        simulate=simulate,
        sharing=sharing,
        grace_seconds=parse_duration(grace, "grace"),
        busy_seconds=busy_seconds,
        queue_policy=queue_policy,
        placement=placement,
        target=load_target_workload(target_workload) if target_workload is not None else None,
        public_reads=public_reads,
        allow_hosts=tuple(allow_host or ()),
        containment=mode,
        pids_max=pids_max,
        policy_memory_bytes=policy_memory_bytes,
    )

    def ready(url: str, token_path: Path, sign_in_url: str) -> None:
        _out.print(
            f"gpuslice serve: listening on {url}  (machine: {simulate or 'this one'}, sharing: {sharing})"
        )
        _out.print(f"containment: {mode}: {contain.describe(mode)}")
        _out.print(f"token: {token_path}  (clients read it from there or from GPUSLICE_TOKEN)")
        _out.print(f"dashboard: {sign_in_url}  (works once; it leaves a cookie in your browser)")
        _out.print(
            f"clients: pass --state-dir {options.state_dir} or export GPUSLICE_STATE_DIR={options.state_dir}"
        )
        _out.print(f"look:  {url}/metrics (Prometheus)  gpuslice top --state-dir {options.state_dir}")
        # nvidia-smi only where there is a driver: a simulated machine has none, so the example there
        # is a command that runs anywhere and shows the slice it was given.
        example = (
            "nvidia-smi"
            if simulate is None
            else "python3 -c \"import os; print(os.environ['GPUSLICE_GPU_MEMORY_BYTES'])\""
        )
        _out.print(f"try:   gpuslice submit --state-dir {options.state_dir} --mem 8GiB -- {example}")

    run(options, on_ready=ready)


def _policy_memory(text: str) -> int:
    """--policy-memory in bytes. Below what the worker itself needs every call would fail, so such a
    limit is refused here rather than met as faults later."""
    from gpuslice.programs.guard import MIN_MEMORY_LIMIT_BYTES
    from gpuslice.units import format_size, parse_size

    try:
        limit = parse_size(text)
    except UserError as err:
        raise UserError(f"--policy-memory: {err}") from None
    if limit < MIN_MEMORY_LIMIT_BYTES:
        raise UserError(
            f"--policy-memory {text}: a policy worker needs about {format_size(MIN_MEMORY_LIMIT_BYTES)} of "
            "address space for Python and the policy API alone; give at least that, e.g. 512MiB"
        )
    return limit


def _check_names(simulate: str | None, sharing: str, queue_policy: str, placement: str) -> None:
    """The machine to simulate, the sharing mode and the policies (a name, or a file verified now): the
    server checks them again only once it holds the state folder (its lock, token and URL file made)."""
    from gpuslice.node.discovery import discover
    from gpuslice.node.enforcement import sharing_mode
    from gpuslice.policies import placement_policy
    from gpuslice.policies.queue import queue_policy as queue_lookup
    from gpuslice.programs.loader import resolve

    if simulate:
        discover(simulate)  # a built-in profile and model: no NVML, nothing started
    sharing_mode(sharing, "--sharing")
    resolve(queue_policy, "queue", queue_lookup)
    resolve(placement, "placement", placement_policy)


def _check_mig(simulate: str | None) -> None:
    """``--sharing mig`` needs a GPU in MIG mode; refuse before the state dir is touched otherwise."""
    from gpuslice.node.discovery import discover

    machine = discover(simulate)
    if not any(gpu.mig_enabled for gpu in machine.gpus):
        how = (
            "simulate a MIG machine with ':mig', e.g. --simulate dgx-a100:mig"
            if simulate
            else "turn MIG mode on first (sudo nvidia-smi -i 0 -mig 1)"
        )
        raise UserError(
            f"--sharing mig: no GPU on this machine has MIG mode on; {how}, or use another --sharing"
        )
