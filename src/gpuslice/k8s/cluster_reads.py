"""The API reads of ``kubectl gpuslice``, as the API server's JSON (camelCase, what the annotation parsers
read), each refusal worded once: which verb on which resource was refused, or why the server did not
answer.

```text
nodes()                          GET /api/v1/nodes
pods(namespace | None)           GET /api/v1/namespaces/NS/pods, or /api/v1/pods for every namespace
                                 (those that have not ended)
pod(namespace, name)             GET /api/v1/namespaces/NS/pods/NAME        (NotFound: no such pod)
events(pod)                      GET /api/v1/namespaces/NS/events?fieldSelector=involvedObject.name=...
metrics(plugin_pod, port)        GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy/metrics  (the device
                                 plugin's Prometheus text, through the API server's pod proxy)
```

Errors: Forbidden (403: "no permission to list nodes …"), NotAuthenticated (401), NotFound (404),
Unavailable (no answer: refused, timed out, TLS), ApiError (any other status).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpuslice.errors import Forbidden, NotAuthenticated, NotFound, Unavailable
from gpuslice.k8s.kube_client import ApiError, api_errors, kubernetes_client_module

__all__ = ["REQUEST_TIMEOUT_S", "ClusterReads"]

# (connect, read) seconds per request: an address that drops packets fails in seconds, not minutes;
# a list of every pod of a large cluster still has half a minute to arrive.
REQUEST_TIMEOUT_S = (5.0, 30.0)
ENDED_LEFT_OUT = "status.phase!=Succeeded,status.phase!=Failed"


class ClusterReads:
    """Read-only calls on one ``kubernetes.client.ApiClient`` (``kube_client.kubectl_api_client``)."""

    def __init__(self, api_client: Any) -> None:
        self._client = api_client
        self._core = kubernetes_client_module().CoreV1Api(api_client)
        self.server = str(api_client.configuration.host)

    def __enter__(self) -> ClusterReads:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()  # its connection pool: the sockets close now, not when collected

    def nodes(self) -> list[dict[str, Any]]:
        return self._items("list", "nodes", self._core.list_node)

    def pods(self, namespace: str | None, label: str = "") -> list[dict[str, Any]]:
        """The pods of ``namespace``, or of every namespace when it is None, that have not ended (an
        ended pod holds no slice: the API server leaves them out of a large cluster's answer); only
        those with ``label`` (a label selector, ``app=NAME``) when one is given."""
        selector = {"field_selector": ENDED_LEFT_OUT} | ({"label_selector": label} if label else {})
        if namespace is None:
            return self._items(
                "list", "pods in every namespace", self._core.list_pod_for_all_namespaces, **selector
            )
        return self._items(
            "list", f"pods in namespace {namespace}", self._core.list_namespaced_pod, namespace, **selector
        )

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json(
            f"get pod {name} in namespace {namespace}", self._core.read_namespaced_pod, name, namespace
        )

    def events(self, namespace: str, pod_name: str) -> list[dict[str, Any]]:
        """The events about pods named ``pod_name`` in ``namespace`` (any uid: the caller picks)."""
        return self._items(
            "list",
            f"events in namespace {namespace}",
            self._core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod_name}",
        )

    def metrics(self, namespace: str, pod_name: str, port: int) -> str:
        """The Prometheus text a pod serves on ``port`` at /metrics, through the API server's proxy."""
        answer = self._call(
            "get",
            f"pods/proxy of {namespace}/{pod_name}",
            self._core.connect_get_namespaced_pod_proxy_with_path,
            f"{pod_name}:{port}",
            namespace,
            "metrics",
        )
        return answer.data.decode("utf-8", errors="replace")

    # ---- one call ----------------------------------------------------------------------------------

    def _items(self, verb: str, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        items = self._json(f"{verb} {what}", call, *args, **kwargs).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    def _json(self, doing: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        verb, _, what = doing.partition(" ")
        answer = self._call(verb, what, call, *args, **kwargs)
        try:
            body = json.loads(answer.data)
        except ValueError:
            raise ApiError(
                f"the API server at {self.server} answered {doing} with something not JSON"
            ) from None
        return body if isinstance(body, dict) else {}

    def _call(self, verb: str, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call`` with the raw answer kept (``_preload_content=False``: the JSON as the server sent it,
        not the client's snake_case models), its failure worded as one line."""
        import urllib3.exceptions

        try:
            with api_errors():
                return call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        except ApiError as err:
            said = str(err).removeprefix("the API server answered ")
            if err.status == 403:
                raise Forbidden(f"no permission to {verb} {what}: {said}") from None
            if err.status == 401:
                raise NotAuthenticated(
                    f"the API server at {self.server} refused the credentials ({said}): check the "
                    "kubeconfig's user"
                ) from None
            if err.status == 404:
                raise NotFound(f"cannot {verb} {what}: {said}") from None
            raise ApiError(f"cannot {verb} {what}: {said}", err.status) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise Unavailable(f"cannot reach the API server at {self.server}: {_reason(err)}") from None


def _reason(err: BaseException) -> str:
    """The innermost cause urllib3 wraps (a refused connection, a timeout, a certificate), in one line."""
    reason: Any = err
    while getattr(reason, "reason", None) is not None and reason.reason is not reason:
        reason = reason.reason
    text = " ".join(str(reason).split())
    # urllib3 words a refusal as "<urllib3.connection.HTTPConnection object at 0x…>: Failed to establish a
    # new connection: [Errno 111] Connection refused": the object's address says nothing to a person.
    return text.split(">: ", 1)[-1] if text.startswith("<") else text
