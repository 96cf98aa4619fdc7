"""deploy/grafana/gpuslice.json: every query is valid PromQL (checked by promtool as recording rules)
and uses only metrics gpuslice exports; panels have unique ids and do not overlap."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from test_alert_rules import SUFFIXES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpuslice.json"


def panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def queries() -> list[str]:
    return [t["expr"] for p in panels() for t in p.get("targets", [])]


def test_every_queried_metric_is_exported(exported_metrics):
    used = {m for q in queries() for m in re.findall(r"\b(gpuslice_[a-z_]+)", q)}
    assert len(used) >= 15
    for name in used:
        base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
        assert name in exported_metrics or base in exported_metrics, f"{name} is not a gpuslice metric"


def test_the_dashboard_covers_the_views_of_the_web_dashboard():
    text = " ".join(queries())
    for metric in (
        "gpuslice_gpu_utilization_ratio",
        "gpuslice_slice_memory_used_bytes",
        "gpuslice_pending_jobs",
        "gpuslice_scheduling_latency_seconds_bucket",
        "gpuslice_enforcement_actions_total",
        "gpuslice_gpu_healthy",
    ):
        assert metric in text


def test_the_dashboard_shows_the_cluster_from_the_ledgers_and_the_pods_on_nodes():
    text = " ".join(queries())
    for metric in (
        "gpuslice_cluster_node_gpus_allocated",
        "gpuslice_cluster_node_gpu_unallocated_ratio",
        "gpuslice_cluster_node_gpu_fragmentation_ratio",
        "gpuslice_cluster_node_gpu_memory_allocated_bytes",
        "gpuslice_cluster_pending_pods",
        "gpuslice_cluster_pending_longest_wait_seconds",
        "gpuslice_cluster_preemptions_total",
        "gpuslice_pod_memory_used_bytes",
        "gpuslice_pod_memory_limit_bytes",
        "gpuslice_pod_compute_busy_seconds_total",
        "gpuslice_pod_compute_limit_ratio",
        "gpuslice_pod_oom_refusals_total",
        "gpuslice_node_plugin_registered",
    ):
        assert metric in text, metric


def test_every_query_is_valid_promql(tmp_path, external_tool):
    # $instance is a Grafana variable; as a regex matcher any value is valid PromQL.
    rules = [{"record": f"gpuslice:dashboard_query_{i}", "expr": q.replace("$instance", ".*")}
             for i, q in enumerate(queries())]  # fmt: skip
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool = external_tool("promtool", "Debian: apt install prometheus")
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_panels_have_unique_ids_a_datasource_and_do_not_overlap():
    seen_ids = set()
    cells: set[tuple[int, int]] = set()
    for p in panels():
        assert p["id"] not in seen_ids
        seen_ids.add(p["id"])
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
