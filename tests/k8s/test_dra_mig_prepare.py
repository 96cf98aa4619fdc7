"""NodePrepareResources for a MIG claim on a machine with a (fake) NVIDIA driver: the instance is made
with the planner's command by the ``MigManager`` serve uses, its UUID is the claim's slice, Unprepare
destroys it, a repeated Prepare creates nothing, and a restarted driver still destroys what it made.
No GPU: a fake ``nvidia-smi`` first on PATH and a fake pynvml (tests/node)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))  # the node tests' fakes
from test_mig_manager import NO_ROOT, FakeSmi, a100_nvml

from gpuslice.k8s.dra.prepare import ClaimRef, Preparer, PrepareRefused, cdi_spec_path
from gpuslice.k8s.dra.slices import DRIVER
from gpuslice.node.discovery import discover
from gpuslice.node.mig_manager import MigManager

NODE = "node-m"


class Claims:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.objects[(namespace, name)]

    def add(self, name: str, uid: str, device: str) -> ClaimRef:
        result = {"request": "mig", "driver": DRIVER, "pool": NODE, "device": device}
        self.objects[("team", name)] = {
            "metadata": {"name": name, "namespace": "team", "uid": uid},
            "status": {"allocation": {"devices": {"results": [result], "config": []}}},
        }
        return ClaimRef("team", uid, name)


@pytest.fixture
def root() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="dra-mig", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def smi(root: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSmi:
    fake = FakeSmi(root / "bin")
    monkeypatch.setenv("PATH", f"{fake.directory}:{os.environ['PATH']}")
    return fake


def preparer(root: Path, smi: FakeSmi, claims: Claims) -> Preparer:
    nvml = a100_nvml(smi)
    machine = discover(nvml=nvml)
    state = root / "state"
    return Preparer(
        machine, NODE, claims, cdi_dir=root / "cdi", state_dir=state, nvml=nvml,
        mig=MigManager(machine, state, nvml=nvml, timeout_seconds=10),
    )  # fmt: skip


def env_of(root: Path, uid: str) -> dict[str, str]:
    spec = json.loads(cdi_spec_path(root / "cdi", uid).read_text())
    return dict(e.split("=", 1) for e in spec["containerEdits"]["env"])


def test_prepare_creates_the_instance_and_unprepare_destroys_it(root: Path, smi: FakeSmi) -> None:
    claims = Claims()
    ref = claims.add("m", "uid-m", "gpu-1-mig-3g-40gb-4")
    node = preparer(root, smi, claims)
    first = node.prepare(ref)
    created = smi.devices(1)
    assert len(created) == 1 and created[0][2] == 4  # one instance, at memory slot 4
    assert smi.calls() == ["nvidia-smi mig -i 1 -cgi 9:4 -C"]
    assert env_of(root, "uid-m")["CUDA_VISIBLE_DEVICES"] == created[0][0]  # the instance's MIG- UUID
    assert env_of(root, "uid-m")["GPUSLICE_MIG_PROFILE"] == "3g.40gb"
    assert node.prepare(ref) == first and len(smi.calls()) == 1  # idempotent: nothing run again
    node.unprepare("uid-m")
    assert smi.devices(1) == []
    assert smi.calls()[1:] == ["nvidia-smi mig -i 1 -dci -ci 0 -gi 1", "nvidia-smi mig -i 1 -dgi -gi 1"]
    node.unprepare("uid-m")  # twice: nothing more to do
    assert len(smi.calls()) == 3


def test_a_restarted_driver_destroys_the_instance_it_made_before(root: Path, smi: FakeSmi) -> None:
    claims = Claims()
    ref = claims.add("m", "uid-r", "gpu-0-mig-1g-10gb-6")
    preparer(root, smi, claims).prepare(ref)
    assert len(smi.devices(0)) == 1
    again = preparer(root, smi, Claims())  # a new process: only the checkpoints know the claim
    again.unprepare("uid-r")
    assert smi.devices(0) == []


def test_an_administrators_instance_is_used_and_left_alone(root: Path, smi: FakeSmi) -> None:
    smi.add_device(0, "MIG-admin", 19, 6)  # 1g.10gb at slot 6, made by hand
    claims = Claims()
    ref = claims.add("m", "uid-a", "gpu-0-mig-1g-10gb-6")
    node = preparer(root, smi, claims)
    node.prepare(ref)
    assert env_of(root, "uid-a")["CUDA_VISIBLE_DEVICES"] == "MIG-admin"
    node.unprepare("uid-a")
    assert smi.calls() == [] and smi.devices(0) == [("MIG-admin", 19, 6)]


def test_a_refused_create_is_the_claims_reason_and_leaves_nothing(root: Path, smi: FakeSmi) -> None:
    smi.refuse("-cgi", 4, NO_ROOT)
    claims = Claims()
    ref = claims.add("m", "uid-x", "gpu-1-mig-3g-40gb-0")
    node = preparer(root, smi, claims)
    with pytest.raises(PrepareRefused, match="needs root"):
        node.prepare(ref)
    assert not cdi_spec_path(root / "cdi", "uid-x").exists() and node.prepared() == {}
    smi.allow()
    node.prepare(ref)  # the kubelet retries: now it is made
    assert len(smi.devices(1)) == 1
