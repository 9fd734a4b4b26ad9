"""Sequence groups in the paper's engine (v0): n samples and beam search sharing real K/V blocks.

Outputs equal the dense references (each sample decoded alone; beam search with contiguous caches) whatever the
pool, block size, preemption mode or prefix caching; the group shares its prompt's blocks, copies on write,
swaps out and back with its sharing kept, and leaks nothing.
"""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv import (
    BeamSearchParams,
    BlockSpaceManager,
    LLMEngine,
    SamplingParams,
    beam_search_dense,
    generate_dense,
    load_tiny,
)

POOLS = [
    dict(num_gpu_blocks=64, block_size=16),
    dict(num_gpu_blocks=160, block_size=1),
    dict(num_gpu_blocks=14, block_size=4),  # tight: groups preempted by recompute
    dict(num_gpu_blocks=14, block_size=4, preemption_mode="swap", num_cpu_blocks=64),
    dict(num_gpu_blocks=64, block_size=4, enable_prefix_caching=True),
]
IDS = ["roomy", "block-1", "tight-recompute", "tight-swap", "prefix"]


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny[1].encode(t) for t in ("The list ", "A class is ", "Exceptions ")]


def assert_all_blocks_free(engine):
    manager = engine.block_manager
    assert manager.num_free_gpu_blocks == manager.num_total_gpu_blocks
    assert manager.num_free_cpu_blocks == manager.num_total_cpu_blocks
    assert not manager.seq_ids


@pytest.mark.parametrize("pool", POOLS, ids=IDS)
def test_parallel_sampling_equals_each_sample_decoded_alone(tiny, prompts, pool):
    model = tiny[0]
    params = [SamplingParams(n=3, seed=s, temperature=0.9, top_p=0.95, max_tokens=14) for s in (1, 2, 3)]
    engine = LLMEngine(model, **pool)
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(i, prompt, p)
    while engine.has_unfinished_requests():
        engine.step()
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        paged, dense = engine.pop_finished(i), generate_dense(model, prompt, p)
        assert [o.token_ids for o in paged.outputs] == [o.token_ids for o in dense.outputs]
        assert [o.index for o in paged.outputs] == [0, 1, 2]
        for a, b in zip(paged.outputs, dense.outputs):
            assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-3)
    assert_all_blocks_free(engine)
    if pool["num_gpu_blocks"] == 14:
        assert engine.stats.num_preemptions > 0


@pytest.mark.parametrize("pool", POOLS, ids=IDS)
def test_beam_search_in_the_engine_equals_the_dense_reference(tiny, prompts, pool):
    model = tiny[0]
    params = BeamSearchParams(beam_width=3, max_tokens=10)
    outputs = LLMEngine(model, **pool).generate(prompts[:2], params)
    for prompt, out in zip(prompts, outputs):
        dense = beam_search_dense(model, prompt, params)
        assert [o.token_ids for o in out.outputs] == [o.token_ids for o in dense.outputs]
        for a, b in zip(out.outputs, dense.outputs):
            assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-3)


def test_a_group_shares_its_prompt_and_copies_on_write(tiny, prompts):
    """n samples hold fewer blocks than n separate requests, and their first appends copy the shared block."""
    model, prompt = tiny[0], prompts[1]  # 11 tokens: two full blocks of 4 and a partial third
    group = LLMEngine(model, num_gpu_blocks=64, block_size=4)
    group.generate([prompt], SamplingParams(n=4, seed=0, max_tokens=2))
    separate = LLMEngine(model, num_gpu_blocks=64, block_size=4)
    separate.generate([prompt] * 4, SamplingParams(seed=0, max_tokens=2))
    assert group.stats.num_cow_copies == 3  # three of the four copy the shared partial block; the last owns it
    assert separate.stats.num_cow_copies == 0
    assert group.stats.peak_gpu_blocks == 2 + 4  # 2 shared full blocks + one private last block each
    assert separate.stats.peak_gpu_blocks == 4 * 3


def test_beams_fork_and_free_every_step(tiny, prompts):
    engine = LLMEngine(tiny[0], num_gpu_blocks=64, block_size=4)
    engine.add_request("b", prompts[0], BeamSearchParams(beam_width=4, max_tokens=6))
    widths = []
    while engine.has_unfinished_requests():
        engine.step()
        if engine.scheduler.requests.get("b"):
            widths.append(len(engine.scheduler.requests["b"].seqs))
    assert widths[0] == 4 and max(widths) == 4  # one prompt, forked into four beams after the prefill
    assert engine.stats.num_cow_copies > 0
    assert_all_blocks_free(engine)


def test_a_swapped_group_keeps_its_sharing():
    manager = BlockSpaceManager(4, 16, num_cpu_blocks=16, watermark=0.0)
    manager.allocate("a", list(range(10)))  # blocks of 4, 4, 2 tokens
    manager.fork("a", "b")
    manager.fork("a", "c")
    manager.append_slots("c", [99])  # c copies the shared partial block; a and b still share all three

    def ref_counts():
        device = manager.get_device("a")
        return Counter(manager.refcount(b, device) for s in ("a", "b", "c") for b in manager.get_block_table(s))

    before = ref_counts()
    moved = manager.swap_out_group(["a", "b", "c"])
    assert len(moved) == 4  # 3 shared blocks + c's private copy: each distinct block moves once
    assert manager.num_free_cpu_blocks == 16 - 4 and ref_counts() == before
    assert manager.swap_in_group(["a", "b", "c"]) and ref_counts() == before
    assert manager.num_free_gpu_blocks == 16 - 4


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["n1", "n3", "beam2", "beam3"]),
                          st.integers(1, 8)), min_size=1, max_size=4),
       st.sampled_from([(10, 4, "recompute"), (10, 4, "swap"), (24, 2, "recompute"), (40, 8, "swap")]),
       st.booleans())
def test_any_mix_of_groups_leaks_nothing_and_equals_dense(tiny, prompts, requests, pool, caching):
    model = tiny[0]
    blocks, block_size, mode = pool
    engine = LLMEngine(model, num_gpu_blocks=blocks, block_size=block_size, preemption_mode=mode,
                       num_cpu_blocks=32, enable_prefix_caching=caching)
    kinds = {"n1": lambda m: SamplingParams(seed=m, temperature=1.0, max_tokens=m),
             "n3": lambda m: SamplingParams(n=3, seed=m, temperature=0.8, max_tokens=m),
             "beam2": lambda m: BeamSearchParams(beam_width=2, max_tokens=m),
             "beam3": lambda m: BeamSearchParams(beam_width=3, max_tokens=m)}
    params = [(prompts[p], kinds[kind](m)) for p, kind, m in requests]
    for i, (prompt, p) in enumerate(params):
        engine.add_request(i, prompt, p)
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_blocks_free(engine)
    for i, (prompt, p) in enumerate(params):
        got = engine.pop_finished(i)
        want = beam_search_dense(model, prompt, p) if isinstance(p, BeamSearchParams) else \
            generate_dense(model, prompt, p)
        width = p.beam_width if isinstance(p, BeamSearchParams) else p.n
        shared = len(prompt) // block_size  # the full prompt blocks, held once by the whole group
        peak = shared + width * (-(-(len(prompt) + p.max_tokens) // block_size) - shared)
        if peak <= blocks:  # it fits the pool alone: equal, as the contract says
            assert [o.token_ids for o in got.outputs] == [o.token_ids for o in want.outputs]
        elif not isinstance(p, BeamSearchParams):  # it outgrew the pool: cut short, never different
            for a, b in zip(got.outputs, want.outputs):
                assert a.token_ids == b.token_ids[:len(a.token_ids)]
