"""The shape of what the webhook and the extender read from the API server and kube-scheduler, checked
before anything reads it: a Pod's fields gpuslice uses, and the AdmissionReview around one.

```text
strict_json(raw)     JSON text -> value; InvalidRequest for NaN/Infinity (not JSON, RFC 8259), a lone
                     surrogate (not Unicode: no answer could carry it back), nesting deeper than
                     MAX_DEPTH, anything else not JSON
check_pod(pod, at)   metadata{name, namespace, uid: str; annotations, labels: {str: str}}
                     spec{schedulerName, nodeName: str; containers, initContainers: [{name: str,
                     resources{requests, limits: {str: str | finite number}}}]}
check_review(r)      {apiVersion, kind: str; request{uid: str; kind{kind: str}; operation: str;
                     object: a Pod as above}}
```

Every refusal is InvalidRequest naming the path (``request.object.spec.containers[0].resources``) and
what was found, so the API server or kube-scheduler can show the user what is wrong. Fields not listed
are not read by gpuslice and are not checked. Absent and null fields are fine (the API server omits
empty ones).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from gpuslice.errors import InvalidRequest

__all__ = ["MAX_DEPTH", "check_pod", "check_review", "strict_json"]

MAX_DEPTH = 100  # far deeper than any Pod; the API server itself limits nesting when it decodes


def _reject_constant(name: str) -> Any:
    raise InvalidRequest(f"the body holds {name}, which JSON does not allow")


def _depth(value: Any) -> int:
    """Nesting depth, iteratively (a recursive walk is what deep input is meant to break)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > MAX_DEPTH:
                return deepest
            stack += [(v, level + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


def strict_json(raw: bytes) -> Any:
    """``raw`` as JSON, refusing what cannot be answered faithfully (see the module doc)."""
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise InvalidRequest(f"the body is nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as err:
        raise InvalidRequest(f"the body is not UTF-8 ({err.reason})") from None
    except ValueError as err:
        raise InvalidRequest(f"the body is not JSON: {err}") from None
    if _depth(value) > MAX_DEPTH:
        raise InvalidRequest(f"the body is nested deeper than {MAX_DEPTH} levels")
    try:
        json.dumps(value).encode("utf-8")  # escapes are decoded by now: a lone surrogate shows here
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest("the body holds a lone UTF-16 surrogate, which is not valid Unicode") from None
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _want(value: Any, kind: type | tuple[type, ...], at: str, what: str) -> Any:
    if value is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise InvalidRequest(f"{at}: must be {what}, not {_kind(value)}")
    return value


def _string_map(value: Any, at: str) -> None:
    for key, item in (_want(value, dict, at, "an object of strings") or {}).items():
        _want(item, str, f"{at}[{key!r}]", "a string")


def _quantities(value: Any, at: str) -> None:
    for key, item in (_want(value, dict, at, "an object of quantities") or {}).items():
        _want(item, (str, int, float), f"{at}[{key!r}]", 'a quantity such as "8Gi" or 1')
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidRequest(f"{at}[{key!r}]: must be a finite quantity")


def check_pod(pod: Any, at: str = "pod") -> Mapping[str, Any]:
    """``pod`` if its fields gpuslice reads have the right kinds; InvalidRequest naming the first that
    does not. A null or absent pod is an empty one."""
    pod = _want(pod, dict, at, "a Pod object") or {}
    meta = _want(pod.get("metadata"), dict, f"{at}.metadata", "an object") or {}
    for name in ("name", "namespace", "uid", "generateName"):
        _want(meta.get(name), str, f"{at}.metadata.{name}", "a string")
    _string_map(meta.get("annotations"), f"{at}.metadata.annotations")
    _string_map(meta.get("labels"), f"{at}.metadata.labels")
    spec = _want(pod.get("spec"), dict, f"{at}.spec", "an object") or {}
    for name in ("schedulerName", "nodeName"):
        _want(spec.get(name), str, f"{at}.spec.{name}", "a string")
    for group in ("containers", "initContainers"):
        for i, container in enumerate(_want(spec.get(group), list, f"{at}.spec.{group}", "a list") or []):
            where = f"{at}.spec.{group}[{i}]"
            if container is None:
                raise InvalidRequest(f"{where}: must be a container object, not null")
            container = _want(container, dict, where, "a container object")
            _want(container.get("name"), str, f"{where}.name", "a string")
            resources = _want(container.get("resources"), dict, f"{where}.resources", "an object") or {}
            for part in ("requests", "limits"):
                _quantities(resources.get(part), f"{where}.resources.{part}")
    return pod


def check_review(review: Any) -> Mapping[str, Any]:
    """The AdmissionReview's request if it has the right kinds (InvalidRequest otherwise); its object
    is checked as a Pod only when the request is about one."""
    review = _want(review, dict, "the body", "an AdmissionReview object")
    if review is None:
        raise InvalidRequest("the body must be an AdmissionReview object, not null")
    for name in ("apiVersion", "kind"):
        _want(review.get(name), str, name, "a string")
    request = _want(review.get("request"), dict, "request", "an AdmissionRequest object")
    if request is None:
        raise InvalidRequest("request: an AdmissionReview needs its request")
    if not isinstance(request.get("uid"), str):
        raise InvalidRequest(f"request.uid: must be a string, not {_kind(request.get('uid'))}")
    kind = _want(request.get("kind"), dict, "request.kind", "an object") or {}
    _want(kind.get("kind"), str, "request.kind.kind", "a string")
    _want(request.get("operation"), str, "request.operation", "a string")
    return request
