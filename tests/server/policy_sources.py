"""Queue policy programs the policy tests load into a server (test_policy_*.py): well-behaved ones that
read a map, and broken ones the guard must contain. Each is the text of a file; ``write`` saves one."""

from __future__ import annotations

from pathlib import Path

_HEAD = """
from __future__ import annotations

from typing import Any

from gpuslice.programs.api import Map, Priority, QueuedJob, QueueOps, QueueView
"""

# A tenant's jobs gain the levels an operator writes into ``boost`` (never above HIGH): the map changes
# the order on a running server.
BOOST = (
    '"""Tenant boost: a tenant\'s jobs gain the priority levels written into the boost map."""\n'
    + _HEAD
    + """

class TenantBoost(QueueOps):
    name = "tenant-boost"

    boost = Map(key=str, value=int, max_entries=64)

    def priority(self, view: QueueView, job: QueuedJob) -> int:
        own = int(job.spec.priority)
        return max(own, min(int(Priority.HIGH), own + self.boost.get(job.spec.tenant, 0)))
"""
)

# The next version: the same map (same name, same spec), so its entries are carried over; and a map
# ``starts`` it fills itself from on_started.
BOOST_V2 = (
    BOOST.replace('"tenant-boost"', '"tenant-boost-v2"')
    + """
    starts = Map(key=str, value=int, max_entries=64)

    def on_started(self, view: QueueView, job: QueuedJob) -> None:
        self.starts.update(job.spec.tenant, self.starts.get(job.spec.tenant, 0) + 1)
"""
)

# Same map name, another spec (float values): a fresh, empty map.
BOOST_FLOAT = (
    BOOST.replace("value=int", "value=float")
    .replace("self.boost.get(job.spec.tenant, 0)", "int(self.boost.get(job.spec.tenant, 0.0))")
    .replace('"tenant-boost"', '"tenant-boost-float"')
)

# Two well-behaved policies whose keys do not compare with each other (str vs float): a pass that mixed
# them would have to fall back to the default order, which the mechanism counts.
BY_TENANT_NAME = (
    '"""Tenants in alphabetical order."""\n'
    + _HEAD
    + """

class ByTenantName(QueueOps):
    name = "by-tenant-name"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (job.spec.tenant,)
"""
)
NEWEST_FIRST = (
    '"""Newest job first."""\n'
    + _HEAD
    + """

class NewestFirst(QueueOps):
    name = "newest-first"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        return (-float(job.seq),)
"""
)

# Broken at run time in the three ways the guard must contain; each passes the verifier.
RAISES = (
    '"""order_key raises."""\n'
    + _HEAD
    + """

class Raises(QueueOps):
    name = "raises"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        raise ValueError("this policy always fails")
"""
)
GARBAGE = (
    '"""order_key answers a list of strings, not a tuple."""\n'
    + _HEAD
    + """

class Garbage(QueueOps):
    name = "garbage"

    def order_key(self, view: QueueView, job: QueuedJob) -> Any:
        return ["first", "please"]
"""
)
SLOW = (
    '"""order_key takes far longer than any budget (a bounded loop, so the verifier accepts it)."""\n'
    + _HEAD
    + """

class Slow(QueueOps):
    name = "slow"

    def order_key(self, view: QueueView, job: QueuedJob) -> tuple[Any, ...]:
        total = 0
        for i in range(30_000_000):
            total += i
        return (total,)
"""
)

# Verified, but its __init__ fails: the swap must change nothing.
INIT_FAILS = (
    '"""__init__ divides by zero."""\n'
    + _HEAD
    + """

class InitFails(QueueOps):
    name = "init-fails"

    def __init__(self) -> None:
        self.scale = 1 // 0
"""
)

# Rejected by the verifier: imports os and loops with while.
REJECTED = '''"""Reads the environment and loops forever."""
import os

from gpuslice.programs.api import QueueOps


class Sneaky(QueueOps):
    name = "sneaky"

    def priority(self, view, job):
        while True:
            os.environ.get("HOME")
'''


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(source)
    return path
