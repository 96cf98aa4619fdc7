"""Options more than one command takes, written once (typer reads them from ``Annotated`` hints)."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuslice.inputs import (
    InvalidInput,
    bounded_int,
    check_listen_host,
    finite_float,
    read_text,
    writable_folder,
)

__all__ = [
    "KubeconfigOption",
    "KubectlKubeconfigOption",
    "NodeNameOption",
    "SimulateOption",
    "finite_between",
    "port_option",
    "resolve_node_name",
    "target_workload_option",
    "writable",
]

# The node components' and the cluster components' common options (device plugin, DRA driver, allocator).
SimulateOption = Annotated[
    str | None,
    typer.Option(help="simulate a machine (dgx-h100, dgx-a100:mig, …) instead of reading NVML"),
]
NodeNameOption = Annotated[
    str | None,
    typer.Option(help="this node's Kubernetes name [env NODE_NAME, from the downward API; else hostname]"),
]


def _kubeconfig(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A kubeconfig must be a YAML mapping in a regular text file: the kubernetes package would block on
    a FIFO and raise a bare UnicodeDecodeError or ScannerError on a binary or malformed file."""
    if value is None:
        return None
    text = read_text(value, "--kubeconfig", max_bytes=16 * 1024**2)
    try:
        import yaml  # the k8s extra's; without it the command says which extra to install
    except ImportError:
        return value
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise InvalidInput(f"--kubeconfig {value} is not valid YAML{at}: give a kubeconfig file") from None
    if not isinstance(data, dict):
        raise InvalidInput(
            f"--kubeconfig {value} is not a kubeconfig: give a YAML mapping of clusters, users …"
        )
    return value


# A Kubernetes object name of the DNS-subdomain kind (RFC 1123), as a Node's and a ResourceSlice's pool.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def resolve_node_name(given: str | None) -> str:
    """This node's name: ``--node-name``, else $NODE_NAME, else the hostname in lower case (as kubelet
    registers it). InvalidInput, naming where it came from, unless it is an RFC 1123 subdomain: the name
    goes into ResourceSlices and object names the API server would refuse, or that name no node."""
    if given is not None:
        name, source = given, "--node-name"
    elif os.environ.get("NODE_NAME"):
        name, source = os.environ["NODE_NAME"], "$NODE_NAME"
    else:
        name, source = socket.gethostname().lower(), "the hostname"
    return object_name(name, f"node name (from {source})")


def object_name(name: str, what: str) -> str:
    """``name`` if it is a Kubernetes object name (an RFC 1123 subdomain); InvalidInput naming ``what``."""
    if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
        raise InvalidInput(
            f"invalid {what} {name!r}: a Kubernetes object name is at most 253 lower-case letters, digits, "
            "'-' and '.', starting and ending with a letter or digit"
        )
    return name


KubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        help="kubeconfig file; default: the pod's service account, then ~/.kube/config", callback=_kubeconfig
    ),
]
# The kubectl plugin finds its configuration as kubectl does (``kube_client.kubectl_api_client``).
KubectlKubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        help="kubeconfig file; default: $KUBECONFIG, then ~/.kube/config, then the pod's service account",
        callback=_kubeconfig,
    ),
]


def _instance(param: typer.CallbackParam, value: str) -> str:
    """The first 8 characters of a pod UID (or any name of lower-case letters, digits and '-')."""
    short = value.strip().lower()[:8]
    if (short and not all(c.isalnum() or c == "-" for c in short)) or not short.isascii():
        raise InvalidInput(f"--instance {value!r}: use lower-case letters, digits and '-' (a pod's UID)")
    return short


# A node plugin's name in its socket names: two pods of one DaemonSet rolled with surge serve side by
# side, and the kubelet keeps each registered by its own socket (``k8s.plugin_socket``).
InstanceOption = Annotated[
    str,
    typer.Option(
        envvar="POD_UID",
        callback=_instance,
        help="this instance's name in its socket names (the chart gives the pod's UID; its first 8 "
        "characters are used), so that the old and the new pod of a rolling update serve side by side; "
        "empty: fixed names",
    ),
]


def _port(param: typer.CallbackParam, value: int | None) -> int | None:
    return None if value is None else bounded_int(value, param.opts[0], 1, 65535)


def _host(param: typer.CallbackParam, value: str) -> str:
    check_listen_host(value)  # one error line, before uvicorn is handed a name it would fail on
    return value


def host_option(help: str) -> Any:
    """``--host ADDRESS`` a server listens on: an address (or a name) of this machine, checked here."""
    return Annotated[str, typer.Option(callback=_host, help=help)]


def port_option(help: str, optional: bool = False) -> Any:
    """``--port N``, a TCP port to listen on, 1..65535 (``optional``: may be left unset). Checked here,
    before any work: asyncio raises OverflowError past 65535, and uvloop silently listens on the port
    modulo 65536 while it prints the one given."""
    kind = int | None if optional else int
    return Annotated[kind, typer.Option(callback=_port, help=f"{help}; 1..65535")]


def finite_between(low: float, high: float) -> Callable[..., float | None]:
    """An option callback that refuses a value outside ``low``..``high``, infinity and NaN, naming the
    flag (click's own ranges let ``nan`` through, and ``1e400`` arrives as infinity)."""

    def check(param: typer.CallbackParam, value: float | None) -> float | None:
        return None if value is None else finite_float(value, param.opts[0], low, high)

    return check


def writable(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """An option callback for an output folder: it must be writable before any work starts."""
    return None if value is None else writable_folder(value, param.opts[0])


def _text_file(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """An input file that must be UTF-8 text, checked as the options are read: a binary file, a FIFO or
    an empty one is named with its flag before anything starts (the loader reads it again)."""
    if value is not None:
        read_text(value, param.opts[0])
    return value


def target_workload_option(default: str) -> Any:
    """``--target-workload PATH``: the workload FGD-style placement keeps room for, as serve and the
    Kubernetes extender take it; ``default`` says what is used without it."""
    return Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            callback=_text_file,
            help="CSV of representative pods in openb's pod-list format (num_gpu, gpu_milli, …): the "
            f"workload fgd keeps room for; default: {default}",
        ),
    ]
