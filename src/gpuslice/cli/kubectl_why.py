"""``kubectl gpuslice why POD``: why a pod waits (its FailedScheduling refusals with their amounts,
newest first), or where it runs and with which slice, or that it asks for no GPU."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Mapping
from typing import Annotated, Any

import typer
from rich.text import Text

from gpuslice.cli.kubectl_view import (
    ContextOption,
    NamespaceOption,
    Output,
    OutputOption,
    connect,
    out,
    pod_name,
    print_json,
    text,
)
from gpuslice.cli.options import KubectlKubeconfigOption
from gpuslice.errors import NotFound
from gpuslice.k8s.pending_reason import PodStory, extender_scheduler, pod_story

__all__ = ["why"]


def why(
    pod: Annotated[str, typer.Argument(help="the pod's name", callback=pod_name)],
    kubeconfig: KubectlKubeconfigOption = None,
    context: ContextOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Why a pod waits: the scheduler's refusals with their amounts, newest first, from its
    FailedScheduling events; or where it runs and with which slice, or that it asks for no GPU.

    Example: kubectl gpuslice why train-7 -n team-a
    """
    with connect(kubeconfig, context) as (reads, default_namespace):
        scope = namespace or default_namespace
        try:
            found = reads.pod(scope, pod)
        except NotFound:
            raise NotFound(f"pod {pod} not found in namespace {scope}") from None
        events = reads.events(scope, pod) if _pending(found) else []
    story = pod_story(found, events)
    if output is Output.json:
        print_json(_story_json(story))
        return
    for line in _story_lines(story):
        out.print(line, soft_wrap=False)


def _pending(pod: Mapping[str, Any]) -> bool:
    return not (pod.get("spec") or {}).get("nodeName")


def _story_lines(story: PodStory) -> list[Text]:
    who = f"pod {story.namespace}/{story.name}"
    if story.state == "no-gpu":
        return [text(f"{who} does not ask for a GPU: no container names a gpuslice.io resource.")]
    if story.state == "unreadable":
        return [text(f"{who}: its gpuslice ask or decision cannot be read: {story.problem}")]
    if story.state == "ended":
        return [text(f"{who} has ended ({story.phase}); it asked for {story.asks}.")]
    if story.state == "bound":
        held = "; ".join(story.slices) or "no gpuslice slice"
        lines: list[Text] = [
            text(f"{who} is not pending: bound to node {story.node} with {held} ({story.phase}).")
        ]
        return lines + ([text(story.problem, style="yellow")] if story.problem else [])
    lines = [text(f"{who} is pending; it asks for {story.asks}.")]
    if not story.events:
        lines.append(text("No FailedScheduling event about it (events are kept for an hour)."))
    for event in story.events:
        seen = _age(event.last_seen.timestamp()) if event.last_seen else "at an unknown time"
        times = f", {event.count} times" if event.count > 1 else ""
        lines.append(
            text(f"{event.reason} from {event.source or 'an unnamed source'}, {seen}{times}:", "bold")
        )
        # indented, every wrapped line too, and whole words: an amount is never split
        width = max(20, out.width - 2)
        wrapped = textwrap.wrap(event.message, width, break_long_words=False, break_on_hyphens=False)
        lines += [text(f"  {part}") for part in wrapped]
    if story.condition and not story.events:
        lines.append(text(f"Its PodScheduled condition: {story.condition}"))
    if not extender_scheduler(story) and not any(e.source == "gpuslice-extender" for e in story.events):
        lines.append(
            text(
                f"Its scheduler is {story.scheduler}, not gpuslice's: the gpuslice extender is not asked "
                "about it (gpuslice's admission webhook sets it on pods that ask for gpuslice.io resources).",
                style="yellow",
            )
        )
    return lines


def _age(timestamp: float) -> str:
    seconds = max(0, int(time.time() - timestamp))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _story_json(story: PodStory) -> dict[str, Any]:
    return {
        "namespace": story.namespace,
        "name": story.name,
        "state": story.state,
        "phase": story.phase,
        "asks": story.asks or None,
        "node": story.node or None,
        "slices": list(story.slices),
        "scheduler": story.scheduler,
        "condition": story.condition or None,
        "events": [
            {
                "reason": e.reason,
                "source": e.source,
                "message": e.message,
                "count": e.count,
                "lastSeen": e.last_seen.isoformat() if e.last_seen else None,
            }
            for e in story.events
        ],
        "problem": story.problem or None,
    }
