"""Every argument of every public entry point, replaced by junk: the answer is a result or a PagedKVError.

``test_bad_input.py`` pins chosen cases and their messages; this probe finds the *class*: for each call in
``CALLS`` (a working baseline), each argument in turn is swapped for each value in ``JUNK``. A foreign
``TypeError``/``AttributeError``/``IndexError`` fails, and so does a PagedKVError that left the target changed.
"""

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from pagedkv import (  # noqa: E402
    MODELS,
    BlockAllocator,
    BlockSpaceManager,
    CacheEngine,
    LlamaForCausalLM,
    ModelSpec,
    PagedKVCache,
    PagedKVError,
    Scheduler,
    cache_block_bytes,
    generate_dense,
    num_cpu_blocks,
    num_gpu_blocks,
    paged_attention,
)
from pagedkv.decoding import sharing_savings  # noqa: E402
from pagedkv.sim import memory_breakdown  # noqa: E402
from pagedkv.viz import BlockTableVisualizer, SchedulerVisualizer, draw_block_map  # noqa: E402

from test_bad_input import TINY, attention_inputs, cache, engine, equal, manager, scheduler, state  # noqa: E402

JUNK = {"None": None, "str": "x", "float": 1.5, "nan": math.nan, "negative": -1, "bool": True,
        "0-d array": np.array(3), "list of None": [None], "list of str": ["gpu"], "dict": {}, "object": object(),
        "float tensor": torch.tensor(1.5), "ndarray": np.ones((2, 2))}


def kv(n):
    return torch.ones(n, 1, 2), torch.ones(n, 1, 2)


# (name, make the target or None, function of (target, **kwargs), good keyword arguments)
CALLS = [
    ("ModelSpec", None, lambda _, **a: ModelSpec(**a),
     dict(name="m", num_layers=2, num_heads=4, num_kv_heads=2, head_size=8, dtype="float16")),
    ("cache_block_bytes", None, lambda _, **a: cache_block_bytes(**a), dict(spec=MODELS["opt-13b"], block_size=16)),
    ("num_gpu_blocks", None, lambda _, **a: num_gpu_blocks(**a),
     dict(spec=MODELS["opt-13b"], block_size=16, total_memory=8e10, peak_memory=3e10, gpu_memory_utilization=0.9)),
    ("num_cpu_blocks", None, lambda _, **a: num_cpu_blocks(**a),
     dict(spec=MODELS["opt-13b"], block_size=16, swap_space_bytes=4e9)),
    ("BlockAllocator", None, lambda _, **a: BlockAllocator(**a), dict(num_blocks=4, block_size=4)),
    ("BlockAllocator.free", lambda: _allocator(), lambda t, **a: t.free(**a), dict(block_id=0)),
    ("BlockAllocator.incref", lambda: _allocator(), lambda t, **a: t.incref(**a), dict(block_id=0)),
    ("BlockAllocator.refcount", lambda: _allocator(), lambda t, **a: t.refcount(**a), dict(block_id=0)),
    ("BlockSpaceManager", None, lambda _, **a: BlockSpaceManager(**a),
     dict(block_size=4, num_gpu_blocks=8, num_cpu_blocks=2, watermark=0.01, enable_prefix_caching=False)),
    ("manager.can_allocate", manager, lambda t, **a: t.can_allocate(**a), dict(prompt=5)),
    ("manager.allocate", manager, lambda t, **a: t.allocate(**a), dict(seq_id="b", token_ids=[1, 2, 3])),
    ("manager.can_append_slots", manager, lambda t, **a: t.can_append_slots(**a), dict(seq_id="a", num_tokens=1)),
    ("manager.append_slots", manager, lambda t, **a: t.append_slots(**a), dict(seq_id="a", token_ids=[7])),
    ("manager.fork", manager, lambda t, **a: t.fork(**a), dict(parent_seq_id="a", child_seq_id="b")),
    ("manager.free", manager, lambda t, **a: t.free(**a), dict(seq_id="a")),
    ("manager.swap_out", manager, lambda t, **a: t.swap_out(**a), dict(seq_id="a")),
    ("manager.get_slot_mapping", manager, lambda t, **a: t.get_slot_mapping(**a), dict(seq_id="a")),
    ("manager.free_block_ids", manager, lambda t, **a: t.free_block_ids(**a), dict(device="gpu")),
    ("manager.num_cached_tokens", manager, lambda t, **a: t.num_cached_tokens(**a), dict(seq_id="a")),
    ("CacheEngine", None, lambda _, **a: CacheEngine(**a),
     dict(num_gpu_blocks=4, block_size=4, num_kv_heads=1, head_size=2, num_cpu_blocks=1, dtype=torch.float32)),
    ("CacheEngine.write", lambda: CacheEngine(4, 4, 1, 2), lambda t, **a: t.write(**a),
     dict(slot_mapping=[0, 5], k=torch.ones(2, 1, 2), v=torch.ones(2, 1, 2), pool="gpu")),
    ("CacheEngine.copy_blocks", lambda: CacheEngine(4, 4, 1, 2), lambda t, **a: t.copy_blocks(**a),
     dict(pairs=[(0, 1)], pool="gpu")),
    ("CacheEngine.swap", lambda: CacheEngine(4, 4, 1, 2, 2), lambda t, **a: t.swap(**a),
     dict(src_pool="gpu", dst_pool="cpu", pairs=[(0, 1)])),
    ("CacheEngine.read_blocks", lambda: CacheEngine(4, 4, 1, 2), lambda t, **a: t.read_blocks(**a),
     dict(block_table=[0, 1], num_tokens=5, pool="gpu")),
    ("PagedKVCache", None, lambda _, **a: PagedKVCache(**a),
     dict(num_gpu_blocks=4, block_size=4, num_kv_heads=1, head_size=2, num_cpu_blocks=1, dtype=torch.float32)),
    ("PagedKVCache.add_sequence", cache, lambda t, **a: t.add_sequence(**a),
     dict(seq_id="b", keys=kv(3)[0], values=kv(3)[1], token_ids=[1, 2, 3])),
    ("PagedKVCache.append", cache, lambda t, **a: t.append(**a),
     dict(seq_id="a", key=torch.ones(1, 2), value=torch.ones(1, 2), token_id=6)),
    ("PagedKVCache.fork", cache, lambda t, **a: t.fork(**a), dict(parent="a", child="b")),
    ("PagedKVCache.swap_out", cache, lambda t, **a: t.swap_out(**a), dict(seq_id="a")),
    ("PagedKVCache.gather", cache, lambda t, **a: t.gather(**a), dict(seq_id="a")),
    ("PagedKVCache.attention", cache, lambda t, **a: t.attention(**a),
     dict(query=torch.ones(1, 1, 2), seq_ids=["a"], backend="torch")),
    ("paged_attention", attention_inputs, lambda t, **a: paged_attention(**{**t, **a}),
     dict(scale=0.5, backend="torch", partition_size=None)),
    ("sharing_savings", None, lambda _, **a: sharing_savings(**a),
     dict(mode="beam", width=2, prompt_len=8, output_len=4, block_size=4, seed=0)),
    ("memory_breakdown", None, lambda _, **a: memory_breakdown(**a, num_requests=40, progress=False),
     dict(policy="paged", workload="sharegpt", seed=0)),
    ("Scheduler", None, lambda _, **a: Scheduler(BlockSpaceManager(4, 8), **a),
     dict(max_num_seqs=4, max_num_batched_tokens=64, preemption_mode="recompute")),
    ("Scheduler.add_request", scheduler, lambda t, **a: t.add_request(**a),
     dict(request_id="b", prompt_token_ids=[1, 2], max_tokens=2)),
    ("LLMEngine.add_request", engine, lambda t, **a: t.add_request(**a),
     dict(request_id="b", prompt_token_ids=[1, 2], max_tokens=2)),
    ("LLMEngine.generate", engine, lambda t, **a: t.generate(**a), dict(prompts=[[1, 2]], max_tokens=2)),
    ("generate_dense", None, lambda _, **a: generate_dense(LlamaForCausalLM(TINY), **a),
     dict(prompt_token_ids=[1, 2], params=2)),
    ("draw_block_map", None, lambda _, **a: draw_block_map(manager().snapshot(), **a),
     dict(highlight=[0], title="t", show_tables=True, labels=True, sources=[1], columns=4)),
    ("BlockTableVisualizer", None, lambda _, **a: BlockTableVisualizer(**a),
     dict(target=None, block_size=4, num_gpu_blocks=8, num_cpu_blocks=2, beam_width=2, seed=0)),
    ("SchedulerVisualizer", None, lambda _, **a: SchedulerVisualizer(**a),
     dict(num_gpu_blocks=8, block_size=4)),
    ("SchedulerVisualizer hybrid", None, lambda _, **a: SchedulerVisualizer(**a),
     dict(version="v1", sliding_window=8, num_gpu_blocks=8, block_size=4)),
]


def _allocator():
    a = BlockAllocator(4, 4)
    a.allocate()
    return a


CASES = [(name, make, call, good, arg, junk) for name, make, call, good in CALLS for arg in good for junk in JUNK]


@pytest.mark.parametrize("name, make, call, good, arg, junk", CASES,
                         ids=[f"{c[0]}({c[4]}={c[5]})" for c in CASES])
def test_junk_in_any_argument_is_a_result_or_a_pagedkv_error(name, make, call, good, arg, junk):
    target = make() if make else None
    before = state(target)
    try:
        call(target, **{**good, arg: JUNK[junk]})
    except PagedKVError as error:
        assert isinstance(error, (ValueError, KeyError)), type(error).__mro__
        assert equal(state(target), before), f"{name} refused {arg}={junk} but changed state"
    except Exception as error:  # noqa: BLE001 - the point: nothing else may escape
        pytest.fail(f"{name}({arg}={junk!s}) raised {type(error).__name__}: {error}")
    finally:
        import matplotlib.pyplot as plt

        plt.close("all")
