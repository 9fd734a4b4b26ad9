"""Layer 1 — block-size arithmetic: how many bytes a token and a block of KV cache take.

Every token keeps one key and one value vector per layer and per KV head, so

    kv_bytes_per_token = 2 (K and V) * num_layers * num_kv_heads * head_size * bytes(dtype)

A block holds ``block_size`` tokens.  vLLM profiles the model, sees how much GPU
memory is left below ``gpu_memory_utilization``, and carves the rest into
blocks: see ``vllm/worker/cache_engine.py`` (``get_cache_block_size``) and
``determine_num_available_blocks`` in ``vllm/worker/worker.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Real

from .errors import PagedKVValueError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}

GiB = 1024**3


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise PagedKVValueError(f"{name} must be a positive integer, got {value!r}.")


def _check_memory(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise PagedKVValueError(f"{name} must be a finite number of bytes >= 0, got {value!r}.")


def _check_spec(spec) -> None:
    if not isinstance(spec, ModelSpec):
        raise PagedKVValueError(f"spec must be a ModelSpec, got {type(spec).__name__}; e.g. MODELS['llama-2-7b'] "
                                "or ModelSpec(name, num_layers, num_heads, num_kv_heads, head_size).")


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a model's attention, which is all the KV cache depends on.

    ``num_kv_heads == num_heads`` is multi-head attention (MHA), ``1`` is
    multi-query (MQA), anything between is grouped-query attention (GQA).
    ``num_params`` is optional and only used to estimate the weights' memory.
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: str = "float16"
    num_params: int | None = None

    def __post_init__(self):
        for field in ("num_layers", "num_heads", "num_kv_heads", "head_size"):
            _check_positive_int(field, getattr(self, field))
        if self.num_heads % self.num_kv_heads:
            raise PagedKVValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}): each KV head serves a whole group of query heads."
            )
        if self.num_params is not None:
            _check_positive_int("num_params", self.num_params)
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise PagedKVValueError(
                f"unknown dtype {self.dtype!r}; use one of {sorted(DTYPE_BYTES)}."
            )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K **and** V one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_size * self.dtype_bytes

    @property
    def attention_kind(self) -> str:
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def weight_bytes(self) -> int:
        """Memory of the weights at 2 bytes a parameter (fp16/bf16 serving)."""
        if self.num_params is None:
            raise PagedKVValueError(f"{self.name} has no num_params; pass num_params=... to ModelSpec.")
        return 2 * self.num_params

    def with_dtype(self, dtype: str) -> ModelSpec:
        """The same model with its KV cache stored in another dtype."""
        return replace(self, dtype=dtype)


def cache_block_bytes(spec: ModelSpec, block_size: int) -> int:
    """Bytes of one KV block: ``block_size`` tokens, K and V, every layer."""
    _check_spec(spec)
    _check_positive_int("block_size", block_size)
    return block_size * spec.kv_bytes_per_token


def num_gpu_blocks(
    spec: ModelSpec,
    block_size: int,
    total_memory: int,
    peak_memory: int,
    gpu_memory_utilization: float = 0.9,
) -> int:
    """Blocks that fit in the GPU memory left after the profiled peak.

    ``peak_memory`` is what a forward pass used (weights + activations);
    vLLM may use ``total_memory * gpu_memory_utilization`` in all.
    """
    if (isinstance(gpu_memory_utilization, bool) or not isinstance(gpu_memory_utilization, Real)
            or not 0 < gpu_memory_utilization <= 1):
        raise PagedKVValueError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}."
        )
    _check_memory("total_memory", total_memory)
    _check_memory("peak_memory", peak_memory)
    block_bytes = cache_block_bytes(spec, block_size)
    return max(0, int((total_memory * gpu_memory_utilization - peak_memory) // block_bytes))


def num_cpu_blocks(spec: ModelSpec, block_size: int, swap_space_bytes: int) -> int:
    """Blocks that fit in the CPU swap space (vLLM's ``--swap-space``)."""
    _check_memory("swap_space_bytes", swap_space_bytes)
    return int(swap_space_bytes // cache_block_bytes(spec, block_size))


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that ``num_tokens`` tokens occupy: the ceiling of the division."""
    return -(-num_tokens // block_size)


# Real shapes from each model's config.json on the Hugging Face hub.
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("opt-13b", num_layers=40, num_heads=40, num_kv_heads=40, head_size=128,
                  num_params=12_853_000_000),
        ModelSpec("llama-2-7b", num_layers=32, num_heads=32, num_kv_heads=32, head_size=128,
                  num_params=6_738_000_000),
        ModelSpec("llama-2-13b", num_layers=40, num_heads=40, num_kv_heads=40, head_size=128,
                  num_params=13_016_000_000),
        ModelSpec("llama-2-70b", num_layers=80, num_heads=64, num_kv_heads=8, head_size=128,
                  num_params=68_977_000_000),
        ModelSpec("llama-3-8b", num_layers=32, num_heads=32, num_kv_heads=8, head_size=128,
                  num_params=8_030_000_000),
        ModelSpec("mistral-7b", num_layers=32, num_heads=32, num_kv_heads=8, head_size=128,
                  num_params=7_242_000_000),
        ModelSpec("falcon-7b", num_layers=32, num_heads=71, num_kv_heads=1, head_size=64,
                  num_params=6_922_000_000),
    )
}
