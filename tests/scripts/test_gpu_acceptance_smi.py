"""The acceptance script's nvidia-smi side: its CSV parsed, and discovery/telemetry/topology compared.

The discovery stage runs against a fake nvidia-smi program (conftest.py) and a fake pynvml describing
the same DGX H100; a changed UUID, a different topology or drifting telemetry must fail its check.
"""

from __future__ import annotations

import types

import pytest
from acceptance_helpers import FIXTURES, TOPO_FIXTURES, dgx_h100_nvml, make_fake_smi

from gpu_acceptance import main as acceptance
from gpu_acceptance.runner import Context
from gpu_acceptance.smi import (
    MEMORY_USED_SLACK_BYTES,
    SmiApp,
    SmiParseError,
    compare_processes,
    compare_telemetry,
    parse_apps,
    parse_gpus,
)

MIB = 1 << 20


def context(tmp_path, smi, nvml) -> Context:
    return Context(
        repo=tmp_path,
        out_dir=tmp_path,
        python="python3",
        env={},
        options={"nvidia_smi": str(smi), "nvml": nvml},
    )


def test_recorded_h100_rows_parse_into_numbers_and_none_for_not_available():
    gpus = parse_gpus((FIXTURES / "smi_dgx_h100_gpus.csv").read_text())
    assert len(gpus) == 8
    first = gpus[0]
    assert (first.name, first.memory_total_bytes, first.memory_used_bytes) == (
        "NVIDIA H100 80GB HBM3",
        81559 * MIB,
        72459 * MIB,
    )
    assert (first.temperature_c, first.power_w, first.mig_mode, first.driver_version) == (
        36.0,
        113.25,
        "Disabled",
        "535.129.03",
    )
    row = (
        "0, GPU-1, NVIDIA H200, 143771, 0, [N/A], [Not Supported], [N/A], [N/A], 00000000:18:00.0, 580.159.03"
    )
    h200 = parse_gpus(row)[0]
    assert h200.utilization_percent is None and h200.temperature_c is None and h200.mig_mode == ""


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0, GPU-1, H100, 81559", id="too few fields"),
        pytest.param("0, GPU-1, H100, lots, 1, 2, 3, 4, Disabled, bus, 535", id="text for a number"),
        pytest.param("[N/A], GPU-1, H100, 81559, 1, 2, 3, 4, Disabled, bus, 535", id="no index"),
    ],
)
def test_malformed_query_output_is_a_parse_error_quoting_it(text):
    with pytest.raises(SmiParseError):
        parse_gpus(text)


def test_compute_apps_rows():
    apps = parse_apps("4242, GPU-aaaa, 1536\n4243, GPU-aaaa, [N/A]\n")
    assert apps == [SmiApp(4242, "GPU-aaaa", 1536 * MIB), SmiApp(4243, "GPU-aaaa", None)]


def test_discovery_stage_agrees_with_nvidia_smi_on_the_same_machine(tmp_path, dgx_h100_smi):
    record = acceptance.discovery_stage(context(tmp_path, dgx_h100_smi, dgx_h100_nvml()))
    failed = [c for c in record["checks"] if not c["ok"]]
    assert not failed
    names = {c["name"] for c in record["checks"]}
    assert {
        "gpu count",
        "gpu0 uuid",
        "gpu7 memory total",
        "gpu3 model",
        "topology labels",
        "gpu5 power",
    } <= names
    assert record["topology"][0][1] == "NV18" and {g["model"] for g in record["gpus"]} == {"H100"}


def test_a_different_uuid_fails_that_gpus_uuid_check_only(tmp_path, dgx_h100_smi):
    record = acceptance.discovery_stage(context(tmp_path, dgx_h100_smi, dgx_h100_nvml(uuid_suffix="-x")))
    failed = {c["name"] for c in record["checks"] if not c["ok"]}
    assert failed == {f"gpu{i} uuid" for i in range(8)}


def test_a_different_topology_fails_the_label_check_and_names_pairs(tmp_path):
    smi = make_fake_smi(
        tmp_path / "smi",
        gpus=(FIXTURES / "smi_dgx_h100_gpus.csv").read_text(),
        topo=(TOPO_FIXTURES / "dgx1_v100.txt").read_text(),
    )
    record = acceptance.discovery_stage(context(tmp_path, smi, dgx_h100_nvml()))
    labels = next(c for c in record["checks"] if c["name"] == "topology labels")
    assert not labels["ok"] and labels["differ"][0].startswith("GPU0-GPU1: nvml NV18, smi NV")


def test_memory_used_far_from_nvidia_smi_fails_the_telemetry_check(tmp_path, dgx_h100_smi):
    nvml = dgx_h100_nvml(extra_used=MEMORY_USED_SLACK_BYTES + 64 * MIB)
    record = acceptance.discovery_stage(context(tmp_path, dgx_h100_smi, nvml))
    failed = {c["name"] for c in record["checks"] if not c["ok"]}
    assert failed == {f"gpu{i} memory used" for i in range(8)}


def test_telemetry_missing_on_one_side_only_disagrees():
    reading = types.SimpleNamespace(
        index=0,
        utilization_percent=None,
        memory_used_bytes=MIB,
        temperature_celsius=40.0,
        power_watts=None,
        ecc_uncorrected=0,
    )
    row = "0, GPU-1, H100, 81559, 1, [N/A], 40, 100.0, Disabled, bus, 535"
    checks = {c["name"]: c["ok"] for c in compare_telemetry([reading], parse_gpus(row))}
    assert checks == {
        "gpu0 memory used": True,
        "gpu0 temperature": True,
        "gpu0 power": False,
        "gpu0 utilization": True,
    }


def test_job_memory_is_summed_over_the_jobs_processes_and_compared():
    apps = [SmiApp(10, "GPU-a", 1000 * MIB), SmiApp(11, "GPU-a", 24 * MIB), SmiApp(20, "GPU-a", 3000 * MIB)]
    checks = compare_processes(
        {"job_a": (1024 * MIB, {10, 11}), "job_b": (2000 * MIB, {20}), "job_c": (5 * MIB, {30})}, apps
    )
    assert [(c["name"], c["ok"], c["smi"]) for c in checks] == [
        ("job_a memory", True, 1024 * MIB),
        ("job_b memory", False, 3000 * MIB),
        ("job_c memory", False, None),
    ]


def test_a_single_gpu_has_no_pairs_and_no_nvswitch_to_compare():
    from gpu_acceptance.smi import compare_topology
    from gpuslice.hardware.topology_smi import parse_topo_matrix

    one = parse_topo_matrix("\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-15\t0\t\tN/A\n")
    nvml_view = types.SimpleNamespace(n_gpus=1, nvswitch=True, label=one.label)  # NVLinks to switches
    checks = compare_topology(nvml_view, one)
    assert [(c["name"], c["ok"]) for c in checks] == [("topology gpu count", True), ("topology labels", True)]
