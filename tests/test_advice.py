"""advice.ask: the one fallback rule every policy family's mechanism follows."""

from __future__ import annotations

import pytest

from gpuslice.advice import EXCEPTION, INVALID, Fallback, ask


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


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (5, (5, None)),
        (float("nan"), (0, Fallback.NAN)),
        (250, (99, Fallback.WRONG_SHAPE)),  # repaired, not replaced: the repair keeps what it can
        (None, (0, Fallback.INVALID)),  # False is a plain refusal
    ],
    ids=["accepted", "refused with a code", "repaired", "plain refusal"],
)
def test_a_check_may_name_its_code_and_a_repair_may_keep_part_of_the_answer(answer, expected):
    def check(x):
        if x is None:
            return False
        if x != x:
            return Fallback.NAN
        return Fallback.WRONG_SHAPE if x > 99 else True

    repair = lambda x: min(x, 99) if isinstance(x, int) and x > 0 else 0  # noqa: E731
    advice = ask(lambda: answer, check, lambda: 0, repair if answer == answer else None)
    assert (advice.value, advice.fallback) == expected


def test_a_check_that_answers_with_text_instead_of_a_code_refuses_plainly():
    """Only a ``Fallback`` code names a reason; a string (truthy) must not pass for acceptance."""
    advice = ask(lambda: 5, lambda _: "looks wrong", lambda: 0)
    assert (advice.value, advice.fallback) == (0, Fallback.INVALID)


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("exception ValueError", Fallback.EXCEPTION),
        ("crash (exit 9)", Fallback.CRASH),
        ("timeout", Fallback.TIMEOUT),
        ("overrun", Fallback.OVERRUN),
        ("memory", Fallback.MEMORY),
        ("busy", Fallback.BUSY),
        ("restarting", Fallback.RESTARTING),
        ("invalid", Fallback.INVALID),
        ("something new", Fallback.INVALID),  # a reason no producer gives: counted, never raised
    ],
)
def test_a_guard_fault_is_counted_under_the_code_its_reason_starts_with(reason, kind):
    from gpuslice.programs.guard import fault_kind

    assert fault_kind(reason) is kind
