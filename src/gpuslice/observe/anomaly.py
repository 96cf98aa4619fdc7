"""A sliding-window 3-sigma detector over many series at once (numpy): per GPU, its utilisation, memory
used and temperature.

Each ``update(values)`` takes one new sample per series. A sample is anomalous when the window of the
previous ``window`` samples holds at least ``min_samples`` and the sample lies more than ``sigmas``
standard deviations from their mean, where the deviation is at least ``min_std`` for that series (a
flat series has a standard deviation of 0, and then any wobble would be "infinitely" unusual; the
floor says how much wobble is never news, e.g. 2 percentage points of utilisation).

An excursion is reported once, when it starts; the series must come back inside the band before it
can be reported again. The anomalous samples do enter the window, so a lasting change of level
becomes the new normal after about a window. ``reset(series)`` forgets a series' history: the daemon
calls it when the jobs on a GPU change, because a new job is an expected change, not an anomaly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Anomaly", "SigmaDetector"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Anomaly:
    series: int
    value: float
    mean: float
    std: float  # the window's standard deviation
    scale: float  # the deviation it was judged by: max(std, the series' min_std)

    @property
    def sigmas(self) -> float:
        """How far out the value is, in units of ``scale`` (more than the detector's ``sigmas``)."""
        return abs(self.value - self.mean) / self.scale if self.scale > 0 else float("inf")


class SigmaDetector:
    """``n_series`` series, a ring buffer of ``window`` samples each. NaN samples (no reading) are
    skipped: they neither enter the window nor raise anything."""

    def __init__(
        self,
        n_series: int,
        *,
        window: int = 120,
        sigmas: float = 3.0,
        min_samples: int = 20,
        min_std: Sequence[float] | float = 0.0,
    ) -> None:
        if window < 2 or not 2 <= min_samples <= window:
            raise ValueError(f"need window >= 2 and 2 <= min_samples <= window, got {window}, {min_samples}")
        self.window = window
        self.sigmas = sigmas
        self.min_samples = min_samples
        self.min_std = np.broadcast_to(np.asarray(min_std, dtype=np.float64), (n_series,)).copy()
        self._buf = np.full((n_series, window), np.nan)
        self._next = np.zeros(n_series, dtype=np.int64)  # where each series writes its next sample
        self._out = np.zeros(n_series, dtype=bool)  # inside a reported excursion

    def reset(self, series: int) -> None:
        self._buf[series] = np.nan
        self._next[series] = 0
        self._out[series] = False

    def update(self, values: Sequence[float] | FloatArray) -> list[Anomaly]:
        """Add one sample per series; the anomalies that start with these samples."""
        x = np.asarray(values, dtype=np.float64)
        filled = ~np.isnan(self._buf)
        count = filled.sum(axis=1)
        n = np.maximum(count, 1)  # a fresh series: mean/std 0, and count < min_samples keeps it quiet
        mean = np.where(filled, self._buf, 0.0).sum(axis=1) / n
        std = np.sqrt(np.where(filled, (self._buf - mean[:, None]) ** 2, 0.0).sum(axis=1) / n)
        scale = np.maximum(std, self.min_std)
        band = self.sigmas * scale
        present = ~np.isnan(x)
        outside = present & (count >= self.min_samples) & (np.abs(x - mean) > band)
        starts = outside & ~self._out
        self._out = np.where(present, outside, self._out)
        rows = np.flatnonzero(present)
        self._buf[rows, self._next[rows]] = x[rows]
        self._next[rows] = (self._next[rows] + 1) % self.window
        return [
            Anomaly(int(i), float(x[i]), float(mean[i]), float(std[i]), float(scale[i]))
            for i in np.flatnonzero(starts)
        ]
