"""The gpuslice device plugin: the kubelet side of gpuslice on one Kubernetes node.

It speaks the kubelet device plugin API v1beta1 (``proto/deviceplugin.proto``, from kubernetes
``staging/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto``) for one or more resources, each
on its own unix socket:

```text
gpuslice.io/gpu              every non-MIG GPU as split_count shares "<GPU-uuid>::<n>" (n = 0..split-1)
gpuslice.io/mig-<profile>    every existing MIG instance of that profile, by its "MIG-…" UUID
```

Lifecycle (NVIDIA's k8s-device-plugin does the same, ``internal/plugin/server.go``):

```text
start:   publish the node inventory annotation (GPUs, memory, topology, MIG layout, health)
         for each resource: gRPC server on <socket_dir>/<endpoint>, then Register on kubelet.sock
         (version v1beta1, options: GetPreferredAllocationAvailable)
kubelet: GetDevicePluginOptions, ListAndWatch (full list now and after every health change)
admit:   GetPreferredAllocation: the extender's GPUs when a bound pod waits for them, else the
         GPU set every home chooses (policies.gpuset.pick.pick_gpu_set over the machine's topology)
create:  Allocate: the one pod waiting on this node (refused while several wait), if the device IDs
         the kubelet passed are of its decision's GPUs (or MIG instance) -> CUDA_VISIBLE_DEVICES,
         GPUSLICE_* and the sharing mode's limits
         (node.enforcement.job_env), the GPUs' device nodes and CDI names; bind-phase "allocated";
         the extender's node lock cleared (k8s/node_lock.py)
watch:   kubelet.sock recreated (kubelet restart) or our sockets deleted -> restart servers, register
health:  a HealthSource reports GPU / MIG changes -> devices flip Healthy/Unhealthy, list resent,
         inventory republished
```

The extender decides which GPUs a pod gets; the kubelet only counts shares (an extended resource
is an integer count; the kubelet picks device IDs at admission). The
shares the kubelet hands to Allocate are therefore slots, not GPUs: the GPUs come from the pod's
decision annotations (``k8s.annotations.Decision``), HAMi's design (its device plugin's Allocate,
Project-HAMi/HAMi ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go``).
GetPreferredAllocation steers the kubelet to shares of the decided GPUs, and Allocate then reads the
GPUs back from the decision of the one pod waiting on the node. The device plugin API names no pod,
and neither device IDs nor admission order tell two waiting pods apart, so Allocate refuses while
more than one waits; the extender's node lock keeps it to one (docs/kubernetes.md, "The node lock").

Sharing on Kubernetes is ``soft`` (the PyTorch cap, with the graded monitor): MPS needs a control
daemon outside this plugin's container, a host tmpfs at /dev/shm in the daemon and every client, and
per-GPU pipe folders (NVIDIA runs a separate DaemonSet for it); none of that is set up here, so the
plugin refuses ``--sharing mps`` instead of shipping a mode that cannot work.

The API server is reached through two small interfaces, ``PodSource`` and ``NodePublisher``, so tests
swap in fakes; ``NodeKubeClient`` implements both with the official ``kubernetes`` client.

Modules, one job each:

```text
kube.py        PodSource, NodePublisher and NodeKubeClient: the pods bound to this node, the node itself
devices.py     the devices advertised (shares, MIG instances), the node inventory and labels, device nodes
allocation.py  GetPreferredAllocation (pick_gpu_set when no decision names GPUs) and Allocate
record.py      the plugin's own record of the slices it gave (pod UID, GPUs, limits), for the metrics
plugin.py      DevicePlugin: gRPC servers, kubelet registration and its watch, health, inventory
run.py         serve: the plugin wired to the API server, NVML health and metrics (observe.node_slices)
```
"""

from __future__ import annotations

from gpuslice.k8s.container_slice import K8S_SHARING, pod_sharing
from gpuslice.k8s.device_plugin.allocation import AllocationRefused
from gpuslice.k8s.device_plugin.devices import (
    CDI_KIND,
    CONTROL_DEVICES,
    HEALTHY,
    LABEL_COUNT,
    LABEL_MEMORY,
    LABEL_MIG_CAPABLE,
    LABEL_PRODUCT,
    SHARE_SEPARATOR,
    UNHEALTHY,
    PluginDevice,
    default_mig_layouts,
    device_nodes,
    gpu_minors,
    gpu_of_share,
    node_inventory,
    node_labels,
    parse_mig_layouts,
)
from gpuslice.k8s.device_plugin.kube import NodeKubeClient, NodePublisher, PendingPod, PodSource
from gpuslice.k8s.device_plugin.plugin import (
    API_VERSION,
    DEVICE_PLUGIN_PATH,
    KUBELET_SOCKET,
    DevicePlugin,
    RegistrationFailed,
)
from gpuslice.k8s.device_plugin.run import serve

__all__ = [
    "API_VERSION",
    "CDI_KIND",
    "CONTROL_DEVICES",
    "DEVICE_PLUGIN_PATH",
    "HEALTHY",
    "K8S_SHARING",
    "KUBELET_SOCKET",
    "LABEL_COUNT",
    "LABEL_MEMORY",
    "LABEL_MIG_CAPABLE",
    "LABEL_PRODUCT",
    "SHARE_SEPARATOR",
    "UNHEALTHY",
    "AllocationRefused",
    "DevicePlugin",
    "NodeKubeClient",
    "NodePublisher",
    "PendingPod",
    "PluginDevice",
    "PodSource",
    "RegistrationFailed",
    "default_mig_layouts",
    "device_nodes",
    "gpu_minors",
    "gpu_of_share",
    "node_inventory",
    "node_labels",
    "parse_mig_layouts",
    "pod_sharing",
    "serve",
]
