"""vLLM as it is today (0.33, the v1 engine), readable: ``KVCacheManager`` and ``Scheduler``.

The paper's engine (v0) is ``pagedkv.manager`` and ``pagedkv.scheduler``; ``LLMEngine(..., version="v1")`` runs
this one with the same model runner, and ``beam_search`` is vLLM's ``LLM.beam_search`` loop over any engine.
``AsyncScheduler`` schedules step N+1 while step N runs (``LLMEngine(..., async_scheduling=True)``).
Hybrid models (sliding-window layers beside full ones) get one block table per KV cache group
(``kv_cache_interface``, ``single_type_kv_cache_manager``, ``kv_cache_coordinator``, ``block_pool``).
"""

from .async_scheduler import AsyncScheduler
from .beam_search import beam_search
from .kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec, get_kv_cache_groups
from .kv_cache_manager import KVCacheManager
from .scheduler import Request, RequestStatus, Scheduler, SchedulerOutput

__all__ = ["AsyncScheduler", "FullAttentionSpec", "KVCacheGroupSpec", "KVCacheManager", "SlidingWindowSpec",
           "beam_search", "get_kv_cache_groups", "Request", "RequestStatus", "Scheduler", "SchedulerOutput"]
