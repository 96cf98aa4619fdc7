"""Batch assignment vs one-at-a-time greedy vs round-robin: modelled ring all-reduce time of the jobs.

    .venv/bin/python benchmarks/batch_assign.py                          # 3 machines × 2000 mixes
    .venv/bin/python benchmarks/batch_assign.py --trials 500 --markdown benchmarks/out/batch_assign.md

Per machine (DGX-1 V100 hybrid cube-mesh, an 8-GPU PCIe server on two sockets, an NVSwitch DGX A100)
and per trial (seeded): 0–3 GPUs are already busy (chosen at random), then 2–4 jobs of 2, 3 or 4 GPUs
(probabilities 0.5 / 0.2 / 0.3) wait, as many as fit the free GPUs together, in a random order. Each
method places all of them (they fit together, so each does):

- batch: ``assign_batch`` (policies/gpuset/batch.py, default weights and candidate cut);
- greedy: one job at a time in queue order, each the exact search's best set of what is left (what every
  home does without a batch);
- round-robin: a cursor at a random GPU (where earlier allocations left it) hands out the next k free
  GPU indices, topology-blind.

Figure: the modelled time of one 1 GB ring all-reduce per job, 2(k−1)/k · S / B_min, B_min the bottleneck
link of the best ring through its GPUs (link rates from the machine profiles), summed over the trial's
jobs. Reported: the mean per-job time, the mean and spread (sd, 5th / 95th percentile) over trials of the
reduction against round-robin and against greedy, the share of trials where batch is faster / slower
than greedy, and the solve time of one batch (wall clock on this machine, not a target).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from gpuslice.hardware.topology_profiles import profile
from gpuslice.policies.gpuset.batch import BatchJob, assign_batch
from gpuslice.policies.gpuset.batch_compare import greedy_sets, ring_allreduce_seconds, round_robin_sets

MACHINES = {"dgx1": "dgx1-v100", "pcie8": "pcie-8gpu-2socket", "nvswitch8": "dgx-a100"}
SIZES, SIZE_PROBS = (2, 3, 4), (0.5, 0.2, 0.3)
MESSAGE_BYTES = 1e9


def trial(rng: np.random.Generator, n: int) -> tuple[list[int], list[int], int]:
    """(free GPUs, job sizes in queue order, round-robin cursor) of one mix."""
    busy = set(rng.choice(n, int(rng.integers(0, 4)), replace=False).tolist())
    free = [g for g in range(n) if g not in busy]
    sizes: list[int] = []
    for _ in range(int(rng.integers(2, 5))):
        k = int(rng.choice(SIZES, p=SIZE_PROBS))
        if sum(sizes) + k <= len(free):
            sizes.append(k)
    while len(sizes) < 2:  # two jobs at least: a batch of one is the greedy choice
        sizes.append(2)
        if sum(sizes) > len(free):
            sizes = [2, 2]
    return free, sizes, int(rng.integers(0, n))


def total_ms(topo, sets) -> float:
    assert all(s is not None for s in sets), "every method places every job of a mix that fits"
    return sum(ring_allreduce_seconds(topo, s, MESSAGE_BYTES) for s in sets) * 1e3


def run_machine(name: str, trials: int, seed: int) -> dict[str, float]:
    topo = profile(MACHINES[name])
    rng = np.random.default_rng(seed)
    rows, solve = [], []
    for _ in range(trials):
        free, sizes, cursor = trial(rng, topo.n_gpus)
        t0 = time.perf_counter()
        batch = assign_batch(topo, free, [BatchJob(str(i), k) for i, k in enumerate(sizes)])
        solve.append(time.perf_counter() - t0)
        given = [g for s in batch.sets if s is not None for g in s.gpus]
        assert len(given) == len(set(given)), "a GPU given twice"
        b = total_ms(topo, [s.gpus if s else None for s in batch.sets])
        g = total_ms(topo, greedy_sets(topo, free, sizes))
        r = total_ms(topo, round_robin_sets(topo, free, sizes, cursor))
        rows.append((b, g, r, len(sizes)))
    a = np.array(rows)
    jobs = a[:, 3].sum()
    vs_rr = 1 - a[:, 0] / a[:, 2]
    vs_greedy = 1 - a[:, 0] / a[:, 1]
    greedy_vs_rr = 1 - a[:, 1] / a[:, 2]
    return {
        "batch_ms": a[:, 0].sum() / jobs,
        "greedy_ms": a[:, 1].sum() / jobs,
        "rr_ms": a[:, 2].sum() / jobs,
        "vs_rr_mean": 100 * vs_rr.mean(),
        "vs_rr_sd": 100 * vs_rr.std(),
        "vs_rr_p5": 100 * np.percentile(vs_rr, 5),
        "vs_rr_p95": 100 * np.percentile(vs_rr, 95),
        "greedy_vs_rr_mean": 100 * greedy_vs_rr.mean(),
        "vs_greedy_mean": 100 * vs_greedy.mean(),
        "vs_greedy_sd": 100 * vs_greedy.std(),
        "faster_than_greedy": 100 * float((a[:, 0] < a[:, 1] - 1e-9).mean()),
        "slower_than_greedy": 100 * float((a[:, 0] > a[:, 1] + 1e-9).mean()),
        "rr_share_40": 100 * float((vs_rr >= 0.40).mean()),
        "solve_us": 1e6 * float(np.median(solve)),
        "solve_us_max": 1e6 * float(np.max(solve)),
    }


def markdown(results: dict[str, dict[str, float]], trials: int, seed: int) -> str:
    head = (
        f"{trials} mixes per machine, seed {seed}; per-job ms = modelled 1 GB ring all-reduce\n\n"
        "| machine | batch ms/job | greedy ms/job | round-robin ms/job | batch vs RR: mean ± sd (p5…p95) "
        "| greedy vs RR | batch vs greedy: mean ± sd | faster / slower than greedy | mixes ≥ 40 % below RR "
        "| solve µs (median / max) |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
    )
    lines = []
    for name, r in results.items():
        lines.append(
            f"| {name} ({MACHINES[name]}) | {r['batch_ms']:.2f} | {r['greedy_ms']:.2f} | {r['rr_ms']:.2f} "
            f"| {r['vs_rr_mean']:+.1f} % ± {r['vs_rr_sd']:.1f} ({r['vs_rr_p5']:+.1f}…{r['vs_rr_p95']:+.1f}) "
            f"| {r['greedy_vs_rr_mean']:+.1f} % | {r['vs_greedy_mean']:+.1f} % ± {r['vs_greedy_sd']:.1f} "
            f"| {r['faster_than_greedy']:.1f} % / {r['slower_than_greedy']:.1f} % | {r['rr_share_40']:.1f} % "
            f"| {r['solve_us']:.0f} / {r['solve_us_max']:.0f} |"
        )
    note = "(reductions: positive = less all-reduce time than the other method)"
    return head + "\n".join(lines) + f"\n\n{note}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    results = {name: run_machine(name, args.trials, args.seed) for name in MACHINES}
    text = markdown(results, args.trials, args.seed)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
