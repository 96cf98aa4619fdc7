"""``gpuslice topo show`` and ``topo pick``: tables on success, a UserError naming the input otherwise."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuslice.cli.topo import app, parse_gpu_list
from gpuslice.errors import UnknownPolicy, UserError
from gpuslice.hardware.topology_nvml import NvmlUnavailable
from gpuslice.policies.gpuset import GpuSetUnavailable

FIXTURES = Path(__file__).parents[1] / "hardware" / "fixtures"
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_show_a_built_in_system_prints_matrix_groups_and_bandwidth():
    result = invoke("show", "--system", "dgx1-v100")
    assert result.exit_code == 0, result.output
    assert "NV2" in result.output and "SYS" in result.output
    assert "NVLink groups" in result.output and "0, 1, 2, 3, 4, 5, 6, 7" in result.output
    assert "50" in result.output and "6.3" in result.output


def test_show_from_a_file_reads_nvidia_smi_output():
    result = invoke("show", "--from-file", str(FIXTURES / "dgx_a100.txt"))
    assert result.exit_code == 0, result.output
    assert "NVSwitch" in result.output and "NV12" in result.output and "48-63,176-191" in result.output


def test_show_pcie_machine_lists_each_gpu_as_its_own_group():
    result = invoke("show", "--system", "pcie-4x-l4")
    assert result.exit_code == 0 and result.output.count("(no NVLink)") == 4


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (["show"], UserError, "exactly one of"),
        (["show", "--system", "dgx-a100", "--local"], UserError, "exactly one of"),
        (["show", "--system", "dgx-9"], UserError, "known: dgx1-v100"),
        (["pick", "--system", "dgx1-v100", "--gpus", "9"], GpuSetUnavailable, "asked for 9 GPUs"),
        (["pick", "--system", "dgx1-v100", "--gpus", "1", "--busy", "0,9"], UserError, "GPU 9"),
        (["pick", "--system", "dgx1-v100", "--gpus", "1", "--busy", "a,b"], UserError, "invalid GPU list"),
        (["pick", "--system", "dgx1-v100", "--gpus", "2", "--policy", "nope"], UnknownPolicy, "known:"),
    ],
)
def test_bad_input_is_a_user_error_naming_it(args, error, match):
    result = invoke(*args)
    assert isinstance(result.exception, error), result.output
    assert result.exit_code != 0
    assert re.search(match, str(result.exception))


def test_show_local_without_nvml_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    result = invoke("show", "--local")
    assert isinstance(result.exception, NvmlUnavailable)
    assert "install nvidia-ml-py" in str(result.exception)


def test_pick_prints_the_chosen_set_and_its_bandwidth():
    result = invoke("pick", "--system", "dgx1-v100", "--gpus", "4", "--busy", "0,3")
    assert result.exit_code == 0, result.output
    assert "4, 5, 6, 7" in result.output and "25" in result.output


@pytest.mark.parametrize("policy", ["exact", "besteffort", "hami", "random"])
def test_pick_runs_every_policy(policy):
    result = invoke("pick", "--system", "pcie-8gpu-2socket", "--gpus", "2", "--policy", policy)
    assert result.exit_code == 0, result.output
    assert policy in result.output and "GB/s" in result.output


def test_gpu_lists_parse_or_fail_clearly():
    assert parse_gpu_list("0, 3") == [0, 3] and parse_gpu_list("") == []
    with pytest.raises(UserError, match="invalid GPU list '1-3'"):
        parse_gpu_list("1-3")


def test_pick_is_the_choice_the_placer_and_device_plugin_make():
    from gpuslice.hardware.topology_profiles import profile
    from gpuslice.policies.gpuset.pick import pick_gpu_set
    from gpuslice.workload.job import TopologyNeed

    expected = pick_gpu_set(profile("dgx1-v100"), [1, 2, 3, 4, 5, 6, 7], 3, need=TopologyNeed.NVLINK)
    result = invoke("pick", "--system", "dgx1-v100", "--gpus", "3", "--busy", "0", "--need", "nvlink")
    assert result.exit_code == 0, result.output
    assert ", ".join(map(str, expected)) in result.output and "need nvlink" in result.output


def test_pick_with_a_need_no_free_set_meets_says_so():
    result = invoke("pick", "--system", "pcie-8gpu-2socket", "--gpus", "2", "--need", "nvlink")
    assert isinstance(result.exception, UserError)
    assert "meet --need nvlink" in str(result.exception)


def test_assign_shows_the_joint_sets_beside_greedy_and_round_robin():
    result = invoke("assign", "--machine", "dgx1", "--jobs", "2,2", "--busy", "0,1,2,5", "--json")
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.output)
    rows = report["jobs"]
    assert [r["batch"] for r in rows] == [[4, 6], [3, 7]]
    assert [r["greedy"] for r in rows] == [[4, 7], [3, 6]]
    assert [r["round_robin"] for r in rows] == [[3, 4], [6, 7]]
    assert report["total"] == {
        "batch_allreduce_ms": 80.0,  # two NV1 pairs: 2·½·1 GB / 25 GB/s each
        "greedy_allreduce_ms": round(20.0 + 1e3 / (15.75 * 0.4), 3),  # NV2 pair + a SYS PCIe pair
        "round_robin_allreduce_ms": round(1e3 / (15.75 * 0.4) + 20.0, 3),
    }
    assert rows[0]["latency_hops"] == 1.0 and rows[0]["cost"] > 0


def test_assign_table_names_the_waiting_job_and_why():
    result = invoke("assign", "--machine", "nvswitch8", "--jobs", "4,4,2")
    assert result.exit_code == 0, result.output
    assert "job2 waits: needs 2 GPU(s)" in result.output.replace("\n", " ")


def test_assign_reads_an_nvidia_smi_file():
    result = invoke("assign", "--machine", str(FIXTURES / "dgx_a100.txt"), "--jobs", "2,2", "--json")
    assert result.exit_code == 0, result.output
    assert '"machine": "dgx_a100"' in result.output
