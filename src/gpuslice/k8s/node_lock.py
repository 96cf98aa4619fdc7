"""The node lock: between the extender's bind and the device plugin's Allocate, one pod at a time per
node for each kind of Allocate call.

The kubelet's Allocate names device IDs, not a pod, and the device IDs are the kubelet's choice (guided
by the plugin's preferred allocation, which is asked without a pod either). What an Allocate call does
tell the device plugin is its *allocate key*: the resource (``gpuslice.io/gpu`` or one
``gpuslice.io/mig-<profile>``) and how many of its devices the container asks for. So the device plugin
can tell which pod it is allocating for only while a single pod on the node with that key waits for an
allocation. The extender's bind takes this lock on the Node for its pod's key before it writes a decision
and binds; the device plugin releases it once Allocate has answered (or refused) that pod. Pods whose
keys differ (a 1-GPU share pod and a 2-GPU pod, a share pod and a MIG pod) go through together. A bind
that finds its key held by a live pod waits a little, then answers an error and kube-scheduler retries
the pod later.

The lock is one annotation on the Node, ``gpuslice.io/node-lock``, whose value is a JSON list with one
entry per pod that holds it::

    [{"uid": "<pod uid>", "pod": "<namespace>/<name>", "since": <unix seconds>, "key": "gpuslice.io/gpu*1"}]

An entry without a key (the single object an older extender wrote) holds the whole node. The lock is
taken and released by a read of the Node and a patch that carries the resourceVersion read, so the API
server refuses the patch (409 Conflict) if anyone changed the Node in between: two extenders, or an
extender and the device plugin, can never both believe they hold or cleared it. An entry older than the
timeout, or whose pod is no longer waiting (deleted, running, failed), is taken over, so a lost pod does
not wedge its node. Correctness does not rest on the lock: the device plugin itself refuses Allocate
while more than one pod with the call's key waits on the node (see ``device_plugin.allocation``); the
lock is what keeps that from happening.

HAMi serialises its binds the same way, per node (Project-HAMi/HAMi ``pkg/util/nodelock``: an annotation
with time and owner pod, patched with the resourceVersion, 5-minute expiry, an owner that no longer
exists releases it); this is gpuslice's own version of that idea, with the finer key.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuslice.errors import Unavailable
from gpuslice.k8s.annotations import (
    DOMAIN,
    RESOURCE_GPU,
    PodGpuRequest,
    mig_resource,
)
from gpuslice.k8s.decision import Decision

__all__ = [
    "ANNOTATION_NODE_LOCK",
    "DEFAULT_LOCK_TIMEOUT_S",
    "LockHolder",
    "NodeLockApi",
    "NodeLockConflict",
    "NodeLockError",
    "allocate_key",
    "ask_key",
    "decision_key",
    "holders_text",
    "parse_holders",
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


def allocate_key(resource: str, devices: int) -> str:
    """What one Allocate call tells apart: its resource and how many of its devices it asks for."""
    return f"{resource}*{devices}"


def decision_key(decision: Decision) -> str:
    """The allocate key of the Allocate call that will come next for ``decision``'s pod (the call of
    its next container, when several ask: ``Decision.current``)."""
    decision = decision.current()
    if decision.mig is not None:
        return allocate_key(mig_resource(decision.mig.profile), 1)
    return allocate_key(RESOURCE_GPU, len(decision.gpu_uuids or decision.gpu_indices))


def ask_key(ask: PodGpuRequest) -> str:
    """The allocate key of a pod, from its request (the same as its decision's, which comes later). A pod
    where several containers ask makes several Allocate calls, of keys that may differ: it holds the
    whole node ("")."""
    if ask.multi:
        return ""
    if ask.mig_profile:
        return allocate_key(mig_resource(ask.mig_profile), max(1, ask.mig_count))
    return allocate_key(RESOURCE_GPU, ask.gpus)


@dataclass(frozen=True, slots=True)
class LockHolder:
    """A pod that holds a node's lock for its allocate key ("": the whole node), and since when (unix
    seconds, the taker's clock)."""

    uid: str
    namespace: str
    name: str
    since: float
    key: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"uid": self.uid, "pod": f"{self.namespace}/{self.name}", "since": self.since, "key": self.key}

    def blocks(self, other: LockHolder) -> bool:
        """Would ``other``'s pod wait for an allocation beside this one with Allocate unable to tell them
        apart? Always when either holds the whole node."""
        return not self.key or not other.key or self.key == other.key

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def holders_text(holders: Sequence[LockHolder]) -> str:
    return json.dumps([h.to_json() for h in holders])


def parse_holders(text: str | None) -> tuple[LockHolder, ...]:
    """The holders in a lock annotation. A malformed entry is left out (nobody can be waiting on an entry
    nobody could have written); a single object is one holder of the whole node."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    entries = value if isinstance(value, list) else [value]
    holders = []
    for entry in entries:
        holder = _holder(entry)
        if holder is None:
            log.warning("malformed %s entry in %r: treated as free", ANNOTATION_NODE_LOCK, text[:200])
        else:
            holders.append(holder)
    return tuple(holders)


def _holder(entry: Any) -> LockHolder | None:
    try:
        namespace, _, name = str(entry["pod"]).partition("/")
        since = float(entry["since"])
        uid = entry["uid"]
        key = entry.get("key", "")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not isinstance(uid, str) or not uid or not name or since != since or not isinstance(key, str):
        return None  # since != since: NaN
    return LockHolder(uid, namespace, name, since, key)


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
    """Take ``node_name``'s lock for ``holder`` (its pod and allocate key): None once taken, else the live
    holder in the way.

    Only holders that ``block`` it stand in the way, and not when held by ``holder``'s own pod (a retried
    bind), older than ``timeout_s``, or held by a pod ``alive`` says no longer waits for its allocation:
    those entries are taken over. Entries of other keys stay; the expired ones are dropped."""
    for _ in range(CONFLICT_RETRIES):
        annotations, version = _read(api, node_name)
        keep = []
        for current in parse_holders(annotations.get(ANNOTATION_NODE_LOCK)):
            if current.uid == holder.uid:
                continue
            age = now() - current.since
            if not current.blocks(holder):
                if age < timeout_s:
                    keep.append(current)
                continue
            if age < timeout_s and alive(current):
                return current
            why = f"older than {timeout_s:g} s" if age >= timeout_s else "its pod no longer waits"
            log.info("node %s: taking over the lock of pod %s (%s) for %s", node_name, current, why, holder)
        try:
            api.write_node_annotations(
                node_name, {ANNOTATION_NODE_LOCK: holders_text([*keep, holder])}, version
            )
        except NodeLockConflict:
            continue
        except Exception as err:
            raise NodeLockError(f"cannot write the lock on node {node_name}: {err}") from None
        return None
    raise NodeLockError(f"node {node_name} changed {CONFLICT_RETRIES} times while its lock was taken")


def release(api: NodeLockApi, node_name: str, uid: str) -> bool:
    """Remove pod ``uid``'s entry from ``node_name``'s lock; True if this call removed it."""
    for _ in range(CONFLICT_RETRIES):
        annotations, version = _read(api, node_name)
        holders = parse_holders(annotations.get(ANNOTATION_NODE_LOCK))
        rest = [h for h in holders if h.uid != uid]
        if len(rest) == len(holders):
            return False  # free already, or taken over since: not ours to clear
        try:
            api.write_node_annotations(
                node_name, {ANNOTATION_NODE_LOCK: holders_text(rest) if rest else None}, version
            )
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


# ---- over the official client (the extender's KubernetesApi and NodeKubeClient delegate here) ---------


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
