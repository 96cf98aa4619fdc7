"""The sweep's worker pool: a run that fails ends the sweep without running the rest of its queue."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuslice.sim import sweep


def _failing_first(spec: sweep.RunSpec) -> None:
    """Seed 0 fails at once; every other run marks that it started, then takes a while."""
    if spec.seed == 0:
        raise ValueError("the first run fails")
    (Path(spec.trace_dir) / f"started-{spec.seed}").touch()  # type: ignore[arg-type]
    time.sleep(0.5)


def test_a_failed_run_drops_the_runs_still_queued_and_is_told_at_once(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sweep, "_trace", lambda name, trace_dir: None)  # no trace to load: _run is stood in
    monkeypatch.setattr(sweep, "_run", _failing_first)  # forked workers find it under the same name
    with pytest.raises(ValueError, match="the first run fails"):
        sweep.run_sweep(["default"], ["fgd"], list(range(40)), trace_dir=tmp_path, jobs=2)
    started = len(list(tmp_path.glob("started-*")))
    # before, the pool ran all 39 others (10 s) before the error was told
    assert started < 10, f"{started} of 39 queued runs ran before the failure was told"
    time.sleep(1.5)  # three runs' time: a worker left running would start more
    assert len(list(tmp_path.glob("started-*"))) == started, "the workers went on after the sweep ended"
