"""Why a pod is where it is, for ``kubectl gpuslice why POD``: the scheduler's refusals of a pending pod
as its FailedScheduling events give them (newest first), or where it was bound and with what slice.

The refusal text is not made here. The extender posts 'gpuslice: 0/N nodes fit: …; closest: NODE
(amounts)' as a FailedScheduling Event (``extender.cluster.ClusterCache.explain``), and kube-scheduler
posts its own FailedScheduling with every filter's reasons and writes the same summary into the pod's
PodScheduled condition, which outlives the events (the API server drops events after an hour).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuslice.errors import InvalidRequest
from gpuslice.k8s.annotations import BIND_PHASE_FAILED, SCHEDULER_NAME, asks_for_gpuslice
from gpuslice.k8s.decision import ContainerDecision, Decision, MigChoice
from gpuslice.k8s.extender.cluster import pod_ask, pod_meta

__all__ = ["REFUSAL_REASON", "PodStory", "SchedulingEvent", "extender_scheduler", "pod_story"]

REFUSAL_REASON = "FailedScheduling"  # the Event reason of kube-scheduler's and the extender's refusals


@dataclass(frozen=True, slots=True)
class SchedulingEvent:
    reason: str
    source: str  # who posted it: gpuslice-extender, default-scheduler, gpuslice-scheduler …
    message: str
    count: int
    last_seen: datetime | None


@dataclass(frozen=True, slots=True)
class PodStory:
    """What ``why`` says about a pod. ``state``: pending, bound, ended, no-gpu (it asks for no
    gpuslice.io resource), unreadable (its ask or decision cannot be read: ``problem`` says why)."""

    namespace: str
    name: str
    state: str
    phase: str
    asks: str = ""
    node: str = ""
    slices: tuple[str, ...] = ()  # where it is held: "4096 MiB, 30 % of GPU 1"
    scheduler: str = ""
    condition: str = ""  # the PodScheduled condition's message while it is not scheduled
    events: tuple[SchedulingEvent, ...] = ()  # its FailedScheduling events, newest first
    problem: str = ""


def pod_story(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> PodStory:
    """``pod`` (API JSON) and the events about pods of its name (any uid: those of an earlier pod of
    the same name are left out)."""
    namespace, name, uid = pod_meta(pod)
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    node = str(spec.get("nodeName") or "")
    base = {"namespace": namespace, "name": name, "phase": phase, "node": node}
    base["scheduler"] = str(spec.get("schedulerName") or "default-scheduler")
    if not asks_for_gpuslice(pod):
        return PodStory(state="no-gpu", **base)
    try:
        asks = "; ".join(c.text() for c in pod_ask(pod).containers)
        decision = Decision.from_annotations((pod.get("metadata") or {}).get("annotations") or {})
    except InvalidRequest as err:
        return PodStory(state="unreadable", problem=str(err), **base)
    if phase in ("Succeeded", "Failed"):
        return PodStory(state="ended", asks=asks, **base)
    if node or decision is not None:
        base["node"] = node or (decision.node if decision else "")
        problem = ""
        if decision is None:
            problem = (
                f"bound without a gpuslice decision: its scheduler {base['scheduler']} did not ask gpuslice"
            )
        elif decision.phase == BIND_PHASE_FAILED:
            problem = "the device plugin could not honour its decision (bind-phase failed)"
        return PodStory(state="bound", asks=asks, slices=_held(decision), problem=problem, **base)
    mine = [e for e in events if _about(e, uid) and e.get("reason") == REFUSAL_REASON]
    told = sorted((_event(e) for e in mine), key=_newest_first)
    return PodStory(state="pending", asks=asks, condition=_unscheduled(status), events=tuple(told), **base)


def _held(decision: Decision | None) -> tuple[str, ...]:
    if decision is None:
        return ()
    slices = [c for c in decision.containers if not c.inside] or [decision]
    return tuple(_slice_text(s) for s in slices)


def _slice_text(held: Decision | ContainerDecision) -> str:
    """``MIG 1g.10gb on GPU 0 (start 4)`` / ``whole GPUs 0,1`` / ``4096 MiB, 30 % of GPU 1``."""
    mig: MigChoice | None = held.mig
    if mig is not None:
        return f"MIG {mig.profile} on GPU {mig.gpu_index} (start {mig.start})"
    gpus = ",".join(str(i) for i in held.gpu_indices) or "?"
    plural = "s" if len(held.gpu_indices) > 1 else ""
    if held.cores_percent >= 100 and not held.memory_mib:
        return f"whole GPU{plural} {gpus}"
    parts = [f"{held.memory_mib} MiB"] if held.memory_mib else []
    return f"{', '.join([*parts, f'{held.cores_percent} %'])} of GPU{plural} {gpus}"


def _about(event: Mapping[str, Any], uid: str) -> bool:
    """The event is about this pod: its uid, or none given (an event without one cannot be told apart)."""
    theirs = str((event.get("involvedObject") or {}).get("uid") or "")
    return not theirs or not uid or theirs == uid


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _event(event: Mapping[str, Any]) -> SchedulingEvent:
    """A core/v1 Event, written through that API (``lastTimestamp``, ``count``) or through
    events.k8s.io/v1 as kube-scheduler does (``eventTime``, ``series``, ``reportingComponent``)."""
    series = event.get("series") or {}
    # When it was last seen, the first of these that is set: a repeated events.k8s.io Event's series, a
    # core Event's lastTimestamp, an events.k8s.io Event's eventTime; when it was written, failing all.
    seen = [
        _time(series.get("lastObservedTime")),
        _time(event.get("lastTimestamp")),
        _time(event.get("eventTime")),
        _time((event.get("metadata") or {}).get("creationTimestamp")),
    ]
    count = event.get("count") or series.get("count") or 1
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
    return SchedulingEvent(
        reason=str(event.get("reason") or ""),
        source=str(source),
        message=str(event.get("message") or ""),
        count=int(count) if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1,
        last_seen=next((t for t in seen if t is not None), None),
    )


def _newest_first(event: SchedulingEvent) -> tuple[int, float]:
    return (0, -event.last_seen.timestamp()) if event.last_seen is not None else (1, 0.0)


def _unscheduled(status: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or []:
        if isinstance(condition, dict) and (condition.get("type"), condition.get("status")) == (
            "PodScheduled",
            "False",
        ):
            return str(condition.get("message") or condition.get("reason") or "")
    return ""


def extender_scheduler(story: PodStory) -> bool:
    """Does the pod name the kube-scheduler profile that calls the extender?"""
    return story.scheduler == SCHEDULER_NAME
