"""The error tree of ``gpuslice.errors``: every error a user can cause is in it, with one exit code and
one HTTP status per family."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import gpuslice
from gpuslice import errors
from gpuslice.errors import GpusliceError, InternalError, UserError, exit_code
from gpuslice.server.errors import http_status

# Exceptions that never reach a user, each for the reason errors.py gives.
OUTSIDE_THE_TREE = {
    "gpuslice.programs.guard.HookTimeout",
    "gpuslice.shim.region.RegionError",
    "gpuslice.shim.build.BuildError",
    "gpuslice.node.fake_load.OutOfMemory",
    "gpuslice.server.run._Stop",
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


def test_every_family_in_errors_py_is_drawn_in_its_docstring() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        if name != "exit_code":
            assert name in doc, name


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
            assert exit_code(cls.__new__(cls)) == 2, cls
    assert exit_code(InternalError("bug")) == 1
    assert exit_code(RuntimeError("bug")) == 1
