"""Layer 1 — block-size arithmetic: how many bytes a token and a block of KV cache take.

Every token keeps one key and one value vector per layer and per KV head, so

    kv_bytes_per_token = 2 (K and V) * num_layers * num_kv_heads * head_size * bytes(dtype)

A block holds ``block_size`` tokens.  vLLM profiles the model, sees how much GPU
memory is left below ``gpu_memory_utilization``, and carves the rest into
blocks: see ``vllm/worker/cache_engine.py`` (``get_cache_block_size``) and
``determine_num_available_blocks`` in ``vllm/worker/worker.py``.

Hybrid models (Gemma 3, gpt-oss, Mistral-7B-v0.1) have sliding-window layers that need only their last
``sliding_window`` tokens, so the bytes a *request* holds depend on its length L:

    request_kv_bytes(L) = sum over layers of 2 * num_kv_heads * head_size * bytes(dtype) * min(L, window)

vLLM today (0.33) puts such layers into KV cache groups of equal size over one block pool
(``_get_kv_cache_groups_uniform_page_size`` in ``vllm/v1/core/kv_cache_planning.py``); a pool block holds one page
(``block_size`` tokens of one layer) for each layer of a group, so ``cache_block_bytes`` is ``group_size`` pages and
``num_gpu_blocks`` divides the memory by that (``get_kv_cache_config_from_groups``, same file). A uniform model is
one group of all its layers: the formula above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from numbers import Real

from .errors import PagedKVValueError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}

GiB = 1024**3
LAYER_TYPES = ("full_attention", "sliding_attention")  # Hugging Face's names


MAX_NUM_LAYERS = 100_000


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
    ``sliding_window`` and ``layer_types`` (Hugging Face's names) describe a hybrid model: a
    ``"sliding_attention"`` layer keeps only its last ``sliding_window`` tokens. ``layer_types=None``: every
    layer slides if a window is given (Mistral-7B-v0.1), else none does.
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: str = "float16"
    num_params: int | None = None
    sliding_window: int | None = None
    layer_types: tuple | None = None

    def __post_init__(self):
        for field in ("num_layers", "num_heads", "num_kv_heads", "head_size"):
            _check_positive_int(field, getattr(self, field))
        if self.num_layers > MAX_NUM_LAYERS:  # one layer type is kept per layer: 10**30 of them cannot be
            raise PagedKVValueError(f"num_layers must be at most {MAX_NUM_LAYERS:,} (real models have a few hundred "
                                    f"at most; a spec keeps one layer type per layer), got {self.num_layers}.")
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
        self._check_layer_types()

    def _check_layer_types(self) -> None:
        if self.sliding_window is not None:
            _check_positive_int("sliding_window", self.sliding_window)
        types = self.layer_types
        if types is None:
            types = ("full_attention" if self.sliding_window is None else "sliding_attention",) * self.num_layers
        if isinstance(types, (str, bytes)) or not hasattr(types, "__iter__"):
            raise PagedKVValueError(f"layer_types must be a list with one entry per layer, got {types!r}.")
        types = tuple(types)
        if len(types) != self.num_layers:
            raise PagedKVValueError(f"layer_types has {len(types)} entries but num_layers is {self.num_layers}: "
                                    "give one type per layer.")
        unknown = [t for t in types if t not in LAYER_TYPES]
        if unknown:
            raise PagedKVValueError(f"layer_types has unknown type {unknown[0]!r}; each is one of {list(LAYER_TYPES)}.")
        if "sliding_attention" in types and self.sliding_window is None:
            raise PagedKVValueError("layer_types has sliding_attention layers but sliding_window is None: give "
                                    "sliding_window.")
        object.__setattr__(self, "layer_types", types)

    def __repr__(self) -> str:  # the hybrid fields only when they say something (uniform specs print as before)
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.name not in ("sliding_window", "layer_types")]
        if self.is_hybrid:
            shown.append(f"sliding_window={self.sliding_window!r}, layer_types=({self.num_sliding_layers} sliding, "
                         f"{self.num_layers - self.num_sliding_layers} full)")
        return f"ModelSpec({', '.join(shown)})"

    @property
    def is_hybrid(self) -> bool:
        """Whether some layer slides (its cache stops growing at ``sliding_window`` tokens)."""
        return self.num_sliding_layers > 0

    @property
    def num_sliding_layers(self) -> int:
        return self.layer_types.count("sliding_attention")

    @property
    def layer_kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies in one layer."""
        return 2 * self.num_kv_heads * self.head_size * self.dtype_bytes

    def request_kv_bytes(self, context_len: int) -> int:
        """Bytes of KV cache one request of ``context_len`` tokens needs, every layer keeping only what it sees
        (no block rounding)."""
        _check_positive_int("context_len", context_len)
        window = self.sliding_window or context_len
        tokens = sum(min(context_len, window) if t == "sliding_attention" else context_len for t in self.layer_types)
        return tokens * self.layer_kv_bytes_per_token

    def kv_bytes_per_token_at(self, context_len: int) -> float:
        """Bytes per token of a request ``context_len`` tokens long: ``kv_bytes_per_token`` for a uniform model,
        less and less for a hybrid one as the context outgrows the window."""
        return self.request_kv_bytes(context_len) / context_len

    @property
    def kv_cache_group_size(self) -> int:
        """Layers per KV cache group, as vLLM 0.33 forms groups: one group for a uniform model; else the smaller
        layer count of the two kinds (the larger one when it is below 1.5 times the smaller)."""
        counts = [c for c in (self.num_sliding_layers, self.num_layers - self.num_sliding_layers) if c]
        return kv_cache_group_size(counts)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K **and** V one token occupies across all layers (every layer keeping it: short contexts)."""
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


def kv_cache_group_size(layer_counts) -> int:
    """vLLM's group size for layers of several kinds (``_get_kv_cache_groups_uniform_page_size``): the smallest
    count, or the largest when it is below 1.5 times the smallest (less padding, e.g. gpt-oss-20b's 12 + 13)."""
    counts = list(layer_counts)
    return max(counts) if max(counts) < min(counts) * 1.5 else min(counts)


def cache_block_bytes(spec: ModelSpec, block_size: int) -> int:
    """Bytes of one KV block: ``block_size`` tokens, K and V, every layer of a KV cache group (a uniform model's
    one group is every layer; a hybrid model's blocks are ``kv_cache_group_size`` layers deep)."""
    _check_spec(spec)
    _check_positive_int("block_size", block_size)
    return block_size * spec.layer_kv_bytes_per_token * spec.kv_cache_group_size


def num_gpu_blocks(
    spec: ModelSpec,
    block_size: int,
    total_memory: int,
    peak_memory: int,
    gpu_memory_utilization: float = 0.9,
) -> int:
    """Blocks that fit in the GPU memory left after the profiled peak.

    ``peak_memory`` is what a forward pass used (weights + activations);
    vLLM may use ``total_memory * gpu_memory_utilization`` in all. For a hybrid model a block is
    ``cache_block_bytes``: one page of each layer of a group, every group drawing on the same pool (vLLM 0.33:
    ``num_blocks = available_memory // bytes_per_block`` in ``get_kv_cache_config_from_groups``).
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


def request_kv_blocks(spec: ModelSpec, block_size: int, context_len: int) -> int:
    """Pool blocks one request of ``context_len`` computed tokens holds in vLLM 0.33's hybrid manager: every
    group's table, a sliding group's blocks before the window given back (``SlidingWindowManager``)."""
    _check_spec(spec)
    _check_positive_int("block_size", block_size)
    _check_positive_int("context_len", context_len)
    group_size = spec.kv_cache_group_size
    num_full = spec.num_layers - spec.num_sliding_layers
    total = blocks_needed(num_full, group_size) * blocks_needed(context_len, block_size)
    if spec.num_sliding_layers:
        skipped = max(0, context_len - spec.sliding_window + 1) // block_size
        per_group = blocks_needed(context_len, block_size) - skipped
        total += blocks_needed(spec.num_sliding_layers, group_size) * per_group
    return total


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

# Hybrid models (sliding-window layers beside full ones), from their config.json on the Hugging Face hub.
HYBRID_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # google/gemma-3-27b: 62 layers, every 6th global (transformers' sliding_window_pattern 6): 52 local + 10.
        ModelSpec("gemma-3-27b", num_layers=62, num_heads=32, num_kv_heads=16, head_size=128, dtype="bfloat16",
                  sliding_window=1024,
                  layer_types=tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62))),
        # openai/gpt-oss-120b: 36 layers alternating a 128-token window and full attention.
        ModelSpec("gpt-oss-120b", num_layers=36, num_heads=64, num_kv_heads=8, head_size=64, dtype="bfloat16",
                  sliding_window=128, layer_types=("sliding_attention", "full_attention") * 18),
        # mistralai/Mistral-7B-v0.1: every layer slides over 4,096 tokens.
        ModelSpec("mistral-7b-v0.1", num_layers=32, num_heads=32, num_kv_heads=8, head_size=128,
                  num_params=7_242_000_000, sliding_window=4096),
    )
}
