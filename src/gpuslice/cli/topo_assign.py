"""``gpuslice topo assign``: the joint GPU sets of several waiting jobs on one machine, beside the
one-at-a-time and round-robin placements, with the cost terms and the modelled all-reduce time.

Parses options, loads a ``Topology`` (a short name, a built-in profile, or an ``nvidia-smi topo -m``
file), calls ``assign_batch`` and the two baselines (policies/gpuset/batch*.py), and prints; no decision
is made here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.errors import UserError
from gpuslice.hardware.topology import Topology
from gpuslice.hardware.topology_profiles import PROFILES, profile
from gpuslice.hardware.topology_smi import read_topo_file
from gpuslice.inputs import file_kind
from gpuslice.policies.gpuset.batch import BatchJob, assign_batch
from gpuslice.policies.gpuset.batch_compare import greedy_sets, ring_allreduce_seconds, round_robin_sets

__all__ = ["MACHINES", "assign", "load_machine", "parse_jobs"]

# Short names for the three machines the batch benchmark compares; every built-in profile works too.
MACHINES = {"dgx1": "dgx1-v100", "pcie8": "pcie-8gpu-2socket", "nvswitch8": "dgx-a100"}
MAX_JOBS = 16
ALLREDUCE_BYTES = 1e9  # the message the all-reduce column is modelled for: 1 GB


def load_machine(text: str) -> Topology:
    """A short name, a built-in profile name, or the path of an ``nvidia-smi topo -m`` file."""
    name = MACHINES.get(text, text)
    if name in PROFILES:
        return profile(name)
    path = Path(text)
    if text and file_kind(path) == "file":  # never raises: a name too long is no file either
        return read_topo_file(path)
    known = ", ".join([*MACHINES, *PROFILES])
    raise UserError(f"--machine {text!r} is neither a machine ({known}) nor a readable topology file")


def parse_jobs(text: str, n_gpus: int) -> list[int]:
    """'2,2,4' → [2, 2, 4]: GPU counts of the waiting jobs, each 1…n_gpus, at most MAX_JOBS of them."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or not all(p.isascii() and p.isdigit() and len(p) <= 3 for p in parts):
        raise UserError(f"--jobs {text!r}: give GPU counts separated by commas, e.g. 2,2,4")
    ks = [int(p) for p in parts]
    if len(ks) > MAX_JOBS:
        raise UserError(f"--jobs: at most {MAX_JOBS} jobs at once, got {len(ks)}")
    bad = [k for k in ks if not 1 <= k <= n_gpus]
    if bad:
        raise UserError(f"--jobs: a job asks for {bad[0]} GPUs; this machine has 1–{n_gpus}")
    return ks


def _busy(text: str, n_gpus: int) -> set[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isascii() and p.isdigit() and len(p) <= 3 for p in parts):
        raise UserError(f"--busy {text!r}: give GPU indices separated by commas, e.g. 0,3")
    busy = {int(p) for p in parts}
    if any(g >= n_gpus for g in busy):
        raise UserError(f"--busy names GPU {max(busy)}, but the machine has GPUs 0–{n_gpus - 1}")
    return busy


def _ms(topo: Topology, gpus: tuple[int, ...] | None) -> float | None:
    return None if gpus is None else round(ring_allreduce_seconds(topo, gpus, ALLREDUCE_BYTES) * 1e3, 3)


def _report(topo: Topology, free: list[int], ks: list[int]) -> dict[str, object]:
    jobs = [BatchJob(f"job{i}", k) for i, k in enumerate(ks)]
    batch = assign_batch(topo, free, jobs)
    greedy, rr = greedy_sets(topo, free, ks), round_robin_sets(topo, free, ks)
    rows = []
    for i, (job, s) in enumerate(zip(jobs, batch.sets, strict=True)):
        gpus = None if s is None else s.gpus
        rows.append({
            "job": job.name, "gpus_asked": job.k,
            "batch": list(gpus) if gpus else None, "batch_allreduce_ms": _ms(topo, gpus),
            "latency_hops": s and s.latency, "bandwidth": s and round(s.bandwidth, 4),
            "balance": s and s.balance, "cost": s and s.total, "waits": batch.reasons.get(job.name),
            "greedy": list(greedy[i]) if greedy[i] else None, "greedy_allreduce_ms": _ms(topo, greedy[i]),
            "round_robin": list(rr[i]) if rr[i] else None, "round_robin_allreduce_ms": _ms(topo, rr[i]),
        })  # fmt: skip
    totals = {
        key: round(sum(r[key] or 0.0 for r in rows), 3)  # type: ignore[misc]
        for key in ("batch_allreduce_ms", "greedy_allreduce_ms", "round_robin_allreduce_ms")
    }
    return {"machine": topo.name, "free": free, "jobs": rows, "total": totals, "optimal": batch.optimal}


def _cell(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def assign(
    machine: Annotated[
        str, typer.Option(help=f"{', '.join(MACHINES)}, a built-in profile, or an `nvidia-smi topo -m` file.")
    ],
    jobs: Annotated[str, typer.Option(help="GPU counts of the waiting jobs, in queue order, e.g. 2,2,4.")],
    busy: Annotated[str, typer.Option(help="GPUs already in use, e.g. 0,3.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Assign the waiting --jobs jointly to disjoint GPU sets of --machine (the batch assignment serve
    uses), next to one-at-a-time greedy and round-robin, with the modelled 1 GB ring all-reduce time."""
    topo = load_machine(machine)
    ks = parse_jobs(jobs, topo.n_gpus)
    taken = _busy(busy, topo.n_gpus)
    report = _report(topo, [g for g in range(topo.n_gpus) if g not in taken], ks)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    title = f"{topo.name}: jobs {jobs}, busy {sorted(taken) or 'none'}; ms = modelled 1 GB ring all-reduce"
    # Two-line headers and no outer border keep the table inside 80 columns; a value that still does not
    # fit folds onto the next line, never cut (a GPU list's commas let it wrap where it reads well).
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0))
    columns = ("job", "gpus_asked", "batch", "latency_hops", "bandwidth", "balance", "cost",
               "batch_allreduce_ms", "greedy", "greedy_allreduce_ms", "round_robin",
               "round_robin_allreduce_ms")  # fmt: skip
    headers = ("job", "k", "batch\nGPUs", "hops", "bw", "bal", "cost", "batch\nms", "greedy\nGPUs",
               "greedy\nms", "round-\nrobin", "round-\nrobin ms")  # fmt: skip
    for header in headers:
        left = header in ("job", "batch\nGPUs", "greedy\nGPUs", "round-\nrobin")
        # numbers never wrap (the text columns give way first); text folds
        table.add_column(header, justify="left" if left else "right", overflow="fold", no_wrap=not left)
    rows: list[dict[str, object]] = report["jobs"]  # type: ignore[assignment]
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in columns))
    total: dict[str, float] = report["total"]  # type: ignore[assignment]
    sums = [_cell(total[f"{k}_allreduce_ms"]) for k in ("batch", "greedy", "round_robin")]
    table.add_row("total", *[""] * 6, sums[0], "", sums[1], "", sums[2])
    console = terminal.console()
    console.print(table)
    for row in rows:
        if row["waits"]:
            console.print(f"{row['job']} waits: {row['waits']}", highlight=False)
