"""The extender's side of the node lock (``k8s.node_lock``): take it at bind, wait a little for it.

One bind per node at a time in this process tries the lock (the others queue on an in-process mutex, so
a node released wakes one reader of the Node, not every waiting bind). A node locked by a pod that still
waits for its allocation is waited on for up to ``wait_s``, woken by the Node watch (the device plugin's
release is a Node change) or every ``POLL_S``; then bind answers an error and kube-scheduler retries the
pod with its usual backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuslice.k8s.annotations import ANNOTATION_BIND_PHASE, ANNOTATION_NODE, BIND_PHASE_ALLOCATING
from gpuslice.k8s.node_lock import LockHolder, NodeLockApi, NodeLockError, release, take

__all__ = ["DEFAULT_LOCK_WAIT_S", "BindLocks"]

log = logging.getLogger(__name__)

# kube-scheduler waits for an extender's bind up to its httpTimeout (10 s in deploy/); a bind
# waits for a locked node well inside it, then answers so the pod is retried instead of timing out.
DEFAULT_LOCK_WAIT_S = 5.0
POLL_S = 1.0  # re-read a locked Node this often even without a watch event for it


class BindLocks:
    """Node locks for binds. ``api`` reads pods (``get_pod``) and the Node (``NodeLockApi``)."""

    def __init__(
        self,
        api: Any,
        *,
        timeout_s: float,
        wait_s: float = DEFAULT_LOCK_WAIT_S,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.api: NodeLockApi = api
        self._pods = api
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self._now = now
        self._guard = threading.Lock()
        self._changed = threading.Condition(self._guard)
        self._per_node: dict[str, threading.Lock] = {}
        self._binding: set[str] = set()  # pod UIDs whose bind runs in this process (lock taken or taking)
        self.refused = 0  # binds answered "node locked" after waiting

    def changed(self, node_name: str) -> None:
        """A watch event for ``node_name``: wake the bind waiting for its lock."""
        with self._changed:
            self._changed.notify_all()

    def acquire(self, node_name: str, namespace: str, name: str, uid: str) -> str:
        """Take ``node_name``'s lock for the pod; '' once held, else why not (bind answers it)."""
        deadline = time.monotonic() + self.wait_s
        with self._guard:
            mutex = self._per_node.setdefault(node_name, threading.Lock())
        if not mutex.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return self._refusal(node_name, None)
        try:
            with self._guard:
                self._binding.add(uid)
            holder = LockHolder(uid, namespace, name, self._now())
            while True:
                try:
                    blocker = take(
                        self.api,
                        node_name,
                        holder,
                        timeout_s=self.timeout_s,
                        alive=self._alive,
                        now=self._now,
                    )
                except NodeLockError as err:
                    self.done(uid)
                    return str(err)
                if blocker is None:
                    return ""
                left = deadline - time.monotonic()
                if left <= 0:
                    self.done(uid)
                    return self._refusal(node_name, blocker)
                with self._changed:
                    self._changed.wait(min(left, POLL_S))
        finally:
            mutex.release()

    def done(self, uid: str) -> None:
        """The pod's bind has ended (its annotations now say whether it waits for Allocate)."""
        with self._guard:
            self._binding.discard(uid)

    def release(self, node_name: str, uid: str) -> None:
        """Give the lock back after a failed bind (the device plugin releases it after Allocate)."""
        try:
            release(self.api, node_name, uid)
        except NodeLockError as err:
            log.warning("%s; it frees itself once the pod is seen not waiting", err)

    def _refusal(self, node_name: str, blocker: LockHolder | None) -> str:
        self.refused += 1
        who = f"pod {blocker}, waiting for Allocate since {blocker.since:.0f}" if blocker else "another bind"
        return (
            f"node {node_name} is locked by {who}: one pod at a time per node goes from bind to Allocate; "
            "kube-scheduler retries"
        )

    def _alive(self, holder: LockHolder) -> bool:
        """Does the holder's pod still wait for an allocation? Its bind runs here, or the API server has
        it Pending with bind-phase "allocating". When the API cannot say, it is taken as waiting."""
        with self._guard:
            if holder.uid in self._binding:
                return True
        try:
            pod = self._pods.get_pod(holder.namespace, holder.name)
        except Exception:
            try:
                return not self._pods.pod_gone(holder.namespace, holder.name, holder.uid)
            except Exception:
                return True
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return (
            meta.get("uid") == holder.uid
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            and annotations.get(ANNOTATION_BIND_PHASE) == BIND_PHASE_ALLOCATING
            and bool(annotations.get(ANNOTATION_NODE))
        )
