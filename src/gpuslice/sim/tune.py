"""Tune a placement policy's weights and the queue's settings through the timed replay (Optuna).

```text
train traces ─► trial: params ─► tuned_fit.py written with them ─► replay_timed(each) ─► objective
   (Optuna TPE, sqlite study: resumable, shared by --jobs processes)
best params ──► replay on the held-out traces (never seen by the search)  vs  the defaults on the same
```

What is searched: the three constants of the ``tuned_fit`` policy file (CPU and GPU leftover weights,
shared-GPU bonus), serve's EASY backfill on or off, and the queue's aging period (priority-fair: a
waiting job gains one level per period). Each trial replays through the policy *file* it would write,
loaded by the same loader as ``sim``, ``serve --placement`` and the extender, so the written file is
what was scored. The objective is the mean over the training traces of: mean JCT of finished pods,
p99 queueing delay, or unallocated GPU % (100 − mean allocation over the run), lower is better.

A tuning trace is a window of a trace: ``NAME@K`` is jobs [K·N, (K+1)·N) of NAME (N = ``sample``),
arrivals shifted to start at 0, on every ``node_stride``-th node of its cluster, so queues form at a
moderate load and one replay takes about a second. Default split, by time: window 1 of the default
trace to train, window 2 to hold out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpuslice.errors import UserError
from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
from gpuslice.sim.timed_trace import TimedTrace, every_kth_node, load_timed_trace

__all__ = [
    "DEFAULTS",
    "OBJECTIVES",
    "STUDY_NAME",
    "TuneSetup",
    "best_params",
    "check_disjoint",
    "defaults_value",
    "evaluate",
    "evaluate_each",
    "objective_value",
    "open_study",
    "policy_source",
    "run_trial",
    "suggest",
    "tuning_trace",
    "write_policy",
]

TEMPLATE = Path(__file__).with_name("tuned_fit.py")
OBJECTIVES = ("mean-jct", "p99-wait", "unallocated")
# the defaults: the template's constants, serve's backfill (on) and aging period (600 s)
DEFAULTS: dict[str, Any] = {
    "CPU_WEIGHT": 0.5,
    "GPU_WEIGHT": 0.5,
    "SHARE_BONUS": 0.0,
    "backfill": True,
    "aging_seconds": 600.0,
}
POLICY_PARAMS = ("CPU_WEIGHT", "GPU_WEIGHT", "SHARE_BONUS")


@dataclass(frozen=True)
class TuneSetup:
    objective: str
    load: float
    queue: str = "priority-fair"
    seed: int = 42  # the replay's (placement randomness), not the sampler's


def suggest(trial: Any) -> dict[str, Any]:
    """One point of the search space (Optuna's define-by-run)."""
    return {
        "CPU_WEIGHT": trial.suggest_float("CPU_WEIGHT", -1.0, 1.0),
        "GPU_WEIGHT": trial.suggest_float("GPU_WEIGHT", -1.0, 1.0),
        "SHARE_BONUS": trial.suggest_float("SHARE_BONUS", 0.0, 1.0),
        "backfill": trial.suggest_categorical("backfill", [True, False]),
        "aging_seconds": trial.suggest_float("aging_seconds", 60.0, 86_400.0, log=True),
    }


def policy_source(params: dict[str, Any]) -> str:
    """The tuned_fit policy file with its constants set to ``params``."""
    text = re.sub(r"^__all__ = .*\n\n", "", TEMPLATE.read_text(), count=1, flags=re.MULTILINE)
    for name in POLICY_PARAMS:
        value = float(params[name])
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite")
        text, n = re.subn(rf"^{name} = [-+0-9.e]+$", f"{name} = {value!r}", text, count=1, flags=re.MULTILINE)
        assert n == 1, name
    return text


def write_policy(params: dict[str, Any], path: Path) -> Path:
    """Write the policy file for ``params`` (mode 0600); a header comment records the queue settings."""
    backfill = "on" if params["backfill"] else "off"
    queue = f"# gpuslice tune: backfill {backfill}, aging {params['aging_seconds']:.0f} s\n"
    path.write_text(queue + policy_source(params))
    path.chmod(0o600)
    return path


def tuning_trace(spec: str, sample: int, node_stride: int, trace_dir: Path | None = None) -> TimedTrace:
    """``NAME`` or ``NAME@K``: window K (default 0) of ``sample`` jobs of the trace, on every
    ``node_stride``-th node (UserError for a bad window or a trace without timestamps)."""
    name, _, window = spec.partition("@")
    if window and not window.isdecimal():
        raise UserError(f"trace {spec!r}: the window after @ must be a whole number (NAME@K)")
    k = int(window or 0)
    full = load_timed_trace(name, trace_dir)
    jobs = full.jobs[k * sample : (k + 1) * sample]
    if len(jobs) < 2:
        raise UserError(
            f"trace {spec!r}: window {k} of {sample} jobs is empty "
            f"({name} has {len(full.jobs)} replayable pods)"
        )
    start = jobs[0].arrival
    jobs = tuple(replace(j, arrival=j.arrival - start) for j in jobs)
    return TimedTrace(
        name=spec,
        nodes=every_kth_node(full, node_stride).nodes,
        jobs=jobs,
        end=max(j.arrival + j.duration for j in jobs),
        never_scheduled=0,
    )


def check_disjoint(train: Sequence[str], holdout: Sequence[str]) -> None:
    """UserError when a held-out window is one the search trains on: the same ``NAME@K`` in both, or a
    trace named bare (``NAME``) on one side and in any form on the other (a bare name stands for the
    trace, so it is never held out from itself). A held-out score on training data says nothing."""

    def split(spec: str) -> tuple[str, str]:
        name, _, window = spec.partition("@")
        return name, window

    for h in holdout:
        name, window = split(h)
        for t in train:
            other, trained = split(t)
            if other == name and (not window or not trained or window == trained):
                raise UserError(
                    f"--holdout {h} overlaps --train {t}: the held-out windows must be ones the search never "
                    f"sees; name windows of {name} that differ (e.g. --train {name}@1 --holdout {name}@2)"
                )


def objective_value(record: dict[str, Any], objective: str) -> float:
    """The figure of one replay that ``objective`` minimises (inf when no pod finished)."""
    if objective == "unallocated":
        return 100.0 - float(record["mean_allocation_pct"])
    key, stat = {"mean-jct": ("jct_s", "mean"), "p99-wait": ("wait_s", "p99")}[objective]
    value = record[key]["all"][stat]
    return math.inf if value is None else float(value)


def evaluate_each(
    params: dict[str, Any],
    traces: Sequence[TimedTrace],
    setup: TuneSetup,
    policy_path: Path,
) -> list[float]:
    """The objective on each of ``traces`` with ``params``, replayed through the written policy file."""
    write_policy(params, policy_path)
    values = []
    for trace in traces:
        estimates = np.array([j.duration for j in trace.jobs], dtype=np.float64)
        config = ReplayConfig(
            str(policy_path),
            setup.queue,
            bool(params["backfill"]),
            setup.load,
            setup.seed,
            aging_seconds=float(params["aging_seconds"]),
            label="tuned",
        )
        values.append(objective_value(replay_timed(trace, config, estimates).record(), setup.objective))
    return values


def evaluate(
    params: dict[str, Any], traces: Sequence[TimedTrace], setup: TuneSetup, policy_path: Path
) -> float:
    """The training score: the mean of the per-trace objectives (each window counts alike)."""
    return float(np.mean(evaluate_each(params, traces, setup, policy_path)))


STUDY_NAME = "gpuslice-tune"


def open_study(storage: Path, attrs: dict[str, Any], seed: int) -> Any:
    """The study in sqlite file ``storage`` (created 0600, or continued when its settings match).

    A run that was killed leaves its trial in progress RUNNING: on opening, such trials are marked
    FAILED (one ``gpuslice tune`` per study at a time; its ``--jobs`` processes start after this), and
    the defaults are queued again if they have not been scored yet."""
    import optuna  # only the tune command needs it
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    new = not storage.exists()
    if new:
        storage.touch(mode=0o600)
    storage.chmod(0o600)
    study = optuna.create_study(
        study_name=STUDY_NAME,
        storage=f"sqlite:///{storage.resolve()}",
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=seed),
        load_if_exists=True,
    )
    if not study.trials and not study.user_attrs:
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    else:
        old = {k: study.user_attrs.get(k) for k in attrs}
        if old != attrs:
            diff = ", ".join(f"{k} {old[k]!r} (now {attrs[k]!r})" for k in attrs if old[k] != attrs[k])
            raise UserError(f"--study {storage} was tuned with other settings: {diff}; give a new --study")
    rdb = optuna.storages.RDBStorage(f"sqlite:///{storage.resolve()}")
    study_id = rdb.get_study_id_from_name(STUDY_NAME)
    for stale in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_id = rdb.get_trial_id_from_study_id_trial_number(study_id, stale.number)
        rdb.set_trial_state_values(trial_id, TrialState.FAIL)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if defaults_value(study) is None and not waiting:
        study.enqueue_trial(DEFAULTS)  # the defaults are scored first: the best is never worse on training
    return study


def defaults_value(study: Any) -> float | None:
    """The training score of the defaults in ``study`` (None until that trial has finished)."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if trial.params == DEFAULTS:
            return float(trial.value)
    return None


def run_trial(
    storage: Path,
    seed: int,
    traces: Sequence[TimedTrace],
    setup: TuneSetup,
    workdir: Path,
) -> float:
    """Ask the study for one point, score it on ``traces``, tell the study (one process's share of
    ``--jobs``; each call re-opens the sqlite study, so calls may run in parallel processes)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(
        study_name=STUDY_NAME,
        storage=f"sqlite:///{storage.resolve()}",
        sampler=optuna.samplers.TPESampler(seed=seed),
    )
    trial = study.ask()
    params = suggest(trial)
    path = workdir / f"trial-{trial.number}.py"
    try:
        value = evaluate(params, traces, setup, path)
    except Exception:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    finally:
        path.unlink(missing_ok=True)
    study.tell(trial, value if math.isfinite(value) else 1e18)
    return value


def best_params(study: Any) -> dict[str, Any]:
    """The best trial's parameters, every key of DEFAULTS present."""
    return {**DEFAULTS, **study.best_trial.params}
