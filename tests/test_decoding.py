"""pagedkv.decoding: parallel sampling and beam search watched step by step, through the one engine.

The samples and beams are the engine's (equal to the dense references); the step counts are what sharing saves.
"""

import pytest

from pagedkv import BeamSearchParams, SamplingParams, beam_search_dense, generate_dense
from pagedkv.decoding import (
    GroupDecoding,
    replayed_parallel_savings,
    run_decoding,
    sharing_savings,
    synthetic_prompt,
    tiny_engine,
    tiny_model,
)

from invariants import check_manager_invariants


def test_parallel_samples_are_the_engines_and_equal_the_dense_reference():
    prompt = synthetic_prompt(9, seed=2)
    result = run_decoding("parallel", 3, prompt, 12, block_size=4, seed=7)
    want = generate_dense(tiny_model(), prompt, SamplingParams(n=3, seed=7, max_tokens=12, ignore_eos=True))
    assert [o.token_ids for o in result.output.outputs] == [o.token_ids for o in want.outputs]
    assert len({tuple(o.token_ids) for o in result.output.outputs}) == 3  # three different texts


@pytest.mark.parametrize("width", [1, 2, 4])
def test_beams_equal_beam_search_dense(width):
    prompt = synthetic_prompt(7, seed=1)
    result = run_decoding("beam", width, prompt, 10, block_size=2)
    want = beam_search_dense(tiny_model(), prompt, BeamSearchParams(beam_width=width, max_tokens=10, ignore_eos=True))
    assert [o.token_ids for o in result.output.outputs] == [o.token_ids for o in want.outputs]


def test_the_prompt_is_shared_then_copied_on_write():
    engine = tiny_engine(64, block_size=4, watermark=0.0)
    group = GroupDecoding(engine, synthetic_prompt(9), SamplingParams(n=3, seed=1, max_tokens=8))
    first = group.step()  # the prefill: one prompt sequence holds 3 blocks; sampling then forks it twice
    assert (first.num_seqs, first.blocks_in_use, first.blocks_without_sharing) == (1, 3, 3)
    assert engine.block_manager.num_free_gpu_blocks == 64 - 3
    assert sorted(engine.block_manager.snapshot().blocks[b].ref_count for b in range(3)) == [3, 3, 3]
    second = group.step()  # each writes into the shared partial block: two copy, the last writes in place
    assert second.cow_copies == 2 and second.blocks_in_use == 2 + 3 and second.blocks_without_sharing == 3 * 3
    while not group.finished:
        group.step()
        check_manager_invariants(engine.block_manager)
    assert engine.block_manager.num_free_gpu_blocks == 64  # nothing leaked


def test_beam_search_frees_dropped_beams_and_forks_share():
    engine = tiny_engine(96, block_size=4, watermark=0.0)
    group = GroupDecoding(engine, synthetic_prompt(20), BeamSearchParams(beam_width=4, max_tokens=24))
    while not group.finished:
        stats = group.step()
        check_manager_invariants(engine.block_manager)
        assert stats.blocks_in_use <= stats.blocks_without_sharing
    steps = group.steps
    assert any(s.blocks_freed for s in steps) and any(s.cow_copies for s in steps)
    assert sum(s.blocks_freed for s in steps) == engine.scheduler.num_pruned_blocks
    assert engine.block_manager.num_free_gpu_blocks == 96


def test_savings_sanity():
    parallel = [sharing_savings("parallel", w, 64, 64) for w in (2, 4, 6)]
    beam = sharing_savings("beam", 4, 64, 64)
    assert 0 < parallel[1] < beam < 1
    assert parallel == sorted(parallel) and parallel[0] < parallel[-1]  # more samples share the one prompt


def test_deterministic_and_bad_mode():
    assert sharing_savings("beam", 3, 30, 30, seed=5) == sharing_savings("beam", 3, 30, 30, seed=5)
    with pytest.raises(ValueError, match="mode"):
        sharing_savings("greedy", 2, 10, 10)


@pytest.mark.parametrize("mode", ["parallel", "beam"])
def test_the_peak_is_the_engines_own(mode):
    """One definition of the peak: counted where the step allocates, it is the engine's ``peak_gpu_blocks``."""
    engine = tiny_engine(64, block_size=4, watermark=0.0)
    result = run_decoding(mode, 4, synthetic_prompt(10), 12, block_size=4, engine=engine)
    assert result.peak_in_use == engine.stats.peak_gpu_blocks
    assert result.peak_in_use == max(s.blocks_in_use for s in result.steps)


def test_the_peak_without_sharing_counts_every_written_slot():
    """Without sharing, n samples at the last step each hold a slot for every token but the last sampled one."""
    prompt_len, output_len, n, block_size = 30, 40, 4, 4
    result = run_decoding("parallel", n, synthetic_prompt(prompt_len), output_len, block_size=block_size)
    assert result.peak_without_sharing == n * -(-(prompt_len + output_len - 1) // block_size)


@pytest.mark.parametrize("width, prompt_len, output_len, block_size", [(2, 7, 9, 4), (3, 8, 6, 4), (4, 19, 12, 16)])
def test_replayed_parallel_savings_equal_the_engines(width, prompt_len, output_len, block_size):
    """The block-manager replay (no model) gives the engine's own saving for parallel sampling."""
    engine = sharing_savings("parallel", width, prompt_len, output_len, block_size)
    assert replayed_parallel_savings(width, prompt_len, output_len, block_size) == pytest.approx(engine)


def test_admission_by_hand_hands_out_the_v1_engines_blocks():
    """Notebook 06 redoes steps of vLLM's beam-search loop with notebook 04's two calls (``get_computed_blocks``,
    then ``allocate_slots``) on a bare ``KVCacheManager``, freeing each step's requests after it: the tables, ref
    counts, names and free queue must be the ones the v1 engine's scheduler hands out at each step's scheduling."""
    from pagedkv import LLMEngine
    from pagedkv.v1 import KVCacheManager, Request

    engine = LLMEngine(tiny_model(), version="v1", num_gpu_blocks=16, block_size=4)
    steps, schedule = [], engine.scheduler.schedule

    def spy():
        out = schedule()
        tokens = [list(engine.scheduler.requests[r].all_token_ids) for r in out.scheduled_new_reqs]
        steps.append((tokens, engine.snapshot()))
        return out

    engine.scheduler.schedule = spy
    engine.generate([synthetic_prompt(7, seed=1)], BeamSearchParams(beam_width=4, max_tokens=4, ignore_eos=True))
    assert len(steps) == 4  # one engine step a beam step: every request computes its tail and samples at once

    def pool_view(state):
        return ([(b.block_id, b.ref_count, b.num_tokens, b.block_hash) for b in state.blocks],
                list(state.tables.values()), state.free_block_ids())

    pool = KVCacheManager(block_size=4, num_gpu_blocks=16)
    for step, (token_lists, engine_state) in enumerate(steps):
        requests = [Request(f"{step}.{i}", tokens, max_tokens=1) for i, tokens in enumerate(token_lists)]
        for request in requests:
            hit_blocks, num_hit_tokens = pool.get_computed_blocks(request)
            pool.allocate_slots(request, request.num_tokens - num_hit_tokens, num_hit_tokens, hit_blocks)
            request.num_computed_tokens = request.num_tokens
        assert pool_view(pool.snapshot()) == pool_view(engine_state), step
        for request in requests:
            pool.free(request)
