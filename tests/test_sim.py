import pytest

from pagedkv.sim import PARTS, Buddy, FirstFit, max_concurrent_requests, memory_breakdown, simulate, synthetic_lengths


@pytest.fixture(scope="module")
def sharegpt():
    return {p: memory_breakdown(p, "sharegpt", num_requests=300, progress=False)
            for p in ("reserve_max", "reserve_pow2", "oracle", "paged")}


def test_fractions_are_an_exact_partition(sharegpt):
    for parts in sharegpt.values():
        assert set(parts) == set(PARTS)
        assert sum(parts.values()) == pytest.approx(1.0, abs=1e-9)
        assert all(v >= -1e-12 for v in parts.values())


def test_paper_ordering_and_bounds(sharegpt):
    token = {p: parts["token_states"] for p, parts in sharegpt.items()}
    assert token["paged"] >= 0.9 and token["reserve_max"] <= 0.45
    assert token["paged"] > token["oracle"] > token["reserve_pow2"] > token["reserve_max"]
    assert sharegpt["oracle"]["internal_fragmentation"] == 0  # the oracle reserves exactly what is used


def test_deterministic_under_a_seed():
    a = simulate("paged", "alpaca", seed=3, num_requests=400, progress=False)
    b = simulate("paged", "alpaca", seed=3, num_requests=400, progress=False)
    assert a.breakdown == b.breakdown and a.steps == b.steps
    assert simulate("paged", "alpaca", seed=4, num_requests=400, progress=False).steps != a.steps


def test_workload_lengths_match_the_datasets():
    pairs = synthetic_lengths("sharegpt", 20_000, seed=0)
    mean_in = sum(p for p, _ in pairs) / len(pairs)
    mean_out = sum(o for _, o in pairs) / len(pairs)
    assert mean_in == pytest.approx(161.31, rel=0.05) and mean_out == pytest.approx(337.99, rel=0.05)
    assert all(p + o <= 2048 and p >= 1 for p, o in pairs)


def test_custom_lengths_and_every_request_finishes():
    r = simulate("oracle", lengths=[(10, 5)] * 50, budget_tokens=256, max_len=128, progress=False)
    assert r.workload == "custom" and r.steps > 0
    r = simulate("paged", lengths=[(1000, 1000)] * 6, budget_tokens=4096, progress=False)
    assert r.preemptions > 0  # growing sequences outrun the blocks: the newest is preempted and recomputed
    assert r.recomputed_tokens > 1000  # and their tokens are prefilled again, which costs time
    assert r.time > r.steps


def test_recompute_costs_time_and_swap_moves_blocks():
    recompute = simulate("paged", lengths=[(200, 600)] * 12, budget_tokens=4096, progress=False)
    swap = simulate("paged", lengths=[(200, 600)] * 12, budget_tokens=4096, progress=False, preemption_mode="swap")
    assert recompute.preemptions > 0 and recompute.recomputed_tokens > 0 and recompute.swapped_blocks == 0
    assert swap.preemptions > 0 and swap.recomputed_tokens == 0 and swap.swapped_blocks > 0


def test_requests_that_never_fit_raise_instead_of_spinning():
    with pytest.raises(ValueError, match="never fit"):
        memory_breakdown("paged", budget_tokens=2048, max_len=2048, lengths=[(2040, 8)], progress=False)
    with pytest.raises(ValueError, match="never fit"):
        memory_breakdown("paged", budget_tokens=4096, block_size=8192, num_requests=5, progress=False)
    with pytest.raises(ValueError, match="never saturated"):
        memory_breakdown("oracle", lengths=[(10, 5)] * 3, budget_tokens=4096, progress=False)


def test_bad_input():
    with pytest.raises(ValueError, match="policy"):
        memory_breakdown("buddy", "sharegpt", num_requests=10)
    with pytest.raises(ValueError, match="workload"):
        memory_breakdown("paged", "wikipedia", num_requests=10)
    with pytest.raises(ValueError, match="max_len"):
        simulate("paged", lengths=[(3000, 1)])


def test_first_fit_merges_holes():
    space = FirstFit(100)
    a, b, c = space.allocate(30), space.allocate(30), space.allocate(30)
    assert (a, b, c) == (0, 30, 60) and space.allocate(20) is None  # only 10 left
    space.free(b, 30)
    assert space.allocate(40) is None  # 30 + 10 free, but not contiguous: external fragmentation
    space.free(a, 30)
    space.free(c, 30)
    assert space.holes == [(0, 100)]


def test_buddy_rounds_up_splits_and_merges():
    space = Buddy(100)  # not a power of two: parts of 64, 32 and 4
    assert space.holes == [(0, 64), (64, 32), (96, 4)]
    assert Buddy.held(20) == 32 and Buddy.held(32) == 32 and FirstFit.held(20) == 20
    a = space.allocate(20)  # 32 slots: the smallest free block that holds them
    b = space.allocate(20)  # the 64 halved: its lower half taken, the upper one free
    assert (a, b) == (64, 0) and space.holes == [(32, 32), (96, 4)]
    assert space.allocate(40) is None  # 36 slots free, but no free block of 64
    space.free(b, 20)
    assert space.holes == [(0, 64), (96, 4)]  # b merged with its buddy, the upper half
    space.free(a, 20)
    assert space.holes == [(0, 64), (64, 32), (96, 4)]  # parts never merge


def test_the_papers_orca_baselines():
    """The paper's Orca: its Pow2 rule (prompt + the output rounded up) and a buddy allocator (§6.1), whose rounding
    is internal fragmentation, counted apart in ``rounding``."""
    from pagedkv.sim import chunk_slots  # the chunk each contiguous rule asks for, before the allocator rounds it

    assert chunk_slots("reserve_pow2_output", 161, 338) == 161 + 512 and Buddy.held(161 + 512) == 1024
    lengths = [(10, 250)] * 40
    first_fit = simulate("reserve_pow2_output", lengths=lengths, budget_tokens=2048, max_len=512, progress=False)
    buddy = simulate("reserve_pow2_output", lengths=lengths, budget_tokens=2048, max_len=512, progress=False,
                     allocator="buddy")
    share = first_fit.mean_running / 2048  # of the budget, per slot every running request holds
    assert first_fit.breakdown["internal_fragmentation"] == pytest.approx(6 * share)  # 10 + 256 slots for 260
    assert first_fit.rounding == 0 and first_fit.mean_running == 2048 // 266  # 7 at once
    assert buddy.mean_running == 4  # 266 slots take a block of 512: four fit in 2,048
    assert buddy.rounding == pytest.approx((512 - 266) * 4 / 2048)
    assert buddy.breakdown["internal_fragmentation"] == pytest.approx((512 - 260) * 4 / 2048)
    # under a buddy allocator the oracle's chunks are reserve_pow2's: all of its internal part is rounding
    oracle, pow2 = (simulate(p, "sharegpt", num_requests=200, allocator="buddy", progress=False)
                    for p in ("oracle", "reserve_pow2"))
    assert oracle.breakdown == pow2.breakdown and pow2.rounding == 0
    assert oracle.rounding > 0.1 and oracle.rounding == pytest.approx(oracle.breakdown["internal_fragmentation"])
    with pytest.raises(ValueError, match="allocator"):
        simulate("paged", "sharegpt", num_requests=10, allocator="buddy")
    with pytest.raises(ValueError, match="allocator"):
        simulate("oracle", "sharegpt", num_requests=10, allocator="best_fit")


def test_max_concurrent_requests():
    assert max_concurrent_requests("reserve_max") == 15_700 // 2048
    assert max_concurrent_requests("paged", request_len=500) == 15_700 // 512
    with pytest.raises(ValueError, match="policy"):
        max_concurrent_requests("reserve_pow2_output")  # its chunk needs the prompt's length apart


def test_the_v1_policy_serves_everything_by_recompute_with_paged_memory():
    """Issue #26: the simulator runs vLLM v1's scheduler too (one budget, chunks, recompute only)."""
    from pagedkv.sim import simulate

    v0 = simulate("paged", "sharegpt", num_requests=150, budget_tokens=4096, progress=False)
    v1 = simulate("paged_v1", "sharegpt", num_requests=150, budget_tokens=4096, progress=False)
    chunked = simulate("paged_v1", "sharegpt", num_requests=150, budget_tokens=4096, progress=False,
                       max_num_batched_tokens=256)
    for r in (v1, chunked):
        assert abs(sum(r.breakdown.values()) - 1) < 1e-9 and r.swapped_blocks == 0
        assert r.breakdown["token_states"] > 0.9 and r.preemptions > 0 and r.recomputed_tokens > 0
    assert abs(v1.breakdown["token_states"] - v0.breakdown["token_states"]) < 0.03  # the same blocks
    assert chunked.steps > v1.steps  # a 256-token budget spreads prompts over more steps


def test_external_fragmentation_split_into_holes_and_remainder():
    """reserve_max's free memory is the budget's remainder beside whole chunks, never a hole; the oracle's is
    mostly holes (the next request would fit the free slots taken together, but no single one); paging has none."""
    runs = {p: simulate(p, "sharegpt", num_requests=300, progress=False) for p in ("reserve_max", "oracle", "paged")}
    assert runs["reserve_max"].external_in_holes == 0
    assert runs["reserve_max"].breakdown["external_fragmentation"] == pytest.approx(15_700 % 2048 / 15_700, abs=1e-3)
    assert runs["oracle"].external_in_holes > 0.9
    assert runs["paged"].external_in_holes == 0
    for r in runs.values():
        assert 0 < r.saturated_time <= r.saturated_until <= r.time


def test_holes_are_told_from_a_remainder():
    # two 30-slot requests in 64 slots, then one of 40: 4 slots left over, never enough for it (no hole)
    r = simulate("oracle", lengths=[(20, 10), (20, 10), (30, 10)], budget_tokens=64, max_len=40, progress=False)
    assert r.external_in_holes == 0 and r.breakdown["external_fragmentation"] > 0
