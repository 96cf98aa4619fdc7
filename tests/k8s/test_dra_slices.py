"""The DRA driver's ResourceSlices and DeviceClasses: shape, API limits, MIG geometry as shared
counters, health, and the deploy files that ship the classes."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.hardware.mig import mig_gpu
from gpuslice.k8s.dra.classes import CLASS_MIG, CLASS_SHARED, CLASS_WHOLE, device_classes
from gpuslice.k8s.dra.identity import GpuIdentity, gpu_identities, normal_bus_id, pcie_root_of
from gpuslice.k8s.dra.slices import (
    ATTR_PCI_BUS_ID,
    ATTR_PCIE_ROOT,
    DRIVER,
    MEMORY_MIN_MIB,
    MEMORY_STEP_MIB,
    mig_devices,
    node_slices,
    parse_mig_device_name,
)
from gpuslice.node.discovery import discover
from gpuslice.units import MiB

REPO = Path(__file__).resolve().parents[2]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def mib(quantity: str) -> int:
    assert quantity.endswith("Mi")
    return int(quantity[:-2])


def test_one_pool_per_node_with_a_shared_device_per_gpu() -> None:
    machine = discover("dgx-h100")
    slices = node_slices(machine, "node-a", generation=3, identities=gpu_identities(machine))
    assert {s["spec"]["pool"]["name"] for s in slices} == {"node-a"}
    assert all(s["spec"]["pool"]["resourceSliceCount"] == len(slices) == 8 for s in slices)
    assert all(s["spec"]["pool"]["generation"] == 3 and s["spec"]["nodeName"] == "node-a" for s in slices)
    assert all(s["spec"]["driver"] == DRIVER for s in slices)
    gpus = devices(slices)
    assert [d["name"] for d in gpus] == [f"gpu-{i}" for i in range(8)]
    first = gpus[0]
    assert first["allowMultipleAllocations"] is True
    assert first["attributes"]["uuid"]["string"] == machine.gpus[0].uuid
    assert first["attributes"]["productName"]["string"] == "H100"
    assert first["attributes"][ATTR_PCI_BUS_ID]["string"] == "0000:10:00.0"
    assert first["attributes"][ATTR_PCIE_ROOT]["string"].startswith("pci")
    # an NVSwitch board: every GPU in one NVLink domain, so matchAttribute on it accepts any pair
    assert {d["attributes"]["nvlinkDomain"]["int"] for d in gpus} == {0}


def test_shared_gpu_capacity_defaults_to_the_whole_gpu_on_a_valid_step() -> None:
    machine = discover("dgx-h100")
    gpu = devices(node_slices(machine, "n", generation=1))[0]
    memory = gpu["capacity"]["memory"]
    value, default = mib(memory["value"]), mib(memory["requestPolicy"]["default"])
    rng = memory["requestPolicy"]["validRange"]
    assert value == machine.gpus[0].memory_bytes // MiB
    # the API server's rule: default = min + n * step, and default <= value; the largest such
    assert (default - mib(rng["min"])) % mib(rng["step"]) == 0
    assert value - MEMORY_STEP_MIB < default <= value
    assert mib(rng["min"]) == MEMORY_MIN_MIB
    cores = gpu["capacity"]["cores"]
    assert cores["value"] == "100" and cores["requestPolicy"]["default"] == "100"


def test_nvlink_domains_split_where_the_topology_does() -> None:
    machine = discover("pcie-8gpu-2socket")
    gpus = devices(node_slices(machine, "n", generation=1))
    domains = [d["attributes"]["nvlinkDomain"]["int"] for d in gpus]
    assert len(set(domains)) == len(machine.topology.nvlink_groups())
    assert [d["attributes"]["numaNode"]["int"] for d in gpus] == list(machine.topology.numa)


def test_mig_gpus_publish_every_placement_consuming_the_gpus_counters() -> None:
    machine = discover("dgx-h100:mig")
    slices = node_slices(machine, "n", generation=1)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert len(counter_slices) == 1 and "devices" not in counter_slices[0]["spec"]  # the API's rule
    sets = {c["name"]: c["counters"] for c in counter_slices[0]["spec"]["sharedCounters"]}
    assert set(sets) == {f"gpu-{i}" for i in range(8)}
    table = mig_gpu(machine.gpus[0].mig_model)
    placements = [d for d in devices(slices) if d["name"].startswith("gpu-0-")]
    assert len(placements) == sum(len(p.starts) for p in table.profiles)
    assert all(d.get("allowMultipleAllocations") is None for d in placements)
    for d in placements:
        (use,) = d["consumesCounters"]
        assert use["counterSet"] == "gpu-0" and set(use["counters"]) <= set(sets["gpu-0"])

    def memory(d: dict[str, Any]) -> set[str]:
        return {c for c in d["consumesCounters"][0]["counters"] if c.startswith("memory-slice-")}

    # Two placements may be allocated together exactly when their memory slices do not overlap.
    parsed = {d["name"]: parse_mig_device_name(machine, d["name"]) for d in placements}
    for a, b in itertools.combinations(placements, 2):
        ma, mb = parsed[a["name"]], parsed[b["name"]]
        overlap = ma.profile.mask_at(ma.start) & mb.profile.mask_at(mb.start)
        assert bool(overlap) == bool(memory(a) & memory(b)), (a["name"], b["name"])


def test_mig_device_names_round_trip_and_foreign_names_do_not_parse() -> None:
    machine = discover("dgx-h100:mig")
    for d in mig_devices(machine, 3):
        assert parse_mig_device_name(machine, d.name) == d
    assert parse_mig_device_name(machine, "gpu-3") is None
    assert parse_mig_device_name(machine, "gpu-9-mig-1g-10gb-0") is None
    assert parse_mig_device_name(discover("dgx-h100"), "gpu-0-mig-1g-10gb-0") is None  # MIG off there


@pytest.mark.parametrize("spec", ["dgx-h100", "dgx-h100:mig", "dgx-a100:mig", "pcie-8gpu-2socket"])
def test_slices_keep_within_the_api_servers_limits(spec: str) -> None:
    machine = discover(spec)
    for s in node_slices(machine, "node-with-a-long-name-0123456789", generation=1):
        body = s["spec"]
        assert not ("devices" in body and "sharedCounters" in body)
        assert len(body.get("sharedCounters", [])) <= 8
        assert len(body.get("devices", [])) <= 64  # the limit once devices consume counters
        assert len(s["metadata"]["name"]) <= 253
        for c in body.get("sharedCounters", []):
            assert DNS_LABEL.match(c["name"]) and len(c["counters"]) <= 32
            assert all(DNS_LABEL.match(k) for k in c["counters"])
        for d in body.get("devices", []):
            assert DNS_LABEL.match(d["name"]) and len(d["name"]) <= 63, d["name"]
            assert len(d["attributes"]) + len(d.get("capacity", {})) <= 32
            assert all(len(str(v)) <= 64 for a in d["attributes"].values() for v in a.values())


def test_an_unhealthy_gpu_publishes_no_devices_and_the_pool_keeps_its_size() -> None:
    machine = discover("dgx-h100")
    healthy = {i: i != 2 for i in range(8)}
    slices = node_slices(machine, "n", generation=2, healthy=healthy)
    assert len(slices) == 8 and all(s["spec"]["pool"]["resourceSliceCount"] == 8 for s in slices)
    assert "gpu-2" not in {d["name"] for d in devices(slices)}
    assert next(s for s in slices if s["metadata"]["name"] == "n-gpu-2")["spec"]["devices"] == []


def test_unknown_identity_fields_are_left_out() -> None:
    machine = discover("dgx-h100")
    gpu = devices(node_slices(machine, "n", generation=1, identities={0: GpuIdentity()}))[0]
    assert ATTR_PCI_BUS_ID not in gpu["attributes"] and "cudaComputeCapability" not in gpu["attributes"]
    known = {0: GpuIdentity("0000:3b:00.0", "pci0000:3a", "9.0")}
    gpu = devices(node_slices(machine, "n", generation=1, identities=known))[0]
    assert gpu["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}  # semver, as the API wants


def test_bus_ids_are_normalised_and_roots_read_from_sysfs(tmp_path: Path) -> None:
    assert normal_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    root = tmp_path / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    root.mkdir(parents=True)
    (tmp_path / "bus").mkdir()
    (tmp_path / "bus" / "0000:3b:00.0").symlink_to(root)
    assert pcie_root_of("0000:3b:00.0", tmp_path / "bus") == "pci0000:3a"
    assert pcie_root_of("0000:99:00.0", tmp_path / "bus") == ""


def test_device_classes_select_by_type_and_mark_the_whole_gpu_class_exclusive() -> None:
    classes = {c["metadata"]["name"]: c for c in device_classes()}
    assert set(classes) == {CLASS_SHARED, CLASS_WHOLE, CLASS_MIG}
    for name, kind, exclusive in (
        (CLASS_SHARED, "gpu", False),
        (CLASS_WHOLE, "gpu", True),
        (CLASS_MIG, "mig", False),
    ):
        spec = classes[name]["spec"]
        assert f'.type == "{kind}"' in spec["selectors"][0]["cel"]["expression"]
        assert spec["config"][0]["opaque"]["parameters"]["exclusive"] is exclusive


def _template_objects(path: Path) -> list[dict[str, Any]]:
    """The chart template's DeviceClasses: its template lines dropped, the rest plain YAML."""
    text = "\n".join(line for line in path.read_text().splitlines() if "{{" not in line)
    return [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "DeviceClass"]


def test_the_deploy_files_ship_exactly_these_classes() -> None:
    kustomize = [
        d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/50-dra-deviceclasses.yaml").read_text()) if d
    ]
    assert kustomize == device_classes()
    kustomization = yaml.safe_load((REPO / "deploy/kubernetes/kustomization.yaml").read_text())
    assert "50-dra-deviceclasses.yaml" in kustomization["resources"]
    chart = _template_objects(REPO / "deploy/helm/gpuslice/templates/dra.yaml")
    assert [(c["metadata"]["name"], c["spec"]) for c in chart] == [
        (c["metadata"]["name"], c["spec"]) for c in device_classes()
    ]
