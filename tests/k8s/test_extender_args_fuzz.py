"""Every field of ExtenderArgs, ExtenderBindingArgs and ExtenderPreemptionArgs (k8s.io/kube-scheduler
extender/v1), each either well formed or any JSON at all, posted to the extender's HTTP app: no answer
is a 5xx, and each says what is wrong in the field kube-scheduler shows (filter's and bind's Error).

kube-scheduler reads an extender's body only on a 200 (HTTPExtender.send), so a 500 costs the pod its
reason and, for filter, its scheduling attempt."""

from __future__ import annotations

import json
import warnings
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_extender import GPU1_8G, FakeApi, inventory, make_state, pod_json

from gpuslice.k8s.extender import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

NODES = ["node-1", "node-2"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
names = st.sampled_from([*NODES, "", "no-such-node"]) | st.text(max_size=12)
pods = st.sampled_from(
    [pod_json("p", GPU1_8G), pod_json("cpu", {"cpu": "1"}), pod_json("whole", {"gpuslice.io/gpu": "2"})]
)


def _field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: a well-formed one, or any JSON, or missing (``_MISSING``)."""
    return valid | json_values | st.just(_MISSING)


_MISSING = object()


def _pod() -> st.SearchStrategy[Any]:
    """A pod, or a pod with one of its own fields replaced by any JSON."""
    broken = st.tuples(pods, st.sampled_from(["metadata", "spec", "status", "kind"]), json_values).map(
        lambda t: {**t[0], t[1]: t[2]}
    )
    return _field(pods | broken)


def _node_list() -> st.SearchStrategy[Any]:
    item = st.builds(lambda n: {"metadata": {"name": n}}, names) | json_values
    return st.builds(lambda items: {"items": items}, st.lists(item, max_size=3)) | st.lists(
        names | json_values, max_size=3
    )


def _object(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """An object of these fields, each well formed, any JSON, or left out."""
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not _MISSING})


def _body(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """A request body: the object, or any JSON in its place."""
    return (_object(fields) | json_values).map(lambda v: json.dumps(v).encode())


EXTENDER_ARGS = _body(
    {
        "Pod": _pod(),
        "Nodes": _field(_node_list()),
        "NodeNames": _field(st.lists(names | json_values, max_size=3)),
    }
)
BINDING_ARGS = _body({k: _field(names) for k in ("PodName", "PodNamespace", "PodUID", "Node")})
victims = _object(
    {"Pods": _field(st.lists(pods | st.builds(lambda u: {"UID": u}, names) | json_values, max_size=2)),
     "NumPDBViolations": _field(st.integers(0, 3))}
)  # fmt: skip
PREEMPTION_ARGS = _body(
    {
        "Pod": _pod(),
        "NodeNameToVictims": _field(st.dictionaries(names, victims | json_values, max_size=2)),
        "NodeNameToMetaVictims": _field(st.dictionaries(names, victims | json_values, max_size=2)),
    }
)

_client = TestClient(
    create_app(make_state(FakeApi(), {n: inventory() for n in NODES})), raise_server_exceptions=False
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _post(verb: str, body: bytes) -> Any:
    r = _client.post(f"/{verb}", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, (r.status_code, body[:300], r.text[:300])
    return r.json()


@FUZZ
@given(EXTENDER_ARGS)
def test_filter_answers_every_extender_args_with_a_result(body: bytes) -> None:
    answer = _post("filter", body)
    assert isinstance(answer["Error"], str)
    if answer["Error"]:
        assert answer["NodeNames"] is None  # a refusal of the request, not of nodes
    reasons = {**answer.get("FailedNodes", {}), **answer.get("FailedAndUnresolvableNodes", {})}
    assert all(isinstance(why, str) and why for why in reasons.values()), answer


@FUZZ
@given(EXTENDER_ARGS)
def test_prioritize_answers_every_extender_args_with_a_list(body: bytes) -> None:
    answer = _post("prioritize", body)
    assert isinstance(answer, list)
    assert all(isinstance(h["Host"], str) and 0 <= h["Score"] <= 10 for h in answer)


@FUZZ
@given(BINDING_ARGS)
def test_bind_answers_every_binding_args_with_an_error_field(body: bytes) -> None:
    answer = _post("bind", body)
    assert isinstance(answer["Error"], str)
    assert "HTTP response headers" not in answer["Error"]


@FUZZ
@given(PREEMPTION_ARGS)
def test_preempt_answers_every_preemption_args_with_candidates(body: bytes) -> None:
    answer = _post("preempt", body)
    assert isinstance(answer["NodeNameToMetaVictims"], dict)
