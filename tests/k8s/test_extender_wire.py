"""extender_wire: ExtenderArgs in, filter and prioritize replies out, and the reader that recognises a
repeated NodeNames list without decoding it. Bodies are written as kube-scheduler's Go encoder writes
them (compact, fields in the order Pod, Nodes, NodeNames) unless a test says otherwise."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.k8s import extender_wire as wire

ONE_NODE = {"items": [{"metadata": {"name": "x"}}]}
POD = {"metadata": {"name": "p", "namespace": "team-a", "uid": "u-1"}, "spec": {"containers": []}}
NAMES = [f"gpu-node-{i:03d}" for i in range(50)]


def go_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def args(names: list[str], pod: dict[str, Any] = POD) -> bytes:
    return go_json({"Pod": pod, "Nodes": None, "NodeNames": names})


def test_a_repeated_list_comes_back_as_the_same_list_without_decoding_it():
    reader = wire.ArgsReader()
    body, first = reader.read(args(NAMES))
    assert first == NAMES and body["Pod"] == POD
    other_pod = {**POD, "metadata": {**POD["metadata"], "name": "q", "uid": "u-2"}}
    body, again = reader.read(args(NAMES, other_pod))
    assert again is first  # recognised, not decoded
    assert body == {"Pod": other_pod, "Nodes": None, "NodeNames": None}


def test_a_list_that_differs_in_one_name_is_decoded():
    reader = wire.ArgsReader()
    _, first = reader.read(args(NAMES))
    changed = [*NAMES[:-1], "gpu-node-999"]
    _, names = reader.read(args(changed))
    assert names == changed and names is not first


def test_the_survivors_a_filter_passed_are_recognised_by_prioritize():
    reader = wire.ArgsReader()
    reader.read(args(NAMES))
    survivors = NAMES[::3]
    reader.remember(survivors)
    _, names = reader.read(args(survivors))
    assert names is survivors
    _, names = reader.read(args(NAMES))  # kube-scheduler's full list is still known after that
    assert names == NAMES


@pytest.mark.parametrize(
    "raw, names",
    [
        # not compact: the plain path
        (json.dumps({"Pod": POD, "Nodes": None, "NodeNames": NAMES}).encode(), NAMES),
        # NodeNames not last
        (go_json({"NodeNames": NAMES, "Pod": POD}), NAMES),
        # a name holding "]"
        (go_json({"Pod": POD, "NodeNames": ["a]", *NAMES]}), ["a]", *NAMES]),
        # the last member's key only ends in NodeNames; the real NodeNames is absent (Nodes is used)
        (
            go_json({"Pod": POD, "Nodes": ONE_NODE, 'y"NodeNames': NAMES}),
            ["x"],
        ),
        # a nested NodeNames as the very last array of the body
        (go_json({"NodeNames": ["real"], "Pod": {"NodeNames": NAMES}}), ["real"]),
    ],
    ids=["spaces", "not last", "bracket in a name", "look-alike key", "nested"],
)
def test_bodies_that_only_look_like_a_repeat_are_read_in_full(raw: bytes, names: list[str]):
    reader = wire.ArgsReader()
    reader.remember(NAMES)
    reader.read(args(NAMES))  # NAMES is remembered, in its compact encoding
    body, read = reader.read(raw)
    assert read == names
    assert body == json.loads(raw)


def test_legacy_lowercase_keys_and_full_node_objects_are_read():
    reader = wire.ArgsReader()
    _, names = reader.read(go_json({"pod": POD, "nodenames": ["a", "b"]}))
    assert names == ["a", "b"]
    nodes = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
    _, names = reader.read(go_json({"Pod": POD, "Nodes": nodes, "NodeNames": None}))
    assert names == ["a", "b"]


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[1, 2]", b"", go_json({"Pod": POD, "NodeNames": ["a", 7]}), go_json({"NodeNames": "a"})],
    ids=["broken", "an array", "empty", "a name that is a number", "names that are a string"],
)
def test_a_body_that_is_not_a_json_object_is_an_invalid_request(raw: bytes):
    with pytest.raises(InvalidRequest):
        wire.ArgsReader().read(raw)


def test_filter_reply_uses_the_pascal_case_keys_kube_scheduler_reads():
    reply = orjson.loads(wire.filter_reply(["a"], {"b": "full"}, {"c": "no inventory"}))
    assert reply == {
        "NodeNames": ["a"],
        "FailedNodes": {"b": "full"},
        "FailedAndUnresolvableNodes": {"c": "no inventory"},
        "Error": "",
    }
    assert orjson.loads(wire.filter_error("bad pod")) == {
        "NodeNames": None,
        "FailedNodes": {},
        "Error": "bad pod",
    }


def test_host_priorities_clip_scores_to_the_extender_range():
    reply = orjson.loads(wire.host_priorities(["a", "b", "c"], np.array([-3, 4, 99])))
    assert reply == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 4}, {"Host": "c", "Score": 10}]
