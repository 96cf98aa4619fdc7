"""registry: every policy family maps names to classes and rejects unknown names the same way."""

from __future__ import annotations

import pytest

from gpuslice.errors import UnknownPolicy
from gpuslice.memory.policies import EVICTION, PREFETCH, UnknownMemoryPolicy
from gpuslice.policies import PLACEMENT
from gpuslice.policies.gpuset import GPUSET
from gpuslice.policies.mig_placement import MIG_PLACEMENT
from gpuslice.policies.queue import QUEUE
from gpuslice.registry import Registry

FAMILIES = {
    "placement": PLACEMENT,
    "GPU-set": GPUSET,
    "MIG placement": MIG_PLACEMENT,
    "queue": QUEUE,
    "eviction": EVICTION,
    "prefetch": PREFETCH,
}


class Alpha:
    name = "alpha"


class Beta:
    name = "beta"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_maps_each_name_to_a_class_called_by_that_name(family: str) -> None:
    registry = FAMILIES[family]
    assert isinstance(registry, Registry) and len(registry) > 1
    for name, cls in registry.items():
        assert isinstance(cls, type) and cls.name == name
        assert registry.lookup(name) is cls and name in registry


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_rejects_an_unknown_name_listing_the_known_ones_in_order(family: str) -> None:
    registry = FAMILIES[family]
    with pytest.raises(UnknownPolicy) as info:
        registry.lookup("no-such-policy")
    assert str(info.value) == (f"'no-such-policy' is not a {family} policy; known: {', '.join(registry)}")
    with pytest.raises(UnknownPolicy):
        registry["no-such-policy"]
    assert "no-such-policy" not in registry and registry.get("no-such-policy") is None


def test_the_memory_families_raise_their_own_subclass() -> None:
    with pytest.raises(UnknownMemoryPolicy):
        EVICTION["lru"]


def test_a_registry_keeps_the_order_classes_were_given_in() -> None:
    assert list(Registry("toy", (Beta, Alpha))) == ["beta", "alpha"]


def test_two_classes_with_one_name_or_a_class_without_a_name_are_refused() -> None:
    with pytest.raises(TypeError, match="two toy policies are called 'alpha'"):
        Registry("toy", (Alpha, Alpha))
    with pytest.raises(TypeError, match="has no policy name"):
        Registry("toy", (int,))
