"""Placement policies: one per file, one registry. Unknown names list the known ones."""

from __future__ import annotations

from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import PlacementOps, PolicyContext, TieBreak
from gpuslice.policies.bestfit import BestFit
from gpuslice.policies.clustering import Clustering
from gpuslice.policies.dotprod import DotProd
from gpuslice.policies.fgd import FGD
from gpuslice.policies.fgd_exact import FGDExact
from gpuslice.policies.fgd_scarcity import ScarcityFGD
from gpuslice.policies.hami import HamiBinpack, HamiSpread
from gpuslice.policies.packing import Packing
from gpuslice.policies.random import RandomFit
from gpuslice.registry import Registry

__all__ = [
    "DEFAULT_PLACEMENT",
    "PLACEMENT",
    "PlacementOps",
    "PolicyContext",
    "TieBreak",
    "make_policy",
    "placement_policy",
]

# What serve and the Kubernetes extender place with unless told otherwise: FGD needs a target workload
# that a fresh server or cluster may not have yet; best fit needs nothing.
DEFAULT_PLACEMENT = "bestfit"

# Alphabetical, so help texts and "known: ..." messages list the names in that order.
PLACEMENT: Registry[PlacementOps] = Registry(
    "placement",
    (BestFit, Clustering, DotProd, FGD, FGDExact, ScarcityFGD, HamiBinpack, HamiSpread, Packing, RandomFit),
)


def placement_policy(name: str) -> type[PlacementOps]:
    """The policy class registered as ``name``; UnknownPolicy lists the known names otherwise."""
    return PLACEMENT.lookup(name)


def make_policy(name: str, view: LedgerView, context: PolicyContext) -> PlacementOps:
    return placement_policy(name)(view, context)
