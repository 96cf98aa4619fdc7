"""``gpuslice k8s device-plugin`` end to end, with no cluster: the CLI function runs in a child process
against a fake kubelet (gRPC on a unix socket) and a fake API server (HTTP) that the official
``kubernetes`` client talks to through a kubeconfig. Also ``serve`` in-process on a simulated MIG node.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from test_device_plugin import TIMEOUT_S, FakeApi, FakeKubelet, wait_until

from gpuslice.errors import UserError
from gpuslice.k8s.annotations import (
    ANNOTATION_BIND_PHASE,
    ANNOTATION_NODE_INVENTORY,
    BIND_PHASE_ALLOCATED,
    RESOURCE_GPU,
    NodeInventory,
    mig_resource,
)
from gpuslice.k8s.decision import Decision
from gpuslice.k8s.device_plugin import NodeKubeClient, parse_mig_layouts, serve
from gpuslice.k8s.proto import deviceplugin_pb2 as pb
from gpuslice.node.discovery import discover

NODE = "node-a"


class FakeApiServer:
    """The three API calls the device plugin makes, answered like kube-apiserver would.

    GET /api/v1/pods?fieldSelector=… lists the stored pods bound to the selected node in phase Pending;
    PATCH of a pod or node merges metadata.annotations (merge-patch or strategic-merge-patch only: an
    object sent as application/json-patch+json gets the 400 a real API server gives).
    """

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.node_annotations: dict[str, str] = {}
        self.node_version = 1  # the Node's resourceVersion: a PATCH that names another gets 409
        self.requests: list[tuple[str, str, str]] = []  # (method, path with query, content type)
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def add_pod(
        self, namespace: str, name: str, annotations: dict[str, str], node: str = NODE, gpus: int = 1
    ) -> None:
        container: dict[str, Any] = {"name": "main", "image": "cuda"}
        if gpus:
            container["resources"] = {"limits": {"gpuslice.io/gpu": str(gpus)}}
        self.pods[(namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "annotations": dict(annotations),
            },
            "spec": {"nodeName": node, "containers": [container]},
            "status": {"phase": "Pending"},
        }

    def _node(self, name: str) -> dict[str, Any]:
        meta = {
            "name": name,
            "annotations": dict(self.node_annotations),
            "resourceVersion": str(self.node_version),
        }
        return {"apiVersion": "v1", "kind": "Node", "metadata": meta}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                server.requests.append(("GET", self.path, ""))
                if url.path.startswith("/api/v1/nodes/"):
                    return self._send(200, server._node(url.path.rsplit("/", 1)[1]))
                if url.path != "/api/v1/pods":
                    return self._send(404, {"kind": "Status", "code": 404})
                selector = dict(
                    term.split("=", 1) for term in parse_qs(url.query)["fieldSelector"][0].split(",")
                )
                items = [
                    pod
                    for pod in server.pods.values()
                    if pod["spec"]["nodeName"] == selector["spec.nodeName"]
                    and pod["status"]["phase"] == selector.get("status.phase", pod["status"]["phase"])
                ]
                self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})

            def do_PATCH(self) -> None:
                content_type = self.headers.get("Content-Type", "")
                server.requests.append(("PATCH", self.path, content_type))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if "merge-patch" not in content_type:
                    return self._send(400, {"kind": "Status", "code": 400, "message": "bad patch type"})
                annotations = body["metadata"]["annotations"]
                parts = self.path.strip("/").split("/")  # api v1 namespaces NS pods NAME | api v1 nodes NAME
                if parts[2] == "nodes":
                    version = body["metadata"].get("resourceVersion")
                    if version is not None and version != str(server.node_version):
                        return self._send(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
                    for key, value in annotations.items():
                        if value is None:  # merge patch: null deletes the key
                            server.node_annotations.pop(key, None)
                        else:
                            server.node_annotations[key] = value
                    server.node_version += 1
                    return self._send(200, server._node(parts[3]))
                pod = server.pods[(parts[3], parts[5])]
                pod["metadata"]["annotations"].update(annotations)
                self._send(200, pod)

        return Handler


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    fake = FakeApiServer()
    fake.thread.start()
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "plugin", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "plugin"}}],
                "current-context": "fake",
            }
        )
    )
    return path


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    socket_dir = tmp_path / "dp"
    socket_dir.mkdir()
    fake = FakeKubelet(socket_dir)
    fake.start()
    yield fake
    fake.stop()


def test_cli_serves_the_kubelet_and_allocates_from_the_api_servers_pod(tmp_path, kubelet, apiserver):
    """The whole path: discover(simulate) -> NodeKubeClient over HTTP -> Register -> Allocate -> patch."""
    script = (
        "import typer; from gpuslice.cli.k8s_device_plugin import device_plugin; typer.run(device_plugin)"
    )
    args = ["--simulate", "dgx-h100", "--split-count", "2", "--socket-dir", str(kubelet.socket_dir)]
    args += ["--node-name", NODE, "--kubeconfig", str(kubeconfig(tmp_path / "kc.json", apiserver.url))]
    args += ["--state-dir", str(tmp_path / "state"), "--sharing", "soft"]
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        request = kubelet.requests.get(timeout=60)  # importing grpc, kubernetes and numpy takes a while
        assert request.resource_name == RESOURCE_GPU
        inventory = NodeInventory.from_json(apiserver.node_annotations[ANNOTATION_NODE_INVENTORY])
        assert len(inventory.gpus) == 8 and inventory.split_count == 2
        assert inventory.topology[0][1].startswith("NV")  # dgx-h100: NVSwitch between every pair

        uuid = inventory.gpus[5].uuid
        decision = Decision(NODE, "main", (5,), (uuid,), memory_mib=20480, cores_percent=50, bind_time=1)
        apiserver.add_pod("team-a", "llm", decision.to_annotations())
        stub = kubelet.dial(request.endpoint)
        ids = pb.ContainerAllocateRequest(devices_ids=[f"{inventory.gpus[5].uuid}::1"])
        response = stub.Allocate(pb.AllocateRequest(container_requests=[ids]), timeout=TIMEOUT_S)
        env = dict(response.container_responses[0].envs)
        assert env["CUDA_VISIBLE_DEVICES"] == uuid
        assert env["GPUSLICE_COMPUTE_PERCENT"] == "50"
        assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(20480 * 2**20)
        assert apiserver.pods[("team-a", "llm")]["metadata"]["annotations"][ANNOTATION_BIND_PHASE] == (
            BIND_PHASE_ALLOCATED
        )
        assert ("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}%2Cstatus.phase%3DPending", "") in (
            apiserver.requests
        )
        assert all("merge-patch" in ct for method, _, ct in apiserver.requests if method == "PATCH")
    finally:
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err.decode()[-2000:]
    assert "gpuslice device plugin on node node-a: gpuslice.io/gpu (16 devices)" in out.decode()
    assert not (kubelet.socket_dir / "gpuslice-gpu.sock").exists()


def test_kube_api_lists_only_pods_waiting_in_bind_phase_allocating(tmp_path, apiserver):
    api = NodeKubeClient(str(kubeconfig(tmp_path / "kc.json", apiserver.url)))
    apiserver.add_pod("a", "waiting", Decision(NODE, "main", (0,), ("GPU-x",)).to_annotations())
    apiserver.add_pod(
        "a", "done", Decision(NODE, "main", (1,), ("GPU-y",), phase="allocated").to_annotations()
    )
    apiserver.add_pod("a", "plain", {}, gpus=0)
    apiserver.add_pod("a", "by-hand", {})  # asks for a GPU, bound without the extender
    apiserver.add_pod(
        "a", "elsewhere", Decision("node-b", "main", (0,), ("GPU-z",)).to_annotations(), "node-b"
    )
    pods = api.allocating_pods(NODE)
    api.close()
    got = sorted((p.name, p.uid, p.decision.gpu_uuids if p.decision else None) for p in pods)
    assert got == [("by-hand", "uid-by-hand", None), ("waiting", "uid-waiting", ("GPU-x",))]


def test_kube_api_lists_the_nodes_pods_that_have_not_ended_from_the_watch_cache(tmp_path, apiserver):
    api = NodeKubeClient(str(kubeconfig(tmp_path / "kc.json", apiserver.url)))
    phases = {"starting": "Pending", "running": "Running", "done": "Succeeded", "oom": "Failed"}
    for name, phase in phases.items():
        apiserver.add_pod("a", name, {})
        apiserver.pods[("a", name)]["status"]["phase"] = phase
    apiserver.add_pod("a", "elsewhere", {}, "node-b")
    uids = api.live_pod_uids(NODE)
    api.close()
    assert uids == {"uid-starting", "uid-running"}
    (listed,) = [path for method, path, _ in apiserver.requests if method == "GET"]
    assert "resourceVersion=0" in listed  # the metrics list at every scrape: never an etcd read


def test_kube_api_releases_only_its_pods_node_lock_with_the_resource_version(tmp_path, apiserver):
    from gpuslice.k8s.node_lock import ANNOTATION_NODE_LOCK, LockHolder, holders_text

    api = NodeKubeClient(str(kubeconfig(tmp_path / "kc.json", apiserver.url)))
    apiserver.node_annotations[ANNOTATION_NODE_LOCK] = holders_text([LockHolder("uid-a", "ns", "a", 100.0)])
    apiserver.node_annotations["other"] = "kept"
    assert not api.release_node_lock(NODE, "uid-b")  # someone else's lock stays
    assert ANNOTATION_NODE_LOCK in apiserver.node_annotations
    assert api.release_node_lock(NODE, "uid-a")
    api.close()
    assert apiserver.node_annotations == {"other": "kept"}
    (patch,) = [r for r in apiserver.requests if r[0] == "PATCH"]
    assert patch[1] == f"/api/v1/nodes/{NODE}" and "merge-patch" in patch[2]


def test_serve_on_a_simulated_mig_node_advertises_the_default_instances(tmp_path):
    socket_dir = tmp_path / "dp"
    socket_dir.mkdir()
    kubelet = FakeKubelet(socket_dir)
    kubelet.start()
    api, stop, ready = FakeApi(), threading.Event(), threading.Event()
    machine = discover("dgx-a100:mig")
    thread = threading.Thread(
        target=serve,
        args=(machine, NODE),
        kwargs={
            "simulated": True,
            "pods": api,
            "node": api,
            "socket_dir": socket_dir,
            "state_dir": tmp_path / "state",
            "stop": stop,
            "on_ready": lambda plugin: ready.set(),
        },
    )
    thread.start()
    try:
        assert ready.wait(TIMEOUT_S)
        assert kubelet.next_request().resource_name == mig_resource("3g.40gb")
        gpus = api.inventory().gpus
        assert [[(s.profile, s.start) for s in g.mig] for g in gpus] == [[("3g.40gb", 0), ("3g.40gb", 4)]] * 8
    finally:
        stop.set()
        thread.join(timeout=TIMEOUT_S)
        kubelet.stop()
    assert not thread.is_alive()
    assert wait_until(lambda: not (socket_dir / "gpuslice-mig-3g.40gb.sock").exists())


def test_mig_layout_option_is_checked_against_the_machine():
    machine = discover("dgx-a100:mig")
    layouts = parse_mig_layouts(machine, ["1=7g.80gb@0/0"])
    assert [str(i) for i in layouts[1].instances] == ["7g.80gb@0/0"]
    with pytest.raises(UserError, match="GPU=LAYOUT"):
        parse_mig_layouts(machine, ["7g.80gb@0"])
    with pytest.raises(UserError, match="not a MIG-mode GPU"):
        parse_mig_layouts(discover("dgx-h100"), ["0=1g.10gb@0"])
