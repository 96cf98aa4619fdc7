"""A ``/metrics`` endpoint of its own: a registry served on a port by prometheus_client's threaded HTTP
server, for the components whose main port is not where Prometheus scrapes them.

```text
device plugin, DRA driver     their node's series; no HTTP port otherwise (gRPC sockets only)
DRA allocator                 its pools' series; no HTTP port otherwise
scheduler extender            its verbs' and the cluster's series on the pod's address, while its scheduling
                              port stays on loopback (whoever reaches /bind can bind pods)
```

Each exposition runs on the server's own thread, never on a component's event loop.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, start_http_server

from gpuslice.errors import UserError

__all__ = ["serve_metrics"]


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> Callable[[], None]:
    """Serve ``registry`` at ``http://host:port/metrics`` until the returned function is called (all
    addresses by default: Prometheus scrapes the pod's IP). UserError naming ``--metrics-port`` when the
    port cannot be listened on."""
    try:
        server, _thread = start_http_server(port, host, registry=registry)
    except OSError as err:
        raise UserError(
            f"--metrics-port {port}: cannot listen there ({err.strerror or err}); give a free port"
        ) from None

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return stop
