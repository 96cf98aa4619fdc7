"""gpuslice as a Kubernetes DRA driver (resource.k8s.io/v1): the node side of claims for GPU slices.

```text
slices.py          the node's ResourceSlices: one pool per node, shared GPUs with consumable memory and
                   cores, MIG placements as partitions of the GPU's shared counters
classes.py         the DeviceClasses shipped in deploy/ (shared, whole GPU, MIG)
identity.py        PCI bus ID, PCIe root, compute capability of each GPU (NVML + sysfs, or made up)
prepare.py         a claim's allocation -> a CDI spec with the slice's env, mounts, device nodes; checkpoint
kubelet_plugin.py  plugin registration + the v1.DRAPlugin gRPC service (stubs in proto/)
kube.py            the API server calls: read claims, publish the pool
driver.py          all of it on one node, republishing on health changes (``gpuslice k8s dra-driver``)
```

The device-plugin path (``k8s/device_plugin``) is untouched by this one; a cluster may run either or
both (docs/kubernetes.md, "Dynamic Resource Allocation").
"""

from gpuslice.k8s.dra.classes import CLASS_MIG, CLASS_SHARED, CLASS_WHOLE, device_classes
from gpuslice.k8s.dra.slices import DRIVER, node_slices

__all__ = ["CLASS_MIG", "CLASS_SHARED", "CLASS_WHOLE", "DRIVER", "device_classes", "node_slices"]
