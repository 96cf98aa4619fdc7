"""One ``gpuslice tune`` run: trials added to the study (in parallel if asked), the best and the defaults
replayed on held-out traces, and the run's record. The CLI (``cli/tune.py``) parses, shows progress and
writes the files; the search itself (trials, objectives, the policy file) is ``sim/tune.py``.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuslice.sim.timed_trace import TimedTrace
from gpuslice.sim.tune import (
    DEFAULTS,
    TuneSetup,
    best_params,
    defaults_value,
    evaluate_each,
    open_study,
    run_trial,
)

__all__ = ["StudyRun", "run_study"]


@dataclass(frozen=True)
class StudyRun:
    """What a run found: the best parameters, and the record written beside the policy (``summary``)."""

    best: dict[str, Any]
    summary: dict[str, Any]


def run_study(
    *,
    setup: TuneSetup,
    train: Sequence[TimedTrace],
    holdout: Sequence[TimedTrace],
    holdout_names: Sequence[str],
    attrs: dict[str, Any],
    seed: int,
    trials: int,
    jobs: int,
    study: Path | None,
    on_trial: Callable[[], None] = lambda: None,
    on_phase: Callable[[str], None] = lambda _: None,
) -> StudyRun:
    """Add ``trials`` trials to the study in ``study`` (a temporary one if None), ``jobs`` at a time;
    replay the best and the defaults on ``holdout``. ``on_trial`` is called as each trial ends,
    ``on_phase`` when the held-out replay starts."""
    with tempfile.TemporaryDirectory(prefix="gpuslice-tune-") as tmp:
        workdir = Path(tmp)
        storage = study or workdir / "study.sqlite3"
        done_before = len(open_study(storage, attrs, seed).trials)
        # one sampler seed per trial, from (seed, trial number): runs with other seeds share none
        seeds = [
            int(np.random.SeedSequence([seed, done_before + i]).generate_state(1)[0]) for i in range(trials)
        ]
        if jobs == 1:
            for s in seeds:
                run_trial(storage, s, train, setup, workdir)
                on_trial()
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(run_trial, storage, s, train, setup, workdir) for s in seeds]
                for future in futures:
                    future.result()
                    on_trial()
        opened = open_study(storage, attrs, seed)
        best = best_params(opened)
        on_phase("held-out replay")
        scores = {
            name: evaluate_each(params, holdout, setup, workdir / f"{name}.py")
            for name, params in (("defaults", DEFAULTS), ("best", best))
        }
        trained = (defaults_value(opened), opened.best_value)
        done = sum(t.state.name == "COMPLETE" for t in opened.trials)
    return StudyRun(best, summary(best, scores, trained, done, setup.objective, list(holdout_names)))


def _gain(base: float, best: float) -> float | None:
    """Improvement of ``best`` over ``base`` in % of ``base`` (None when either is not finite)."""
    if not (math.isfinite(base) and math.isfinite(best)) or base == 0:
        return None
    return round(100.0 * (base - best) / base, 3)


def _sd(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return round(float(np.std(finite, ddof=1)), 3) if len(finite) > 1 else None


def summary(
    best: dict[str, Any],
    scores: dict[str, list[float]],
    train: tuple[float | None, float],
    trials: int,
    objective: str,
    holdout: list[str],
) -> dict[str, Any]:
    """The run's record (FILE.json): held-out scores per window and on their mean; the spread of the
    per-window improvement and of the defaults over the windows, to judge a gain against."""
    base, tuned = float(np.mean(scores["defaults"])), float(np.mean(scores["best"]))
    windows = [
        {"window": spec, "defaults": d, "best": b, "improvement_pct": _gain(d, b)}
        for spec, d, b in zip(holdout, scores["defaults"], scores["best"], strict=True)
    ]
    gains = [w["improvement_pct"] for w in windows if w["improvement_pct"] is not None]
    return {
        "objective": objective,
        "trials": trials,
        "train_defaults": train[0],
        "train_best": train[1],
        "holdout": holdout,
        "holdout_defaults": base,
        "holdout_best": tuned,
        "holdout_improvement_pct": _gain(base, tuned),
        "holdout_windows": windows,
        "holdout_improvement_sd_over_windows": _sd(gains),
        "holdout_defaults_sd_over_windows": _sd(scores["defaults"]),
        "best": best,
        "defaults": DEFAULTS,
    }
