"""sim.trace: openb node and pod CSVs, validated row by row."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.errors import TraceFormatError, UnknownTrace
from gpuslice.hardware.node import NodeSpec
from gpuslice.sim.trace import BUNDLED_TRACES, NODE_FILE, bundled_dir, load_nodes, load_pods, load_trace
from gpuslice.units import MiB
from gpuslice.workload.request import Request

SHARED_OPENB = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "openb"
needs_shared_openb = pytest.mark.skipif(not SHARED_OPENB.is_dir(), reason=f"no openb data at {SHARED_OPENB}")

NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
node-a,32000,65536,4,V100M16
node-b,16000,32768,2,T4
"""
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,"
    "gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)


def write_trace(directory: Path, name: str, pods: str, nodes: str = NODES_CSV) -> Path:
    (directory / NODE_FILE).write_text(nodes)
    (directory / f"openb_pod_list_{name}.csv").write_text(pods)
    return directory


def test_the_bundled_default_trace_has_8152_pods_on_1213_nodes_with_6212_gpus() -> None:
    trace = load_trace()
    assert trace.name == "default"
    assert len(trace.pods) == 8152
    assert len(trace.nodes) == 1213
    assert sum(n.gpu_count for n in trace.nodes) == 6212
    assert trace.total_gpu_milli == 6_212_000
    assert "default" in BUNDLED_TRACES
    assert (bundled_dir() / NODE_FILE).is_file()


def test_the_first_default_pod_is_read_field_by_field() -> None:
    pod = load_trace().pods[0]
    assert pod.name == "openb-pod-0000"
    assert pod.request == Request(cpu_milli=12000, memory_bytes=16384 * MiB, num_gpu=1, gpu_milli=1000)


def test_a_small_trace_loads_from_a_directory(tmp_path: Path) -> None:
    pods = POD_HEADER + (
        "p0,4000,1024,1,500,,LS,Running,0,10,0\n"
        "p1,8000,2048,2,1000,V100M32|V100M16,LS,Running,0,10,0\n"
        "p2,1000,512,0,0,,BE,Running,0,10,0\n"
    )
    trace = load_trace("tiny", write_trace(tmp_path, "tiny", pods))
    assert trace.nodes == (
        NodeSpec("node-a", 32000, 65536 * MiB, 4, "V100M16"),
        NodeSpec("node-b", 16000, 32768 * MiB, 2, "T4"),
    )
    assert [p.name for p in trace.pods] == ["p0", "p1", "p2"]
    assert trace.pods[0].request == Request(cpu_milli=4000, memory_bytes=1024 * MiB, num_gpu=1, gpu_milli=500)
    assert trace.pods[2].request.num_gpu == 0
    assert trace.total_gpu_milli == 6000


def test_gpu_spec_with_a_bar_becomes_sorted_gpu_models(tmp_path: Path) -> None:
    pods = POD_HEADER + "p0,4000,1024,1,1000,V100M32|V100M16,LS,Running,0,10,0\n"
    (pod,) = load_trace("spec", write_trace(tmp_path, "spec", pods)).pods
    assert pod.request.gpu_models == ("V100M16", "V100M32")


def test_the_five_column_multigpu_format_loads(tmp_path: Path) -> None:
    pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,1024,2,1000\np1,2000,512,1,250\n"
    trace = load_trace("multigpu99", write_trace(tmp_path, "multigpu99", pods))
    assert [p.request.total_gpu_milli for p in trace.pods] == [2000, 250]
    assert all(p.request.gpu_models == () for p in trace.pods)


def test_gpu_milli_above_one_gpu_is_capped_at_1000(tmp_path: Path) -> None:
    pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,1024,1,1200\n"
    (pod,) = load_trace("cap", write_trace(tmp_path, "cap", pods)).pods
    assert pod.request.gpu_milli == 1000


def test_a_non_integer_field_names_the_file_and_the_row(tmp_path: Path) -> None:
    pods = POD_HEADER + "p0,4000,1024,1,500,,LS,Running,0,10,0\np1,lots,1024,1,500,,LS,Running,0,10,0\n"
    write_trace(tmp_path, "bad", pods)
    with pytest.raises(TraceFormatError) as info:
        load_trace("bad", tmp_path)
    message = str(info.value)
    assert str(tmp_path / "openb_pod_list_bad.csv") in message
    assert "row 3" in message  # the header is row 1
    assert "cpu_milli is 'lots'" in message


def test_a_request_that_contradicts_itself_is_a_format_error_with_its_row(tmp_path: Path) -> None:
    pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,1024,2,500\n"
    with pytest.raises(TraceFormatError, match=r"openb_pod_list_share2\.csv, row 2: .*one GPU only"):
        load_trace("share2", write_trace(tmp_path, "share2", pods))


def test_a_missing_column_is_a_format_error_naming_the_column(tmp_path: Path) -> None:
    pods = "name,cpu_milli,memory_mib,num_gpu\np0,4000,1024,1\n"
    with pytest.raises(TraceFormatError, match=r"lacks column.*gpu_milli"):
        load_trace("short", write_trace(tmp_path, "short", pods))


def test_a_malformed_node_row_names_the_node_file_and_row(tmp_path: Path) -> None:
    nodes = NODES_CSV + "node-c,16000,32768,9,T4\n"
    pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,0,0\n"
    with pytest.raises(TraceFormatError, match=r"gpu_node\.csv, row 4: .*9 GPUs"):
        load_trace("x", write_trace(tmp_path, "x", pods, nodes))


def test_empty_node_and_pod_files_are_format_errors(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n")
    (tmp_path / "pods.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    with pytest.raises(TraceFormatError, match="no nodes"):
        load_nodes(tmp_path / "nodes.csv")
    with pytest.raises(TraceFormatError, match="no pods"):
        load_pods(tmp_path / "pods.csv")


def test_an_unknown_trace_name_lists_the_known_ones(tmp_path: Path) -> None:
    for name in ("beta", "alpha"):
        write_trace(tmp_path, name, "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,0,0\n")
    with pytest.raises(UnknownTrace, match=r"no trace 'gamma'.*known here: alpha, beta"):
        load_trace("gamma", tmp_path)


def test_an_unknown_bundled_trace_points_at_trace_dir_and_lists_default() -> None:
    with pytest.raises(UnknownTrace, match=r"--trace-dir.*known here: default"):
        load_trace("gpushare40")


def test_a_directory_without_the_node_list_is_an_unknown_trace(tmp_path: Path) -> None:
    (tmp_path / "openb_pod_list_lone.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,0,0\n"
    )
    with pytest.raises(UnknownTrace, match=NODE_FILE):
        load_trace("lone", tmp_path)


@needs_shared_openb
def test_the_shared_multigpu_trace_loads_in_the_five_column_format() -> None:
    trace = load_trace("multigpu50", SHARED_OPENB)
    assert len(trace.nodes) == 1213
    assert any(p.request.num_gpu > 1 for p in trace.pods)


@needs_shared_openb
def test_the_shared_gpuspec_trace_pins_pods_to_gpu_models() -> None:
    trace = load_trace("gpuspec10", SHARED_OPENB)
    pinned = [p.request.gpu_models for p in trace.pods if p.request.gpu_models]
    assert ("V100M16", "V100M32") in pinned  # "V100M16|V100M32|V100M32" deduplicated


@needs_shared_openb
def test_the_bundled_default_trace_equals_the_shared_copy() -> None:
    assert load_trace("default", SHARED_OPENB) == load_trace("default")


def test_the_trace_names_help_lists_are_the_published_ones():
    from gpuslice.sim.published import published_results
    from gpuslice.sim.trace import OPENB_TRACES

    assert set(OPENB_TRACES) == {trace for trace, _ in published_results()}
