import pytest

from pagedkv import MODELS, ModelSpec, PagedKVError, cache_block_bytes, num_cpu_blocks, num_gpu_blocks
from pagedkv.sizing import blocks_needed


def test_block_bytes_counts_keys_and_values():
    spec = ModelSpec("toy", num_layers=4, num_heads=8, num_kv_heads=8, head_size=128)
    assert cache_block_bytes(spec, 4) == 65_536  # forgetting K+V's factor 2 would give 32,768


def test_opt_13b_token_is_800_kb():
    assert MODELS["opt-13b"].kv_bytes_per_token == 819_200


@pytest.mark.parametrize("dtype, size", [("float32", 4), ("float16", 2), ("bfloat16", 2), ("fp8", 1)])
def test_dtype_bytes(dtype, size):
    spec = ModelSpec("m", 2, 4, 2, 8, dtype=dtype)
    assert spec.kv_bytes_per_token == 2 * 2 * 2 * 8 * size


def test_presets_have_real_shapes():
    assert {"opt-13b", "llama-2-7b", "llama-3-8b", "mistral-7b"} <= set(MODELS)
    llama3 = MODELS["llama-3-8b"]
    assert (llama3.num_layers, llama3.num_heads, llama3.num_kv_heads, llama3.head_size) == (32, 32, 8, 128)
    assert llama3.attention_kind == "GQA"
    assert MODELS["llama-2-7b"].attention_kind == "MHA"
    assert MODELS["falcon-7b"].attention_kind == "MQA"
    assert all(name == spec.name == name.lower() for name, spec in MODELS.items())


def test_num_gpu_blocks_formula():
    spec = MODELS["llama-2-7b"]  # 512 KiB per token in fp16
    block = cache_block_bytes(spec, 16)
    total, peak = 80 * 2**30, 15 * 2**30
    assert num_gpu_blocks(spec, 16, total, peak) == int((total * 0.9 - peak) // block)
    assert num_gpu_blocks(spec, 16, total, peak, gpu_memory_utilization=1.0) == (total - peak) // block
    assert num_gpu_blocks(spec, 16, total, total) == 0  # nothing left: never negative


def test_num_cpu_blocks():
    spec = MODELS["opt-13b"]
    assert num_cpu_blocks(spec, 16, 4 * 2**30) == 4 * 2**30 // (16 * 819_200)


def test_blocks_needed_is_a_ceiling():
    assert [blocks_needed(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


@pytest.mark.parametrize("kwargs, word", [
    (dict(block_size=0), "block_size"),
    (dict(block_size=-4), "block_size"),
    (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(total_memory=-1), "total_memory"),
    (dict(peak_memory=-1), "peak_memory"),
])
def test_bad_input_is_a_value_error_naming_the_argument(kwargs, word):
    args = dict(spec=MODELS["opt-13b"], block_size=16, total_memory=2**30, peak_memory=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=word) as info:
        num_gpu_blocks(**args)
    assert isinstance(info.value, PagedKVError)


def test_bad_model_specs():
    with pytest.raises(ValueError, match="dtype"):
        ModelSpec("m", 1, 1, 1, 1, dtype="int4")
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelSpec("m", 1, 6, 4, 8)
    with pytest.raises(ValueError, match="num_layers"):
        ModelSpec("m", 0, 1, 1, 1)


def test_with_dtype_and_weights():
    spec = MODELS["llama-3-8b"]
    assert spec.with_dtype("fp8").kv_bytes_per_token * 2 == spec.kv_bytes_per_token
    assert spec.weight_bytes == 2 * spec.num_params
    with pytest.raises(ValueError, match="num_params"):
        _ = ModelSpec("m", 1, 1, 1, 1).weight_bytes
