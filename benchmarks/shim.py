"""Native shim overhead and compute-share accuracy, against the fake CUDA driver (no GPU needed).

Builds the fake libcuda.so.1 (native/shim/fake) and benchmarks/shim_bench.c into benchmarks/out/shim/,
then runs the load with and without the installed shim (gpuslice.shim.library_path()):

  1. ns per cuMemAlloc_v2 + cuMemFree_v2 pair (1 MiB), without the shim and with it (a 1 GiB slice);
  2. ns per empty cuLaunchKernel: without the shim, share 100 % (counted, not throttled), share 50 %
     (two events recorded around each launch and the token bucket); 1 and 2 are medians of 3 runs;
  3. achieved compute share against 10/30/50/100 % over a 5 s loop of 1 ms kernels: the time the fake
     GPU spent running this job's kernels over the wall time;
  4. a high-priority job's launch delay (p50/p99 over 200 1 ms kernels, 10 ms apart) alone and beside
     a low-priority job that launches back to back, and the low job's share meanwhile.

The fake driver runs a kernel as a sleep in the launching thread, so "GPU time" here is the kernels'
measured run time (sleep overshoot included, on both sides of the comparison). Writes
benchmarks/out/shim.md (the table for RESULTS.md).

    .venv/bin/python benchmarks/shim.py
    .venv/bin/python benchmarks/shim.py --seconds 2 --repeat 100000     # quicker
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

from gpuslice.shim import library_path
from gpuslice.shim.build import build_fake_driver, compiler

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "shim"
TARGETS = (10, 30, 50, 100)


def build() -> Path:
    fake = OUT / "fake"
    build_fake_driver(HERE.parent / "native" / "shim", fake)
    program = OUT / "shim_bench"
    command = [*compiler(), "-std=gnu11", "-O2", "-o", str(program), str(HERE / "shim_bench.c")]
    subprocess.run([*command, f"-L{fake}", "-l:libcuda.so.1"], check=True)
    return program


def job_env(job: str, shim: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_")}
    env["LD_LIBRARY_PATH"] = str(OUT / "fake")
    if shim:
        regions = OUT / "regions"
        regions.mkdir(exist_ok=True)
        (regions / f"{job}.region").unlink(missing_ok=True)
        env.update(
            LD_PRELOAD=str(library_path()),
            GPUSLICE_SHIM_DIR=str(regions),
            GPUSLICE_JOB_ID=job,
            GPUSLICE_GPU_MEMORY_BYTES=str(1 << 30),
            GPUSLICE_GPUS="0",
            **extra,
        )
    return env


def run(program: Path, args: list[str], env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run([str(program), *args], env=env, capture_output=True, text=True, check=True)
    return {k: float(v) for k, v in (line.split() for line in done.stdout.splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each share run (default 5)")
    parser.add_argument("--repeat", type=int, default=500_000, help="calls per overhead figure")
    args = parser.parse_args()
    program = build()
    lines = [f"`.venv/bin/python benchmarks/shim.py` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"load average before: {os.getloadavg()[0]:.2f}", ""]  # fmt: skip

    n = str(args.repeat)
    lines += ["| call (median of 3 runs, alternating) | without shim | with shim | added |"]
    lines += ["|---|---:|---:|---:|"]
    cases = [
        ("cuMemAlloc_v2 + cuMemFree_v2 (1 MiB)", ["alloc", n, str(1 << 20)], {}),
        ("cuLaunchKernel, share 100 % (counted)", ["launch", n], {"GPUSLICE_COMPUTE_PERCENT": "100"}),
        ("cuLaunchKernel, share 50 % (events, bucket)", ["launch", n], {"GPUSLICE_COMPUTE_PERCENT": "50"}),
    ]
    for label, command, extra in cases:
        plain, shimmed = [], []
        for _ in range(3):
            plain.append(run(program, command, job_env("overhead", False))["ns_per_op"])
            shimmed.append(run(program, command, job_env("overhead", True, **extra))["ns_per_op"])
        a, b = statistics.median(plain), statistics.median(shimmed)
        lines.append(f"| {label} | {a:.0f} ns | {b:.0f} ns | {b - a:+.0f} ns |")

    header = f"| target share | achieved ({args.seconds:g} s of 1 ms kernels) | error |"
    lines += ["", header, "|---:|---:|---:|"]
    for target in TARGETS:
        env = job_env(f"share{target}", True, GPUSLICE_COMPUTE_PERCENT=str(target))
        achieved = run(program, ["loop", str(args.seconds), "1000"], env)["share"] * 100
        lines.append(f"| {target} % | {achieved:.1f} % | {achieved - target:+.1f} points |")

    probe = ["probe", "200", "1000", "10000"]
    high_env = job_env("high", True, GPUSLICE_PRIORITY="high")
    alone = run(program, probe, high_env)
    low_env = job_env("low", True, GPUSLICE_PRIORITY="low", GPUSLICE_COMPUTE_PERCENT="50")
    low_command = [str(program), "loop", str(args.seconds), "1000"]
    low = subprocess.Popen(low_command, env=low_env, stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    beside = run(program, probe, high_env)
    low_out = {k: float(v) for k, v in (line.split() for line in low.communicate()[0].splitlines())}
    lines += [
        "",
        "| high-priority launch delay (200 × 1 ms kernels, 10 ms apart) | p50 | p99 |",
        "|---|---:|---:|",
        f"| alone | {alone['p50_us']:.1f} µs | {alone['p99_us']:.1f} µs |",
        f"| beside a low-priority job launching back to back | {beside['p50_us']:.1f} µs | "
        f"{beside['p99_us']:.1f} µs |",
        "",
        f"The low job (50 % share) ran {low_out['share'] * 100:.1f} % of its {args.seconds:g} s: it yields "
        "while the high one is active (until 100 ms after its last launch).",
        "",
        f"load average after: {os.getloadavg()[0]:.2f}",
    ]
    text = "\n".join(lines) + "\n"
    (HERE / "out" / "shim.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
