"""MIG placement benchmark: keep-largest vs HAMi's first-free (and lowest-free) vs the exhaustive optimum.

Streams (fixed seeds 0..N-1, ``random.Random(seed)``): each event is, with probability ``depart``, the
departure of a uniformly chosen live request, otherwise the arrival of a new request for one profile
drawn from the mix. Mixes: ``uniform`` over the five sharing shapes (1g, 1g with 2x memory, 2g, 3g, 4g;
no 7g — that is a whole GPU — and no ``+me``); ``small-heavy`` weights them 4:2:2:1:1. Departures
refer to request ids, so they are the same for every policy (a rejected request's departure is a no-op).

Metrics per stream (``benchmarks/mig_stream.py``): requests accepted before the first rejection,
total requests accepted. Acceptance is forced: a request that fits somewhere is accepted.
Optimum (short streams only): for each metric on its own, the maximum over every placement choice at
every accepted arrival, found by depth-first search with memoisation on (event index, live instances).

Usage: ``.venv/bin/python benchmarks/mig.py [--seeds 500] [--markdown benchmarks/out/mig.md]``
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpuslice.hardware.mig import MigGpu, mig_gpu
from gpuslice.policies.mig_placement import mig_placement_policy
from mig_stream import Arrive, Depart, Event, optimum, replay

POLICIES = ("keep-largest", "first-free", "lowest-free")
MIXES: dict[str, dict[str, int]] = {
    "uniform": {"1g": 1, "1g.2x": 1, "2g": 1, "3g": 1, "4g": 1},
    "small-heavy": {"1g": 4, "1g.2x": 2, "2g": 2, "3g": 1, "4g": 1},
}


@dataclass(frozen=True)
class StreamKind:
    name: str
    events: int
    depart: float
    exhaustive: bool


KINDS = (
    StreamKind("short, arrivals only (10)", 10, 0.0, True),
    StreamKind("short, departures (16, p=0.3)", 16, 0.3, True),
    StreamKind("long, departures (80, p=0.4)", 80, 0.4, False),
)


def _shape(profile_name: str, gpu: MigGpu) -> str:
    p = gpu.profile(profile_name)
    return "1g.2x" if p.compute_slices == 1 and p.memory_slices == 2 else profile_name.split(".")[0]


def make_stream(gpu: MigGpu, seed: int, kind: StreamKind, mix: dict[str, int]) -> list[Event]:
    rng = random.Random(seed)
    profiles = [p for p in gpu.profiles if not p.media_extensions and p.compute_slices < 7]
    weights = [mix[_shape(p.name, gpu)] for p in profiles]
    events: list[Event] = []
    live: list[int] = []
    for rid in range(kind.events):
        if live and rng.random() < kind.depart:
            events.append(Depart(live.pop(rng.randrange(len(live)))))
        else:
            events.append(Arrive(rid, (rng.choices(profiles, weights)[0],)))
            live.append(rid)
    return events


@dataclass
class Row:
    gpu: str
    kind: str
    mix: str
    streams: int
    before: dict[str, float]  # mean accepted before first rejection, per policy (+ "optimum")
    total: dict[str, float]
    match_before: dict[str, float]  # % streams equal to the optimum
    match_total: dict[str, float]
    vs_ff_before: tuple[int, int, int]  # keep-largest vs first-free per stream: wins, ties, losses
    vs_ff_total: tuple[int, int, int]


def _wtl(a: list[int], b: list[int]) -> tuple[int, int, int]:
    return (
        sum(x > y for x, y in zip(a, b, strict=True)),
        sum(x == y for x, y in zip(a, b, strict=True)),
        sum(x < y for x, y in zip(a, b, strict=True)),
    )


def run(seeds: int, progress: Progress) -> list[Row]:
    rows = []
    configs = [(g, k, m) for g in ("a100-80gb", "h100-80gb") for k in KINDS for m in MIXES]
    task = progress.add_task("MIG streams", total=len(configs) * seeds)
    for gpu_key, kind, mix in configs:
        gpu = mig_gpu(gpu_key)
        before: dict[str, list[int]] = {p: [] for p in (*POLICIES, "optimum")}
        total: dict[str, list[int]] = {p: [] for p in (*POLICIES, "optimum")}
        for seed in range(seeds):
            events = make_stream(gpu, seed, kind, MIXES[mix])
            for name in POLICIES:
                r = replay(gpu, events, mig_placement_policy(name)())
                before[name].append(r.accepted_before_first_rejection)
                total[name].append(r.accepted)
            if kind.exhaustive:
                ob, ot = optimum(gpu, events)
                before["optimum"].append(ob)
                total["optimum"].append(ot)
            progress.update(task, advance=1, description=f"{gpu_key} {kind.name} {mix}")
        names = (*POLICIES, "optimum") if kind.exhaustive else POLICIES

        def pct(series: dict[str, list[int]], p: str, exhaustive: bool = kind.exhaustive) -> float:
            if not exhaustive:
                return float("nan")
            return 100 * sum(x == o for x, o in zip(series[p], series["optimum"], strict=True)) / seeds

        rows.append(
            Row(
                gpu_key,
                kind.name,
                mix,
                seeds,
                {p: sum(before[p]) / seeds for p in names},
                {p: sum(total[p]) / seeds for p in names},
                {p: pct(before, p) for p in POLICIES},
                {p: pct(total, p) for p in POLICIES},
                _wtl(before["keep-largest"], before["first-free"]),
                _wtl(total["keep-largest"], total["first-free"]),
            )
        )
    return rows


def markdown(rows: list[Row], seeds: int) -> str:
    def f(x: float, digits: int = 2) -> str:
        return "–" if x != x else f"{x:.{digits}f}"

    head = (
        "| GPU | stream | mix | metric | keep-largest | first-free | lowest-free | optimum "
        "| keep-largest = opt % | first-free = opt % | keep-largest vs first-free W/T/L |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        for metric, means, match, wtl in (
            ("before 1st rejection", r.before, r.match_before, r.vs_ff_before),
            ("total accepted", r.total, r.match_total, r.vs_ff_total),
        ):
            keep, ff = "keep-largest", "first-free"
            lines.append(
                f"| {r.gpu} | {r.kind} | {r.mix} | {metric} | {f(means[keep])} | {f(means[ff])} "
                f"| {f(means['lowest-free'])} | {f(means.get('optimum', float('nan')))} "
                f"| {f(match[keep], 1)} | {f(match[ff], 1)} | {wtl[0]}/{wtl[1]}/{wtl[2]} |"
            )
    note = (
        f"\nMeans over {seeds} streams per row (seeds 0–{seeds - 1}); W/T/L counts streams where "
        "keep-largest accepted more / the same / fewer than first-free. "
        "Optimum: exhaustive search (short streams only).\n"
    )
    return head + "\n".join(lines) + "\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=500, help="streams per row (seeds 0..N-1)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True) as progress:
        rows = run(args.seeds, progress)
    text = markdown(rows, args.seeds)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
