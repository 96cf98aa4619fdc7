"""The sweep's worker pool: a run that fails ends the sweep without running the rest of its queue."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

# The sweep runs in a fresh interpreter, as `gpuslice sim openb` does: its workers are forked, and a
# fork taken while another thread of a long test session holds a lock can leave the worker stuck.
_SWEEP = """
import sys, time
from pathlib import Path
from gpuslice.sim import sweep

def failing_first(spec):
    # seed 0 fails at once; every other run marks that it started, then takes a while
    if spec.seed == 0:
        raise ValueError("the first run fails")
    (Path(spec.trace_dir) / f"started-{spec.seed}").touch()
    time.sleep(0.5)

sweep._trace = lambda name, trace_dir: None  # no trace to load: the run is stood in
sweep._run = failing_first  # the forked workers find it under the same name
try:
    sweep.run_sweep(["default"], ["fgd"], list(range(40)), trace_dir=Path(sys.argv[1]), jobs=2)
except ValueError as err:
    print(err)
"""


def test_a_failed_run_drops_the_runs_still_queued_and_is_told_at_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SWEEP, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "the first run fails", done.stderr[-2000:]
    started = len(list(tmp_path.glob("started-*")))
    # before, the pool ran all 39 others (10 s) before the error was told
    assert started < 10, f"{started} of 39 queued runs ran before the failure was told"
    time.sleep(1.5)  # three runs' time: a worker left running would start more
    assert len(list(tmp_path.glob("started-*"))) == started, "the workers went on after the sweep ended"
