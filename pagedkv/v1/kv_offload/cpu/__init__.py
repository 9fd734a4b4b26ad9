"""The CPU backend of KV offloading (vLLM 0.33: ``vllm/v1/kv_offload/cpu/``)."""

from .manager import CPUOffloadingManager
from .policies import LRUCachePolicy
from .spec import cpu_chunk_bytes, cpu_num_chunks

__all__ = ["CPUOffloadingManager", "LRUCachePolicy", "cpu_chunk_bytes", "cpu_num_chunks"]
