"""Acceptance: property-based calls generated from the served OpenAPI schema never get a 5xx.

The app runs in-process over a daemon with the fake node; calls carry the bearer token so that
submits, cancels and tenant changes reach the daemon rather than stopping at 401.
"""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings

from gpuslice.server.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import schemathesis
    from schemathesis.checks import not_a_server_error

# schemathesis and starlette warn about their own deprecations; they are not ours to fix here.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]

TOKEN = "fuzz-token"


def test_no_generated_call_gets_a_server_error(make_daemon):
    app = create_app(make_daemon(grace_seconds=0.1), TOKEN)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 11  # every route of app.py is in the served schema
    calls = 0

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        def call(case) -> None:
            nonlocal calls
            if case.path.endswith("/logs") and case.query:
                case.query["follow"] = False  # a follow on a job that never ends would stream forever
            case.call_and_validate(headers=auth, checks=[not_a_server_error])
            calls += 1

        call()
    assert calls >= 100
