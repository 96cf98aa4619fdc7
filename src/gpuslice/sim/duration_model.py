"""Predicted run times: a gradient-boosted model of a pod's duration from what the trace knows when the
pod arrives, judged on pods it never saw.

Features (all known at submission): requested CPU, memory, GPU count and milli-GPU per GPU, the GPU
models it accepts, its QoS class, and the hour of the day and the day of the week it arrived (the
trace's clock, from its start). Target: log(1 + duration), so that the many short pods and the few
month-long ones weigh alike; the prediction is turned back into seconds. Model: scikit-learn's
``HistGradientBoostingRegressor`` (categorical features native, no scaling needed), fixed seed.

Censored pods (still running at the trace's end) have only a lower bound for their duration: they are
left out of training and of the error figures.

``held_out_errors``: train on the earliest ``train_fraction`` of the pods (by arrival), measure on the
rest, against a constant guess (the training pods' median), the way a scheduler would meet it: the
future is what it predicts. ``cross_fitted`` gives every pod of a trace an estimate from a model that
did not see it (two halves by arrival, each predicted by the model of the other): what the replay's
``sjf-predicted`` orders by.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuslice.errors import UserError
from gpuslice.sim.timed_trace import TimedJob

__all__ = ["DEFAULT_TRAIN_FRACTION", "DurationModel", "HeldOutErrors", "cross_fitted", "held_out_errors"]

DEFAULT_TRAIN_FRACTION = 0.7
_DAY = 86_400.0


def _categories(values: Sequence[str], known: dict[str, int]) -> np.ndarray:
    """Codes of ``values`` in ``known`` (extended with new ones; unseen at prediction time gives NaN)."""
    return np.array([known.get(v, np.nan) for v in values], dtype=np.float64)


def features(jobs: Sequence[TimedJob], qos_codes: dict[str, int], model_codes: dict[str, int]) -> np.ndarray:
    """One row per pod: cpu, memory, GPUs, milli-GPU, GPU models (code), QoS (code), hour, weekday."""
    models = ["|".join(j.request.gpu_models) for j in jobs]
    return np.column_stack(
        [
            np.array([j.request.cpu_milli for j in jobs], dtype=np.float64),
            np.array([j.request.memory_bytes for j in jobs], dtype=np.float64),
            np.array([j.request.num_gpu for j in jobs], dtype=np.float64),
            np.array([j.request.gpu_milli for j in jobs], dtype=np.float64),
            _categories(models, model_codes),
            _categories([j.qos for j in jobs], qos_codes),
            np.array([(j.arrival % _DAY) / 3600.0 for j in jobs], dtype=np.float64),
            np.array([(j.arrival // _DAY) % 7 for j in jobs], dtype=np.float64),
        ]
    ).reshape(len(jobs), 8)


class DurationModel:
    """A fitted duration predictor (see the module docstring)."""

    def __init__(self, jobs: Sequence[TimedJob], seed: int = 0) -> None:
        from sklearn.ensemble import HistGradientBoostingRegressor  # ~1 s to import; only when used

        train = [j for j in jobs if not j.censored]
        if len(train) < 2:
            raise ValueError("a duration model needs at least two uncensored pods to learn from")
        self.qos_codes = {q: i for i, q in enumerate(sorted({j.qos for j in train}))}
        self.model_codes = {
            m: i for i, m in enumerate(sorted({"|".join(j.request.gpu_models) for j in train}))
        }
        self.median = float(np.median([j.duration for j in train]))
        self.regressor = HistGradientBoostingRegressor(
            categorical_features=[4, 5], random_state=seed, max_iter=200, learning_rate=0.1
        )
        target = np.log1p(np.array([j.duration for j in train], dtype=np.float64))
        self.regressor.fit(features(train, self.qos_codes, self.model_codes), target)

    def predict(self, jobs: Sequence[TimedJob]) -> np.ndarray:
        """Predicted durations in seconds (>= 0)."""
        if not jobs:
            return np.zeros(0)
        log = self.regressor.predict(features(jobs, self.qos_codes, self.model_codes))
        return np.maximum(np.expm1(log), 0.0)


@dataclass(frozen=True)
class HeldOutErrors:
    """Errors on the held-out pods of the model and of the constant guess (training median)."""

    train_pods: int
    test_pods: int
    mae_s: float
    median_ae_s: float
    log_mae: float  # mean |log(1+pred) − log(1+true)|: errors as ratios
    rank_correlation: float  # Spearman: what SJF's order depends on
    baseline_mae_s: float
    baseline_median_ae_s: float
    baseline_log_mae: float

    def record(self) -> dict[str, float | int]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def _rank(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    return ranks


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(_rank(a), _rank(b))[0, 1])


def _split(jobs: Sequence[TimedJob], train_fraction: float) -> tuple[list[TimedJob], list[TimedJob]]:
    ordered = sorted(jobs, key=lambda j: j.arrival)
    cut = round(len(ordered) * train_fraction)
    return ordered[:cut], ordered[cut:]


def held_out_errors(
    jobs: Sequence[TimedJob], train_fraction: float = DEFAULT_TRAIN_FRACTION, seed: int = 0
) -> tuple[HeldOutErrors, list[TimedJob], np.ndarray]:
    """Train on the earliest ``train_fraction`` of ``jobs``, judge on the rest: the errors, the judged
    (uncensored) pods and their predictions."""
    if not 0 < train_fraction < 1:
        raise ValueError("train_fraction must be between 0 and 1")
    train, test = _split(jobs, train_fraction)
    model = DurationModel(train, seed)
    test = [j for j in test if not j.censored]
    if not test:
        raise ValueError("no uncensored pod is left to judge the model on")
    predicted = model.predict(test)
    actual = np.array([j.duration for j in test], dtype=np.float64)
    baseline = np.full(len(test), model.median)
    log_true = np.log1p(actual)
    errors = HeldOutErrors(
        train_pods=sum(not j.censored for j in train),
        test_pods=len(test),
        mae_s=float(np.abs(predicted - actual).mean()),
        median_ae_s=float(np.median(np.abs(predicted - actual))),
        log_mae=float(np.abs(np.log1p(predicted) - log_true).mean()),
        rank_correlation=_spearman(predicted, actual),
        baseline_mae_s=float(np.abs(baseline - actual).mean()),
        baseline_median_ae_s=float(np.median(np.abs(baseline - actual))),
        baseline_log_mae=float(np.abs(np.log1p(baseline) - log_true).mean()),
    )
    return errors, test, predicted


def cross_fitted(jobs: Sequence[TimedJob], seed: int = 0) -> np.ndarray:
    """An estimate for every pod of ``jobs`` (same order) from a model that never saw it: the two halves
    by arrival, each predicted by the model trained on the other."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival)
    half = len(order) // 2
    first, second = order[:half], order[half:]
    learnable = [sum(not jobs[i].censored for i in part) for part in (first, second)]
    if min(learnable) < 2:
        raise UserError(
            f"predicted run times need at least two finished pods in each half of the trace by arrival "
            f"(each half is predicted by a model of the other); this one has {learnable[0]} and "
            f"{learnable[1]} of {len(jobs)} pods: use recorded run times (sjf-oracle) or a longer trace"
        )
    out = np.zeros(len(jobs))
    for judged, learned in ((first, second), (second, first)):
        if not judged:
            continue
        model = DurationModel([jobs[i] for i in learned], seed)
        out[judged] = model.predict([jobs[i] for i in judged])
    return out
