"""Who may bind now: one bind per pod at a time (``PodBinds``), and the extender's side of the node lock
(``k8s.node_lock``): take it at bind, wait a little for it (``BindLocks``).

Every bind answers within ``BIND_BUDGET_S`` of reaching the HTTP app, queueing for a worker thread
included, well inside kube-scheduler's httpTimeout: a bind that would wait longer for its pod's other
bind or for a locked node answers an error instead, and kube-scheduler retries the pod with its backoff.

One bind per node and allocate key at a time in this process tries the lock (the others queue on an
in-process mutex, so a node released wakes one reader of the Node, not every waiting bind). A node
locked for the bind's key by a pod that still waits for its allocation is waited on for up to
``wait_s``, woken by the Node watch (the device plugin's release is a Node change) or every ``POLL_S``;
then bind answers an error and kube-scheduler retries the pod with its usual backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuslice.k8s.annotations import ANNOTATION_BIND_PHASE, ANNOTATION_NODE, BIND_PHASE_ALLOCATING
from gpuslice.k8s.node_lock import LockHolder, NodeLockApi, NodeLockError, release, take

__all__ = ["BIND_BUDGET_S", "DEFAULT_LOCK_WAIT_S", "BindLocks", "PodBinds"]

log = logging.getLogger(__name__)

# kube-scheduler waits for an extender's bind up to its httpTimeout (10 s in deploy/) and then binds the
# pod again while the first bind may still run. A bind answers within BIND_BUDGET_S of its arrival (its
# API calls, about 2 x 10 ms, come after the waits); it waits for a locked node at most
# DEFAULT_LOCK_WAIT_S of that, then answers so the pod is retried instead of timing out.
BIND_BUDGET_S = 3.0
DEFAULT_LOCK_WAIT_S = 2.0
POLL_S = 1.0  # re-read a locked Node this often even without a watch event for it


class PodBinds:
    """One bind per pod UID at a time in this process.

    A second bind of a pod (kube-scheduler's retry after its timeout) waits until the first has ended,
    so it reads the first one's outcome (bound: ``_bound_to``; failed: nothing held) instead of racing it
    for the pod's decision, hold and annotations; at its deadline it gives up and answers an error."""

    def __init__(self) -> None:
        self._ended = threading.Condition()
        self._running: set[str] = set()

    def claim(self, uid: str, deadline: float) -> bool:
        """Start ``uid``'s bind; False if another bind of it still runs at ``deadline`` (time.monotonic)."""
        with self._ended:
            while uid in self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._ended.wait(left)
            self._running.add(uid)
            return True

    def end(self, uid: str) -> None:
        """``uid``'s bind has answered (its annotations now say whether it waits for Allocate)."""
        with self._ended:
            self._running.discard(uid)
            self._ended.notify_all()

    def running(self, uid: str) -> bool:
        with self._ended:
            return uid in self._running


class BindLocks:
    """Node locks for binds. ``api`` reads pods (``get_pod``) and the Node (``NodeLockApi``); ``binds``
    says which pods' binds run in this process (their locks are live whatever the API says)."""

    def __init__(
        self,
        api: Any,
        binds: PodBinds,
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
        self._per_key: dict[tuple[str, str], threading.Lock] = {}  # (node, allocate key)
        self._binds = binds
        self.refused = 0  # binds answered "node locked" after waiting

    def changed(self, node_name: str) -> None:
        """A watch event for ``node_name``: wake the bind waiting for its lock."""
        with self._changed:
            self._changed.notify_all()

    def acquire(self, node_name: str, namespace: str, name: str, uid: str, key: str, deadline: float) -> str:
        """Take ``node_name``'s lock for the pod and its allocate ``key`` (``node_lock.ask_key``); '' once
        held, else why not (bind answers it). Waits ``wait_s`` at most, and never past ``deadline``
        (time.monotonic)."""
        deadline = min(deadline, time.monotonic() + self.wait_s)
        with self._guard:
            mutex = self._per_key.setdefault((node_name, key), threading.Lock())
        if not mutex.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return self._refusal(node_name, key, None)
        try:
            holder = LockHolder(uid, namespace, name, self._now(), key)
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
                    return str(err)
                if blocker is None:
                    return ""
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._refusal(node_name, key, blocker)
                with self._changed:
                    self._changed.wait(min(left, POLL_S))
        finally:
            mutex.release()

    def release(self, node_name: str, uid: str) -> None:
        """Give the lock back after a failed bind (the device plugin releases it after Allocate)."""
        try:
            release(self.api, node_name, uid)
        except NodeLockError as err:
            log.warning("%s; it frees itself once the pod is seen not waiting", err)

    def _refusal(self, node_name: str, key: str, blocker: LockHolder | None) -> str:
        self.refused += 1
        who = f"pod {blocker}, waiting for Allocate since {blocker.since:.0f}" if blocker else "another bind"
        return (
            f"node {node_name} is locked by {who} (allocate key {key}): one pod at a time per node and "
            "allocate key (resource, device count) goes from bind to Allocate; kube-scheduler retries"
        )

    def _alive(self, holder: LockHolder) -> bool:
        """Does the holder's pod still wait for an allocation? Its bind runs here, or the API server has
        it Pending with bind-phase "allocating". When the API cannot say, it is taken as waiting."""
        if self._binds.running(holder.uid):
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
