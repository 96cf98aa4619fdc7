"""Compile the shim and the fake driver with the machine's C compiler (standard library only).

``setup.py`` loads this file by path at ``pip install`` time (before gpuslice's dependencies exist),
and the tests call it to build the fake driver into a temporary directory. Sources live in
``native/shim/``; nothing needs the CUDA SDK (``cuda_abi.h`` declares the types from NVIDIA's
documented ABI).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

__all__ = ["FAKE_LIBRARIES", "SHIM_LIBRARY", "BuildError", "build_fake_driver", "build_shim", "compiler"]

SHIM_LIBRARY = "libgpuslice-shim.so"
# file name -> source, relative to native/shim/; sonames are what programs link and dlopen
FAKE_LIBRARIES = {"libcuda.so.1": "fake/fake_cuda.c", "libnvidia-ml.so.1": "fake/fake_nvml.c"}
_FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-fPIC", "-shared", "-fvisibility=hidden"]


class BuildError(RuntimeError):
    """The C compiler is missing or failed; the message holds its command and output."""


def compiler() -> list[str]:
    """$CC (may hold flags), else cc, else gcc."""
    cc = os.environ.get("CC")
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc"):
        path = shutil.which(name)
        if path:
            return [path]
    raise BuildError(
        "no C compiler found (cc or gcc on PATH, or $CC): install gcc to build the gpuslice shim"
    )


def _compile(sources: list[Path], out: Path, extra: list[str]) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    command = [*compiler(), *_FLAGS, "-o", str(tmp), *map(str, sources), *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stderr.strip()}")
    os.replace(tmp, out)  # a process that has the old file mapped keeps it; new ones get this one
    return out


def build_shim(source_dir: Path, out_dir: Path) -> Path:
    """``out_dir/libgpuslice-shim.so`` from ``source_dir`` (native/shim)."""
    return _compile([Path(source_dir) / "shim.c"], Path(out_dir) / SHIM_LIBRARY, ["-ldl", "-lpthread"])


def build_fake_driver(source_dir: Path, out_dir: Path) -> dict[str, Path]:
    """The fake ``libcuda.so.1`` and ``libnvidia-ml.so.1`` in ``out_dir``: {file name: path}."""
    built = {}
    for name, source in FAKE_LIBRARIES.items():
        # -Bsymbolic: calls inside the fake bind to its own functions, as inside the real driver, so a
        # _ptsz variant that forwards to the plain one is not intercepted twice
        extra = [f"-Wl,-soname,{name}", "-Wl,-Bsymbolic"]
        built[name] = _compile([Path(source_dir) / source], Path(out_dir) / name, extra)
    return built
