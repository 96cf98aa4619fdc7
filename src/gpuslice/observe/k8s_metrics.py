"""Metrics of the Kubernetes components: the scheduler extender and the device plugin.

```text
extender        GET /metrics on its own port: request latency per verb, decisions per verb and result
                (``instrument_extender(app)``: an ASGI middleware around the extender's routes)
device plugin   GET /metrics on --metrics-port: health of each advertised device and of each GPU
```

The extender middleware tells a verb's result from the first bytes of its reply (the extender/v1
shapes: a filter that ran answers ``{"NodeNames":[...`` or ``{"NodeNames":[]``, one that could not read
the request ``{"NodeNames":null``; a bind ``{"Error":""}`` or an error text; a preempt with no
candidate ``{"NodeNameToMetaVictims":{}}``), so the hot path pays for no second decode of 5,000 node
names; tests/observe/test_k8s_metrics.py drives the real extender app to keep the two in step.

Same conventions and docs table as the serve metrics (observe/metrics.py, docs/metrics.md); the GPU
health gauge has the same name and labels in serve and the device plugin, so one alert rule covers both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from gpuslice.observe.metrics import gpu_healthy_family

__all__ = [
    "EXTENDER_BUCKETS_SECONDS",
    "EXTENDER_RESULTS",
    "DeviceHealthRow",
    "DevicePluginMetrics",
    "ExtenderMetrics",
    "ExtenderMetricsMiddleware",
    "instrument_extender",
    "reply_result",
]

# An extender call is on kube-scheduler's critical path (its default extender timeout is 5 s); the
# target is a few milliseconds, so the buckets are fine below 10 ms.
EXTENDER_BUCKETS_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# The results each verb can record, created at zero so rates exist before the first event.
EXTENDER_RESULTS = {
    "filter": ("fits", "unschedulable", "error"),  # fits: at least one node passed
    "prioritize": ("scored", "error"),
    "preempt": ("candidates", "none", "error"),
    "bind": ("bound", "refused", "error"),
}
_VERBS = {f"/{verb}": verb for verb in EXTENDER_RESULTS}
_PEEK_BYTES = 32  # enough of a reply to tell its result


class ExtenderMetrics:
    """One registry per extender app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram("gpuslice_extender_request_duration_seconds",
                                 "time to answer one extender call, by verb", ["verb"],
                                 buckets=EXTENDER_BUCKETS_SECONDS, registry=self.registry)  # fmt: skip
        self.decisions = Counter("gpuslice_extender_decisions", "extender answers, by verb and result",
                                 ["verb", "result"], registry=self.registry)  # fmt: skip
        for verb, results in EXTENDER_RESULTS.items():
            self.latency.labels(verb)
            for result in results:
                self.decisions.labels(verb, result)

    @contextmanager
    def timed(self, verb: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.latency.labels(verb).observe(time.perf_counter() - start)

    def decided(self, verb: str, result: str) -> None:
        self.decisions.labels(verb, result).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def reply_result(verb: str, status: int, head: bytes) -> str:
    """The result code of an extender reply from its HTTP status and first bytes (see the module doc)."""
    if status != 200:
        return "error"
    if verb == "filter":
        if head.startswith(b'{"NodeNames":null'):
            return "error"
        return "unschedulable" if head.startswith(b'{"NodeNames":[]') else "fits"
    if verb == "prioritize":
        return "error" if head.startswith(b"[]") else "scored"
    if verb == "preempt":
        return "none" if head.startswith(b'{"NodeNameToMetaVictims":{}}') else "candidates"
    return "bound" if head.startswith(b'{"Error":""}') else "refused"


class ExtenderMetricsMiddleware:
    """Pure ASGI middleware: times POST /filter, /prioritize, /preempt, /bind and counts their results."""

    def __init__(self, app: Any, metrics: ExtenderMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        verb = _VERBS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if verb is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        status = 500
        head = bytearray()

        async def watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and len(head) < _PEEK_BYTES:
                head.extend(message.get("body", b"")[: _PEEK_BYTES - len(head)])
            await send(message)

        try:
            with self.metrics.timed(verb):
                await self.app(scope, receive, watch)
        finally:
            self.metrics.decided(verb, reply_result(verb, status, bytes(head)))


def instrument_extender(app: Any, metrics: ExtenderMetrics | None = None) -> ExtenderMetrics:
    """Add GET /metrics and the timing middleware to the extender's FastAPI app; the metrics object."""
    metrics = metrics or ExtenderMetrics()

    async def endpoint(_: Request) -> Response:
        # A worker thread: with the cluster's series (observe/cluster_metrics.py) the exposition of 1,000
        # nodes takes tens of milliseconds, which on the event loop would hold up kube-scheduler's calls.
        return Response(await run_in_threadpool(metrics.exposition), media_type=CONTENT_TYPE_LATEST)

    app.add_route("/metrics", endpoint, methods=["GET"])
    app.add_middleware(ExtenderMetricsMiddleware, metrics=metrics)
    return metrics


@dataclass(frozen=True, slots=True)
class DeviceHealthRow:
    """One device the kubelet sees (a share or a MIG instance) and whether it is advertised Healthy."""

    resource: str  # gpuslice.io/gpu or gpuslice.io/mig-<profile>
    device: str
    gpu: int
    healthy: bool


class _DevicePluginCollector(Collector):
    def __init__(
        self,
        devices: Callable[[], Sequence[DeviceHealthRow]],
        gpus: Callable[[], Sequence[tuple[int, str, str, bool]]],
    ) -> None:
        self._devices = devices
        self._gpus = gpus

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("gpuslice_device_plugin_device_healthy",
                                   "1 if the device is advertised Healthy to the kubelet, else 0",
                                   labels=["resource", "device", "gpu"])  # fmt: skip
        for d in self._devices():
            family.add_metric([d.resource, d.device, str(d.gpu)], 1.0 if d.healthy else 0.0)
        yield family
        yield gpu_healthy_family(self._gpus())


class DevicePluginMetrics:
    """``devices()``: every advertised device; ``gpus()``: (index, uuid, model, healthy) per GPU."""

    def __init__(
        self,
        devices: Callable[[], Sequence[DeviceHealthRow]],
        gpus: Callable[[], Sequence[tuple[int, str, str, bool]]],
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_DevicePluginCollector(devices, gpus))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
