"""The one place gpuslice's Kubernetes components get an API client from the official ``kubernetes`` package.

Configuration order (``api_client``, gpuslice's components): ``kubeconfig`` if given, else the pod's
service account (in-cluster), else ~/.kube/config. ``kubectl_api_client`` (the kubectl plugin) finds it as
kubectl does instead. The package is imported here, lazily, so the ``k8s`` extra stays optional.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from gpuslice.errors import GpusliceError, UserError

__all__ = ["ApiError", "api_client", "api_errors", "kubectl_api_client", "kubernetes_client_module"]

# Where the pod's service account mounts the namespace it runs in (in-cluster configuration).
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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


def kubectl_api_client(kubeconfig: str | None = None, context: str | None = None) -> tuple[Any, str]:
    """A ``kubernetes.client.ApiClient`` and the namespace to use, found as kubectl finds them: the
    kubeconfig ``kubeconfig``, else the files in $KUBECONFIG (joined by ':'), else ~/.kube/config; its
    ``context`` (default: the current one) and that context's namespace ("default" if it names none). With
    no kubeconfig file at all, the pod's service account and its namespace (kubectl's in-cluster
    fallback). UserError, one line, when none of them is usable. One difference from kubectl: with several
    files in $KUBECONFIG the current-context of the last file that sets one wins (the client's merge)."""
    client = kubernetes_client_module()
    import yaml
    from kubernetes import config

    paths = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    found = [p for p in paths.split(os.pathsep) if p and os.path.exists(os.path.expanduser(p))]
    for path in found:  # a FIFO would block the client's open() for ever, a folder fail inside it
        if not os.path.isfile(os.path.expanduser(path)):
            raise UserError(f"no usable Kubernetes configuration: kubeconfig {path} is not a regular file")
    configuration = client.Configuration()
    try:
        if not found and not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
            with open(SERVICE_ACCOUNT_NAMESPACE) as file:
                namespace = file.read().strip() or "default"
        else:
            config.load_kube_config(
                config_file=paths, context=context, client_configuration=configuration, persist_config=False
            )
            contexts, current = config.list_kube_config_contexts(config_file=paths)
            chosen = next((c for c in contexts if c.get("name") == context), current) if context else current
            namespace = str(((chosen or {}).get("context") or {}).get("namespace") or "default")
    except (config.ConfigException, OSError, ValueError, TypeError, AttributeError, yaml.YAMLError) as err:
        # (a file that is not YAML, or YAML that is not a mapping, fails inside the client's merge)
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else f"kubeconfig {paths}"
        if not found and not kubeconfig:
            where = f"no kubeconfig ({paths} does not exist) and not in a pod"
        said = " ".join(str(err).split())  # YAML's errors span lines
        raise UserError(f"no usable Kubernetes configuration ({where}): {said}") from None
    # One try per request, as kubectl: urllib3 would retry a refused connection three times.
    configuration.retries = 0
    return client.ApiClient(configuration), namespace
