"""Writes malformed_webhook.json and malformed_extender.json next to this file: malformed bodies for the
admission webhook and the scheduler extender, derived from a valid one by replacing every value on its
paths with the wrong kinds of JSON (lists where objects go, NaN, a lone surrogate, deep nesting …).

Run ``python tests/k8s/data/make_malformed.py`` after changing the shapes; the files are the corpus the
tests read (each case: a name, the body as text, and whether "__DEEP__" stands for 100,000 levels).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
DEEP = "__DEEP__"
WRONG: dict[str, Any] = {
    "list": [1, "a"], "object": {"x": 1}, "string": "x", "number": 7, "nan": float("nan"),
    "infinity": float("inf"), "bool": True, "null": None, "surrogate": "\ud800", "deep": DEEP,
    "huge": 10**400,
}  # fmt: skip

REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": "team-a",
        "object": {
            "metadata": {"name": "train", "annotations": {"gpuslice.io/placement-policy": "binpack"}},
            "spec": {
                "containers": [{"name": "t", "resources": {"requests": {"gpuslice.io/gpumem": "8Gi"},
                                                           "limits": {"gpuslice.io/gpu": "1"}}}],
                "initContainers": [{"name": "i"}],
            },
        },
    },
}  # fmt: skip

POD = {
    "metadata": {"name": "train", "namespace": "team-a", "uid": "u-1",
                 "annotations": {"gpuslice.io/placement-policy": "binpack"}},
    "spec": {"containers": [{"name": "t", "resources": {"limits": {"gpuslice.io/gpumem": "8Gi"}}}]},
}  # fmt: skip
ARGS = {"Pod": POD, "NodeNames": ["node-1", "node-2"]}
BIND = {"PodName": "train", "PodNamespace": "team-a", "PodUID": "u-1", "Node": "node-1"}
PREEMPT = {"Pod": POD, "NodeNameToMetaVictims": {"node-1": {"Pods": [{"UID": "v-1"}], "NumPDBViolations": 0}}}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


def _replaced(doc: Any, path: tuple[Any, ...], new: Any) -> Any:
    out = copy.deepcopy(doc)
    target = out
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = new
    return out


def _cases(prefix: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    cases = [
        {"name": f"{prefix}: not JSON", "body": "{not json"},
        {"name": f"{prefix}: a list", "body": "[]"},
        {"name": f"{prefix}: a string", "body": '"x"'},
        {"name": f"{prefix}: empty", "body": ""},
        {"name": f"{prefix}: deep", "body": json.dumps(DEEP), "deep": True},
    ]
    for path in _paths(doc):
        for kind, value in WRONG.items():
            body = json.dumps(_replaced(doc, path, value))
            cases.append({"name": f"{prefix}: {'.'.join(map(str, path))} = {kind}", "body": body,
                          "deep": value == DEEP})  # fmt: skip
    return cases


def main() -> None:
    (HERE / "malformed_webhook.json").write_text(json.dumps(_cases("review", REVIEW), indent=0) + "\n")
    extender = _cases("filter", ARGS) + _cases("prioritize", ARGS) + _cases("bind", BIND)
    extender += _cases("preempt", PREEMPT)
    (HERE / "malformed_extender.json").write_text(json.dumps(extender, indent=0) + "\n")


if __name__ == "__main__":
    main()
