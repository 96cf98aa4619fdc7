"""The malformed corpus (tests/k8s/data, made by make_malformed.py): every body the admission webhook
or the scheduler extender can be sent with the wrong kinds of JSON is answered without a 5xx, and with a
reason the user sees (the webhook's status message, which the API server prints; the extender's
Error or per-node reasons, which kube-scheduler puts in the pod's FailedScheduling event; it reads an
extender's answer only when the status is 200).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from test_extender import FakeApi, inventory, make_state

from gpuslice.k8s.extender import create_app as extender_app
from gpuslice.k8s.webhook import create_app as webhook_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

DATA = Path(__file__).parent / "data"
DEEP = "[" * 100_000 + "]" * 100_000


def _corpus(name: str) -> list[dict[str, Any]]:
    return json.loads((DATA / name).read_text())


def _body(case: dict[str, Any]) -> bytes:
    text = case["body"].replace('"__DEEP__"', DEEP) if case.get("deep") else case["body"]
    return text.encode("utf-8", "surrogatepass")


WEBHOOK = _corpus("malformed_webhook.json")
EXTENDER = _corpus("malformed_extender.json")


@pytest.fixture(scope="module")
def webhook() -> TestClient:
    return TestClient(webhook_app(), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def extender() -> TestClient:
    state = make_state(FakeApi(), {"node-1": inventory(), "node-2": inventory()})
    return TestClient(extender_app(state), raise_server_exceptions=False)


def test_neither_publishes_a_schema_that_would_disagree_with_its_kubernetes_contract(webhook, extender):
    """Their bodies are Kubernetes' types (AdmissionReview, extender/v1); FastAPI's own schema listed
    /mutate and /preempt with no body and left out /filter, /prioritize and /bind."""
    for client in (webhook, extender):
        assert client.get("/openapi.json").status_code == 404
        assert client.get("/docs").status_code == 404


def test_the_corpus_is_there_and_large():
    assert len(WEBHOOK) > 200 and len(EXTENDER) > 500


@pytest.mark.parametrize("case", WEBHOOK, ids=lambda c: c["name"])
def test_the_webhook_answers_each_malformed_review_with_a_reason(webhook, case):
    r = webhook.post("/mutate", content=_body(case), headers={"Content-Type": "application/json"})
    assert r.status_code < 500, r.text
    answer = r.json()
    if r.status_code == 200:
        response = answer["response"]
        assert isinstance(response["uid"], str) and isinstance(response["allowed"], bool)
        if not response["allowed"]:
            assert response["status"]["message"].startswith("gpuslice: ")
    else:
        assert answer["error"]


@pytest.mark.parametrize("case", EXTENDER, ids=lambda c: c["name"])
def test_the_extender_answers_each_malformed_call_with_a_reason(extender, case):
    verb = case["name"].split(":")[0]
    r = extender.post(f"/{verb}", content=_body(case), headers={"Content-Type": "application/json"})
    # kube-scheduler reads an extender's body only on a 200 (HTTPExtender.send in
    # pkg/scheduler/extender.go); on any other status the pod's event shows the code alone. So every
    # verb answers 200, and /bind (whose result has an Error field) always says why it refused.
    assert r.status_code == 200, r.text[:300]
    answer = r.json()
    if verb == "bind":
        assert isinstance(answer["Error"], str) and answer["Error"], answer
    if verb == "filter":
        assert isinstance(answer["Error"], str)
        reasons = {**answer.get("FailedNodes", {}), **answer.get("FailedAndUnresolvableNodes", {})}
        assert all(isinstance(why, str) and why for why in reasons.values()), answer
