"""Soft GPU memory cap for PyTorch jobs, applied when the job's torch initialises CUDA.

``enforcement.job_env`` copies this file, unchanged, to ``state_dir/softcap/sitecustomize.py`` and puts
that directory first on the job's PYTHONPATH. Python imports ``sitecustomize`` at start-up, so in the
job's interpreter this file then:

1. adds a meta-path finder that waits for ``torch.cuda`` to be imported (torch itself is *not*
   imported here: a job that never uses torch pays one ``find_spec`` check per import and no more);
2. when ``torch.cuda`` has been executed, wraps its ``_lazy_init``. PyTorch's C++ side calls
   ``torch.cuda._lazy_init`` by attribute lookup the first time a tensor touches CUDA, and
   ``torch.cuda.init()`` calls it too, so the wrapper runs once CUDA is up and calls
   ``torch.cuda.set_per_process_memory_fraction(GPUSLICE_GPU_MEMORY_BYTES / total, device)`` for every
   visible device; the caching allocator then raises OutOfMemoryError beyond the slice;
3. imports the ``sitecustomize`` this file shadows (the next one on sys.path), so a site's own start-up
   code keeps working.

Limits (why "soft"): it caps PyTorch's caching allocator only (not cuBLAS workspaces, NCCL buffers or
other CUDA libraries), each Python process of a job gets the whole cap, and ``python -I``/``-S`` skip
it. The monitor's graded response (node/monitor.py) catches what this misses. A failure to apply the
cap is printed to stderr and never stops the job.

Standard library only, and no gpuslice imports: the job's interpreter may not have gpuslice installed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
from typing import Any

__all__ = ["ENV_MEMORY_BYTES", "TorchCudaFinder", "apply_cap", "install", "patch_torch_cuda"]

ENV_MEMORY_BYTES = "GPUSLICE_GPU_MEMORY_BYTES"  # per GPU, bytes; the cap is off when unset or 0
ENV_SOFT_CAP = "GPUSLICE_SOFT_CAP"  # "1": job_env turned the cap on for this job
_MARK = "_gpuslice_softcap"


def _warn(message: str) -> None:
    sys.stderr.write(f"gpuslice soft cap: {message}\n")


def _limit_bytes() -> int:
    try:
        return int(os.environ.get(ENV_MEMORY_BYTES, "0"))
    except ValueError:
        _warn(f"{ENV_MEMORY_BYTES}={os.environ.get(ENV_MEMORY_BYTES)!r} is not a number of bytes; no cap")
        return 0


def apply_cap(cuda: Any, limit_bytes: int) -> list[tuple[int, float]]:
    """Cap each visible device of ``cuda`` (torch.cuda) at ``limit_bytes``; returns what was set."""
    applied = []
    for device in range(cuda.device_count()):
        total = int(cuda.get_device_properties(device).total_memory)
        fraction = min(1.0, limit_bytes / total) if total > 0 else 1.0
        cuda.set_per_process_memory_fraction(fraction, device)
        applied.append((device, fraction))
    return applied


def patch_torch_cuda(cuda: Any, limit_bytes: int) -> None:
    """Wrap ``cuda._lazy_init`` so that the cap is applied once, right after CUDA comes up."""
    original = cuda._lazy_init
    if getattr(original, _MARK, False):
        return
    state = {"done": False, "busy": False}

    def _lazy_init(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        # "busy": set_per_process_memory_fraction and get_device_properties call _lazy_init themselves.
        if not state["done"] and not state["busy"]:
            state["busy"] = True
            try:
                apply_cap(cuda, limit_bytes)
            except Exception as e:  # a cap that cannot be set must not break the job
                _warn(
                    f"could not set the PyTorch memory fraction ({type(e).__name__}: {e}); running uncapped"
                )
            finally:
                state["done"], state["busy"] = True, False
        return result

    setattr(_lazy_init, _MARK, True)
    _lazy_init.__wrapped__ = original  # type: ignore[attr-defined]
    cuda._lazy_init = _lazy_init


class TorchCudaFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when ``torch.cuda`` is found by the other finders, patches it once executed."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch.cuda":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        limit_bytes = self.limit_bytes

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            if getattr(module, "__name__", "") == "torch.cuda" and hasattr(module, "_lazy_init"):
                patch_torch_cuda(module, limit_bytes)

        # An instance attribute on this module's own loader: __loader__ stays the real loader object.
        loader.exec_module = exec_and_patch
        return spec


def install(limit_bytes: int | None = None) -> bool:
    """Arrange for the cap to be applied; False (and nothing done) when there is no cap to apply."""
    limit = _limit_bytes() if limit_bytes is None else limit_bytes
    if limit <= 0:
        return False
    if "torch.cuda" in sys.modules:  # imported before us (only possible when called by hand)
        patch_torch_cuda(sys.modules["torch.cuda"], limit)
    elif not any(isinstance(f, TorchCudaFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchCudaFinder(limit))
    return True


def _chain_shadowed_sitecustomize() -> None:
    """Import the ``sitecustomize`` this file hides, as site.py would (errors printed, not raised)."""
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    removed = [(i, p) for i, p in enumerate(sys.path) if os.path.abspath(p or os.curdir) == here]
    for i, _ in reversed(removed):
        del sys.path[i]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            _warn(f"the site's sitecustomize failed: {type(e).__name__}: {e}")
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    except Exception as e:  # site.py prints such errors and carries on; so do we
        sys.stderr.write(
            f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(e).__name__}: {e}\n"
        )
    finally:
        for i, p in removed:
            sys.path.insert(i, p)


if __name__ == "sitecustomize":
    if os.environ.get(ENV_SOFT_CAP) == "1":
        install()
    _chain_shadowed_sitecustomize()
