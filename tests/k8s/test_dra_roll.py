"""Two instances of the DRA driver on one node, as a DaemonSet rolled with surge runs them: each has its
own sockets (the kubelet drops a plugin whose socket is replaced, and keeps every registered instance
by its own socket), a killed instance's sockets are cleared by the next one, and both prepare and
unprepare from one checkpoint without losing each other's claims."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpuslice.k8s.dra.kubelet_plugin import KubeletPlugin, dra_socket, registration_socket
from gpuslice.k8s.dra.prepare import ClaimRef, Preparer, cdi_spec_path
from gpuslice.k8s.dra.proto import pluginregistration_pb2 as reg
from gpuslice.k8s.dra.proto import pluginregistration_pb2_grpc as reg_grpc
from gpuslice.k8s.dra.slices import DRIVER
from gpuslice.node.discovery import discover

NODE = "node-a"


class Claims:
    """Every claim asked for exists: a 1 GiB / 5 % share of GPU ``n % 4`` for claim ``c<n>``."""

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        gpu = int(name[1:]) % 4
        result = {
            "request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{gpu}",
            "consumedCapacity": {"memory": "1Gi", "cores": "5"},
        }  # fmt: skip
        return {
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
            "status": {"allocation": {"devices": {"results": [result], "config": []}}},
        }


def ref(n: int) -> ClaimRef:
    return ClaimRef(namespace="team", uid=f"uid-c{n}", name=f"c{n}")


@pytest.fixture
def root() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="dra-roll", dir="/tmp"))  # unix socket paths: at most 107 bytes
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def preparer(root: Path) -> Preparer:
    return Preparer(
        discover("pcie-4x-l4"), NODE, Claims(), cdi_dir=root / "cdi", state_dir=root / "state", sharing="soft"
    )


def checkpoint_claims(root: Path) -> set[str]:
    return set(json.loads((root / "state" / "dra-checkpoint.json").read_text())["claims"])


def test_two_instances_share_one_checkpoint(root: Path) -> None:
    old, new = preparer(root), preparer(root)  # the new pod starts while the old one serves
    old.prepare(ref(1))
    new.prepare(ref(2))
    assert checkpoint_claims(root) == {"uid-c1", "uid-c2"}  # neither wrote over the other's claim
    assert new.prepare(ref(1)) == old.prepared()["uid-c1"]  # prepared already: the same devices
    new.unprepare("uid-c1")  # the kubelet may ask either instance
    assert not cdi_spec_path(root / "cdi", "uid-c1").exists()
    assert set(old.prepared()) == {"uid-c2"}  # the old one knows it is gone


def test_concurrent_prepares_in_two_instances_lose_no_claim(root: Path) -> None:
    instances = (preparer(root), preparer(root))
    errors: list[BaseException] = []

    def run(instance: Preparer, first: int) -> None:
        try:
            for n in range(first, first + 40, 2):
                instance.prepare(ref(n))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(inst, k)) for k, inst in enumerate(instances)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert checkpoint_claims(root) == {f"uid-c{n}" for n in range(40)}
    assert len(list((root / "cdi").glob("*.json"))) == 40


def _registered_name(path: Path) -> str:
    with grpc.insecure_channel(f"unix://{path}") as channel:
        return reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10).endpoint


def test_each_instance_has_its_own_sockets_and_stops_only_its_own(root: Path) -> None:
    dirs = {"plugins_dir": root / "plugins", "registry_dir": root / "registry"}
    old = KubeletPlugin(preparer(root), instance="0ld0ld00", **dirs)
    new = KubeletPlugin(preparer(root), instance="11ew11ew", **dirs)
    old.start()
    try:
        new.start()  # the old one still serves: its sockets are live, not stale
        assert old.endpoint != new.endpoint and old.registration_path != new.registration_path
        assert _registered_name(old.registration_path) == str(dra_socket(root / "plugins", "0ld0ld00"))
        assert _registered_name(new.registration_path) == str(dra_socket(root / "plugins", "11ew11ew"))
    finally:
        old.stop()
    assert not old.endpoint.exists() and not old.registration_path.exists()
    assert _registered_name(new.registration_path) == str(new.endpoint)  # the new one serves on
    new.stop()
    assert sorted(p.name for p in (root / "registry").iterdir()) == []


def test_a_killed_instances_sockets_are_removed_by_the_next(root: Path) -> None:
    registry = registration_socket(root / "registry", "dead0000")
    endpoint = dra_socket(root / "plugins", "dead0000")
    for path in (registry, endpoint):  # bound, then the process died: nobody listens
        path.parent.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    other = root / "registry" / "other.example.com-reg.sock"  # another driver's: never ours to remove
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(other))
    plugin = KubeletPlugin(
        preparer(root), instance="a1ive000", plugins_dir=root / "plugins", registry_dir=root / "registry"
    )
    plugin.start()
    try:
        assert not registry.exists() and not endpoint.exists()
        assert other.exists() and plugin.registration_path.exists()
    finally:
        plugin.stop()


def test_an_instance_name_is_checked_and_shortened_like_the_device_plugins(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpuslice.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["k8s", "dra-driver", "--simulate", "pcie-4x-l4", "--node-name", "n1", "--instance", "../x"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--instance" in err and "lower-case" in err, err
