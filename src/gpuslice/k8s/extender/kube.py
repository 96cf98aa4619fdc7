"""The Kubernetes API as the extender needs it: pods, bindings, events, and a watch of nodes and pods.

``KubeApi`` is the interface (tests fake it); ``KubernetesApi`` implements it with the official client."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuslice.k8s import kube_client, node_lock
from gpuslice.k8s.kube_client import ApiError, api_errors

__all__ = ["RELISTED", "AlreadyBound", "KubeApi", "KubernetesApi", "WatchEvent"]

log = logging.getLogger(__name__)

RELISTED = "RELISTED"  # WatchEvent.type after a full list: object {"items": [...]}, everything that exists


class AlreadyBound(ApiError):
    """``create_binding``: the pod is already bound to a node (the API server's 409, "already assigned");
    the first Binding of a pod is the only one."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watch: ``kind`` Node or Pod, ``type`` ADDED/MODIFIED/DELETED, API JSON."""

    kind: str
    type: str
    object: Mapping[str, Any]


class KubeApi(Protocol):
    """What the extender needs from the API server. ``KubernetesApi`` is the real one; tests fake it."""

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None: ...

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    def create_event(
        self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str
    ) -> None: ...

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a preemption victim with its own grace period (only if it is still that pod: ``uid``)."""
        ...

    def pod_gone(self, namespace: str, name: str, uid: str) -> bool:
        """True once the pod ``uid`` no longer exists (deleted, or replaced by another of that name)."""
        ...

    # the node lock's two calls (``k8s.node_lock.NodeLockApi``)
    def read_node_annotations(self, node_name: str) -> tuple[dict[str, str], str]: ...

    def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> None: ...


class KubernetesApi:
    """``KubeApi`` over the official ``kubernetes`` client (imported here, so the extra stays optional)."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        client = kube_client.kubernetes_client_module()
        self._client = client
        self._core = client.CoreV1Api(kube_client.api_client(kubeconfig))

    def _plain(self, obj: Any) -> dict[str, Any]:
        return self._core.api_client.sanitize_for_serialization(obj)

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        with api_errors():
            return self._plain(self._core.read_namespaced_pod(name, namespace))

    def patch_pod_annotations(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        with api_errors():
            self._core.patch_namespaced_pod(name, namespace, body)

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        c = self._client
        body = c.V1Binding(
            metadata=c.V1ObjectMeta(name=name, namespace=namespace, uid=uid),
            target=c.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        # _preload_content=False: the client cannot decode the Binding the server answers with
        # (a known kubernetes-client/python bug: "Invalid value for `target`, must not be `None`").
        try:
            with api_errors():
                self._core.create_namespaced_binding(namespace, body, _preload_content=False)
        except ApiError as err:
            if err.status == 409 and "already assigned" in str(err):
                raise AlreadyBound(str(err), err.status) from None
            raise

    def create_event(self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str) -> None:
        c = self._client
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = c.CoreV1Event(
            metadata=c.V1ObjectMeta(generate_name=f"{pod_name}.", namespace=namespace),
            involved_object=c.V1ObjectReference(
                api_version="v1", kind="Pod", namespace=namespace, name=pod_name, uid=pod_uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning",
            source=c.V1EventSource(component="gpuslice-extender"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._core.create_namespaced_event(namespace, event)

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        c = self._client
        # The UID precondition: a pod recreated under the same name since is not touched.
        self._core.delete_namespaced_pod(
            name, namespace, body=c.V1DeleteOptions(preconditions=c.V1Preconditions(uid=uid))
        )

    def pod_gone(self, namespace: str, name: str, uid: str) -> bool:
        try:
            pod = self._core.read_namespaced_pod(name, namespace)
        except self._client.exceptions.ApiException as err:
            if err.status == 404:
                return True
            raise
        return bool(pod.metadata.uid != uid)

    def list_resource_claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim in the cluster (the cluster view keeps gpuslice's allocated ones)."""
        from gpuslice.k8s.dra.kube import GROUP, VERSION

        objects = self._client.CustomObjectsApi(self._core.api_client)
        with api_errors():
            found = objects.list_cluster_custom_object(GROUP, VERSION, "resourceclaims", _request_timeout=10)
        return list(found.get("items") or [])

    def read_node_annotations(self, node_name: str) -> tuple[dict[str, str], str]:
        return node_lock.read_node_annotations(self._core, node_name)

    def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> None:
        node_lock.write_node_annotations(self._core, node_name, annotations, resource_version)

    def events(self) -> Iterator[WatchEvent]:
        """Every node and pod as ADDED, then their changes; relists after a dropped or expired watch."""
        from kubernetes import watch

        queue: list[WatchEvent] = []
        ready = threading.Condition()

        def pump(kind: str, lister: Callable[..., Any]) -> None:
            while True:
                try:
                    listed = lister()
                    objects = [self._plain(o) for o in listed.items]
                    with ready:
                        queue.extend(WatchEvent(kind, "ADDED", o) for o in objects)
                        # what was deleted while no watch ran shows up only as absence from the list
                        queue.append(WatchEvent(kind, RELISTED, {"items": objects}))
                        ready.notify()
                    stream = watch.Watch().stream(lister, resource_version=listed.metadata.resource_version)
                    for raw in stream:
                        with ready:
                            queue.append(WatchEvent(kind, raw["type"], self._plain(raw["object"])))
                            ready.notify()
                except Exception:  # 410 Gone, a dropped connection: relist, as informers do
                    log.warning("%s watch ended; relisting in 1 s", kind, exc_info=True)
                    time.sleep(1.0)

        for kind, lister in (("Node", self._core.list_node), ("Pod", self._core.list_pod_for_all_namespaces)):
            threading.Thread(target=pump, args=(kind, lister), daemon=True, name=f"watch-{kind}").start()
        while True:
            with ready:
                while not queue:
                    ready.wait()
                batch, queue[:] = list(queue), []
            yield from batch
