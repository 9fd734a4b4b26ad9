"""Layer 5 — the physical KV cache: the tensors the block tables point into.

Each pool (``"gpu"``, and ``"cpu"`` for swapped-out blocks) holds a key and a
value tensor shaped ``[num_blocks, block_size, num_kv_heads, head_size]``, so
``key_cache[b, i]`` is the key of the token in slot ``i`` of block ``b``.
The three operations mirror vLLM's CUDA ops (``csrc/cache_kernels.cu``):
``write`` is ``reshape_and_cache``, ``copy_blocks`` does copy-on-write copies
and ``swap`` is ``swap_blocks``; ``vllm/worker/cache_engine.py`` owns the tensors.
"""

from __future__ import annotations

import torch

from .errors import PagedKVValueError, ShapeError
from .validate import check_choice, check_int, check_int_list, is_list_like


def _device(device) -> torch.device:
    """``device`` as a torch.device that exists on this machine."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise PagedKVValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}.") from None
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise PagedKVValueError(f"device {device} is not available here (torch sees {torch.cuda.device_count()} CUDA "
                                "GPUs); use device='cpu', which stands in for the GPU pool.")
    if device.type not in ("cpu", "cuda"):
        raise PagedKVValueError(f"device must be 'cpu' or a CUDA device, got {device}.")
    return device


def reshape_and_cache(key_cache: torch.Tensor, value_cache: torch.Tensor, slots: torch.Tensor,
                      k: torch.Tensor, v: torch.Tensor) -> None:
    """Token ``i``'s K and V into slot ``slots[i]`` (block ``slot // block_size``, offset ``slot % block_size``).

    vLLM's ``reshape_and_cache`` op (``csrc/cache_kernels.cu``), unchecked: :meth:`CacheEngine.write` checks
    first, and the engine checks its slot mapping once per step, then writes every layer with this.
    """
    num_kv_heads, head_size = key_cache.shape[2:]
    key_cache.view(-1, num_kv_heads, head_size)[slots] = k.to(key_cache.device)  # a slot-major view, no copy
    value_cache.view(-1, num_kv_heads, head_size)[slots] = v.to(value_cache.device)


class CacheEngine:
    """Allocates the K/V tensors of both pools and moves data between blocks."""

    def __init__(self, num_gpu_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                 num_cpu_blocks: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
        for name, value, minimum in (("num_gpu_blocks", num_gpu_blocks, 0), ("block_size", block_size, 1),
                                     ("num_kv_heads", num_kv_heads, 1), ("head_size", head_size, 1),
                                     ("num_cpu_blocks", num_cpu_blocks, 0)):
            check_int(name, value, minimum)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise PagedKVValueError(f"dtype must be a floating torch dtype such as torch.float16, got {dtype!r}.")
        device = _device(device)
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.dtype = dtype
        # The "gpu" pool lives on `device`; without a GPU, CPU tensors stand in for it.
        self.pools = {
            "gpu": self._empty_pool(num_gpu_blocks, device),
            "cpu": self._empty_pool(num_cpu_blocks, torch.device("cpu")),
        }

    def _empty_pool(self, num_blocks: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (num_blocks, self.block_size, self.num_kv_heads, self.head_size)
        return (torch.zeros(shape, dtype=self.dtype, device=device),
                torch.zeros(shape, dtype=self.dtype, device=device))

    @property
    def key_cache(self) -> torch.Tensor:
        return self.pools["gpu"][0]

    @property
    def value_cache(self) -> torch.Tensor:
        return self.pools["gpu"][1]

    def num_blocks(self, pool: str = "gpu") -> int:
        return self._pool(pool)[0].shape[0]

    def check_kv(self, k: torch.Tensor, v: torch.Tensor, num_tokens: int | None = None) -> None:
        """Raise ShapeError unless ``k`` and ``v`` are ``[num_tokens, num_kv_heads, head_size]`` of our dtype."""
        expected = (num_tokens if num_tokens is not None else "n", self.num_kv_heads, self.head_size)
        for name, t in (("keys", k), ("values", v)):
            if not isinstance(t, torch.Tensor):
                raise ShapeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
            if t.layout != torch.strided or t.device.type == "meta":
                raise ShapeError(f"{name} must be a dense tensor with data (got layout {t.layout}, device "
                                 f"{t.device}); pass .to_dense() of a real tensor.")
            shape_ok = t.dim() == 3 and tuple(t.shape[1:]) == expected[1:]
            if not shape_ok or (num_tokens is not None and t.shape[0] != num_tokens):
                raise ShapeError(f"{name} has shape {tuple(t.shape)}; expected {expected} "
                                 "(tokens, num_kv_heads, head_size).")
            if t.dtype != self.dtype:
                raise ShapeError(f"{name} has dtype {t.dtype}; this cache stores {self.dtype}. "
                                 f"Convert with .to({self.dtype}).")
        if k.shape[0] != v.shape[0]:
            raise ShapeError(f"keys ({k.shape[0]} tokens) and values ({v.shape[0]} tokens) differ in length.")

    def write(self, slot_mapping, k: torch.Tensor, v: torch.Tensor, pool: str = "gpu") -> None:
        """Store token ``i`` at block ``slot // block_size``, offset ``slot % block_size``; slot -1 is skipped."""
        key_cache, value_cache = self._pool(pool)
        slots = slot_mapping if isinstance(slot_mapping, torch.Tensor) else check_int_list("slot_mapping",
                                                                                            slot_mapping)
        if isinstance(slots, torch.Tensor) and (slots.dtype.is_floating_point or slots.dtype.is_complex
                                                or slots.dtype == torch.bool or slots.dim() > 1):
            raise PagedKVValueError(f"slot_mapping must hold integer slots in one dimension, got a {slots.dtype} "
                                    f"tensor of shape {tuple(slots.shape)}.")
        slots = torch.as_tensor(slots, dtype=torch.long).reshape(-1)
        self.check_kv(k, v, num_tokens=slots.numel())
        num_slots = key_cache.shape[0] * self.block_size
        if slots.numel() and (slots.min() < -1 or slots.max() >= num_slots):
            raise PagedKVValueError(f"slot_mapping holds {slots.min().item()}..{slots.max().item()}, "
                                    f"but this pool has slots 0..{num_slots - 1} (-1 means skip).")
        keep = slots >= 0
        # a cache stores values, never autograd history
        reshape_and_cache(key_cache, value_cache, slots[keep], k.detach()[keep], v.detach()[keep])

    def copy_blocks(self, pairs, pool: str = "gpu") -> None:
        """Copy whole blocks ``src -> dst`` inside one pool (all copy-on-write copies at once)."""
        if type(pairs) is list and not pairs:  # most steps copy nothing
            return
        src, dst = self._block_indices(pairs, pool, pool)
        for cache in self._pool(pool):
            cache[dst] = cache[src]  # the right side is gathered first, so copies don't interfere

    def swap(self, src_pool: str, dst_pool: str, pairs) -> None:
        """Copy blocks between pools: ``(src_block, dst_block)`` pairs, e.g. GPU -> CPU on swap-out."""
        if type(pairs) is list and not pairs:
            return
        src, dst = self._block_indices(pairs, src_pool, dst_pool)
        for src_cache, dst_cache in zip(self._pool(src_pool), self._pool(dst_pool)):
            dst_cache[dst] = src_cache[src].to(dst_cache.device)

    def read_blocks(self, block_table, num_tokens: int, pool: str = "gpu") -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``num_tokens`` keys and values stored in ``block_table``'s blocks, in order."""
        index = torch.as_tensor(check_int_list("block_table", block_table, minimum=0), dtype=torch.long)
        num_tokens = check_int("num_tokens", num_tokens, minimum=0)
        key_cache, _ = self._pool(pool)
        if index.numel() and index.max() >= key_cache.shape[0]:
            raise PagedKVValueError(f"block_table names block {index.max().item()}, but the {pool} pool has "
                                    f"{key_cache.shape[0]} blocks.")
        return tuple(cache[index].reshape(-1, self.num_kv_heads, self.head_size)[:num_tokens].clone()
                     for cache in self._pool(pool))

    def _pool(self, pool: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pools[check_choice("pool", pool, tuple(self.pools))]

    def _block_indices(self, pairs, src_pool: str, dst_pool: str) -> tuple[torch.Tensor, torch.Tensor]:
        self._pool(src_pool), self._pool(dst_pool)
        if not is_list_like(pairs, ndim=2) and not is_list_like(pairs):  # a tensor [n, 2], or a list of pairs
            raise PagedKVValueError(f"block pairs must be a list of (src, dst) block ids, got {pairs!r}.")
        pairs = list(pairs)
        for pair in pairs:
            if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
                raise PagedKVValueError(f"each block pair is (src, dst), got {pair!r} in {pairs!r}.")
            for block_id in pair:
                check_int("a block id in the pairs", block_id, minimum=0)
        index = torch.as_tensor(pairs, dtype=torch.long).reshape(-1, 2)
        for column, pool in ((0, src_pool), (1, dst_pool)):
            n = self.num_blocks(pool)
            if len(index) and (index[:, column].min() < 0 or index[:, column].max() >= n):
                valid = f"valid ids 0..{n - 1}" if n else "it has no blocks"
                raise PagedKVValueError(f"block pairs {list(pairs)} name a block outside the {pool} pool ({valid}).")
        return index[:, 0], index[:, 1]
