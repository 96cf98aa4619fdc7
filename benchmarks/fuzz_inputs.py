"""The command-line fuzzer's long run: fresh random inputs, many per command, and what it found.

    .venv/bin/python benchmarks/fuzz_inputs.py --examples 300

Runs ``tests/cli/test_fuzz_inputs.py`` with ``GPUSLICE_FUZZ_RANDOM=1`` (fresh draws every run) and
``GPUSLICE_FUZZ_EXAMPLES`` examples per command, one pytest per command, and prints a Markdown table for
``benchmarks/RESULTS.md``: examples tried, wall time, and each failure Hypothesis reduced (the command
line it found). CI runs the same test with 25 fixed examples per command.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST = "tests/cli/test_fuzz_inputs.py"
COMMANDS = ("estimate", "mig plan", "predict", "sim openb", "sim replay", "topo assign", "tune")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="examples per command (default 300)")
    args = parser.parse_args()
    env = {**os.environ, "GPUSLICE_FUZZ_RANDOM": "1", "GPUSLICE_FUZZ_EXAMPLES": str(args.examples)}
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("\n| command | examples | wall s | result |\n|---|---:|---:|---|")
    for command in COMMANDS:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{TEST}::"
             f"test_every_drawn_input_is_refused_cleanly_before_any_work_or_accepted[{command}]"],
            cwd=REPO, env=env, capture_output=True, text=True,
        )  # fmt: skip
        wall = time.monotonic() - started
        found = re.findall(r"AssertionError: (.{0,300})", done.stdout) or re.findall(
            r"Error: (.{0,300})", done.stdout
        )
        result = (
            "no failure" if done.returncode == 0 else "; ".join(dict.fromkeys(found)) or done.stdout[-300:]
        )
        print(f"| {command} | {args.examples} | {wall:.0f} | {result} |", flush=True)


if __name__ == "__main__":
    main()
