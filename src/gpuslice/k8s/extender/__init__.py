"""kube-scheduler extender: filter, prioritize and bind over a gpuslice Ledger of the cluster's GPUs.

Lifecycle of one pod (the extender/v1 protocol: k8s.io/kube-scheduler/extender/v1 and kube-scheduler's
``pkg/scheduler/extender.go``; the extender is ``nodeCacheCapable``, so it gets node names, never node
objects):

```text
POST /filter      {Pod, NodeNames}  -> {NodeNames, FailedNodes{name: reason}, Error}
                  per node a verdict from the pod's shape's cache: rows whose Ledger.version moved are
                  recomputed, the rest reused; the survivors' ledger indices kept for /prioritize
                  0 nodes pass -> a Warning Event on the pod saying why (off the request path)
POST /prioritize  {Pod, NodeNames}  -> [{Host, Score 0..10}]      placement policy's scores, rescaled
                  (0 where filter's verdict refuses the node)
POST /preempt     {Pod, NodeNameToMetaVictims} -> the candidates where evicting those victims frees a GPU
                  the pod fits on (a what-if over one ledger row)
POST /bind        {PodName, PodNamespace, PodUID, Node}      answered within BIND_BUDGET_S of arrival
                  per-pod claim: one bind of a pod at a time (a retry reads the first one's outcome)
                  per-node lock: choose GPUs (policy advice, topology), Ledger.reserve   (microseconds)
                  no lock:       patch decision annotations, create the Binding  -> {Error}
                  API failure -> the reservation is released; kube-scheduler retries the pod
                  409 "already assigned" -> bound by an earlier bind: its hold stays, nothing marked failed
watch             Node inventory annotation changed -> ledger rebuilt lazily on the next call (with new,
                  empty verdict caches)
                  Pod bound elsewhere / after a restart -> reserved from its decision annotations
                  Pod deleted, Succeeded or Failed -> released
```

The node lock (``k8s/node_lock.py``, ``bind_lock.py``): a bind takes the ``gpuslice.io/node-lock``
annotation on its node before writing the decision, and the device plugin clears it after Allocate, so
one pod per node at a time is bound and not yet allocated: the device plugin's Allocate, which names no
pod, can then tell whom it answers for. HAMi's users reported multi-minute stalls behind its version of
this lock (Project-HAMi/HAMi ``pkg/util/nodelock``), where a pod that never reaches Allocate holds the
node until a timeout. Here a lock whose pod is gone, no longer Pending, or already allocated is taken
over at once, and only a pod the kubelet never admits holds it until ``--node-lock-timeout``. Inside
the extender, the in-memory ledger is still the arbiter: a bind holds its node's ledger lock only while
it chooses GPUs and reserves them, and a failed bind gives back its reservation and the node lock at
once. A stale filter answer is harmless, because bind checks again against the ledger.

Modules, one job each. ``ClusterState`` is made of the others as collaborators, each owning its state:
it makes one ``ClusterCache`` and gives it to a ``Verdicts`` and a ``Preemption``:

```text
kube.py        the API server: KubeApi (what the extender needs), KubernetesApi, the node and pod watch
cluster.py     ClusterCache: nodes' inventories and bound pods from the watch, the ledger built over them,
               the holds of filter and bind and the nominations of preemption
verdicts.py    Verdicts: the ledger's fit codes per node (cached per request shape), in Kubernetes words
preemption.py  Preemption: the preempt verb's what-if, and evictions the extender starts itself
bind_lock.py   PodBinds: one bind per pod; BindLocks: the node lock taken at bind (waiting a little)
state.py       ClusterState: filter, prioritize, bind, preempt; GPUs chosen by Placer.pick_gpus
app.py         create_app: the HTTP verbs over a ClusterState
dashboard/     the read-only cluster page under /cluster/ and its view.json (snapshot.cluster_view)
```

GPUs inside a node are never chosen here: ``Placer.pick_gpus`` (the policy's advice checked by the ledger,
else best fit for a share and ``pick_gpu_set`` over the node's wiring for several GPUs) chooses them, as
for ``gpuslice sim`` and ``serve``; the extender adds only what Kubernetes adds, ``cluster.open_slots``
(healthy, not in MIG mode, fewer shares than the node's splitCount).

Default placement policy: ``bestfit``. FGD (the better policy on openb) needs a target workload, the
mix of task shapes to come, which a freshly started extender does not have; bestfit needs nothing,
is deterministic and packs shares onto already-used GPUs, which is what keeps whole GPUs free. A pod
can ask for ``fgd`` (annotation ``gpuslice.io/placement-policy``); its target workload is then the
shapes of the pods bound when the ledger was last built, plus the pod itself.

The ledger keeps one GPU model per node (the first GPU's) and at most ``MAX_GPUS_PER_NODE`` GPUs;
MIG-mode and unhealthy GPUs are held by a blocker reservation so no share lands on them. MIG instances
are tracked beside the ledger, one pod per existing instance.
"""

from __future__ import annotations

from gpuslice.k8s.extender.app import SERVER_OPTIONS, create_app
from gpuslice.k8s.extender.kube import RELISTED, KubeApi, KubernetesApi, WatchEvent
from gpuslice.k8s.extender.state import MAX_EXTENDER_PRIORITY, ClusterState, FilterResult
from gpuslice.k8s.extender.verdicts import (
    REASON_NO_INVENTORY,
    REASON_NO_MIG_INSTANCE,
    REASON_RESERVED,
    REASON_SHARE_LIMIT,
)

__all__ = [
    "MAX_EXTENDER_PRIORITY",
    "REASON_NO_INVENTORY",
    "REASON_NO_MIG_INSTANCE",
    "REASON_RESERVED",
    "REASON_SHARE_LIMIT",
    "RELISTED",
    "SERVER_OPTIONS",
    "ClusterState",
    "FilterResult",
    "KubeApi",
    "KubernetesApi",
    "WatchEvent",
    "create_app",
]
