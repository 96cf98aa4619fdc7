"""The command-line fuzzer's long run: fresh random inputs, many per command and per input file, and
what it found.

    .venv/bin/python benchmarks/fuzz_inputs.py --examples 300

Runs the drawn tests of ``tests/cli/test_fuzz_inputs.py`` (options) and ``test_fuzz_file_contents.py``
(file contents) with ``GPUSLICE_FUZZ_RANDOM=1`` (fresh draws every run) and ``GPUSLICE_FUZZ_EXAMPLES``
examples, one pytest per command or file, and prints a Markdown table for ``benchmarks/RESULTS.md``:
examples tried (the first seven commands get all; the later commands and the files a third, as in CI),
wall time, and each failure Hypothesis reduced (the command line it found). CI runs the same tests with
25 fixed examples.
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
TESTS = (
    "tests/cli/test_fuzz_inputs.py::test_every_drawn_input_is_refused_cleanly_before_any_work_or_accepted",
    "tests/cli/test_fuzz_file_contents.py::"
    "test_every_drawn_file_content_is_refused_cleanly_before_any_work_or_accepted",
)
FULL = ("estimate", "mig plan", "predict", "sim openb", "sim replay", "topo assign", "tune")  # all examples


def _cases() -> list[str]:
    """Every drawn test's node id (one per command and one per input file), as pytest collects them."""
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *TESTS],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [line for line in listed.splitlines() if "::" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="examples per command (default 300)")
    args = parser.parse_args()
    env = {**os.environ, "GPUSLICE_FUZZ_RANDOM": "1", "GPUSLICE_FUZZ_EXAMPLES": str(args.examples)}
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("\n| command or input file | examples | wall s | result |\n|---|---:|---:|---|")
    for case in _cases():
        command = case.rsplit("[", 1)[1].rstrip("]")
        examples = args.examples if command in FULL else max(1, args.examples // 3)
        if "file_content" in case:
            command = f"file: {command}"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", case],
            cwd=REPO, env=env, capture_output=True, text=True,
        )  # fmt: skip
        wall = time.monotonic() - started
        # an assertion of the contract, else the exception (a traceback's last line, or Hypothesis's own)
        found = re.findall(r"AssertionError: (.{0,300})", done.stdout) or re.findall(
            r"([\w.]*(?:Error|Exception|Warning): .{0,300})", done.stdout
        )
        result = (
            "no failure" if done.returncode == 0 else "; ".join(dict.fromkeys(found)) or done.stdout[-300:]
        )
        result = " ".join(result.replace("|", "\\|").split())  # one table cell
        print(f"| {command} | {examples} | {wall:.0f} | {result} |", flush=True)


if __name__ == "__main__":
    main()
