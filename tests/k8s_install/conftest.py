"""The install tests' fixtures (``install_helpers``): a plane with pod networking, a real node, the chart."""

import pytest
from install_helpers import cluster, installed, user_namespace

__all__ = ["cluster", "installed", "user_namespace"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # as in tests/k8s_e2e: the client's pools are closed by the garbage collector
        item.add_marker(pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"))
        item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))
