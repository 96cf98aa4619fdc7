"""Reading a big timed trace: wall time and peak memory of ``load_timed_trace``, this tree against a git
revision, side by side in one run.

    .venv/bin/python benchmarks/trace_load.py --pods 1200000 --base eb35237~1

The trace is the bundled default pod list copied until it has ``--pods`` rows (pod names made unique),
on the bundled node list, in a temporary folder. Each load runs in a fresh interpreter (``/usr/bin/time``
is not needed: the child reports its own ``ru_maxrss``), alternating the two trees ``--rounds`` times, so
that a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
_CHILD = """
import resource, sys, time
from pathlib import Path
from gpuslice.sim.timed_trace import load_timed_trace
started = time.perf_counter()
trace = load_timed_trace("big", Path(sys.argv[1]))
seconds = time.perf_counter() - started
print(seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, len(trace.jobs))
"""


def make_trace(folder: Path, pods: int) -> None:
    """``pods`` rows of the bundled default pod list, repeated, with unique names."""
    bundled = ROOT / "src" / "gpuslice" / "data" / "openb"
    shutil.copy(bundled / "openb_node_list_gpu_node.csv", folder)
    header, *rows = (bundled / "openb_pod_list_default.csv").read_text().splitlines()
    with (folder / "openb_pod_list_big.csv").open("w") as out:
        out.write(header + "\n")
        for i in range(pods):
            _, rest = rows[i % len(rows)].split(",", 1)
            out.write(f"big-{i},{rest}\n")


def load_once(src: Path, folder: Path) -> tuple[float, float, int]:
    """(seconds, peak RSS MiB, replayable pods) of one load by the tree whose sources are ``src``."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(folder)],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, rss, jobs = done.stdout.split()
    return float(seconds), float(rss), int(jobs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=1_200_000, help="rows in the trace (default 1.2 million)")
    parser.add_argument("--base", default="HEAD~1", help="git revision to compare with (default HEAD~1)")
    parser.add_argument("--rounds", type=int, default=2, help="loads per tree, alternating (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "trace").mkdir()
        make_trace(work / "trace", args.pods)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.base, "src"], capture_output=True, check=True
        )
        (work / "base").mkdir()
        subprocess.run(["tar", "-x", "-C", str(work / "base")], input=archive.stdout, check=True)
        trees = {args.base: work / "base" / "src", "this tree": ROOT / "src"}
        measured: dict[str, list[tuple[float, float, int]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, src in trees.items():
                measured[name].append(load_once(src, work / "trace"))
                print(
                    f"{name}: {measured[name][-1][0]:.1f} s, {measured[name][-1][1]:.0f} MiB", file=sys.stderr
                )
    size = (args.pods * 70) >> 20
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, Python {platform.python_version()}, "
        f"{args.pods:,} pod rows (about {size} MiB)"
    )
    print("| tree | load s (median) | peak RSS MiB (max) | replayable pods |")
    print("|---|---:|---:|---:|")
    for name, runs in measured.items():
        print(
            f"| {name} | {median(r[0] for r in runs):.1f} | {max(r[1] for r in runs):.0f} | {runs[0][2]:,} |"
        )


if __name__ == "__main__":
    main()
