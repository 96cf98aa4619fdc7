"""Whether a node component is stopping because gpuslice is being removed, and what it then clears.

``helm uninstall`` (or ``kubectl delete -k``) deletes a DaemonSet first; the garbage collector then
deletes its pods, so each pod gets SIGTERM when its DaemonSet is gone already. A rolling update (a
``helm upgrade``) stops pods while their DaemonSet still exists, and so does a pod deleted by hand or a
node drained. So a component that is told its DaemonSet (``--daemonset NAMESPACE/NAME``, the chart
sets it) asks at shutdown: gone, or being deleted, means gpuslice is leaving this node, and the
component takes back what it wrote there; anything else (the DaemonSet present, or the API server not
answering) means it will be back, and everything stays.

What the device plugin takes back (``device_plugin.run``): its inventory annotation and feature
labels on the node, and its files in the state folder, unless a pod on the node still holds a slice
(its containers still read the shim and their job regions there). Its sockets it removes at every stop.

What the DRA driver takes back (``dra.driver.DraDriver.forget``): the node's ResourceSlices of its
driver (the pool is served no more), and, unless a claim is still prepared on the node, the idle MIG
instances it made, its CDI specs, its checkpoint and its state files. Its sockets it removes at every stop.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuslice.errors import UserError
from gpuslice.k8s import kube_client

__all__ = ["STATE_FOLDERS", "clear_state_folder", "daemonset_gone", "parse_owner", "remove_daemonsets"]

# What a node component writes in its state folder: the shim and its regions (``k8s.shim_mounts``),
# the soft cap (``node.enforcement.softcap_dir``), the stand-in device nodes of a simulated node.
STATE_FOLDERS = ("shim", "softcap", "dev")

log = logging.getLogger(__name__)


def clear_state_folder(state_dir: Path, own: Sequence[str] = ()) -> list[str]:
    """Remove gpuslice's folders (``STATE_FOLDERS``) and the component's ``own`` entries from
    ``state_dir``, then the folder itself if that leaves it empty (in a pod it is the hostPath volume's
    mount point: the host keeps it, empty). What was left, in words (for the log)."""
    for entry in (*STATE_FOLDERS, *own):
        path = state_dir / entry
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    others = sorted(p.name for p in state_dir.iterdir()) if state_dir.is_dir() else []
    if others:  # another component's files stay, and so does the folder
        return [f"{state_dir}: other files than this component's ({', '.join(others[:5])})"]
    with contextlib.suppress(OSError):
        state_dir.rmdir()
    return []


def parse_owner(value: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` of a DaemonSet; UserError for anything else."""
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise UserError(f"--daemonset {value!r}: write NAMESPACE/NAME, e.g. gpuslice/gpuslice-device-plugin")
    return namespace, name


def daemonset_gone(api_client: Any, namespace: str, name: str) -> bool:
    """True when the DaemonSet ``namespace/name`` does not exist or is being deleted; False when it
    exists, or when the API server cannot say (then nothing is cleared: it is only left behind)."""
    client = kube_client.kubernetes_client_module()
    try:
        found = client.AppsV1Api(api_client).read_namespaced_daemon_set(name, namespace)
    except Exception as err:  # a refusal, or the API server away: keep everything, as for an update
        if isinstance(err, client.exceptions.ApiException) and err.status == 404:
            return True
        log.warning(
            "cannot read DaemonSet %s/%s (%s): leaving this node's state in place", namespace, name, err
        )
        return False
    return found.metadata.deletion_timestamp is not None


def remove_daemonsets(api_client: Any, namespace: str, names: Sequence[str], timeout_s: float) -> list[str]:
    """Delete the DaemonSets ``names`` in the foreground (their pods stop while they still exist, being
    deleted, and their accounts may still act) and wait until they are gone; the ones still there when
    ``timeout_s`` runs out."""
    client = kube_client.kubernetes_client_module()
    apps = client.AppsV1Api(api_client)
    body = client.V1DeleteOptions(propagation_policy="Foreground")
    for name in names:
        try:
            apps.delete_namespaced_daemon_set(name, namespace, body=body)
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise
    deadline = time.monotonic() + timeout_s
    left = list(names)
    while left:
        left = [n for n in left if not _gone(apps, client, namespace, n)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return left


def _gone(apps: Any, client: Any, namespace: str, name: str) -> bool:
    try:
        apps.read_namespaced_daemon_set(name, namespace)
    except client.exceptions.ApiException as err:
        if err.status == 404:
            return True
        raise
    return False
