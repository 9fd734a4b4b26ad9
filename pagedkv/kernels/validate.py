"""Check ``paged_attention``'s arguments before any kernel is launched.

A bad block id would make a GPU kernel read someone else's memory and return
garbage (or crash the process); here it becomes an error naming the argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import torch

from ..errors import BlockTableError, PagedKVValueError, ShapeError
from ..validate import check_choice

BACKENDS = ("auto", "cuda", "cpu", "torch")
NUMBA_DTYPES = (torch.float32, torch.float16)
MAX_PARTITION_SIZE = 8192  # 32 KB of float32 logits + q, reductions: under numba's 48 KB static shared memory


@dataclass(frozen=True)
class AttentionShape:
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    num_blocks: int
    block_size: int
    max_blocks_per_seq: int
    max_seq_len: int
    scale: float

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads


def _require(cond: bool, error, message: str) -> None:
    if not cond:
        raise error(message)


def check_attention_args(query, key_cache, value_cache, block_tables, seq_lens, scale=None,
                         backend="auto", partition_size=None) -> AttentionShape:
    """Validate everything; return the sizes the kernels need."""
    check_choice("backend", backend, BACKENDS)
    _check_tensors(query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
                   seq_lens=seq_lens)
    _require(query.dim() == 3, ShapeError,
             f"query has shape {tuple(query.shape)}; expected [num_seqs, num_heads, head_size].")
    num_seqs = query.shape[0]
    num_heads, num_kv_heads, head_size, num_blocks, block_size = _check_query_and_caches(
        query, key_cache, value_cache, backend)
    lens = _check_seq_lens_and_tables(block_tables, seq_lens, num_seqs, block_size, num_blocks)
    if partition_size is not None:
        whole = isinstance(partition_size, int) and not isinstance(partition_size, bool)
        _require(whole and partition_size >= 0 and partition_size % block_size == 0,
                 PagedKVValueError,
                 f"partition_size must be 0 (force v1) or a positive multiple of block_size ({block_size}), "
                 f"got {partition_size!r}.")
        _require(partition_size <= MAX_PARTITION_SIZE, PagedKVValueError,
                 f"partition_size {partition_size} is too large: one partition's float32 logits live in 48 KB "
                 f"of shared memory, so at most {MAX_PARTITION_SIZE} tokens (vLLM uses 512).")
        _require(partition_size > 0 or num_seqs == 0 or int(lens.max()) <= MAX_PARTITION_SIZE, PagedKVValueError,
                 f"partition_size=0 forces v1, which holds a whole sequence's float32 logits in 48 KB of shared "
                 f"memory: at most {MAX_PARTITION_SIZE} tokens, and the longest sequence has {int(lens.max())}. "
                 "Pass partition_size=512 (v2) or None.")
    return AttentionShape(num_seqs, num_heads, num_kv_heads, head_size, num_blocks, block_size,
                          block_tables.shape[1], int(lens.max()) if num_seqs else 0, _check_scale(scale, head_size))


def _check_tensors(query, **named) -> None:
    """Every argument a dense, contiguous torch.Tensor with data, on query's device."""
    for name, t in {"query": query, **named}.items():
        _require(isinstance(t, torch.Tensor), ShapeError, f"{name} must be a torch.Tensor, got {type(t).__name__}.")
        _require(t.layout == torch.strided and t.device.type != "meta", ShapeError,
                 f"{name} must be a dense tensor with data (got layout {t.layout} on {t.device}); pass .to_dense().")
        _require(t.is_contiguous(), ShapeError, f"{name} must be contiguous; pass {name}.contiguous().")
        _require(t.device == query.device, ShapeError,
                 f"{name} is on {t.device} but query is on {query.device}; put every tensor on one device.")


def _check_query_and_caches(query, key_cache, value_cache, backend) -> tuple[int, int, int, int, int]:
    """A 3-D query against ``[num_blocks, block_size, num_kv_heads, head_size]`` caches: sizes, GQA, dtypes.

    Returns ``(num_heads, num_kv_heads, head_size, num_blocks, block_size)``."""
    _require(key_cache.dim() == 4, ShapeError, f"key_cache has shape {tuple(key_cache.shape)}; expected "
             "[num_blocks, block_size, num_kv_heads, head_size].")
    _require(value_cache.shape == key_cache.shape, ShapeError,
             f"value_cache {tuple(value_cache.shape)} must have key_cache's shape {tuple(key_cache.shape)}.")
    _, num_heads, head_size = query.shape
    num_blocks, block_size, num_kv_heads, cache_head_size = key_cache.shape
    for name, size in (("num_heads", num_heads), ("head_size", head_size), ("num_blocks", num_blocks),
                       ("block_size", block_size), ("num_kv_heads", num_kv_heads)):
        _require(size >= 1, ShapeError, f"{name} is {size} (query {tuple(query.shape)}, caches "
                 f"{tuple(key_cache.shape)}); every size but num_seqs must be at least 1.")
    _require(cache_head_size == head_size, ShapeError,
             f"query's head_size is {head_size} but the cache's is {cache_head_size}.")
    _require(num_heads % num_kv_heads == 0, ShapeError,
             f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}) for GQA/MQA.")
    _require(query.dtype == key_cache.dtype == value_cache.dtype, ShapeError,
             f"query, key_cache and value_cache must share a dtype; got {query.dtype}, "
             f"{key_cache.dtype}, {value_cache.dtype}.")
    _require(query.dtype.is_floating_point, ShapeError,
             f"attention needs floating-point tensors, got {query.dtype}; convert with .float().")
    if backend in ("cuda", "cpu", "auto"):
        _require(query.dtype in NUMBA_DTYPES, ShapeError,
                 f"the numba kernels take float32 or float16, got {query.dtype}; use backend='torch' or convert.")
    return num_heads, num_kv_heads, head_size, num_blocks, block_size


def _check_seq_lens_and_tables(block_tables, seq_lens, num_seqs, block_size, num_blocks) -> torch.Tensor:
    """int32 ``seq_lens [num_seqs]``, each >= 1 and within its block table; every block id read is in the cache.

    Returns the lengths on the CPU."""
    _require(block_tables.dtype == torch.int32 and block_tables.dim() == 2
             and block_tables.shape[0] == num_seqs, ShapeError,
             f"block_tables must be int32 [num_seqs={num_seqs}, max_blocks_per_seq]; got "
             f"{block_tables.dtype} {tuple(block_tables.shape)}.")
    _require(seq_lens.dtype == torch.int32 and tuple(seq_lens.shape) == (num_seqs,), ShapeError,
             f"seq_lens must be int32 [num_seqs={num_seqs}]; got {seq_lens.dtype} {tuple(seq_lens.shape)}.")
    lens = seq_lens.cpu()
    capacity = block_tables.shape[1] * block_size
    _require(num_seqs == 0 or int(lens.min()) >= 1, BlockTableError,
             f"seq_lens must all be >= 1 (a decode step attends to at least its own token); got {lens.tolist()}.")
    _require(num_seqs == 0 or int(lens.max()) <= capacity, BlockTableError,
             f"seq_lens {lens.tolist()} exceed what block_tables can address: {block_tables.shape[1]} blocks "
             f"x block_size {block_size} = {capacity} tokens.")
    tables = block_tables.cpu()
    blocks_used = (lens + block_size - 1) // block_size
    in_use = torch.arange(tables.shape[1]) < blocks_used[:, None]  # the entries each sequence reads
    bad = in_use & ((tables < 0) | (tables >= num_blocks))
    if bad.any():
        seq = int(bad.any(dim=1).nonzero()[0])
        raise BlockTableError(f"block_tables[{seq}] uses block id(s) {tables[seq][bad[seq]].tolist()}, outside "
                              f"the cache's {num_blocks} blocks (valid ids 0..{num_blocks - 1}).")
    return lens


def _check_scale(scale, head_size: int) -> float:
    if scale is None:
        scale = head_size ** -0.5
    _require(isinstance(scale, Real) and not isinstance(scale, bool) and math.isfinite(scale), PagedKVValueError,
             f"scale must be a finite number (default head_size ** -0.5 = {head_size ** -0.5:.4g}), got {scale!r}.")
    return float(scale)


@dataclass(frozen=True)
class UnifiedShape:
    """The sizes ``unified_paged_attention``'s kernels need (vLLM: the step's attention metadata)."""

    num_tokens: int
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    num_blocks: int
    block_size: int
    max_query_len: int
    max_seq_len: int
    scale: float
    sliding_window: int | None

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads


def check_unified_args(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables, scale=None,
                       sliding_window=None, backend="auto") -> UnifiedShape:
    """Validate ``unified_paged_attention``'s arguments; return the sizes the kernels need."""
    check_choice("backend", backend, BACKENDS)
    _check_tensors(query, key_cache=key_cache, value_cache=value_cache, cu_seqlens_q=cu_seqlens_q,
                   seq_lens=seq_lens, block_tables=block_tables)
    _require(query.dim() == 3, ShapeError,
             f"query has shape {tuple(query.shape)}; expected [num_tokens, num_heads, head_size].")
    num_heads, num_kv_heads, head_size, num_blocks, block_size = _check_query_and_caches(
        query, key_cache, value_cache, backend)
    num_tokens = query.shape[0]
    _require(cu_seqlens_q.dtype == torch.int32 and cu_seqlens_q.dim() == 1 and cu_seqlens_q.numel() >= 1,
             ShapeError, f"cu_seqlens_q must be int32 [num_seqs + 1] (0, then each sequence's last query row + 1); "
             f"got {cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)}.")
    starts = cu_seqlens_q.cpu()
    q_lens = starts[1:] - starts[:-1]
    _require(int(starts[0]) == 0, PagedKVValueError, f"cu_seqlens_q must start at 0, got {starts.tolist()}.")
    _require(bool((q_lens > 0).all()), PagedKVValueError,
             f"cu_seqlens_q must be strictly increasing (every sequence has at least one query), got "
             f"{starts.tolist()}.")
    _require(int(starts[-1]) == num_tokens, PagedKVValueError,
             f"cu_seqlens_q ends at {int(starts[-1])} but query has {num_tokens} rows; its last entry must be "
             "num_tokens.")
    num_seqs = q_lens.numel()
    lens = _check_seq_lens_and_tables(block_tables, seq_lens, num_seqs, block_size, num_blocks)
    too_long = (q_lens > lens).nonzero()
    if too_long.numel():
        s = int(too_long[0])
        raise PagedKVValueError(f"sequence {s} has {int(q_lens[s])} queries but seq_lens[{s}] = {int(lens[s])}: "
                                "its queries are the last of its tokens, so q_len <= seq_len (write the step's K/V "
                                "first and count them in seq_lens).")
    whole = isinstance(sliding_window, int) and not isinstance(sliding_window, bool)
    _require(sliding_window is None or (whole and sliding_window >= 1), PagedKVValueError,
             f"sliding_window must be None (full attention) or a positive int (keys j > position - window), got "
             f"{sliding_window!r}.")
    return UnifiedShape(num_tokens, num_seqs, num_heads, num_kv_heads, head_size, num_blocks, block_size,
                        int(q_lens.max()) if num_seqs else 0, int(lens.max()) if num_seqs else 0,
                        _check_scale(scale, head_size), sliding_window)
