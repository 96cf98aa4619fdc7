"""The sliding-window 3-sigma detector on synthetic series."""

from __future__ import annotations

import numpy as np
import pytest

from gpuslice.observe.anomaly import SigmaDetector


def feed(detector: SigmaDetector, series: np.ndarray) -> list[tuple[int, int]]:
    """(sample index, series) of every anomaly raised while feeding ``series`` (samples x series)."""
    found = []
    for t, row in enumerate(series):
        found += [(t, a.series) for a in detector.update(row)]
    return found


def test_a_flat_series_never_raises_an_anomaly():
    detector = SigmaDetector(1, window=60, min_samples=20, min_std=1.0)
    assert feed(detector, np.full((2000, 1), 42.0)) == []


def test_noisy_but_stable_series_raise_nothing_when_the_noise_is_within_the_floor():
    rng = np.random.default_rng(7)
    util = 60 + rng.normal(0, 0.5, 5000)  # utilisation wobbling by half a point; floor 2 points
    temp = 55 + rng.uniform(-1.5, 1.5, 5000)  # bounded noise: never past 3 sigma of itself
    detector = SigmaDetector(2, window=120, min_samples=20, min_std=[2.0, 0.0])
    assert feed(detector, np.column_stack([util, temp])) == []


def test_a_spike_is_raised_once_at_the_sample_where_it_starts():
    rng = np.random.default_rng(1)
    x = 50 + rng.normal(0, 1.0, 300)
    x = np.clip(x, 47, 53)  # keep the baseline itself inside 3 sigma
    x[200:205] = 90  # a five-sample excursion
    detector = SigmaDetector(1, window=100, min_samples=20, min_std=1.0)
    assert feed(detector, x[:, None]) == [(200, 0)]


def test_an_excursion_that_ends_and_comes_back_is_raised_twice():
    x = np.full(200, 30.0)
    x[100] = 80
    x[150] = 80
    detector = SigmaDetector(1, window=40, min_samples=10, min_std=1.0)
    assert [t for t, _ in feed(detector, x[:, None])] == [100, 150]


def test_a_lasting_change_of_level_becomes_normal_after_a_window():
    x = np.concatenate([np.full(100, 20.0), np.full(300, 70.0)])
    detector = SigmaDetector(1, window=50, min_samples=10, min_std=1.0)
    found = feed(detector, x[:, None])
    assert found == [(100, 0)]
    # by now the window holds only the new level: a small wobble around it is not news
    assert detector.update([71.0]) == []


def test_series_are_independent_and_only_the_anomalous_one_is_named():
    x = np.full((100, 3), [10.0, 20.0, 30.0])
    x[80, 2] = 90
    detector = SigmaDetector(3, window=50, min_samples=10, min_std=1.0)
    anomalies = feed(detector, x)
    assert anomalies == [(80, 2)]


def test_reset_forgets_history_so_the_next_samples_are_not_compared_with_the_old_level():
    detector = SigmaDetector(1, window=30, min_samples=10, min_std=1.0)
    feed(detector, np.full((50, 1), 5.0))
    detector.reset(0)
    assert feed(detector, np.full((9, 1), 95.0)) == []  # fewer than min_samples: quiet


def test_missing_readings_neither_enter_the_window_nor_raise():
    detector = SigmaDetector(1, window=30, min_samples=10, min_std=1.0)
    x = np.full((40, 1), 12.0)
    x[::3] = np.nan
    assert feed(detector, x) == []
    a = detector.update([60.0])
    assert len(a) == 1 and a[0].mean == pytest.approx(12.0) and a[0].std == pytest.approx(0.0)


def test_the_reported_anomaly_carries_value_mean_and_sigmas():
    detector = SigmaDetector(1, window=20, min_samples=10, min_std=0.0)
    for v in [10.0, 12.0] * 10:
        assert detector.update([v]) == []
    (a,) = detector.update([20.0])
    assert a.value == 20.0 and a.mean == pytest.approx(11.0) and a.std == pytest.approx(1.0)
    assert a.sigmas == pytest.approx(9.0)


def test_sigmas_are_counted_in_the_floor_when_the_window_is_flatter_than_it():
    detector = SigmaDetector(1, window=20, min_samples=10, min_std=2.0)
    for _ in range(10):
        detector.update([40.0])
    (a,) = detector.update([50.0])
    assert a.std == 0.0 and a.scale == 2.0 and a.sigmas == pytest.approx(5.0)


def test_bad_window_settings_are_refused():
    with pytest.raises(ValueError, match="min_samples"):
        SigmaDetector(1, window=10, min_samples=20)
