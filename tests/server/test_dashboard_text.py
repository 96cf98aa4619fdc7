"""The dashboard writes out control characters and bidirectional overrides exactly as the CLI does
(cli/terminal.py visible): the same rule, checked by running the page's own function under Node.js."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib.resources import files

import pytest

from gpuslice.cli.terminal import visible

JS = (files("gpuslice.server.dashboard") / "static" / "dashboard.js").read_text()
SAMPLES = [
    "plain text, tabs\tand\nnewlines",
    "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07",  # title, clear screen, clipboard
    "ls\rrm -rf ~ \x00\x7f\x9b31m \u0085",  # CR, NUL, DEL, 8-bit CSI, NEL
    "evil\u202etxt.exe \u2066x\u2069 \u200f",  # right-to-left override, isolates (U+200F is a mark, kept)
    "<img src=x onerror=alert(1)> :x: [bold]",
]


def test_the_page_writes_out_controls_as_the_cli_does():
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    found = re.search(r"const CONTROLS = [^\n]*\n\nfunction visible\(text\) \{.*?\n\}\n", JS, re.S)
    assert found, "dashboard.js has no visible() next to CONTROLS"
    script = found.group() + f"process.stdout.write(JSON.stringify({json.dumps(SAMPLES)}.map(visible)));"
    ran = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True, timeout=60)
    shown = json.loads(ran.stdout)
    assert shown == [visible(s) for s in SAMPLES]
    assert "\\x1b]0;pwned" in shown[1] and "\\u202e" in shown[3]


def test_every_text_the_page_makes_goes_through_visible():
    """Text reaches the page through el() and withTitle() only, and both call visible()."""
    code = re.sub(r"//[^\n]*", "", JS)
    assert "document.createTextNode(visible(child))" in code
    assert 'setAttribute("title", visible(title))' in code
    assert code.count("createTextNode(") == 1
