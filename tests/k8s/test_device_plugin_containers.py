"""Allocate for a pod where several containers ask: the kubelet calls it once per container, in its order
(init containers, then app containers), and each call gets that container's slice; the pod is allocated,
and its node lock given back, only after the last."""

from __future__ import annotations

import grpc
import pytest
import test_device_plugin as plugin_tests
from test_device_plugin import NODE, allocate, dgx1_machine, preferred, share

from gpuslice.k8s.annotations import (
    ANNOTATION_ALLOCATED_CONTAINERS,
    ANNOTATION_BIND_PHASE,
    BIND_PHASE_ALLOCATED,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_FAILED,
)
from gpuslice.k8s.decision import ContainerDecision, Decision
from gpuslice.k8s.shim_mounts import slice_folder
from gpuslice.units import MiB

# the fake kubelet, API and plugin of the device plugin's own tests
socket_dir, kubelet, api = plugin_tests.socket_dir, plugin_tests.kubelet, plugin_tests.api
health, make_plugin = plugin_tests.health, plugin_tests.make_plugin


def _pod_decision(machine, init: bool = True) -> Decision:
    """train: 20000 MiB / 30 % of GPU 1; shipper: 4000 MiB / 10 % of GPU 4; warm (init) inside train's."""
    u1, u4 = machine.gpus[1].uuid, machine.gpus[4].uuid
    slices = (
        *([ContainerDecision("warm", (1,), (u1,), 2000, 5, inside=True)] if init else []),
        ContainerDecision("train", (1,), (u1,), 20000, 30),
        ContainerDecision("shipper", (4,), (u4,), 4000, 10),
    )
    return Decision(NODE, "train", (1,), (u1,), 20000, 30, containers=slices)


def test_each_allocate_call_gets_its_containers_slice_and_the_pod_is_allocated_after_the_last(
    make_plugin, kubelet, api
):
    machine = dgx1_machine()
    make_plugin(machine, sharing="shim")
    stub = kubelet.dial(kubelet.next_request().endpoint)
    api.bind("ml", "multi", _pod_decision(machine))
    annotations = api.pod_annotations[("ml", "multi")]
    seen = []
    for gpu in (1, 1, 4):  # warm (inside train's GPU), train (reuses warm's device), shipper
        assert preferred(stub, [share(machine, g, n) for g in range(8) for n in range(2)], 1) == [
            share(machine, gpu)
        ]
        env = dict(allocate(stub, [share(machine, gpu)]).container_responses[0].envs)
        seen.append(
            (
                env["GPUSLICE_GPUS"],
                int(env["GPUSLICE_GPU_MEMORY_BYTES"]) // MiB,
                env["GPUSLICE_COMPUTE_PERCENT"],
            )
        )
        assert env["GPUSLICE_SHIM_REGION"].endswith(
            "/ml.multi_" + ["warm", "train", "shipper"][len(seen) - 1] + "/job.region"
        )
        done = annotations[ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATED
        assert done == (len(seen) == 3) and annotations[ANNOTATION_ALLOCATED_CONTAINERS] == str(len(seen))
        assert api.lock_releases == (
            [(NODE, "uid-multi")] if done else []
        )  # the node stays locked till the last
    assert seen == [("1", 2000, "5"), ("1", 20000, "30"), ("4", 4000, "10")]


def test_devices_not_of_the_next_containers_slice_fail_the_pod(make_plugin, kubelet, api):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    api.bind("ml", "multi", _pod_decision(machine, init=False))
    allocate(stub, [share(machine, 1)])  # train
    with pytest.raises(grpc.RpcError) as raised:
        allocate(stub, [share(machine, 1, 1)])  # shipper's call, with a device of train's GPU
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not of its decision's GPUs (4,)" in raised.value.details()
    assert api.pod_annotations[("ml", "multi")][ANNOTATION_BIND_PHASE] == BIND_PHASE_FAILED


def test_an_init_container_may_run_on_any_gpu_of_the_first_slice_but_no_other(make_plugin, kubelet, api):
    machine = dgx1_machine()
    make_plugin(machine)
    stub = kubelet.dial(kubelet.next_request().endpoint)
    u2, u5 = machine.gpus[2].uuid, machine.gpus[5].uuid
    slices = (
        ContainerDecision("warm", (2,), (u2,), 0, 100, inside=True),
        ContainerDecision("train", (2, 5), (u2, u5), 0, 100),
    )
    api.bind("ml", "ddp", Decision(NODE, "train", (2, 5), (u2, u5), containers=slices))
    env = dict(allocate(stub, [share(machine, 5)]).container_responses[0].envs)  # the kubelet's pick
    assert env["GPUSLICE_GPUS"] == "5" and env["CUDA_VISIBLE_DEVICES"] == u5
    assert api.pod_annotations[("ml", "ddp")][ANNOTATION_BIND_PHASE] == BIND_PHASE_ALLOCATING
    env = dict(allocate(stub, [share(machine, 5), share(machine, 2)]).container_responses[0].envs)
    assert env["GPUSLICE_GPUS"] == "2,5"
    api.bind("ml", "stray", Decision(NODE, "train", (2, 5), (u2, u5), containers=slices))
    with pytest.raises(grpc.RpcError) as raised:
        allocate(stub, [share(machine, 3)])
    assert (
        "for init container 'warm' are not on its first GPU container's GPUs (2, 5)" in raised.value.details()
    )


def test_a_containers_shim_folder_is_never_another_pods(make_plugin, kubelet, api):
    """Pod x's container y and a pod named x.y (a legal pod name) in one namespace each get a region of
    their own: sharing one would give them one memory budget, and each could rewrite the other's."""
    machine = dgx1_machine()
    make_plugin(machine, sharing="shim")
    stub = kubelet.dial(kubelet.next_request().endpoint)
    u1, u4 = machine.gpus[1].uuid, machine.gpus[4].uuid
    slices = (ContainerDecision("y", (1,), (u1,), 2000, 10), ContainerDecision("z", (4,), (u4,), 2000, 10))
    api.bind("ml", "x", Decision(NODE, "y", (1,), (u1,), 2000, 10, containers=slices))
    container_y = dict(allocate(stub, [share(machine, 1)]).container_responses[0].envs)
    allocate(stub, [share(machine, 4)])  # container z: pod x is allocated
    api.bind("ml", "x.y", Decision(NODE, "main", (1,), (u1,), memory_mib=2000, cores_percent=10))
    pod_x_y = dict(allocate(stub, [share(machine, 1, 1)]).container_responses[0].envs)
    assert container_y["GPUSLICE_SHIM_DIR"] != pod_x_y["GPUSLICE_SHIM_DIR"]
    assert container_y["GPUSLICE_SHIM_REGION"] != pod_x_y["GPUSLICE_SHIM_REGION"]


def test_no_pod_or_container_name_gives_a_dra_claims_shim_folder() -> None:
    # names as Kubernetes allows them: pods lower-case letters, digits, '-' and '.'; containers no '.'
    made = {
        slice_folder("claim-a"),
        slice_folder("claim", "a"),
        slice_folder("a"),
        slice_folder("a", "claim"),
    }
    assert slice_folder(claim="a") not in made and len(made) == 4
