"""One GPU-set choice for every home: for the same request on the same machine with the same GPUs free,
the extender's bind, the device plugin's GetPreferredAllocation and ``topo pick`` (``choose_gpu_set``
with the exact policy) all answer with ``pick_gpu_set``'s GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_device_plugin import FakeApi as FakePods
from test_device_plugin import dgx1_machine
from test_extender import FakeApi, _bound_pod, make_state, pod_json
from test_extender import inventory as extender_inventory

from gpuslice.k8s.annotations import ANNOTATION_GPU_INDICES, RESOURCE_GPU
from gpuslice.k8s.device_plugin import SHARE_SEPARATOR, DevicePlugin
from gpuslice.k8s.extender import WatchEvent
from gpuslice.k8s.proto import deviceplugin_pb2 as pb
from gpuslice.policies.gpuset import choose_gpu_set, make_gpuset_policy
from gpuslice.policies.gpuset.pick import pick_gpu_set

MACHINE = dgx1_machine()  # DGX-1's hybrid cube mesh: NV2, NV1 and SYS pairs, so sets differ
TOPOLOGY = MACHINE.topology
LABELS = tuple(tuple(TOPOLOGY.label(i, j) for j in range(8)) for i in range(8)) if TOPOLOGY else ()

CASES = [  # (GPUs already taken by other pods, whole GPUs the new pod asks for)
    ((), 2),
    ((), 4),
    ((0,), 2),
    ((0,), 3),
    ((1, 4), 2),
    ((1, 4), 4),
    ((0, 2, 5), 3),
    ((3, 6), 5),
]


def extender_choice(taken: tuple[int, ...], k: int) -> tuple[int, ...]:
    """The GPUs the extender writes into the pod's decision when it binds it to the node."""
    api = FakeApi()
    state = make_state(api, {"n": extender_inventory("V100M16", gpus=8, memory_mib=16384, topology=LABELS)})
    for g in taken:
        state.apply(WatchEvent("Pod", "ADDED", _bound_pod(f"old-{g}", "n", str(g), {RESOURCE_GPU: "1"})))
    pod = pod_json("new", {RESOURCE_GPU: str(k)})
    api.pods[("team-a", "new")] = pod
    meta = pod["metadata"]
    assert state.bind(meta["namespace"], meta["name"], meta["uid"], "n") == ""
    return tuple(int(g) for g in api.annotations_of("new")[ANNOTATION_GPU_INDICES].split(","))


def plugin_choice(tmp_path: Path, taken: tuple[int, ...], k: int) -> tuple[int, ...]:
    """The GPUs behind the shares the device plugin prefers when no bound pod waits for them."""
    plugin = DevicePlugin(MACHINE, "n", pods=FakePods(), socket_dir=tmp_path / "sock", state_dir=tmp_path)
    resource = plugin.resources[0]
    free = [d.id for d in resource.devices if d.gpu not in taken]
    asked = pb.ContainerPreferredAllocationRequest(available_deviceIDs=free, allocation_size=k)
    reply = plugin._preferred(resource, pb.PreferredAllocationRequest(container_requests=[asked]))
    index = {g.uuid: g.index for g in MACHINE.gpus}
    return tuple(sorted(index[i.split(SHARE_SEPARATOR)[0]] for i in reply.container_responses[0].deviceIDs))


@pytest.mark.parametrize(("taken", "k"), CASES, ids=[f"taken{t}-k{k}" for t, k in CASES])
def test_extender_device_plugin_and_topo_pick_choose_the_same_gpus(tmp_path, taken, k):
    """Several cases differ from the extender's earlier fewest-hops rule: with every GPU free a 2-GPU pod
    now gets 0,3 (a double NVLink, NV2) where equal hop counts used to give 0,1 (NV1)."""
    free = [g for g in range(8) if g not in taken]
    expected = pick_gpu_set(TOPOLOGY, free, k)
    assert expected is not None and len(expected) == k
    assert choose_gpu_set(make_gpuset_policy("exact"), TOPOLOGY, free, k).gpus == expected  # topo pick
    assert extender_choice(taken, k) == expected
    assert plugin_choice(tmp_path, taken, k) == expected


def test_device_plugin_must_include_gpus_are_completed_by_the_shared_ranking(tmp_path):
    """The kubelet may fix some devices (must_include); the rest of the set is pick_gpu_set's with must."""
    plugin = DevicePlugin(MACHINE, "n", pods=FakePods(), socket_dir=tmp_path / "sock", state_dir=tmp_path)
    resource = plugin.resources[0]
    must = next(d.id for d in resource.devices if d.gpu == 5)
    asked = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=[d.id for d in resource.devices],
        must_include_deviceIDs=[must],
        allocation_size=3,
    )
    reply = plugin._preferred(resource, pb.PreferredAllocationRequest(container_requests=[asked]))
    index = {g.uuid: g.index for g in MACHINE.gpus}
    got = tuple(sorted(index[i.split(SHARE_SEPARATOR)[0]] for i in reply.container_responses[0].deviceIDs))
    assert must in reply.container_responses[0].deviceIDs
    assert got == pick_gpu_set(TOPOLOGY, range(8), 3, must={5})


def test_device_plugin_gpuset_policy_option_still_advises(tmp_path):
    """``gpuset_policy`` reaches pick_gpu_set as its policy: 'random' advises a set exact would not pick."""
    plugin = DevicePlugin(
        MACHINE,
        "n",
        pods=FakePods(),
        socket_dir=tmp_path / "sock",
        state_dir=tmp_path,
        gpuset_policy="random",
    )
    resource = plugin.resources[0]
    asked = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=[d.id for d in resource.devices], allocation_size=4
    )
    reply = plugin._preferred(resource, pb.PreferredAllocationRequest(container_requests=[asked]))
    index = {g.uuid: g.index for g in MACHINE.gpus}
    got = tuple(sorted(index[i.split(SHARE_SEPARATOR)[0]] for i in reply.container_responses[0].deviceIDs))
    assert got == pick_gpu_set(TOPOLOGY, range(8), 4, policy=make_gpuset_policy("random"))
    assert got != pick_gpu_set(TOPOLOGY, range(8), 4)
