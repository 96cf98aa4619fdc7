"""``gpuslice sim replay``: the timed replay of openb traces (arrivals, queue, ends); JCT and waits."""

from __future__ import annotations

import math
from itertools import product
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.options import writable
from gpuslice.cli.progress import WorkProgress, read_timed_trace
from gpuslice.errors import UserError
from gpuslice.hardware.topology_profiles import profile
from gpuslice.inputs import bounded_int
from gpuslice.policies import DEFAULT_PLACEMENT, placement_policy
from gpuslice.programs.loader import resolve
from gpuslice.sim.queue_setups import SETUPS, estimates_for, queue_setup
from gpuslice.sim.timed_metrics import TimedResult, write_timed_results
from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
from gpuslice.sim.timed_trace import every_kth_node, repeat_trace
from gpuslice.sim.trace import DEFAULT_TRACE

__all__ = ["MAX_LOAD", "MAX_REPEAT", "MAX_SEED", "REPLAY_EPILOG", "check_load", "replay"]

MAX_SEED = 2**32 - 1  # numpy's legacy seeds and the artifact's are 32-bit
# A million times the trace's pace plays openb's 145 days in 13 s: more compresses nothing further.
MAX_LOAD = 1e6
# copies of the trace in one stream: the replay keeps one declared run time (8 bytes) per pod, so a
# typo such as 1000000000 would ask for terabytes; 1,000 copies of the bundled trace are ~8 million pods
MAX_REPEAT = 1_000
MAX_NODE_STRIDE = 1_000  # beyond the largest trace's node count: one node left

REPLAY_EPILOG = "Queue setups:\n\n" + "\n\n".join(
    f"{s.name}: queue policy {s.queue}, backfill {'on' if s.backfill else 'off'}, {s.estimate} run times"
    for s in SETUPS.values()
)


def check_load(value: float, option: str = "--load") -> float:
    """A compression factor: a positive, finite number up to MAX_LOAD (UserError otherwise)."""
    if not (math.isfinite(value) and 0 < value <= MAX_LOAD):
        raise UserError(
            f"{option} {value:g}: must be a positive number up to {MAX_LOAD:g} (1 = the trace's own pace)"
        )
    return value


def replay(
    trace: Annotated[
        list[str] | None,
        typer.Option(
            help=f"openb trace with timestamps, repeatable. Default: {DEFAULT_TRACE}.", show_default=False
        ),
    ] = None,
    trace_dir: Annotated[
        Path | None,
        typer.Option(help="Folder of openb CSVs; default: the bundled data.", exists=True, file_okay=False),
    ] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Placement policy or policy file, repeatable. Default: {DEFAULT_PLACEMENT}.",
            show_default=False,
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            help="Queue setup (list below), or a queue policy name or file, repeatable. Default: fair-share.",
            show_default=False,
        ),
    ] = None,
    load: Annotated[
        list[float] | None,
        typer.Option(
            help="Arrival compression, repeatable: arrivals at creation_time / LOAD. Default: 1.",
            show_default=False,
        ),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option(
            help="Play the trace this many times back to back, as a stream: each pod is made when it "
            f"arrives and dropped when it ends (memory stays flat; --repeat 14 is ~100,000 pods); "
            f"1..{MAX_REPEAT:,}.",
        ),
    ] = 1,
    node_stride: Annotated[
        int,
        typer.Option(
            help="Keep every K-th node of the trace's cluster (as `sim tune` does): the same pods on a "
            "smaller cluster, so queues form at a moderate --load.",
        ),
    ] = 1,
    seed: Annotated[
        int, typer.Option(help=f"Seed of the placement policy's randomness, 0..{MAX_SEED:,}.")
    ] = 42,
    out: Annotated[
        Path, typer.Option(help="Folder for results.csv, results.json, plots.", callback=writable)
    ] = Path("results"),
    plot: Annotated[bool, typer.Option(help="Also write a PNG per trace and load.")] = False,
    topology: Annotated[
        str | None,
        typer.Option(
            help="Machine profile (as in `topo show --system`) wired into every node with its GPU count: "
            "multi-GPU pods arriving together there get their GPU sets jointly. Default: no wiring.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Replay pods at their trace times: they wait in serve's queue, run for their recorded duration on the
    Placer's choice, and leave. Censored pods (running at the trace's end) hold GPUs for their recorded part
    and are left out of JCT and wait figures; pods production never started are not replayed."""
    loads = [check_load(x) for x in (load or [1.0])]
    bounded_int(repeat, "--repeat", 1, MAX_REPEAT)
    bounded_int(node_stride, "--node-stride", 1, MAX_NODE_STRIDE)
    bounded_int(seed, "--seed", 0, MAX_SEED)
    if topology is not None:
        profile(topology)  # an unknown name is refused before any replay starts
    setups = [queue_setup(q) for q in (queue or ["fair-share"])]
    policies = policy or [DEFAULT_PLACEMENT]
    for name in policies:  # a bad name or file fails here, before any replay (a file is verified)
        resolve(name, "placement", placement_policy)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file: give a folder for the results")
    console = terminal.console()
    traces = [
        repeat_trace(every_kth_node(read_timed_trace(console, t, trace_dir), node_stride), repeat)
        for t in (trace or [DEFAULT_TRACE])
    ]
    # every declared run time before any replay: a setup that cannot have them is refused first
    estimates = {
        (timed.name, setup.estimate): estimates_for(timed.jobs, setup, seed)
        for timed in traces
        for setup in {s.estimate: s for s in setups}.values()
    }
    runs = list(product(traces, setups, policies, loads))
    results: list[TimedResult] = []
    pods = sum(len(timed.jobs) for timed, *_ in runs)
    with WorkProgress(console, "sim replay", pods, "pods") as progress:
        progress.say(f"sim replay: {len(runs):,} run{'s' * (len(runs) != 1)}, {pods:,} pods")
        done = 0
        for timed, setup, placement, factor in runs:
            progress.describe(f"{timed.name} {placement} {setup.name} load {factor:g}")
            key = (timed.name, setup.estimate)
            config = ReplayConfig(
                placement, setup.queue, setup.backfill, factor, seed, label=setup.name, topology=topology
            )
            base = done
            results.append(
                replay_timed(
                    timed, config, estimates[key], lambda arrived, _, b=base: progress.update(b + arrived)
                )  # type: ignore[arg-type]
            )
            done += len(timed.jobs)
            progress.update(done)
    records = [r.record() for r in results]  # each computes its figures over every pod: once here
    console.print(_table(results, records))
    console.print(
        "alloc %: time-weighted over the busy window, from the first arrival until 99 % of the finished "
        "pods had ended (results.json: busy_window_s; over the whole makespan: mean_allocation_pct)",
        markup=False, highlight=False,
    )  # fmt: skip
    if not any(rec["wait_s"]["all"]["n"] and rec["wait_s"]["all"]["p99"] for rec in records):  # type: ignore[index]
        console.print(
            "No pod waited in any run, so the queue setups cannot differ here: the cluster always had room. "
            "Shrink it with --node-stride (e.g. 20) or raise --load to make queues form.",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
    for r, rec in zip(results, records, strict=True):  # MIG pods: alloc % leaves their GPUs out
        mig = rec.get("mig")
        if mig is not None:
            wait = mig["wait_s"]  # type: ignore[index]
            console.print(
                f"MIG ({r.trace}, {r.placement}, {r.queue}, load {r.load:g}): {mig['pods']:,} pods, "  # type: ignore[index]
                f"{mig['started']:,} started, wait mean {_s(wait['mean'])} s, p99 {_s(wait['p99'])} s",
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
    written = write_timed_results(results, out)
    if plot:
        from gpuslice.sim.timed_plot import write_timed_plots  # matplotlib: only load it when asked

        written += write_timed_plots(results, out)
    for path in written:
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


def _pct(value: object) -> str:
    return "—" if value is None else f"{value:.2f}"


def _s(value: object) -> str:
    return "—" if value is None else f"{value:,.0f}"


# The figure columns: header (two lines, so the table fits 80 columns), and how each row reads it.
_FIGURES = (
    ("JCT\nmean", lambda rec: _s(rec["jct_s"]["all"]["mean"])),
    ("JCT\np99", lambda rec: _s(rec["jct_s"]["all"]["p99"])),
    ("wait\nmean", lambda rec: _s(rec["wait_s"]["all"]["mean"])),
    ("wait\np99", lambda rec: _s(rec["wait_s"]["all"]["p99"])),
    ("trace\nwait", lambda rec: _s(rec["recorded_wait_s"]["all"]["mean"])),
    ("alloc\n%", lambda rec: _pct(rec["busy_allocation_pct"])),
    ("pre-\nempted", lambda rec: f"{rec['preemptions']:,}"),
    ("never\nstarted", lambda rec: f"{rec['never_started']:,}"),
)


def _table(results: list[TimedResult], records: list[dict[str, object]]) -> Table:
    """The runs' figures, one row per run. Columns that hold one value in every row (the trace, the
    policy, often the load) go into the title instead; text may wrap and numbers fold rather than be
    cut, so no digit is lost at any width."""
    keys = {
        "trace": [r.trace for r in results],
        "policy": [r.placement for r in results],
        "queue": [r.queue for r in results],
        "load": [f"{r.load:g}" for r in results],
    }
    varying = [k for k, values in keys.items() if len(set(values)) > 1 or k == "queue"]
    same = [f"{k} {keys[k][0]}" for k in keys if k not in varying and results]
    title = "Timed replay: JCT and queueing delay of finished pods (s); production's recorded wait beside"
    table = Table(
        title=title + (f" ({', '.join(same)})" if same else ""),
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    for header in varying:
        table.add_column(header, overflow="fold")
    for header, _ in _FIGURES:
        table.add_column(header, justify="right", overflow="fold")
    for i, rec in enumerate(records):
        table.add_row(*(keys[k][i] for k in varying), *(read(rec) for _, read in _FIGURES))
    return table
