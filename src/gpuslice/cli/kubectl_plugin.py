"""``kubectl gpuslice``: the cluster's GPU slices as gpuslice holds them, read through the API server.

kubectl runs any ``kubectl-NAME`` on PATH for ``kubectl NAME …`` with the rest of the arguments; this is
the ``kubectl-gpuslice`` console script. It reads as kubectl does (``--kubeconfig``, $KUBECONFIG,
``--context``, ``-n``, ``-A``) and writes nothing.

```text
top      cli/kubectl_top  ─► nodes, every pod ─► slice_report.cluster_report ─► per node: GPUs, slices
pods     cli/kubectl_pods ─► pods (ns | all), nodes ─► slice_report.pod_reports ─► pod table
why POD  cli/kubectl_why  ─► the pod, its events ─► pending_reason.pod_story ─► refusals, newest first
usage    k8s/plugin_usage: the device plugin pods' /metrics through the API server's pod proxy, read
         twice ``--interval`` apart; "-" and one dim note where it cannot be read
```

Every error is one ``error: …`` line on stderr and exit 1, as kubectl's own (not gpuslice's 2 for a
user's mistake): no kubeconfig, an API server that does not answer, a refused verb (named), a pod that
does not exist, gpuslice not installed (``slice_report.require_installed``).
"""

from __future__ import annotations

import logging
import warnings

import typer

from gpuslice.cli import kubectl_pods, kubectl_top, kubectl_why, terminal
from gpuslice.errors import GpusliceError

__all__ = ["app", "main"]

app = typer.Typer(
    name="kubectl-gpuslice",
    help="gpuslice's GPU slices in this cluster: what each GPU holds, each pod's slice, why a pod waits.",
    no_args_is_help=True,
    add_completion=False,  # kubectl completes its plugins itself (kubectl_complete-NAME), not typer
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("top")(kubectl_top.top)
app.command("pods")(kubectl_pods.pods)
app.command("why")(kubectl_why.why)

_err = terminal.console(stderr=True, highlight=False)


def _error_line(text: str) -> None:
    _err.print(f"error: {text}", markup=False, highlight=False, soft_wrap=True)


def main(args: list[str] | None = None) -> None:
    """The ``kubectl-gpuslice`` console script: every error is one line on stderr and exit 1."""
    from gpuslice.cli.main import build_command

    # The extender's cache logs what it leaves out (a malformed decision, a slice that does not fit);
    # here the report says it as notes, and a log line would only repeat it on stderr.
    logging.getLogger("gpuslice").addHandler(logging.NullHandler())
    # A kubeconfig with insecure-skip-tls-verify asked for it: kubectl does not warn on every request.
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    try:
        result = build_command(app).main(args=args, prog_name="kubectl gpuslice", standalone_mode=False)
    except GpusliceError as err:
        _error_line(str(err))
        raise SystemExit(1) from None
    except typer.TyperException as err:  # the option parser's: a missing argument, an unknown option
        if type(err).__name__ == "NoArgsIsHelpError":
            typer.echo(err.format_message())
            raise SystemExit(0) from None
        ctx = getattr(err, "ctx", None)
        where = ctx.command_path if ctx is not None else "kubectl gpuslice"
        _error_line(f"{err.format_message().rstrip('.')} (see `{where} --help`)")
        raise SystemExit(1) from None
    except typer.Abort:
        _error_line("aborted")
        raise SystemExit(130) from None
    raise SystemExit(result if isinstance(result, int) else 0)
