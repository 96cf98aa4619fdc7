"""``gpuslice topo``: show a machine's GPU topology, and pick the GPUs a multi-GPU job would get.

Parses options, loads a ``Topology`` (built-in profile, ``nvidia-smi topo -m`` file, or NVML), calls one
GPU-set policy, and prints rich tables. No decision is made here (DESIGN.md: entry points present).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.topo_assign import assign
from gpuslice.errors import UserError
from gpuslice.hardware.topology import LinkType, Topology
from gpuslice.hardware.topology_nvml import read_nvml_topology
from gpuslice.hardware.topology_profiles import PROFILES, profile
from gpuslice.hardware.topology_smi import read_topo_file
from gpuslice.policies.gpuset import GPUSET, make_gpuset_policy
from gpuslice.policies.gpuset.base import check_gpu_set_request
from gpuslice.policies.gpuset.pick import pick_gpu_set
from gpuslice.workload.job import TopologyNeed

__all__ = ["app", "parse_gpu_list", "pick", "show"]

app = typer.Typer(
    help="GPU topology of one machine: link matrix, NVLink groups, bandwidth, best GPU sets.",
    no_args_is_help=True,
)

_SYSTEMS = ", ".join(PROFILES)
_POLICIES = ", ".join(GPUSET)
_STYLE = {
    LinkType.NVLINK: "green",
    LinkType.NVSWITCH: "green",
    LinkType.PIX: "cyan",
    LinkType.PXB: "cyan",
    LinkType.PHB: "yellow",
    LinkType.NODE: "yellow",
    LinkType.SYS: "red",
    LinkType.SELF: "dim",
}


def parse_gpu_list(text: str) -> list[int]:
    """'0,3' → [0, 3]; '' → []; UserError names the input otherwise."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        raise UserError(f"invalid GPU list {text!r}: use GPU indices separated by commas, e.g. 0,3")
    return [int(p) for p in parts]


def _load(system: str | None, from_file: Path | None, local: bool) -> Topology:
    chosen = [x for x in (system is not None, from_file is not None, local) if x]
    if len(chosen) != 1:
        raise UserError("give exactly one of --simulate NAME, --from-file FILE or --local")
    if from_file is not None:
        return read_topo_file(from_file)
    if local:
        return read_nvml_topology()
    assert system is not None
    return profile(system)


def _gbps(value: float) -> str:
    return "—" if math.isinf(value) else f"{value:g}"


def _tables(topo: Topology) -> list[Table]:
    n = topo.n_gpus
    gpus = [f"GPU{i}" for i in range(n)]
    links = Table(title=f"{topo.name}: links ({'NVSwitch' if topo.nvswitch else 'no NVSwitch'})")
    bandwidth = Table(title="pair bandwidth, GB/s per direction")
    for table in (links, bandwidth):
        table.add_column("")
        for g in gpus:
            table.add_column(g, justify="center")
    links.add_column("NUMA", justify="right")
    links.add_column("CPU affinity")
    bw = topo.pair_bandwidth_gbps()
    for i in range(n):
        cells = [f"[{_STYLE[topo.link(i, j)]}]{topo.label(i, j)}[/]" for j in range(n)]
        numa = str(topo.numa[i]) if topo.numa[i] >= 0 else "?"
        links.add_row(gpus[i], *cells, numa, escape(topo.cpu_affinity[i] or "?"))
        bandwidth.add_row(gpus[i], *(_gbps(float(bw[i, j])) for j in range(n)))
    groups = Table(title="NVLink groups")
    groups.add_column("group", justify="right")
    groups.add_column("GPUs")
    for k, members in enumerate(topo.nvlink_groups()):
        groups.add_row(str(k), ", ".join(map(str, members)) + ("" if len(members) > 1 else " (no NVLink)"))
    return [links, groups, bandwidth]


@app.command()
def show(
    system: Annotated[
        str | None, typer.Option("--simulate", "--system", help=f"Built-in machine: {_SYSTEMS}.")
    ] = None,
    from_file: Annotated[
        Path | None, typer.Option(help="Saved output of `nvidia-smi topo -m`.", dir_okay=False)
    ] = None,
    local: Annotated[bool, typer.Option(help="Read this machine through NVML (needs nvidia-ml-py).")] = False,
) -> None:
    """Print the link matrix, NVLink groups and pair bandwidth of one machine."""
    topo = _load(system, from_file, local)
    console = terminal.console()
    for table in _tables(topo):
        console.print(table)
    if topo.source:
        console.print(f"source: {escape(topo.source)}", highlight=False)


@app.command()
def pick(
    system: Annotated[str, typer.Option("--simulate", "--system", help=f"Built-in machine: {_SYSTEMS}.")],
    gpus: Annotated[int, typer.Option(min=1, help="How many GPUs the job needs.")],
    busy: Annotated[str, typer.Option(help="GPUs already in use, e.g. 0,3.")] = "",
    policy: Annotated[str, typer.Option(help=f"GPU-set policy: {_POLICIES}.")] = "exact",
    need: Annotated[
        TopologyNeed,
        typer.Option(
            help="how the GPUs must be connected: any, nvlink (every pair), pcie-switch (every pair behind "
            "one PCIe switch or NVLink); with a need the exact ranking chooses among the sets that meet it"
        ),
    ] = TopologyNeed.ANY,
) -> None:
    """Choose the GPUs a job asking for --gpus would get on --simulate with --busy GPUs taken: the same
    choice serve, the Kubernetes extender and the device plugin make."""
    topo = profile(system)
    taken = parse_gpu_list(busy)
    unknown = [g for g in taken if g >= topo.n_gpus]
    if unknown:
        raise UserError(f"--busy names GPU {unknown[0]}, but {system} has GPUs 0–{topo.n_gpus - 1}")
    free = [g for g in range(topo.n_gpus) if g not in taken]
    gpuset = make_gpuset_policy(policy)
    check_gpu_set_request(topo, free, gpus)
    chosen = pick_gpu_set(topo, free, gpus, need=need, policy=gpuset)
    if chosen is None:
        raise UserError(
            f"no {gpus} of the free GPUs of {system} ({', '.join(map(str, free))}) meet --need {need.value}"
        )
    title = f"{system}: {gpus} GPU(s), busy {taken or 'none'}, policy {policy}"
    table = Table(title=title + (f", need {need.value}" if need is not TopologyNeed.ANY else ""))
    for column in ("GPUs", "ring GB/s", "hop cost", "links inside the set"):
        table.add_column(column)
    inner = sorted({topo.label(a, b) for a in chosen for b in chosen if a < b})
    table.add_row(
        ", ".join(map(str, chosen)),
        _gbps(topo.ring_bandwidth(chosen)),
        f"{topo.hop_cost(chosen):g}",
        ", ".join(inner) or "—",
    )
    terminal.console().print(table)


app.command("assign")(assign)
