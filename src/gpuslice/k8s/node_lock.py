"""The node lock: one pod at a time per node between the extender's bind and the device plugin's Allocate.

The kubelet's Allocate names device IDs, not a pod, so the device plugin can tell which pod it is
allocating for only while a single pod on the node waits for an allocation. The extender's bind takes
this lock on the Node before it writes a decision and binds; the device plugin releases it once Allocate
has answered (or refused) that pod. A bind that finds the node locked by a live pod waits a little, then
answers an error and kube-scheduler retries the pod later.

The lock is one annotation on the Node, ``gpuslice.io/node-lock``, whose value is JSON::

    {"uid": "<pod uid>", "pod": "<namespace>/<name>", "since": <unix seconds>}

It is taken and released by a read of the Node and a patch that carries the resourceVersion read, so
the API server refuses the patch (409 Conflict) if anyone changed the Node in between: two extenders, or
an extender and the device plugin, can never both believe they hold or cleared it. A lock older than the
timeout, or whose pod is no longer waiting (deleted, running, failed), is taken over, so a lost pod does
not wedge its node. Correctness does not rest on the lock: the device plugin itself refuses Allocate
while more than one pod waits on the node (see ``device_plugin.allocation``); the lock is what keeps
that from happening.

HAMi serialises its binds the same way (Project-HAMi/HAMi ``pkg/util/nodelock``: an annotation with
time and owner pod, patched with the resourceVersion, 5-minute expiry, an owner that no longer exists
releases it); this is gpuslice's own version of that idea.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuslice.errors import Unavailable
from gpuslice.k8s.annotations import DOMAIN

__all__ = [
    "ANNOTATION_NODE_LOCK",
    "DEFAULT_LOCK_TIMEOUT_S",
    "LockHolder",
    "NodeLockApi",
    "NodeLockConflict",
    "NodeLockError",
    "parse_holder",
    "read_node_annotations",
    "release",
    "take",
    "write_node_annotations",
]

log = logging.getLogger(__name__)

ANNOTATION_NODE_LOCK = f"{DOMAIN}/node-lock"
# HAMi's default expiry (HAMI_NODELOCK_EXPIRE, 5 minutes). A live waiting pod is normally allocated in
# well under a second; the timeout only frees a node whose waiting pod the kubelet never admits.
DEFAULT_LOCK_TIMEOUT_S = 300.0
CONFLICT_RETRIES = 8  # the Node also changes under us (kubelet status, inventory): read again, retry


class NodeLockConflict(Exception):
    """The Node's resourceVersion changed between the read and the patch (the API server's 409)."""


class NodeLockError(Unavailable):
    """The node lock could not be read or written (the API server did not answer, or kept changing)."""


@dataclass(frozen=True, slots=True)
class LockHolder:
    """The pod a node's lock is held for, and since when (unix seconds, the taker's clock)."""

    uid: str
    namespace: str
    name: str
    since: float

    def to_text(self) -> str:
        return json.dumps({"uid": self.uid, "pod": f"{self.namespace}/{self.name}", "since": self.since})

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_holder(text: str | None) -> LockHolder | None:
    """The holder in a lock annotation; None when there is none or it is malformed (then it is free:
    nobody can be waiting on a lock nobody could have written)."""
    if not text:
        return None
    try:
        value = json.loads(text)
        namespace, _, name = str(value["pod"]).partition("/")
        since = float(value["since"])
        uid = value["uid"]
    except (ValueError, TypeError, KeyError):
        log.warning("malformed %s %r: treated as free", ANNOTATION_NODE_LOCK, text[:200])
        return None
    if not isinstance(uid, str) or not uid or not name or since != since:  # since != since: NaN
        log.warning("malformed %s %r: treated as free", ANNOTATION_NODE_LOCK, text[:200])
        return None
    return LockHolder(uid, namespace, name, since)


class NodeLockApi(Protocol):
    """The two Node calls the lock needs (the extender's and the device plugin's API both have them)."""

    def read_node_annotations(self, node_name: str) -> tuple[dict[str, str], str]:
        """The Node's annotations and its resourceVersion."""
        ...

    def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> None:
        """Merge ``annotations`` (None deletes a key) if the Node is still at ``resource_version``;
        ``NodeLockConflict`` if it is not."""
        ...


def take(
    api: NodeLockApi,
    node_name: str,
    holder: LockHolder,
    *,
    timeout_s: float,
    alive: Callable[[LockHolder], bool],
    now: Callable[[], float] = time.time,
) -> LockHolder | None:
    """Take ``node_name``'s lock for ``holder``: None once taken, else the live holder in the way.

    The lock is free when absent, malformed, held by ``holder``'s own pod (a retried bind), older than
    ``timeout_s``, or held by a pod ``alive`` says no longer waits for its allocation."""
    for _ in range(CONFLICT_RETRIES):
        annotations, version = _read(api, node_name)
        current = parse_holder(annotations.get(ANNOTATION_NODE_LOCK))
        if current is not None and current.uid != holder.uid:
            age = now() - current.since
            if age < timeout_s and alive(current):
                return current
            why = f"older than {timeout_s:g} s" if age >= timeout_s else "its pod no longer waits"
            log.info("node %s: taking over the lock of pod %s (%s) for %s", node_name, current, why, holder)
        try:
            api.write_node_annotations(node_name, {ANNOTATION_NODE_LOCK: holder.to_text()}, version)
        except NodeLockConflict:
            continue
        except Exception as err:
            raise NodeLockError(f"cannot write the lock on node {node_name}: {err}") from None
        return None
    raise NodeLockError(f"node {node_name} changed {CONFLICT_RETRIES} times while its lock was taken")


def release(api: NodeLockApi, node_name: str, uid: str) -> bool:
    """Clear ``node_name``'s lock if pod ``uid`` holds it; True if it was cleared by this call."""
    for _ in range(CONFLICT_RETRIES):
        annotations, version = _read(api, node_name)
        current = parse_holder(annotations.get(ANNOTATION_NODE_LOCK))
        if current is None or current.uid != uid:
            return False  # free already, or taken over since: not ours to clear
        try:
            api.write_node_annotations(node_name, {ANNOTATION_NODE_LOCK: None}, version)
        except NodeLockConflict:
            continue
        except Exception as err:
            raise NodeLockError(f"cannot clear the lock on node {node_name}: {err}") from None
        return True
    raise NodeLockError(f"node {node_name} changed {CONFLICT_RETRIES} times while its lock was cleared")


def _read(api: NodeLockApi, node_name: str) -> tuple[dict[str, str], str]:
    try:
        return api.read_node_annotations(node_name)
    except Exception as err:
        raise NodeLockError(f"cannot read node {node_name}: {err}") from None


# ---- over the official client (both KubeApi classes delegate here) -----------------------------------


def read_node_annotations(core: Any, node_name: str) -> tuple[dict[str, str], str]:
    """``NodeLockApi.read_node_annotations`` for a ``kubernetes.client.CoreV1Api``."""
    node = core.read_node(node_name)
    return dict(node.metadata.annotations or {}), str(node.metadata.resource_version)


def write_node_annotations(
    core: Any, node_name: str, annotations: Mapping[str, str | None], resource_version: str
) -> None:
    """``NodeLockApi.write_node_annotations`` for a ``kubernetes.client.CoreV1Api``: a merge patch whose
    metadata.resourceVersion makes the API server check it (409 Conflict when the Node moved on)."""
    from kubernetes.client.exceptions import ApiException

    body = {"metadata": {"resourceVersion": resource_version, "annotations": dict(annotations)}}
    try:
        core.patch_node(node_name, body)
    except ApiException as err:
        if err.status == 409:
            raise NodeLockConflict(str(err.reason)) from None
        raise
