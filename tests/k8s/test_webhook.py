"""The admission webhook: AdmissionReview v1 JSON round-trips over real TLS (trustme CA, uvicorn on a
free localhost port), plus the mutation rules as named cases."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trustme
import uvicorn

from gpuslice.k8s.annotations import ANNOTATION_PLACEMENT_POLICY, SCHEDULER_NAME
from gpuslice.k8s.webhook import admit, create_app, mutate_pod


def review(pod: dict[str, Any], operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    """What the API server posts to a mutating webhook (admission.k8s.io/v1)."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
        },
    }


def pod(resources: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "team-a", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "train", "image": "pytorch", "resources": resources}], **spec},
    }


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(base64.b64decode(answer["response"]["patch"]))


# ---- over TLS -----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def https_url(ca: trustme.CA, tmp_path_factory) -> Iterator[str]:
    """The webhook served by uvicorn over TLS with a certificate for 127.0.0.1 signed by a test CA."""
    folder = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert.cert_chain_pems[0].write_to_path(cert_path)
    cert.private_key_pem.write_to_path(key_path)
    port = _free_port()
    config = uvicorn.Config(
        create_app(),
        host="127.0.0.1",
        port=port,
        ssl_certfile=str(cert_path),
        ssl_keyfile=str(key_path),
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    yield f"https://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)


@pytest.fixture
def https(ca: trustme.CA, https_url: str) -> Iterator[httpx.Client]:
    # Verify the server certificate, as the API server does, against the test CA (the caBundle of the
    # MutatingWebhookConfiguration).
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with httpx.Client(base_url=https_url, verify=context) as client:
        yield client


def test_review_round_trips_over_tls_with_a_jsonpatch(https):
    body = review(pod({"limits": {"gpuslice.io/gpumem": "8000"}}))
    answer = https.post("/mutate", json=body).json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert patch_of(answer) == [
        {"op": "add", "path": "/spec/containers/0/resources/limits/gpuslice.io~1gpu", "value": "1"},
        {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME},
    ]


def test_impossible_request_is_refused_over_tls_with_a_message(https):
    body = review(pod({"limits": {"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "150"}}))
    response = https.post("/mutate", json=body).json()["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "gpuslice.io/gpucores is a percent of one GPU, 1..100; got 150" in response["status"]["message"]


def test_plain_http_is_not_served(https_url):
    with pytest.raises(httpx.HTTPError):
        httpx.post(https_url.replace("https", "http") + "/mutate", json={}, timeout=2)


def test_a_client_that_does_not_trust_the_ca_is_refused(https_url):
    with pytest.raises(httpx.ConnectError):
        httpx.post(https_url + "/mutate", json={}, timeout=2)  # default trust store: no test CA


# ---- rules --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "resources", "expected"),
    [
        ("whole GPU in limits: only the scheduler", {"limits": {"gpuslice.io/gpu": "2"}}, []),
        (
            "requests only: copied to limits",
            {"requests": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "4096"}},
            [
                {"op": "add", "path": "/spec/containers/0/resources/limits", "value": {}},
                {"op": "add", "path": "/spec/containers/0/resources/limits/gpuslice.io~1gpu", "value": "1"},
                {
                    "op": "add",
                    "path": "/spec/containers/0/resources/limits/gpuslice.io~1gpumem",
                    "value": "4096",
                },
            ],
        ),
        (
            "cores without gpu: gpu 1 added",
            {"limits": {"gpuslice.io/gpucores": "25"}},
            [{"op": "add", "path": "/spec/containers/0/resources/limits/gpuslice.io~1gpu", "value": "1"}],
        ),
        ("MIG instance", {"limits": {"gpuslice.io/mig-1g.10gb": "1"}}, []),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_defaults(name, resources, expected):
    ops = mutate_pod(pod(resources))
    assert ops == [*expected, {"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME}]


@pytest.mark.parametrize(
    ("name", "resources", "annotations", "spec", "message"),
    [
        (
            "share on two GPUs",
            {"gpuslice.io/gpu": "2", "gpuslice.io/gpumem": "1000"},
            {},
            {},
            "for one GPU only",
        ),
        ("nine GPUs", {"gpuslice.io/gpu": "9"}, {}, {}, "num_gpu must be 0..8"),
        ("unknown MIG profile", {"gpuslice.io/mig-9g.99gb": "1"}, {}, {}, "no GPU has MIG profile '9g.99gb'"),
        ("MIG plus gpu", {"gpuslice.io/mig-1g.10gb": "1", "gpuslice.io/gpu": "1"}, {}, {}, "exactly one MIG"),
        ("unknown resource", {"gpuslice.io/vram": "1"}, {}, {}, "unknown resource gpuslice.io/vram"),
        ("fractional count", {"gpuslice.io/gpu": "0.5"}, {}, {}, "not a whole non-negative number"),
        ("unknown policy", {"gpuslice.io/gpu": "1"}, {ANNOTATION_PLACEMENT_POLICY: "fdg"}, {}, "known: "),
        (
            "model pinned and excluded",
            {"gpuslice.io/gpu": "1"},
            {"gpuslice.io/gpu-models": "H100", "gpuslice.io/exclude-gpu-models": "H100"},
            {},
            "both required and excluded",
        ),
        (
            "another scheduler",
            {"gpuslice.io/gpu": "1"},
            {},
            {"schedulerName": "volcano"},
            "names scheduler 'volcano'",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else "",
)
def test_impossible_requests_are_refused_with_a_message(name, resources, annotations, spec, message):
    answer = admit(review(pod({"limits": resources}, annotations, **spec)))["response"]
    assert answer["allowed"] is False
    assert message in answer["status"]["message"]


def test_two_containers_asking_for_gpus_are_admitted_and_an_init_container_bigger_than_the_slice_is_not():
    p = pod({"limits": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "4000"}})
    p["spec"]["containers"].append({"name": "second", "resources": {"limits": {"gpuslice.io/gpu": "1"}}})
    answer = admit(review(p))["response"]
    assert answer["allowed"] is True
    p["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"limits": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "8000"}}}
    ]
    answer = admit(review(p))["response"]
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert "init container 'warm' asks for 8000 MiB of 1 GPU, more than container" in message
    assert "(4000 MiB of 1 GPU)" in message


def test_pods_without_gpuslice_resources_and_other_operations_pass_unchanged():
    plain = admit(review(pod({"limits": {"cpu": "1", "nvidia.com/gpu": "1"}})))["response"]
    assert plain == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    update = admit(review(pod({"limits": {"gpuslice.io/gpu": "99"}}), operation="UPDATE"))["response"]
    assert update["allowed"] is True and "patch" not in update


def test_a_pod_already_on_the_gpuslice_scheduler_gets_no_scheduler_patch():
    ops = mutate_pod(pod({"limits": {"gpuslice.io/gpu": "1"}}, schedulerName=SCHEDULER_NAME))
    assert ops == []
