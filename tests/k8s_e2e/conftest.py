"""The end-to-end fixtures (``e2e_helpers``): a real control plane and gpuslice's processes on it."""

from e2e_helpers import api_client, core, namespace, plane, stack

__all__ = ["api_client", "core", "namespace", "plane", "stack"]
