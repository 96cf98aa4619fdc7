"""`gpuslice tune`'s held-out improvement over the default parameters, over several sampler seeds.

Runs `gpuslice tune --seed S` once per seed (its default split: window 1 of the default trace to
train, window 2 held out) and prints each seed's held-out score of the defaults and of the best
parameters, then the improvement's mean and standard deviation over the seeds.

    python benchmarks/tune_seeds.py --seeds 0 1 2 --trials 12 --objective mean-jct
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--objective", default="mean-jct")
    args, extra = parser.parse_known_args()
    gains = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            out = Path(tmp) / f"seed{seed}.py"
            start = time.perf_counter()
            command = [str(Path(sys.executable).with_name("gpuslice")), "tune", "--seed", str(seed)]
            command += [
                "--trials",
                str(args.trials),
                "--objective",
                args.objective,
                "--out",
                str(out),
                *extra,
            ]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            summary = json.loads(out.with_name(out.name + ".json").read_text())
            gains.append(summary["holdout_improvement_pct"])
            print(
                f"seed {seed}: held-out {args.objective} defaults {summary['holdout_defaults']:.1f} "
                f"best {summary['holdout_best']:.1f} ({gains[-1]:+.2f} %), "
                f"train best {summary['train_best']:.1f},"
                f" {wall:.0f} s, best {json.dumps(summary['best'])}",
                flush=True,
            )
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    print(f"improvement over {len(gains)} seeds: mean {statistics.mean(gains):+.2f} %, sd {spread:.2f} %")


if __name__ == "__main__":
    main()
