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
from statistics import median

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


def command_of(args: list[str]) -> str:
    """The command a case runs: its first word, with the subcommand for the command groups."""
    words = [a for a in args if not a.startswith("-")][:2]
    return " ".join(words) if words and words[0] in GROUPS else words[0]


GROUPS = {"sim", "topo", "mig", "policy", "tenants", "k8s"}


def main() -> None:
    cases = tomllib.loads(CORPUS.read_text(encoding="utf-8"))["case"]
    script = str(Path(sys.executable).with_name("gpuslice"))
    rows = [(case["name"], command_of(case["args"]), *run_case(case, script)) for case in cases]
    print(f"{len(rows)} cases, exit 2 in {sum(1 for r in rows if r[2] == 2)}")
    print()
    print("| command | cases | exit 2 | median wall s | slowest s | largest peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for command in sorted({r[1] for r in rows}):
        mine = [r for r in rows if r[1] == command]
        walls = sorted(r[3] for r in mine)
        print(f"| {command} | {len(mine)} | {sum(1 for r in mine if r[2] == 2)} | {median(walls):.2f} | "
              f"{walls[-1]:.2f} | {max(r[4] for r in mine) / 1024:.0f} |")  # fmt: skip
    slowest = max(rows, key=lambda r: r[3])
    print()
    print(f"median wall {median(r[3] for r in rows):.2f} s; slowest {slowest[3]:.2f} s ({slowest[0]})")


if __name__ == "__main__":
    main()
