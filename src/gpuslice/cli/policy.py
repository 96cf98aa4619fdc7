"""``gpuslice policy …``: verify a policy file, load it into a running server, read and write its maps.

The Python counterpart of ``bpftool prog load`` / ``bpftool map update`` for gpu_ext's eBPF policies:

```text
policy check FILE                  the verifier, locally; no server needed
policy export NAME                 a built-in policy written as a policy file, to read or start from
policy load FILE                   the server verifies the source itself, then swaps it in between decisions
policy list                        what each family runs now: file or built-in, faults, detached, maps
policy unload FAMILY               back to the built-in policy the server was started with
policy events                      loaded / unloaded / fault / detached, the newest, oldest first
policy map dump|get|update|delete   a loaded policy's maps; `map update boost 3 2` ~ bpftool's `key 3 value 2`
```
Server address and token as for the job commands (--url / GPUSLICE_URL, --state-dir / GPUSLICE_TOKEN).
The commands that change the server (load, unload, map update, map delete) wait --wait seconds for its
answer; without one they exit 4 and say that the request was sent and may still be applied, and which
command shows whether it was (the client decides this: server/client.py).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gpuslice.cli import terminal
from gpuslice.cli.jobs import StateDir, Url
from gpuslice.errors import UserError
from gpuslice.inputs import InvalidInput, read_text, writable_file
from gpuslice.server.client import MAX_PAGE, ServeClient, ServerError
from gpuslice.server.errors import OutcomeUnknown

__all__ = ["app", "map_app"]

_out = terminal.console(highlight=False, soft_wrap=True)
_err = terminal.console(stderr=True, highlight=False, soft_wrap=True)

app = typer.Typer(
    help="Policies as programs: verify a policy file (check), write a built-in as a file (export), hot-swap "
    "a file into a running `gpuslice serve` (load, list, unload) and read or write the maps it keeps its "
    "state in (map dump|get|update).",
    no_args_is_help=True,
)
map_app = typer.Typer(
    help="A loaded policy's maps, on a running server: dump all entries, get, update or delete one.",
    no_args_is_help=True,
)
app.add_typer(map_app, name="map")


Family = Annotated[str, typer.Option("--family", help="the policy family whose map it is")]
MapName = Annotated[str, typer.Argument(help="the map's name in the policy file", show_default=False)]

_MAX_WAIT = 86_400.0  # a day; beyond it a socket timeout no longer fits


def _wait_seconds(value: float) -> float:
    """--wait: a positive, finite number of seconds, up to a day."""
    if not (math.isfinite(value) and 0 < value <= _MAX_WAIT):
        raise InvalidInput(f"invalid --wait {value:g}: use a positive number of seconds up to 86400, e.g. 30")
    return value


Wait = Annotated[
    float,
    typer.Option(
        "--wait",
        callback=_wait_seconds,
        help="seconds to wait for the server's answer; with none by then the command exits "
        f"{OutcomeUnknown.exit_status}: the request was sent and the server may still apply it, and the "
        "error names the command that shows whether it did",
    ),
]


def _client(url: str | None, state_dir: Path | None) -> ServeClient:
    """The one place these commands get their client (tests replace it with one bound to an app)."""
    return ServeClient(url=url, state_dir=state_dir)


def _read(file: Path) -> str:
    # A folder, a FIFO (whose read would block), a binary or non-UTF-8 file: one error line naming it.
    return read_text(file, "policy file")


@app.command()
def check(file: Annotated[Path, typer.Argument(help="the policy file (.py)", show_default=False)]) -> None:
    """Verify a policy file locally, without a server.

    Prints one line per violation ("file:line: message") and exits 2 if there is any; otherwise one line
    naming the policy's family, class and maps."""
    from gpuslice.programs.verify import check_source

    report = check_source(_read(file), str(file))
    if not report.ok:
        for v in report.violations:
            _out.print(f"{v.file}:{v.line}: {v.message}", markup=False)
        noun = "violation" if len(report.violations) == 1 else "violations"
        _err.print(f"error: {file} rejected by the verifier: {len(report.violations)} {noun}", markup=False)
        raise typer.Exit(2)
    _out.print(report.summary(), markup=False)


@app.command()
def export(
    name: Annotated[str, typer.Argument(help="a built-in, e.g. bestfit, fgd, lfu", show_default=False)],
    family: Annotated[
        str | None,
        typer.Option(help="placement, queue, eviction or prefetch; needed when the name is in several"),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            "--output",  # --out as every other command; --output, its old name, still works
            help="write here instead of printing",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write a built-in policy as a policy file: its own source, importing from the policy API.

    A starting point for your own policy: the file passes `policy check` and decides exactly as the
    built-in. Built-ins that build on another policy (fgd-scarcity, priority) cannot be exported."""
    from gpuslice.programs.export import export_source

    if output is not None:
        writable_file(output, "--out")  # a FIFO there would block the write; a folder would fail it
    text = export_source(name, family)
    if output is None:
        _out.print(text, markup=False, end="")
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot write {output}: {err.strerror or err}") from None
    _err.print(f"wrote built-in policy {name} to {output}", markup=False)


@app.command()
def load(
    file: Annotated[Path, typer.Argument(help="the policy file (.py)", show_default=False)],
    url: Url = None,
    state_dir: StateDir = None,
    wait: Wait = 30.0,
) -> None:
    """Verify and hot-swap a policy file into a running server.

    The server verifies the text itself (a rejection lists each violation, exit 2), then swaps the policy
    in between two scheduling passes. Maps with the same name and type as the running version's keep
    their entries; other maps start empty."""
    source = _read(file)
    with _client(url, state_dir) as client:
        try:
            info = client.load_policy(str(file), source, wait=wait)
        except ServerError as err:
            if err.status != 422:
                raise
            _rejected(file, err)
    maps = ", ".join(f"{m['name']} ({_entries(m['entries'])})" for m in info["maps"])
    _out.print(
        f"loaded {info['family']} policy {info['name']} from {file} (sha256 {info['sha256'][:12]})"
        + (f"; maps: {maps}" if maps else ""),
        markup=False,
    )


def _rejected(file: Path, err: ServerError) -> None:
    """A 422 from the server: its violations, one per line, then one error line; exit 2."""
    lines = str(err).splitlines()
    for line in lines[1:]:
        _out.print(line.strip(), markup=False)
    _err.print(f"error: {lines[0].rstrip(':') if lines else f'{file} rejected'}", markup=False)
    raise typer.Exit(2)


@app.command("list")
def list_policies(url: Url = None, state_dir: StateDir = None) -> None:
    """What each policy family runs now: a loaded file or the built-in, its faults and maps."""
    with _client(url, state_dir) as client:
        rows = client.policies()
    table = Table("FAMILY", "POLICY", "SOURCE", "SHA256", "LOADED", "STATE", "FAULTS", "MAPS", box=None)
    for column in table.columns[:2]:
        column.no_wrap = True  # the names people type; the path and the lists may fold
    table.columns[2].overflow = "fold"
    for p in rows:
        faults = ", ".join(f"{f['hook']}/{f['reason']} {f['count']}" for f in p["faults"]) or "—"
        maps = ", ".join(f"{m['name']} {m['entries']}/{m['max_entries']}" for m in p["maps"]) or "—"
        state = "detached (built-in decides)" if p["detached"] else "active"
        table.add_row(
            p["family"], escape(p["name"]), escape(p["source"] or "built-in"),
            (p["sha256"] or "")[:12] or "—", _when(p["loaded_at"]), state, escape(faults), escape(maps),
        )  # fmt: skip
    _out.print(table)


@app.command()
def unload(
    family: Annotated[str, typer.Argument(help="the policy family, e.g. queue", show_default=False)],
    url: Url = None,
    state_dir: StateDir = None,
    wait: Wait = 30.0,
) -> None:
    """Unload FAMILY's policy file: the server's built-in policy decides again."""
    with _client(url, state_dir) as client:
        info = client.unload_policy(family, wait=wait)
    _out.print(f"{info['family']}: built-in policy {info['name']} restored", markup=False)


@app.command()
def events(
    limit: Annotated[int, typer.Option(min=1, max=MAX_PAGE, help="at most this many, the newest")] = 50,
    url: Url = None,
    state_dir: StateDir = None,
) -> None:
    """Policy events, oldest first: loaded, unloaded, faults (hook and reason), detached."""
    rows: list[dict[str, Any]] = []
    with _client(url, state_dir) as client:
        while page := client.events(kind="policy", after=rows[-1]["id"] if rows else 0, limit=MAX_PAGE):
            rows = (rows + page)[-limit:]
            if len(page) < MAX_PAGE:
                break
    for e in rows:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"]))
        _out.print(f"{stamp}  {e['reason']}", markup=False)
    if not rows:
        _out.print("no policy events")


@map_app.command("dump")
def map_dump(
    name: MapName,
    family: Family = "queue",
    url: Url = None,
    state_dir: StateDir = None,
) -> None:
    """Every entry of a loaded policy's map, in key order."""
    with _client(url, state_dir) as client:
        m = client.policy_map(family, name)
    table = Table(
        "KEY", "VALUE", box=None, title=f"{m['name']}: {_spec_text(m)}, {_entries(len(m['entries']))}"
    )
    for key, value in m["entries"]:
        table.add_row(escape(str(key)), escape(str(value)))
    _out.print(table)


@map_app.command("get")
def map_get(
    name: MapName,
    key: Annotated[str, typer.Argument(help="the key, written as its type (int, float, str, bool)")],
    family: Family = "queue",
    url: Url = None,
    state_dir: StateDir = None,
) -> None:
    """One entry's value; exit 2 if the key is not in the map."""
    with _client(url, state_dir) as client:
        entry = client.policy_map_get(family, name, key)
    _out.print(str(entry["value"]), markup=False)


@map_app.command("update")
def map_update(
    name: MapName,
    key: Annotated[str, typer.Argument(help="the key, written as the map's key type")],
    value: Annotated[str, typer.Argument(help="the value, written as the map's value type")],
    family: Family = "queue",
    url: Url = None,
    state_dir: StateDir = None,
    wait: Wait = 30.0,
) -> None:
    """Set one entry of a loaded policy's map; the policy reads it from its next decision on.

    The counterpart of `bpftool map update … key 3 value 128`: `gpuslice policy map update boost 3 128`.
    KEY and VALUE are parsed as the map's types (int, float, str; bool as true/false/1/0)."""
    with _client(url, state_dir) as client:
        entry = client.policy_map_update(family, name, key, value, wait=wait)
    was = "" if entry.get("previous") is None else f" (was {entry['previous']})"
    _out.print(f"{name}[{entry['key']!r}] = {entry['value']!r}{was}", markup=False)


@map_app.command("delete")
def map_delete(
    name: MapName,
    key: Annotated[str, typer.Argument(help="the key, written as the map's key type")],
    family: Family = "queue",
    url: Url = None,
    state_dir: StateDir = None,
    wait: Wait = 30.0,
) -> None:
    """Remove one entry of a loaded policy's map (`bpftool map delete`); exit 2 if it is not there."""
    with _client(url, state_dir) as client:
        entry = client.policy_map_delete(family, name, key, wait=wait)
    _out.print(f"{name}[{entry['key']!r}] deleted (was {entry['value']!r})", markup=False)


def _spec_text(m: dict[str, Any]) -> str:
    """'int → float, max 4096' from a map's JSON form."""
    return f"{m['key_type']} → {m['value_type']}, max {m['max_entries']}"


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def _when(t: float | None) -> str:
    """'14:03:07' today, '2026-11-29 14:03' before; '—' for the built-in."""
    if t is None:
        return "—"
    today = time.strftime("%Y-%m-%d") == time.strftime("%Y-%m-%d", time.localtime(t))
    return time.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M", time.localtime(t))
