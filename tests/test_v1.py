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
    assert s.kv_cache_manager.allocator.free_block_ids() == [3, 4, 5, 2, 1, 0]
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
    s = scheduler(num_blocks=32, max_num_batched_tokens=100, long_prefill_token_threshold=5)
    s.add_request("a", list(range(12)), 1)
    assert [run(s).num_scheduled_tokens["a"] for _ in range(3)] == [5, 5, 2]
    assert s.finished["a"] == [7]


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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_workload_keeps_ref_counts_and_the_budget_and_leaks_nothing(data):
    block_size = data.draw(st.sampled_from([1, 2, 4]))
    num_blocks = data.draw(st.integers(8, 24))
    budget = data.draw(st.integers(4, 24))
    s = scheduler(num_blocks, block_size, caching=data.draw(st.booleans()), max_num_batched_tokens=budget,
                  max_num_seqs=data.draw(st.integers(1, 4)),
                  long_prefill_token_threshold=data.draw(st.integers(0, 6)))
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


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, words", [
    (dict(version="v2"), "version"),
    (dict(version="v1", preemption_mode="swap"), "recompute only"),
    (dict(version="v1", num_cpu_blocks=8), "no swap space"),
    (dict(version="v1", watermark=0.01), "no watermark"),
    (dict(version="v1", max_num_batched_tokens=0), "max_num_batched_tokens"),
    (dict(version="v1", long_prefill_token_threshold=-1), "long_prefill_token_threshold"),
    (dict(version="v0", long_prefill_token_threshold=4), "version='v1'"),
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
    s = scheduler()
    with pytest.raises(PagedKVError, match="fans n > 1 out"):
        s.add_request("a", [1], SamplingParams(n=2))
