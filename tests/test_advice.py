"""advice.ask: the one fallback rule every policy family's mechanism follows."""

from __future__ import annotations

import pytest

from gpuslice.advice import EXCEPTION, INVALID, ask


def boom() -> int:
    raise RuntimeError("policy bug")


@pytest.mark.parametrize(
    ("hook", "check", "expected"),
    [
        (lambda: 3, lambda x: x > 0, (3, None)),
        (boom, lambda x: True, (0, EXCEPTION)),
        (lambda: -1, lambda x: x > 0, (0, INVALID)),
        (lambda: "3", lambda x: x > 0, (0, INVALID)),  # the check itself raises on a malformed answer
    ],
    ids=["valid answer is followed", "raising hook", "refused answer", "check that raises"],
)
def test_ask_follows_valid_advice_and_falls_back_to_the_default_otherwise(hook, check, expected):
    advice = ask(hook, check, lambda: 0)
    assert (advice.value, advice.fallback) == expected
    assert advice.followed is (expected[1] is None)


def test_the_exception_a_hook_raised_is_kept_for_the_message():
    advice = ask(boom, lambda x: True, lambda: 0)
    assert isinstance(advice.error, RuntimeError) and str(advice.error) == "policy bug"


def test_the_default_is_computed_only_when_needed():
    calls = []
    ask(lambda: 1, lambda x: True, lambda: calls.append("default") or 0)
    assert calls == []
