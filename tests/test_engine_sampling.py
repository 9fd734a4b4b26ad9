"""Seeded sampling through the paged engine equals each sample decoded alone with a contiguous cache.

A request's tokens may depend only on the model, its prompt, its params and its seed: never on the batch
around it, the block size, the pool size, preemption (recompute or swap) or prefix caching.
"""

import pytest

from pagedkv import LLMEngine, PagedKVError, SamplingParams, generate_dense, load_tiny

SETTINGS = [
    dict(num_gpu_blocks=64, block_size=16),
    dict(num_gpu_blocks=100, block_size=1),  # one request alone fits (<= 65 tokens), two at once do not
    dict(num_gpu_blocks=10, block_size=8),  # tight: recompute
    dict(num_gpu_blocks=10, block_size=8, preemption_mode="swap", num_cpu_blocks=64),
    dict(num_gpu_blocks=64, block_size=4, enable_prefix_caching=True),
]


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def prompts(tiny):
    system = "The Python documentation says: "
    return [tiny[1].encode(system + t) for t in ("A list ", "A class ", "The return ", "Exceptions ", "A set ")]


PARAMS = [SamplingParams(seed=s, temperature=t, top_p=p, top_k=k, max_tokens=24) for s, t, p, k in
          ((1, 1.0, 1.0, 0), (2, 0.8, 0.9, 0), (3, 1.2, 1.0, 20), (4, 0.6, 0.95, 8), (5, 1.0, 0.5, 0))]


@pytest.mark.parametrize("settings", SETTINGS, ids=["roomy", "block-1", "tight-recompute", "tight-swap", "prefix"])
def test_seeded_sampling_equals_dense_whatever_the_pool(tiny, prompts, settings):
    model = tiny[0]
    engine = LLMEngine(model, **settings)
    for i, (prompt, params) in enumerate(zip(prompts, PARAMS)):
        engine.add_request(i, prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    for i, (prompt, params) in enumerate(zip(prompts, PARAMS)):
        paged, dense = engine.pop_finished(i).outputs[0], generate_dense(model, prompt, params).outputs[0]
        assert paged.token_ids == dense.token_ids
        assert paged.finish_reason == dense.finish_reason
        assert paged.cumulative_logprob == pytest.approx(dense.cumulative_logprob, abs=1e-3)
    if settings["num_gpu_blocks"] == 10:
        assert engine.stats.num_preemptions > 0


def test_generate_with_sampling_params_returns_request_outputs(tiny, prompts):
    model = tiny[0]
    params = SamplingParams(seed=11, temperature=0.9, max_tokens=16)
    outputs = LLMEngine(model, num_gpu_blocks=32, block_size=8).generate(prompts[:3], params)
    assert [o.prompt_token_ids for o in outputs] == prompts[:3]
    assert [o.outputs[0].token_ids for o in outputs] == [generate_dense(model, p, params).outputs[0].token_ids
                                                         for p in prompts[:3]]
    assert all(o.outputs[0].finish_reason == "length" and len(o.outputs[0].token_ids) == 16 for o in outputs)


def test_temperature_zero_equals_the_greedy_int_api(tiny, prompts):
    model = tiny[0]
    engine = LLMEngine(model, num_gpu_blocks=32, block_size=8)
    sampled = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=20))
    assert [o.outputs[0].token_ids for o in sampled] == engine.generate(prompts, 20)
    assert engine.generate(prompts, max_tokens=20) == engine.generate(prompts, 20)


def test_a_stop_token_finishes_a_request_with_reason_stop(tiny, prompts):
    model = tiny[0]
    greedy = generate_dense(model, prompts[0], 20)
    params = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[greedy[4]])
    out = LLMEngine(model, num_gpu_blocks=32, block_size=8).generate([prompts[0]], params)[0].outputs[0]
    assert out.token_ids == greedy[:greedy.index(greedy[4]) + 1] and out.finish_reason == "stop"


def test_a_request_that_can_never_fit_comes_back_empty(tiny):
    engine = LLMEngine(tiny[0], num_gpu_blocks=2, block_size=4)
    with pytest.warns(RuntimeWarning, match=r"20 tokens \(20 of prompt, 0 generated\) need 5 blocks of 4 .* 2 GPU"):
        out = engine.generate([[1] * 20], SamplingParams(seed=0, max_tokens=4))[0].outputs[0]
    assert out.token_ids == [] and out.finish_reason == "length"  # vLLM v0 reports an ignored request so
    assert engine.stats.num_ignored == 1


@pytest.mark.parametrize("call", [
    lambda e, p: e.add_request("x", p, SamplingParams(n=300)),  # more sequences than max_num_seqs
    lambda e, p: e.generate([p], SamplingParams(stop_token_ids=[300])),
    lambda e, p: e.add_request("x", p, 4, max_tokens=4),
    lambda e, p: e.add_request("x", p),
    lambda e, p: e.generate([p], "16"),
])
def test_bad_requests_are_refused_and_change_nothing(tiny, prompts, call):
    engine = LLMEngine(tiny[0], num_gpu_blocks=16, block_size=4)
    with pytest.raises(PagedKVError) as error:
        call(engine, prompts[0])
    assert isinstance(error.value, ValueError)
    assert not engine.has_unfinished_requests() and not engine._processors


def test_pop_finished_of_an_unknown_request(tiny):
    with pytest.raises(PagedKVError, match="has not finished"):
        LLMEngine(tiny[0], num_gpu_blocks=8, block_size=4).pop_finished("nope")
