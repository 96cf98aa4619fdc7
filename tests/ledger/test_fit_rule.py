"""ledger.fit: the one fit rule. ``Ledger.fits`` (the fast form sim calls per pod) and ``fit_code`` (its
one-node form in plain numbers) agree with it, ``why_not`` counts its codes, and ``check`` refuses a
chosen GPU for the reason the rule gives when that GPU is the only one."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger import FITS, Ledger, Placement, Refusal, RefusalCode, code_number, code_of, fit_codes
from gpuslice.ledger.fit import CHECKS, Rows, fit_code, refusal_at
from gpuslice.ledger.placement import Unit
from gpuslice.units import GiB
from gpuslice.workload.request import Request

NODES = [
    NodeSpec("a", 8000, 64 * GiB, 4, "V100M16", gpu_memory_bytes=16 * GiB),
    NodeSpec("b", 8000, 64 * GiB, 2, "T4", gpu_memory_bytes=16 * GiB),
    NodeSpec("c", 4000, 32 * GiB, 0, ""),
]


def _random_request(rng: random.Random) -> Request:
    n = rng.choice([0, 1, 1, 2, 3])
    return Request(
        cpu_milli=rng.choice([0, 1000, 4000]),
        memory_bytes=rng.choice([0, 8 * GiB, 40 * GiB]),
        num_gpu=n,
        gpu_milli=(rng.choice([1, 300, 700, 1000]) if n == 1 else 1000) if n else 0,
        gpu_memory_bytes=rng.choice([0, 4 * GiB, 12 * GiB]) if n else 0,
        gpu_models=rng.choice([(), ("T4",)]) if n else (),
    )


def test_fits_is_the_fit_rule_and_why_not_counts_its_codes() -> None:
    rng = random.Random(3)
    seen: set[RefusalCode | None] = set()
    for _ in range(60):
        ledger = Ledger(NODES)
        for _ in range(rng.randint(0, 12)):
            req = _random_request(rng)
            node = rng.randrange(len(NODES))
            gpus = rng.sample(range(NODES[node].gpu_count), min(req.num_gpu, NODES[node].gpu_count))
            ledger.reserve(node, gpus, req)
        req = _random_request(rng)
        codes = ledger.refusal_codes(req)
        np.testing.assert_array_equal(ledger.fits(req), codes == FITS)
        counted = {code_of(int(c)) for c in codes if c}
        assert set(ledger.why_not(req)) == counted
        assert sum(ledger.why_not(req).values()) == int((codes != FITS).sum())
        seen |= counted | ({None} if (codes == FITS).any() else set())
    assert {None, RefusalCode.INSUFFICIENT_GPU, RefusalCode.GPU_MODEL_NOT_ALLOWED} <= seen


def test_the_one_node_form_gives_the_vectorised_rules_code_on_random_rows() -> None:
    """``fit_code`` on plain numbers and ``fit_codes`` on a one-row array: the same code for random
    requests (MIG ones among them) and random rows, every check reached."""
    rng = random.Random(11)
    seen = set()
    for _ in range(3000):
        mig = rng.random() < 0.15
        req = _random_request(rng)
        if mig:
            req = Request(cpu_milli=req.cpu_milli, memory_bytes=req.memory_bytes, mig_profile="1g.10gb",
                          gpu_models=rng.choice([(), ("A100",)]))  # fmt: skip
        g = rng.choice([1, 2, 4, 8])
        milli = [rng.choice([0, 100, 300, 700, 1000]) for _ in range(g)]
        memory = [rng.choice([0, 2 * GiB, 6 * GiB, 16 * GiB]) for _ in range(g)]
        usable = [rng.random() < 0.8 for _ in range(g)] if rng.random() < 0.5 else None
        model_ok, slot = rng.random() < 0.85, (rng.random() < 0.6) if mig else None
        cpu = rng.choice([None, 0, 2000, 8000])
        host = rng.choice([None, 0, 16 * GiB, 64 * GiB])
        vector = fit_codes(
            req,
            np.array([model_ok]),
            None if usable is None else np.array([usable]),
            np.array([milli]),
            np.array([memory]),
            None if cpu is None else np.array([cpu]),
            None if host is None else np.array([host]),
            None if slot is None else np.array([slot]),
        )
        one = fit_code(req, model_ok, milli, memory, cpu, host, slot, usable)
        assert one == int(vector[0]), (req, model_ok, usable, milli, memory, cpu, host, slot)
        seen.add(one)
    assert seen == {FITS, *(code_number(c) for c in CHECKS)}


def test_the_checks_run_model_usable_memory_compute_cpu_memory() -> None:
    req = Request(cpu_milli=4000, memory_bytes=GiB, num_gpu=1, gpu_milli=500, gpu_memory_bytes=8 * GiB)
    row = np.zeros((1, 2), dtype=np.int64)
    cases = [  # (model ok, usable, free milli, free memory, free cpu) -> code
        (False, [True, True], [0, 0], [0, 0], 0, RefusalCode.GPU_MODEL_NOT_ALLOWED),
        (True, [False, False], [1000, 1000], [16 * GiB] * 2, 8000, RefusalCode.NO_USABLE_GPU),
        (True, [True, True], [0, 0], [0, 0], 0, RefusalCode.INSUFFICIENT_GPU_MEMORY),
        (True, [True, True], [0, 1000], [16 * GiB, 0], 0, RefusalCode.INSUFFICIENT_GPU),
        (True, [True, False], [1000, 0], [16 * GiB, 0], 0, RefusalCode.INSUFFICIENT_CPU),
        (True, [True, False], [1000, 0], [16 * GiB, 0], 8000, None),
    ]
    for model_ok, usable, milli, memory, cpu, expected in cases:
        codes = fit_codes(
            req,
            np.array([model_ok]),
            np.array([usable]),
            row + milli,
            row + memory,
            np.array([cpu]),
            np.array([64 * GiB]),
        )
        assert code_of(int(codes[0])) is expected
        assert expected is None or int(codes[0]) == code_number(expected)


def test_check_refuses_for_the_reason_the_fit_rule_gives() -> None:
    ledger = Ledger(NODES[:1])
    assert isinstance(
        ledger.reserve(0, (0,), Request(0, num_gpu=1, gpu_milli=800, gpu_memory_bytes=10 * GiB)), Placement
    )
    req = Request(0, num_gpu=1, gpu_milli=500, gpu_memory_bytes=8 * GiB)  # both short on GPU 0
    usable = np.zeros((1, 8), dtype=bool)
    usable[0, 0] = True
    rule = code_of(int(ledger.refusal_codes(req, slice(0, 1), usable)[0]))
    refusal = ledger.check(0, (0,), req)
    assert refusal is not None and refusal.code is rule is RefusalCode.INSUFFICIENT_GPU_MEMORY


def test_a_mig_request_is_judged_by_the_same_rule_model_slot_cpu_memory() -> None:
    """MIG requests through the same rule: ``fits`` equals ``refusal_codes == 0``, the codes are the
    first failing of model, free MIG start (read from each MIG GPU's held instances), CPU, memory, and
    a node fits exactly when a reservation of some free start there succeeds."""
    table = mig_gpu("A100-80GB")
    nodes = [
        NodeSpec("m", 8000, 64 * GiB, 2, "A100-80GB", gpu_memory_bytes=80 * GiB),
        NodeSpec("h", 8000, 64 * GiB, 2, "H100", gpu_memory_bytes=80 * GiB),
        NodeSpec("t", 8000, 64 * GiB, 2, "T4", gpu_memory_bytes=16 * GiB),
    ]
    mig = {(0, 0): table, (0, 1): table, (1, 0): mig_gpu("H100")}
    rng = random.Random(5)
    seen: set[RefusalCode | None] = set()
    for _ in range(80):
        ledger = Ledger(nodes, mig=mig)
        for _ in range(rng.randint(0, 10)):
            node, gpu = rng.choice(list(mig))
            profile = rng.choice(mig[node, gpu].profiles)
            ledger.reserve_mig(node, gpu, MigInstance(profile, rng.choice(profile.starts)),
                               Request(rng.choice([0, 2000]), mig_profile=profile.name))  # fmt: skip
        req = Request(
            rng.choice([0, 4000, 9000]),
            rng.choice([0, 80 * GiB]),
            gpu_models=rng.choice([(), ("H100",)]),
            mig_profile=rng.choice(["1g.10gb", "3g.40gb", "7g.80gb"]),
        )
        codes = ledger.refusal_codes(req)
        np.testing.assert_array_equal(ledger.fits(req), codes == FITS)
        for node in range(len(nodes)):
            reservable = any(
                ledger.check_mig(node, gpu, MigInstance(p, s), req) is None
                for (n, gpu), g in mig.items() if n == node
                for p in g.profiles if p.name == req.mig_profile
                for s in p.starts
            )  # fmt: skip
            assert reservable == (codes[node] == FITS), (node, req, codes)
        seen |= {code_of(int(c)) for c in codes}
    assert {None, RefusalCode.NO_MIG_SLOT, RefusalCode.GPU_MODEL_NOT_ALLOWED,
            RefusalCode.INSUFFICIENT_CPU, RefusalCode.INSUFFICIENT_MEMORY} <= seen  # fmt: skip


def test_reserve_names_the_fit_rules_first_reason_for_a_node_that_fails_several_checks() -> None:
    """A node lacking both the GPU model and the CPU: the rule says the model (it is checked first), and
    so must ``reserve``, or a pending reason and a refused placement would disagree about one node."""
    rng = random.Random(5)
    for _ in range(300):
        ledger = Ledger(NODES)
        request = _random_request(rng)
        codes = ledger.refusal_codes(request)
        for node, spec in enumerate(NODES):
            if request.num_gpu > spec.gpu_count:
                continue  # no GPU set of that size to name on this node
            gpus = tuple(range(request.num_gpu))
            refusal = ledger.check(node, gpus, request)
            if codes[node] in (code_number(c) for c in (RefusalCode.GPU_MODEL_NOT_ALLOWED,
                                                        RefusalCode.INSUFFICIENT_CPU,
                                                        RefusalCode.INSUFFICIENT_MEMORY)):  # fmt: skip
                assert refusal is not None and refusal.code == code_of(codes[node]), (node, request)
    mixed = Request(cpu_milli=9000, num_gpu=1, gpu_milli=1000, gpu_models=("T4",))
    assert code_of(Ledger(NODES).refusal_codes(mixed)[0]) == RefusalCode.GPU_MODEL_NOT_ALLOWED
    refusal = Ledger(NODES).check(0, (0,), mixed)
    assert refusal is not None and refusal.code == RefusalCode.GPU_MODEL_NOT_ALLOWED


def test_a_request_that_takes_exactly_what_is_free_fits() -> None:
    """GPU memory, host memory and CPU each asked to the byte (milli) of what is free: it fits; one more
    does not, with the check that fails named."""
    ledger = Ledger(NODES)
    exact = Request(
        cpu_milli=8000, memory_bytes=64 * GiB, num_gpu=1, gpu_milli=1000, gpu_memory_bytes=16 * GiB
    )
    assert code_of(ledger.refusal_codes(exact)[0]) is None
    assert ledger.fits(exact)[0]
    for more, code in (
        ({"gpu_memory_bytes": 16 * GiB + 1}, RefusalCode.INSUFFICIENT_GPU_MEMORY),
        ({"memory_bytes": 64 * GiB + 1}, RefusalCode.INSUFFICIENT_MEMORY),
        ({"cpu_milli": 8001}, RefusalCode.INSUFFICIENT_CPU),
    ):
        fields = {"cpu_milli": 8000, "memory_bytes": 64 * GiB, "num_gpu": 1, "gpu_milli": 1000,
                  "gpu_memory_bytes": 16 * GiB, **more}  # fmt: skip
        assert code_of(ledger.refusal_codes(Request(**fields))[0]) == code, more


def test_only_refusals_about_what_others_hold_are_curable_by_preemption() -> None:
    """The one rule of what an eviction can cure (Kubernetes' Unschedulable vs UnschedulableAndUnresolvable):
    a node that is not there, whose GPU model the request rules out, or a GPU choice that is wrong in
    itself stays refused whoever leaves, and so does an unhealthy GPU; free GPU, GPU memory, CPU, memory,
    MIG slots and a held node come back when others go. The verdict arrays read the same rule by number."""
    from gpuslice.ledger.fit import UNCURABLE

    uncurable = {c for c in RefusalCode if not c.curable}
    assert uncurable == {
        RefusalCode.NO_SUCH_NODE,
        RefusalCode.GPU_MODEL_NOT_ALLOWED,
        RefusalCode.WRONG_GPU_COUNT,
        RefusalCode.NO_SUCH_GPU,
        RefusalCode.DUPLICATE_GPU,
        RefusalCode.UNHEALTHY_GPU,
    }
    assert not UNCURABLE[FITS]
    assert [bool(UNCURABLE[code_number(c)]) for c in RefusalCode] == [not c.curable for c in RefusalCode]


# ---- amounts -----------------------------------------------------------------------------------------


def gpu_memory_refusal(node: int, need: int, free: int, capacity: int) -> Refusal:
    return Refusal(
        RefusalCode.INSUFFICIENT_GPU_MEMORY,
        node,
        need=need,
        free=free,
        capacity=capacity,
        unit=Unit.GPU_MEMORY,
    )


def _two_nodes() -> Ledger:
    """Two 4-GPU nodes of 16 GiB GPUs; GPU memory taken: node 0 [10, 4, 12, 16] GiB, node 1 [6, 6, 6, 6]."""
    ledger = Ledger(
        [NodeSpec(f"n{i}", 8_000, 32 * GiB, 4, "A100", gpu_memory_bytes=16 * GiB) for i in range(2)]
    )
    for node, taken in enumerate(([10, 4, 12, 16], [6, 6, 6, 6])):
        for gpu, gib in enumerate(taken):
            ledger.reserve(
                node, (gpu,), Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=gib * GiB)
            )
    return ledger


def test_a_refusal_on_gpu_memory_gives_what_the_best_set_of_gpus_could_give_each() -> None:
    """Two whole GPUs with 8 GiB free each on node 0, whose free memory is [6, 12, 4, 0] GiB: the best
    pair gives 6 GiB each (the second most free), of 16 GiB GPUs."""
    req = Request(cpu_milli=0, num_gpu=2, gpu_milli=1000, gpu_memory_bytes=8 * GiB)
    refused = _two_nodes().refusal(0, req)
    assert refused == gpu_memory_refusal(0, 8 * GiB, 6 * GiB, 16 * GiB)
    assert refused.amounts == "need 8 GiB, free 6 GiB of 16 GiB GPU memory"
    # all four: the fourth most free has nothing free (and the node's empty slots count for nothing)
    four = Request(cpu_milli=0, num_gpu=4, gpu_milli=1000, gpu_memory_bytes=8 * GiB)
    assert _two_nodes().refusal(0, four).free == 0


def test_the_closest_node_is_the_one_with_the_most_of_the_missing_resource_free() -> None:
    """11 GiB and 950 milli on one GPU fit neither node: node 0 has the memory (12 GiB on GPU 1) but 900
    milli free on each GPU, node 1 has 10 GiB free at most. One node fails each check; on a tie the
    earlier check of the fit rule is the one reported (GPU memory), so node 1 with its 10 GiB."""
    ledger = _two_nodes()
    req = Request(cpu_milli=0, num_gpu=1, gpu_milli=950, gpu_memory_bytes=11 * GiB)
    assert [code_of(int(c)) for c in ledger.refusal_codes(req)] == [
        RefusalCode.INSUFFICIENT_GPU,
        RefusalCode.INSUFFICIENT_GPU_MEMORY,
    ]
    closest = ledger.closest(req)
    assert closest == gpu_memory_refusal(1, 11 * GiB, 10 * GiB, 16 * GiB)
    # A whole GPU: every GPU of both nodes holds a share, so none is free; the first node is reported
    whole = Request(cpu_milli=0, num_gpu=1, gpu_milli=1000)
    assert ledger.closest(whole) == Refusal(
        RefusalCode.INSUFFICIENT_GPU, 0, need=1, free=0, capacity=4, unit=Unit.GPUS
    )
    cpu = Request(cpu_milli=9_000)
    assert ledger.reserve(1, (), Request(cpu_milli=1_000)) is not None
    assert ledger.closest(cpu) == Refusal(
        RefusalCode.INSUFFICIENT_CPU, 0, need=9_000, free=8_000, capacity=8_000, unit=Unit.CPU_MILLI
    )
    assert ledger.closest(Request(cpu_milli=1_000)) is None  # it fits somewhere


def test_the_amounts_of_each_resource_code_on_one_node() -> None:
    """Per code, what ``Ledger.refusal`` reports: GPUs the home lets it use against the GPUs there, a
    share's compute on the GPUs with its memory (not the freest GPU overall), whole GPUs counted, and no
    amounts for a code that names no resource."""
    ledger = Ledger([NodeSpec("n", 8_000, 32 * GiB, 4, "A100", gpu_memory_bytes=16 * GiB)])
    whole = Request(cpu_milli=0, num_gpu=1, gpu_milli=1000)
    assert isinstance(ledger.reserve(0, (0,), whole), Placement)  # GPU 0: no compute, all its memory
    big = Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=12 * GiB)
    for gpu in (1, 2):  # GPUs 1, 2: 900 milli and 4 GiB free
        assert isinstance(ledger.reserve(0, (gpu,), big), Placement)
    small = Request(cpu_milli=0, num_gpu=1, gpu_milli=600, gpu_memory_bytes=10 * GiB)
    assert isinstance(ledger.reserve(0, (3,), small), Placement)  # GPU 3: 400 milli and 6 GiB free
    usable = np.array([True, True, False, False, False, False, False, False])
    three = Request(cpu_milli=0, num_gpu=3, gpu_milli=1000)
    assert ledger.refusal(0, three, usable) == Refusal(
        RefusalCode.NO_USABLE_GPU, 0, need=3, free=2, capacity=4, unit=Unit.GPUS
    )
    # 6 GiB and 500 milli: only GPUs 0 and 3 have the memory; the most compute free there is GPU 3's
    # 400 (GPUs 1 and 2 have 900 but not the memory)
    share = Request(cpu_milli=0, num_gpu=1, gpu_milli=500, gpu_memory_bytes=6 * GiB)
    assert ledger.refusal(0, share) == Refusal(
        RefusalCode.INSUFFICIENT_GPU, 0, need=500, free=400, capacity=1000, unit=Unit.GPU_MILLI
    )
    # 16 GiB: GPU 0 has exactly that much free, but no compute at all
    full = Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=16 * GiB)
    assert ledger.refusal(0, full) == Refusal(
        RefusalCode.INSUFFICIENT_GPU, 0, need=100, free=0, capacity=1000, unit=Unit.GPU_MILLI
    )
    # four GPUs with 8 GiB each: the fourth most free has 4 GiB
    four = Request(cpu_milli=0, num_gpu=4, gpu_milli=1000, gpu_memory_bytes=8 * GiB)
    assert ledger.refusal(0, four) == gpu_memory_refusal(0, 8 * GiB, 4 * GiB, 16 * GiB)
    t4 = Request(cpu_milli=0, num_gpu=1, gpu_milli=1000, gpu_models=("T4",))
    assert ledger.refusal(0, t4) == Refusal(RefusalCode.GPU_MODEL_NOT_ALLOWED, 0)
    assert ledger.refusal(0, t4).amounts == ""


def test_the_amounts_of_many_nodes_are_each_nodes_own() -> None:
    """``closest`` over nodes that fail alike compares each node's own amounts: whole GPUs free per node
    (one node has one free GPU, the other none), and usable GPUs per node."""
    ledger = Ledger(
        [NodeSpec(f"n{i}", 8_000, 32 * GiB, 4, "A100", gpu_memory_bytes=16 * GiB) for i in range(2)]
    )
    whole = Request(cpu_milli=0, num_gpu=1, gpu_milli=1000)
    for node, gpus in ((0, (0, 1, 2, 3)), (1, (0, 1, 2))):
        for gpu in gpus:
            assert isinstance(ledger.reserve(node, (gpu,), whole), Placement)
    two = Request(cpu_milli=0, num_gpu=2, gpu_milli=1000)
    assert ledger.closest(two) == Refusal(
        RefusalCode.INSUFFICIENT_GPU, 1, need=2, free=1, capacity=4, unit=Unit.GPUS
    )
    usable = np.zeros((2, 8), dtype=bool)
    usable[0, :1] = True  # node 0 lets it use one GPU, node 1 three
    usable[1, :3] = True
    codes = ledger.refusal_codes(Request(cpu_milli=0, num_gpu=2, gpu_milli=1000), slice(None), usable)
    assert [code_of(int(c)) for c in codes] == [RefusalCode.NO_USABLE_GPU, RefusalCode.INSUFFICIENT_GPU]
    four = Request(cpu_milli=0, num_gpu=4, gpu_milli=1000)
    assert ledger.closest(four, usable=usable) == Refusal(
        RefusalCode.NO_USABLE_GPU, 1, need=4, free=3, capacity=4, unit=Unit.GPUS
    )


def test_the_gpu_memory_capacity_is_the_largest_usable_gpus_of_that_node() -> None:
    """On nodes of mixed GPUs the capacity reported is the node's own largest usable GPU, not another
    node's or another slot's: node 0 has 16 and 40 GiB GPUs, node 1 two 24 GiB ones."""
    nodes = [
        NodeSpec("mixed", 8_000, 32 * GiB, 2, "A100", gpu_memory_each=(16 * GiB, 40 * GiB)),
        NodeSpec("even", 8_000, 32 * GiB, 2, "A100", gpu_memory_bytes=24 * GiB),
    ]
    ledger = Ledger(nodes)
    req = Request(cpu_milli=0, num_gpu=1, gpu_milli=100, gpu_memory_bytes=48 * GiB)
    assert ledger.refusal(0, req) == gpu_memory_refusal(0, 48 * GiB, 40 * GiB, 40 * GiB)
    assert ledger.refusal(1, req).capacity == 24 * GiB
    assert ledger.closest(req) == ledger.refusal(0, req)  # 40 GiB free beats 24


def test_a_mig_request_judged_without_its_slots_is_refused_naming_the_argument() -> None:
    """A home that forgets ``mig_slot`` for a MIG request gets an error that names the argument to pass
    and what it holds, in both forms of the rule, rather than a verdict that skipped the slot check."""
    req = Request(0, mig_profile="1g.10gb")
    expected = "^a MIG request is judged with mig_slot \\(the node's free MIG starts\\)$"
    with pytest.raises(ValueError, match=expected):
        fit_codes(req, np.array([True]), None, np.zeros((1, 1)), np.zeros((1, 1)))
    with pytest.raises(ValueError, match=expected):
        fit_code(req, True, [0], [0])


def test_the_model_and_mig_slot_masks_may_be_any_truth_values() -> None:
    """``model_ok`` and ``mig_slot`` are read as truth values, so masks of 0/1 numbers give the verdicts of
    the same masks as bools (``fit_code`` reads its one node's the same way), never a bitwise not."""
    mig = Request(1000, mig_profile="1g.10gb", gpu_models=("A100",))
    whole = Request(1000, num_gpu=1, gpu_milli=1000)
    model_ok, slot = np.array([1, 0, 1, 0], dtype=np.uint8), np.array([1, 1, 0, 0], dtype=np.uint8)
    free_milli, free_memory = np.full((4, 1), 1000), np.full((4, 1), 16 * GiB)
    cpu = np.full(4, 4000)
    for req in (mig, whole):
        as_numbers = fit_codes(req, model_ok, None, free_milli, free_memory, cpu, None, slot)
        as_bools = fit_codes(
            req, model_ok.astype(bool), None, free_milli, free_memory, cpu, None, slot.astype(bool)
        )
        np.testing.assert_array_equal(as_numbers, as_bools)
        one_node = [
            fit_code(req, bool(m), [1000], [16 * GiB], 4000, None, bool(s))
            for m, s in zip(model_ok, slot, strict=True)
        ]
        np.testing.assert_array_equal(as_numbers, one_node)
    model, no_slot = code_number(RefusalCode.GPU_MODEL_NOT_ALLOWED), code_number(RefusalCode.NO_MIG_SLOT)
    np.testing.assert_array_equal(
        fit_codes(mig, model_ok, None, free_milli, free_memory, cpu, None, slot),
        [FITS, model, no_slot, model],
    )


def test_the_one_node_form_refuses_gpu_columns_of_different_lengths() -> None:
    """Free milli and free memory given for different numbers of GPUs is a home's bug: ``fit_code`` raises
    instead of judging only the GPUs both name."""
    req = Request(0, num_gpu=1, gpu_milli=500)
    with pytest.raises(ValueError, match="zip"):
        fit_code(req, True, [1000, 1000], [16 * GiB])
    with pytest.raises(ValueError, match="zip"):
        fit_code(req, True, [0], [16 * GiB, 16 * GiB])


def test_a_refusal_at_a_given_row_is_that_rows_even_where_another_has_more_free() -> None:
    """``refusal_at`` with ``k`` reports row ``k``'s amounts and node, not the row with the most free (which
    it picks only when ``k`` is None)."""
    ledger = Ledger(
        [NodeSpec(f"n{i}", 8_000, 32 * GiB, 1, "A100", gpu_memory_bytes=16 * GiB) for i in range(2)]
    )
    assert isinstance(ledger.reserve(1, (), Request(cpu_milli=6_000)), Placement)
    no_gpu = np.zeros((2, 1), dtype=np.int64)
    view = ledger.view
    rows = Rows(
        no_gpu, no_gpu, no_gpu, no_gpu == 0, view.free_cpu_milli, view.cpu_capacity_milli, no_gpu, no_gpu
    )
    cpu = Request(cpu_milli=9_000)
    nodes = (7, 9)  # the rows' node numbers, as a home's subset of nodes gives them
    assert refusal_at(RefusalCode.INSUFFICIENT_CPU, cpu, rows, nodes, 1) == Refusal(
        RefusalCode.INSUFFICIENT_CPU, 9, need=9_000, free=2_000, capacity=8_000, unit=Unit.CPU_MILLI
    )
    assert refusal_at(RefusalCode.INSUFFICIENT_CPU, cpu, rows, nodes).node == 7  # the most free


def test_a_node_the_request_fits_has_no_refusal() -> None:
    ledger = Ledger(NODES)
    share = Request(cpu_milli=1000, num_gpu=1, gpu_milli=500)
    assert ledger.refusal(0, share) is None
    assert ledger.refusal(2, share) == Refusal(RefusalCode.GPU_MODEL_NOT_ALLOWED, 2)  # no GPUs at all


def test_the_closest_node_is_none_where_the_request_fits_on_one_of_the_rows() -> None:
    """Node "a" has the CPU for 6 CPUs, "b" (after a reserve) and "c" do not: the request fits, so there is
    no closest refusal, over every node or over rows that include "a"; over "b" and "c" there is."""
    ledger = Ledger(NODES)
    assert isinstance(ledger.reserve(1, (), Request(cpu_milli=4_000)), Placement)
    six = Request(cpu_milli=6_000)
    assert ledger.closest(six) is None
    assert ledger.closest(six, rows=np.array([2, 0])) is None
    assert ledger.closest(six, rows=np.array([1, 2])) == Refusal(
        RefusalCode.INSUFFICIENT_CPU, 1, need=6_000, free=4_000, capacity=8_000, unit=Unit.CPU_MILLI
    )


def test_the_closest_node_is_among_the_rows_asked_and_by_the_codes_given() -> None:
    """``rows`` limits the search to those nodes (the most free CPU elsewhere is not reported), and a home's
    own ``codes`` are what is counted, not the rule's codes recomputed."""
    ledger = Ledger(NODES)
    nine = Request(cpu_milli=9_000)
    assert ledger.closest(nine).node == 0  # 8 CPUs free on "a" and "b": the first
    assert ledger.closest(nine, rows=[2]) == Refusal(
        RefusalCode.INSUFFICIENT_CPU, 2, need=9_000, free=4_000, capacity=4_000, unit=Unit.CPU_MILLI
    )
    memory = code_number(RefusalCode.INSUFFICIENT_MEMORY)
    given = [memory, memory, code_number(RefusalCode.INSUFFICIENT_CPU)]  # the home says: memory on a, b
    assert ledger.closest(nine, codes=given) == Refusal(
        RefusalCode.INSUFFICIENT_MEMORY, 0, need=0, free=64 * GiB, capacity=64 * GiB, unit=Unit.MEMORY
    )
    assert ledger.why_not(nine, np.array(given)) == {
        RefusalCode.INSUFFICIENT_MEMORY: 2, RefusalCode.INSUFFICIENT_CPU: 1
    }  # fmt: skip
    assert ledger.why_not(nine) == {RefusalCode.INSUFFICIENT_CPU: 3}
