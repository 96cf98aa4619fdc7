"""``KubernetesApi`` builds real ``kubernetes`` client objects and calls the right CoreV1Api methods.

No API server: the CoreV1Api is swapped for a recorder after construction; the client's own models and
its serialiser are the real ones, so a wrong field or a missing required one fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client, config

from gpuslice.k8s.extender import RELISTED, KubernetesApi


class Recorder:
    """Stands in for CoreV1Api: records each call, answers reads with real client models."""

    def __init__(self) -> None:
        self.api_client = client.ApiClient()
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, method: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, args, kwargs))
            if method == "read_namespaced_pod":
                return client.V1Pod(
                    metadata=client.V1ObjectMeta(name=args[0], namespace=args[1], uid="u-1"),
                    spec=client.V1PodSpec(containers=[client.V1Container(name="train", image="pytorch")]),
                )
            return None

        return call


@pytest.fixture
def api(monkeypatch) -> tuple[KubernetesApi, Recorder]:
    monkeypatch.setattr(config, "load_kube_config", lambda config_file=None: None)
    kube = KubernetesApi(kubeconfig="/nonexistent/kubeconfig")
    recorder = Recorder()
    kube._core = recorder
    return kube, recorder


def test_get_pod_returns_api_json(api):
    kube, _ = api
    pod = kube.get_pod("team-a", "train-1")
    assert pod["metadata"] == {"name": "train-1", "namespace": "team-a", "uid": "u-1"}
    assert pod["spec"]["containers"][0]["name"] == "train"


def test_annotations_are_a_merge_patch_of_metadata(api):
    kube, rec = api
    kube.patch_pod_annotations("team-a", "train-1", {"gpuslice.io/node": "n1"})
    assert rec.calls == [
        (
            "patch_namespaced_pod",
            ("train-1", "team-a", {"metadata": {"annotations": {"gpuslice.io/node": "n1"}}}),
            {},
        )
    ]


def test_binding_targets_the_node_and_skips_decoding_the_reply(api):
    kube, rec = api
    kube.create_binding("team-a", "train-1", "u-1", "gpu-node-7")
    ((method, (namespace, body), kwargs),) = rec.calls
    assert (method, namespace, kwargs) == ("create_namespaced_binding", "team-a", {"_preload_content": False})
    assert rec.api_client.sanitize_for_serialization(body) == {
        "metadata": {"name": "train-1", "namespace": "team-a", "uid": "u-1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-7"},
    }


def test_event_names_the_pod_and_the_extender(api):
    kube, rec = api
    kube.create_event("team-a", "train-1", "u-1", "FailedScheduling", "gpuslice: 0/3 nodes fit: 3 no GPU")
    ((method, (namespace, event), _),) = rec.calls
    body = rec.api_client.sanitize_for_serialization(event)
    assert (method, namespace) == ("create_namespaced_event", "team-a")
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "train-1",
        "namespace": "team-a",
        "uid": "u-1",
    }
    assert (body["type"], body["reason"], body["source"]) == (
        "Warning",
        "FailedScheduling",
        {"component": "gpuslice-extender"},
    )
    assert body["metadata"]["generateName"] == "train-1."


def test_events_lists_then_marks_the_relist(api, monkeypatch):
    kube, rec = api
    node = client.V1Node(metadata=client.V1ObjectMeta(name="n1", annotations={"a": "b"}))
    listed = client.V1NodeList(items=[node], metadata=client.V1ListMeta(resource_version="42"))
    rec.list_node = lambda **kw: listed
    rec.list_pod_for_all_namespaces = lambda **kw: client.V1PodList(
        items=[], metadata=client.V1ListMeta(resource_version="7")
    )

    class QuietWatch:
        def stream(self, lister, **kwargs):
            assert kwargs["resource_version"] in ("42", "7")  # the watch starts where the list ended
            if lister == rec.list_node:
                yield {"type": "MODIFIED", "object": node}
            # Stay open, as a watch does: the pump threads are daemons and just wait here. (Ending the
            # stream would make them relist in a loop; raising would be an unhandled thread exception.)
            threading_event.wait()

    import threading

    from kubernetes import watch

    threading_event = threading.Event()
    monkeypatch.setattr(watch, "Watch", QuietWatch)
    stream = kube.events()
    seen = [next(stream) for _ in range(4)]  # node: ADDED, RELISTED, MODIFIED; pods: RELISTED
    node_events = [(e.type, e.object.get("metadata", {}).get("name")) for e in seen if e.kind == "Node"]
    assert node_events[:3] == [("ADDED", "n1"), (RELISTED, None), ("MODIFIED", "n1")]
    relisted = next(e for e in seen if e.kind == "Node" and e.type == RELISTED)
    assert relisted.object["items"][0]["metadata"]["name"] == "n1"
