"""``unified_paged_attention`` (a step's prefill chunks, prefix hits and decodes in one call) against torch's SDPA.

The expected answer is computed here from scratch: each sequence's keys read token by token through its block
table, an explicit boolean mask (causal, and the window), and ``torch.nn.functional.scaled_dot_product_attention``.
The "cuda" backend runs in numba's CUDA simulator without a GPU, so its cases stay tiny.
"""

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from pagedkv import PagedKVValueError, paged_attention, unified_paged_attention
from pagedkv.kernels import reference_unified_attention

TOL = {torch.float32: 3e-5, torch.float16: 3e-3}
HEADS = [(4, 4), (4, 2), (4, 1), (8, 2)]  # GQA groups of 1, 2 and 4 query heads; MQA
HEAD_IDS = ["MHA", "GQA2", "MQA", "GQA4"]


def make_batch(q_lens, seq_lens, num_heads=4, num_kv_heads=2, head_size=8, block_size=4, dtype=torch.float32,
               seed=0):
    """Each sequence's blocks scattered over the cache; unused table entries -1 (never read)."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(per_seq) + 2
    order = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.full((len(seq_lens), max(per_seq, default=1) + 1), -1, dtype=torch.int32)
    for s, n in enumerate(per_seq):
        tables[s, :n] = torch.tensor(order[:n], dtype=torch.int32)
        order = order[n:]
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache, value_cache = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    query = torch.randn((sum(q_lens), num_heads, head_size), generator=g).to(dtype)
    cu_seqlens_q = torch.tensor([0] + torch.tensor(q_lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)
    return query, key_cache, value_cache, cu_seqlens_q, torch.tensor(seq_lens, dtype=torch.int32), tables


def sdpa(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables, sliding_window=None):
    """torch's SDPA per sequence, keys read one token at a time, with an explicit mask."""
    block_size, group = key_cache.shape[1], query.shape[1] // key_cache.shape[2]
    out = torch.empty(query.shape, dtype=torch.float32)
    for s in range(len(seq_lens)):
        start, end, seq_len = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1]), int(seq_lens[s])
        token = torch.arange(seq_len)
        block, offset = block_tables[s].long()[token // block_size], token % block_size  # token t's slot
        k = key_cache[block, offset].float().repeat_interleave(group, dim=1)
        v = value_cache[block, offset].float().repeat_interleave(group, dim=1)
        position = torch.arange(seq_len - (end - start), seq_len)[:, None]  # of each query
        mask = token[None, :] <= position
        if sliding_window is not None:
            mask &= token[None, :] > position - sliding_window
        out[start:end] = F.scaled_dot_product_attention(query[start:end].float().transpose(0, 1), k.transpose(0, 1),
                                                        v.transpose(0, 1), attn_mask=mask).transpose(0, 1)
    return out


def check(backend, batch, sliding_window=None):
    out = unified_paged_attention(*batch, sliding_window=sliding_window, backend=backend)
    query = batch[0]
    assert out.shape == query.shape and out.dtype == query.dtype
    expected = sdpa(*batch, sliding_window=sliding_window)
    tol = TOL[query.dtype]
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)
    if backend != "torch":  # the reference agrees too
        torch.testing.assert_close(reference_unified_attention(*batch, sliding_window=sliding_window).float(),
                                   expected, atol=tol, rtol=tol)


# q_len, seq_len: a decode, a whole prompt, a chunk after a prefix (hit or earlier chunk), a one-token prompt,
# a chunk ending exactly on a block, and a prompt of a block and one token
MIXED = ([1, 9, 5, 1, 4, 5], [12, 9, 13, 1, 8, 5])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads", HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_mixed_batch_matches_sdpa(backend, heads, dtype):
    check(backend, make_batch(*MIXED, num_heads=heads[0], num_kv_heads=heads[1], head_size=16, dtype=dtype))


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("window", [None, 1, 3, 6])
def test_block_sizes_and_windows(block_size, window):
    check("cpu", make_batch(*MIXED, block_size=block_size, seed=block_size), sliding_window=window)


def test_one_long_and_many_short():
    q_lens, seq_lens = [300] + [1] * 20 + [3] * 5, [340] + list(range(5, 105, 5)) + [3, 7, 20, 33, 64]
    batch = make_batch(q_lens, seq_lens, num_heads=8, num_kv_heads=2, head_size=32, block_size=16, seed=4)
    check("cpu", batch)
    check("cpu", batch, sliding_window=50)


def test_empty_batch():
    batch = make_batch([], [])
    for backend in ("torch", "cpu", "cuda"):
        out = unified_paged_attention(*batch, backend=backend)
        assert out.shape == (0, 4, 8)


@pytest.mark.parametrize("backend", ["torch", "cpu", "cuda"])
def test_decodes_equal_paged_attention(backend):
    q_lens, seq_lens = [1] * 4, [1, 5, 8, 13]
    query, key_cache, value_cache, cu, lens, tables = make_batch(q_lens, seq_lens, seed=7)
    expected = paged_attention(query, key_cache, value_cache, tables, lens, backend="torch")
    out = unified_paged_attention(query, key_cache, value_cache, cu, lens, tables, backend=backend)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=2e-6)


@st.composite
def batches(draw):
    """Random varlen batches: 0-5 sequences, each with a prefix (cached or computed earlier) and a chunk."""
    num_seqs = draw(st.integers(0, 5))
    q_lens = [draw(st.integers(1, 24)) for _ in range(num_seqs)]
    seq_lens = [q + draw(st.sampled_from([0, 0, 1, 7, 16, 40])) for q in q_lens]
    heads = draw(st.sampled_from(HEADS))
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    window = draw(st.sampled_from([None, None, 1, 2, 5, 17]))
    batch = make_batch(q_lens, seq_lens, heads[0], heads[1], 8, block_size, dtype, seed=draw(st.integers(0, 99)))
    return batch, window


@settings(max_examples=40, deadline=None)
@given(batches())
def test_random_batches_match_sdpa(case):
    batch, window = case
    check("cpu", batch, sliding_window=window)


# ------------------------------------------------------------------ the numba.cuda kernel (the simulator: tiny)
CUDA_CASES = [  # (q_lens, seq_lens, heads, block_size, dtype, window)
    ([1, 3, 2], [5, 3, 6], (2, 1), 4, torch.float32, None),    # decode, prompt, chunk after a prefix; GQA 2
    ([5, 1], [7, 3], (2, 2), 2, torch.float16, None),          # MHA, fp16: tiles of 8 queries, one partial
    ([4, 1, 2], [9, 6, 2], (4, 1), 4, torch.float32, 3),       # MQA with a window: pages skipped before it
    ([3, 1], [4, 2], (2, 1), 1, torch.float32, 2),             # block size 1: a page per token
]


@pytest.mark.parametrize("q_lens, seq_lens, heads, block_size, dtype, window", CUDA_CASES)
def test_cuda_kernel_matches_sdpa(q_lens, seq_lens, heads, block_size, dtype, window):
    batch = make_batch(q_lens, seq_lens, heads[0], heads[1], 4, block_size, dtype, seed=len(q_lens))
    check("cuda", batch, sliding_window=window)


def test_cuda_tile_count_is_an_upper_bound():
    """A sequence whose queries fill whole tiles, then one with a spare tile: the grid's extra blocks leave."""
    from pagedkv.kernels.cuda_unified import block_q_for
    from pagedkv.kernels.validate import check_unified_args

    batch = make_batch([16, 1, 9], [16, 4, 12], num_heads=2, num_kv_heads=1, head_size=4, block_size=8, seed=3)
    assert block_q_for(check_unified_args(*batch)) == 8  # 16 rows / 2 query heads: 2 + 1 + 2 tiles, a grid of 6
    check("cuda", batch)


def run_cuda(batch, sliding_window=None, **launch):
    """The unified kernel with forced launch choices (``partition_size``, ``num_segments``), against SDPA."""
    from pagedkv.kernels.cuda_unified import unified_attention_cuda
    from pagedkv.kernels.validate import check_unified_args

    shape = check_unified_args(*batch, sliding_window=sliding_window)
    out = unified_attention_cuda(*batch, shape, **launch)
    tol = TOL[batch[0].dtype]
    torch.testing.assert_close(out.float(), sdpa(*batch, sliding_window=sliding_window), atol=tol, rtol=tol)


SPLIT_CASES = [  # (q_lens, seq_lens, heads, block_size, dtype, window): decodes over contexts of several partitions
    ([1, 1], [21, 9], (4, 2), 4, torch.float32, None),   # GQA 2: 3 segments of 8 keys, the second sequence's 2
    ([1, 1, 1], [17, 5, 12], (2, 1), 2, torch.float16, 6),  # a window: the first segments see no key at all
    ([1], [13], (2, 2), 3, torch.float32, None),        # block size 3: decodes take the prefill tile's path
]


@pytest.mark.parametrize("q_lens, seq_lens, heads, block_size, dtype, window", SPLIT_CASES)
def test_split_kv_matches_sdpa(q_lens, seq_lens, heads, block_size, dtype, window):
    """vLLM's 3-D mode: each context split into segments (of two 4-key partitions here), one program each, and the
    v2 reduce combining them."""
    batch = make_batch(q_lens, seq_lens, heads[0], heads[1], 4, block_size, dtype, seed=sum(seq_lens))
    run_cuda(batch, sliding_window=window, partition_size=4, num_segments=3)


def test_split_kv_of_a_mixed_batch():
    """Segments under a chunk of queries too (vLLM splits speculative decodes' few queries the same way): the reduce
    reads each query row's own sequence length."""
    batch = make_batch([1, 3], [10, 7], num_heads=2, num_kv_heads=1, head_size=4, block_size=2, seed=5)
    run_cuda(batch, partition_size=4, num_segments=2)


def test_decode_tile_merges_partitions_online():
    """A 2-D decode tile walks its context in partitions (4 keys here) and merges them with an online softmax."""
    batch = make_batch([1, 1], [11, 6], num_heads=4, num_kv_heads=1, head_size=4, block_size=2, seed=9)
    run_cuda(batch, partition_size=4)
    run_cuda(batch, sliding_window=7, partition_size=4)  # a window whose first key starts inside a block


def test_the_split_rule_follows_vllm():
    """3-D for decodes too few to fill 128 programs (vLLM 0.33's seq_threshold_3D) over contexts longer than a
    partition; 2-D for anything else."""
    from pagedkv.kernels.cuda_unified import NUM_SEGMENTS, choose_split
    from pagedkv.kernels.validate import UnifiedShape

    def shape(num_seqs, max_query_len, max_seq_len, kv_heads=8):
        return UnifiedShape(num_seqs * max_query_len, num_seqs, 4 * kv_heads, kv_heads, 128, 100, 16, max_query_len,
                            max_seq_len, 0.1, None)

    assert choose_split(shape(4, 1, 8192), 512) == NUM_SEGMENTS == 16
    assert choose_split(shape(64, 1, 8192), 512) == 1  # 512 programs: the 2-D grid is full
    assert choose_split(shape(4, 1, 300), 512) == 1  # one partition: nothing to split
    assert choose_split(shape(4, 16, 8192), 512) == 1  # chunks of queries: 2-D


# ------------------------------------------------------------------ bad input: an error before anything runs
def _bad(name):
    """A valid batch, then one thing broken: (args, kwargs)."""
    query, key_cache, value_cache, cu, seq_lens, tables = make_batch([1, 3], [4, 6])
    kw = {}
    if name == "cu_seqlens_q int64":
        cu = cu.long()
    elif name == "cu_seqlens_q not from 0":
        cu = torch.tensor([1, 2, 4], dtype=torch.int32)
    elif name == "cu_seqlens_q not increasing":
        cu = torch.tensor([0, 4, 4], dtype=torch.int32)
    elif name == "cu_seqlens_q short of num_tokens":
        cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    elif name == "cu_seqlens_q 2-D":
        cu = cu[None]
    elif name == "q_len > seq_len":
        seq_lens = torch.tensor([4, 2], dtype=torch.int32)
    elif name == "seq_len past its table":
        seq_lens = torch.tensor([4, 40], dtype=torch.int32)
    elif name == "block id outside the cache":
        tables[1, 0] = key_cache.shape[0]
    elif name == "negative block id":
        tables[0, 0] = -1
    elif name == "seq_lens int64":
        seq_lens = seq_lens.long()
    elif name == "seq_lens wrong length":
        seq_lens = torch.tensor([4, 6, 2], dtype=torch.int32)
    elif name == "block_tables wrong rows":
        tables = tables[:1]
    elif name == "query dtype":
        query = query.half()
    elif name == "query 2-D":
        query = query[:, 0]
    elif name == "head_size mismatch":
        query = query[:, :, :4].contiguous()
    elif name == "heads not a multiple":
        query = query[:, :3].contiguous()
    elif name == "value_cache shape":
        value_cache = value_cache[:-1]
    elif name == "window 0":
        kw["sliding_window"] = 0
    elif name == "window float":
        kw["sliding_window"] = 2.0
    elif name == "window bool":
        kw["sliding_window"] = True
    elif name == "scale nan":
        kw["scale"] = float("nan")
    elif name == "backend":
        kw["backend"] = "gpu"
    elif name == "query a list":
        query = query.tolist()
    elif name == "non-contiguous query":
        query = query.transpose(0, 1).contiguous().transpose(0, 1)
    return (query, key_cache, value_cache, cu, seq_lens, tables), kw


BAD = ["cu_seqlens_q int64", "cu_seqlens_q not from 0", "cu_seqlens_q not increasing",
       "cu_seqlens_q short of num_tokens", "cu_seqlens_q 2-D", "q_len > seq_len", "seq_len past its table",
       "block id outside the cache", "negative block id", "seq_lens int64", "seq_lens wrong length",
       "block_tables wrong rows", "query dtype", "query 2-D", "head_size mismatch", "heads not a multiple",
       "value_cache shape", "window 0", "window float", "window bool", "scale nan", "backend", "query a list",
       "non-contiguous query"]


@pytest.mark.parametrize("backend", ["torch", "cpu", "cuda"])
@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_refused_before_anything_runs(name, backend):
    args, kw = _bad(name)
    kw.setdefault("backend", backend)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(PagedKVValueError) as error:
        unified_paged_attention(*args, **kw)
    assert len(str(error.value)) > 30  # says what was wrong
    for a, b in zip(args, before):  # nothing written
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_bad_input_messages_say_what_to_do():
    args, _ = _bad("q_len > seq_len")
    with pytest.raises(PagedKVValueError, match=r"sequence 1 has 3 queries but seq_lens\[1\] = 2"):
        unified_paged_attention(*args)
    args, _ = _bad("cu_seqlens_q short of num_tokens")
    with pytest.raises(PagedKVValueError, match="its last entry must be num_tokens"):
        unified_paged_attention(*args)
    args, kw = _bad("window 0")
    with pytest.raises(PagedKVValueError, match="sliding_window must be None"):
        unified_paged_attention(*args, **kw)


# ------------------------------------------------------------------ the engine: one call per layer per step
def test_engine_attends_once_per_layer_per_step(monkeypatch):
    """v1 with chunked prefill and a prefix hit: every step, each layer makes one call over the whole batch, on
    one metadata object built for the step; the answers still equal the dense model's."""
    from pagedkv import LLMEngine, generate_dense, load_tiny
    from pagedkv.kernels import UnifiedAttentionMetadata

    model, _ = load_tiny()
    calls, original = [], UnifiedAttentionMetadata.attend

    def counting(self, query, *args, **kwargs):
        calls.append((id(self), query.shape[0]))
        return original(self, query, *args, **kwargs)

    monkeypatch.setattr(UnifiedAttentionMetadata, "attend", counting)
    engine = LLMEngine(model, num_gpu_blocks=64, block_size=4, version="v1", max_num_batched_tokens=16)
    prompts = [[3 + i % 50 for i in range(30)], [3 + i % 50 for i in range(30)] + [9, 10], [7, 8, 9]]
    for i, prompt in enumerate(prompts):
        engine.add_request(i, prompt, 6)
    mixed = 0
    while engine.has_unfinished_requests():
        before = len(calls)
        out = engine.step()
        step = calls[before:]
        if out.is_empty:
            continue
        assert len(step) == model.config.num_hidden_layers  # one call per layer
        assert len({meta for meta, _ in step}) == 1  # one metadata for the step
        lens = list(out.num_scheduled_tokens.values())
        mixed += max(lens) > 1 and min(lens) == 1  # a chunk and a decode in one call
    assert mixed and engine.stats.num_prefix_cached_tokens > 0
    for i, prompt in enumerate(prompts):
        assert list(engine.pop_finished(i).outputs[0].token_ids) == generate_dense(model, prompt, 6)
