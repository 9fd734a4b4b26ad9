"""The dense reference: gather each sequence's K/V through its block table, then plain attention.

Slow (it copies every sequence's keys and values out of the pages) but
obviously right; every kernel is tested against it and against torch's
``scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch

from .validate import check_attention_args


def gather_kv(key_cache, value_cache, block_table, seq_len: int):
    """``[seq_len, num_kv_heads, head_size]`` keys and values of one sequence, in token order."""
    block_size = key_cache.shape[1]
    blocks = block_table[: -(-seq_len // block_size)].long()
    keys = key_cache[blocks].flatten(0, 1)[:seq_len]  # [blocks, block_size, ...] -> [tokens, ...]
    values = value_cache[blocks].flatten(0, 1)[:seq_len]
    return keys, values


def reference_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, scale=None, *,
                              backend="torch", partition_size=None):
    """Same arguments as ``paged_attention``; softmax in float32, torch only."""
    shape = check_attention_args(query, key_cache, value_cache, block_tables, seq_lens, scale,
                                 backend, partition_size)
    out = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    for seq in range(shape.num_seqs):
        keys, values = gather_kv(key_cache, value_cache, block_tables[seq], int(seq_lens[seq]))
        # GQA/MQA: query head h reads KV head h // num_queries_per_kv.
        keys = keys.float().repeat_interleave(shape.num_queries_per_kv, dim=1)  # [tokens, heads, head_size]
        values = values.float().repeat_interleave(shape.num_queries_per_kv, dim=1)
        logits = torch.einsum("hd,thd->ht", query[seq].float(), keys) * shape.scale
        probs = torch.softmax(logits, dim=-1)
        out[seq] = torch.einsum("ht,thd->hd", probs, values)
    return out.to(query.dtype)


def reference_unified_attention(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables, scale=None, *,
                                sliding_window=None, backend="torch"):
    """``unified_paged_attention``'s dense reference: per sequence, gather its keys, mask them, softmax in float32.

    Query ``i`` of sequence ``s`` sits at position ``p = seq_lens[s] - q_len + i`` and sees keys ``j <= p`` (and
    ``j > p - sliding_window`` when a window is given), written out as an explicit boolean mask.
    """
    from .validate import check_unified_args

    shape = check_unified_args(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_tables, scale,
                               sliding_window, backend)
    out = torch.empty(query.shape, dtype=torch.float32, device=query.device)
    starts = cu_seqlens_q.tolist()
    for seq in range(shape.num_seqs):
        seq_len, rows = int(seq_lens[seq]), slice(starts[seq], starts[seq + 1])
        keys, values = gather_kv(key_cache, value_cache, block_tables[seq], seq_len)
        keys = keys.float().repeat_interleave(shape.num_queries_per_kv, dim=1)  # [tokens, heads, head_size]
        values = values.float().repeat_interleave(shape.num_queries_per_kv, dim=1)
        positions = torch.arange(seq_len - (rows.stop - rows.start), seq_len, device=query.device)
        j = torch.arange(seq_len, device=query.device)
        mask = j[None, :] <= positions[:, None]  # causal: [q_len, seq_len]
        if sliding_window is not None:
            mask &= j[None, :] > positions[:, None] - sliding_window
        logits = torch.einsum("qhd,thd->hqt", query[rows].float(), keys) * shape.scale
        probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        out[rows] = torch.einsum("hqt,thd->qhd", probs, values)
    return out.to(query.dtype)
