"""serve places through the shared placer: `--placement NAME|FILE` decides which GPUs a job gets, as in
sim and the Kubernetes extender (a daemon over a fake node, and a real `gpuslice serve --simulate`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_helpers import FakeNode, h100_machine

from gpuslice.errors import UnknownPolicy, UserError
from gpuslice.server.daemon import Daemon
from gpuslice.server.store import Store
from gpuslice.sim.tune import DEFAULTS, write_policy
from gpuslice.workload.job import JobSpec
from gpuslice.workload.request import Request
from gpuslice.workload.target import TargetWorkload

HIGHEST_GPU = '''"""Highest GPU: a share goes to the highest-numbered GPU it fits on (a test policy)."""

import numpy as np

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class HighestGpu(PlacementOps):
    name = "highest-gpu"
    summary = "the highest-numbered fitting GPUs"

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        fitting = np.flatnonzero(view.gpu_fits(req, node))
        return tuple(int(g) for g in fitting[::-1][: req.num_gpu])
'''

CRASHES = '''"""Crashes: every GPU choice raises (a test policy)."""

from gpuslice.programs.api import LedgerView, PlacementOps, Request


class Crashes(PlacementOps):
    name = "crashes"
    summary = "raises in pick_gpus"

    def pick_gpus(self, view: LedgerView, req: Request, node: int) -> tuple[int, ...]:
        raise RuntimeError("boom")
'''

# A target of half-GPU shares: FGD keeps room for them, best fit packs regardless.
HALVES = TargetWorkload.from_requests([Request(cpu_milli=0, num_gpu=1, gpu_milli=500)])


def share(percent: int) -> JobSpec:
    return JobSpec(command=("train",), gpus=1, compute_percent=percent)


def placed(tmp_path: Path, name: str, placement: str, specs: list[JobSpec], **kw) -> list[tuple[int, ...]]:
    """Run ``specs`` one after another on a fresh 2-GPU daemon; the GPUs each job got."""
    state = tmp_path / name
    state.mkdir()
    store = Store(state / "state.db")
    try:
        daemon = Daemon(
            store, h100_machine(2), FakeNode(), state, placement=placement, monitor_seconds=0, **kw
        )
        gpus = []
        for spec in specs:
            job = daemon.submit(spec)
            daemon.tick()
            gpus.append(tuple(daemon.store.get(job.id).gpus))
        return gpus
    finally:
        store.close()


def test_fgd_and_bestfit_choose_differently_where_the_paper_says_they_should(tmp_path):
    # GPU 0 holds 40 %; a 20 % share: best fit packs it onto GPU 0 (leaving 40 %, too little for a half),
    # FGD puts it on GPU 1 so both GPUs still take a half-GPU share.
    jobs = [share(40), share(20)]
    assert placed(tmp_path, "bestfit", "bestfit", jobs) == [(0,), (0,)]
    assert placed(tmp_path, "fgd", "fgd", jobs, target=HALVES) == [(0,), (1,)]


def test_fgd_without_a_target_uses_the_shapes_of_the_jobs_the_server_knows(tmp_path):
    # Known shapes: 40 % (running) and 50 % (asking). Best fit packs the half next to the 40 %; FGD sees
    # that GPU 0's 10 % left would be lost to both shapes and keeps GPU 0's 60 % for another one.
    jobs = [share(40), share(50)]
    assert placed(tmp_path, "bestfit-known", "bestfit", jobs) == [(0,), (0,)]
    assert placed(tmp_path, "fgd-known", "fgd", jobs) == [(0,), (1,)]


def test_a_placement_policy_file_chooses_the_gpus(tmp_path):
    policy = tmp_path / "highest_gpu.py"
    policy.write_text(HIGHEST_GPU)
    assert placed(tmp_path, "file", str(policy), [share(10), share(10)]) == [(1,), (1,)]


def test_a_crashing_placement_file_costs_quality_never_correctness(tmp_path):
    policy = tmp_path / "crashes.py"
    policy.write_text(CRASHES)
    # the guard replaces each crash with the default (best fit) and the jobs still start
    assert placed(tmp_path, "crash", str(policy), [share(30), share(30)]) == [(0,), (0,)]


def test_an_unknown_placement_name_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(UnknownPolicy, match="bestfit"):
        placed(tmp_path, "unknown", "no-such-policy", [])


def test_a_missing_placement_file_is_refused(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        placed(tmp_path, "missing", str(tmp_path / "nope.py"), [])


def test_serve_process_places_with_a_policy_file(serve, tmp_path):
    policy = tmp_path / "highest_gpu.py"
    policy.write_text(HIGHEST_GPU)
    server = serve("--placement", str(policy))
    job = server.submit(["sleep", "30"], gpus=1, compute_percent=10)
    server.wait(lambda: server.jobs()[job["id"]]["state"] == "RUNNING", 15, "the job to start")
    assert server.jobs()[job["id"]]["gpus"] == [7]  # dgx-h100: GPUs 0-7


def test_serve_with_an_unknown_placement_exits_with_one_error_line(run_cli, tmp_path):
    code, _, err = run_cli(
        ["serve", "--simulate", "dgx-h100", "--state-dir", str(tmp_path / "s"), "--placement", "nope"]
    )
    assert code == 2
    assert "'nope' is not a placement policy" in err and "Traceback" not in err


def test_serve_process_runs_jobs_with_the_file_gpuslice_tune_writes(serve, tmp_path):
    # One machine is one node, so the tuned node weights cannot change serve's choice: the GPU inside the
    # node is the mechanism's (best fit packs shares). What this checks is that serve loads the file
    # tune writes, unchanged, and schedules with it.
    tuned = {**DEFAULTS, "CPU_WEIGHT": -0.3, "GPU_WEIGHT": 0.9, "SHARE_BONUS": 0.7}
    policy = write_policy(tuned, tmp_path / "tuned.py")
    server = serve("--placement", str(policy))
    first = server.submit(["sleep", "30"], gpus=1, compute_percent=30)
    second = server.submit(["sleep", "30"], gpus=1, compute_percent=30)
    running = lambda: all(server.jobs()[j["id"]]["state"] == "RUNNING" for j in (first, second))  # noqa: E731
    server.wait(running, 15, "both jobs to start")
    assert [server.jobs()[j["id"]]["gpus"] for j in (first, second)] == [[0], [0]]
    events = server.http.get("/v1/events", params={"kind": "policy"}).json()
    assert events == []  # no guard event: the file's hooks ran, none faulted and fell back
