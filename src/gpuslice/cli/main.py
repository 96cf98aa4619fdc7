"""The ``gpuslice`` console script: the root typer app, its sub-apps, and where errors become exit codes."""

from __future__ import annotations

import inspect
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import typer
from typer._click import _textwrap  # the formatter's wrapper class: see _WholeWords

from gpuslice.cli import (
    estimate,
    jobs,
    k8s,
    memsim,
    mig,
    policy,
    predict,
    serve,
    sim,
    tenants,
    top,
    topo,
    tune,
)
from gpuslice.cli.terminal import console
from gpuslice.errors import GpusliceError, exit_code

__all__ = ["app", "build_command", "main", "package_version"]

app = typer.Typer(
    name="gpuslice",
    help="Share and schedule GPUs; replay placement policies on real cluster traces.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every subcommand inherits it
)


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), or 'unknown' when run from a bare tree."""
    try:
        return version("gpuslice")
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"gpuslice {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Share and schedule GPUs; replay placement policies on real cluster traces."""


app.add_typer(sim.app, name="sim")
app.add_typer(topo.app, name="topo")
app.add_typer(mig.app, name="mig")
app.add_typer(k8s.app, name="k8s")
app.add_typer(policy.app, name="policy")
app.add_typer(tenants.app, name="tenants")
app.command("memsim")(memsim.memsim)
app.command("estimate")(estimate.estimate)
app.command("predict")(predict.predict)
app.command("tune")(tune.tune)
app.command("serve")(serve.serve)
for _name in ("submit", "ps", "show", "cancel", "logs", "gpus", "queue"):
    app.command(_name)(getattr(jobs, _name))
app.command("top")(top.top)

_stderr = console(stderr=True)  # an error echoing input shows its controls and :x: as they are

# What --help shows after an option that takes a value, by Python type (as click names them); a flag
# shows nothing. typer's own labels (<bool>, <list[str]>, <float range>) read as Python, not as a CLI.
_METAVARS = {bool: "", int: "INTEGER", float: "NUMBER", str: "TEXT", Path: "PATH"}


def _plain_help(typer_app: typer.Typer) -> None:
    """Plain, click-style help in every sub-app: it wraps whole words at any width, where the boxed
    rich layout cuts option names and help text with an ellipsis at 80 columns."""
    typer_app.rich_markup_mode = None
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _plain_help(group.typer_instance)


def _no_type(ctx: Any) -> None:
    return None


def _name_value_types(command: Any) -> None:
    for param in command.params:
        if param.param_type_name == "argument" and param.metavar is None:
            param.metavar = param.name.upper()
            param.display_type_rich = _no_type  # "MODEL", not "MODEL <str>"
        if param.param_type_name == "option" and param.metavar is None:
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            element = get_args(annotation)[0] if get_origin(annotation) is list else annotation
            if param.is_flag or element is bool:
                param.metavar = ""
            elif element in _METAVARS:
                param.metavar = _METAVARS[element]
    for sub in getattr(command, "commands", {}).values():
        _name_value_types(sub)


def _full_summaries(command: Any) -> None:
    """A command list shows each summary whole (wrapped), not cut at 45 characters with '...'."""
    for sub in getattr(command, "commands", {}).values():
        if not sub.short_help and sub.help:
            sub.short_help = " ".join(inspect.cleandoc(sub.help).split("\n\n")[0].split())
        _full_summaries(sub)


class _WholeWords(_textwrap.TextWrapper):
    """click's wrapper, but a hyphenated name (fgd-scarcity, --target-workload) is never split."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("break_on_hyphens", False)
        super().__init__(*args, **kwargs)


def build_command(typer_app: typer.Typer | None = None) -> Any:
    """The click command tree of ``typer_app`` (default ``app``; the kubectl plugin passes its own), with
    plain value names and whole summaries in --help (what ``main`` runs); help is wrapped at whole words
    only."""
    typer_app = app if typer_app is None else typer_app
    _plain_help(typer_app)
    _textwrap.TextWrapper = _WholeWords  # click's help formatter looks it up here on every call
    command = typer.main.get_command(typer_app)
    _name_value_types(command)
    _full_summaries(command)
    return command


def _error_line(text: str) -> None:
    # soft_wrap: the message stays on one line whatever the terminal width.
    _stderr.print(f"error: {text}", markup=False, highlight=False, soft_wrap=True)


def _usage_text(err: typer.TyperException) -> str:
    """The parser's message, plus where the usage is, on one line (typer's own box takes four)."""
    message = err.format_message().rstrip(".")
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        return f"{message} (see `{ctx.command_path} --help`)"
    return message


def main(args: list[str] | None = None) -> None:
    """Run the CLI; every error a user can cause becomes one ``error: …`` line on stderr.

    A GpusliceError exits 2 (user) or 1 (bug); a usage error from the option parser (a value out of
    range, a missing option, a file that does not exist) exits 2, as click's own handler would.
    """
    try:
        result = build_command().main(args=args, prog_name="gpuslice", standalone_mode=False)
    except GpusliceError as err:
        _error_line(str(err))
        raise SystemExit(exit_code(err)) from None
    except typer.TyperException as err:  # typer's parser: UsageError, BadParameter, MissingParameter, …
        if type(err).__name__ == "NoArgsIsHelpError":  # a group called bare: its message is the help
            typer.echo(err.format_message())
        else:
            _error_line(_usage_text(err))
        raise SystemExit(err.exit_code) from None
    except typer.Abort:
        _error_line("aborted")
        raise SystemExit(130) from None
    raise SystemExit(result if isinstance(result, int) else 0)
