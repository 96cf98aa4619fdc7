"""Text from jobs and users, made safe to print on the operator's terminal.

What the operator reads must be what runs. A job's command, tenant, reason or output, or an error that
echoes input, can hold escape sequences (set the window title, clear the screen, write the clipboard
through OSC 52, hide a line behind a carriage return) and rich markup or emoji codes (``[bold]``, ``[/]``,
``:x:``). Everything the CLI prints goes through here:

```text
visible(text)      C0 controls but \\n and \\t, DEL, C1 controls and the bidirectional overrides written
                   as \\xNN or \\uNNNN (ESC becomes \\x1b): what the characters are, not what they do
VisibleBytes       the same for a job's raw output, a chunk at a time: a UTF-8 character split between
                   chunks is decoded whole, and a byte that is not UTF-8 is shown as \\xNN
shown(text)        visible(text) with rich markup escaped: user text inside a markup string
console(**kw)      the CLI's rich Console: emoji codes stay text, and every string it renders (printed
                   or a table cell) goes through visible() first; a table printed on it that cannot fit
                   the width without cutting a cell is printed stacked instead (fitted)
fitted(table, w)   ``table`` if it fits ``w`` columns whole, else the same cells stacked: one block per
                   row, a line per column (header, value), so no number loses a digit on a narrow terminal
```

A backslash itself is left as it is, so a job that prints the four characters ``\\x1b`` looks like one
that printed ESC; ``gpuslice logs --raw`` gives the bytes when that matters.
"""

from __future__ import annotations

import codecs
import re
from typing import Any

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["VisibleBytes", "console", "fitted", "shown", "visible"]

# C0 but TAB and LF, DEL, C1 (U+0080-U+009F: 8-bit CSI, OSC, ST …), and the bidirectional embeddings,
# overrides and isolates (Unicode UAX #9), which can show a line in another order than its characters.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control character but newline and tab written out (ESC as ``\\x1b``)."""
    return _CONTROLS.sub(_escaped, text)


def shown(text: Any) -> str:
    """``text`` (made a string) to put inside a rich markup string: controls visible, markup escaped."""
    return escape(visible(str(text)))


class VisibleBytes:
    """A job's output, chunk by chunk, as UTF-8 bytes with its control characters made visible."""

    def __init__(self) -> None:
        # backslashreplace: a byte that is not UTF-8 (a lone 0x9b, the 8-bit CSI) becomes the text \x9b
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def feed(self, chunk: bytes) -> bytes:
        return visible(self._decoder.decode(chunk)).encode("utf-8")

    def end(self) -> bytes:
        """What is left of a character cut off at the end of the output."""
        return visible(self._decoder.decode(b"", final=True)).encode("utf-8")


_ROOM = 100_000  # columns to measure a table's own minimum width in


def fitted(table: Table, console: Console, width: int | None = None) -> Table:
    """``table`` when ``width`` (default: the console's) holds it with every word of every cell whole
    (rich wraps text between words, but a cell narrower than its longest word is cut or folded, a number
    too; a column that folds on purpose may be narrow, ``_minimum_width``); else the same title, cells
    and caption stacked: for each row, one line per column with its header and value, rows apart by a
    blank line."""
    width = console.width if width is None else width
    if _minimum_width(table, console) <= width:
        return table
    stacked = Table(
        title=table.title,
        caption=table.caption,
        caption_justify=table.caption_justify,
        box=None,
        show_header=False,
        pad_edge=False,
    )
    stacked.add_column(style="bold", no_wrap=True)
    stacked.add_column(overflow="fold")
    headers = [_header(c.header, i) for i, c in enumerate(table.columns)]
    rows = list(zip(*(list(c.cells) for c in table.columns), strict=True))
    for n, cells in enumerate(rows):
        if n:
            stacked.add_row("", "")
        for header, cell in zip(headers, cells, strict=True):
            stacked.add_row(header, cell)
    return stacked


def _minimum_width(table: Table, console: Console) -> int:
    """The narrowest ``table`` can be drawn with no cell cut: every word whole, but in a column that
    folds its text (``overflow="fold"``: a command, a path), which may be as narrow as its min_width
    (or 8). Measured with room to spare: rich clamps a measure to the width it is given."""
    folding = [c for c in table.columns if c.overflow == "fold" and not c.no_wrap]
    saved = [c.max_width for c in folding]
    try:
        for column in folding:
            column.max_width = column.min_width or 8
        return Measurement.get(console, console.options.update_width(_ROOM), table).minimum
    finally:
        for column, max_width in zip(folding, saved, strict=True):
            column.max_width = max_width


def _header(header: RenderableType, index: int) -> RenderableType:
    """A column's header as the stacked layout's label (a header left empty: the column's number)."""
    if isinstance(header, str | Text) and not str(header).strip():
        return f"#{index + 1}" if index else ""
    return header


class _VisibleConsole(Console):
    """A Console that makes controls visible in every string it renders; rich itself only drops a few
    (BEL, backspace, CR, VT, FF) and passes ESC on. A table printed on it is ``fitted`` to its width."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text), **kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        objects = tuple(fitted(o, self) if isinstance(o, Table) else o for o in objects)
        super().print(*objects, **kwargs)


def console(**kwargs: Any) -> Console:
    """A rich Console for the CLI (Console's own arguments), on which ``:x:`` stays ``:x:``."""
    return _VisibleConsole(**{**kwargs, "emoji": False})
