"""Annotation, label and resource names and their (de)serialisation: round trips and refusals."""

from __future__ import annotations

import json

import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.k8s.annotations import (
    ANNOTATION_EXCLUDE_GPU_MODELS,
    ANNOTATION_GPU_MODELS,
    ANNOTATION_MIG_INSTANCE,
    ANNOTATION_NODE,
    ANNOTATION_PLACEMENT_POLICY,
    DECISION_ANNOTATIONS,
    InventoryGpu,
    MigSlot,
    NodeInventory,
    PodGpuRequest,
    asks_for_gpuslice,
    managed_resources,
    mig_profile,
    mig_resource,
    pod_gpu_request,
)
from gpuslice.k8s.decision import Decision, MigChoice
from gpuslice.units import MiB


def pod(limits=None, requests=None, annotations=None, init=False):
    container = {"name": "c", "resources": {"limits": limits or {}, "requests": requests or {}}}
    spec = {"initContainers" if init else "containers": [container]}
    return {"metadata": {"annotations": annotations or {}}, "spec": spec}


def test_every_name_is_under_the_gpuslice_domain():
    assert all(
        name.startswith("gpuslice.io/") for name in (*DECISION_ANNOTATIONS, *managed_resources(["1g.10gb"]))
    )
    assert mig_resource("3g.40gb") == "gpuslice.io/mig-3g.40gb"
    assert mig_resource("1g.10gb+me") == "gpuslice.io/mig-1g.10gb.me"  # '+' is not allowed in a resource name
    assert mig_profile(mig_resource("1g.10gb+me")) == "1g.10gb+me"
    assert pod_gpu_request(pod({"gpuslice.io/mig-1g.10gb.me": "1"})).mig_profile == "1g.10gb+me"


def test_inventory_round_trips_through_its_json():
    inv = NodeInventory(
        gpus=(
            InventoryGpu(0, "GPU-0", "A100-80GB", 81920),
            InventoryGpu(
                1, "GPU-1", "A100-80GB", 81920, healthy=False, mig=(MigSlot("3g.40gb", 4, "MIG-x", 2),)
            ),
        ),
        topology=(("X", "NV12"), ("NV12", "X")),
        split_count=4,
    )
    assert NodeInventory.from_json(inv.to_json()) == inv
    assert json.loads(inv.to_json())["gpus"][1]["mig"] == [
        {"profile": "3g.40gb", "start": 4, "uuid": "MIG-x", "giId": 2}
    ]
    assert inv.model == "A100-80GB"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "malformed"),
        ('{"version": 2, "gpus": []}', "inventory version 2"),
        ('{"gpus": [{"index": 0}]}', "malformed"),
        ('{"splitCount": 0, "gpus": []}', "splitCount must be at least 1"),
        (
            '{"gpus": [{"index": 0, "uuid": "u", "model": "T4", "memoryMiB": 1}], '
            '"topology": [["X", "PIX"]]}',
            "1x1",
        ),
    ],
    ids=["not json", "future version", "missing field", "zero split", "topology shape"],
)
def test_malformed_inventory_is_refused_with_what_is_wrong(text, message):
    with pytest.raises(InvalidRequest, match=message):
        NodeInventory.from_json(text)


def test_decision_round_trips_through_annotations():
    d = Decision("n1", "train", (2, 3), ("GPU-a", "GPU-b"), 0, 100, bind_time=1700000000)
    assert Decision.from_annotations(d.to_annotations()) == d
    mig = Decision("n1", "train", (1,), ("GPU-a",), mig=MigChoice(1, "1g.10gb", 6, "MIG-u"))
    assert mig.to_annotations()[ANNOTATION_MIG_INSTANCE] == "1:1g.10gb@6:MIG-u"
    assert Decision.from_annotations(mig.to_annotations()) == mig


def test_pod_without_decision_has_none_and_a_malformed_one_is_refused():
    assert Decision.from_annotations({}) is None
    with pytest.raises(InvalidRequest):
        Decision.from_annotations({ANNOTATION_NODE: "n", "gpuslice.io/gpu-indices": "zero"})
    with pytest.raises(InvalidRequest, match="GPU:PROFILE@START"):
        MigChoice.parse("1g.10gb")


@pytest.mark.parametrize(
    ("limits", "gpus", "milli", "memory_mib"),
    [
        ({"gpuslice.io/gpu": "1"}, 1, 1000, 0),
        ({"gpuslice.io/gpu": 4}, 4, 1000, 0),
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "25"}, 1, 250, 0),
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "2048"}, 1, 1, 2048),  # memory-only share: 1 milli
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "8000", "gpuslice.io/gpucores": "50"}, 1, 500, 8000),
    ],
    ids=["whole", "four whole", "cores only", "memory only", "memory and cores"],
)
def test_pod_resources_become_a_ledger_request(limits, gpus, milli, memory_mib):
    request = pod_gpu_request(pod(limits)).to_request()
    assert (request.num_gpu, request.gpu_milli, request.gpu_memory_bytes) == (gpus, milli, memory_mib * MiB)
    assert request.cpu_milli == 0  # CPU and memory stay kube-scheduler's business


def test_limits_win_over_requests_and_annotations_are_read():
    p = pod(
        {"gpuslice.io/gpu": "2"},
        {"gpuslice.io/gpu": "1"},
        {
            ANNOTATION_GPU_MODELS: "H100, A100-80GB",
            ANNOTATION_EXCLUDE_GPU_MODELS: "T4",
            ANNOTATION_PLACEMENT_POLICY: "fgd",
        },
    )
    ask = pod_gpu_request(p)
    assert ask == PodGpuRequest("c", 2, 0, 0, "", 0, ("A100-80GB", "H100"), ("T4",), "fgd")


def test_init_containers_count_and_pods_without_resources_ask_nothing():
    assert asks_for_gpuslice(pod({"gpuslice.io/gpu": "1"}, init=True))
    assert pod_gpu_request(pod({"gpuslice.io/gpu": "1"}, init=True)).gpus == 1
    assert not asks_for_gpuslice(pod({"nvidia.com/gpu": "1"}))
    assert not pod_gpu_request(pod({"cpu": "1"})).wants_gpu


def test_mig_request_is_read_alone():
    ask = pod_gpu_request(pod({"gpuslice.io/mig-2g.20gb": "1"}))
    assert (ask.mig_profile, ask.mig_count, ask.wants_gpu) == ("2g.20gb", 1, True)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"gpuslice.io/gpumem": "100"}, "need gpuslice.io/gpu"),
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "0.5"}, "not a whole non-negative number"),
        ({"gpuslice.io/gpu": "-1"}, "not a whole non-negative number"),
        ({"gpuslice.io/mig-1g.10gb": "2"}, "exactly one MIG instance"),
        ({"gpuslice.io/gpu": "3", "gpuslice.io/gpucores": "40"}, "for one GPU only"),
    ],
    ids=["memory without gpu", "fractional", "negative", "two MIG", "share on three GPUs"],
)
def test_impossible_pods_are_refused_naming_the_container(limits, message):
    with pytest.raises(InvalidRequest, match=message) as err:
        pod_gpu_request(pod(limits))
    assert "container 'c'" in str(err.value)
