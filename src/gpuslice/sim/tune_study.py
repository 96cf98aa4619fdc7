"""One ``gpuslice tune`` run: trials added to the study (in parallel if asked), the best and the defaults
replayed on held-out traces, and the run's record. The CLI (``cli/tune.py``) parses, shows progress and
writes the files; the search itself (trials, objectives, the policy file) is ``sim/tune.py``.

The held-out result is not one number: the best and the defaults are replayed on every held-out window
with each of ``holdout_seeds`` seeds, both on the same (window, seed), so each pair differs only by the
parameters. Seed k is replay seed 42 + k (the placement's tie-breaks among equal nodes) and, for k ≥ 1,
the window with a random tenth of its pods left out (drawn from the seed; none in a window of fewer
than 10 pods): tie-breaks alone rarely change a score, so the spread over seeds is the workload's
sampling noise, the spread over windows that of the period. The record gives mean, standard
deviation, min and max of both and of the paired difference (defaults − best, in the objective's unit),
and a verdict by this rule (``noise_verdict``):

* fewer than ``MIN_PAIRS`` (3) finite pairs: too few to judge;
* every pair equal: no difference;
* beyond noise when every paired difference has the same sign (none zero) and the mean difference is
  more than twice its standard error (sd / √n); otherwise within noise.

A sign agreement over n pairs alone would happen by chance with probability 2^(1−n) (25 % at n = 3), so
the rule is a screen, not a test at a stated level: more windows or seeds make it stricter.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
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

__all__ = ["MIN_PAIRS", "StudyRun", "holdout_seed_list", "holdout_variant", "noise_verdict", "run_study"]

MIN_PAIRS = 3  # paired held-out runs needed before the verdict says more than "too few to judge"


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
    holdout_seeds: int = 1,
    on_trial: Callable[[], None] = lambda: None,
    on_phase: Callable[[str], None] = lambda _: None,
) -> StudyRun:
    """Add ``trials`` trials to the study in ``study`` (a temporary one if None), ``jobs`` at a time;
    replay the best and the defaults on each of ``holdout`` with each of ``holdout_seeds`` replay seeds.
    ``on_trial`` is called as each trial ends, ``on_phase`` when the held-out replay starts."""
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
                try:
                    for future in as_completed(futures):
                        future.result()
                        on_trial()
                except BaseException:  # Ctrl-C (cli/interrupt.py) or a failed trial: no trial starts after it
                    # The pool's own thread cancels what is queued (a future cancelled here races with it
                    # marking the pool broken: InvalidStateError). wait=True: it is joined now, under
                    # cli/interrupt.py's watch, not at the exit, past it.
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
        opened = open_study(storage, attrs, seed)
        best = best_params(opened)
        on_phase("held-out replay")
        seed_list = holdout_seed_list(setup.seed, holdout_seeds)
        # scores[name][s][w]: the objective of ``name`` on held-out window w with replay seed s
        scores = {
            name: [
                evaluate_each(
                    params,
                    [holdout_variant(t, k, s) for t in holdout],
                    replace(setup, seed=s),
                    workdir / f"{name}.py",
                )
                for k, s in enumerate(seed_list)
            ]
            for name, params in (("defaults", DEFAULTS), ("best", best))
        }
        trained = (defaults_value(opened), opened.best_value)
        done = sum(t.state.name == "COMPLETE" for t in opened.trials)
    return StudyRun(
        best, summary(best, scores, seed_list, trained, done, setup.objective, list(holdout_names))
    )


def holdout_seed_list(first: int, count: int) -> list[int]:
    """The replay seeds of the held-out runs: ``first`` (the training replays' seed), then the next ones."""
    return [first + i for i in range(count)]


LEAVE_OUT = 0.1  # the share of a held-out window's pods that seed k >= 1 leaves out


def holdout_variant(trace: TimedTrace, k: int, seed: int) -> TimedTrace:
    """The held-out window as seed ``k`` (the ``k``-th of the list, replay seed ``seed``) replays it: as is
    for k = 0, else without ``LEAVE_OUT`` of its pods, drawn from ``seed``."""
    drop = int(LEAVE_OUT * len(trace.jobs))
    if k == 0 or drop == 0:
        return trace
    rng = np.random.default_rng(np.random.SeedSequence([seed, len(trace.jobs)]))
    left_out = set(rng.choice(len(trace.jobs), size=drop, replace=False).tolist())
    jobs = tuple(j for i, j in enumerate(trace.jobs) if i not in left_out)
    return replace(trace, jobs=jobs, end=max(j.arrival + j.duration for j in jobs))


def _gain(base: float, best: float) -> float | None:
    """Improvement of ``best`` over ``base`` in % of ``base`` (None when either is not finite)."""
    if not (math.isfinite(base) and math.isfinite(best)) or base == 0:
        return None
    return round(100.0 * (base - best) / base, 3)


def _sd(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return round(float(np.std(finite, ddof=1)), 3) if len(finite) > 1 else None


def _stats(values: list[float]) -> dict[str, float | None]:
    """Mean, standard deviation (n − 1), min and max of the finite ``values`` (None where undefined)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"mean": None, "sd": None, "min": None, "max": None}
    return {
        "mean": round(float(np.mean(finite)), 3),
        "sd": _sd(finite),
        "min": round(min(finite), 3),
        "max": round(max(finite), 3),
    }


def noise_verdict(differences: list[float]) -> tuple[bool | None, str]:
    """Whether the paired differences (defaults − best; > 0: the best is better) are beyond noise, and
    the sentence that says so (the rule is in this module's docstring). None: too few pairs to judge."""
    d = [v for v in differences if math.isfinite(v)]
    n = len(d)
    if n < MIN_PAIRS:
        return None, (
            f"too few paired held-out runs to judge noise ({n}, need {MIN_PAIRS}): "
            "give more --holdout windows or --holdout-seeds"
        )
    if all(v == 0 for v in d):
        return False, f"no difference: the best and the defaults score the same on all {n} held-out runs"
    mean = float(np.mean(d))
    se = float(np.std(d, ddof=1)) / math.sqrt(n)
    better = "better" if mean > 0 else "worse"
    same_sign = all(v > 0 for v in d) or all(v < 0 for v in d)
    if same_sign and abs(mean) > 2 * se:
        return True, (
            f"beyond noise: the best is {better} than the defaults in all {n} paired held-out runs, "
            f"mean difference {abs(mean):,.3f} > 2 × its standard error {se:,.3f}"
        )
    wins = sum(v > 0 for v in d)
    return False, (
        f"within noise: the best is better in {wins} of {n} paired held-out runs, mean difference "
        f"{mean:+,.3f} against 2 × its standard error {2 * se:,.3f}"
    )


def summary(
    best: dict[str, Any],
    scores: dict[str, list[list[float]]],
    seeds: list[int],
    train: tuple[float | None, float],
    trials: int,
    objective: str,
    holdout: list[str],
) -> dict[str, Any]:
    """The run's record (FILE.json): held-out scores per window (the mean over seeds), per run (window,
    seed) and over all runs with their spread, and whether the paired difference is beyond noise.
    ``scores[name][s][w]`` is ``name``'s objective on window ``w`` with the ``s``-th of ``seeds``."""
    runs = [
        {
            "window": spec,
            "seed": seed,
            "defaults": scores["defaults"][s][w],
            "best": scores["best"][s][w],
            "difference": scores["defaults"][s][w] - scores["best"][s][w],
        }
        for w, spec in enumerate(holdout)
        for s, seed in enumerate(seeds)
    ]
    per_window = {
        name: [float(np.mean([scores[name][s][w] for s in range(len(seeds))])) for w in range(len(holdout))]
        for name in ("defaults", "best")
    }
    base = float(np.mean([r["defaults"] for r in runs]))
    tuned = float(np.mean([r["best"] for r in runs]))
    windows = [
        {"window": spec, "defaults": d, "best": b, "improvement_pct": _gain(d, b)}
        for spec, d, b in zip(holdout, per_window["defaults"], per_window["best"], strict=True)
    ]
    gains = [w["improvement_pct"] for w in windows if w["improvement_pct"] is not None]
    differences = [r["difference"] for r in runs]
    beyond, verdict = noise_verdict(differences)
    return {
        "objective": objective,
        "trials": trials,
        "train_defaults": train[0],
        "train_best": train[1],
        "holdout": holdout,
        "holdout_seeds": seeds,
        "holdout_defaults": base,
        "holdout_best": tuned,
        "holdout_improvement_pct": _gain(base, tuned),
        "holdout_windows": windows,
        "holdout_runs": runs,
        "holdout_spread": {
            "n": sum(math.isfinite(d) for d in differences),
            "defaults": _stats([r["defaults"] for r in runs]),
            "best": _stats([r["best"] for r in runs]),
            "difference": _stats(differences),
        },
        "holdout_beyond_noise": beyond,
        "holdout_verdict": verdict,
        "holdout_improvement_sd_over_windows": _sd(gains),
        "holdout_defaults_sd_over_windows": _sd(per_window["defaults"]),
        "best": best,
        "defaults": DEFAULTS,
    }
