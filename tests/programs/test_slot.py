"""A policy slot swaps atomically, carries maps with the same spec, restores the default on unload or
detach, and reads and writes the loaded policy's maps."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpuslice.errors import InternalError, UserError
from gpuslice.policies.queue import QUEUE
from gpuslice.policies.queue.base import QueuedJob, QueueView, order_pending
from gpuslice.programs.guard import GuardConfig
from gpuslice.programs.loader import PolicyFamilyMismatch, PolicyInitError, load_file, load_source
from gpuslice.programs.maps import MapError
from gpuslice.programs.slot import NoPolicyLoaded, NoSuchMap, PolicySlot
from gpuslice.workload.job import JobSpec

ROOT = Path(__file__).resolve().parents[2]
SMALL_FIRST = ROOT / "examples/policies/small_first.py"

BOOST_V2 = """\
from typing import Any

from gpuslice.programs.api import Map, QueuedJob, QueueOps, QueueView


class V2(QueueOps):
    name = "v2"

    boost = Map(key=str, value=int, max_entries=256)
    seen = Map(key=str, value=int, max_entries=SIZE)

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (-self.boost.get(job.spec.tenant, 0),)
"""


def slot(events: list[str] | None = None) -> PolicySlot:
    return PolicySlot("queue", QUEUE["priority-fair"], on_event=None if events is None else events.append)


def test_empty_slot_holds_the_builtin_default() -> None:
    s = slot()
    assert s.current.name == "priority-fair"
    assert s.info() == {"family": "queue", "name": "priority-fair", "builtin": True, "detached": False}
    with pytest.raises(NoPolicyLoaded):
        s.unload()
    with pytest.raises(NoPolicyLoaded):
        s.map_dump("boost")


def test_swap_makes_the_file_active_and_unload_restores_the_default() -> None:
    events: list[str] = []
    s = slot(events)
    s.swap(load_file(SMALL_FIRST))
    info = s.info()
    assert (info["name"], info["builtin"], info["detached"], info["faults"]) == (
        "small-first",
        False,
        False,
        {},
    )
    assert info["maps"] == {"boost": {"key": "str", "value": "int", "max_entries": 256, "entries": 0}}
    assert s.current.name == "small-first" and len(info["sha256"]) == 64
    s.unload()
    assert s.current.name == "priority-fair" and s.info()["builtin"]
    assert events[0].startswith("policy small-first (queue) loaded from") and "unloaded" in events[1]


def test_maps_are_read_and_written_by_name_with_text_parsed_as_their_types() -> None:
    s = slot()
    s.swap(load_file(SMALL_FIRST))
    s.map_update("boost", "alice", "2")
    assert s.map_get("boost", "alice") == 2 and s.map_dump("boost") == [("alice", 2)]
    assert s.map_delete("boost", "alice") and s.map_get("boost", "alice") is None
    with pytest.raises(MapError, match="not a int"):
        s.map_update("boost", "alice", "lots")
    with pytest.raises(NoSuchMap, match="its maps: boost"):
        s.map_get("freq", "1")


def test_a_swap_carries_maps_of_the_same_name_and_spec_and_starts_the_others_empty() -> None:
    events: list[str] = []
    s = slot(events)
    s.swap(load_file(SMALL_FIRST))
    s.map_update("boost", "bob", "3")
    s.swap(load_source(BOOST_V2.replace("SIZE", "8"), "v2.py"))
    assert s.map_dump("boost") == [("bob", 3)] and s.map_dump("seen") == []
    assert events[-1].endswith("maps carried over: boost")
    s.map_update("seen", "x", "1")
    s.swap(load_source(BOOST_V2.replace("SIZE", "16"), "v3.py"))  # same name, other spec: not carried
    assert s.map_dump("seen") == [] and s.map_dump("boost") == [("bob", 3)]


def test_a_failed_swap_leaves_the_active_policy_unchanged() -> None:
    s = slot()
    s.swap(load_file(SMALL_FIRST))
    before = s.current
    with pytest.raises(PolicyFamilyMismatch):
        s.swap(load_file(ROOT / "examples/policies/least_loaded.py"))
    broken = BOOST_V2.replace("SIZE", "8").replace(
        'name = "v2"', 'name = "v2"\n\n    def __init__(self):\n        raise ValueError("bad config")'
    )
    with pytest.raises(PolicyInitError, match="bad config"):
        s.swap(load_source(broken, "broken.py"))
    assert s.current is before and s.info()["name"] == "small-first"


def test_repeated_faults_detach_the_policy_and_the_slot_restores_the_default() -> None:
    raising = BOOST_V2.replace("SIZE", "8").replace(
        "return (-self.boost.get(job.spec.tenant, 0),)", "raise ValueError('bug')"
    )
    events: list[str] = []
    s = PolicySlot("queue", QUEUE["priority-fair"], GuardConfig(max_faults=2), events.append)
    s.swap(load_source(raising, "raising.py"))
    view = QueueView(now=0.0)
    jobs = [QueuedJob(f"j{i}", JobSpec(command=("x",)), 0.0, i) for i in range(3)]
    with s.lock:
        order_pending(s.current, view, jobs)  # one call orders the whole queue: one fault
        assert s.info()["faults"] == {"order_key:exception": 1}
        order_pending(s.current, view, jobs)
    assert s.current.name == "priority-fair"  # detached after the second fault
    info = s.info()
    assert info["detached"] and info["faults"] == {"order_key:exception": 2}
    assert any("detached after 2 faults" in e for e in events)


def test_decisions_under_the_lock_never_see_half_a_swap() -> None:
    s = slot()
    loaded = [load_file(SMALL_FIRST), load_source(BOOST_V2.replace("SIZE", "8"), "v2.py")]
    view = QueueView(now=0.0)
    jobs = [QueuedJob(f"j{i}", JobSpec(command=("x",), gpus=1 + i % 2), 0.0, i) for i in range(8)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def decide() -> None:
        try:
            while not stop.is_set():
                with s.lock:
                    ops = s.current
                    order = order_pending(ops, view, jobs)
                    assert sorted(j.seq for j in order) == list(range(8))
                    assert s.current is ops
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    workers = [threading.Thread(target=decide) for _ in range(3)]
    for w in workers:
        w.start()
    for i in range(12):  # each swap starts the file's worker process (about half a second)
        s.swap(loaded[i % 2])
    stop.set()
    for w in workers:
        w.join()
    assert errors == [] and s.info()["faults"] == {}


def test_a_slot_for_a_family_that_does_not_exist_is_an_internal_error_never_a_user_error():
    with pytest.raises(InternalError, match="unknown policy family 'lottery'; known: placement") as raised:
        PolicySlot("lottery", default_factory=QUEUE["fifo"])
    assert not isinstance(raised.value, UserError)
