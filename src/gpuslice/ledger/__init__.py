"""Columnar free capacity with validated reserve/release, and the fragmentation measure over it."""

from gpuslice.ledger.fragmentation import node_fragmentation
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode

__all__ = ["Ledger", "LedgerView", "Placement", "Refusal", "RefusalCode", "node_fragmentation"]
