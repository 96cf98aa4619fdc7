"""The error tree of ``gpuslice.errors``: every error a user can cause is in it, with one exit code and
one HTTP status per family."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import gpuslice
from gpuslice import errors
from gpuslice.errors import GpusliceError, InternalError, UserError, exit_code
from gpuslice.server.errors import http_status

# Exceptions that never reach a user, each for the reason errors.py gives.
OUTSIDE_THE_TREE = {
    "gpuslice.programs.hook_runner.HookTimeout",
    "gpuslice.shim.region.RegionError",
    "gpuslice.shim.build.BuildError",
    "gpuslice.node.fake_load.OutOfMemory",
    "gpuslice.server.run._Stop",
    "gpuslice.k8s.node_lock.NodeLockConflict",
    "gpuslice.node.private_files.UnsafeFile",
    "gpuslice.node.proctree.ContainmentUnavailable",
}


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(gpuslice.__path__, "gpuslice."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[name] for name in sorted(found)]


CLASSES = _exception_classes()


def test_the_walk_finds_the_errors_of_every_layer() -> None:
    modules = {cls.__module__.split(".")[1] for cls in CLASSES}
    assert {"errors", "hardware", "server", "programs", "node", "k8s", "estimate", "memory"} <= modules
    assert len(CLASSES) > 40


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_error_is_in_the_tree_or_named_as_outside_it(cls: type[BaseException]) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    assert issubclass(cls, GpusliceError) != (name in OUTSIDE_THE_TREE), name


def _drawn_tree(doc: str) -> dict[str, tuple[str, str | None]]:
    """{class name: (module, parent name)} as drawn in the first ``text`` block of ``doc``.

    A node line is ``├─ Name[, Name …] [(module)]``, then two spaces and its description; its depth is
    where the branch mark stands, its parent the last node one level up."""
    block = doc[doc.index("```text") + len("```text") : doc.index("```", doc.index("```text") + 7)]
    drawn: dict[str, tuple[str, str | None]] = {}
    parents: list[str] = []
    for line in block.strip("\n").splitlines():
        mark = min((i for i in (line.find("├─"), line.find("└─")) if i >= 0), default=-1)
        depth = 0 if mark < 0 else mark // 3 + 1
        spec = (line if mark < 0 else line[mark + 2 :]).strip().split("  ")[0]
        if mark < 0 and depth == 0 and parents:
            raise AssertionError(f"a second root or a line without a branch mark: {line!r}")
        found = re.fullmatch(r"([A-Z]\w*(?:, [A-Z]\w*)*)(?: \(([\w.]+)\))?", spec)
        assert found, f"not a node line: {line!r}"
        names = found[1].split(", ")
        module = f"gpuslice.{found[2]}" if found[2] else "gpuslice.errors"
        parent = parents[depth - 1] if depth else None
        for name in names:
            assert name not in drawn, f"{name} is drawn twice"
            drawn[name] = (module, parent)
        parents[depth:] = [names[0]]
    return drawn


DRAWN = _drawn_tree(errors.__doc__ or "")


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_every_class_drawn_in_the_tree_exists_where_it_says_under_the_parent_it_says(name: str) -> None:
    module, parent = DRAWN[name]
    cls = getattr(importlib.import_module(module), name, None)
    assert inspect.isclass(cls) and cls.__module__ == module, f"{name} is not defined in {module}"
    if parent is None:
        assert cls is GpusliceError
    else:
        assert parent in {base.__name__ for base in cls.__bases__}, f"{name}'s bases: {cls.__bases__}"


IN_TREE = [c for c in CLASSES if issubclass(c, GpusliceError)]


@pytest.mark.parametrize("cls", IN_TREE, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_error_class_of_the_package_is_drawn_in_the_tree(cls: type[BaseException]) -> None:
    assert DRAWN.get(cls.__name__, ("",))[0] == cls.__module__, f"{cls.__name__} is not drawn in errors.py"


def test_the_tree_parser_reads_depth_parents_and_modules() -> None:
    doc = "```text\nGpusliceError\n├─ UserError   text\n│  ├─ A, B (x.y)\n│  └─ C\n└─ InternalError\n```"
    assert _drawn_tree(doc) == {
        "GpusliceError": ("gpuslice.errors", None), "UserError": ("gpuslice.errors", "GpusliceError"),
        "A": ("gpuslice.x.y", "UserError"), "B": ("gpuslice.x.y", "UserError"),
        "C": ("gpuslice.errors", "UserError"), "InternalError": ("gpuslice.errors", "GpusliceError"),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("JobNotFound", 404),
        ("GpuNotFound", 404),
        ("PolicyNotFound", 404),
        ("NoSuchMap", 404),
        ("NoPolicyLoaded", 404),
        ("JobConflict", 409),
        ("NotAuthenticated", 401),
        ("ForbiddenUser", 403),
        ("TooManyFollowers", 429),
        ("PolicyRejected", 422),
        ("InvalidRequest", 400),
        ("UnknownPolicy", 400),
        ("UnknownMigProfile", 400),
        ("MpsUnavailable", 400),
        ("ServerError", 400),
    ],
)
def test_each_server_facing_error_keeps_its_http_status(name: str, status: int) -> None:
    [cls] = [c for c in CLASSES if c.__name__ == name]
    assert http_status(cls.__new__(cls)) == status


def test_a_field_error_says_its_own_status() -> None:
    from gpuslice.server.models import FieldError

    assert http_status(FieldError("env", "too long", http_status=422)) == 422
    assert http_status(FieldError("env", "bad")) == 400


def test_user_errors_exit_2_and_everything_else_exits_1() -> None:
    for cls in CLASSES:
        if issubclass(cls, UserError):
            own = getattr(cls, "exit_status", None)  # drawn in the tree: PortTaken exits 3, as uvicorn;
            assert exit_code(cls.__new__(cls)) == (own or 2), cls  # OutcomeUnknown 4 (answer lost)
    assert [c.__name__ for c in CLASSES if getattr(c, "exit_status", None)] == ["OutcomeUnknown", "PortTaken"]
    assert exit_code(InternalError("bug")) == 1
    assert exit_code(RuntimeError("bug")) == 1
