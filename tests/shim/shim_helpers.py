"""Helpers for the shim tests: the built pieces, how to run a test program as a job, and compiling.

The shim under test is the one the package was installed with (``gpuslice.shim.library_path()``); the
fake ``libcuda.so.1`` / ``libnvidia-ml.so.1`` and the programs are built here from ``native/shim`` and
``tests/shim/c`` with the machine's C compiler.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuslice.shim import library_path
from gpuslice.shim.build import compiler

ROOT = Path(__file__).resolve().parents[2]
C_DIR = Path(__file__).resolve().parent / "c"
LIMIT = 100_000_000  # bytes of the slice in most tests
CHUNK = 1 << 20


@dataclass(frozen=True)
class Native:
    """The built pieces, and how to run a test program as a job's process."""

    fake_dir: Path
    client: Path
    work: Path

    def env(self, job: str, **extra: str) -> dict[str, str]:
        """A job's environment: the shim preloaded, the fake driver found, a LIMIT-byte slice of GPU 0."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_")}
        env.update(
            LD_LIBRARY_PATH=str(self.fake_dir),
            LD_PRELOAD=str(library_path()),
            GPUSLICE_SHIM_DIR=str(self.work),
            GPUSLICE_JOB_ID=job,
            GPUSLICE_GPU_MEMORY_BYTES=str(LIMIT),
            GPUSLICE_GPUS="0",
            GPUSLICE_GPU_UUIDS="GPU-fake-0",
        )
        env.update(extra)
        return env

    def run(
        self, args: list[str], env: Mapping[str, str], timeout: float = 120
    ) -> tuple[dict[str, float], str]:
        """Run the client to the end: ({key: value} from its output, its stderr)."""
        done = subprocess.run(
            [str(self.client), *args],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{args} exited {done.returncode}: {done.stderr}"
        return parse(done.stdout), done.stderr

    def start(self, args: list[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.client), *args],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def parse(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        values[key] = float(value) if value else 1.0
    return values


def compile_program(
    out: Path, sources: list[Path], fake_dir: Path | None = None, extra: list[str] = ()
) -> Path:
    command = [*compiler(), "-std=gnu11", "-O1", "-o", str(out), *map(str, sources)]
    if fake_dir is not None:
        command += [f"-L{fake_dir}", "-l:libcuda.so.1", "-l:libnvidia-ml.so.1"]
    command += [*extra, "-ldl", "-lpthread"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return out
