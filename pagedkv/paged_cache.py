"""Layer 7 — ``PagedKVCache``: block tables and K/V tensors kept in step, behind one object.

The manager decides where tokens go and which blocks must be copied; the
cache engine moves the data.  This facade does both, in the right order, so
``gather(seq)`` always returns exactly the keys and values written for
``seq`` (a forked child inherits its parent's).  One caveat, by design: with
prefix caching a full block is named by its tokens, so a second prompt with the
same leading tokens *shares* the first one's K/V and its own K/V for those
tokens are not written (they would be the same, coming from the same model).  In vLLM the scheduler, the
block manager and the worker's cache engine share this job
(``vllm/core/scheduler.py`` hands ``blocks_to_copy`` / ``blocks_to_swap_*`` to
``vllm/worker/worker.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import torch

from .cache import CacheEngine
from .errors import PagedKVValueError, WrongDeviceError
from .kernels import paged_attention
from .manager import BlockSpaceManager
from .state import ManagerState
from .validate import check_int, check_tensor, check_token_ids, is_list_like


@dataclass(frozen=True)
class CacheEvent:
    """One step in the cache's life, kept for printing and drawing."""

    kind: str  # allocate, append, copy_on_write, fork, swap_out, swap_in, free
    seq_id: object
    blocks: tuple = ()  # blocks the step touched (on the sequence's device afterwards)
    copies: tuple = ()  # (src, dst) block pairs copied

    def __str__(self) -> str:
        copies = ", ".join(f"{s}->{d}" for s, d in self.copies)
        text = f"{self.kind:<13} seq {self.seq_id}: blocks {list(self.blocks)}"
        return text + (f"  copies {copies}" if copies else "")


class PagedKVCache:
    """A paged KV cache for one attention layer, as the labs use it."""

    def __init__(self, num_gpu_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                 num_cpu_blocks: int = 0, dtype: torch.dtype = torch.float32,
                 enable_prefix_caching: bool = False, watermark: float = 0.01, device="cpu"):
        self.manager = BlockSpaceManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark,
                                         enable_prefix_caching)
        self.engine = CacheEngine(num_gpu_blocks, block_size, num_kv_heads, head_size,
                                  num_cpu_blocks, dtype, device)
        self.events: list[CacheEvent] = []

    @property
    def block_size(self) -> int:
        return self.manager.block_size

    @property
    def key_cache(self) -> torch.Tensor:
        return self.engine.key_cache

    @property
    def value_cache(self) -> torch.Tensor:
        return self.engine.value_cache

    def add_sequence(self, seq_id, keys: torch.Tensor, values: torch.Tensor, token_ids=None) -> list[int]:
        """Allocate blocks for a prompt and write its K/V; returns the block table.

        With prefix caching, blocks found in the cache already hold these tokens'
        K/V (K/V depend only on the prefix), so only the rest is written.
        """
        self.engine.check_kv(keys, values)
        token_ids = self._token_ids(token_ids, keys.shape[0], seq_id)
        table = self.manager.allocate(seq_id, token_ids)
        slots = self.manager.get_slot_mapping(seq_id)
        num_cached = self.manager.num_cached_tokens(seq_id)
        self.engine.write([-1] * num_cached + slots[num_cached:], keys, values)
        self._log("allocate", seq_id, table)
        return table

    def append(self, seq_id, key: torch.Tensor, value: torch.Tensor, token_id=None) -> list[tuple[int, int]]:
        """Append one token (``[num_kv_heads, head_size]``) or several (``[n, ...]``).

        Returns the copy-on-write copies that were performed.
        """
        check_tensor("key", key), check_tensor("value", value)
        if key.dim() == 2 and value.dim() == 2:
            key, value = key.unsqueeze(0), value.unsqueeze(0)
        self.engine.check_kv(key, value)
        start = self.manager.get_num_tokens(seq_id)
        token_ids = self._token_ids(token_id, key.shape[0], seq_id, start)
        copies = self.manager.append_slots(seq_id, token_ids)
        self.engine.copy_blocks(copies)
        self.engine.write(self.manager.get_slot_mapping(seq_id)[start:], key, value)
        table = self.manager.get_block_table(seq_id)
        if copies:
            self._log("copy_on_write", seq_id, [dst for _, dst in copies], copies)
        self._log("append", seq_id, table[start // self.block_size:])
        return copies

    def fork(self, parent, child) -> None:
        """The child shares all of the parent's blocks: no data is copied until one of them appends."""
        self.manager.fork(parent, child)
        self._log("fork", child, self.manager.get_block_table(child))

    def free(self, seq_id) -> None:
        table = self.manager.get_block_table(seq_id)
        self.manager.free(seq_id)
        self._log("free", seq_id, table)

    def swap_out(self, seq_id) -> list[tuple[int, int]]:
        """Copy the sequence's blocks to the CPU pool and release its GPU blocks."""
        mapping = self.manager.swap_out(seq_id)
        self.engine.swap("gpu", "cpu", mapping)
        self._log("swap_out", seq_id, [cpu for _, cpu in mapping], mapping)
        return mapping

    def swap_in(self, seq_id) -> list[tuple[int, int]]:
        mapping = self.manager.swap_in(seq_id)
        self.engine.swap("cpu", "gpu", mapping)
        self._log("swap_in", seq_id, [gpu for _, gpu in mapping], mapping)
        return mapping

    def gather(self, seq_id) -> tuple[torch.Tensor, torch.Tensor]:
        """The sequence's keys and values, ``[num_tokens, num_kv_heads, head_size]`` each, in order."""
        device = self.manager.get_device(seq_id)
        if device != "gpu":
            raise WrongDeviceError(f"sequence {seq_id!r} is swapped out to the CPU; call swap_in({seq_id!r}) "
                                   "before reading it.")
        return self.engine.read_blocks(self.manager.get_block_table(seq_id), self.manager.get_num_tokens(seq_id))

    def block_tables(self, seq_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """``block_tables`` (int32, padded with 0) and ``seq_lens`` for a batch, as the kernel takes them."""
        tables = [self.manager.get_block_table(s) for s in seq_ids]
        for seq_id in seq_ids:
            if self.manager.get_device(seq_id) != "gpu":
                raise WrongDeviceError(f"sequence {seq_id!r} is swapped out; swap_in({seq_id!r}) before attention.")
        width = max((len(t) for t in tables), default=0)
        block_tables = torch.zeros((len(tables), max(width, 1)), dtype=torch.int32)
        for row, table in enumerate(tables):
            block_tables[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
        seq_lens = torch.tensor([self.manager.get_num_tokens(s) for s in seq_ids], dtype=torch.int32)
        return block_tables, seq_lens

    def attention(self, query: torch.Tensor, seq_ids, backend: str = "auto", **kwargs) -> torch.Tensor:
        """One decode step of attention for ``seq_ids``: ``query`` is ``[len(seq_ids), num_heads, head_size]``."""
        if not is_list_like(seq_ids):
            raise PagedKVValueError(f"seq_ids must be a list of sequence ids, one per query row, got {seq_ids!r}.")
        block_tables, seq_lens = self.block_tables(list(seq_ids))
        return paged_attention(query, self.key_cache, self.value_cache, block_tables, seq_lens,
                               backend=backend, **kwargs)

    def snapshot(self) -> ManagerState:
        return self.manager.snapshot()

    def format_events(self, last: int | None = None) -> str:
        events = self.events if last is None else self.events[-check_int("last", last, minimum=1):]
        return "\n".join(f"{i:>3}. {e}" for i, e in enumerate(events, start=len(self.events) - len(events) + 1))

    def _log(self, kind: str, seq_id, blocks, copies=()) -> None:
        self.events.append(CacheEvent(kind, seq_id, tuple(blocks), tuple(copies)))

    def _token_ids(self, token_ids, n: int, seq_id, start: int = 0) -> list[int]:
        if token_ids is None:
            if self.manager.enable_prefix_caching:
                raise PagedKVValueError(f"prefix caching names blocks by their token ids; pass token_ids "
                                        f"for sequence {seq_id!r}.")
            return list(range(start, start + n))  # placeholders: nothing reads them without caching
        single = isinstance(token_ids, Integral) or getattr(token_ids, "ndim", None) == 0
        ids = check_token_ids("token_ids", [token_ids] if single else token_ids)
        if len(ids) != n:
            raise PagedKVValueError(f"got {len(ids)} token ids for {n} K/V rows of sequence {seq_id!r}; "
                                    "pass one token id per token.")
        return ids
