"""The end-to-end fixtures (``e2e_helpers``): a real control plane and gpuslice's processes on it; and
(``node_helpers``) a real kubelet + containerd node with the device plugin on it."""

import pytest
from e2e_helpers import api_client, core, namespace, plane, stack
from node_helpers import device_plugin, node, node_namespace

__all__ = ["api_client", "core", "device_plugin", "namespace", "node", "node_namespace", "plane", "stack"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The official client's connection pools and urllib's TLS sockets are closed by the garbage
    # collector in these long-lived sessions; that is not what these tests are about.
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"))
        item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))
