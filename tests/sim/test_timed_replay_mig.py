"""MIG pods in the timed replay: they wait for a free start of their profile, are preempted and
backfilled on copies of the MIG layouts, and never share slices; the GPU figures leave MIG GPUs out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuslice.cli.main import main
from gpuslice.sim.queue_setups import estimates_for, queue_setup
from gpuslice.sim.timed_replay import ReplayConfig, replay_timed
from gpuslice.sim.timed_trace import load_timed_trace
from gpuslice.sim.trace import NODE_FILE

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time,mig_profile"
)


def write_trace(tmp_path: Path, pods: list[tuple], mig_gpus: int = 1, gpus: int = 2) -> Path:
    """Pods as (name, profile or milli, qos, creation, scheduled, deletion) on one A100-80GB node whose
    first ``mig_gpus`` GPUs are in MIG mode."""
    (tmp_path / NODE_FILE).write_text(
        f"sn,cpu_milli,memory_mib,gpu,model,mig_gpus\nn0,96000,393216,{gpus},A100-80GB,{mig_gpus}\n"
    )
    rows = []
    for name, what, qos, c, s, d in pods:
        mig = isinstance(what, str)
        num_gpu, milli = (1, 0) if mig else ((1, what) if what else (0, 0))
        rows.append(f"{name},1000,1024,{num_gpu},{milli},,{qos},Running,{c},{d},{s},{what if mig else ''}")
    (tmp_path / "openb_pod_list_t.csv").write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return tmp_path


def run(tmp_path: Path, setup: str):
    trace = load_timed_trace("t", tmp_path)
    chosen = queue_setup(setup)
    config = ReplayConfig("bestfit", chosen.queue, chosen.backfill, label=chosen.name)
    result = replay_timed(trace, config, estimates_for(trace.jobs, chosen))
    return result, {j.name: i for i, j in enumerate(trace.jobs)}


def test_a_mig_pod_waits_for_a_free_start_of_its_profile_and_others_fill_the_rest(tmp_path: Path) -> None:
    pods = [
        ("big", "4g.40gb", "LS", 0, 0, 100),  # slices 0-3
        ("half", "4g.40gb", "LS", 1, 1, 51),  # only start 0: waits for big
        ("small", "3g.40gb", "LS", 2, 2, 12),  # start 4 is free: runs at once, beside big
        ("share", 500, "LS", 3, 3, 13),  # on the GPU not in MIG mode
        ("z", 0, "LS", 9000, 9000, 9001),
    ]
    result, at = run(write_trace(tmp_path, pods), "easy-backfill")
    assert result.start[at["big"]] == 0 and result.start[at["small"]] == 2
    assert result.start[at["half"]] == 100  # 4g.40gb starts only at slot 0
    assert result.start[at["share"]] == 3
    assert result.total_gpu_milli == 1000  # the MIG GPU is not in the GPU figures
    assert float(np.max(result.allocated_gpu_milli)) == 500  # the share alone
    mig = result.record()["mig"]
    assert (mig["pods"], mig["started"], mig["wait_s"]["n"], mig["wait_s"]["mean"]) == (3, 3, 3, 33.0)


def test_a_latency_sensitive_mig_pod_preempts_the_best_effort_instance_in_its_way(tmp_path: Path) -> None:
    pods = [
        ("be", "7g.80gb", "BE", 0, 0, 1000),
        ("ls", "1g.10gb", "LS", 10, 10, 60),
        ("z", 0, "LS", 9000, 9000, 9001),
    ]
    result, at = run(write_trace(tmp_path, pods, gpus=1), "fair-share")
    assert result.start[at["ls"]] == 40  # 10 + the 30 s grace: the 7g instance had to go
    assert result.preempted[at["be"]] == 1 and result.record()["preemptions"] == 1
    assert result.start[at["be"]] == 0 and result.end[at["be"]] == 90 + 1000  # ran again after ls


def test_backfill_lets_a_mig_pod_past_a_blocked_mig_head_only_if_the_head_keeps_its_start(
    tmp_path: Path,
) -> None:
    pods = [
        ("a", "3g.40gb", "LS", 0, 0, 100),  # start 0
        ("head", "7g.80gb", "LS", 1, 1, 11),  # needs the whole GPU: reserved at 100
        ("fits", "3g.40gb", "LS", 2, 2, 52),  # start 4, ends at 52 < 100: backfilled
        ("late", "3g.40gb", "LS", 60, 60, 260),  # would run past 100 on the head's slices: waits
        ("z", 0, "LS", 9000, 9000, 9001),
    ]
    strict, at = run(write_trace(tmp_path, pods, gpus=1), "fifo")
    easy, _ = run(tmp_path, "easy-backfill")
    assert strict.start[at["fits"]] == 110  # behind the head
    assert easy.start[at["fits"]] == 2 and easy.start[at["head"]] == 100
    assert easy.start[at["late"]] == 110  # not before the head, which took every slice at 100


def test_sim_replay_prints_how_the_mig_pods_fared_and_plots_a_mig_only_cluster(tmp_path, monkeypatch, capsys):
    pods = [("a", "3g.40gb", "LS", 0, 0, 100), ("b", "7g.80gb", "LS", 1, 1, 11)]
    pods.append(("z", 0, "LS", 900, 900, 901))  # the last instant: z is censored, a and b are measured
    (tmp_path / "t").mkdir()
    folder = write_trace(tmp_path / "t", pods, gpus=1)
    out = tmp_path / "out"
    args = ["sim", "replay", "--trace-dir", str(folder), "--trace", "t", "--queue", "fifo", "--plot"]
    monkeypatch.setattr(sys, "argv", ["gpuslice", *args, "--out", str(out)])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    assert "MIG (t, bestfit, fifo, load 1): 2 pods, 2 started, wait mean 50 s, p99 98 s" in text
    (record,) = json.loads((out / "results.json").read_text())
    assert record["mig"]["pods"] == 2 and record["mean_allocation_pct"] is None  # no GPU outside MIG mode
