"""``gpuslice k8s …``: the three Kubernetes components, one command each.

```text
gpuslice k8s extender       -> k8s/extender/app.py::create_app(ClusterState(KubernetesApi), watch events)
gpuslice k8s webhook        -> k8s/webhook.py::run(cert, key)
gpuslice k8s device-plugin  -> cli/k8s_device_plugin.py::device_plugin(...)
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuslice.cli import k8s_device_plugin, k8s_dra, k8s_dra_allocator, terminal
from gpuslice.cli.options import (
    KubeconfigOption,
    finite_between,
    host_option,
    object_name,
    port_option,
    target_workload_option,
)
from gpuslice.errors import UserError
from gpuslice.inputs import file_kind
from gpuslice.k8s.annotations import SCHEDULER_NAME
from gpuslice.k8s.node_lock import DEFAULT_LOCK_TIMEOUT_S
from gpuslice.policies import DEFAULT_PLACEMENT, PLACEMENT

__all__ = ["app", "extender", "probe", "remove_daemonsets", "webhook"]

app = typer.Typer(
    help="Kubernetes: scheduler extender, admission webhook, device plugin.", no_args_is_help=True
)
_out = terminal.console(highlight=False, soft_wrap=True)


@app.command()
def extender(
    host: host_option(
        "address to listen on; kube-scheduler runs in the same pod, so loopback is enough, and anyone who "
        "reaches the bind verb can bind pods"
    ) = "127.0.0.1",
    port: port_option("TCP port; the KubeSchedulerConfiguration's urlPrefix points here") = 8888,
    metrics_port: port_option(
        "serve GET /metrics (the verbs' latency and results, the cluster's series) on this port on every "
        "address, for Prometheus to scrape at the pod's IP while --host stays loopback; off if unset",
        optional=True,
    ) = None,
    kubeconfig: KubeconfigOption = None,
    policy: Annotated[
        str,
        typer.Option(
            help="default placement policy for pods without the annotation: "
            f"{', '.join(sorted(PLACEMENT))}, or a policy file (.py; verified and guarded; a pod's "
            "annotation can name built-in policies only)"
        ),
    ] = DEFAULT_PLACEMENT,
    decide: Annotated[
        bool,
        typer.Option(
            "--decide/--no-decide",
            help="--decide: filter passes only the node the placement policy chooses, so kube-scheduler's "
            "own scoring cannot undo it; --no-decide: every fitting node passes and kube-scheduler adds "
            "this extender's scores (weight in the scheduler configuration) to its own",
        ),
    ] = True,
    target_workload: target_workload_option("the pods bound when the extender last rebuilt") = None,
    node_lock_timeout: Annotated[
        float,
        typer.Option(
            min=1.0,
            max=86400.0,
            help="seconds after which a node's lock (one pod per node from bind to Allocate) is taken "
            "over even though its pod still waits; a pod that is gone or no longer waits frees it at once",
        ),
    ] = DEFAULT_LOCK_TIMEOUT_S,
) -> None:
    """Serve the kube-scheduler extender (filter, prioritize, preempt, bind) over the cluster's GPUs."""
    if node_lock_timeout != node_lock_timeout:  # NaN passes typer's range check
        raise UserError("--node-lock-timeout: give a number of seconds from 1 to 86400")
    import logging

    import uvicorn

    from gpuslice.k8s.extender import SERVER_OPTIONS, ClusterState, KubernetesApi, create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from gpuslice.policies import placement_policy
    from gpuslice.programs.loader import resolve
    from gpuslice.sim.trace import load_target_workload

    resolve(policy, "placement", placement_policy)  # a name, or a file verified now
    target = load_target_workload(target_workload) if target_workload is not None else None
    api = KubernetesApi(str(kubeconfig) if kubeconfig else None)  # after the cheap checks of the options
    state = ClusterState(
        api, default_policy=policy, narrow=decide, target=target, lock_timeout_s=node_lock_timeout
    )
    app = create_app(state, api.events())
    stop_metrics = None
    if metrics_port is not None:
        from gpuslice.observe.metrics_server import serve_metrics

        stop_metrics = serve_metrics(app.state.metrics.registry, metrics_port)
    _out.print(f"gpuslice extender on {host}:{port}, default policy {policy}; watching nodes and pods")
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", **SERVER_OPTIONS)
    finally:
        if stop_metrics is not None:
            stop_metrics()


@app.command()
def webhook(
    cert: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="TLS certificate (PEM)")],
    key: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="TLS private key (PEM)")],
    port: port_option("TCP port; the webhook Service targets it") = 8443,
    host: host_option("address to listen on") = "0.0.0.0",
    scheduler_name: Annotated[
        str, typer.Option(help="schedulerName set on pods asking for gpuslice resources")
    ] = SCHEDULER_NAME,
    dra_claims: Annotated[
        str,
        typer.Option(
            help="rewrite gpuslice.io resources into a DRA claim template: off, label (pods labelled "
            "gpuslice.io/dra=true) or all; the webhook then creates templates (needs RBAC for them)"
        ),
    ] = "off",
    kubeconfig: KubeconfigOption = None,
) -> None:
    """Serve the mutating admission webhook over HTTPS (AdmissionReview v1 at /mutate).

    It lists the cluster's nodes and DRA ResourceSlices (cached 30 s) to admit a MIG pod only when some
    GPU here offers its profile; without API access it checks against every MIG table it knows."""
    from gpuslice.k8s.dra.rewrite import DraClaims
    from gpuslice.k8s.kube_client import api_client
    from gpuslice.k8s.mig_inventory import from_api
    from gpuslice.k8s.webhook import DraRewrite, run

    try:
        mode = DraClaims(dra_claims)
    except ValueError:
        raise UserError(f"--dra-claims {dra_claims!r}: use off, label or all") from None
    _check_tls_pair(cert, key)
    dra = None
    if mode is not DraClaims.OFF:
        from gpuslice.k8s.dra.kube import DraApi

        dra = DraRewrite(mode, DraApi(str(kubeconfig) if kubeconfig else None))
    try:
        mig = from_api(api_client(str(kubeconfig) if kubeconfig else None))
        inventory = "MIG profiles from this cluster's GPUs"
    except UserError as err:
        mig, inventory = None, f"MIG profiles from every known table (no API access: {err})"
    _out.print(
        f"gpuslice webhook on https://{host}:{port}/mutate, scheduler {scheduler_name}, DRA {mode.value}; "
        f"{inventory}"
    )
    run(str(cert), str(key), host=host, port=port, scheduler_name=scheduler_name, dra=dra, mig=mig)


@app.command()
def probe(
    url: Annotated[str, typer.Argument(help="http(s) URL to GET, e.g. http://127.0.0.1:8888/healthz")],
    timeout: Annotated[
        float,
        typer.Option(callback=finite_between(0.01, 3600), help="seconds to wait for the answer, 0.01..3600"),
    ] = 2.0,
) -> None:
    """Exit 0 if URL answers 200, else 1: an exec readiness probe for a server that listens on loopback
    only (an httpGet probe comes from the node, to the pod's address, and cannot reach it)."""
    import ssl
    import urllib.error
    import urllib.parse
    import urllib.request

    try:
        parts = urllib.parse.urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port past 65535 or not a number, an unclosed bracket
        usable = False
    if not usable:  # a mistake in the probe's command line, not an unready server: said, exit 2
        raise UserError(f"invalid URL {url[:200]!r}: give http(s)://HOST[:PORT]/PATH")
    context = ssl._create_unverified_context() if url.startswith("https:") else None  # a liveness check
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
            status = answer.status
    except urllib.error.HTTPError as err:  # an answer, not 200
        err.close()
        status = err.code
    except Exception as err:
        _out.print(f"error: {url}: {err}")
        raise typer.Exit(1) from None
    if status != 200:
        _out.print(f"error: {url} answered {status}")
        raise typer.Exit(1)


@app.command("remove-daemonsets")
def remove_daemonsets(
    namespace: Annotated[str, typer.Option(help="their namespace")],
    daemonset: Annotated[
        list[str], typer.Option(help="a DaemonSet to remove, e.g. gpuslice-device-plugin (repeatable)")
    ],
    kubeconfig: KubeconfigOption = None,
    timeout: Annotated[
        float,
        typer.Option(callback=finite_between(1, 3600), help="seconds to wait until they are gone, 1..3600"),
    ] = 120.0,
) -> None:
    """Delete DaemonSets in the foreground and wait until they are gone: the chart's pre-delete hook, so
    that the node components stop while their DaemonSet is being deleted and their accounts still work,
    and take back what they wrote on each node (annotations, labels, state files). Exit 1 if some are
    still there after --timeout."""
    from gpuslice.k8s import kube_client
    from gpuslice.k8s.uninstall import remove_daemonsets as remove

    object_name(namespace, "namespace")
    names = [object_name(name, "DaemonSet name") for name in daemonset]
    left = remove(kube_client.api_client(str(kubeconfig) if kubeconfig else None), namespace, names, timeout)
    if left:
        _out.print(f"error: still there after {timeout:g} s: {', '.join(left)} (namespace {namespace})")
        raise typer.Exit(1)
    _out.print(f"removed {', '.join(names)} from namespace {namespace}")


def _check_tls_pair(cert: Path, key: Path) -> None:
    """Load the certificate and key as the server will, so a wrong file is one error line, not a trace
    (a FIFO or device in their place is refused first: loading it would block or never end)."""
    import ssl

    for option, path in (("--cert", cert), ("--key", key)):
        kind = file_kind(path)
        if kind != "file":
            raise UserError(f"{option} {path} is {kind}: give a regular file (PEM)")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as err:
        raise UserError(
            f"cannot use --cert {cert} with --key {key}: {getattr(err, 'reason', None) or err}; give a PEM "
            "certificate and its unencrypted PEM private key"
        ) from None


# The command lives in its own module (one command per module); grpc is imported only when it runs.
app.command("device-plugin")(k8s_device_plugin.device_plugin)
app.command("dra-driver")(k8s_dra.dra_driver)
app.command("dra-allocator")(k8s_dra_allocator.dra_allocator)
