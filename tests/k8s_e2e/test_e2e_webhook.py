"""The admission webhook registered with the API server by the MutatingWebhookConfiguration users
deploy (a real caBundle; only its address is rewritten): pods come out mutated, a bad request is refused
with our message, pods without gpuslice resources never reach it, and with the webhook down the
failurePolicy refuses exactly the gpuslice pods."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_helpers import GPUSLICE, Stack, gpu_pod, wait_http

from gpuslice.k8s.annotations import SCHEDULER_NAME

pytestmark = pytest.mark.k8s_e2e


def plain_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "registry.example/web:1"}]},
    }


def test_pod_created_through_the_api_server_comes_out_mutated(
    stack: Stack, core: Any, namespace: str
) -> None:
    created = core.create_namespaced_pod(namespace, gpu_pod("mutated", {"gpuslice.io/gpumem": 4_000}))
    assert created.spec.scheduler_name == SCHEDULER_NAME
    limits = created.spec.containers[0].resources.limits
    assert limits["gpuslice.io/gpu"] == "1"  # defaulted: a memory share is one GPU
    assert limits["gpuslice.io/gpumem"] == "4k" or limits["gpuslice.io/gpumem"] == "4000"


def test_pod_without_gpuslice_resources_is_left_alone(stack: Stack, core: Any, namespace: str) -> None:
    created = core.create_namespaced_pod(namespace, plain_pod("plain"))
    assert created.spec.scheduler_name == "default-scheduler"


def test_impossible_request_is_refused_with_our_message(stack: Stack, core: Any, namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(
            namespace, gpu_pod("bad", {"gpuslice.io/gpu": 1, "gpuslice.io/gpucores": 150})
        )
    assert refused.value.status == 400
    assert "gpuslice:" in refused.value.body
    assert "gpucores" in refused.value.body


def test_with_the_webhook_down_gpuslice_pods_are_refused_and_others_are_not(
    stack: Stack, core: Any, namespace: str
) -> None:
    """failurePolicy Fail with matchConditions: the manifest promises that a webhook outage refuses the
    pods that ask for gpuslice.io resources (they would otherwise fail at the kubelet) and nothing else."""
    from kubernetes.client.exceptions import ApiException

    proc = stack.webhook
    argv = list(proc.popen.args)  # type: ignore[arg-type]
    proc.stop()
    try:
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(namespace, gpu_pod("while-down", {"gpuslice.io/gpu": 1}))
        assert refused.value.status == 500
        assert "failed calling webhook" in refused.value.body
        created = core.create_namespaced_pod(namespace, plain_pod("plain-while-down"))
        assert created.metadata.name == "plain-while-down"
    finally:
        stack.plane.processes.remove(proc)
        stack.webhook = stack.plane.spawn("webhook", [GPUSLICE, *argv[1:]] if argv[0] != GPUSLICE else argv)
        wait_http(f"https://127.0.0.1:{stack.webhook_port}/healthz", 90, insecure=True, proc=stack.webhook)
    created = core.create_namespaced_pod(namespace, gpu_pod("after-restart", {"gpuslice.io/gpu": 1}))
    assert created.spec.scheduler_name == SCHEDULER_NAME
