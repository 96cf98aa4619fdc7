"""Fixed codes for free-text reasons, so metrics get a small, stable ``reason`` label.

The scheduler and the daemon explain themselves in sentences ("needs 40 GiB on one GPU; largest free is
22 GiB on GPU 3"); a label must not carry numbers or job ids (each distinct value is a new time series).
The tables map the sentences' fixed parts to codes, first match wins; tests/observe/test_reasons.py
drives the real scheduler into each situation and checks its sentence gets the code meant for it.
"""

from __future__ import annotations

__all__ = ["FAULT_KINDS", "failure_code", "fault_kind"]

# Why a job ended FAILED (daemon.py's reasons).
_FAILED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lost", ("lost",)),
    ("launch", ("could not launch",)),
    ("max_runtime", ("max runtime",)),
    ("memory_enforcement", ("exceeding its GPU memory slice",)),
    ("exit_code", ("failed with",)),
)

FAULT_KINDS = ("xid", "ecc", "nvml", "manual")


def _first(text: str, table: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    for code, fragments in table:
        if any(f in text for f in fragments):
            return code
    return "other"


def failure_code(reason: str) -> str:
    """The code of a FAILED job's reason: exit_code, lost, launch, max_runtime, memory_enforcement."""
    return _first(reason, _FAILED)


def fault_kind(reason: str, manual: bool) -> str:
    """xid | ecc | nvml | manual: what marked a GPU unhealthy (manual marks keep their own kind, even
    when their text names an XID, so injected faults never pass for real ones)."""
    if manual:
        return "manual"
    if reason.startswith("XID"):
        return "xid"
    if "ECC" in reason:
        return "ecc"
    return "nvml"
