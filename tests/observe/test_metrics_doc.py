"""docs/metrics.md documents every metric the registries export, and nothing else: name, type, labels."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| `(gpuslice_[a-z_]+)` \| (\w+) \| ([^|]*) \|", line)
        if m:
            labels = frozenset(x.strip() for x in m.group(3).split(",") if x.strip())
            assert m.group(1) not in rows, f"{m.group(1)} is documented twice"
            rows[m.group(1)] = (m.group(2), labels)
    return rows


def test_every_exported_metric_is_documented_with_its_type_and_labels(exported_metrics):
    docs = documented()
    for name, (kind, labels) in exported_metrics.items():
        assert name in docs, f"{name} is exported but not in docs/metrics.md"
        assert docs[name] == (kind, labels), f"{name}: docs say {docs[name]}, registry has {(kind, labels)}"


def test_no_documented_metric_is_stale(exported_metrics):
    stale = set(documented()) - set(exported_metrics)
    assert not stale, f"documented but no longer exported: {sorted(stale)}"


def test_names_follow_prometheus_conventions(exported_metrics):
    for name, (kind, _labels) in exported_metrics.items():
        assert name.startswith("gpuslice_")
        assert (kind == "counter") == name.endswith("_total"), name
        not_base = re.search(r"_(ms|milliseconds|percent|kb|mb|gb|mib|gib)(_|$)", name)
        assert not not_base, f"{name}: not in a base unit"
