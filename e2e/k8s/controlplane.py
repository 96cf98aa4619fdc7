"""A real Kubernetes control plane on 127.0.0.1 for the end-to-end tests: etcd, kube-apiserver,
kube-scheduler, all upstream binaries built by ``scripts/k8s-e2e`` (``e2e/k8s/``).

What runs and what does not:

* etcd (one member, no fsync: test data), kube-apiserver (RBAC, the default admission plugins with
  MutatingAdmissionWebhook on, ServiceAccount admission off because no controller-manager creates the
  ``default`` accounts), kube-scheduler with a KubeSchedulerConfiguration given by the test.
* No kube-controller-manager, no kubelet: Node objects are written by the tests as the device plugin
  and the kubelet would write them, and nothing runs the pods. A pod deleted with a grace period stays
  Terminating until something deletes it with grace 0 (the tests do what the kubelet would).

Every process runs in its own process group and is stopped (SIGTERM, then SIGKILL) by ``stop``; the
pytest fixture calls it on success, failure and Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "BIN_ENV",
    "FEATURE_GATES",
    "ControlPlane",
    "Process",
    "binaries_dir",
    "free_port",
    "wait_for",
    "wait_http",
]

BIN_ENV = "GPUSLICE_K8S_BIN"  # where scripts/k8s-e2e put kube-apiserver, kube-scheduler, kubectl, etcd, helm
ADMIN_TOKEN = "gpuslice-e2e-admin-token"  # a static token of system:masters, for the tests only
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kubectl", "helm")
# What gpuslice's DRA driver publishes needs (resource.k8s.io/v1 is served by default since v1.34):
# consumable capacity and partitionable devices are beta and on by default from v1.36; named here so
# that a version that turns them off fails loudly instead of dropping the fields it does not know.
FEATURE_GATES = "DRAConsumableCapacity=true,DRAPartitionableDevices=true"


def binaries_dir() -> Path | None:
    """The folder with every upstream binary, from $GPUSLICE_K8S_BIN; None when it is not there."""
    value = os.environ.get(BIN_ENV)
    if not value:
        return None
    folder = Path(value)
    return folder if all((folder / b).is_file() for b in BINARIES) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float, *, insecure: bool = False, proc: Process | None = None) -> None:
    """Until ``url`` answers 200 (``proc`` ended first, or ``timeout_s`` passed: RuntimeError)."""
    context = ssl._create_unverified_context() if insecure else None
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}; log:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as answer:
                if answer.status == 200:
                    return
        except Exception as err:  # not up yet
            last = err
        time.sleep(0.2)
    raise RuntimeError(
        f"{url} did not answer within {timeout_s:.0f} s ({last})"
        + (f"; {proc.name} log:\n{proc.tail()}" if proc else "")
    )


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll until ``predicate`` returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@dataclass
class Process:
    """One child process in its own group, its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 5.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the whole group, as a crash would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (started by ``start``) and any number of kube-schedulers and helpers."""

    bin: Path
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpuslice-k8s-e2e-")))
    processes: list[Process] = field(default_factory=list)
    apiserver_port: int = 0
    kubeconfig: Path = Path()
    # The install tests' plane: the API server on the pod network's gateway (pods reach it there), pods
    # get service-account tokens (ServiceAccount admission; kube-controller-manager makes the accounts),
    # and a webhook Service is dialled at its endpoint's address (no kube-proxy).
    address: str = "127.0.0.1"
    pod_tokens: bool = False

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self._start_etcd_and_apiserver()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
        keep = os.environ.get("GPUSLICE_E2E_LOGS")  # a folder to keep every process's log in
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for log in self.root.glob("*.log"):
                shutil.copy(log, Path(keep) / log.name)
        shutil.rmtree(self.root, ignore_errors=True)

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Process:
        log = self.root / f"{name}.log"
        out = log.open("ab")
        popen = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() reaches its children too
            env={**os.environ, **(env or {})},
        )
        out.close()
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    def forget(self, proc: Process) -> None:
        proc.stop()
        if proc in self.processes:
            self.processes.remove(proc)

    # ---- etcd and kube-apiserver -------------------------------------------------------------------------

    def _start_etcd_and_apiserver(self) -> None:
        client, peer = free_port(), free_port()
        etcd = self.spawn(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{client}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{client}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # test data: a crash may lose it
                "--log-level",
                "warn",
            ],
        )
        wait_http(f"http://127.0.0.1:{client}/health", 60, proc=etcd)

        certs = self.root / "pki"
        certs.mkdir()
        sa_key = certs / "sa.key"
        subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True)
        tokens = certs / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},admin,admin-uid,"system:masters"\n')
        self.apiserver_port = free_port()
        apiserver = self.spawn(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                "--etcd-servers",
                f"http://127.0.0.1:{client}",
                "--bind-address",
                self.address,
                "--advertise-address",
                self.address,
                # the kubernetes Service's endpoint may not be a loopback address: keep none
                "--endpoint-reconciler-type",
                "none",
                "--secure-port",
                str(self.apiserver_port),
                "--cert-dir",
                str(certs),  # a self-signed serving certificate is made here
                "--service-cluster-ip-range",
                "10.96.0.0/24",
                "--service-account-issuer",
                "https://kubernetes.default.svc",
                "--service-account-key-file",
                str(sa_key),
                "--service-account-signing-key-file",
                str(sa_key),
                "--token-auth-file",
                str(tokens),
                "--authorization-mode",
                "RBAC",
                # a node's kubelet is dialled at its InternalIP (the bridge's address on a pod network),
                # never by its made-up host name, which no DNS resolves
                "--kubelet-preferred-address-types",
                "InternalIP,Hostname",
                "--enable-admission-plugins",
                "MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
                *(
                    ["--enable-aggregator-routing=true"]
                    if self.pod_tokens
                    # no controller-manager creates each namespace's "default" service account
                    else ["--disable-admission-plugins", "ServiceAccount"]
                ),
                "--allow-privileged=true",
                f"--feature-gates={FEATURE_GATES}",
            ],
        )
        wait_http(f"{self.server}/readyz", 120, insecure=True, proc=apiserver)
        self.kubeconfig = self.root / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "e2e",
                            "cluster": {
                                "server": self.server,
                                # the API server's own self-signed certificate is its CA
                                "certificate-authority": str(certs / "apiserver.crt"),
                            },
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
                    "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
                    "current-context": "e2e",
                }
            )
        )
        self.kubeconfig.chmod(0o600)

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    # ---- kube-scheduler --------------------------------------------------------------------------------

    def start_scheduler(self, config: Mapping[str, Any], name: str = "kube-scheduler") -> tuple[Process, int]:
        """kube-scheduler with ``config`` (a KubeSchedulerConfiguration, its client connection pointed at
        this API server); returns the process and its secure port (GET /metrics needs no credentials)."""
        config = dict(config)
        config["clientConnection"] = {
            **config.get("clientConnection", {}),
            "kubeconfig": str(self.kubeconfig),
        }
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        port = free_port()
        proc = self.spawn(
            name,
            [
                str(self.bin / "kube-scheduler"),
                "--config",
                str(path),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(port),
                "--authentication-kubeconfig",
                str(self.kubeconfig),
                "--authorization-kubeconfig",
                str(self.kubeconfig),
                "--authorization-always-allow-paths",
                "/healthz,/readyz,/livez,/metrics",
                f"--feature-gates={FEATURE_GATES}",
                "--v",
                "2",
            ],
        )
        wait_http(f"https://127.0.0.1:{port}/healthz", 60, insecure=True, proc=proc)
        return proc, port

    # ---- kube-controller-manager -----------------------------------------------------------------------

    def start_controller_manager(self, controllers: str = "*") -> Process:
        """kube-controller-manager running ``controllers`` (its ``--controllers``; ``*``: every one on by
        default: Deployments, DaemonSets, EndpointSlices, service accounts, the root CA ConfigMap,
        garbage collection, namespaces, resource claims …)."""
        if not (self.bin / "kube-controller-manager").is_file():
            raise AssertionError(f"no kube-controller-manager in {self.bin}: scripts/k8s-e2e builds it")
        return self.spawn(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                "--kubeconfig", str(self.kubeconfig),
                "--controllers", controllers,
                "--leader-elect=false",
                "--secure-port", "0",
                "--use-service-account-credentials=false",
                # the CA pods trust the API server by (kube-root-ca.crt in every namespace)
                "--root-ca-file", str(self.root / "pki" / "apiserver.crt"),
                f"--feature-gates={FEATURE_GATES}",
            ],
        )  # fmt: skip

    # ---- gpuslice's extender ------------------------------------------------------------------------

    def start_extender(self, gpuslice: str, port: int, *args: str, name: str = "extender") -> Process:
        """``gpuslice k8s extender`` as users start it, on 127.0.0.1:``port`` against this API server."""
        proc = self.spawn(
            name,
            [gpuslice, "k8s", "extender", "--host", "127.0.0.1", "--port", str(port),
             "--kubeconfig", str(self.kubeconfig), *args],
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/healthz", 120, proc=proc)
        return proc

    # ---- tools -----------------------------------------------------------------------------------------

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.tool("kubectl", "--kubeconfig", str(self.kubeconfig), *args, stdin=stdin, check=check)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            "HELM_CACHE_HOME": str(self.root / "helm-cache"),
            "HELM_CONFIG_HOME": str(self.root / "helm"),
            "HELM_DATA_HOME": str(self.root / "helm-data"),
            "KUBECONFIG": str(self.kubeconfig),
        }
        return self.tool("helm", *args, check=check, env=env)

    def tool(
        self,
        name: str,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.bin / name), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, **(env or {})},
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{name} {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done
