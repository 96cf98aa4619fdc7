"""``kubectl gpuslice`` (the ``kubectl-gpuslice`` script) against an API server: top, pods and why print
what the annotations, events and device plugin metrics say, and every failure is one line and exit 1.

The API is ``fake_kube_api.FakeKubeApi``, a real HTTP server in the test process: the official client,
its kubeconfig loading and its error paths all run. The cluster: node gpu-a with two H100s (a whole-GPU
pod on GPU 0, two shares on GPU 1), node gpu-b with an A100 in MIG mode (a 1g.10gb pod), a CPU node, a
pending pod the extender refused, a pod that asks for no GPU, and gpu-a's device plugin serving metrics.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_kube_api import FakeKubeApi, kubeconfig_for

from gpuslice.cli import kubectl_plugin
from gpuslice.k8s.annotations import (
    ANNOTATION_NODE_INVENTORY,
    RESOURCE_GPU,
    RESOURCE_GPUCORES,
    RESOURCE_GPUMEM,
    InventoryGpu,
    MigSlot,
    NodeInventory,
    mig_resource,
)
from gpuslice.k8s.decision import Decision, MigChoice

GiB = 1024**3
H100 = InventoryGpu(0, "GPU-a0", "H100-80GB", 81920)


def node(name: str, inventory: NodeInventory | None) -> dict[str, Any]:
    annotations = {ANNOTATION_NODE_INVENTORY: inventory.to_json()} if inventory else {}
    return {"kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}", "annotations": annotations}}


def pod(
    name: str,
    resources: dict[str, str] | None = None,
    *,
    namespace: str = "team",
    decision: Decision | None = None,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    scheduler: str = "gpuslice-scheduler",
    ports: list[dict[str, Any]] | None = None,
    node_name: str = "",
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda"}
    if resources:
        container["resources"] = {"limits": resources}
    if ports:
        container["ports"] = ports
    spec: dict[str, Any] = {"containers": [container], "schedulerName": scheduler}
    if decision or node_name:
        spec["nodeName"] = node_name or decision.node
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "labels": labels or {},
            "annotations": decision.to_annotations() if decision else {},
            "creationTimestamp": "2026-12-05T05:00:00Z",
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def refusal_event(pod_name: str, message: str, when: str, source: str, count: int = 1) -> dict[str, Any]:
    return {
        "kind": "Event",
        "metadata": {"name": f"{pod_name}.{when}", "namespace": "team", "creationTimestamp": when},
        "involvedObject": {
            "kind": "Pod",
            "namespace": "team",
            "name": pod_name,
            "uid": f"uid-team-{pod_name}",
        },
        "reason": "FailedScheduling",
        "message": message,
        "type": "Warning",
        "source": {"component": source},
        "count": count,
        "firstTimestamp": when,
        "lastTimestamp": when,
    }


class EventRecorder:
    """Where the extender's refusal goes: the one call of its API it makes here (``create_event``)."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def create_event(self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str) -> None:
        self.messages.append(message)


def extender_refuses(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], pod_name: str, api: Any
) -> None:
    """The real extender over these objects filters the pod on every node and posts its FailedScheduling
    Event through ``api``: what ``why`` reads is the extender's own wording and amounts."""
    from gpuslice.k8s.extender.kube import RELISTED, WatchEvent
    from gpuslice.k8s.extender.state import ClusterState

    state = ClusterState(api)
    for kind, items in (("Node", nodes), ("Pod", pods)):
        for item in items:
            state.apply(WatchEvent(kind, "ADDED", item))
        state.apply(WatchEvent(kind, RELISTED, {"items": items}))
    pending = next(p for p in pods if p["metadata"]["name"] == pod_name)
    assert not state.filter(pending, [n["metadata"]["name"] for n in nodes]).passed
    state.flush_events()


SCHEDULER_SAYS = (
    "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 gpuslice refused."
)


def metrics_page(busy: dict[tuple[str, int], float]) -> str:
    """gpu-a's device plugin as observe.node_slices writes it: per slice and GPU the memory limit it was
    given, and from its shim region memory used and busy seconds (growing between reads). ``infer-1``
    has two asking containers; ``infer-2`` runs without the shim (a limit, no usage series); a DRA
    claim's series (no pod) is there too."""
    labels = 'namespace="team",pod="{}",container="{}",claim="",gpu="{}"'
    lines = [
        "# HELP gpuslice_pod_memory_limit_bytes GPU memory the slice was given on the GPU",
        "# TYPE gpuslice_pod_memory_limit_bytes gauge",
    ]
    for name, container, gpu in (
        ("train", "", 0),
        ("infer-1", "a", 1),
        ("infer-1", "b", 1),
        ("infer-2", "", 1),
    ):
        lines.append(f"gpuslice_pod_memory_limit_bytes{{{labels.format(name, container, gpu)}}} {10 * GiB}")
    lines += [
        "# HELP gpuslice_pod_memory_used_bytes GPU memory the slice holds through the shim",
        "# TYPE gpuslice_pod_memory_used_bytes gauge",
    ]
    used = {("train", "", 0): 60 * GiB, ("infer-1", "a", 1): 10 * GiB, ("infer-1", "b", 1): 8 * GiB}
    for (name, container, gpu), value in used.items():
        lines.append(f"gpuslice_pod_memory_used_bytes{{{labels.format(name, container, gpu)}}} {value}")
    lines.append('gpuslice_pod_memory_used_bytes{namespace="team",pod="",container="",claim="c1",gpu="1"} 99')
    lines += [
        "# HELP gpuslice_pod_compute_busy_seconds kernel time the shim measured",
        "# TYPE gpuslice_pod_compute_busy_seconds counter",
    ]
    for (name, gpu), value in busy.items():
        lines.append(f"gpuslice_pod_compute_busy_seconds_total{{{labels.format(name, 'a', gpu)}}} {value}")
    lines += [
        "# HELP gpuslice_gpu_slices x",
        "# TYPE gpuslice_gpu_slices gauge",
        'gpuslice_gpu_slices{gpu="0"} 1',
    ]
    return "\n".join(lines) + "\n"


class BusyCounter:
    """gpu-a's metrics as a live plugin serves them: ``train`` keeps GPU 0 busy all the time, ``infer-1``
    a quarter of it (the counters grow with the clock); ``infer-2`` has no shim region to measure."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> str:
        self.reads += 1
        now = time.monotonic()
        return metrics_page({("train", 0): 1.0 * now, ("infer-1", 1): 0.25 * now})


def two_node_cluster() -> FakeKubeApi:
    a100_mig = InventoryGpu(0, "GPU-b0", "A100-80GB", 81920, mig=(MigSlot("1g.10gb", 4, "MIG-1"),))
    gpu_a = NodeInventory((H100, InventoryGpu(1, "GPU-a1", "H100-80GB", 81920)), split_count=10)
    api = FakeKubeApi(
        nodes=[node("gpu-a", gpu_a), node("gpu-b", NodeInventory((a100_mig,))), node("cpu-1", None)],
        pods=[
            pod("train", {RESOURCE_GPU: "1"}, decision=Decision("gpu-a", "main", (0,), ("GPU-a0",), 0, 100)),
            pod(
                "infer-1",
                {RESOURCE_GPU: "1", RESOURCE_GPUMEM: "20480", RESOURCE_GPUCORES: "30"},
                decision=Decision("gpu-a", "main", (1,), ("GPU-a1",), 20480, 30),
            ),
            pod(
                "infer-2",
                {RESOURCE_GPU: "1", RESOURCE_GPUMEM: "10240", RESOURCE_GPUCORES: "20"},
                decision=Decision("gpu-a", "main", (1,), ("GPU-a1",), 10240, 20),
            ),
            pod(
                "mig-job",
                {mig_resource("1g.10gb"): "1"},
                namespace="research",
                decision=Decision("gpu-b", "main", mig=MigChoice(0, "1g.10gb", 4, "MIG-1")),
            ),
            pod("waiting", {RESOURCE_GPU: "1", RESOURCE_GPUMEM: "90000"}, phase="Pending"),
            pod("web", None),
            pod(
                "gpuslice-device-plugin-x1",
                None,
                namespace="gpuslice",
                labels={"app": "gpuslice-device-plugin"},
                ports=[{"name": "metrics", "containerPort": 9445}],
                node_name="gpu-a",
            ),
        ],
    )
    recorder = EventRecorder()
    extender_refuses(api.nodes, api.pods, "waiting", recorder)
    api.events = [
        refusal_event("waiting", SCHEDULER_SAYS, "2026-12-05T05:10:00Z", "gpuslice-scheduler", count=4),
        refusal_event("waiting", recorder.messages[0], "2026-12-05T05:12:00Z", "gpuslice-extender", count=2),
        refusal_event("web", "0/3 nodes are available: something else", "2026-12-05T05:13:00Z", "x"),
    ]
    api.metrics[("gpuslice", "gpuslice-device-plugin-x1", 9445)] = BusyCounter()
    return api


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeApi]:
    api = two_node_cluster().start()
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(api.url, tmp_path, namespace="team")))
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield api
    api.stop()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        kubectl_plugin.main(list(args))
    out = capsys.readouterr()
    return int(ended.value.code or 0), out.out, out.err


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


def no_wider_than(text: str, width: int = 80) -> None:
    too_wide = [line for line in text.splitlines() if len(line.rstrip()) > width]
    assert not too_wide, f"lines wider than {width}:\n" + "\n".join(too_wide)


# ---- top ------------------------------------------------------------------------------------------------


def test_top_shows_each_gpu_with_the_slices_its_annotations_hold(cluster, capsys):
    code, out, err = run(capsys, "top", "--interval", "0")
    assert (code, err) == (0, "")
    no_wider_than(out)
    # whole GPU 0: nothing else can land, all its memory is allocated; GPU 1: 20 + 10 GiB, 30 + 20 %;
    # the MIG GPU: its 1g.10gb instance, 1 of its 8 memory slices and 1 of its 7 compute slices
    assert rows(out)[:13] == [
        ["gpu-a:", "2", "×", "H100-80GB"],
        ["GPU", "MEMORY", "MEM", "ALLOC", "MEM", "FREE", "CORE", "ALLOC", "USED", "BUSY"],
        ["0", "80", "GiB", "80", "GiB", "0", "B", "100", "%", "60", "GiB", "-"],
        ["1", "80", "GiB", "30", "GiB", "50", "GiB", "50", "%", "-", "-"],  # infer-2's use is unknown
        ["POD", "GPU", "SLICE", "USED", "BUSY"],
        ["team/train", "0", "whole", "60", "GiB", "-"],
        ["team/infer-1", "1", "20480", "MiB,", "30", "%", "18", "GiB", "-"],  # its two containers
        ["team/infer-2", "1", "10240", "MiB,", "20", "%", "-", "-"],
        ["gpu-b:", "1", "×", "A100-80GB"],
        ["GPU", "MEMORY", "MEM", "ALLOC", "MEM", "FREE", "CORE", "ALLOC", "USED", "BUSY"],
        ["0", "MIG", "80", "GiB", "10", "GiB", "70", "GiB", "14", "%", "-", "-"],
        ["POD", "GPU", "SLICE", "USED", "BUSY"],
        ["research/mig-job", "0", "MIG", "1g.10gb", "-", "-"],
    ]
    # why a figure is "-": said once each, dimly, not as an error
    notes = [n.strip() for n in " ".join(out.split()).split("note: ")[1:]]
    assert notes == [
        "usage not shown for gpu-b: no running gpuslice device plugin with a metrics port",
        "no usage series for team/infer-2: their device plugin reads usage from the shim's regions, which a "
        "slice without shim sharing does not have",
    ]


def test_top_and_pods_read_compute_busy_from_two_reads_of_the_device_plugin(cluster, capsys):
    code, out, err = run(capsys, "top", "--interval", "0.3", "-o", "json")
    assert (code, err) == (0, "")
    gpus = {(g["node"], g["index"]): g for g in json.loads(out)["gpus"]}
    assert gpus[("gpu-a", 0)]["busyPercent"] == pytest.approx(100, abs=5)  # train: busy all the time
    assert gpus[("gpu-a", 0)]["usedMemoryBytes"] == 60 * GiB
    assert gpus[("gpu-a", 1)]["busyPercent"] is None  # infer-2 has no usage series: the sum is unknown
    assert gpus[("gpu-b", 0)]["busyPercent"] is None and gpus[("gpu-b", 0)]["usedMemoryBytes"] is None
    assert cluster.metrics[("gpuslice", "gpuslice-device-plugin-x1", 9445)].reads == 2
    code, out, err = run(capsys, "pods", "--interval", "0.3", "-o", "json")
    found = {p["name"]: p for p in json.loads(out)["pods"]}
    assert found["infer-1"]["busyPercent"] == pytest.approx(25, abs=5)  # a quarter of the time
    assert found["infer-1"]["usedMemoryBytes"] == 18 * GiB
    assert found["infer-2"]["busyPercent"] is None and found["infer-2"]["usedMemoryBytes"] is None
    assert found["waiting"]["busyPercent"] is None


def test_top_json_has_the_documented_keys(cluster, capsys):
    code, out, _ = run(capsys, "top", "--interval", "0", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert sorted(data) == ["gpus", "notes"]
    gpu = next(g for g in data["gpus"] if (g["node"], g["index"]) == ("gpu-a", 1))
    assert gpu == {
        "node": "gpu-a",
        "index": 1,
        "model": "H100-80GB",
        "healthy": True,
        "mig": False,
        "memoryBytes": 80 * GiB,
        "allocatedMemoryBytes": 30 * GiB,
        "freeMemoryBytes": 50 * GiB,
        "allocatedComputePercent": 50.0,
        "freeComputePercent": 50.0,
        "usedMemoryBytes": None,  # infer-2 has no usage series: the sum is unknown
        "busyPercent": None,
        "slices": [
            {"namespace": "team", "pod": "infer-1", "kind": "share", "memoryBytes": 20 * GiB,
             "computePercent": 30.0, "migProfile": None},
            {"namespace": "team", "pod": "infer-2", "kind": "share", "memoryBytes": 10 * GiB,
             "computePercent": 20.0, "migProfile": None},
        ],
    }  # fmt: skip
    mig = next(g for g in data["gpus"] if g["node"] == "gpu-b")
    assert mig["slices"] == [
        {"namespace": "research", "pod": "mig-job", "kind": "mig", "memoryBytes": mig["allocatedMemoryBytes"],
         "computePercent": 14.2, "migProfile": "1g.10gb"}  # 142 milli: 1 of 7 slices, as serve counts it
    ]  # fmt: skip


# ---- pods -----------------------------------------------------------------------------------------------


def test_pods_lists_the_namespaces_gpu_pods_with_slice_gpu_node_and_use(cluster, capsys):
    code, out, err = run(capsys, "pods", "--interval", "0")
    assert (code, err) == (0, "")
    no_wider_than(out)
    assert rows(out) == [
        ["POD", "STATUS", "SLICE", "GPU", "NODE", "USED", "BUSY"],
        ["infer-1", "Running", "20480", "MiB,", "30", "%", "of", "1", "GPU", "1", "gpu-a", "18", "GiB", "-"],
        ["infer-2", "Running", "10240", "MiB,", "20", "%", "of", "1", "GPU", "1", "gpu-a", "-", "-"],
        ["train", "Running", "1", "GPU", "0", "gpu-a", "60", "GiB", "-"],
        ["waiting", "Pending", "90000", "MiB", "of", "1", "GPU", "-", "-", "-", "-"],
    ]  # web asks for no GPU; mig-job is in namespace research


def test_pods_all_namespaces_adds_the_namespace_and_the_mig_pod(cluster, capsys):
    code, out, _ = run(capsys, "pods", "-A", "--interval", "0", "-o", "json")
    assert code == 0
    found = {(p["namespace"], p["name"]): p for p in json.loads(out)["pods"]}
    assert sorted(found) == [
        ("research", "mig-job"), ("team", "infer-1"), ("team", "infer-2"), ("team", "train"),
        ("team", "waiting"),
    ]  # fmt: skip
    assert found[("research", "mig-job")]["gpus"] == [0]
    assert found[("research", "mig-job")]["slices"][0]["migProfile"] == "1g.10gb"
    assert found[("team", "waiting")]["node"] is None and found[("team", "waiting")]["phase"] == "Pending"
    code, out, _ = run(capsys, "pods", "-n", "research", "--interval", "0")
    assert [r[:2] for r in rows(out)[:3]] == [["POD", "STATUS"], ["mig-job", "Running"], ["note:", "usage"]]


# ---- why ------------------------------------------------------------------------------------------------


def test_why_prints_the_refusals_newest_first_with_their_amounts(cluster, capsys):
    code, out, err = run(capsys, "why", "waiting")
    assert (code, err) == (0, "")
    no_wider_than(out)
    lines = out.splitlines()
    # each message indented under its heading, every wrapped line too, with no padding after it
    assert [line[:2] for line in lines[2:-3]] == ["  "] * (len(lines) - 5) and len(lines) > 6
    assert all(line == line.rstrip() for line in lines)
    text = " ".join(out.split())
    assert text.startswith("pod team/waiting is pending; it asks for 90000 MiB of 1 GPU.")
    extender = text.index("FailedScheduling from gpuslice-extender")
    scheduler = text.index("FailedScheduling from gpuslice-scheduler")
    assert extender < scheduler  # 05:12 before 05:10
    refusal = cluster.events[1]["message"]  # the extender's own, with its amounts
    assert (
        refusal.startswith("gpuslice: 0/3 nodes fit: ")
        and "90000 MiB" in refusal
        and "; closest: " in refusal
    )
    assert " ".join(refusal.split()) in text and "2 times" in text and "4 times" in text
    assert "something else" not in text  # another pod's event


def said(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What the command printed, its lines (wrapped at 80 columns) joined."""
    code, out, err = run(capsys, *args)
    assert (code, err) == (0, "")
    return " ".join(out.split())


def test_why_says_where_a_bound_pod_runs_and_that_a_plain_pod_asks_for_no_gpu(cluster, capsys):
    assert said(capsys, "why", "infer-1") == (
        "pod team/infer-1 is not pending: bound to node gpu-a with 20480 MiB, 30 % of GPU 1 (Running)."
    )
    assert said(capsys, "why", "mig-job", "-n", "research") == (
        "pod research/mig-job is not pending: bound to node gpu-b with MIG 1g.10gb on GPU 0 (start 4) "
        "(Running)."
    )
    assert said(capsys, "why", "web") == (
        "pod team/web does not ask for a GPU: no container names a gpuslice.io resource."
    )
    # a pending pod: only its events are read
    assert not any("/events" in path and "infer-1" in path for path in cluster.seen)


def test_why_json(cluster, capsys):
    code, out, _ = run(capsys, "why", "waiting", "-o", "json")
    story = json.loads(out)
    assert code == 0 and story["state"] == "pending" and story["asks"] == "90000 MiB of 1 GPU"
    assert [(e["source"], e["count"], e["lastSeen"]) for e in story["events"]] == [
        ("gpuslice-extender", 2, "2026-12-05T05:12:00+00:00"),
        ("gpuslice-scheduler", 4, "2026-12-05T05:10:00+00:00"),
    ]


# ---- errors: one line on stderr, exit 1, never a traceback -----------------------------------------------


def one_line_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = run(capsys, *args)
    lines = err.strip().splitlines()
    assert (code, out) == (1, ""), err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_no_kubeconfig_anywhere_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    line = one_line_error(capsys, "top")
    assert line.startswith(
        "error: no usable Kubernetes configuration (no kubeconfig (~/.kube/config does not exist)"
    )
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "gone.yaml"))
    assert "gone.yaml does not exist" in one_line_error(capsys, "pods")
    # --kubeconfig names a file that is not there, or is not a kubeconfig
    assert "--kubeconfig" in one_line_error(capsys, "why", "x", "--kubeconfig", str(tmp_path / "nope"))
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    assert "not a kubeconfig" in one_line_error(capsys, "top", "--kubeconfig", str(tmp_path / "list.yaml"))


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("a: [\n", "expected the node content"),  # not YAML
        ("- a\n- b\n", "no usable Kubernetes configuration"),  # YAML, not a mapping
        ("apiVersion: v1\nkind: Config\n", "Expected key current-context"),
        (b"\x85\xff\x00binary", "can't decode"),
        (None, "is not a regular file"),  # a FIFO: the client's open() would wait for a writer for ever
        ("", "is not a regular file"),  # a folder
    ],
    ids=["not-yaml", "a-list", "no-context", "binary", "fifo", "folder"],
)
def test_a_kubeconfig_in_kubeconfig_env_that_is_not_one_is_one_line(
    content, said, tmp_path, monkeypatch, capsys
):
    path = tmp_path / "config"
    if content is None:
        os.mkfifo(path)
    elif content == "":
        path.mkdir()
    else:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}{os.pathsep}{path}")
    line = one_line_error(capsys, "top")
    assert line.startswith("error: no usable Kubernetes configuration") and said in line


def test_an_unknown_context_is_one_line(cluster, capsys):
    line = one_line_error(capsys, "top", "--context", "prod")
    assert "no usable Kubernetes configuration" in line and "prod" in line


def test_an_api_server_that_does_not_answer_is_one_line(tmp_path, monkeypatch, capsys):
    api = FakeKubeApi().start()
    api.stop()  # its port is free again: nothing listens there
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(api.url, tmp_path)))
    line = one_line_error(capsys, "pods")
    assert line.startswith(f"error: cannot reach the API server at {api.url}: ") and "refused" in line


def test_a_verb_rbac_refuses_is_named(cluster, capsys):
    cluster.forbidden["/api/v1/nodes"] = "list nodes"
    line = one_line_error(capsys, "top")
    assert line.startswith(
        'error: no permission to list nodes: 403 Forbidden: nodes is forbidden: User "viewer"'
    )
    cluster.forbidden["/api/v1/namespaces/team/pods"] = "list pods"
    assert one_line_error(capsys, "pods").startswith(
        "error: no permission to list pods in namespace team: 403"
    )
    assert one_line_error(capsys, "why", "waiting").startswith("error: no permission to get pod waiting in ")


def test_credentials_the_api_server_refuses_are_one_line(cluster, capsys):
    cluster.unauthorized = True
    assert one_line_error(capsys, "pods") == (
        f"error: the API server at {cluster.url} refused the credentials (401 Unauthorized: Unauthorized): "
        "check the kubeconfig's user"
    )


def test_help_explains_each_command_with_an_example_at_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "--help")
    assert code == 0 and all(f"  {c} " in out for c in ("top", "pods", "why"))
    for command, example in (("top", "kubectl gpuslice top"), ("pods", "kubectl gpuslice pods -n team-a"),
                             ("why", "kubectl gpuslice why train-7 -n team-a")):  # fmt: skip
        code, out, _ = run(capsys, command, "--help")
        assert code == 0 and f"Example: {example}\n" in out
        assert "$KUBECONFIG, then ~/.kube/config, then the pod's service account" in " ".join(out.split())
        no_wider_than(out)
    assert run(capsys)[:2] == (0, run(capsys, "--help")[1])  # no command: the help, as kubectl's own


def test_pods_without_permission_on_nodes_shows_the_decisions(cluster, capsys):
    """A namespace's user often may not list nodes: the pods and their decisions still show."""
    cluster.forbidden["/api/v1/nodes"] = "list nodes"
    text = said(capsys, "pods", "--interval", "0")
    assert "train Running 1 GPU 0 gpu-a 60 GiB -" in text
    assert "note: slices from the pods' decisions only (no permission to list nodes: 403" in text


def test_usage_that_cannot_be_read_is_a_dash_and_one_note(cluster, capsys):
    cluster.forbidden["/api/v1/namespaces/gpuslice/pods/gpuslice-device-plugin-x1:9445/proxy"] = (
        "get pods/proxy"
    )
    text = said(capsys, "top", "--interval", "0")
    assert "0 80 GiB 80 GiB 0 B 100 % - - 1 80 GiB 30 GiB 50 GiB 50 % - -" in text
    assert (
        "note: usage not shown for gpu-a: no permission to get pods/proxy of "
        "gpuslice/gpuslice-device-plugin-x1: 403 Forbidden" in text
    )
    # no permission to find the plugins at all (pods in every namespace), as a namespace's user
    cluster.forbidden["/api/v1/pods"] = "list pods"
    text = said(capsys, "pods", "--interval", "0")
    assert "train Running 1 GPU 0 gpu-a - -" in text
    assert "note: usage not shown: no permission to list pods in every namespace: 403" in text
    # the plugin does not answer through the proxy, or serves no per-pod series (an older gpuslice)
    del cluster.forbidden["/api/v1/pods"], cluster.forbidden[next(iter(cluster.forbidden))]
    cluster.metrics[("gpuslice", "gpuslice-device-plugin-x1", 9445)] = lambda: "# TYPE up gauge\nup 1\n"
    assert "its device plugin exports no per-pod usage" in said(capsys, "top", "--interval", "0")
    cluster.metrics[("gpuslice", "gpuslice-device-plugin-x1", 9445)] = lambda: "<html>not metrics</html>\n"
    assert "gpu-a: its device plugin's /metrics is not Prometheus text" in said(
        capsys, "top", "--interval", "0"
    )
    del cluster.metrics[("gpuslice", "gpuslice-device-plugin-x1", 9445)]
    text = said(capsys, "top", "--interval", "0")
    assert "its device plugin's /metrics did not answer through the pod proxy" in text and "503" in text


def test_a_cluster_without_gpuslice_is_one_line(cluster, capsys):
    for item in cluster.nodes:
        item["metadata"]["annotations"] = {}
    for command in ("top", "pods"):
        line = one_line_error(capsys, command)
        assert line.startswith("error: gpuslice is not installed in this cluster: no node carries the "
                               "gpuslice.io/node-inventory annotation")  # fmt: skip


def test_a_pod_that_does_not_exist_is_one_line(cluster, capsys):
    assert one_line_error(capsys, "why", "nope") == "error: pod nope not found in namespace team"
    assert one_line_error(capsys, "why", "train", "-n", "research") == (
        "error: pod train not found in namespace research"
    )


def test_a_name_that_cannot_be_a_kubernetes_name_is_one_line_and_never_sent(cluster, capsys):
    assert one_line_error(capsys, "why", "../nodes").startswith("error: invalid pod name '../nodes': ")
    assert one_line_error(capsys, "pods", "-n", "Team A").startswith("error: invalid namespace 'Team A': ")
    assert cluster.seen == []


def test_a_mistyped_command_or_option_is_one_line(cluster, capsys):
    assert "No such command 'topp'" in one_line_error(capsys, "topp")
    assert "--output" in one_line_error(capsys, "top", "-o", "yaml")
    assert "Missing argument" in one_line_error(capsys, "why")


# ---- what others wrote: annotations and events are input ------------------------------------------------


def test_garbage_annotations_are_notes_not_tracebacks(cluster, capsys):
    by_name = {p["metadata"]["name"]: p for p in cluster.pods}
    by_name["infer-2"]["metadata"]["annotations"]["gpuslice.io/gpu-indices"] = "one,two"
    by_name["mig-job"]["metadata"]["annotations"]["gpuslice.io/mig-instance"] = "0:9g.99gb@4"
    by_name["train"]["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPUMEM] = "lots"
    cluster.nodes[1]["metadata"]["annotations"][ANNOTATION_NODE_INVENTORY] = '{"gpus": [{"index": "x"}]}'
    code, out, err = run(capsys, "top", "--interval", "0")
    text = " ".join(out.split())
    assert (code, err) == (0, "")
    assert "team/infer-2: malformed gpuslice decision annotations on a pod" in text
    assert "team/train: container 'main'" in text and "lots" in text
    assert "node gpu-b: malformed gpuslice.io/node-inventory annotation" in text
    # infer-1 is still held on GPU 1; the two others are left out as the extender leaves them out
    assert "1 80 GiB 20 GiB 60 GiB 30 %" in text and "team/infer-2" not in text.split("note:")[0]
    text = said(capsys, "pods", "-A", "--interval", "0")
    assert "note: research/mig-job: not in the ledger: node gpu-b has no gpuslice inventory" in text
    assert "team/train: container 'main': gpuslice.io/gpumem: 'lots' is not a Kubernetes quantity" in text


def test_an_ended_pod_holds_nothing_and_is_not_even_sent(cluster, capsys):
    finished = pod("done", {RESOURCE_GPU: "1"}, decision=Decision("gpu-a", "main", (0,), ("GPU-a0",)))
    finished["status"]["phase"] = "Succeeded"  # its decision stays on it; its GPU is free again
    cluster.pods.append(finished)
    assert "team/done" not in said(capsys, "top", "--interval", "0")
    assert " done " not in said(capsys, "pods", "--interval", "0")
    assert all("fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed" in p
               for p in cluster.seen if "/pods?" in p)  # fmt: skip


def test_a_decision_the_ledger_cannot_hold_is_counted_as_a_conflict(cluster, capsys):
    by_name = {p["metadata"]["name"]: p for p in cluster.pods}
    # a second whole-GPU pod on GPU 0, placed from outside gpuslice
    cluster.pods.append(
        pod("intruder", {RESOURCE_GPU: "1"}, decision=Decision("gpu-a", "main", (0,), ("GPU-a0",)))
    )
    assert by_name["train"]["spec"]["nodeName"] == "gpu-a"
    text = said(capsys, "top", "--interval", "0")
    assert "note: 1 slice(s) of bound pods do not fit the ledger" in text


def test_control_characters_in_event_messages_are_written_out(cluster, capsys):
    cluster.events[1]["message"] = "gpuslice: 0/2 nodes fit\x1b]0;owned\x07 \x1b[2J"
    code, out, _ = run(capsys, "why", "waiting")
    assert code == 0 and "\x1b" not in out and "\\x1b]0;owned\\x07 \\x1b[2J" in out


# ---- kubectl finds and runs it; its output through a pipe ----------------------------------------------

SCRIPT = Path(sys.executable).parent / "kubectl-gpuslice"  # the console script the package installs


def kubectl_binary() -> Path | None:
    """kubectl from $GPUSLICE_K8S_BIN or the e2e build cache (scripts/k8s-e2e builds it there)."""
    given = os.environ.get("GPUSLICE_K8S_BIN")
    candidates = [Path(given) / "kubectl"] if given else []
    candidates += sorted(Path.home().glob(".cache/gpuslice-e2e/*/bin/kubectl"))
    return next((c for c in candidates if c.is_file()), None)


KUBECTL = kubectl_binary()


def on_real_cluster(test: Any) -> Any:
    """Run by scripts/k8s-e2e with its binaries (k8s_e2e); as in tests/k8s_e2e, the kubernetes client's
    unclosed sockets are not this test's findings."""
    for mark in (
        pytest.mark.k8s_e2e,
        pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
        pytest.mark.filterwarnings("ignore::ResourceWarning"),
    ):
        test = mark(test)
    return test
needs_script = pytest.mark.skipif(
    not SCRIPT.is_file(), reason="the package is not installed (no console script)"
)
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="no kubectl (GPUSLICE_K8S_BIN, ~/.cache/gpuslice-e2e)"
)


@needs_script
@on_real_cluster
@needs_kubectl
def test_kubectl_finds_the_plugin_on_path_and_runs_it(cluster, tmp_path):
    env = {
        **os.environ,
        "PATH": f"{SCRIPT.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
    }
    listed = subprocess.run(
        [str(KUBECTL), "plugin", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert str(SCRIPT) in listed.stdout.splitlines(), listed.stdout + listed.stderr
    ran = subprocess.run(
        [str(KUBECTL), "gpuslice", "pods", "-A", "--interval", "0"], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ["research", "mig-job", "Running", "MIG", "1g.10gb", "0", "gpu-b", "-", "-"] in rows(ran.stdout)
    failed = subprocess.run(
        [str(KUBECTL), "gpuslice", "why", "nope"], env=env, capture_output=True, text=True
    )
    assert (failed.returncode, failed.stderr) == (1, "error: pod nope not found in namespace team\n")


@needs_script
def test_piped_output_has_no_terminal_codes_and_fits_80_columns(cluster):
    env = {**os.environ}
    env.pop("COLUMNS", None)  # a pipe: rich's default, 80
    for args in (["top", "--interval", "0"], ["pods", "-A", "--interval", "0"], ["why", "waiting"]):
        done = subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout and done.stdout.strip()
        no_wider_than(done.stdout)


def test_tables_keep_every_digit_at_80_columns_with_long_names(cluster, capsys, monkeypatch):
    """Cloud node names and long pod names: each table is as the rest of the CLI's, every number whole
    at 80 columns (``test_table_widths.lost_digits``), folded or stacked where it does not fit."""
    from rich.console import Console
    from rich.table import Table
    from test_table_widths import lost_digits

    long_node = "ip-10-0-113-207.eu-west-1.compute.internal"
    for item in cluster.nodes:
        if item["metadata"]["name"] == "gpu-a":
            item["metadata"]["name"] = long_node
    for item in cluster.pods:
        spec, meta = item["spec"], item["metadata"]
        if spec.get("nodeName") == "gpu-a":
            spec["nodeName"] = long_node
            if "gpuslice.io/node" in meta["annotations"]:
                meta["annotations"]["gpuslice.io/node"] = long_node
        if meta["name"] == "infer-1":
            meta["name"] = "llama-3-70b-instruct-inference-server-7d9f8b6c4-x2k9p"
    printed: list[Table] = []
    original = Console.print

    def record(self: Console, *objects: Any, **kwargs: Any) -> None:
        printed.extend(o for o in objects if isinstance(o, Table))
        original(self, *objects, **kwargs)

    monkeypatch.setattr(Console, "print", record)
    for args in (["top"], ["pods", "-A"]):
        code, out, err = run(capsys, *args, "--interval", "0")
        assert (code, err) == (0, "")
        no_wider_than(out)
    assert len(printed) == 5  # top: per node, its GPUs and its slices; pods: one table
    for table in printed:
        assert lost_digits(table, 80) == []


# ---- a real kube-apiserver (etcd + kube-apiserver only: nothing schedules or runs the pods) -------------
# Marked k8s_e2e, as the kubectl test above: scripts/k8s-e2e runs them once it has built the binaries
# (a fresh machine has none when the unit tests run, and they would only be skipped there).


def control_plane_binaries() -> Path | None:
    """The upstream binaries scripts/k8s-e2e builds: $GPUSLICE_K8S_BIN, else its cache folder."""
    given = os.environ.get("GPUSLICE_K8S_BIN")
    candidates = [Path(given)] if given else []
    candidates += sorted(p.parent for p in Path.home().glob(".cache/gpuslice-e2e/*/bin/kube-apiserver"))
    wanted = ("etcd", "kube-apiserver", "kubectl")
    return next((c for c in candidates if all((c / b).is_file() for b in wanted)), None)


BINARIES = control_plane_binaries()


@pytest.fixture(scope="module")
def real_api() -> Iterator[Any]:
    """etcd and kube-apiserver with RBAC (about 5 s to start), the test cluster written into it as the
    device plugin, the extender and kube-scheduler would write it."""
    if BINARIES is None:
        pytest.skip(
            "no kube-apiserver and etcd (GPUSLICE_K8S_BIN, or ~/.cache/gpuslice-e2e from scripts/k8s-e2e)"
        )
    sys.path.insert(0, str(Path(__file__).parents[2] / "e2e" / "k8s"))
    from controlplane import ControlPlane

    plane = ControlPlane(BINARIES)
    plane.start()
    try:
        write_cluster(plane)
        yield plane
    finally:
        plane.stop()


def write_cluster(plane: Any) -> None:
    """The fake API's cluster, less the usage: nodes and pods applied as they are, the device plugin pod
    marked Running, the extender's refusal posted by the extender's own Event code and kube-scheduler's
    through events.k8s.io/v1 as kube-scheduler posts it; and a ServiceAccount that may read the pods and
    events of namespace team and nothing else."""
    import yaml

    from gpuslice.k8s.extender.kube import KubernetesApi

    api = two_node_cluster()
    for item in api.nodes:
        item.update(apiVersion="v1")
    for item in api.pods:
        item.update(apiVersion="v1")
        item["metadata"].pop("uid"), item["metadata"].pop("creationTimestamp")
        item.pop("status")
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in ("team", "research", "gpuslice")
    ]
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer", "namespace": "team"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "viewer", "namespace": "team"},
            "rules": [{"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "viewer", "namespace": "team"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "team"}],
        },
    ]  # fmt: skip
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([*namespaces, *rbac, *api.nodes, *api.pods]))
    running = [("gpuslice-device-plugin-x1", "gpuslice"), ("mig-job", "research")]
    for name, namespace in [*running, ("train", "team"), ("infer-1", "team"), ("infer-2", "team")]:
        plane.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge",
                      "-p", '{"status": {"phase": "Running"}}')  # fmt: skip
    waiting = json.loads(plane.kubectl("get", "pod", "waiting", "-n", "team", "-o", "json").stdout)
    nodes = json.loads(plane.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    pods = json.loads(plane.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]
    with warnings.catch_warnings():  # the extender's client, made here only for this: collected now
        warnings.simplefilter("ignore", ResourceWarning)
        extender_refuses(nodes, pods, "waiting", KubernetesApi(str(plane.kubeconfig)))
        gc.collect()
    scheduler_event = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "waiting.scheduler", "namespace": "team"},
        "eventTime": "2020-01-01T00:00:00.000000Z",  # long before the extender's: listed after it
        "reportingController": "gpuslice-scheduler", "reportingInstance": "gpuslice-scheduler-node-1",
        "action": "Scheduling", "reason": "FailedScheduling", "type": "Warning", "note": SCHEDULER_SAYS,
        "regarding": {"kind": "Pod", "namespace": "team", "name": "waiting",
                      "uid": waiting["metadata"]["uid"], "apiVersion": "v1"},
    }  # fmt: skip
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(scheduler_event))


@on_real_cluster
def test_against_a_real_api_server_as_admin(real_api, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(real_api.kubeconfig))
    monkeypatch.setenv("COLUMNS", "80")
    text = said(capsys, "top", "--interval", "0")
    assert text.startswith(
        "gpu-a: 2 × H100-80GB GPU MEMORY MEM ALLOC MEM FREE CORE ALLOC USED BUSY "
        "0 80 GiB 80 GiB 0 B 100 % - - 1 80 GiB 30 GiB 50 GiB 50 % - - "
    )
    assert "research/mig-job 0 MIG 1g.10gb - -" in text
    # the plugin pod has no address (no kubelet runs it): the API server's proxy cannot reach it
    assert (
        "note: usage not shown for gpu-a: its device plugin's /metrics did not answer through the pod proxy"
        in text
    )
    text = said(capsys, "pods", "-A", "--interval", "0")
    assert (
        "team train Running 1 GPU 0 gpu-a - -" in text
        and "research mig-job Running MIG 1g.10gb 0 gpu-b" in text
    )
    text = said(capsys, "why", "waiting", "-n", "team")
    assert text.startswith(
        "pod team/waiting is pending; it asks for 90000 MiB of 1 GPU. "
        "FailedScheduling from gpuslice-extender, "
    )
    assert "gpuslice: 0/3 nodes fit: " in text and "; closest: " in text
    assert (
        text.index("from gpuslice-extender") < text.index("from gpuslice-scheduler")
        and SCHEDULER_SAYS in text
    )
    assert (
        one_line_error(capsys, "why", "nope", "-n", "team") == "error: pod nope not found in namespace team"
    )


@on_real_cluster
def test_a_real_api_server_whose_certificate_is_not_trusted_is_one_line(
    real_api, tmp_path, monkeypatch, capsys
):
    import yaml

    config = yaml.safe_load(real_api.kubeconfig.read_text())
    del config["clusters"][0]["cluster"]["certificate-authority"]  # the system's CAs: none signed it
    (tmp_path / "untrusted").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "untrusted"))
    line = one_line_error(capsys, "top")
    assert (
        line.startswith(f"error: cannot reach the API server at {real_api.server}: ")
        and "CERTIFICATE" in line
    )


@on_real_cluster
def test_against_a_real_api_server_with_rbac(real_api, tmp_path, monkeypatch, capsys):
    """A ServiceAccount that may get and list pods and events in namespace team, nothing else."""
    import yaml

    token = real_api.kubectl("create", "token", "viewer", "-n", "team").stdout.strip()
    admin = yaml.safe_load(real_api.kubeconfig.read_text())
    admin["users"] = [{"name": "admin", "user": {"token": token}}]
    admin["contexts"][0]["context"]["namespace"] = "team"
    (tmp_path / "viewer").write_text(yaml.safe_dump(admin))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "viewer"))
    assert one_line_error(capsys, "top") == (
        "error: no permission to list nodes: 403 Forbidden: nodes is forbidden: User "
        '"system:serviceaccount:team:viewer" cannot list resource "nodes" in API group "" at the cluster '
        "scope"
    )
    text = said(capsys, "pods", "--interval", "0")
    assert text.startswith(
        "POD STATUS SLICE GPU NODE USED BUSY infer-1 Running 20480 MiB, 30 % of 1 GPU 1 gpu-a - -"
    )
    assert "note: slices from the pods' decisions only (no permission to list nodes: 403" in text
    assert "note: usage not shown: no permission to list pods in every namespace: 403" in text
    assert "FailedScheduling from gpuslice-extender" in said(capsys, "why", "waiting")
    assert one_line_error(capsys, "pods", "-A").startswith(
        "error: no permission to list pods in every namespace: 403 Forbidden: pods is forbidden"
    )
    assert one_line_error(capsys, "why", "mig-job", "-n", "research").startswith(
        "error: no permission to get pod mig-job in namespace research: 403 Forbidden"
    )


def test_why_orders_both_event_apis_by_when_each_was_last_seen():
    """core/v1 Events (the extender's: lastTimestamp, count) and events.k8s.io/v1 ones (kube-scheduler's:
    eventTime, series), as the core API lists both; an Event's creationTimestamp is when it was written."""
    from gpuslice.k8s.pending_reason import pod_story

    waiting = two_node_cluster().pods[4]
    core = refusal_event("waiting", "core", "2026-12-05T05:10:00Z", "gpuslice-extender")
    repeated = {
        "metadata": {"namespace": "team", "creationTimestamp": "2026-12-05T05:00:00Z"},
        "involvedObject": {"kind": "Pod", "name": "waiting", "uid": "uid-team-waiting"},
        "reason": "FailedScheduling", "message": "repeated", "reportingComponent": "gpuslice-scheduler",
        "eventTime": "2026-12-05T05:00:00.000000Z",
        "series": {"count": 7, "lastObservedTime": "2026-12-05T05:20:00.5Z"},
    }  # fmt: skip
    late = {**repeated, "message": "written late", "series": None, "eventTime": "2026-12-05T04:00:00.000000Z"}
    late["metadata"] = {"namespace": "team", "creationTimestamp": "2026-12-05T06:00:00Z"}
    other_pod = {**core, "involvedObject": {"kind": "Pod", "name": "waiting", "uid": "an-earlier-pod"}}
    story = pod_story(waiting, [late, core, repeated, other_pod])
    assert [(e.message, e.source, e.count) for e in story.events] == [
        ("repeated", "gpuslice-scheduler", 7),
        ("core", "gpuslice-extender", 1),
        ("written late", "gpuslice-scheduler", 1),
    ]


def test_why_says_what_it_can_of_an_unreadable_an_ended_and_an_unasked_pod(cluster, capsys):
    cluster.pods += [
        pod("garbled", {RESOURCE_GPU: "1", RESOURCE_GPUMEM: "lots"}, phase="Pending"),
        pod("finished", {RESOURCE_GPU: "1"}, phase="Succeeded"),
        pod("stray", {RESOURCE_GPU: "1"}, phase="Pending", scheduler="default-scheduler"),
    ]
    cluster.pods[-1]["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient gpuslice.io/gpu."}
    ]  # fmt: skip
    assert said(capsys, "why", "garbled") == (
        "pod team/garbled: its gpuslice ask or decision cannot be read: container 'main': "
        "gpuslice.io/gpumem: 'lots' is not a Kubernetes quantity (e.g. 2, 500m, 8Gi)"
    )
    assert said(capsys, "why", "finished") == "pod team/finished has ended (Succeeded); it asked for 1 GPU."
    # no event left, a scheduler that never asks the extender: the condition, and why no refusal of
    # gpuslice's is there
    assert said(capsys, "why", "stray") == (
        "pod team/stray is pending; it asks for 1 GPU. No FailedScheduling event about it (events are kept "
        "for an hour). Its PodScheduled condition: 0/3 nodes are available: 3 Insufficient gpuslice.io/gpu. "
        "Its scheduler is default-scheduler, not gpuslice's: the gpuslice extender is not asked about it "
        "(gpuslice's admission webhook sets it on pods that ask for gpuslice.io resources)."
    )


def test_usage_reads_what_the_device_plugins_node_metrics_write(tmp_path):
    """The writer (``observe.node_slices``, the device plugin's /metrics) and this reader agree on the
    series: a slice with a shim region has its memory and busy seconds, one without has none."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuslice.hardware.machine import GpuInfo, Machine
    from gpuslice.k8s.usage import PodGpuSample, UsageKey, parse_usage
    from gpuslice.observe.node_slices import NodeSliceCollector, SliceHolder
    from gpuslice.shim.region import DeviceUsage, pack_region

    region = tmp_path / "job.region"
    region.write_bytes(pack_region([DeviceUsage(1, 8 * GiB, 3 * GiB, 2_500_000_000, 10, 0)]))
    machine = Machine("n", (GpuInfo(0, "GPU-a", "H100", 80 * GiB), GpuInfo(1, "GPU-b", "H100", 80 * GiB)))
    holders = [
        SliceHolder("team", (1,), 8 * GiB, 0.3, region, pod="infer"),
        SliceHolder("team", (0,), 80 * GiB, 1.0, None, pod="no-shim"),
    ]
    registry = CollectorRegistry()
    registry.register(NodeSliceCollector(machine, lambda: holders, lambda: True))
    assert parse_usage(generate_latest(registry).decode()) == {
        UsageKey("team", "infer", 1): PodGpuSample(memory_used_bytes=3 * GiB, busy_seconds=2.5)
    }
