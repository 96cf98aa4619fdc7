"""The DRA driver leaving a node when gpuslice is removed: the pool is unpublished whatever else
happens, and the node's files (CDI specs, checkpoint, state folders) go only when no claim is still
prepared there; a stop while the DaemonSet still exists (an update) takes nothing back."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from gpuslice.cli import k8s_dra
from gpuslice.k8s.dra.driver import DraDriver
from gpuslice.k8s.dra.prepare import ClaimRef, cdi_spec_path
from gpuslice.k8s.dra.slices import DRIVER
from gpuslice.node.discovery import discover

NODE = "node-a"


class Api:
    """The driver's API side over dicts: one claim source, one pool."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.pool: list[dict] = []

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.claims[(namespace, name)]

    def next_generation(self, node_name: str) -> int:
        return 1 + max((s["spec"]["pool"]["generation"] for s in self.pool), default=0)

    def publish(self, node_name: str, slices: Sequence[dict]) -> None:
        self.pool = list(slices)

    def unpublish(self, node_name: str) -> None:
        self.pool = []

    def share(self, name: str, uid: str, gpu: int) -> ClaimRef:
        result = {
            "request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{gpu}",
            "consumedCapacity": {"memory": "4Gi", "cores": "25"},
        }  # fmt: skip
        self.claims[("team", name)] = {
            "metadata": {"name": name, "namespace": "team", "uid": uid},
            "status": {"allocation": {"devices": {"results": [result], "config": []}}},
        }
        return ClaimRef(namespace="team", uid=uid, name=name)


@pytest.fixture
def root() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="dra-un", dir="/tmp"))  # unix socket paths: at most 107 bytes
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def driver(root: Path, api: Api, sharing: str = "shim") -> DraDriver:
    made = DraDriver(
        discover("pcie-4x-l4"),
        NODE,
        api,
        cdi_dir=root / "cdi",
        state_dir=root / "state",
        sharing=sharing,
        plugins_dir=root / "plugins",
        registry_dir=root / "registry",
    )
    made.start()
    return made


def used(root: Path, api: Api) -> DraDriver:
    """A started driver that prepared a claim and let it go: its files are on the node, none in use."""
    made = driver(root, api)
    made.preparer.prepare(api.share("done", "uid-done", 2))
    made.preparer.unprepare("uid-done")
    return made


def test_with_no_claim_prepared_the_pool_specs_checkpoint_and_state_all_go(root: Path) -> None:
    api = Api()
    dra = used(root, api)
    stale = cdi_spec_path(root / "cdi", "uid-crashed")  # a crash between the spec and the checkpoint
    stale.write_text("{}")
    foreign = root / "cdi" / "nvidia.com-gpu.json"  # another vendor's spec in the same folder
    foreign.write_text("{}")
    dra.stop()
    state = root / "state"
    assert api.pool and (state / "dra-checkpoint.json").exists() and (state / "shim").is_dir()

    assert dra.forget() == []
    assert api.pool == []
    assert sorted(p.name for p in (root / "cdi").iterdir()) == [foreign.name]
    assert not state.exists()
    assert not list((root / "plugins").iterdir()) and not list((root / "registry").iterdir())


def test_a_claim_still_prepared_keeps_the_nodes_files_but_not_the_pool(root: Path) -> None:
    api = Api()
    dra = driver(root, api)
    dra.preparer.prepare(api.share("train", "uid-t", 1))
    dra.stop()

    kept = dra.forget()
    assert api.pool == []  # no new claim may land in a pool nobody serves
    assert len(kept) == 1 and "team/train" in kept[0]
    assert cdi_spec_path(root / "cdi", "uid-t").exists()  # its container may restart and need it
    assert "uid-t" in (root / "state" / "dra-checkpoint.json").read_text()
    assert (root / "state" / "shim").is_dir()  # the pod's shim region and library


def test_another_components_file_keeps_the_state_folder(root: Path) -> None:
    api = Api()
    dra = used(root, api)
    dra.stop()
    (root / "state" / "notes.txt").write_text("the admin's")
    kept = dra.forget()
    assert len(kept) == 1 and "notes.txt" in kept[0]
    assert sorted(p.name for p in (root / "state").iterdir()) == ["notes.txt"]


class FakeApps:
    def __init__(self, deleting: bool | None) -> None:
        self.deleting = deleting  # None: the DaemonSet is gone

    def read_namespaced_daemon_set(self, name: str, namespace: str) -> Any:
        if self.deleting is None:
            raise client.exceptions.ApiException(status=404)
        stamp = dt.datetime.now(dt.UTC) if self.deleting else None
        return SimpleNamespace(metadata=SimpleNamespace(deletion_timestamp=stamp))


@pytest.mark.parametrize(("deleting", "cleared"), [(None, True), (True, True), (False, False)])
def test_the_cli_clears_only_when_its_daemonset_is_gone_or_being_deleted(
    root: Path, monkeypatch: pytest.MonkeyPatch, deleting: bool | None, cleared: bool
) -> None:
    monkeypatch.setattr(client, "AppsV1Api", lambda _api: FakeApps(deleting))
    api = Api()
    dra = used(root, api)
    dra.stop()
    k8s_dra._forget_if_removed(dra, SimpleNamespace(api_client=object()), ("gpuslice", "gpuslice-dra-driver"))
    assert (api.pool == []) is cleared
    assert (root / "state").exists() is not cleared


def test_a_bad_daemonset_value_is_one_error_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpuslice.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(
            ["k8s", "dra-driver", "--simulate", "pcie-4x-l4", "--node-name", "n1", "--daemonset", "nameonly"]
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error:") and "NAMESPACE/NAME" in err, err
