"""inputs: numbers bounded and finite, files read as UTF-8 text, output folders probed before work."""

from __future__ import annotations

import math
import os
import re

import pytest

from gpuslice.errors import UserError
from gpuslice.inputs import (
    InvalidInput,
    bounded_int,
    finite_float,
    read_json,
    read_text,
    writable_file,
    writable_folder,
)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, float("1e400"), 0.5, 11.0])
def test_a_float_outside_its_range_infinite_or_nan_is_refused_naming_the_flag(value):
    with pytest.raises(InvalidInput, match="--tune"):
        finite_float(value, "--tune", 1.0, 10.0)


def test_a_float_inside_its_range_passes():
    assert finite_float(1.3, "--tune", 1.0, 10.0) == 1.3


@pytest.mark.parametrize("value", [0, 2**63, True, 1.5])
def test_an_integer_outside_its_range_or_not_an_integer_is_refused(value):
    with pytest.raises(InvalidInput, match="from 1 to 256"):
        bounded_int(value, "--jobs", 1, 256)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "binary file (a NUL byte at offset 8)"),
        (b'{"a": "\xe9"}', "not UTF-8 text (byte 0xe9 at offset 7)"),
        (b"", "is empty"),
        (b"  \n\t\n", "is empty"),
    ],
)
def test_a_file_that_is_not_text_is_refused_by_name(tmp_path, content, words):
    path = tmp_path / "trace.csv"
    path.write_bytes(content)
    with pytest.raises(InvalidInput) as err:
        read_text(path, "trace")
    assert words in str(err.value) and str(path) in str(err.value)
    assert isinstance(err.value, UserError)


def test_text_is_returned_without_a_byte_order_mark(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes("\ufeff{}".encode())
    assert read_text(path, "config") == "{}"


def test_a_folder_or_a_missing_file_or_one_too_large_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match="is a folder"):
        read_text(tmp_path, "trace")
    with pytest.raises(InvalidInput, match="cannot read trace"):
        read_text(tmp_path / "absent.csv", "trace")
    (tmp_path / "big").write_text("x" * 100)
    with pytest.raises(InvalidInput, match="at most 10 are read"):
        read_text(tmp_path / "big", "trace", max_bytes=10)


def test_a_writable_folder_is_probed_and_nothing_is_left_behind(tmp_path):
    target = tmp_path / "a" / "b"
    assert writable_folder(target, "--out") == target
    assert list(tmp_path.iterdir()) == []  # the probe is removed and the folder not made


@pytest.mark.parametrize("where", ["file", "under a file", "/proc"])
def test_an_output_folder_that_cannot_be_made_is_refused_before_work(tmp_path, where):
    (tmp_path / "f").write_text("x")
    target = {"file": tmp_path / "f", "under a file": tmp_path / "f" / "out", "/proc": "/proc/nope"}[where]
    with pytest.raises(InvalidInput, match="--out"):
        writable_folder(target, "--out")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    with pytest.raises(InvalidInput, match=r"trace .*in\.fifo is a FIFO: give a regular file"):
        read_text(fifo, "trace")


@pytest.mark.parametrize("kind", ["folder", "FIFO"])
def test_an_output_file_where_a_folder_or_fifo_is_is_refused(tmp_path, kind):
    target = tmp_path / "out"
    target.mkdir() if kind == "folder" else os.mkfifo(target)
    with pytest.raises(InvalidInput, match=f"--out {target} is a {kind}: give a file name"):
        writable_file(target, "--out")
    assert writable_file(tmp_path / "new" / "p.py", "--out") == tmp_path / "new" / "p.py"
    assert not (tmp_path / "new").exists()


def test_a_name_longer_than_the_file_system_allows_is_refused_before_the_work(tmp_path) -> None:
    """A folder or file name of 300 characters: the write would fail only after the work (a stat of it
    raises ENAMETOOLONG instead of saying it is missing)."""
    from gpuslice.inputs import InvalidInput, writable_file, writable_folder

    long = "a" * 300
    for check, path in (
        (writable_folder, tmp_path / long),
        (writable_folder, tmp_path / "new" / long / "x"),
        (writable_file, tmp_path / long),
        (writable_file, tmp_path / long / "f.py"),
    ):
        with pytest.raises(InvalidInput, match="a name of 300 characters is too long"):
            check(path, "--out")
    assert list(tmp_path.iterdir()) == []  # nothing made by the probes
    assert writable_folder(tmp_path / "new" / "b", "--out") == tmp_path / "new" / "b"  # ordinary names pass


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "is not JSON (line 1, column 2"),
        ("[" * 10_000 + "]" * 10_000, "nests too deeply"),
        ('{"n": ' + "9" * 5000 + "}", "holds a number of thousands of digits"),
    ],
    ids=["not json", "10,000 deep", "5,000 digits"],
)
def test_a_json_file_that_no_decoder_answers_faithfully_is_one_refusal_naming_it(tmp_path, text, words):
    path = tmp_path / "f.json"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=re.escape(f"settings {path} {words}")):
        read_json(path, "settings")
    path.write_text('{"n": [1, 2.5, "x"]}')
    assert read_json(path, "settings") == {"n": [1, 2.5, "x"]}
