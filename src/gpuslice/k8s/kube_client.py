"""The one place gpuslice's Kubernetes components get an API client from the official ``kubernetes`` package.

Configuration order: ``kubeconfig`` if given, else the pod's service account (in-cluster), else
~/.kube/config. The package is imported here, lazily, so the ``k8s`` extra stays optional.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from gpuslice.errors import GpusliceError, UserError

__all__ = ["ApiError", "api_client", "api_errors", "kubernetes_client_module"]


class ApiError(GpusliceError):
    """An API call failed; the message is the API server's status and its own words (``status``: the
    HTTP code, 0 when no answer came)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@contextmanager
def api_errors() -> Iterator[None]:
    """Turn the client's ApiException into an ``ApiError`` that says the HTTP status and the Status
    object's message (the caller says what it was doing). The client's own text carries the raw HTTP response
    headers (and the body as JSON), which is not for a pod's events or a scheduler's log."""
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as err:
        message = ""
        try:
            body = json.loads(err.body or "")
            message = str(body.get("message") or "") if isinstance(body, dict) else ""
        except (TypeError, ValueError):
            pass
        status = int(err.status or 0)
        said = f"{status} {err.reason or ''}".strip() + (f": {message}" if message else "")
        raise ApiError(f"the API server answered {said}", status) from None


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
