"""pagedkv: how vLLM manages the KV cache in pages, as a small readable package.

Layers, lowest first (a module only imports the ones above it in this list):
sizing -> blocks -> prefix -> manager -> cache -> kernels -> paged_cache -> scheduler -> sim
-> sampling -> v1 -> gguf_file, tokenizer (read by model) -> model -> output_processor -> engine -> decoding -> viz.
"""

from .blocks import BlockAllocator, FreeBlockQueue
from .cache import CacheEngine
from .engine import EngineStats, LLMEngine
from .errors import (
    BlockTableError,
    DoubleFreeError,
    DuplicateSequenceError,
    EmptyPromptError,
    ModelFileError,
    NoFreeBlocksError,
    PagedKVError,
    PagedKVKeyError,
    PagedKVValueError,
    ShapeError,
    UnknownSequenceError,
    WrongDeviceError,
)
from .kernels import (  # first: sets the CUDA mode
    CUDA_MODE,
    paged_attention,
    reference_paged_attention,
    unified_paged_attention,
)
from .manager import AllocStatus, BlockSpaceManager
from .model import LlamaConfig, LlamaForCausalLM, beam_search_dense, generate_dense, load_smollm2, load_tiny
from .paged_cache import CacheEvent, PagedKVCache
from .prefix import hash_block_tokens
from .sampling import BeamSearchParams, CompletionOutput, RequestOutput, SamplingParams
from .scheduler import PreemptionMode, Scheduler, SchedulerOutputs
from .sizing import MODELS, ModelSpec, cache_block_bytes, num_cpu_blocks, num_gpu_blocks
from .state import BlockState, ManagerState
from .v1 import beam_search

__version__ = "0.1.0"

__all__ = [
    "AllocStatus", "BeamSearchParams", "BlockAllocator", "BlockSpaceManager", "BlockState", "BlockTableError",
    "CUDA_MODE", "CacheEngine", "CacheEvent", "CompletionOutput", "DoubleFreeError", "DuplicateSequenceError",
    "EmptyPromptError", "EngineStats", "FreeBlockQueue", "LLMEngine", "LlamaConfig", "LlamaForCausalLM", "MODELS",
    "ManagerState", "ModelFileError", "ModelSpec", "NoFreeBlocksError", "PagedKVCache", "PagedKVError",
    "PagedKVKeyError", "PagedKVValueError", "PreemptionMode", "RequestOutput", "SamplingParams", "Scheduler",
    "SchedulerOutputs", "ShapeError", "UnknownSequenceError", "WrongDeviceError", "beam_search", "beam_search_dense",
    "cache_block_bytes", "generate_dense", "hash_block_tokens", "load_smollm2", "load_tiny", "num_cpu_blocks",
    "num_gpu_blocks", "paged_attention", "reference_paged_attention", "unified_paged_attention",
]
