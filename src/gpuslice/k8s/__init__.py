"""Kubernetes entry points over the gpuslice core: annotations, scheduler extender, admission webhook,
device plugin.

```text
webhook (admission)   pod asks for gpuslice.io/* -> schedulerName, defaults, or a clear rejection
kube-scheduler        in-tree filters -> extender /filter -> /prioritize -> extender /bind
extender              Ledger over the nodes' inventory annotations + bound pods' decision annotations
                      bind: choose GPUs, write the decision annotations, create the Binding
device plugin         Allocate: read the decision annotations -> CUDA_VISIBLE_DEVICES, limits
```

``annotations`` is the one place that names every annotation, label and resource and (de)serialises
them; the other modules import it and never spell a key themselves. The modules that talk to the API
server import the ``kubernetes`` client lazily, so ``pip install gpuslice`` without the ``k8s`` extra
still imports this package.
"""

from __future__ import annotations

# Public names live in the submodules (annotations, extender, webhook, device_plugin); importing the
# package must not pull in the kubernetes client or grpc.
__all__: list[str] = []
