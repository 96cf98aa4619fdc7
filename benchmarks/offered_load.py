"""Offered load of a timed trace: the peak number of GPUs its pods ask for at once when every pod starts
the moment it arrives (unlimited GPUs), over the cluster's GPUs; and the arrival compression that offers
a chosen ratio.

A pod asks for ``num_gpu × gpu_milli / 1000`` GPUs (a share counts as its fraction) from arrival / load
to arrival / load + duration. Durations are never compressed, so compressing arrivals (a higher load)
packs the same pods closer, and copies played back to back (``repeat_trace``) ask for more than one copy
can: an openb pod list asks for about its cluster's capacity in total.
"""

from __future__ import annotations

import math

import numpy as np

from gpuslice.sim.timed_trace import TimedTrace, repeat_trace

__all__ = ["MAX_LOAD", "cluster_gpus", "compression_for", "peak_gpus"]

MAX_LOAD = 1e7  # beyond this every window of an openb trace arrives within a second
MAX_REPEAT = 8


def cluster_gpus(trace: TimedTrace) -> int:
    return sum(n.gpu_count for n in trace.nodes)


def peak_gpus(trace: TimedTrace, load: float) -> float:
    """Peak concurrent GPUs ``trace`` asks for at compression ``load``, with unlimited GPUs (an end at the
    same instant as a start is counted first)."""
    gpus = np.array([j.request.total_gpu_milli for j in trace.jobs], dtype=np.float64) / 1000
    start = np.array([j.arrival for j in trace.jobs], dtype=np.float64) / load
    duration = np.array([j.duration for j in trace.jobs], dtype=np.float64)
    times = np.concatenate([start, start + duration])
    delta = np.concatenate([gpus, -gpus])
    order = np.lexsort((delta, times))
    return float(np.cumsum(delta[order]).max())


def _round_up(x: float, steps: int = 0) -> float:
    """``x`` rounded up to 3 significant digits, then ``steps`` more units of the last digit."""
    step = 10 ** (math.floor(math.log10(x)) - 2)
    return float(f"{(math.ceil(x / step - 1e-9) + steps) * step:.3g}")


def compression_for(trace: TimedTrace, ratio: float) -> tuple[int, float, float]:
    """(copies, load, offered ratio reached): the fewest back-to-back copies of ``trace`` whose peak can
    reach ``ratio`` × the cluster's GPUs, and the least compression at which it does (bisection on
    log(load), rounded up to 3 significant digits; the ratio reached is measured there).
    ValueError when even MAX_REPEAT copies at MAX_LOAD fall short."""
    if not ratio > 0:
        raise ValueError("the offered ratio must be positive")
    total = cluster_gpus(trace)
    for copies in range(1, MAX_REPEAT + 1):
        played = repeat_trace(trace, copies)
        if peak_gpus(played, MAX_LOAD) / total < ratio:
            continue
        low, high = 0.0, math.log10(MAX_LOAD)
        if peak_gpus(played, 1.0) / total >= ratio:
            high = 0.0
        for _ in range(40):
            mid = (low + high) / 2
            if peak_gpus(played, 10**mid) / total >= ratio:
                high = mid
            else:
                low = mid
        load = min(MAX_LOAD, _round_up(10**high))
        if peak_gpus(played, load) / total < ratio:  # the crossing itself: an end meets a start there
            load = min(MAX_LOAD, _round_up(10**high, 1))
        return copies, load, peak_gpus(played, load) / total
    raise ValueError(f"{trace.name}: {MAX_REPEAT} copies at load {MAX_LOAD:g} offer less than {ratio:g}")
