"""What a layer's KV cache needs, and how layers fall into KV cache groups (vLLM today, 0.33).

vLLM 0.33 describes every attention layer by a *spec* (``vllm/v1/kv_cache_interface.py``): a full-attention layer
(``FullAttentionSpec``) keeps every token's K/V; a sliding-window layer (``SlidingWindowSpec``) needs only the
last ``sliding_window`` tokens. Layers with the same spec form a **KV cache group**; every group gets its own block
table per request, over **one** block pool, and a block holds one page of each layer of the group it serves.

So that one page size serves every group, vLLM makes the groups equally large
(``_get_kv_cache_groups_uniform_page_size`` in ``vllm/v1/core/kv_cache_planning.py``): the group size is the
smallest number of layers of one spec (the largest, when it is below 1.5 times the smallest), each spec's layers
are dealt round-robin into ``ceil(count / group_size)`` groups (``layers[i::num_groups]``), and a short group is
padded. Gemma 3 27B (52 sliding, 10 full layers) becomes 1 full group and 6 sliding groups of 10 layers (8 of the
60 sliding slots are padding); gpt-oss (18 + 18) becomes one group of each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import PagedKVValueError
from ..sizing import DTYPE_BYTES, kv_cache_group_size
from ..validate import check_int


@dataclass(frozen=True)
class AttentionSpec:
    """The shape of one attention layer's pages (vLLM: ``AttentionSpec``). ``dtype`` is a name here ("bfloat16"),
    a ``torch.dtype`` in vLLM; ``head_size_v``, V's width, is K's unless given (vLLM's default too)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: str = "float16"
    head_size_v: int | None = field(default=None, kw_only=True)

    def __post_init__(self):
        for name in ("block_size", "num_kv_heads", "head_size"):
            check_int(name, getattr(self, name), minimum=1)
        if self.dtype not in DTYPE_BYTES:
            raise PagedKVValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}.")
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        check_int("head_size_v", self.head_size_v, minimum=0)

    @property
    def page_size_bytes(self) -> int:
        """One layer's K and V for ``block_size`` tokens, as vLLM 0.33 writes it (``AttentionSpec.page_size_bytes``:
        ``num_heads * num_states * state_content_size_bytes``, one state a token): KV heads x block_size x
        (head_size + head_size_v) x bytes per element."""
        return self.num_kv_heads * self.block_size * (self.head_size + self.head_size_v) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """A layer that attends over every earlier token: it keeps all of them (vLLM: ``FullAttentionSpec``)."""


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """A layer that sees only its last ``sliding_window`` tokens (vLLM: ``SlidingWindowSpec``). Its page is
    ``AttentionSpec``'s: vLLM's ``SlidingWindowSpec`` does not override ``page_size_bytes`` either, so a window
    changes how many blocks the layer keeps, never a block's bytes."""

    sliding_window: int = 0

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.sliding_window, bool) or not isinstance(self.sliding_window, int) \
                or self.sliding_window < 1:
            raise PagedKVValueError(f"sliding_window must be a positive int (the tokens a sliding layer sees), "
                                    f"got {self.sliding_window!r}.")

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        """Blocks one request can hold at most: the last ``sliding_window - 1`` tokens plus the tokens scheduled but
        not yet processed, plus one because the window rarely starts at a block boundary (vLLM 0.33: the same
        method; ``VllmConfig.max_in_flight_tokens`` is ``max_concurrent_batches * max_num_batched_tokens``, one
        step's budget when scheduling is synchronous, two with async scheduling)."""
        num_tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
        return -(-num_tokens // self.block_size) + 1


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    """A multi-head latent attention layer (vLLM: ``MLAAttentionSpec``): one compressed latent and a RoPE key per
    token, shared by every head, so one "KV head" (``ModelConfig.get_num_kv_heads`` is 1 for MLA), ``head_size``
    the latent's width plus the key's, and no separate V (``head_size_v = 0``)."""

    head_size_v: int = field(default=0, kw_only=True)


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba layer's page (vLLM: ``MambaSpec``): one request's states (``shapes``, each of ``dtypes``), whatever
    ``block_size`` is; ``page_size_padded`` is the size vLLM 0.33 pads it to, one attention page
    (``_align_hybrid_block_size`` in ``vllm/platforms/interface.py``)."""

    shapes: tuple
    dtypes: tuple
    page_size_padded: int | None = None

    def __post_init__(self):
        if len(self.shapes) != len(self.dtypes) or not self.shapes:
            raise PagedKVValueError(f"give one dtype per state shape, got {len(self.shapes)} shapes and "
                                    f"{len(self.dtypes)} dtypes.")
        for shape in self.shapes:
            for size in shape:
                check_int("a state shape's size", size, minimum=1)
        for dtype in self.dtypes:
            if dtype not in DTYPE_BYTES:
                raise PagedKVValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}.")
        unpadded = sum(math.prod(shape) * DTYPE_BYTES[dtype] for shape, dtype in zip(self.shapes, self.dtypes))
        if self.page_size_padded is not None and check_int("page_size_padded", self.page_size_padded) < unpadded:
            raise PagedKVValueError(f"page_size_padded ({self.page_size_padded:,}) is smaller than the states "
                                    f"({unpadded:,} bytes).")

    @property
    def page_size_bytes(self) -> int:
        """The states' bytes, or ``page_size_padded`` when it is set (vLLM: ``MambaSpec.page_size_bytes``)."""
        if self.page_size_padded is not None:
            return self.page_size_padded
        return sum(math.prod(shape) * DTYPE_BYTES[dtype] for shape, dtype in zip(self.shapes, self.dtypes))


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one block table (vLLM: ``KVCacheGroupSpec``); ``num_padding_layers`` empty slots make
    the group as large as the others, so that one block is one page of every group."""

    layer_names: tuple  # layer indices
    kv_cache_spec: AttentionSpec
    num_padding_layers: int = 0

    @property
    def sliding_window(self) -> int | None:
        return getattr(self.kv_cache_spec, "sliding_window", None)

    @property
    def name(self) -> str:
        """How drawings label it: ``"full"`` or ``"sliding 1024"``."""
        return "full" if self.sliding_window is None else f"sliding {self.sliding_window}"

    @property
    def page_size_bytes(self) -> int:
        """One block of this group: a page for each of its layers and padding slots."""
        return (len(self.layer_names) + self.num_padding_layers) * self.kv_cache_spec.page_size_bytes


def get_kv_cache_groups(layer_specs) -> list[KVCacheGroupSpec]:
    """The layers grouped as vLLM 0.33 groups them (``get_kv_cache_groups`` -> one group if every spec is the
    same, else ``_get_kv_cache_groups_uniform_page_size``). ``layer_specs``: one spec per layer, in order."""
    if isinstance(layer_specs, (str, bytes, dict)) or not hasattr(layer_specs, "__iter__"):
        raise PagedKVValueError(f"layer_specs must be a list with one spec per layer, got {layer_specs!r}.")
    layer_specs = list(layer_specs)
    if not layer_specs:
        raise PagedKVValueError("layer_specs is empty: give one FullAttentionSpec or SlidingWindowSpec per layer.")
    for i, spec in enumerate(layer_specs):
        if not isinstance(spec, (FullAttentionSpec, SlidingWindowSpec)):
            raise PagedKVValueError(f"layer_specs[{i}] is {spec!r}; each layer needs a FullAttentionSpec or a "
                                    "SlidingWindowSpec.")
    if len({spec.page_size_bytes for spec in layer_specs}) > 1:
        raise PagedKVValueError("layer_specs have different page sizes (block_size, KV heads, head size or dtype "
                                "differ); pagedkv groups layers with one page size, as vLLM does for attention.")
    same: dict = {}  # spec -> its layers, in order of first appearance
    for i, spec in enumerate(layer_specs):
        same.setdefault(spec, []).append(i)
    if len(same) == 1:
        return [KVCacheGroupSpec(tuple(range(len(layer_specs))), layer_specs[0])]
    group_size = kv_cache_group_size(len(layers) for layers in same.values())
    groups = []
    for spec, layers in same.items():
        num_groups = -(-len(layers) // group_size)
        for i in range(num_groups):
            members = tuple(layers[i::num_groups])
            groups.append(KVCacheGroupSpec(members, spec, group_size - len(members)))
    return groups
