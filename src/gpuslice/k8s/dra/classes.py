"""The DeviceClasses gpuslice ships (resource.k8s.io/v1), one per way of asking for a GPU.

| class | selects | a request without ``capacity`` gets |
|---|---|---|
| ``gpu.gpuslice.io`` | shared GPUs (``type == "gpu"``) | the whole GPU (request policy defaults) |
| ``whole-gpu.gpuslice.io`` | the same, marked exclusive | the whole GPU; asking for less: refused |
| ``mig.gpuslice.io`` | MIG placements (``type == "mig"``) | one instance; select ``migProfile`` |

deploy/kubernetes/50-dra-deviceclasses.yaml and the chart's template are these objects written out
(a test compares them).
"""

from __future__ import annotations

from typing import Any

from gpuslice.k8s.dra.slices import API_VERSION, DRIVER, TYPE_GPU, TYPE_MIG

__all__ = [
    "CLASS_MIG",
    "CLASS_SHARED",
    "CLASS_WHOLE",
    "CONFIG_API_VERSION",
    "CONFIG_KIND",
    "device_classes",
]

CLASS_SHARED = "gpu.gpuslice.io"
CLASS_WHOLE = "whole-gpu.gpuslice.io"
CLASS_MIG = "mig.gpuslice.io"
# The opaque configuration a class passes to the kubelet plugin (in the claim's allocation, source
# FromClass): {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "exclusive": true|false}.
CONFIG_API_VERSION = "gpu.gpuslice.io/v1"
CONFIG_KIND = "GpuConfig"


def _selector(kind: str) -> str:
    return f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "{kind}"'


def _device_class(name: str, kind: str, exclusive: bool) -> dict[str, Any]:
    config = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND, "exclusive": exclusive}
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpuslice"}},
        "spec": {
            "selectors": [{"cel": {"expression": _selector(kind)}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": config}}],
        },
    }


def device_classes() -> list[dict[str, Any]]:
    """The three DeviceClass objects, in the order of the table above."""
    return [
        _device_class(CLASS_SHARED, TYPE_GPU, exclusive=False),
        _device_class(CLASS_WHOLE, TYPE_GPU, exclusive=True),
        _device_class(CLASS_MIG, TYPE_MIG, exclusive=False),
    ]
