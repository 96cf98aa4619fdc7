"""Objects a reader can see whole: in the packages listed below, a class owns the state it reads.

A class that reads ``self._x`` must set ``self._x`` itself (or define ``_x`` as a method or a class
attribute); a class that declares ``_x: T`` without a value says that someone else sets it, which is how a
mixin reaches into the object it is mixed into. Both are refused here, checked on the source. Collaborators
get what they need through their constructor instead (``server/daemon.py`` shows the pattern).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "gpuslice"
# The packages held to the rule; more join as their classes are made whole.
WHOLE = ("server", "k8s/extender")


def _declared_only(cls: ast.ClassDef, node: ast.stmt) -> str | None:
    """The name a class-level ``name: T`` without a value declares, outside dataclasses and typed
    records (whose fields are declared that way)."""
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is None):
        return None
    records = {"dataclass", "NamedTuple", "TypedDict", "Protocol", "BaseModel"}
    names = {getattr(d, "id", getattr(getattr(d, "func", None), "id", "")) for d in cls.decorator_list}
    bases = {getattr(b, "id", getattr(b, "attr", "")) for b in cls.bases}
    return None if (names | bases) & records else node.target.id


def borrowed_state(source: str, where: str) -> list[str]:
    """Every private attribute a class in ``source`` reads but never sets, and every one it declares for
    someone else to set."""
    problems = []
    for cls in (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)):
        own: set[str] = set()
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                own.add(node.name)
            elif isinstance(node, ast.Assign):
                own |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                own.add(node.target.id)
            declared = _declared_only(cls, node)
            if declared is not None:
                problems.append(f"{where}: {cls.name} declares {declared} for another class to set")
        attributes = [
            n
            for n in ast.walk(cls)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
        ]
        own |= {a.attr for a in attributes if isinstance(a.ctx, ast.Store)}
        for a in attributes:
            private = a.attr.startswith("_") and not a.attr.startswith("__")
            if isinstance(a.ctx, ast.Load) and private and a.attr not in own:
                problems.append(f"{where}: {cls.name} reads self.{a.attr}, which it never sets")
    return sorted(set(problems))


@pytest.mark.parametrize("package", WHOLE)
def test_every_class_sets_the_private_state_it_reads(package: str) -> None:
    problems = [
        p
        for path in sorted((SRC / package).rglob("*.py"))
        for p in borrowed_state(path.read_text(encoding="utf-8"), str(path.relative_to(SRC)))
    ]
    assert problems == []


def test_the_check_finds_a_mixin_that_reads_the_state_of_the_class_it_is_mixed_into() -> None:
    mixin = """
class Views:
    _lock: object

    def rows(self):
        with self._lock:
            return self._published
"""
    assert borrowed_state(mixin, "m.py") == [
        "m.py: Views declares _lock for another class to set",
        "m.py: Views reads self._lock, which it never sets",
        "m.py: Views reads self._published, which it never sets",
    ]


def test_the_check_lets_a_class_read_what_it_sets_and_a_dataclass_declare_fields() -> None:
    whole = """
from dataclasses import dataclass

@dataclass
class Row:
    _index: int

class Views:
    _limit = 3

    def __init__(self, lock):
        self._lock = lock

    def rows(self):
        with self._lock:
            return self._helper(self._limit)

    def _helper(self, n):
        return n
"""
    assert borrowed_state(whole, "m.py") == []
