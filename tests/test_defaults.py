"""Each default is defined once, in the module that owns it; every other place that shows it agrees.

A default a program cannot import (the job supervisor runs without the package, deploy manifests are
YAML) keeps a copy, and these tests fail when a copy drifts from its source.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import yaml

from gpuslice.cli.jobs import submit
from gpuslice.cli.k8s_device_plugin import device_plugin
from gpuslice.cli.serve import serve
from gpuslice.cli.sim import openb
from gpuslice.k8s.annotations import DEFAULT_SPLIT_COUNT
from gpuslice.node import supervisor
from gpuslice.node.enforcement import DEFAULT_SHARING, SharingMode
from gpuslice.policies.queue import DEFAULT_QUEUE_POLICY, QUEUE, PriorityFair
from gpuslice.scheduler.node_scheduler import NodeScheduler
from gpuslice.server.daemon import DEFAULT_TICK_SECONDS, Daemon
from gpuslice.server.models import SubmitRequest, parse_duration
from gpuslice.server.run import ServeOptions
from gpuslice.sim.trace import BUNDLED_TRACES, DEFAULT_TRACE, load_trace
from gpuslice.workload.job import DEFAULT_GRACE_SECONDS, DEFAULT_TENANT, JobSpec

REPO = Path(__file__).resolve().parent.parent


def _default(function: Any, name: str) -> Any:
    return inspect.signature(function).parameters[name].default


def test_the_default_queue_policy_is_a_registered_builtin() -> None:
    assert QUEUE[DEFAULT_QUEUE_POLICY] is PriorityFair


def test_serve_daemon_and_scheduler_share_the_queue_policy_default() -> None:
    assert _default(serve, "queue_policy") == DEFAULT_QUEUE_POLICY
    assert ServeOptions.__dataclass_fields__["queue_policy"].default == DEFAULT_QUEUE_POLICY
    assert _default(Daemon, "queue_policy") == DEFAULT_QUEUE_POLICY
    assert _default(NodeScheduler, "queue_policy") == DEFAULT_QUEUE_POLICY


def test_serve_daemon_scheduler_and_supervisor_share_the_grace() -> None:
    assert parse_duration(_default(serve, "grace"), "grace") == DEFAULT_GRACE_SECONDS
    assert ServeOptions.__dataclass_fields__["grace_seconds"].default == DEFAULT_GRACE_SECONDS
    assert _default(Daemon, "grace_seconds") == DEFAULT_GRACE_SECONDS
    assert _default(NodeScheduler, "grace_seconds") == DEFAULT_GRACE_SECONDS
    # the supervisor's copy: it runs without importing the package
    assert supervisor.DEFAULT_GRACE_SECONDS == DEFAULT_GRACE_SECONDS


def test_serve_and_the_device_plugin_share_the_sharing_default() -> None:
    assert DEFAULT_SHARING is SharingMode.SOFT
    assert _default(serve, "sharing") == DEFAULT_SHARING.value
    assert ServeOptions.__dataclass_fields__["sharing"].default == DEFAULT_SHARING.value
    assert _default(Daemon, "sharing") == DEFAULT_SHARING.value
    assert _default(device_plugin, "sharing") == DEFAULT_SHARING.value


def test_serve_options_and_the_daemon_share_the_tick() -> None:
    assert ServeOptions.__dataclass_fields__["tick_seconds"].default == DEFAULT_TICK_SECONDS
    assert _default(Daemon, "tick_seconds") == DEFAULT_TICK_SECONDS


def test_the_deploy_manifests_use_the_default_split_count() -> None:
    assert _default(device_plugin, "split_count") == DEFAULT_SPLIT_COUNT
    values = yaml.safe_load((REPO / "deploy/helm/gpuslice/values.yaml").read_text(encoding="utf-8"))
    assert values["devicePlugin"]["splitCount"] == DEFAULT_SPLIT_COUNT
    manifest = list(yaml.safe_load_all((REPO / "deploy/kubernetes/40-device-plugin.yaml").read_text()))
    commands = [
        c["command"]
        for doc in manifest
        if doc and doc.get("kind") == "DaemonSet"
        for c in doc["spec"]["template"]["spec"]["containers"]
    ]
    [command] = [c for c in commands if "--split-count" in c]
    assert int(command[command.index("--split-count") + 1]) == DEFAULT_SPLIT_COUNT


def test_the_cli_the_api_and_the_job_spec_share_the_default_tenant() -> None:
    assert JobSpec(command=("true",)).tenant == DEFAULT_TENANT
    assert SubmitRequest.model_fields["tenant"].default == DEFAULT_TENANT
    assert _default(submit, "tenant") == DEFAULT_TENANT


def test_sim_openb_replays_the_bundled_default_trace() -> None:
    assert DEFAULT_TRACE in BUNDLED_TRACES
    assert _default(load_trace, "name") == DEFAULT_TRACE
    assert _default(openb, "trace") is None  # None: the command replays [DEFAULT_TRACE]
