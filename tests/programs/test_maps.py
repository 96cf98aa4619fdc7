"""Maps hold declared types only, never grow past max_entries, and load all-or-nothing."""

from __future__ import annotations

import pytest

from gpuslice.errors import UserError
from gpuslice.programs.maps import Map, MapError, MapFull, MapSpec


def test_map_stores_and_reads_typed_entries() -> None:
    m = Map(key=int, value=float, max_entries=4)
    m.update(3, 1.5)
    m.update(4, 2)  # an int is accepted for a float value and stored as a float
    assert m.get(3) == 1.5 and m.get(4) == 2.0 and type(m.get(4)) is float
    assert m.get(99, -1.0) == -1.0 and 3 in m and len(m) == 2
    assert m.delete(3) and not m.delete(3)


@pytest.mark.parametrize(
    ("key", "value"),
    [("3", 1.0), (3, "x"), (True, 1.0), (3.0, 1.0)],
    ids=["str key", "str value", "bool key", "float key"],
)
def test_map_refuses_the_wrong_type(key: object, value: object) -> None:
    m = Map(key=int, value=float, max_entries=4)
    with pytest.raises(MapError):
        m.update(key, value)
    assert len(m) == 0


def test_full_map_refuses_a_new_key_but_updates_an_existing_one() -> None:
    m = Map(key=str, value=int, max_entries=2)
    m.update("a", 1)
    m.update("b", 2)
    with pytest.raises(MapFull, match="full"):
        m.update("c", 3)
    m.update("a", 10)
    assert m.dump() == [("a", 10), ("b", 2)]
    assert issubclass(MapFull, UserError)


def test_spec_is_comparable_and_printable() -> None:
    assert Map(int, int, 8).spec() == MapSpec(int, int, 8) != MapSpec(int, float, 8)
    assert str(MapSpec(str, bool, 3)) == "Map(key=str, value=bool, max_entries=3)"


@pytest.mark.parametrize(
    "args",
    [(list, int, 4), (int, dict, 4), (int, int, 0), (int, int, 1 << 30), (int, int, 2.5)],
    ids=["list key", "dict value", "zero entries", "too many entries", "float size"],
)
def test_unsupported_declarations_are_refused(args: tuple) -> None:
    with pytest.raises(MapError):
        Map(*args)


def test_load_replaces_everything_or_nothing() -> None:
    m = Map(key=int, value=int, max_entries=2)
    m.update(1, 1)
    with pytest.raises(MapError):
        m.load([(5, 5), ("bad", 6)])
    assert m.dump() == [(1, 1)]
    with pytest.raises(MapFull):
        m.load([(1, 1), (2, 2), (3, 3)])
    m.load([(7, 70), (6, 60)])
    assert m.dump() == [(6, 60), (7, 70)]


def test_text_from_the_cli_is_parsed_as_the_declared_types() -> None:
    m = Map(key=str, value=bool, max_entries=2)
    assert m.parse_key("alice") == "alice" and m.parse_value("true") is True and m.parse_value("0") is False
    n = Map(key=int, value=float, max_entries=2)
    assert n.parse_key("42") == 42 and n.parse_value("0.25") == 0.25
    with pytest.raises(MapError, match="not a int"):
        n.parse_key("4x")
    with pytest.raises(MapError, match="not a bool"):
        m.parse_value("maybe")


def test_items_is_a_copy_so_a_hook_may_update_while_walking() -> None:
    m = Map(key=int, value=int, max_entries=8)
    for k in range(3):
        m.update(k, k)
    for k, v in m.items():
        m.update(k, v + 1)
    assert m.dump() == [(0, 1), (1, 2), (2, 3)]
