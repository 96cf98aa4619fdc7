"""The kube-scheduler extender/v1 wire format: reading ExtenderArgs, writing filter and prioritize replies.

```text
ExtenderArgs            {"Pod": {...}, "Nodes": null, "NodeNames": ["n1", ...]}   (nodeCacheCapable)
ExtenderFilterResult    {"NodeNames": [...], "FailedNodes": {name: reason}, "FailedAndUnresolvableNodes":
                         {name: reason}, "Error": ""}, plus "Nodes": {"items": [...]} when the request
                         carried whole Nodes (nodeCacheCapable: false)
HostPriorityList        [{"Host": "n1", "Score": 0..10}, ...]
```

Keys are PascalCase: the extender/v1 structs (k8s.io/kube-scheduler/extender/v1, ``types.go``) carry no
json tags, so Go writes the field names as they are. Kube-schedulers before v1.16 used lowercase tags
(``pkg/scheduler/api/v1``), and Go reads keys case-insensitively, so lowercase keys are still accepted.

Why a module of its own: at 5,000 nodes the JSON of the node names (about 100 kB each way, four times
per pod) costs more than the placement itself, so the codec is chosen for speed: orjson (Rust) decodes
and encodes several times faster than the standard library (benchmarks/RESULTS.md), and the
HostPriorityList of DNS names is spliced from precomputed score strings instead of thousands of dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuslice.errors import InvalidRequest, UserError

try:
    import orjson
except ImportError:  # the extender runs from the k8s extra; say so instead of a bare ImportError
    raise UserError("the scheduler extender needs the k8s extra: pip install 'gpuslice[k8s]'") from None

__all__ = [
    "MAX_EXTENDER_PRIORITY",
    "ArgsReader",
    "decode",
    "encode",
    "field",
    "filter_error",
    "filter_reply",
    "host_priorities",
    "node_names",
]

MAX_EXTENDER_PRIORITY = 10  # MaxExtenderPriority in k8s.io/kube-scheduler/extender/v1
RECENT_NAME_LISTS = 4  # node-name lists an ArgsReader remembers (kube-scheduler's list, the last survivors)
_NODE_NAMES_KEY = b'"NodeNames":'


def decode(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; InvalidRequest for anything else."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise InvalidRequest(f"the body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    return body


def encode(value: Any) -> bytes:
    """Any reply as JSON bytes."""
    return orjson.dumps(value)


def field(body: Mapping[str, Any], name: str) -> Any:
    """A wire field by its PascalCase name, or its lowercase spelling (kube-schedulers before v1.16)."""
    if name in body:
        return body[name]
    lowered = name.lower()
    for key, value in body.items():
        if key.lower() == lowered:
            return value
    return None


def node_names(body: Mapping[str, Any]) -> list[str]:
    """NodeNames (nodeCacheCapable) or, failing that, the names of Nodes.items."""
    names = field(body, "NodeNames")
    if isinstance(names, list):
        if not {type(n) for n in names} <= {str}:
            raise InvalidRequest("NodeNames must be a list of node names (strings)")
        return names
    if names is not None:
        raise InvalidRequest("NodeNames must be a list of node names (strings) or null")
    nodes = field(body, "Nodes")
    if nodes is None:
        return []
    items = field(nodes, "items") if isinstance(nodes, dict) else None
    if not isinstance(nodes, dict) or not isinstance(items, list | None):
        raise InvalidRequest('Nodes must be a NodeList object ({"items": [Node, ...]}) or null')
    out = []
    for i, item in enumerate(items or []):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str):
            raise InvalidRequest(f"Nodes.items[{i}] must be a Node object with metadata.name")
        out.append(name)
    return out


class ArgsReader:
    """Decodes ExtenderArgs; a NodeNames array that repeats a recent one byte for byte is not decoded again.

    kube-scheduler sends the same node names to /filter pod after pod, and to /prioritize the names
    /filter just passed. Decoding 5,000 names, comparing them with the last list and freeing them again
    is a large share of a call; a repeat here costs a memcmp and the returned list is the remembered one
    (callers must not change it).

    When a repeat is recognised: the body ends with ``"NodeNames":`` and the orjson encoding of a
    remembered list and ``}`` (Go's encoding/json writes ExtenderArgs compactly, fields in the order Pod,
    Nodes, NodeNames), so that array decodes to exactly the remembered list. The body is then decoded
    with the array replaced by null, and must come out with NodeNames null at the top level, which proves
    the replaced bytes were the top-level array. Anything else takes the plain path.

    Used from the event loop's one thread (the extender's async handlers); not locked.
    """

    def __init__(self, keep: int = RECENT_NAME_LISTS) -> None:
        self._keep = keep
        # (b'"NodeNames":' + orjson encoding + b"}", list), most recent first
        self._recent: list[tuple[bytes, list[Any]]] = []

    def read(self, raw: bytes) -> tuple[dict[str, Any], list[Any]]:
        """The body as a JSON object and its node names (see ``node_names``); InvalidRequest if not JSON."""
        for i, (tail, names) in enumerate(self._recent):
            if raw.endswith(tail):  # one memcmp of the array's length
                body = decode(raw[: len(raw) - len(tail) + len(_NODE_NAMES_KEY)] + b"null}")
                if "NodeNames" not in body or body["NodeNames"] is not None:
                    break  # the replaced array was not the top-level NodeNames
                if i:
                    self._recent.insert(0, self._recent.pop(i))
                return body, names
        body = decode(raw)
        names = node_names(body)
        if raw.endswith(b"]}"):  # written as Go writes it: worth recognising next time
            self.remember(names)
        return body, names

    def remember(self, names: list[Any]) -> None:
        """Expect ``names`` in a coming request (the nodes a filter passed come back to prioritize)."""
        tail = _NODE_NAMES_KEY + orjson.dumps(names) + b"}"
        self._recent = [(tail, names), *self._recent[: self._keep - 1]]


def filter_reply(
    passed: list[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    nodes: Mapping[str, Any] | None = None,
) -> bytes:
    """ExtenderFilterResult for a filter that ran.

    ``nodes``: the request's ``Nodes`` (a NodeList) when kube-scheduler sent whole nodes
    (``nodeCacheCapable: false``); it then reads the survivors from the reply's ``Nodes.items`` only, so
    they go back there, as the objects it sent. NodeNames is always filled too.
    """
    reply: dict[str, Any] = {
        "NodeNames": passed,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }
    if nodes is not None:
        keep = set(passed)
        items = [i for i in nodes.get("items") or [] if (i.get("metadata") or {}).get("name") in keep]
        reply["Nodes"] = {**nodes, "items": items}
    return orjson.dumps(reply)


def filter_error(message: str) -> bytes:
    """ExtenderFilterResult for a request the extender could not read: kube-scheduler reports Error."""
    return orjson.dumps({"NodeNames": None, "FailedNodes": {}, "Error": message})


# After each host name in a HostPriorityList: its score and the opening of the next entry, per score.
_AFTER_HOST = np.array(
    [f'","Score":{s}}},{{"Host":"' for s in range(MAX_EXTENDER_PRIORITY + 1)], dtype=object
)
_NEXT_HOST = ',{"Host":"'


def host_priorities(hosts: Sequence[Any], scores: np.ndarray) -> bytes:
    """HostPriorityList JSON, scores clipped to 0..MAX_EXTENDER_PRIORITY.

    Node names are DNS subdomains: ASCII with nothing JSON escapes. When every name is like that (one
    orjson pass over the joined names tells), the text is joined from the names and 11 precomputed
    score strings instead of building and encoding 5,000 dicts. Any other name: the plain encoding.
    """
    clipped = np.clip(scores, 0, MAX_EXTENDER_PRIORITY)
    try:
        joined: str | None = ",".join(hosts)
    except TypeError:  # not all strings
        joined = None
    plain = (
        bool(hosts)
        and joined is not None
        and joined.isascii()
        and len(orjson.dumps(joined)) == len(joined) + 2  # the quotes only: nothing was escaped
    )
    if not plain:
        return orjson.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, clipped.tolist(), strict=True)])
    parts: list[str] = [""] * (2 * len(hosts))
    parts[0::2] = hosts
    parts[1::2] = _AFTER_HOST[clipped].tolist()
    return ('[{"Host":"' + "".join(parts)[: -len(_NEXT_HOST)] + "]").encode()
