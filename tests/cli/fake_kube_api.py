"""A small in-process Kubernetes API server for the kubectl plugin's tests: it answers the few reads the
plugin makes with the shapes the real one sends (a List with ``items``, a ``Status`` on a refusal, the
pod proxy's raw text), so the official client and every layer above it run as they do against a cluster.

```text
GET /api/v1/nodes                                   List of ``nodes``
GET /api/v1/pods[?labelSelector=k=v]                List of every pod (those with the label)
GET /api/v1/namespaces/NS/pods[?labelSelector=…]    List of the namespace's pods
GET /api/v1/namespaces/NS/pods/NAME                 the pod, or a 404 Status
GET /api/v1/namespaces/NS/events?fieldSelector=…    List of the events whose involvedObject matches
GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy/metrics   ``metrics[(NS, NAME, PORT)]`` (a callable:
                                                    it is called on each read), or a 503 Status
```

``forbidden`` holds path prefixes answered with RBAC's 403 Status, ``unauthorized`` answers everything
with a 401 Status; ``seen`` records every path asked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import yaml

__all__ = ["FakeKubeApi", "kubeconfig_for"]


@dataclass
class FakeKubeApi:
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[tuple[str, str, int], Callable[[], str]] = field(default_factory=dict)
    forbidden: dict[str, str] = field(default_factory=dict)  # path prefix -> "verb resource" refused
    unauthorized: bool = False  # every request answered 401, as for an expired token
    seen: list[str] = field(default_factory=list)
    port: int = 0

    def start(self) -> FakeKubeApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.seen.append(self.path)
                status, body, kind = api.answer(self.path)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- routing -----------------------------------------------------------------------------------

    def answer(self, raw: str) -> tuple[int, Any, str]:
        url = urlparse(raw)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = unquote(url.path)  # the client writes NAME:PORT as NAME%3APORT
        if self.unauthorized:
            return 401, _status(401, "Unauthorized", "Unauthorized"), "application/json"
        for prefix, refused in self.forbidden.items():
            if path.startswith(prefix):
                verb, resource = refused.split(" ", 1)
                return (
                    403,
                    _status(
                        403,
                        "Forbidden",
                        f'{resource} is forbidden: User "viewer" cannot {verb} resource "{resource}" in API '
                        'group ""',
                    ),
                    "application/json",
                )
        parts = path.strip("/").split("/")
        if parts == ["api", "v1", "nodes"]:
            return 200, _list("NodeList", self.nodes), "application/json"
        if parts == ["api", "v1", "pods"]:
            return 200, _list("PodList", _labelled(self.pods, query)), "application/json"
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5:
            namespace, resource, rest = parts[3], parts[4], parts[5:]
            if resource == "events" and not rest:
                return 200, _list("EventList", self._events(namespace, query)), "application/json"
            if resource == "pods" and not rest:
                mine = [p for p in self.pods if p["metadata"].get("namespace") == namespace]
                return 200, _list("PodList", _labelled(mine, query)), "application/json"
            if resource == "pods" and len(rest) == 1:
                for pod in self.pods:
                    if (pod["metadata"].get("namespace"), pod["metadata"]["name"]) == (namespace, rest[0]):
                        return 200, pod, "application/json"
                return 404, _status(404, "NotFound", f'pods "{rest[0]}" not found'), "application/json"
            if resource == "pods" and rest[1:] == ["proxy", "metrics"]:
                name, _, port = rest[0].partition(":")
                page = self.metrics.get((namespace, name, int(port or 0)))
                if page is None:
                    said = f"error trying to reach service: dial tcp 10.0.0.9:{port}: connection refused"
                    return 503, _status(503, "ServiceUnavailable", said), "application/json"
                return 200, page(), "text/plain; version=0.0.4"
        return (
            404,
            _status(404, "NotFound", "the server could not find the requested resource"),
            "application/json",
        )

    def _events(self, namespace: str, query: dict[str, str]) -> list[dict[str, Any]]:
        wanted = dict(term.split("=", 1) for term in query.get("fieldSelector", "").split(",") if term)
        out = []
        for event in self.events:
            involved = event.get("involvedObject") or {}
            if event["metadata"].get("namespace") != namespace:
                continue
            if all(str(involved.get(k.removeprefix("involvedObject."), "")) == v for k, v in wanted.items()):
                out.append(event)
        return out


def _labelled(items: list[dict[str, Any]], query: dict[str, str]) -> list[dict[str, Any]]:
    """The items a ``labelSelector`` (``k=v``) and a ``fieldSelector`` of ``status.phase!=P`` terms keep."""
    left_out = {t.removeprefix("status.phase!=") for t in query.get("fieldSelector", "").split(",") if t}
    items = [i for i in items if (i.get("status") or {}).get("phase") not in left_out]
    selector = query.get("labelSelector")
    if not selector:
        return items
    key, _, value = selector.partition("=")
    return [i for i in items if (i["metadata"].get("labels") or {}).get(key) == value]


def _list(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def kubeconfig_for(server: str, folder: Path, namespace: str = "", name: str = "config") -> Path:
    """A kubeconfig with one context, ``fake``, at ``server`` (a token user), its namespace if given."""
    context: dict[str, Any] = {"cluster": "fake", "user": "viewer"}
    if namespace:
        context["namespace"] = namespace
    path = folder / name
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "viewer", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": context}],
                "current-context": "fake",
            }
        )
    )
    return path
