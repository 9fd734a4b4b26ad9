"""pagedkv.v1: vLLM today's KV cache manager and scheduler, and the engine running them.

One token budget, chunked prefill, recompute only, a prefix hit capped at num_tokens - 1, n > 1 fanned out,
beam search as a loop outside the engine. Outputs equal v0's and the dense references.
"""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv import (
    BeamSearchParams,
    LLMEngine,
    PagedKVError,
    SamplingParams,
    beam_search,
    beam_search_dense,
    generate_dense,
    hash_block_tokens,
    load_tiny,
)
from pagedkv.v1 import KVCacheManager, Scheduler
from pagedkv.viz import draw_block_map


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


def scheduler(num_blocks=16, block_size=4, caching=True, **kwargs):
    return Scheduler(KVCacheManager(block_size, num_blocks, enable_caching=caching), **kwargs)


def run(s, sampled_token=7):
    """One step of the scheduler alone; every request that reaches its end samples ``sampled_token``."""
    out = s.schedule()
    s.update_from_output(out, {r: sampled_token for r in s.sampling_request_ids(out)})
    return out


def check_blocks(s: Scheduler):
    """Ref counts are the number of requests pointing at a block; every running request has slots for its
    computed tokens; waiting ones hold nothing."""
    kv = s.kv_cache_manager
    users = Counter(b for blocks in kv.req_to_blocks.values() for b in blocks)
    for b in range(kv.num_gpu_blocks):
        assert kv.allocator.refcount(b) == users[b]
    assert kv.num_free_blocks == kv.num_gpu_blocks - len(users)
    assert set(kv.req_to_blocks) == set(s.running)
    for request_id in s.running:
        request = s.requests[request_id]
        assert len(kv.req_to_blocks[request_id]) * kv.block_size >= request.num_computed_tokens
    if kv.prefix_cache is not None:  # a name may have several blocks, each named by it and holding its content
        cache = kv.prefix_cache
        assert sorted(b for blocks in cache.hash_to_blocks.values() for b in blocks) == sorted(cache.block_to_hash)
        for block_hash, blocks in cache.hash_to_blocks.items():
            assert blocks and all(cache.block_to_hash[b] == block_hash for b in blocks)
            assert all(hash_block_tokens(*cache.content(b)) == block_hash for b in blocks)


# --------------------------------------------------------------- KVCacheManager
def test_a_full_prefix_hit_is_capped_so_the_last_block_is_recomputed():
    s = scheduler(block_size=4)
    s.add_request("a", list(range(12)), 1)
    run(s)
    s.add_request("b", list(range(12)), 1)  # the same 12 tokens: 3 full blocks cached
    blocks, num_computed = s.kv_cache_manager.get_computed_blocks(s.requests["b"])
    assert num_computed == 8 and len(blocks) == 2  # at most 11 tokens, in whole blocks
    out = run(s)
    assert out.num_scheduled_tokens == {"b": 4} and s.requests.get("b") is None  # 4 tokens ran, then it sampled


def test_allocate_slots_returning_none_changes_nothing():
    s = scheduler(num_blocks=4, block_size=4)
    s.add_request("a", list(range(10)), 5)
    run(s)
    kv, request = s.kv_cache_manager, s.requests["a"]
    before = kv.snapshot()
    assert kv.allocate_slots(request, 20) is None
    assert kv.snapshot() == before


def test_free_returns_the_tail_first_and_the_snapshot_draws():
    s = scheduler(num_blocks=6, block_size=2, caching=False)
    s.add_request("a", [1, 2, 3, 4, 5], 1)
    out = run(s)
    assert out.num_scheduled_tokens == {"a": 5} and s.finished["a"] == [7]
    # 0.33's BlockPool.free_blocks: hash-less blocks go to the head, tail block first (vLLM's ids are one higher)
    assert s.kv_cache_manager.allocator.free_block_ids() == [2, 1, 0, 3, 4, 5]
    s.add_request("b", [1, 2, 3], 3)
    run(s)
    draw_block_map(s.kv_cache_manager.snapshot())


# --------------------------------------------------------------- the scheduler
def test_a_long_prompt_is_chunked_under_the_budget_beside_running_decodes():
    s = scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=8)
    s.add_request("short", [1, 2, 3], 10)
    run(s)  # its prefill; it decodes from now on
    s.add_request("long", list(range(20)), 2)
    chunks = []
    while "long" in s.requests:
        out = run(s)
        assert out.total_num_scheduled_tokens <= 8
        assert out.num_scheduled_tokens["short"] == 1  # the decode runs every step, first
        chunks.append(out.num_scheduled_tokens["long"])
    assert chunks[:3] == [7, 7, 6] and chunks[3:] == [1]  # 20 prompt tokens in three chunks, then a decode


def test_long_prefill_token_threshold_caps_a_chunk():
    """Rule T (0.33's Scheduler.schedule): the threshold applies only when more than one request is running or
    waiting as the step begins; a lone request starves nobody and takes the whole budget."""
    s = scheduler(num_blocks=32, max_num_batched_tokens=100, long_prefill_token_threshold=5)
    s.add_request("a", list(range(12)), 1)
    assert run(s).num_scheduled_tokens == {"a": 12} and s.finished["a"] == [7]  # alone: one chunk, not 5, 5, 2
    s = scheduler(num_blocks=32, max_num_batched_tokens=100, long_prefill_token_threshold=5)
    s.add_request("a", list(range(12)), 1)
    s.add_request("b", [1, 2, 3], 1)
    assert run(s).num_scheduled_tokens == {"a": 5, "b": 3}  # two waiting: a is capped; b finishes
    assert run(s).num_scheduled_tokens == {"a": 7}  # a is alone now: the rest in one chunk
    assert s.finished == {"b": [7], "a": [7]}


def test_a_request_samples_only_when_its_chunk_reaches_its_end():
    s = scheduler(num_blocks=32, max_num_batched_tokens=4)
    s.add_request("a", list(range(10)), 3)
    out = s.schedule()
    assert s.sampling_request_ids(out) == []
    s.update_from_output(out, {})
    assert s.requests["a"].num_computed_tokens == 4 and s.requests["a"].output_token_ids == []


def test_preemption_recomputes_the_last_running_request_and_admits_nobody_that_step():
    s = scheduler(num_blocks=4, block_size=2, caching=False)
    for name in ("a", "b"):
        s.add_request(name, [1, 2, 3, 4], 10)
    run(s)  # both prefilled: 2 blocks each, the pool is full
    s.add_request("c", [9], 1)
    out = run(s)  # a needs a third block: b (the last running) is preempted
    assert out.preempted_req_ids == ["b"] and list(out.num_scheduled_tokens) == ["a"]
    b = s.requests["b"]
    assert b.num_computed_tokens == 0 and b.num_preemptions == 1 and s.waiting[0] == "b"
    assert s.waiting == ["b", "c"] and s.running == ["a"]  # c waited: no admissions in a preempting step
    check_blocks(s)


# --------------------------------------------------------------- step for step with vLLM 0.33
# pagedkv's KVCacheManager(block_size, N) hands out all N blocks, ids 0..N-1. vLLM 0.33's BlockPool reserves
# block 0 as the null block, so the same N usable blocks are vLLM's num_gpu_blocks=N+1, and pagedkv's block i is
# vLLM's block i+1. The expectations below were worked out by hand from 0.33's sched/scheduler.py
# (schedule, update_from_output), kv_cache_manager.py (allocate_slots), block_pool.py (free_blocks,
# get_new_blocks, cache_full_blocks) and kv_cache_utils.py (FreeKVCacheBlockQueue).
def steps(s: Scheduler, arrivals: dict, num_steps: int) -> list:
    """Run ``num_steps`` steps, adding ``arrivals[step]`` (``(request_id, prompt, max_tokens)``s) before each.
    Per step: tokens scheduled per request, prefix-hit tokens of the requests admitted, the requests preempted,
    and the free blocks after the step (finished requests freed)."""
    trace = []
    for step in range(num_steps):
        for request_id, prompt, max_tokens in arrivals.get(step, ()):
            s.add_request(request_id, prompt, max_tokens)
        out = s.schedule()
        hits = {r: s.requests[r].num_cached_tokens for r in out.scheduled_new_reqs}
        s.update_from_output(out, {r: 7 for r in s.sampling_request_ids(out)})
        trace.append((out.num_scheduled_tokens, hits, out.preempted_req_ids, s.kv_cache_manager.num_free_blocks))
        check_blocks(s)
    return trace


def test_r_a_request_is_admitted_only_when_its_whole_sequence_fits():
    """Rule R (0.33: scheduler_reserve_full_isl=True, allocate_slots(..., full_sequence_must_fit=True)). Block 4,
    4 usable blocks, budget 8, no caching. Request 0 (4 prompt tokens, 8 to generate) holds 2 blocks from step 1
    and 3 from step 5; request 1's 9 tokens need 3 blocks, so it waits until request 0 finishes (step 7)."""
    arrivals = {0: [(0, [1, 2, 3, 4], 8)], 1: [(1, list(range(10, 19)), 1)]}
    s = scheduler(num_blocks=4, block_size=4, caching=False, max_num_batched_tokens=8)
    assert steps(s, arrivals, 10) == [
        ({0: 4}, {0: 0}, [], 3),
        ({0: 1}, {}, [], 2),  # request 1 waits: 3 blocks > 2 free
        ({0: 1}, {}, [], 2),
        ({0: 1}, {}, [], 2),
        ({0: 1}, {}, [], 2),
        ({0: 1}, {}, [], 1),  # request 0's 9th token takes its third block
        ({0: 1}, {}, [], 1),
        ({0: 1}, {}, [], 4),  # request 0 samples its 8th token and finishes
        ({1: 8}, {1: 0}, [], 2),  # request 1 admitted at step 8, its prompt in two chunks
        ({1: 1}, {}, [], 4),
    ]
    assert s.finished == {0: [7] * 8, 1: [7]} and s.num_preemptions == 0 and s.num_recomputed_tokens == 0
    # The first chunk alone (scheduler_reserve_full_isl=False, pagedkv's old rule): admitted, preempted, again.
    s = scheduler(num_blocks=4, block_size=4, caching=False, max_num_batched_tokens=8,
                  scheduler_reserve_full_isl=False)
    assert steps(s, arrivals, 10) == [
        ({0: 4}, {0: 0}, [], 3),
        ({0: 1, 1: 7}, {1: 0}, [], 0),  # 7 of request 1's tokens fit 2 blocks
        ({0: 1}, {}, [1], 2),  # its last 2 need a third block: the last running request, itself, is preempted
        ({0: 1, 1: 7}, {1: 0}, [], 0),
        ({0: 1}, {}, [1], 2),
        ({0: 1}, {}, [], 1),
        ({0: 1}, {}, [], 1),
        ({0: 1}, {}, [], 4),
        ({1: 8}, {1: 0}, [], 2),
        ({1: 1}, {}, [], 4),
    ]
    assert s.finished == {0: [7] * 8, 1: [7]} and s.num_preemptions == 2 and s.num_recomputed_tokens == 14


def test_f_hashless_blocks_are_freed_to_the_head_so_a_cached_prefix_lives_longer():
    """Rule F (0.33: BlockPool.free_blocks, "LIFO reuse of non-cached blocks"). Block 2, 3 usable blocks, caching
    on. Request [5]'s block has no hash (never full) and goes to the head, so step 1 takes it and keeps [1, 2]'s
    cached block 0; freeing first in, first out would have handed block 0 out at step 1 and lost the hit."""
    s = scheduler(num_blocks=3, block_size=2)
    trace, queues = [], []
    for arrivals in ([("a", [1, 2], 1), ("b", [5], 1)], [("c", [9, 9, 9], 1)], [("d", [1, 2, 3], 1)]):
        trace += steps(s, {0: arrivals}, 1)  # one step each
        queues.append(s.kv_cache_manager.allocator.free_block_ids())
    assert trace == [
        ({"a": 2, "b": 1}, {"a": 0, "b": 0}, [], 3),  # both sample and finish
        ({"c": 3}, {"c": 0}, [], 3),
        ({"d": 1}, {"d": 2}, [], 3),
    ]
    assert queues == [
        [1, 2, 0],  # a's hashed block 0 to the tail, b's hash-less block 1 to the head
        [2, 0, 1],  # c took 1 and 2; its partial block 2 to the head, its full (hashed) block 1 to the tail
        [2, 1, 0],  # d revived block 0 (a 2-token hit) and took block 2
    ]
    assert s.kv_cache_manager.prefix_cache.stats.hits == 1


def test_d_a_block_filling_with_cached_content_is_cached_too():
    """Rule D (0.33: BlockPool's cached_block_hash_to_block, "NOTE #1: We currently don't de-duplicate the
    blocks"; get_cached_block, _maybe_evict_cached_block). Block 2, 4 usable blocks, caching on. Request b's
    prompt [1, 2] is all cached, but a hit is capped at num_tokens - 1, so b recomputes it in a new block 1, which
    gets the same hash as block 0. Step 2 evicts block 0; the content lives on in block 1 and d hits it."""
    s = scheduler(num_blocks=4, block_size=2)
    kv = s.kv_cache_manager
    trace = steps(s, {0: [("a", [1, 2], 1)], 1: [("b", [1, 2], 3)]}, 2)
    one_two = kv.prefix_cache.block_to_hash[0]
    assert kv.prefix_cache.hash_to_blocks[one_two] == [0, 1]  # one name, two blocks
    trace += steps(s, {0: [("c", [7, 7, 7], 1)]}, 1)
    assert kv.prefix_cache.hash_to_blocks[one_two] == [1]  # c's allocation evicted block 0
    trace += steps(s, {0: [("d", [1, 2, 5], 1)]}, 1)
    assert trace == [
        ({"a": 2}, {"a": 0}, [], 4),  # a finishes: block 0, hashed, to the tail
        ({"b": 2}, {"b": 0}, [], 3),  # b's prompt [1, 2] takes block 1 and is cached there too
        ({"b": 1, "c": 3}, {"c": 0}, [], 2),  # b takes block 2; c takes 3 and 0 (evicting block 0's name)
        ({"b": 1, "d": 1}, {"d": 2}, [], 4),  # d hits [1, 2] in block 1 (b's); b and d finish
    ]
    assert s.finished == {"a": [7], "c": [7], "b": [7, 7, 7], "d": [7]}
    assert kv.prefix_cache.stats.hits == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_workload_keeps_ref_counts_and_the_budget_and_leaks_nothing(data):
    block_size = data.draw(st.sampled_from([1, 2, 4]))
    num_blocks = data.draw(st.integers(8, 24))
    budget = data.draw(st.integers(4, 24))
    s = scheduler(num_blocks, block_size, caching=data.draw(st.booleans()), max_num_batched_tokens=budget,
                  max_num_seqs=data.draw(st.integers(1, 4)),
                  long_prefill_token_threshold=data.draw(st.integers(0, 6)),
                  scheduler_reserve_full_isl=data.draw(st.booleans()))
    capacity = num_blocks * block_size
    for i in range(data.draw(st.integers(1, 6))):
        prompt = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=capacity // 2))
        s.add_request(i, prompt, data.draw(st.integers(1, max(1, capacity // 2 - len(prompt)))))
    for _ in range(2000):
        if not s.has_unfinished_requests():
            break
        out = run(s, data.draw(st.integers(0, 3)))
        assert out.total_num_scheduled_tokens <= budget and len(s.running) <= s.max_num_seqs
        check_blocks(s)
    assert not s.has_unfinished_requests()
    kv = s.kv_cache_manager
    assert kv.num_free_blocks == kv.num_gpu_blocks and not kv.req_to_blocks


# --------------------------------------------------------------- the engine
ENGINES = [
    dict(num_gpu_blocks=64, block_size=4),
    dict(num_gpu_blocks=12, block_size=4, max_num_batched_tokens=8, max_num_seqs=4),  # chunks and preemptions
    dict(num_gpu_blocks=20, block_size=2, max_num_batched_tokens=5, max_num_seqs=3, long_prefill_token_threshold=3),
    dict(num_gpu_blocks=40, block_size=16, enable_prefix_caching=False),
]


def prompts_of(tokenizer):
    return [tokenizer.encode("The list "), tokenizer.encode("A dict maps keys"), tokenizer.encode("x = [1, 2]")]


@pytest.mark.parametrize("kwargs", ENGINES)
def test_v1_equals_v0_and_dense_greedy_and_seeded_samples(tiny, kwargs):
    model, tokenizer = tiny
    prompts = prompts_of(tokenizer)
    v1 = LLMEngine(model, version="v1", **kwargs)
    assert v1.generate(prompts, 16) == [generate_dense(model, p, 16) for p in prompts]
    params = SamplingParams(n=3, seed=5, max_tokens=8, temperature=0.9)
    v1_out = LLMEngine(model, version="v1", **kwargs).generate(prompts, params)
    v0_out = LLMEngine(model, num_gpu_blocks=64, block_size=4).generate(prompts, params)
    dense = [generate_dense(model, p, params) for p in prompts]
    for a, b, c in zip(v1_out, v0_out, dense):
        assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs] == [o.token_ids for o in c.outputs]


def test_fan_out_children_share_the_prompt_through_the_prefix_cache(tiny):
    model, tokenizer = tiny
    prompt = tokenizer.encode("The list of keys ")  # 17 tokens: 4 full blocks of 4
    engine = LLMEngine(model, version="v1", num_gpu_blocks=64, block_size=4)
    engine.add_request("r", prompt, SamplingParams(n=4, seed=0, max_tokens=3))
    engine.step()
    kv = engine.kv_cache_manager
    assert sorted(kv.req_to_blocks) == [("r", i) for i in range(4)]
    shared = [kv.req_to_blocks[("r", i)][:4] for i in range(4)]
    assert all(blocks == shared[0] for blocks in shared)  # the four full prompt blocks, once
    assert engine.stats.num_prefix_cached_tokens == 3 * 16 and engine.stats.num_cow_copies == 0
    while not engine.is_finished("r"):
        engine.step()
    out = engine.pop_finished("r")
    assert [o.index for o in out.outputs] == [0, 1, 2, 3] and out.prompt_token_ids == prompt


@pytest.mark.parametrize("kwargs", ENGINES[:3])
def test_the_beam_search_loop_equals_the_dense_reference_and_v0s_group(tiny, kwargs):
    model, tokenizer = tiny
    prompts = prompts_of(tokenizer)
    params = BeamSearchParams(beam_width=3, max_tokens=5)
    loop = beam_search(LLMEngine(model, version="v1", **kwargs), prompts, params)
    group = LLMEngine(model, num_gpu_blocks=64, block_size=4).generate(prompts, params)
    for out, v0, prompt in zip(loop, group, prompts):
        want = beam_search_dense(model, prompt, params)
        assert [o.token_ids for o in out.outputs] == [o.token_ids for o in want.outputs] == \
            [o.token_ids for o in v0.outputs]
    engine = LLMEngine(model, version="v1", num_gpu_blocks=64, block_size=4)
    assert [o.outputs[0].token_ids for o in engine.generate(prompts[:1], params)] == [loop[0].outputs[0].token_ids]


def test_v1_preempts_by_recompute_and_counts_it(tiny):
    model, tokenizer = tiny
    engine = LLMEngine(model, version="v1", num_gpu_blocks=8, block_size=2, max_num_batched_tokens=16)
    prompts = [tokenizer.encode(t) for t in ("ab", "cd", "ef")]
    assert engine.generate(prompts, 8) == [generate_dense(model, p, 8) for p in prompts]
    assert engine.stats.num_preemptions > 0 and engine.scheduler.num_recomputed_tokens > 0


@pytest.mark.parametrize("reserve, preemptions", [(True, 0), (False, 2)])
def test_the_engine_passes_scheduler_reserve_full_isl_on(tiny, reserve, preemptions):
    """Rule R's workload (test_r_...) through the engine: the same outputs, thrashing only without the gate."""
    model, _ = tiny
    engine = LLMEngine(model, version="v1", num_gpu_blocks=4, block_size=4, max_num_batched_tokens=8,
                       enable_prefix_caching=False, scheduler_reserve_full_isl=reserve)
    prompts = [[1, 2, 3, 4], list(range(10, 19))]
    engine.add_request(0, prompts[0], 8)
    engine.step()
    engine.add_request(1, prompts[1], 1)
    while not (engine.is_finished(0) and engine.is_finished(1)):
        engine.step()
    assert [engine.pop_finished(r).outputs[0].token_ids for r in (0, 1)] == \
        [generate_dense(model, p, n) for p, n in zip(prompts, (8, 1))]
    assert engine.stats.num_preemptions == preemptions


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, words", [
    (dict(version="v2"), "version"),
    (dict(version="v1", preemption_mode="swap"), "recompute only"),
    (dict(version="v1", num_cpu_blocks=8), "no swap space"),
    (dict(version="v1", watermark=0.01), "no watermark"),
    (dict(version="v1", max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(version="v1", long_prefill_token_threshold=-1), "long_prefill_token_threshold"),
    (dict(version="v0", long_prefill_token_threshold=4), "version='v1'"),
    (dict(version="v1", scheduler_reserve_full_isl=1), "scheduler_reserve_full_isl must be True"),
    (dict(version="v1", scheduler_reserve_full_isl=None), "scheduler_reserve_full_isl must be True"),
    (dict(version="v0", scheduler_reserve_full_isl=False), "version='v1'"),
])
def test_bad_engine_settings_say_what_v1_does_instead(tiny, kwargs, words):
    with pytest.raises(PagedKVError, match=words):
        LLMEngine(tiny[0], num_gpu_blocks=8, block_size=4, **kwargs)


def test_bad_requests_on_v1_change_nothing(tiny):
    engine = LLMEngine(tiny[0], version="v1", num_gpu_blocks=8, block_size=4)
    engine.add_request("a", [1, 2, 3], 2)
    for call, words in [
        (lambda: engine.add_request("a", [1, 2], 2), "already added"),
        (lambda: engine.add_request("b", [], 2), "prompt"),
        (lambda: engine.add_request("b", [1], BeamSearchParams(beam_width=2, max_tokens=2)), "outside the engine"),
        (lambda: engine.add_request("b", [1], 0), "max_tokens"),
    ]:
        with pytest.raises(PagedKVError, match=words):
            call()
    assert engine.scheduler.waiting == ["a"] and list(engine.scheduler.requests) == ["a"]


def test_v1_scheduler_refuses_bad_settings():
    with pytest.raises(PagedKVError, match="KVCacheManager"):
        Scheduler(object())
    with pytest.raises(PagedKVError, match="max_num_seqs"):
        scheduler(max_num_seqs=0)
    with pytest.raises(PagedKVError, match="scheduler_reserve_full_isl"):
        scheduler(scheduler_reserve_full_isl="yes")
    s = scheduler()
    with pytest.raises(PagedKVError, match="fans n > 1 out"):
        s.add_request("a", [1], SamplingParams(n=2))
