"""A real Kubernetes node on this machine for the end-to-end tests: containerd (Debian's package) with
runc or crun, and the upstream kubelet built by ``scripts/k8s-e2e``, registered with a ``ControlPlane``.

What it takes from the machine, and how it keeps out of the way of everything else on it:

* containerd runs with its own root, state, socket and runc root under the node's temp folder; the
  images come from ``images.build_images`` (no registry) through ``ctr -n k8s.io images import``.
* Pods use the host network, unless the node is given a ``PodNetwork`` (``network.py``: a bridge and
  Debian's CNI plugins). Without one, a CNI config file is written only so that containerd reports its
  network ready (the loopback network it adds needs no binary for such pods).
* The kubelet's cgroups live below this process's own memory cgroup (``cgroupRoot``), created here in
  every cgroup v1 hierarchy and removed again on stop; the host's hierarchies are never remounted.
  Kubernetes 1.35+ refuses cgroup v1 unless ``failCgroupV1: false``, which the configuration sets.
* The kubelet writes kernel sysctls it expects (``vm.overcommit_memory`` …) when they differ. It runs
  in a mount namespace of its own where those files are read-only bind mounts of the values it wants,
  so the shared machine's settings stay as they are. Its own folder is a shared mount, so the volumes
  it mounts there (Secrets, service-account tokens) reach containerd and the containers.
* The device-plugin registration socket is fixed by the kubelet at ``/var/lib/kubelet/device-plugins``:
  one such node per machine at a time.

``stop`` (the fixture calls it on success, failure and Ctrl-C) stops the kubelet, kills every process
left in the node's cgroups and every containerd shim of its socket, stops containerd, unmounts what is
mounted under its folder and removes its cgroups and the folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from controlplane import ControlPlane, Process, free_port, wait_http
from network import CNI_BIN, PodNetwork

__all__ = ["DEVICE_PLUGIN_DIR", "Node", "cgroup_v1_hierarchies", "node_ready"]

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # fixed in the kubelet
CGROUP_FS = Path("/sys/fs/cgroup")
# What the kubelet sets when it finds other values (container_manager_linux.go, setupKernelTunables).
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
_MNT_DETACH = 2


def cgroup_v1_hierarchies(*, unified: bool = False) -> dict[str, Path]:
    """Each mounted cgroup v1 hierarchy (by its controller option, e.g. ``memory``, ``name=systemd``)
    and its mount point, from /proc/self/mountinfo; with ``unified``, a hybrid host's cgroup2 mount too
    (as ``""``: runc makes its cgroups there as well)."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _source, options = right.split(" ")[:3]
        if fstype == "cgroup2" and unified:
            found[""] = Path(left.split(" ")[4])
        if fstype != "cgroup":
            continue
        controllers = [o for o in options.split(",") if o not in ("rw", "ro")]
        found[",".join(controllers)] = Path(left.split(" ")[4])
    return found


def node_ready(core: Any, name: str, *, untainted: bool = False) -> Any:
    """The Node ``name`` once its kubelet reports it Ready (and, with ``untainted``, once the node
    lifecycle controller lifted its not-ready taints too), else None; ``core`` a CoreV1Api."""
    from kubernetes import client

    try:
        node = core.read_node(name)
    except client.exceptions.ApiException as err:
        if err.status == 404:
            return None
        raise
    ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
    if ready is None or ready.status != "True" or (untainted and node.spec.taints):
        return None
    return node


def _claim_device_plugin_dir() -> None:
    """Refuse when another kubelet serves the fixed registration socket; forget a dead one's checkpoint
    (its pods do not exist on this node's fresh runtime)."""
    DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(DEVICE_PLUGIN_DIR / "kubelet.sock"))
        except OSError:
            pass
        else:
            raise RuntimeError(
                f"another kubelet serves {DEVICE_PLUGIN_DIR}/kubelet.sock: one e2e node per machine"
            )
    for stale in DEVICE_PLUGIN_DIR.iterdir():
        stale.unlink()


def _own_memory_cgroup() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return "/"


@dataclass
class Node:
    """One kubelet + containerd node named ``name`` on ``plane``; ``start`` brings it up Ready."""

    plane: ControlPlane
    name: str
    images: dict[str, Path]
    runtime: str = "runc"  # or "crun"
    taints: tuple[str, ...] = ()  # NoSchedule taint keys the kubelet registers the node with
    network: PodNetwork | None = None  # pods on a bridge (network.py); None: the host network only
    root: Path = Path()
    containerd: Process | None = None
    kubelet: Process | None = None
    cgroup_root: str = ""
    _cgroups: list[Path] = field(default_factory=list)  # created here, deepest last
    kubelet_port: int = 0
    healthz_port: int = 0

    def __post_init__(self) -> None:
        self.root = self.plane.root / f"node-{self.name}"

    # ---- paths ----------------------------------------------------------------------------------------

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"

    # ---- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        _claim_device_plugin_dir()
        self.start_runtime()
        try:
            self._make_cgroups()
            self.start_kubelet()
        except BaseException:
            self.stop()
            raise

    def start_runtime(self) -> None:
        """Only the node's containerd, with its images imported (``stop`` stops it): enough to run an
        image with ``ctr run`` and no kubelet."""
        try:
            self.root.mkdir(parents=True)
            self._start_containerd()
            for archive in self.images.values():
                self.ctr("images", "import", str(archive))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.kubelet is not None:
            self.plane.forget(self.kubelet)
            self.kubelet = None
        self._kill_cgroup_processes()
        self._kill_shims()
        if self.containerd is not None:
            self.plane.forget(self.containerd)
            self.containerd = None
        self._unmount_below(self.root)
        self._remove_cgroups()

    def container_log(self, namespace: str, pod: str, uid: str, container: str) -> str:
        """What the container wrote, from the CRI log files the runtime keeps for the kubelet
        (``<podLogsDir>/<namespace>_<pod>_<uid>/<container>/<restart>.log``, lines ``TIME STREAM TAG
        TEXT``; tag ``P`` marks a line the runtime split). The API server's log proxy cannot be used:
        it dials the node's address, which the kubelet will not let be loopback, and the kubelet here
        listens on loopback only."""
        folder = self.root / "pod-logs" / f"{namespace}_{pod}_{uid}" / container
        text = []
        for log in sorted(folder.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1):
            for line in log.read_text(errors="replace").splitlines():
                _time, _stream, tag, message = [*line.split(" ", 3), "", "", ""][:4]
                text.append(message if tag == "P" else message + "\n")
        return "".join(text)

    def running_containers(self) -> set[str]:
        """The IDs of the containers whose task runs in containerd now (``ctr tasks ls``)."""
        rows = [line.split() for line in self.ctr("tasks", "ls").stdout.splitlines()[1:]]
        return {row[0] for row in rows if len(row) >= 3 and row[2] == "RUNNING"}

    def run_image(self, image: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in a new container of ``image`` with ``ctr run --rm`` (no kubelet, no pod): host
        network, runc's state under the node's folder, its cgroup below this process's own."""
        name = f"run-{uuid.uuid4().hex[:8]}"
        cgroup = f"{_own_memory_cgroup().rstrip('/')}/gpuslice-e2e-{name}"
        return self.ctr(
            "run", "--rm", "--net-host", "--cgroup", cgroup,
            "--runc-binary", self.runtime, "--runc-root", str(self.root / "runtime"),
            image, name, *argv, check=False,
        )  # fmt: skip

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done

    # ---- containerd -----------------------------------------------------------------------------------

    def _start_containerd(self) -> None:
        for folder in ("cni/conf", "cni/bin"):
            (self.root / folder).mkdir(parents=True)
        if self.network is not None:
            (self.root / "cni/conf/10-bridge.conflist").write_text(self.network.conflist())
        else:
            (self.root / "cni/conf/10-hostnetwork.conflist").write_text(
                '{"cniVersion": "1.0.0", "name": "e2e-host", "plugins": [{"type": "loopback"}]}\n'
            )
        cni_bin = CNI_BIN if self.network is not None else self.root / "cni/bin"
        pause = next((name for name in self.images if "pause" in name), "none")  # CRI sandboxes only
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = self.root / "containerd.toml"
        config.write_text(
            f"""version = 2
root = "{self.root}/containerd/root"
state = "{self.root}/containerd/state"
[grpc]
  address = "{self.containerd_socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.root}/containerd/opt"
[{cri}]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # no CAP_SYS_RESOURCE here (a sandboxed machine): never set an OOM score below containerd's own
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{self.runtime}"
        Root = "{self.root}/runtime"
  [{cri}.cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{self.root}/cni/conf"
"""
        )
        self.containerd = self.plane.spawn(f"containerd-{self.name}", ["containerd", "--config", str(config)])
        deadline = time.monotonic() + 60
        while self.ctr("version", check=False).returncode != 0:
            if self.containerd.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not come up; log:\n{self.containerd.tail()}")
            time.sleep(0.2)

    def _kill_shims(self) -> None:
        """SIGKILL every containerd shim started for this node's socket (each runs in its own group)."""
        marker = str(self.containerd_socket).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and marker in argv:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)

    # ---- cgroups ----------------------------------------------------------------------------------------

    def _make_cgroups(self) -> None:
        """The kubelet's cgroupRoot below this process's memory cgroup, in every v1 hierarchy."""
        self.cgroup_root = (
            f"{_own_memory_cgroup().rstrip('/')}/gpuslice-e2e-{self.name}-{uuid.uuid4().hex[:6]}"
        )
        for controllers, mount in cgroup_v1_hierarchies().items():
            path = mount
            for part in self.cgroup_root.strip("/").split("/"):
                parent, path = path, path / part
                if path.exists():
                    continue
                path.mkdir()
                self._cgroups.append(path)
                if "cpuset" in controllers.split(","):  # a new cpuset is empty until given its parent's
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        (path / knob).write_text((parent / knob).read_text())

    def _node_cgroups(self) -> list[Path]:
        """Every cgroup of the node (the kubelet's and the containers'), deepest first."""
        found: list[Path] = []
        for mount in cgroup_v1_hierarchies(unified=True).values():
            top = mount / self.cgroup_root.strip("/")
            if self.cgroup_root and top.is_dir():
                found.extend(Path(p) for p, _d, _f in os.walk(top))
        return sorted(found, key=lambda p: len(p.parts), reverse=True)

    def _kill_cgroup_processes(self) -> None:
        for cgroup in self._node_cgroups():
            with contextlib.suppress(OSError):
                for pid in (cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)

    def _remove_cgroups(self) -> None:
        deadline = time.monotonic() + 20
        for cgroup in [*self._node_cgroups(), *reversed(self._cgroups)]:
            while cgroup.exists():
                try:
                    cgroup.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    self._kill_cgroup_processes()  # processes exit asynchronously after SIGKILL
                    time.sleep(0.1)
        self._cgroups.clear()

    @staticmethod
    def _unmount_below(folder: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        prefix = str(folder) + "/"
        points = [
            line.split(" ")[4].replace("\\040", " ")
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
        ]
        for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            libc.umount2(point.encode(), _MNT_DETACH)

    # ---- kubelet ----------------------------------------------------------------------------------------

    def kubelet_config(self) -> dict[str, Any]:
        """The KubeletConfiguration of this node (tests may read it; ``start_kubelet`` writes it)."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # this machine has cgroup v1 (Kubernetes 1.35+ refuses it otherwise)
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            # on a pod network the kubelet serves on the bridge's address, which is the node's address:
            # the API server dials it there for logs, exec and port-forward (loopback is refused as one)
            "address": self.network.gateway if self.network is not None else "127.0.0.1",
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            # loopback only: the API server reads logs without a client certificate
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "registerWithTaints": [{"key": t, "value": "true", "effect": "NoSchedule"} for t in self.taints],
            "podLogsDir": str(self.root / "pod-logs"),
            "failSwapOn": False,
            "maxPods": 250,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
            # a shared test machine: no eviction for disk or memory, no image garbage collection
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
        }

    def start_kubelet(self) -> Process:
        """Start (or restart, keeping its folder and ports) the kubelet; until its node is Ready."""
        if not self.kubelet_port:
            self.kubelet_port, self.healthz_port = free_port(), free_port()
        config = self.root / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config()))
        sysctl_dir = self.root / "sysctl"
        masks = []
        for key, value in KUBELET_SYSCTLS.items():
            if (Path("/proc/sys") / key).read_text().strip() != value:
                fake = sysctl_dir / key.replace("/", ".")
                fake.parent.mkdir(exist_ok=True)
                fake.write_text(value + "\n")
                masks.append(f"mount --bind -o ro {fake} /proc/sys/{key}")
        kubelet = [
            str(self.plane.bin / "kubelet"),
            "--config", str(config),
            "--kubeconfig", str(self.plane.kubeconfig),
            "--root-dir", str(self.kubelet_dir),
            "--hostname-override", self.name,
            *(["--node-ip", self.network.gateway] if self.network is not None else []),
            "--v", "2",
        ]  # fmt: skip
        script = " && ".join([*masks, 'exec "$@"'])
        self._share_kubelet_dir()
        self.kubelet = self.plane.spawn(
            f"kubelet-{self.name}",
            [
                "unshare",
                "--mount",
                "--propagation",
                "unchanged",
                "--",
                "sh",
                "-c",
                script,
                "kubelet",
                *kubelet,
            ],
        )
        wait_http(f"http://127.0.0.1:{self.healthz_port}/healthz", 120, proc=self.kubelet)
        return self.kubelet

    def _share_kubelet_dir(self) -> None:
        """Make the kubelet's folder a shared mount of its own, so that what the kubelet mounts below it
        in its namespace (the tmpfs of every Secret and service-account token volume) is seen by
        containerd, which bind-mounts those folders into containers from this namespace. Everything
        else stays private: the sysctl masks never leave the kubelet's namespace (``unshare
        --propagation unchanged`` keeps this machine's private mounts private)."""
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        mounted = {line.split(" ")[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
        if str(self.kubelet_dir) not in mounted:
            subprocess.run(["mount", "--bind", str(self.kubelet_dir), str(self.kubelet_dir)], check=True)
            subprocess.run(["mount", "--make-shared", str(self.kubelet_dir)], check=True)

    def stop_kubelet(self, *, kill: bool = False) -> None:
        if self.kubelet is not None:
            if kill:
                self.kubelet.kill()
            self.plane.forget(self.kubelet)
            self.kubelet = None
