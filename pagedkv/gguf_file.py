"""Layer 11a — a llama-architecture GGUF file read as a Hugging Face config and state dict.

GGUF is llama.cpp's one-file format: a header of key/value metadata (the model's sizes, its tokenizer's
vocabulary, merges and chat template), then the tensors, most of them quantized in blocks of 32 weights:
Q8_0 stores one fp16 scale and 32 int8s, Q4_0 one scale and 32 four-bit ints, Q4_1 a scale, a minimum and 32
four-bit ints (``w = scale * q + min``). The ``gguf`` package (llama.cpp's own reader) parses the file and
dequantizes; this module only renames.

One thing is not a rename. llama.cpp's converter (``convert_hf_to_gguf.py``, ``LlamaModel.permute``)
reorders the rows of every ``q_proj`` and ``k_proj`` so that its RoPE can rotate *adjacent* pairs
``(x0, x1), (x2, x3), ...`` ("normal" rope), where Hugging Face's rotates the two *halves*
``(x_i, x_{i + d/2})``. Loading back into Hugging Face's layout undoes that permutation, head by head
(:func:`unpermute_qk`); ``transformers`` does the same in ``integrations/gguf``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ModelFileError

# Quantizations whose dequantization is checked in tests (gguf's numpy code); others are refused by name.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")

# GGUF tensor name -> Hugging Face's (``{i}`` is the layer).
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None for a name not in a Llama."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's row order: per head, rows ``(pair, 2)`` back to ``(2, pair)`` (halves, HF's RoPE)."""
    rows, cols = weight.shape
    return weight.reshape(num_heads, rows // num_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def read_llama_gguf(path) -> tuple[dict, dict[str, np.ndarray], dict]:
    """``(config.json as a dict, {hf_name: float32 array}, metadata)`` from a llama-architecture GGUF file.

    Everything is checked before any tensor is dequantized: a file that is missing, not GGUF, truncated, of
    another architecture or with a tensor type outside :data:`SUPPORTED_TYPES` raises a ``ModelFileError``.
    """
    reader, path = _open(path)
    metadata = read_metadata(reader)
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise ModelFileError(f"{path} holds a {arch!r} model; pagedkv reads llama-architecture GGUF files only "
                             "(Llama, SmolLM2, TinyLlama, Mistral 7B v0.1...).")
    config = _hf_config(metadata, reader, path)
    unknown = [t.name for t in reader.tensors if hf_name(t.name) is None]
    odd = sorted({t.tensor_type.name for t in reader.tensors} - set(SUPPORTED_TYPES))
    if unknown or odd:
        raise ModelFileError(f"{path}: " + (f"tensors {unknown[:3]} are not part of a Llama" if unknown else
                                           f"tensor types {odd} are not supported (use one of {SUPPORTED_TYPES})")
                             + "; convert the model with llama.cpp's convert_hf_to_gguf.py to F16 or Q8_0.")
    from gguf.quants import dequantize

    state = {}
    try:
        for tensor in reader.tensors:
            weight = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
            if not weight.flags.writeable:  # an F32 tensor is a view of the read-only file: torch wants a copy
                weight = weight.copy()
            name = hf_name(tensor.name)
            if name.endswith("q_proj.weight"):
                weight = unpermute_qk(weight, config["num_attention_heads"])
            elif name.endswith("k_proj.weight"):
                weight = unpermute_qk(weight, config["num_key_value_heads"])
            state[name] = weight
    except (ValueError, IndexError, OSError) as error:  # a tensor cut short by a truncated file
        raise ModelFileError(f"{path} is damaged or truncated ({error}); download or copy it again.") from None
    return config, state, metadata


def read_metadata(reader_or_path) -> dict:
    """Every key/value of the header as plain Python values (the tokenizer's lists and chat template too)."""
    reader = reader_or_path if hasattr(reader_or_path, "fields") else _open(reader_or_path)[0]
    return {name: _value(field) for name, field in reader.fields.items()}


def _open(path):
    """A ``GGUFReader`` on ``path``, or a ModelFileError that names the path and what is wrong."""
    try:
        import gguf
    except ImportError:
        raise ModelFileError("reading GGUF files needs the gguf package: pip install gguf") from None
    if not isinstance(path, (str, Path)):
        raise ModelFileError(f"a GGUF path must be a str or a Path, got {path!r}.")
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path} does not exist (or is not a file); pass the path of a .gguf file.")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF').")
    try:
        return gguf.GGUFReader(path), path
    except (ValueError, IndexError, OSError, KeyError, UnicodeDecodeError) as error:
        raise ModelFileError(f"{path} is damaged or truncated ({type(error).__name__}: {error}); "
                             "download or copy it again.") from None


def _value(field):
    value = field.contents()
    return value.tolist() if isinstance(value, np.ndarray) else value


def _hf_config(meta: dict, reader, path) -> dict:
    """config.json's fields from the ``llama.*`` metadata (the names llama.cpp's converter wrote them under)."""
    try:
        heads = int(meta["llama.attention.head_count"])
        config = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": int(meta["llama.embedding_length"]),
            "intermediate_size": int(meta["llama.feed_forward_length"]),
            "num_hidden_layers": int(meta["llama.block_count"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
            "max_position_embeddings": int(meta["llama.context_length"]),
            "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
            "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        }
    except KeyError as error:
        raise ModelFileError(f"{path} lacks the metadata key {error.args[0]!r} a llama GGUF file has.") from None
    if meta.get("llama.rope.scaling.type", "none") not in ("none", None):
        raise ModelFileError(f"{path} uses RoPE scaling ({meta['llama.rope.scaling.type']}), which pagedkv's "
                             "Llama does not implement.")
    names = {t.name for t in reader.tensors}
    config["vocab_size"] = int(meta.get("llama.vocab_size") or len(meta.get("tokenizer.ggml.tokens", ())))
    config["head_dim"] = int(meta.get("llama.attention.key_length", config["hidden_size"] // heads))
    config["tie_word_embeddings"] = "output.weight" not in names  # llama.cpp drops the tied copy
    config["bos_token_id"] = meta.get("tokenizer.ggml.bos_token_id")
    config["eos_token_id"] = meta.get("tokenizer.ggml.eos_token_id")
    return config
