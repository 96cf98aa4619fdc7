"""Built-in policies written as policy files by ``programs.export`` (what ``gpuslice policy export``
prints), for the tests that run a file beside its built-in."""

from __future__ import annotations

from pathlib import Path

from gpuslice.programs.export import export_source

# file name -> (built-in name, family)
EXPORTED = {
    "bestfit.py": ("bestfit", "placement"),
    "fgd.py": ("fgd", "placement"),
    "fifo_queue.py": ("fifo", "queue"),
    "priority_fair.py": ("priority-fair", "queue"),
    "lfu.py": ("lfu", "eviction"),
    "fifo_evict.py": ("fifo", "eviction"),
    "stride.py": ("stride", "prefetch"),
}


def write_builtin_files(folder: Path) -> Path:
    """Every file of ``EXPORTED`` written into ``folder``; returns ``folder``."""
    for file, (name, family) in EXPORTED.items():
        (folder / file).write_text(export_source(name, family), encoding="utf-8")
    return folder
