"""vLLM as it is today (0.33, the v1 engine), readable: ``KVCacheManager`` and ``Scheduler``.

The paper's engine (v0) is ``pagedkv.manager`` and ``pagedkv.scheduler``; ``LLMEngine(..., version="v1")`` runs
this one with the same model runner, and ``beam_search`` is vLLM's ``LLM.beam_search`` loop over any engine.
"""

from .beam_search import beam_search
from .kv_cache_manager import KVCacheManager
from .scheduler import Request, RequestStatus, Scheduler, SchedulerOutput

__all__ = ["KVCacheManager", "beam_search", "Request", "RequestStatus", "Scheduler", "SchedulerOutput"]
