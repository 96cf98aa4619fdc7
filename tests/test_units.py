"""units: sizes parsed at the edge into bytes, and formatted back for people."""

from __future__ import annotations

import pytest

from gpuslice.errors import InvalidSize, UserError
from gpuslice.units import GiB, KiB, MiB, TiB, format_size, looks_like_size, parse_size

HINT = "use a number and a unit, e.g. 8GiB, 8000MiB, 8G"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("8GiB", 8 * GiB, id="binary suffix"),
        pytest.param("8000MiB", 8000 * MiB, id="mebibytes"),
        pytest.param("8G", 8 * GiB, id="single letter means binary"),
        pytest.param("1.5GiB", 3 * GiB // 2, id="fraction of a unit"),
        pytest.param("4096B", 4096, id="bytes need their unit too"),
        pytest.param("8GB", 8 * 1000**3, id="two letters without i are decimal"),
        pytest.param("512KiB", 512 * KiB, id="kibibytes"),
        pytest.param("2TiB", 2 * TiB, id="tebibytes"),
        pytest.param("3 mb", 3 * 1000**2, id="space and lower case"),
        pytest.param("  16g ", 16 * GiB, id="surrounding blanks"),
        pytest.param("100B", 100, id="explicit bytes"),
        pytest.param("1TB", 10**12, id="terabytes are decimal"),
        pytest.param("2kB", 2000, id="kilobytes are decimal"),
        pytest.param("1T", TiB, id="a single T means tebibytes"),
        pytest.param("3K", 3 * KiB, id="a single K means kibibytes"),
        pytest.param("5M", 5 * MiB, id="a single M means mebibytes"),
    ],
)
def test_parse_size_reads_number_and_unit_as_bytes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_passes_a_non_negative_int_through() -> None:
    assert parse_size(12345) == 12345
    assert parse_size(1) == 1  # one byte is the least size, and a size


@pytest.mark.parametrize("text", ["8GB?", "-1", "", "eight", "8 G B", "GiB"])
def test_parse_size_rejects_garbage_with_a_usage_hint(text: str) -> None:
    with pytest.raises(InvalidSize) as info:
        parse_size(text)
    assert HINT in str(info.value)
    assert repr(text) in str(info.value)


def test_parse_size_names_an_unknown_unit_and_still_hints() -> None:
    with pytest.raises(InvalidSize, match=r"unknown unit 'XB'.*8GiB"):
        parse_size("8XB")


def test_parse_size_rejects_a_fraction_of_a_byte() -> None:
    with pytest.raises(InvalidSize, match="not a whole number of bytes"):
        parse_size("1.5B")


@pytest.mark.parametrize("text", ["20", "4096", "1.5"])
def test_a_bare_number_is_refused_because_it_could_be_bytes_or_gib(text: str) -> None:
    with pytest.raises(InvalidSize, match=rf"no unit; write {text}GiB \(or {text}B for bytes\)"):
        parse_size(text)


@pytest.mark.parametrize("text", ["0", "0GiB", "0.0MiB", "0B", "0.0", "-5GiB", "-0"])
def test_zero_or_a_negative_size_is_refused_in_any_unit_and_never_told_to_add_one(text: str) -> None:
    with pytest.raises(InvalidSize, match=r"at least one byte") as info:
        parse_size(text)
    assert "write 0" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1.5.2GiB", "'1.5.2' is not a number"),
        ("+5GiB", "a size has no sign"),
        ("9" * 5000 + "GiB", "5,000 digits"),
    ],
)
def test_a_size_that_is_malformed_says_what_is_wrong_with_it(text: str, words: str) -> None:
    with pytest.raises(InvalidSize, match=words):
        parse_size(text)


@pytest.mark.parametrize("text", ["٢٠GiB", "２０GiB", "२०G"])
def test_digits_other_than_ascii_are_refused(text: str) -> None:
    with pytest.raises(InvalidSize, match="use a number and a unit"):
        parse_size(text)


def test_a_huge_size_is_exact_not_a_rounded_float() -> None:
    assert parse_size("9007199254740993B") == 2**53 + 1
    assert parse_size("1000000TiB") == 10**6 * TiB


def test_parse_size_rejects_non_positive_ints_and_bools() -> None:
    with pytest.raises(InvalidSize, match="at least one byte"):
        parse_size(-1)
    with pytest.raises(InvalidSize, match="at least one byte"):
        parse_size(0)
    with pytest.raises(InvalidSize, match="use a number and a unit"):
        parse_size(True)


def test_invalid_size_is_a_user_error() -> None:
    with pytest.raises(UserError):
        parse_size("eight")


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (8 * GiB, "8 GiB"),
        (3 * GiB // 2, "1.5 GiB"),
        (8000 * MiB, "7.8 GiB"),
        (512, "512 B"),
        (KiB, "1 KiB"),
        (TiB, "1 TiB"),
        (5 * MiB, "5 MiB"),
        (0, "0 B"),
    ],
)
def test_format_size_uses_the_largest_binary_unit_at_or_above_one(size: int, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.parametrize(
    "size", [1, 512, KiB, 4 * KiB, MiB, 256 * MiB, GiB, 3 * GiB // 2, 8 * GiB, 80 * GiB, TiB, 2 * TiB]
)
def test_format_size_round_trips_through_parse_size(size: int) -> None:
    assert parse_size(format_size(size)) == size


def test_thirty_digits_are_a_size_and_thirty_one_are_refused_unread() -> None:
    assert parse_size("9" * 30 + "B") == 10**30 - 1
    with pytest.raises(InvalidSize, match="31 digits"):
        parse_size("9" * 31 + "B")


@pytest.mark.parametrize("text", ["8GiB", "0", "-5GiB", "1.5.2GiB", " 8 Gb ", "+3"])
def test_a_number_then_letters_looks_like_a_size(text: str) -> None:
    assert looks_like_size(text)


@pytest.mark.parametrize("text", ["3g.40gb", "a100", "", "GiB", "8 GiB x", "٨GiB"])
def test_a_name_or_anything_else_does_not_look_like_a_size(text: str) -> None:
    assert not looks_like_size(text)
