"""The published schema is the truth: every input the server takes is answered as ``/openapi.json`` says.

The test reads the schema the server publishes, and for every request-body field and every path, query
and header parameter of every operation derives boundary values from that field's own schema (minimum,
maximum, one past each, the bound as a float, half-way values, "", the longest string and one longer,
in ASCII and in multi-byte characters, too many items or entries, values of every wrong JSON type).
Each value replaces the field in a request the schema accepts, is judged by ``jsonschema`` (Draft
2020-12, the dialect of OpenAPI 3.1, with ``pattern`` read as ECMA-262 reads it and the schema's one own
keyword, ``x-maxUtf8Bytes``), and is sent. The answer must agree:

- the schema refuses it  ->  422, the answer for a body or parameter that does not match the schema;
- the schema accepts it  ->  never 422: 2xx, or a refusal for what the value means here, which no schema
  can state (400: a size of zero bytes, a duration of zero, a topology need for one GPU, a GPU model this
  machine lacks, a map value of another type than the loaded policy's map; 403 another user; 404 a key
  that is not in the map).

Nothing here lists the fields: a field added to a model is walked the next time this runs.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import jsonschema
import pytest
from policy_sources import BOOST

from gpuslice.server.app import create_app
from gpuslice.server.models import MAX_BYTES_KEYWORD

with warnings.catch_warnings():
    # starlette asks for its httpx2 fork; the httpx we have works the same for these tests.
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

TOKEN = "truth-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MEANING = frozenset({400, 403, 404})  # a schema-valid value refused for what it means on this server
WRONG_TYPES: tuple[Any, ...] = (None, True, False, 0, 1, -1, 1.5, "x", [], {}, [1], {"a": 1})
TEXTS = ("", " ", "a", "1", "0", "true", "null", "a\x00b", "a=b", "-x", "٢٠", "8GiB", "90s", "0s", "1.5B",
         "8 gib", "1e3GiB", "20GB ", "queue", "ml", "ml\n", "8GiB\n", "90s\n", "\t8\tGiB\t", "8GiBx",
         "-1GiB", "١h", "0GiB")  # fmt: skip


def _max_bytes(validator: Any, limit: int, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    if isinstance(instance, str) and len(instance.encode("utf-8")) > limit:
        yield jsonschema.ValidationError(f"longer than {limit} bytes of UTF-8")


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    """ECMA-262's reading of a pattern: ``$`` is the end of the text, never before a last newline as in
    Python's ``re`` (which jsonschema uses as it is)."""
    if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$$", r"\\Z", pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


VALIDATOR = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {MAX_BYTES_KEYWORD: _max_bytes, "pattern": _ecma_pattern}
)


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _members(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in node.get("anyOf", [node])]


def boundary_values(schema: dict[str, Any], node: dict[str, Any], depth: int = 0) -> Iterator[Any]:
    """Values at and around every bound ``node`` states, and values of every wrong type."""
    node = _resolve(schema, node)
    yield from WRONG_TYPES
    for m in _members(node):
        m = _resolve(schema, m)
        yield from m.get("enum", ())
        if "enum" in m:
            yield str(m["enum"][0]).upper()
        kind = m.get("type")
        if kind in ("integer", "number"):
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if key in m:
                    b = m[key]
                    yield from (b, b - 1, b + 1, float(b), b + 0.5, b - 0.5, int(b) if b == int(b) else b)
                    yield str(b)
            yield from (2**63, -(2**63) - 1, 1e308, 0.0, 3.0, 2.5)
        if kind == "string":
            yield from TEXTS
            for key in ("minLength", "maxLength"):
                if key in m:
                    n = m[key]
                    for char in ("a", "é", "😀"):
                        yield from (char * max(n - 1, 0), char * n, char * (n + 1))
        if kind == "array" and depth < 2:
            low, high = m.get("minItems", 0), m.get("maxItems", 40)
            first = [_resolve(schema, p) for p in m.get("prefixItems", [])]
            good = "true"
            yield from ([good] * max(low - 1, 0), [good] * low, [good] * high, [good] * (high + 1))
            for v in boundary_values(schema, m.get("items", {}), depth + 1):
                yield [v] if not first else [good, v]
            for p in first:
                for v in boundary_values(schema, p, depth + 1):
                    yield [v]
        if kind == "object" and depth < 2 and "properties" not in m:
            high = m.get("maxProperties", 40)
            values = [*m.get("patternProperties", {}).values()] or [m.get("additionalProperties", {})]
            names = m.get("propertyNames", {})
            good_value = "v" if values and _resolve(schema, values[0]).get("type") == "string" else 1.0
            yield from ({f"K{i}": good_value for i in range(n)} for n in (high, high + 1))
            for key in boundary_values(schema, names or {"type": "string"}, depth + 1):
                if isinstance(key, str):
                    yield {key: good_value}
            for v in boundary_values(schema, values[0], depth + 1):
                yield {"K": v}


# -- the server and a request each operation accepts ---------------------------------------------


@pytest.fixture
def api(make_daemon):
    with TestClient(create_app(make_daemon(grace_seconds=0.1), TOKEN), headers=AUTH) as client:
        job = client.post("/v1/jobs", json={"command": ["true"]})
        assert job.status_code == 201, job.text
        assert client.post("/v1/policies", json={"filename": "boost.py", "source": BOOST}).status_code == 201
        client.job_id = job.json()["id"]
        yield client


def _bases(client: TestClient) -> dict[str, dict[str, Any]]:
    """A body and parameters each operation accepts: the walk changes one field of it at a time."""
    return {
        "SubmitRequest": {"command": ["true"]},
        "TenantIn": {"weight": 2.0},
        "GpuHealthIn": {"healthy": True},
        "PolicyIn": {"filename": "boost.py", "source": BOOST},
        "MapValueIn": {"value": 1},
        "params": {"job_id": client.job_id, "index": 0, "name": "ml", "family": "queue", "key": "ml",
                   "limit": 10},
    }  # fmt: skip


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            yield path, method.upper(), op


def _send(client: TestClient, method: str, path: str, params: dict[str, Any], body: Any | None,
          header: dict[str, str] | None = None):  # fmt: skip
    url = path
    query = {}
    for name, value in params.items():
        if "{" + name + "}" in url:
            url = url.replace("{" + name + "}", quote(str(value), safe=""))
        elif value is not None:
            query[name] = value
    content = None if body is None else json.dumps(body, allow_nan=False)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    headers.update(header or {})
    return client.request(method, url, params=query, content=content, headers=headers)


def _cases(client: TestClient, schema: dict[str, Any]) -> Iterator[tuple[str, str, Any, bool, Any]]:
    """(operation, field, value, schema verdict, response) for every boundary value of every input."""
    bases = _bases(client)
    for path, method, op in _operations(schema):
        if path.endswith("/logs") or method == "DELETE":
            continue  # logs: a text stream (its parameters are walked by the GET below); DELETE: once each
        about = f"{method} {path}"
        params_schema = {p["name"]: p for p in op.get("parameters", []) if p["in"] in ("path", "query")}
        params = {n: bases["params"][n] for n in params_schema if n in bases["params"]}
        if path == "/v1/policies/{family}/maps/{name}" or path.endswith("/{key}"):
            params["name"] = "boost"
        body_ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        body_schema = _resolve(schema, body_ref) if body_ref else None
        body = dict(bases[body_ref["$ref"].rsplit("/", 1)[1]]) if body_ref else None
        if body_schema is not None:
            assert VALIDATOR(body_schema).is_valid(body), about
            for field, node in body_schema["properties"].items():
                if field == "source":
                    continue  # its refusals are the verifier's (422 PolicyRejected), not the schema's
                for value in boundary_values(schema, node):
                    changed = {**body, field: value}
                    full = {**body_schema, "components": schema["components"]}
                    valid = VALIDATOR(full).is_valid(changed)
                    yield about, field, value, valid, _send(client, method, path, params, changed)
        for name, p in params_schema.items():
            if name in ("job_id", "family") or (name == "name" and "policies" in path):
                continue  # look-up keys: any text is schema-valid and a missing one is 404
            for value in boundary_values(schema, p["schema"]):
                text = _as_query_text(value)
                if text is None:
                    continue
                valid = _param_valid(p["schema"], text, schema)
                yield about, name, text, valid, _send(client, method, path, {**params, name: text}, body)
        for p in op.get("parameters", []):
            if p["in"] != "header":
                continue
            for value in boundary_values(schema, p["schema"]):
                if isinstance(value, str) and _sendable_header(value):
                    valid = VALIDATOR({**p["schema"], "components": schema["components"]}).is_valid(value)
                    sent = _send(client, method, path, params, body, {p["name"]: value})
                    yield about, p["name"], value, valid, sent


def _sendable_header(text: str) -> bool:
    """Text an HTTP field value carries as it is: visible ASCII and inner spaces (RFC 9110 section 5.5:
    white space around a value is not part of it; a control character is no field value at all)."""
    return text == text.strip(" \t") and all(" " <= c <= "~" for c in text)


def _as_query_text(value: Any) -> str | None:
    """A value as it can travel in a URL: query and path values are text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str) and value != "":
        return str(value)
    return None


def _param_valid(node: dict[str, Any], text: str, schema: dict[str, Any]) -> bool:
    """A parameter's text against its schema, read as the text of a URL is: an integer is written in
    ASCII digits with an optional sign (so "3.0" and "1e3" are not integers here, as in every URL
    parser), a number as a JSON number, a boolean as true/false, else the text itself."""
    full = {**node, "components": schema["components"]}
    candidates: list[Any] = [text]
    if re.fullmatch(r"-?[0-9]+", text):
        candidates.append(int(text))
    elif re.fullmatch(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?", text) and not float(text).is_integer():
        candidates.append(float(text))
    if text in ("true", "false"):
        candidates.append(text == "true")
    return any(VALIDATOR(full).is_valid(c) or VALIDATOR(full).is_valid([c]) for c in candidates)


def test_every_input_is_answered_as_the_published_schema_says(api):
    schema = api.get("/openapi.json").json()
    disagreements: list[str] = []
    seen = 0
    for about, field, value, valid, response in _cases(api, schema):
        seen += 1
        code = response.status_code
        assert code < 500, (about, field, _short(value), response.text[:200])
        if not valid and code != 422:
            disagreements.append(f"{about} {field}={_short(value)}: schema refuses, server {code}")
        elif valid and code >= 300 and code not in MEANING:
            detail = response.json().get("detail", "")[:100]
            disagreements.append(f"{about} {field}={_short(value)}: schema accepts, server {code} {detail}")
    assert seen > 1000
    if os.environ.get("TRUTH_DUMP"):  # every disagreement, for a person reading them all
        with open(os.environ["TRUTH_DUMP"], "w", encoding="utf-8") as out:
            out.write("\n".join(disagreements))
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements[:60])


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}…({len(text)} chars)"
