"""The extender binds a second share pod onto GPUs another pod of the node is still waiting on only when
both have the same slice: the device plugin's Allocate tells such pods apart by their order alone."""

from __future__ import annotations

from gpuslice.k8s.annotations import BIND_PHASE_ALLOCATED, Decision, MigChoice
from gpuslice.k8s.extender.allocating import WAIT_S, AllocatingPods


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def share(gpus: tuple[int, ...], memory: int, cores: int, node: str = "n1", **kw: object) -> Decision:
    return Decision(node, "main", gpus, tuple(f"GPU-{g}" for g in gpus), memory, cores, **kw)  # type: ignore[arg-type]


def test_a_different_slice_on_the_same_gpus_waits_until_the_first_is_allocated() -> None:
    pods = AllocatingPods(Clock())
    assert pods.claim("a", "ns", "thirty", share((0,), 1000, 30)) == ""
    assert pods.claim("b", "ns", "seventy", share((0,), 1000, 70)) == "ns/thirty"
    pods.observe("a", "ns", "thirty", share((0,), 1000, 30, phase=BIND_PHASE_ALLOCATED))
    assert pods.claim("b", "ns", "seventy", share((0,), 1000, 70)) == ""


def test_same_slices_other_gpus_other_nodes_and_mig_never_wait() -> None:
    pods = AllocatingPods(Clock())
    assert pods.claim("a", "ns", "a", share((0,), 1000, 30)) == ""
    assert pods.claim("b", "ns", "b", share((0,), 1000, 30)) == ""  # interchangeable
    assert pods.claim("c", "ns", "c", share((1,), 1000, 70)) == ""  # other GPU
    assert pods.claim("d", "ns", "d", share((0,), 1000, 70, node="n2")) == ""  # other node
    mig = share((0,), 0, 100, mig=MigChoice(0, "3g.40gb", 0, "MIG-x"))
    assert pods.claim("e", "ns", "e", mig) == ""
    # another namespace is another slice (its tenant is in the environment)
    assert pods.claim("f", "other", "f", share((0,), 1000, 30)) == "ns/a"


def test_a_pod_deleted_or_never_admitted_stops_blocking() -> None:
    clock = Clock()
    pods = AllocatingPods(clock)
    pods.claim("a", "ns", "a", share((0,), 1000, 30))
    pods.forget("a")  # deleted
    assert pods.claim("b", "ns", "b", share((0,), 2000, 30)) == ""
    clock.now += WAIT_S + 1  # the kubelet never allocated b
    assert pods.claim("c", "ns", "c", share((0,), 3000, 30)) == ""
