"""MIG in sim: a trace's MIG-mode GPUs are set aside for MIG instances, MIG pods get an instance through
the placer's MIG path (the one MIG choice, ``Ledger.reserve_mig``), and ``sim openb`` reports them."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpuslice.cli.main import main
from gpuslice.errors import InvalidRequest, TraceFormatError
from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger.fit import code_number
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode
from gpuslice.policies import PolicyContext, placement_policy
from gpuslice.scheduler.placer import Placer, Unplaced
from gpuslice.sim.cluster_ledger import cluster_ledger, mig_slices_held, set_aside_milli
from gpuslice.sim.openb import replay
from gpuslice.sim.trace import NODE_FILE, load_trace
from gpuslice.units import GiB
from gpuslice.workload.request import Request, RequestKind


def placer_on(nodes: list[NodeSpec], policy: str = "bestfit") -> Placer:
    ledger = cluster_ledger(nodes)
    return Placer(ledger, placement_policy(policy)(ledger.view, PolicyContext(rng=np.random.default_rng(0))))


def a100(name: str, mig_gpus: int, cpu: int = 64_000) -> NodeSpec:
    return NodeSpec(name, cpu, 512 * GiB, 8, "A100-80GB", gpu_memory_bytes=80 * GiB, mig_gpus=mig_gpus)


def test_a_mig_request_is_its_profile_alone():
    assert Request(1000, mig_profile="1g.10gb").kind is RequestKind.MIG
    assert "MIG 1g.10gb" in str(Request(1000, mig_profile="1g.10gb"))
    with pytest.raises(InvalidRequest, match="profile alone"):
        Request(1000, num_gpu=1, gpu_milli=1000, mig_profile="1g.10gb")


def test_shares_and_whole_gpus_never_land_on_mig_gpus_and_mig_pods_only_there():
    placer = placer_on([a100("n0", mig_gpus=4)])
    ledger = placer.ledger
    assert ledger.mig_gpus == ((0, 0), (0, 1), (0, 2), (0, 3))
    assert set_aside_milli(ledger) == 4000 and ledger.allocated_gpu_milli == 4000
    plain: list[Placement] = []
    for req in [Request(1000, num_gpu=1, gpu_milli=300)] * 12 + [Request(1000, num_gpu=2, gpu_milli=1000)]:
        placed = placer.place(req)
        if isinstance(placed, Placement):
            plain.append(placed)
    assert plain and all(set(p.gpus) <= {4, 5, 6, 7} for p in plain)
    instances = [placer.place(Request(1000, mig_profile="1g.10gb")) for _ in range(4 * 7 + 1)]
    held = [p for p in instances if isinstance(p, Placement)]
    assert len(held) == 4 * 7  # seven 1g.10gb instances on each MIG GPU, then none
    assert all(p.mig is not None and p.mig.gpu in {0, 1, 2, 3} and p.gpus == () for p in held)
    assert isinstance(instances[-1], Unplaced)
    assert instances[-1].reasons == Counter({RefusalCode.NO_MIG_SLOT: 1})
    assert mig_slices_held(ledger) == (28, 28)
    ledger.check_invariants()
    for p in held:
        placer.release(p)
    assert mig_slices_held(ledger) == (0, 28)
    ledger.check_invariants()


def test_the_fullest_gpu_takes_the_instance_and_a_table_without_the_profile_offers_none():
    h200 = NodeSpec("h", 64_000, 512 * GiB, 8, "H200", mig_gpus=8)
    placer = placer_on([a100("a", mig_gpus=2), h200])
    first = placer.place(Request(1000, mig_profile="3g.40gb"))
    second = placer.place(Request(1000, mig_profile="1g.10gb"))
    assert isinstance(first, Placement) and isinstance(second, Placement)
    assert (first.node, first.mig.gpu) == (0, 0)  # type: ignore[union-attr]
    assert (second.node, second.mig.gpu) == (0, 0)  # type: ignore[union-attr]  # the fuller GPU
    on_h200 = placer.place(Request(1000, mig_profile="1g.18gb"))  # H200's smallest profile
    assert isinstance(on_h200, Placement) and on_h200.node == 1


def test_why_a_mig_pod_waits_names_each_nodes_first_failing_check():
    placer = placer_on([a100("busy", mig_gpus=1, cpu=500), a100("full", mig_gpus=1), a100("v", 0)])
    for _ in range(2):
        assert isinstance(placer.place(Request(1000, mig_profile="3g.40gb")), Placement)
    unplaced = placer.place(Request(1000, mig_profile="3g.40gb"))
    assert isinstance(unplaced, Unplaced)
    assert unplaced.reasons == Counter({RefusalCode.INSUFFICIENT_CPU: 1, RefusalCode.NO_MIG_SLOT: 2})
    pinned = placer.place(Request(1000, gpu_models=("H100",), mig_profile="1g.10gb"))
    assert isinstance(pinned, Unplaced)
    assert pinned.reasons == Counter({RefusalCode.GPU_MODEL_NOT_ALLOWED: 3})  # the rule's order: model first
    assert list(placer.ledger.refusal_codes(Request(1000, mig_profile="3g.40gb"))) == [
        code_number(RefusalCode.INSUFFICIENT_CPU), code_number(RefusalCode.NO_MIG_SLOT),
        code_number(RefusalCode.NO_MIG_SLOT)]  # fmt: skip


def test_a_mig_request_is_held_with_its_instance_only():
    ledger = cluster_ledger([a100("n0", mig_gpus=1)])
    req = Request(1000, mig_profile="1g.10gb")
    assert ledger.reserve(0, (), req) == Refusal(RefusalCode.NO_MIG_SLOT, 0)  # never as columns alone
    other = MigInstance(mig_gpu("A100-80GB").profile("2g.20gb"), 0)
    assert ledger.reserve_mig(0, 0, other, req) == Refusal(RefusalCode.NO_MIG_SLOT, 0, gpu=0)
    assert len(ledger.live_placements) == 1  # only the set-aside GPU


NODES = """sn,cpu_milli,memory_mib,gpu,model,mig_gpus
a,64000,524288,8,A100-80GB,4
b,64000,524288,8,A100-80GB,
c,32000,131072,4,T4,0
"""
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,mig_profile\n"


def write(directory: Path, pods: str, nodes: str = NODES) -> Path:
    (directory / NODE_FILE).write_text(nodes)
    (directory / "openb_pod_list_mig.csv").write_text(HEADER + pods)
    return directory


def test_the_mig_columns_are_read(tmp_path):
    trace = load_trace("mig", write(tmp_path, "p0,1000,1024,1,0,,1g.10gb\np1,1000,1024,1,500,,\n"))
    assert [n.mig_gpus for n in trace.nodes] == [4, 0, 0]
    assert trace.total_gpu_milli == (4 + 8 + 4) * 1000  # MIG-mode GPUs are not in the GPU capacity
    assert trace.pods[0].request == Request(1000, 1024 * 2**20, mig_profile="1g.10gb")
    assert trace.pods[1].request == Request(1000, 1024 * 2**20, num_gpu=1, gpu_milli=500)


@pytest.mark.parametrize(
    ("nodes", "pods", "message"),
    [
        pytest.param(NODES.replace(",4\n", ",9\n", 1), "p,1,1,1,0,,1g.10gb\n", "row 2: .*9 GPUs in MIG mode",
                     id="more MIG GPUs than GPUs"),
        pytest.param(NODES.replace(",4\n", ",-1\n", 1), "p,1,1,1,0,,1g.10gb\n", "row 2: .*-1 GPUs in MIG",
                     id="negative"),
        pytest.param(NODES.replace(",4\n", ",four\n", 1), "p,1,1,1,0,,1g.10gb\n", "row 2: mig_gpus is 'four'",
                     id="not a number"),
        pytest.param(NODES.replace("T4,0", "T4,2"), "p,1,1,1,0,,1g.10gb\n", "row 4: 'T4' has no MIG profile",
                     id="a model without a MIG table"),
        pytest.param(NODES, "p,1,1,2,1000,,1g.10gb\n", "row 2: .*num_gpu must be 1, not 2", id="two GPUs"),
        pytest.param(NODES, "p,1,1,1,0,,9g.99gb\n", "no MIG-mode GPU .* offers MIG profile '9g.99gb'",
                     id="unknown profile"),
        pytest.param(NODES.replace(",4\n", ",0\n", 1), "p,1,1,1,0,,1g.10gb\n", "no node has mig_gpus",
                     id="no MIG GPU at all"),
        pytest.param(NODES, "p,1,1,1,0,,19\n", "offers MIG profile '19'",
                     id="a profile ID, not its name (the placer matches names)"),
    ],
)  # fmt: skip
def test_bad_mig_columns_are_one_error_naming_the_row(tmp_path, nodes, pods, message):
    with pytest.raises(TraceFormatError, match=message):
        load_trace("mig", write(tmp_path, pods, nodes))


def test_sim_openb_places_mig_pods_and_reports_them_apart(tmp_path, monkeypatch, capsys):
    pods = "".join(f"m{i},1000,1024,1,0,,{'3g.40gb' if i % 3 == 0 else '1g.10gb'}\n" for i in range(40))
    pods += "".join(f"s{i},2000,4096,1,500,,\n" for i in range(30))
    directory = write(tmp_path, pods)
    result = replay(load_trace("mig", directory), "fgd", seed=1, tune=0.5)  # no pod sampled: 15,000 > 8,000
    assert result.total_gpu_milli == 16_000
    assert result.mig is not None and result.mig["pods"] == 40 and result.mig["slices"] == 28
    # 3g.40gb ×2 per GPU (6 slices) or 1g ×7: the 40 pods fill at most the 28 slices
    assert 0 < result.mig["slices_held"] <= 28 and result.mig["failed_pods"] > 0
    assert int(result.allocated_gpu_milli[-1]) == 30 * 500  # the shares alone, off the MIG GPUs

    out = tmp_path / "out"
    args = ["sim", "openb", "--trace-dir", str(directory), "--trace", "mig", "--policy", "fgd"]
    monkeypatch.setattr(sys, "argv", ["gpuslice", *args, "--seeds", "1", "--tune", "1", "--out", str(out)])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    assert "MIG instances" in text and "MIG pods" in text
    (record,) = json.loads((out / "results.json").read_text())
    assert record["mig"]["pods"] >= 40  # and the MIG pods sampled while inflating to 100 %


def test_a_trace_without_mig_has_no_mig_record():
    result = replay(load_trace(), "bestfit", seed=42, tune=0.2)
    assert result.mig is None and "mig" not in result.record()


def test_a_cluster_whose_every_gpu_is_in_mig_mode_has_no_gpu_figures_and_no_warning(tmp_path):
    nodes = "sn,cpu_milli,memory_mib,gpu,model,mig_gpus\na,64000,524288,2,A100-80GB,2\n"
    pods = "".join(f"m{i},1000,1024,1,0,,3g.40gb\n" for i in range(5))
    result = replay(load_trace("mig", write(tmp_path, pods, nodes)), "bestfit", seed=1, tune=1.0)
    assert result.total_gpu_milli == 0 and np.isnan(result.unallocated_pct).all()  # RuntimeWarning fails
    assert result.mig == {"pods": 5, "failed_pods": 1, "slices_held": 12, "slices": 14}
