"""One paged attention call for a whole step: prefill chunks, prefix hits and decodes together.

vLLM today (0.33) attends every step's mixed batch with one call per layer,
``unified_attention`` in ``vllm/v1/attention/ops/triton_unified_attention.py``
(and FlashAttention's varlen kernel with a ``block_table`` on NVIDIA): the
queries of every request lie in one flat tensor, and each request reads its
earlier tokens straight from its pages.  The metadata is flat:

* ``cu_seqlens_q int32 [num_seqs + 1]``: sequence ``s`` owns query rows
  ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]`` (vLLM's ``query_start_loc``);
* ``seq_lens int32 [num_seqs]``: its tokens *including* this step's, whose K/V
  are already in the cache (vLLM writes before it attends; ``seqused_k``);
* ``block_tables int32 [num_seqs, max_blocks]``: where its tokens live.

Its ``q_len`` queries are its *last* ``q_len`` tokens: query ``i`` sits at
position ``p = seq_len - q_len + i`` and attends keys ``j <= p`` (causal), and
only ``j > p - sliding_window`` on a sliding-window layer.  A decode is
``q_len = 1`` (it sees everything); a prompt is ``q_len = seq_len``; a chunk of
a long prompt, or the tokens after a prefix-cache hit, is anything between::

    import torch
    from pagedkv.kernels import unified_paged_attention

    block_size, kv_heads, head_size = 4, 1, 8
    key_cache = torch.randn(6, block_size, kv_heads, head_size)
    value_cache = torch.randn_like(key_cache)
    # sequence 0: a chunk of 3 queries, tokens 2..4 of 5 (0..1 came earlier); sequence 1: a decode at token 6
    cu_seqlens_q = torch.tensor([0, 3, 4], dtype=torch.int32)
    seq_lens = torch.tensor([5, 7], dtype=torch.int32)
    block_tables = torch.tensor([[2, 0], [5, 1]], dtype=torch.int32)
    query = torch.randn(4, 2, head_size)  # 4 query rows, 2 query heads sharing the KV head
    out = unified_paged_attention(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables)
    window = unified_paged_attention(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables,
                                     sliding_window=2)  # each query sees itself and the token before

Backends: ``"cuda"`` (``cuda_unified.py``: a thread block per (query tile, KV
head[, segment]): a decode tile runs the grouped decode kernel's phases, a
prefill tile stages a page for its rows and masks; the simulator without a
GPU), ``"cpu"`` (below: the decodes through the numba twin in place, the longer
chunks gathered page by page and run through torch's SDPA with an explicit
mask, in a few padded rectangles), ``"torch"`` (the
dense reference, one sequence at a time), ``"auto"`` (``"cuda"`` on a GPU,
else ``"cpu"``).

The engine builds a :class:`UnifiedAttentionMetadata` once per step and every
layer reuses it (vLLM: ``CommonAttentionMetadata`` in
``vllm/v1/attention/backend.py``); the checks and the CPU path's index tensors
are computed by the first layer only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .cpu import paged_attention_cpu
from .reference import reference_unified_attention
from .validate import UnifiedShape, check_unified_args


def unified_paged_attention(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables, scale=None, *,
                            sliding_window=None, backend="auto"):
    """Attention of every query row of a mixed batch over its sequence's pages; ``[num_tokens, num_heads,
    head_size]`` in the query's dtype.

    ``query [num_tokens, num_heads, head_size]``; caches ``[num_blocks, block_size, num_kv_heads, head_size]``
    (query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``); ``cu_seqlens_q``, ``seq_lens``,
    ``block_tables`` as the module docstring says; ``scale`` defaults to ``head_size ** -0.5``;
    ``sliding_window``: ``None`` or a positive int.  Bad input is a ``PagedKVValueError`` before anything runs.
    With ``q_len = 1`` everywhere the result equals ``paged_attention``'s.
    """
    metadata = UnifiedAttentionMetadata(cu_seqlens_q, seq_lens, block_tables)
    return metadata.attend(query, key_cache, value_cache, scale, sliding_window=sliding_window, backend=backend)


@dataclass
class UnifiedAttentionMetadata:
    """A step's flat attention metadata, shared by every layer (vLLM: ``CommonAttentionMetadata``).

    ``attend`` checks its arguments the first time it sees a layout (caches' shape and dtype, window, scale) and
    reuses the result, with the CPU path's gather indices and masks, for every later layer.
    """

    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    _checked: dict = field(default_factory=dict, repr=False)  # layout -> (UnifiedShape, CpuPlan | None)

    def attend(self, query, key_cache, value_cache, scale=None, *, sliding_window=None, backend="auto"):
        key = _layout(query, key_cache, value_cache, scale, sliding_window, backend)
        entry = self._checked.get(key) if key is not None else None
        if entry is None:  # the first layer: check everything (bad input raises here, before any work)
            shape = check_unified_args(query, key_cache, value_cache, self.cu_seqlens_q, self.seq_lens,
                                       self.block_tables, scale, sliding_window, backend)
            entry = self._checked[key] = [shape, None]
        shape = entry[0]
        if shape.num_tokens == 0:  # an empty batch: nothing to attend, no launch
            return query.new_empty(tuple(query.shape))
        query, key_cache, value_cache = query.detach(), key_cache.detach(), value_cache.detach()
        backend = _resolve(backend)
        if backend == "torch":
            return reference_unified_attention(query, key_cache, value_cache, self.cu_seqlens_q, self.seq_lens,
                                               self.block_tables, shape.scale, sliding_window=sliding_window)
        if backend == "cpu":
            if entry[1] is None:
                entry[1] = CpuPlan.build(self.cu_seqlens_q.cpu(), self.seq_lens.cpu(), self.block_tables.cpu(),
                                         shape)
            return entry[1].run(query.cpu(), key_cache.cpu(), value_cache.cpu()).to(query.device)
        from .cuda_unified import unified_attention_cuda

        return unified_attention_cuda(query, key_cache, value_cache, self.cu_seqlens_q, self.seq_lens,
                                      self.block_tables, shape)


def _layout(query, key_cache, value_cache, scale, sliding_window, backend):
    """What the checks depend on besides the metadata, as a dict key; None when something is not even a tensor
    or not hashable (the checks will say what is wrong)."""
    try:
        key = tuple((tuple(t.shape), t.dtype, t.device, t.is_contiguous()) for t in (query, key_cache, value_cache))
        key += (scale, sliding_window, backend)
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


def _resolve(backend: str) -> str:
    from . import resolve_backend

    return resolve_backend(backend)


@dataclass
class _Chunks:
    """Sequences with ``q_len > 1`` padded to one rectangle: ``[S, Q]`` queries over ``[S, B]`` pages."""

    query_rows: torch.Tensor  # [S, Q] flat query row of each padded query (padding repeats the last one)
    blocks: torch.Tensor  # [S * B] physical block of each logical block (0 where a sequence has none)
    mask: torch.Tensor  # [S, 1, Q, B * block_size] which keys each query sees: causal, window
    past_end: torch.Tensor  # [S, B * block_size, 1, 1] slots past each sequence's end (never trusted: zeroed)
    out_rows: torch.Tensor  # flat rows of the real (unpadded) queries, in [S, Q] order
    real: torch.Tensor  # [S, Q] bool: the real queries


@dataclass
class CpuPlan:
    """The CPU path: the decodes in place through the numba CPU twin, the longer chunks as padded SDPAs.

    A decode (``q_len = 1``) is memory-bound: the twin reads its pages where they lie, each K/V row once for
    its query-head group.  A chunk is compute-bound: its pages are gathered (one ``index_select`` of whole
    blocks) and torch's SDPA runs many chunks at once in float32, with an explicit causal/window mask.  The
    decodes apart, as vLLM's FlashInfer backend splits a batch into decodes and prefills
    (``split_decodes_and_prefills``, ``vllm/v1/attention/backends/utils.py``): one rectangle would pad every
    decode to the longest chunk.  The chunks go in a few rectangles of similar sizes (:func:`_buckets`), so a
    600-token prompt does not pad thirty 40-token ones.  ``benchmarks/bench_attention.py --unified`` measures it.
    """

    shape: UnifiedShape
    decode_rows: torch.Tensor  # flat rows of the decodes
    decode_tables: torch.Tensor  # their block tables, int32
    decode_seq_lens: torch.Tensor
    chunks: list  # of _Chunks, one SDPA each

    @classmethod
    def build(cls, cu_seqlens_q, seq_lens, block_tables, shape: UnifiedShape) -> CpuPlan:
        q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        decodes, longer = (q_lens == 1).nonzero().flatten(), (q_lens > 1).nonzero().flatten()
        chunks = [_chunks(bucket, cu_seqlens_q, q_lens, seq_lens, block_tables, shape)
                  for bucket in _buckets(longer, q_lens, seq_lens)]
        return cls(shape, cu_seqlens_q[decodes].long(), block_tables[decodes].contiguous(),
                   seq_lens[decodes].contiguous(), chunks)

    def run(self, query, key_cache, value_cache) -> torch.Tensor:
        shape = self.shape
        if not self.chunks:  # decodes only: no scatter
            return paged_attention_cpu(query, key_cache, value_cache, self.decode_tables, self.decode_seq_lens,
                                       shape.scale, shape.sliding_window)
        out = torch.empty(query.shape, dtype=query.dtype)
        if self.decode_rows.numel():
            out[self.decode_rows] = paged_attention_cpu(query[self.decode_rows], key_cache, value_cache,
                                                        self.decode_tables, self.decode_seq_lens, shape.scale,
                                                        shape.sliding_window)
        for c in self.chunks:
            out[c.out_rows] = self._attend_chunks(c, query, key_cache, value_cache)
        return out

    def _attend_chunks(self, c: _Chunks, query, key_cache, value_cache) -> torch.Tensor:
        """One rectangle of chunks through SDPA; the real queries' outputs, in ``c.out_rows`` order."""
        shape = self.shape
        num_seqs, max_q = c.query_rows.shape
        q = query[c.query_rows.flatten()].view(num_seqs, max_q, shape.num_heads, shape.head_size)
        # whole pages, one index per block; slots past a sequence's end are zeroed (a masked key must not be
        # garbage: 0 * nan is nan), as vLLM's kernel loads them masked, as 0
        keys, values = (cache.view(shape.num_blocks, -1).index_select(0, c.blocks).view(
            num_seqs, -1, shape.num_kv_heads, shape.head_size).masked_fill_(c.past_end, 0)
            for cache in (key_cache, value_cache))
        o = F.scaled_dot_product_attention(q.float().transpose(1, 2), keys.float().transpose(1, 2),
                                           values.float().transpose(1, 2), attn_mask=c.mask, scale=shape.scale,
                                           enable_gqa=True)
        return o.transpose(1, 2)[c.real].to(query.dtype)


def _buckets(members, q_lens, seq_lens, slack: float = 2.0) -> list:
    """``members`` in groups whose padded rectangle (count x longest chunk x longest context) costs at most
    ``slack`` times their real work (the sum of ``q_len x seq_len``): longest chunks first, a new group when the
    next one would break that."""
    order = sorted(members.tolist(), key=lambda s: (-int(q_lens[s]), -int(seq_lens[s])))
    buckets, current, real, longest_kv = [], [], 0, 0
    for s in order:
        q, kv = int(q_lens[s]), int(seq_lens[s])
        if current:
            padded = (len(current) + 1) * int(q_lens[current[0]]) * max(longest_kv, kv)
            if padded > slack * (real + q * kv):
                buckets.append(torch.tensor(current))
                current, real, longest_kv = [], 0, 0
        current.append(s)
        real, longest_kv = real + q * kv, max(longest_kv, kv)
    if current:
        buckets.append(torch.tensor(current))
    return buckets


def _chunks(members, cu_seqlens_q, q_lens, seq_lens, block_tables, shape: UnifiedShape) -> _Chunks:
    """Index tensors and the mask of the chunks (built once per step, reused by every layer)."""
    q_len, seq_len, start = q_lens[members].long(), seq_lens[members].long(), cu_seqlens_q[members].long()
    max_q = int(q_len.max())
    num_blocks = -(-int(seq_len.max()) // shape.block_size)
    i = torch.arange(max_q)
    real = i[None, :] < q_len[:, None]  # [S, Q]
    row_in_seq = torch.minimum(i[None, :], q_len[:, None] - 1)  # padding repeats a real query (no empty row)
    positions = seq_len[:, None] - q_len[:, None] + row_in_seq  # [S, Q]
    j = torch.arange(num_blocks * shape.block_size)
    mask = j[None, None, :] <= positions[:, :, None]  # causal (so also j < seq_len)
    if shape.sliding_window is not None:
        mask &= j[None, None, :] > positions[:, :, None] - shape.sliding_window
    tables = block_tables[members, :num_blocks].long()
    used = torch.arange(num_blocks)[None, :] < (-(-seq_len // shape.block_size))[:, None]
    query_rows = start[:, None] + row_in_seq
    past_end = (j[None, :] >= seq_len[:, None])[:, :, None, None]
    return _Chunks(query_rows, torch.where(used, tables, 0).flatten(), mask[:, None], past_end, query_rows[real],
                   real)
