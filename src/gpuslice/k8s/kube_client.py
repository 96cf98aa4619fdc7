"""The one place gpuslice's Kubernetes components get an API client from the official ``kubernetes`` package.

Configuration order: ``kubeconfig`` if given, else the pod's service account (in-cluster), else
~/.kube/config. The package is imported here, lazily, so the ``k8s`` extra stays optional.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from gpuslice.errors import UserError

__all__ = ["api_client", "kubernetes_client_module"]


def kubernetes_client_module() -> ModuleType:
    """``kubernetes.client``; a UserError naming the extra when the package is missing."""
    try:
        from kubernetes import client
    except ImportError:
        raise UserError("the Kubernetes components need the k8s extra: pip install 'gpuslice[k8s]'") from None
    return client


def api_client(kubeconfig: str | None = None) -> Any:
    """A configured ``kubernetes.client.ApiClient`` (see the module docstring for the order)."""
    client = kubernetes_client_module()
    from kubernetes import config

    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
    except (config.ConfigException, OSError) as err:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "no --kubeconfig, no pod, ~/.kube/config"
        raise UserError(
            f"no usable Kubernetes configuration ({where}): {err}; give --kubeconfig FILE or run it in a pod"
        ) from None
    return client.ApiClient()
