"""Many replays at once: every (trace, policy, seed) combination, in parallel worker processes.

The traces are loaded once, up front, and the forked workers inherit them: a sweep pays the CSV
parsing once, not once per run. Results come back in completion order through ``on_result`` (for
progress bars) and are returned sorted by (trace, policy, seed).
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import product
from pathlib import Path

from gpuslice.policies import placement_policy
from gpuslice.programs.loader import resolve
from gpuslice.sim.openb import DEFAULT_TUNE, ReplayResult, replay
from gpuslice.sim.trace import OpenbTrace, load_trace

__all__ = ["RunSpec", "run_sweep"]


@dataclass(frozen=True)
class RunSpec:
    trace: str
    policy: str
    seed: int
    trace_dir: Path | None = None
    tune: float = DEFAULT_TUNE


@cache
def _trace(name: str, trace_dir: Path | None) -> OpenbTrace:
    return load_trace(name, trace_dir)


def _run(spec: RunSpec) -> ReplayResult:
    return replay(_trace(spec.trace, spec.trace_dir), spec.policy, spec.seed, spec.tune)


def _ignore_interrupts() -> None:
    """A worker leaves Ctrl-C to the sweep's process, which terminates it (a worker's own
    KeyboardInterrupt would only print its traceback beside the command's one line)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_sweep(
    traces: Sequence[str],
    policies: Sequence[str],
    seeds: Sequence[int],
    trace_dir: Path | None = None,
    jobs: int = 1,
    tune: float = DEFAULT_TUNE,
    on_result: Callable[[ReplayResult], None] | None = None,
    on_start: Callable[[], None] | None = None,
) -> list[ReplayResult]:
    """Replay every combination; ``jobs`` > 1 uses that many processes. Traces are loaded (and so
    validated) up front, as are policy names, so a bad name or file fails before any work starts;
    ``on_start`` is called once they all are, as the runs begin."""
    for name in policies:
        resolve(name, "placement", placement_policy)  # a policy file is verified here, before any run
    for name in traces:
        _trace(name, trace_dir)
    specs = [RunSpec(t, p, s, trace_dir, tune) for t, p, s in product(traces, policies, seeds)]
    results: list[ReplayResult] = []
    if on_start is not None:
        on_start()
    if jobs <= 1:
        for spec in specs:
            results.append(_run(spec))
            if on_result is not None:
                on_result(results[-1])
    else:
        # multiprocessing's Pool, not concurrent.futures: leaving its block terminates the workers, so a
        # failed run or an interrupt ends the sweep at once instead of after every run still queued
        with multiprocessing.get_context("fork").Pool(jobs, _ignore_interrupts) as pool:
            for result in pool.imap_unordered(_run, specs):
                results.append(result)
                if on_result is not None:
                    on_result(result)
    order = {(t, p): i for i, (t, p) in enumerate(product(traces, policies))}
    return sorted(results, key=lambda r: (order[(r.trace, r.policy)], r.seed))
