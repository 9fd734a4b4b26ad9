"""How many blocks a CPU tier of ``kv_offloading_size`` GiB holds (vLLM 0.33: ``vllm/v1/kv_offload/cpu/spec.py``,
``CPUOffloadingSpec.__init__``; the GiB become ``cpu_bytes_to_use`` in ``VllmConfig._post_init_kv_transfer_config``).

One chunk (one block, at the default ``blocks_per_chunk = 1``) holds a block's K and V for **every** layer, padded up
to the host page size (``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE``), so the count is
``floor(GiB * 2**30 / round_up(bytes per block, PAGESIZE))``.
"""

from __future__ import annotations

import mmap


def cpu_chunk_bytes(kv_bytes_per_block: int, blocks_per_chunk: int = 1) -> int:
    """Bytes one CPU chunk takes: its blocks' K/V of every layer, rounded up to the host page size."""
    return -(-kv_bytes_per_block * blocks_per_chunk // mmap.PAGESIZE) * mmap.PAGESIZE


def cpu_num_chunks(kv_offloading_size: float, kv_bytes_per_block: int, blocks_per_chunk: int = 1) -> int:
    """CPU chunks that fit ``kv_offloading_size`` GiB, for blocks of ``kv_bytes_per_block`` bytes (all layers)."""
    return int(kv_offloading_size * (1 << 30)) // cpu_chunk_bytes(kv_bytes_per_block, blocks_per_chunk)
