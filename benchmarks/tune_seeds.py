"""`gpuslice tune`'s held-out improvement over the default parameters, over several sampler seeds.

Runs `gpuslice tune --seed S` once per seed (further arguments, e.g. `--train`/`--holdout` windows, go
to `gpuslice tune` unchanged) and prints each seed's training score (defaults → best), its held-out
improvement on each held-out window and on their mean, and its wall time; then the improvement's mean
and standard deviation over the seeds, the per-window improvements over all seeds, and how much the
defaults' own score varies from one held-out window to the next (the yardstick for "beyond noise").

    python benchmarks/tune_seeds.py --seeds 0 1 2 --trials 30 --objective mean-jct \\
        --trace-dir /work/shared/data/openb --train default@1 --train default@3 --train gpushare100@1 \\
        --holdout default@2 --holdout default@4 --holdout default@6 --holdout gpushare40@2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--objective", default="mean-jct")
    args, extra = parser.parse_known_args()
    gains: list[float] = []
    per_window: dict[str, list[float]] = {}
    defaults: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            out = Path(tmp) / f"seed{seed}.py"
            start = time.perf_counter()
            command = [str(Path(sys.executable).with_name("gpuslice")), "tune", "--seed", str(seed)]
            command += ["--trials", str(args.trials), "--objective", args.objective, "--out", str(out)]
            subprocess.run([*command, *extra], check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            summary = json.loads(out.with_name(out.name + ".json").read_text())
            gains.append(summary["holdout_improvement_pct"])
            windows = ", ".join(
                f"{w['window']} {w['defaults']:.1f}→{w['best']:.1f} ({w['improvement_pct']:+.2f} %)"
                for w in summary["holdout_windows"]
            )
            for w in summary["holdout_windows"]:
                per_window.setdefault(w["window"], []).append(w["improvement_pct"])
                defaults[w["window"]] = w["defaults"]
            print(
                f"seed {seed}: train {summary['train_defaults']:.1f}→{summary['train_best']:.1f}; "
                f"held-out {windows}; mean {summary['holdout_defaults']:.1f}→{summary['holdout_best']:.1f} "
                f"({gains[-1]:+.2f} %); {wall:.0f} s; best {json.dumps(summary['best'])}",
                flush=True,
            )
    mean, sd = statistics.mean(gains), _sd(gains)
    print(f"held-out improvement over {len(gains)} seeds: mean {mean:+.2f} %, sd {sd:.2f} %")
    every = [g for values in per_window.values() for g in values]
    for window, values in per_window.items():
        mean, sd = statistics.mean(values), _sd(values)
        print(f"  {window}: defaults {defaults[window]:.1f}, improvement {mean:+.2f} % ± {sd:.2f}")
    mean, sd = statistics.mean(every), _sd(every)
    print(f"  all (seed, window) pairs: {mean:+.2f} % ± {sd:.2f} (n = {len(every)})")
    spread = _sd(list(defaults.values())) / statistics.mean(defaults.values()) * 100
    print(f"  defaults across held-out windows: sd {spread:.1f} % of their mean")


if __name__ == "__main__":
    main()
