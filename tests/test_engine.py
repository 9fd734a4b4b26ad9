"""LLMEngine: paged serving equals dense greedy decoding token for token, in every configuration."""

import pytest
import torch

from pagedkv import PagedKVError
from pagedkv.engine import LLMEngine
from pagedkv.model import LlamaConfig, LlamaForCausalLM, generate_dense

CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=128, rope_theta=500.0, rms_norm_eps=1e-5)
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG).eval()


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(2)
    system = torch.randint(0, 64, (8,), generator=g).tolist()  # a shared "system prompt": two full blocks
    own = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (1, 5, 9, 3, 13, 6)]
    return [system + p for p in own[:3]] + own[3:]


@pytest.fixture(scope="module")
def dense(model, prompts):
    return [generate_dense(model, p, MAX_TOKENS) for p in prompts]


TIGHT = dict(num_gpu_blocks=8, block_size=4, max_num_seqs=8, max_num_batched_tokens=32)  # every request fits alone


@pytest.mark.parametrize("caching", [False, True], ids=["no-cache", "prefix-cache"])
@pytest.mark.parametrize("pool", [
    dict(num_gpu_blocks=64, block_size=4),
    TIGHT,
    {**TIGHT, "preemption_mode": "swap", "num_cpu_blocks": 16},
    {**TIGHT, "preemption_mode": "swap", "num_cpu_blocks": 2},  # CPU pool too small: falls back to recompute
    dict(num_gpu_blocks=40, block_size=1, max_num_seqs=4, max_num_batched_tokens=32),
], ids=["roomy", "tight-recompute", "tight-swap", "swap-fallback", "block-size-1"])
def test_paged_equals_dense(model, prompts, dense, pool, caching):
    engine = LLMEngine(model, enable_prefix_caching=caching, watermark=0.0, **pool)
    assert engine.generate(prompts, MAX_TOKENS) == dense
    manager = engine.block_manager
    assert not manager.seq_ids and manager.num_free_gpu_blocks == manager.num_total_gpu_blocks  # nothing leaks
    assert manager.num_free_cpu_blocks == manager.num_total_cpu_blocks
    assert engine.stats.peak_gpu_blocks <= manager.num_total_gpu_blocks
    if pool is TIGHT:
        assert engine.stats.num_preemptions > 0
    if caching and pool["num_gpu_blocks"] == 64:
        assert engine.stats.num_prefix_cached_tokens >= 2 * 8  # the later requests reuse the system prompt


def test_the_cuda_kernel_in_the_simulator_serves_too(model, prompts, dense):
    engine = LLMEngine(model, num_gpu_blocks=16, block_size=4, backend="cuda", watermark=0.0, max_num_seqs=8,
                       max_num_batched_tokens=32)
    assert engine.generate(prompts[:3], 4) == [d[:4] for d in dense[:3]]


def test_torch_backend_and_step_by_step(model, prompts, dense):
    engine = LLMEngine(model, num_gpu_blocks=32, block_size=4, backend="torch", max_num_seqs=8,
                       max_num_batched_tokens=64)
    engine.add_request("a", prompts[0], MAX_TOKENS)
    engine.add_request("b", prompts[4], MAX_TOKENS)
    first = engine.step()
    assert [r for r, _ in first.prefills] == ["a", "b"] and engine.stats.steps == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.finished == {"a": dense[0], "b": dense[4]}


def test_bad_input_leaves_the_engine_usable(model, prompts, dense):
    engine = LLMEngine(model, num_gpu_blocks=32, block_size=4, max_num_seqs=8, max_num_batched_tokens=64)
    for bad, match in (([[1], [64]], "outside the vocabulary"), ([[1], []], "empty"), ("text", "list of token-id"),
                       ([[1], [2.5]], "integers")):
        with pytest.raises(PagedKVError, match=match):
            engine.generate(bad, 3)
    with pytest.raises(PagedKVError, match=">= 1"):
        engine.generate([[1]], 0)
    assert not engine.has_unfinished_requests() and engine.stats.steps == 0
    assert engine.generate([prompts[1]], MAX_TOKENS) == [dense[1]]
    with pytest.raises(PagedKVError, match="LlamaForCausalLM"):
        LLMEngine(torch.nn.Linear(2, 2), num_gpu_blocks=4)
    with pytest.raises(PagedKVError, match="backend"):
        LLMEngine(model, num_gpu_blocks=4, backend="tpu")
    with pytest.raises(PagedKVError, match="num_gpu_blocks"):
        LLMEngine(model, num_gpu_blocks=0)


def test_fully_cached_prompts_in_the_same_step_and_later(model):
    """A prompt whose blocks another request fills *in this very step* (each layer writes before it reads),
    and one served entirely from the cache later: both still run their last token and equal dense."""
    prompt = list(range(3, 15))  # 12 tokens: three full blocks of 4
    expected = generate_dense(model, prompt, 6)
    engine = LLMEngine(model, num_gpu_blocks=32, block_size=4, enable_prefix_caching=True, max_num_seqs=8,
                       max_num_batched_tokens=64)
    assert engine.generate([prompt, prompt], 6) == [expected, expected]
    assert engine.stats.num_prefix_cached_tokens == 12  # the second request: every prompt token
    assert engine.generate([prompt], 6) == [expected]
    assert engine.stats.num_prefix_cached_tokens == 24
