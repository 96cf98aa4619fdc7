"""Time and peak memory of every bad-input case (tests/cli/bad_inputs.toml) through the real console
script: how long a user waits for the refusal, and what it costs. Prints a Markdown summary.

    .venv/bin/python benchmarks/bad_inputs.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "cli" / "bad_inputs.toml"


def run_case(case: dict, script: str) -> tuple[int, float, int]:
    """(exit status, wall seconds, peak RSS in KiB) of one case, in its own empty folder."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, content in case.get("files", {}).items():
            target = Path(tmp) / name
            if content.startswith("hex:"):
                target.write_bytes(bytes.fromhex(content[4:]))
            else:
                target.write_text(content, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_")}
        env.update(HOME=tmp, GPUSLICE_STATE_DIR=f"{tmp}/state", GPUSLICE_URL="http://127.0.0.1:9")
        env.update({k: v.replace("{tmp}", tmp) for k, v in case.get("env", {}).items()})
        args = [a.replace("{tmp}", tmp) for a in case["args"]]
        started = time.perf_counter()
        child = subprocess.Popen([script, *args], cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
        return os.waitstatus_to_exitcode(status), time.perf_counter() - started, usage.ru_maxrss


def main() -> None:
    cases = tomllib.loads(CORPUS.read_text(encoding="utf-8"))["case"]
    script = str(Path(sys.executable).with_name("gpuslice"))
    rows = [(case["name"], *run_case(case, script)) for case in cases]
    slowest = max(rows, key=lambda r: r[2])
    largest = max(rows, key=lambda r: r[3])
    exit_2 = sum(1 for r in rows if r[1] == 2)
    print(f"cases: {len(rows)}, exit 2: {exit_2}")
    print(f"median wall: {sorted(r[2] for r in rows)[len(rows) // 2]:.2f} s")
    print(f"slowest: {slowest[2]:.2f} s ({slowest[0]})")
    print(f"largest peak RSS: {largest[3] / 1024:.0f} MiB ({largest[0]})")


if __name__ == "__main__":
    main()
