"""The cluster dashboard the extender serves, read-only: static HTML, CSS and plain JavaScript, no build step.

```text
GET /cluster/              the page (index.html); /cluster redirects here
GET /cluster/{file}        its script and style sheet (the files in static/)
GET /cluster/view.json     the whole cluster in one JSON document (snapshot.cluster_view): every node's
                           GPUs and slices, pending pods with why, DRA claims, totals, history
anything else on /cluster  405 (other methods) or 404 (other names); nothing here changes the cluster
```

Reached through ``kubectl port-forward`` to the extender's port, so these routes answer only a Host that
names the loopback (localhost, 127.0.0.1, ::1): a page on evil.example that a DNS rebinding points at
127.0.0.1 arrives with ``Host: evil.example`` and is refused, as ``gpuslice serve`` refuses it
(server/guard.py). kube-scheduler's verbs are not affected: they never come here.

The page asks for view.json once per refresh, whatever the cluster's size, and draws only the nodes
scrolled into view. The JSON is built at most once per ``VIEW_MAX_AGE_S`` however many pages are open,
on one worker thread of its own, so the dashboards of a whole team cost kube-scheduler's calls little;
gzipped for a page that accepts it (every browser does).
Every name on the page comes from the cluster, so the script only ever sets text, never HTML, under the
same Content-Security-Policy as serve's dashboard (no inline scripts or styles, nothing from elsewhere).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Mapping
from importlib.resources import files
from typing import Any

import anyio.to_thread
from anyio import CapacityLimiter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from gpuslice.k8s import extender_wire as wire
from gpuslice.server.dashboard import CONTENT_SECURITY_POLICY
from gpuslice.server.guard import host_name

__all__ = ["GZIP_LEVEL", "LOOPBACK_HOSTS", "VIEW_MAX_AGE_S", "ViewCache", "mount"]

# kubectl port-forward listens on the loopback; these are the names a browser sends for it.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# The page refreshes every 3 s (cluster.js); ten open pages share one build per second.
VIEW_MAX_AGE_S = 1.0
# view.json is mostly repeated keys: gzip's fastest levels take it to about a tenth (the figures are in
# benchmarks/cluster_dashboard.py's output), which matters through kubectl port-forward every 3 s.
GZIP_LEVEL = 1

_MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "cluster.js": "text/javascript; charset=utf-8",
    "cluster.css": "text/css; charset=utf-8",
}
_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate, so an upgraded extender serves its new page at once
}
_TEXT = "text/plain; charset=utf-8"


class ViewCache:
    """``view()`` encoded as JSON, rebuilt when the last build is older than ``max_age_s``; gzipped on
    demand, once per build.

    One build at a time: a request that arrives during a build waits for it and takes its result.
    """

    def __init__(self, view: Callable[[], Mapping[str, Any]], max_age_s: float = VIEW_MAX_AGE_S) -> None:
        self._view = view
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._built_at = float("-inf")  # time.monotonic() of the last build
        self._body = b""
        self._gzipped: bytes | None = None  # of _body, made by the first page that accepts gzip

    def body(self, gzipped: bool = False) -> bytes:
        with self._lock:
            if time.monotonic() - self._built_at >= self.max_age_s:
                self._body, self._gzipped = wire.encode(self._view()), None
                self._built_at = time.monotonic()
            if not gzipped:
                return self._body
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._body, GZIP_LEVEL, mtime=0)
            return self._gzipped


def mount(app: Starlette, view: Callable[[], Mapping[str, Any]]) -> None:
    """Add the dashboard's routes to ``app``; ``view()`` returns the cluster view (snapshot.cluster_view)."""
    static = files(__package__) / "static"
    # Read once: the files are part of the installed package and never change while it runs.
    contents = {name: (static / name).read_bytes() for name in _MEDIA_TYPES}
    latest = ViewCache(view)
    # One worker thread for the dashboard, whatever the number of pages: builds take turns anyway
    # (ViewCache), and the others wait here without a thread, leaving the pool to /bind.
    view_thread = CapacityLimiter(1)

    def refused(request: Request) -> Response | None:
        host = request.headers.get("host", "")
        if len(request.headers.getlist("host")) == 1 and host_name(host) in LOOPBACK_HOSTS:
            return None
        why = (
            f"Host {host_name(host)[:100]!r} is not the loopback: the cluster dashboard is reached with "
            "`kubectl port-forward` and opened at http://localhost:PORT/cluster/\n"
        )
        return Response(why, status_code=400, media_type=_TEXT, headers=_HEADERS)

    async def view_json(request: Request) -> Response:
        if (refusal := refused(request)) is not None:
            return refusal
        # A worker thread: a 1,000-node view takes tens of milliseconds of Python, which on the event loop
        # would hold up kube-scheduler's /filter calls for all of it.
        gzipped = "gzip" in request.headers.get("accept-encoding", "").lower()
        body = await anyio.to_thread.run_sync(latest.body, gzipped, limiter=view_thread)
        headers = {**_HEADERS, "Vary": "Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type="application/json", headers=headers)

    async def page(request: Request) -> Response:
        if (refusal := refused(request)) is not None:
            return refusal
        return Response(contents["index.html"], media_type=_MEDIA_TYPES["index.html"], headers=_HEADERS)

    async def to_page(request: Request) -> Response:
        # relative, so it works behind a proxy that adds a path prefix; the page's links are relative too
        return RedirectResponse("cluster/", status_code=308, headers=_HEADERS)

    async def asset(request: Request) -> Response:
        if (refusal := refused(request)) is not None:
            return refusal
        name = request.path_params["name"]
        # Only the names read above: nothing from the URL ever becomes a path on disk.
        if name not in contents or name == "index.html":
            why = f"no dashboard file {name[:100]!r}; the dashboard is at /cluster/\n"
            return Response(why, status_code=404, media_type=_TEXT, headers=_HEADERS)
        return Response(contents[name], media_type=_MEDIA_TYPES[name], headers=_HEADERS)

    app.add_route("/cluster", to_page, methods=["GET"], include_in_schema=False)
    app.add_route("/cluster/", page, methods=["GET"], include_in_schema=False)
    app.add_route("/cluster/view.json", view_json, methods=["GET"], include_in_schema=False)
    app.add_route("/cluster/{name}", asset, methods=["GET"], include_in_schema=False)
