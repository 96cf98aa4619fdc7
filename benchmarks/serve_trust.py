"""The trust scenarios of ``gpuslice serve``, for ``serve_chaos.py --trust N``: each run N times against real
servers, with the number of runs that broke a promise.

- escapes (serve_escape.py), in every containment mode that works on this machine: a setsid daemon that
  outlives its job, a setsid child on cancel, a re-forker that ignores SIGTERM, a double fork;
- the quota hole (chaos_quota.py): memory-only shares against a ``max_gpus`` quota;
- log links (chaos_files.py): a job swaps its log for a link to the token, a 0600 file, another job's log;
- the store (chaos_store.py): a locked state file, a disk answering EIO (FUSE), two servers racing for one
  port, a token rotation.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from chaos_files import run_attack
from chaos_quota import quota_hole
from chaos_store import eio_store, locked_store, port_race, token_rotation
from gpuslice.node import containment
from serve_escape import escapes

__all__ = ["trust_rows", "working_modes"]


def working_modes() -> list[str]:
    """The containment modes this machine can run (auto's candidates, each once)."""
    modes: list[str] = []
    for mode in ("cgroup2", "cgroup1", "systemd", "subreaper"):
        with contextlib.suppress(containment.ContainmentUnavailable):
            found = containment.detect(mode)
            if found not in modes:
                modes.append(found)
    return modes


def trust_rows(runs: int, root: Path) -> tuple[list[tuple[str, int, int, str]], int]:
    """Every scenario ``runs`` times: rows of (scenario, runs, failures, note) and the total failures."""
    rows: list[tuple[str, int, int, str]] = []
    for mode in working_modes():
        for name, failed in escapes(mode, runs, root / f"escape-{mode}").items():
            rows.append((f"escape: {name}", runs, failed, f"containment {mode}"))
    quota = quota_hole(root / "quota", runs)
    rows.append(("quota hole (memory-only shares vs max_gpus)", quota["runs"], quota["failures"],
                 "; ".join(quota["details"][:2])))  # fmt: skip
    files = run_attack(runs, root / "files")
    rows.append(("log swapped for a link (public reads)", files["runs"], files["failures"],
                 "; ".join(files["reasons"][:2])))  # fmt: skip
    for outcome in (locked_store(root / "locked", runs), eio_store(root / "eio", runs),
                    port_race(root / "port", runs), token_rotation(root / "token", runs)):  # fmt: skip
        note = outcome.skipped or ", ".join(f"{k} {v}" for k, v in outcome.figures.items())
        rows.append((f"store: {outcome.name}", outcome.runs, len(outcome.failures), note))
    return rows, sum(failed for _, _, failed, _ in rows)
