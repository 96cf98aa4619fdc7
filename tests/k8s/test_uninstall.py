"""Leaving a node when gpuslice is removed: a node component clears what it wrote only when its
DaemonSet is gone or being deleted (helm uninstall), never on an update or when the API server cannot
say; the pre-delete hook deletes the DaemonSets in the foreground and waits for them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from gpuslice.cli.main import main
from gpuslice.errors import UserError
from gpuslice.k8s import uninstall
from gpuslice.k8s.annotations import ANNOTATION_NODE_INVENTORY
from gpuslice.k8s.device_plugin.devices import node_labels
from gpuslice.k8s.device_plugin.run import forget_node
from gpuslice.node.discovery import discover


class FakeApps:
    """AppsV1Api's two calls on DaemonSets, over a dict of name -> deletion timestamp (None: live). A
    deleted DaemonSet stays, being deleted, for ``linger`` more reads (as a foreground deletion waits for
    its pods); -1: forever."""

    def __init__(self, sets: dict[str, Any], error: Exception | None = None, linger: int = 0) -> None:
        self.sets = sets
        self.error = error
        self.linger = linger
        self.left: dict[str, int] = {}  # reads left before a deleted DaemonSet is gone
        self.deleted: list[tuple[str, str, str]] = []

    def read_namespaced_daemon_set(self, name: str, namespace: str) -> Any:
        if self.error is not None:
            raise self.error
        if self.left.get(name) == 0:
            del self.sets[name], self.left[name]
        if name not in self.sets:
            raise client.exceptions.ApiException(status=404)
        if self.left.get(name, -1) > 0:
            self.left[name] -= 1
        return SimpleNamespace(metadata=SimpleNamespace(deletion_timestamp=self.sets[name]))

    def delete_namespaced_daemon_set(self, name: str, namespace: str, body: Any) -> None:
        if name not in self.sets:
            raise client.exceptions.ApiException(status=404)
        self.deleted.append((namespace, name, body.propagation_policy))
        self.sets[name] = dt.datetime.now(dt.UTC)
        if self.linger >= 0:
            self.left[name] = self.linger


@pytest.fixture
def apps(monkeypatch: pytest.MonkeyPatch) -> FakeApps:
    fake = FakeApps({"plugin": None})
    monkeypatch.setattr(client, "AppsV1Api", lambda _api: fake)
    return fake


def test_a_daemonset_that_exists_means_an_update_and_nothing_is_cleared(apps: FakeApps) -> None:
    assert uninstall.daemonset_gone(object(), "gs", "plugin") is False


def test_a_daemonset_that_is_gone_or_being_deleted_means_gpuslice_is_leaving(apps: FakeApps) -> None:
    assert uninstall.daemonset_gone(object(), "gs", "other") is True  # 404
    apps.sets["plugin"] = dt.datetime.now(dt.UTC)  # deleted in the foreground: still there, being deleted
    assert uninstall.daemonset_gone(object(), "gs", "plugin") is True


@pytest.mark.parametrize(
    "error",
    [client.exceptions.ApiException(status=403), client.exceptions.ApiException(status=500), OSError()],
)
def test_when_the_api_server_cannot_say_nothing_is_cleared(apps: FakeApps, error: Exception) -> None:
    apps.error = error
    assert uninstall.daemonset_gone(object(), "gs", "plugin") is False


@pytest.mark.parametrize("value", ["", "gs", "/name", "gs/", "gs/a/b"])
def test_an_owner_that_is_not_namespace_slash_name_is_refused(value: str) -> None:
    with pytest.raises(UserError, match="NAMESPACE/NAME"):
        uninstall.parse_owner(value)
    assert uninstall.parse_owner("gs/gpuslice-device-plugin") == ("gs", "gpuslice-device-plugin")


def test_the_hook_deletes_in_the_foreground_and_waits_until_they_are_gone(apps: FakeApps) -> None:
    apps.sets["dra"] = None
    apps.linger = 2  # both stay, being deleted, for two reads after the delete
    assert uninstall.remove_daemonsets(object(), "gs", ["plugin", "dra", "absent"], timeout_s=30) == []
    assert apps.deleted == [("gs", "plugin", "Foreground"), ("gs", "dra", "Foreground")]


def test_the_hook_names_what_is_still_there_after_its_timeout(apps: FakeApps) -> None:
    apps.linger = -1  # a pod that never stops
    assert uninstall.remove_daemonsets(object(), "gs", ["plugin"], timeout_s=1) == ["plugin"]


class FakeCore:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self.patches.append((name, body))


def _state(tmp_path: Path) -> Path:
    state = tmp_path / "gpuslice"
    for folder in uninstall.STATE_FOLDERS:
        (state / folder / "x").mkdir(parents=True)
        (state / folder / "x" / "f").write_text("1")
    return state


def test_leaving_a_node_removes_its_annotation_labels_and_state_folder(tmp_path: Path) -> None:
    machine = discover("pcie-4x-l4")
    core, state = FakeCore(), _state(tmp_path)
    assert forget_node(core, "n1", machine, state, holders=[]) == []
    ((name, body),) = core.patches
    assert name == "n1" and body["metadata"]["annotations"] == {ANNOTATION_NODE_INVENTORY: None}
    assert body["metadata"]["labels"] == dict.fromkeys(node_labels(machine)) and body["metadata"]["labels"]
    assert not state.exists()


def test_leaving_a_node_keeps_the_state_while_pods_hold_slices_and_other_files_always(tmp_path: Path) -> None:
    machine = discover("pcie-4x-l4")
    state = _state(tmp_path)
    kept = forget_node(FakeCore(), "n1", machine, state, holders=["ns/train"])
    assert "1 pod(s) still hold slices" in kept[0] and "ns/train" in kept[0]
    assert all((state / folder / "x" / "f").exists() for folder in uninstall.STATE_FOLDERS)
    (state / "someone-else").write_text("theirs")
    assert "other files" in forget_node(FakeCore(), "n1", machine, state, holders=[])[0]
    assert [p.name for p in state.iterdir()] == ["someone-else"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--namespace", "Bad!", "--daemonset", "plugin"], "invalid namespace 'Bad!'"),
        (["--namespace", "gs", "--daemonset", "a/b"], "invalid DaemonSet name 'a/b'"),
        (["--namespace", "gs", "--daemonset", "x" * 254], "invalid DaemonSet name"),
    ],
)
def test_the_hook_command_refuses_names_no_object_can_have(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["k8s", "remove-daemonsets", *args])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and said in err and err.startswith("error:"), (out, err)
