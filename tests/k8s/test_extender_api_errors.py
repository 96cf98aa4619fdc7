"""What a bind answers when the API server refuses a call: the status and the API server's own message,
never the client library's dump (its ``str(ApiException)`` carries every HTTP response header), and the
409 "already assigned" of a Binding as its own error.

No API server: CoreV1Api is swapped for one that raises the client's real ApiException with a real
response's headers and Status body."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from test_extender import inventory, node_event

from gpuslice.k8s.extender import ClusterState, KubernetesApi
from gpuslice.k8s.extender.kube import AlreadyBound

HEADERS = {
    "Audit-Id": "5d1c0c53-8a61-4e0f-b0c2-6c4f5e0e2b1a",
    "Content-Type": "application/json",
    "X-Kubernetes-Pf-Flowschema-Uid": "0f6a2f4e-c0ae-4a8e-8a39-1a7b2c3d4e5f",
}


class _Response:
    """The parts of urllib3's response that ApiException reads."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status, self.reason, self.headers = status, reason, HEADERS
        self.data = json.dumps(
            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": status}
        ).encode()

    def getheaders(self) -> dict[str, str]:
        return HEADERS


class Refusing:
    """CoreV1Api whose named methods fail as the API server would."""

    def __init__(self, failures: dict[str, tuple[int, str, str]]) -> None:
        self.api_client = client.ApiClient()
        self.failures = failures

    def __getattr__(self, method: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            if method in self.failures:
                raise ApiException(http_resp=_Response(*self.failures[method]))
            if method == "read_namespaced_pod":
                limits = {"cpu": "1"}
                return client.V1Pod(
                    metadata=client.V1ObjectMeta(name=args[0], namespace=args[1], uid="u-1"),
                    spec=client.V1PodSpec(
                        containers=[
                            client.V1Container(
                                name="c", image="i", resources=client.V1ResourceRequirements(limits=limits)
                            )
                        ]
                    ),
                )
            return None

        return call


def _state(monkeypatch, failures: dict[str, tuple[int, str, str]]) -> ClusterState:
    monkeypatch.setattr(config, "load_kube_config", lambda config_file=None: None)
    kube = KubernetesApi(kubeconfig="/nonexistent/kubeconfig")
    kube._core = Refusing(failures)
    state = ClusterState(kube)
    state.apply(node_event("n1", inventory()))
    return state


def _assert_plain(error: str) -> None:
    assert error
    for header, value in HEADERS.items():
        assert header not in error and value not in error, error
    assert "HTTP response headers" not in error and '"kind"' not in error, error


def test_a_bind_to_a_missing_node_says_so_in_the_api_servers_words(monkeypatch):
    missing = (404, "Not Found", 'nodes "gone" not found')
    state = _state(monkeypatch, {"create_namespaced_binding": missing})
    error = state.bind("team-a", "train-1", "u-1", "gone")
    _assert_plain(error)
    assert "404" in error and 'nodes "gone" not found' in error, error
    assert "team-a/train-1" in error and "gone" in error, error


def test_a_bind_of_a_missing_pod_says_so_in_the_api_servers_words(monkeypatch):
    state = _state(monkeypatch, {"read_namespaced_pod": (404, "Not Found", 'pods "train-1" not found')})
    error = state.bind("team-a", "train-1", "u-1", "n1")
    _assert_plain(error)
    assert 'pods "train-1" not found' in error, error


def test_the_409_already_assigned_is_its_own_error_and_other_409s_are_not(monkeypatch):
    monkeypatch.setattr(config, "load_kube_config", lambda config_file=None: None)
    kube = KubernetesApi(kubeconfig="/nonexistent/kubeconfig")
    assigned = 'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1"'
    kube._core = Refusing({"create_namespaced_binding": (409, "Conflict", assigned)})
    with pytest.raises(AlreadyBound, match="already assigned"):
        kube.create_binding("team-a", "p", "u-1", "n1")
    other = 'Operation cannot be fulfilled on pods "p": the object has been modified'
    kube._core = Refusing({"create_namespaced_binding": (409, "Conflict", other)})
    with pytest.raises(Exception, match="has been modified") as raised:
        kube.create_binding("team-a", "p", "u-1", "n1")
    assert not isinstance(raised.value, AlreadyBound)
