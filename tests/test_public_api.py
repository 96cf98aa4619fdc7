"""The package root exports exactly its documented public names, and each one resolves."""

import importlib
import pkgutil

import gpuslice


def test_every_name_in_root_all_is_importable_from_the_root():
    missing = [name for name in gpuslice.__all__ if not hasattr(gpuslice, name)]
    assert missing == []


def test_root_all_lists_the_core_api():
    expected = {"Ledger", "Placement", "Refusal", "Request", "NodeSpec", "PLACEMENT", "Placer", "parse_size"}
    assert expected <= set(gpuslice.__all__)


def test_every_module_declares_all_and_its_names_exist():
    problems = []
    for info in pkgutil.walk_packages(gpuslice.__path__, prefix="gpuslice."):
        module = importlib.import_module(info.name)
        names = getattr(module, "__all__", None)
        if names is None:
            problems.append(f"{info.name} has no __all__")
            continue
        problems += [f"{info.name}.{n} missing" for n in names if not hasattr(module, n)]
    assert problems == []
