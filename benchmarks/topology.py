"""Multi-GPU set choice on real machine topologies: ours (exact) vs besteffort vs HAMi vs random.

    .venv/bin/python benchmarks/topology.py                     # 6 profiles × 4 policies × 5 seeds
    .venv/bin/python benchmarks/topology.py --markdown benchmarks/out/topology.md

For every built-in profile and seed, one random stream of jobs arrives (Poisson; sizes 1/2/4/8 GPUs with
probabilities 0.4/0.3/0.2/0.1, sizes larger than the machine dropped; exponential run times, mean 1;
offered load ``--load`` × the machine's GPUs). A job that finds fewer free GPUs than it asks for is
rejected (no queue), so every policy sees the same jobs arrive and leave; only which GPUs they get
differs. Per policy we report, over the multi-GPU jobs: the mean and 5th percentile of the ring
bandwidth each got (GB/s per direction, the slowest link of the best ring through its GPUs, as modelled),
the accepted jobs, and the share of decisions that matched the exhaustive optimum, the best ring
bandwidth any k free GPUs offered at that moment, recomputed here by brute force over every set and
every ring order (independent of ``Topology.ring_bandwidth``).
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import time
from dataclasses import dataclass, field
from itertools import combinations, permutations
from pathlib import Path

import numpy as np
from rich.progress import Progress

from gpuslice.hardware.topology import Topology
from gpuslice.hardware.topology_profiles import PROFILES
from gpuslice.policies.gpuset import GPUSET, choose_gpu_set, make_gpuset_policy

SIZES = (1, 2, 4, 8)
SIZE_PROBS = (0.4, 0.3, 0.2, 0.1)
POLICIES = ("exact", "besteffort", "hami", "random")
_TOL = 1e-9


@dataclass(frozen=True)
class Job:
    arrival: float
    duration: float
    gpus: int


def job_stream(n_gpus: int, n_jobs: int, load: float, seed: int) -> list[Job]:
    """Poisson arrivals with offered load ``load`` × n_gpus busy GPUs on average (before rejections)."""
    rng = np.random.default_rng(seed)
    sizes = np.array([s for s in SIZES if s <= n_gpus])
    probs = np.array([p for s, p in zip(SIZES, SIZE_PROBS, strict=True) if s <= n_gpus])
    probs /= probs.sum()
    rate = load * n_gpus / float(sizes @ probs)  # arrivals per unit time, mean run time 1
    gaps = rng.exponential(1 / rate, n_jobs)
    return [
        Job(float(t), float(d), int(s))
        for t, d, s in zip(np.cumsum(gaps), rng.exponential(1.0, n_jobs), rng.choice(sizes, n_jobs, p=probs),
                           strict=True)
    ]


class BruteForce:
    """The exhaustive optimum: every k-set of the free GPUs, every ring order through it."""

    def __init__(self, topology: Topology) -> None:
        self.bw = topology.pair_bandwidth_gbps()
        self._ring: dict[tuple[int, ...], float] = {}

    def ring(self, gpus: tuple[int, ...]) -> float:
        if gpus not in self._ring:
            if len(gpus) == 2:
                value = float(self.bw[gpus[0], gpus[1]])
            else:
                first, rest = gpus[0], gpus[1:]
                value = max(
                    min(self.bw[a, b] for a, b in zip((first, *order), (*order, first), strict=True))
                    for order in permutations(rest)
                )
            self._ring[gpus] = float(value)
        return self._ring[gpus]

    def best(self, free: tuple[int, ...], k: int) -> float:
        return max(self.ring(c) for c in combinations(free, k))


@dataclass
class Outcome:
    accepted: int = 0
    bandwidth: list[float] = field(default_factory=list)  # per accepted multi-GPU job
    at_optimum: int = 0
    seconds: float = 0.0
    stream_means: list[float] = field(default_factory=list)  # one per seed


def replay(topology: Topology, jobs: list[Job], policy_name: str, seed: int, oracle: BruteForce) -> Outcome:
    policy = make_gpuset_policy(policy_name, seed)
    free = set(range(topology.n_gpus))
    running: list[tuple[float, tuple[int, ...]]] = []
    out = Outcome()
    for job in jobs:
        while running and running[0][0] <= job.arrival:
            free.update(heapq.heappop(running)[1])
        if job.gpus > len(free):
            continue
        start = time.perf_counter()
        choice = choose_gpu_set(policy, topology, sorted(free), job.gpus)
        out.seconds += time.perf_counter() - start
        assert choice.fallback is None, (policy_name, choice.fallback)
        if job.gpus >= 2:
            got = oracle.ring(choice.gpus)
            out.bandwidth.append(got)
            out.at_optimum += got >= oracle.best(tuple(sorted(free)), job.gpus) - _TOL
        free.difference_update(choice.gpus)
        heapq.heappush(running, (job.arrival + job.duration, choice.gpus))
        out.accepted += 1
    return out


def run(n_jobs: int, seeds: list[int], load: float) -> tuple[list[dict], list[str]]:
    rows: list[dict] = []
    with Progress() as progress:
        task = progress.add_task("replaying", total=len(PROFILES) * len(seeds) * len(POLICIES))
        for name, topology in PROFILES.items():
            oracle = BruteForce(topology)
            merged = {p: Outcome() for p in POLICIES}
            for seed in seeds:
                jobs = job_stream(topology.n_gpus, n_jobs, load, seed)
                for policy in POLICIES:
                    progress.update(task, description=f"{name} seed {seed} {policy}")
                    o = replay(topology, jobs, policy, seed, oracle)
                    m = merged[policy]
                    m.accepted += o.accepted
                    m.bandwidth += o.bandwidth
                    m.at_optimum += o.at_optimum
                    m.seconds += o.seconds
                    m.stream_means.append(float(np.mean(o.bandwidth)) if o.bandwidth else math.nan)
                    progress.advance(task)
            for policy, m in merged.items():
                bw = np.array(m.bandwidth)
                rows.append({
                    "profile": name,
                    "nvswitch": topology.nvswitch,
                    "policy": policy,
                    "accepted": m.accepted,
                    "multi": len(bw),
                    "mean": float(bw.mean()) if len(bw) else math.nan,
                    "p5": float(np.percentile(bw, 5)) if len(bw) else math.nan,
                    "optimum_pct": 100.0 * m.at_optimum / max(len(bw), 1),
                    "us_per_decision": 1e6 * m.seconds / max(m.accepted, 1),
                    "stream_means": m.stream_means,
                })
    return rows, acceptance(rows)


def acceptance(rows: list[dict]) -> list[str]:
    """The acceptance points of multi-GPU selection, checked on the numbers just produced."""
    by = {(r["profile"], r["policy"]): r for r in rows}
    lines, strictly_better = [], []
    for profile in dict.fromkeys(r["profile"] for r in rows):
        ours, be = by[(profile, "exact")], by[(profile, "besteffort")]
        verdict = "PASS" if ours["mean"] >= be["mean"] - _TOL else "FAIL"
        pairs = list(zip(ours["stream_means"], be["stream_means"], strict=True))
        worse = sum(o < b - _TOL for o, b in pairs)
        better = sum(o > b + _TOL for o, b in pairs)
        lines.append(
            f"- {profile}: ours {ours['mean']:.2f} vs besteffort {be['mean']:.2f} GB/s mean → {verdict} "
            f"(never worse); per stream better in {better}, worse in {worse} of {len(pairs)}; "
            f"ours at the per-decision optimum in {ours['optimum_pct']:.1f} % of decisions"
        )
        if not ours["nvswitch"] and ours["mean"] > be["mean"] + _TOL:
            strictly_better.append(profile)
    lines.append(
        "- strictly better than besteffort on an NVSwitch-free profile: "
        + (", ".join(strictly_better) if strictly_better else "NONE (FAIL)")
    )
    return lines


def markdown(rows: list[dict], checks: list[str], command: str, n_jobs: int, seeds: list[int],
             load: float) -> str:
    head = (
        f"Command: `{command}`\n\n"
        f"{n_jobs} job arrivals per stream, seeds {seeds[0]}–{seeds[-1]}, offered load {load} × GPUs; "
        "bandwidth = ring bottleneck in GB/s per direction over accepted multi-GPU jobs.\n\n"
        "| profile | policy | accepted jobs | multi-GPU jobs | mean GB/s | p5 GB/s | vs besteffort | "
        "at optimum | µs/decision |\n|---|---|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    by = {(r["profile"], r["policy"]): r for r in rows}
    body = []
    for r in rows:
        be = by[(r["profile"], "besteffort")]["mean"]
        delta = 100 * (r["mean"] / be - 1) if be else math.nan
        body.append(
            f"| {r['profile']} | {r['policy']} | {r['accepted']} | {r['multi']} | {r['mean']:.2f} | "
            f"{r['p5']:.2f} | {delta:+.1f} % | {r['optimum_pct']:.1f} % | {r['us_per_decision']:.0f} |"
        )
    return head + "\n".join(body) + "\n\nAcceptance:\n\n" + "\n".join(checks) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="job arrivals per stream")
    parser.add_argument("--seeds", type=int, default=5, help="streams per profile (seeds 0…N−1)")
    parser.add_argument("--load", type=float, default=0.9, help="offered load, × the machine's GPUs")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args()
    assert set(POLICIES) <= set(GPUSET)
    seeds = list(range(args.seeds))
    rows, checks = run(args.jobs, seeds, args.load)
    command = "python benchmarks/topology.py " + " ".join(sys.argv[1:])
    text = markdown(rows, checks, command.strip(), args.jobs, seeds, args.load)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
