"""The ``gpuslice`` console script: the root typer app, its sub-apps, and where errors become exit codes."""

from __future__ import annotations

import typer
from rich.console import Console

from gpuslice.cli import estimate, jobs, k8s, memsim, mig, policy, serve, sim, top, topo
from gpuslice.errors import GpusliceError, exit_code

__all__ = ["app", "main"]

app = typer.Typer(
    name="gpuslice",
    help="Share and schedule GPUs; replay placement policies on real cluster traces.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(sim.app, name="sim")
app.add_typer(topo.app, name="topo")
app.add_typer(mig.app, name="mig")
app.add_typer(k8s.app, name="k8s")
app.add_typer(policy.app, name="policy")
app.command("memsim")(memsim.memsim)
app.command("estimate")(estimate.estimate)
app.command("serve")(serve.serve)
for _name in ("submit", "ps", "show", "cancel", "logs", "gpus", "queue"):
    app.command(_name)(getattr(jobs, _name))
app.command("top")(top.top)

_stderr = Console(stderr=True)


def main() -> None:
    """Run the CLI; a GpusliceError becomes one ``error: …`` line on stderr and exit 2 (user) or 1 (bug)."""
    try:
        app()
    except GpusliceError as err:
        # soft_wrap: the message stays on one line whatever the terminal width.
        _stderr.print(f"error: {err}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(exit_code(err)) from None
