"""Every public entry point, fed bad input: a PagedKVError (and the builtin a user expects), a message that
names the problem, and nothing changed. One table, one test."""

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
    LlamaConfig,
    LlamaForCausalLM,
    LLMEngine,
    ModelSpec,
    PagedKVCache,
    PagedKVError,
    Scheduler,
    cache_block_bytes,
    num_cpu_blocks,
    num_gpu_blocks,
    paged_attention,
)
from pagedkv.decoding import run_decoding, sharing_savings  # noqa: E402
from pagedkv.sim import max_concurrent_requests, memory_breakdown, synthetic_lengths  # noqa: E402
from pagedkv.viz import BlockTableVisualizer, SchedulerVisualizer, draw_block_map  # noqa: E402

OPT = MODELS["opt-13b"]


# ------------------------------------------------------------------ targets, and what "unchanged" means
def manager(caching=True):
    m = BlockSpaceManager(4, 8, num_cpu_blocks=1, watermark=0.0, enable_prefix_caching=caching)  # "a" needs 2
    m.allocate("a", [1, 2, 3, 4, 5])
    return m


def cache():
    c = PagedKVCache(8, 4, 1, 2, num_cpu_blocks=2, enable_prefix_caching=True)
    c.add_sequence("a", torch.ones(5, 1, 2), -torch.ones(5, 1, 2), token_ids=[1, 2, 3, 4, 5])
    return c


def scheduler():
    s = Scheduler(BlockSpaceManager(4, 8, watermark=0.0), max_num_seqs=4, max_num_batched_tokens=64)
    s.add_request("a", [1, 2, 3], 4)
    return s


TINY = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=64)


def engine():
    torch.manual_seed(0)
    return LLMEngine(LlamaForCausalLM(TINY), num_gpu_blocks=8, block_size=4, max_num_seqs=4,
                     max_num_batched_tokens=64)


def attention_inputs():
    return dict(query=torch.randn(2, 2, 4), key_cache=torch.randn(4, 2, 1, 4), value_cache=torch.randn(4, 2, 1, 4),
                block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                seq_lens=torch.tensor([3, 4], dtype=torch.int32))


def state(target):
    """Everything observable about a target, as plain data to compare before and after."""
    if isinstance(target, BlockSpaceManager):
        return target.snapshot()
    if isinstance(target, PagedKVCache):
        return (target.snapshot(), len(target.events),
                *[t.clone() for pool in target.engine.pools.values() for t in pool])
    if isinstance(target, CacheEngine):
        return tuple(t.clone() for pool in target.pools.values() for t in pool)
    if isinstance(target, Scheduler):
        return (target.waiting, target.running, target.swapped, dict(target.finished),
                target.block_manager.snapshot())
    if isinstance(target, LLMEngine):
        return state(target.scheduler), vars(target.stats).copy(), *[c.key_cache.clone() for c in target.caches]
    if isinstance(target, BlockTableVisualizer):
        return target.snapshot(), dict(target.settings), list(target.log)
    if isinstance(target, SchedulerVisualizer):
        return dict(target.settings), state(target.scheduler), len(target.timeline.steps)
    if isinstance(target, dict):  # attention inputs
        return {k: v.clone() for k, v in target.items()}
    return None


def equal(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return a == b


V, K = ValueError, KeyError
CASES = [
    # sizing
    ("ModelSpec bool layers", None, lambda _: ModelSpec("x", True, 1, 1, 1), V, "num_layers"),
    ("ModelSpec 10**30 layers", None, lambda _: ModelSpec("x", 10**30, 1, 1, 1), V, "num_layers"),
    ("ModelSpec heads do not divide", None, lambda _: ModelSpec("x", 1, 3, 2, 8), V, "multiple of num_kv_heads"),
    ("ModelSpec unknown dtype", None, lambda _: ModelSpec("x", 1, 1, 1, 1, dtype="int4"), V, "unknown dtype"),
    ("ModelSpec negative num_params", None, lambda _: ModelSpec("x", 1, 1, 1, 1, num_params=-1), V, "num_params"),
    ("cache_block_bytes block 0", None, lambda _: cache_block_bytes(OPT, 0), V, "block_size"),
    ("cache_block_bytes not a spec", None, lambda _: cache_block_bytes("opt-13b", 16), V, "ModelSpec"),
    ("num_gpu_blocks NaN memory", None, lambda _: num_gpu_blocks(OPT, 16, math.nan, 0), V, "finite"),
    ("num_gpu_blocks inf peak", None, lambda _: num_gpu_blocks(OPT, 16, 8e10, math.inf), V, "finite"),
    ("num_gpu_blocks None", None, lambda _: num_gpu_blocks(OPT, 16, None, 0), V, "total_memory"),
    ("num_gpu_blocks string", None, lambda _: num_gpu_blocks(OPT, 16, "80GB", 0), V, "total_memory"),
    ("num_gpu_blocks utilization 0", None, lambda _: num_gpu_blocks(OPT, 16, 8e10, 0, 0), V, "utilization"),
    ("num_gpu_blocks utilization None", None, lambda _: num_gpu_blocks(OPT, 16, 8e10, 0, None), V, "utilization"),
    ("num_cpu_blocks negative", None, lambda _: num_cpu_blocks(OPT, 16, -1), V, "swap_space_bytes"),
    ("num_cpu_blocks bool", None, lambda _: num_cpu_blocks(OPT, 16, True), V, "swap_space_bytes"),
    # allocator
    ("BlockAllocator bool", None, lambda _: BlockAllocator(True, 4), V, "num_blocks"),
    ("BlockAllocator block 0", None, lambda _: BlockAllocator(4, 0), V, "block_size"),
    ("free float id", lambda: BlockAllocator(4, 4), lambda a: a.free(1.0), V, "integers"),
    ("free out of range", lambda: BlockAllocator(4, 4), lambda a: a.free(9), V, r"0\.\.3"),
    ("refcount in an empty pool", lambda: BlockAllocator(0, 4), lambda a: a.refcount(0), V, "no blocks"),
    ("double free", lambda: BlockAllocator(4, 4), lambda a: a.free(0), V, "already free"),
    # manager
    ("manager watermark None", None, lambda _: BlockSpaceManager(4, 8, watermark=None), V, "watermark"),
    ("manager watermark 1", None, lambda _: BlockSpaceManager(4, 8, watermark=1.0), V, "watermark"),
    ("manager bool block size", None, lambda _: BlockSpaceManager(True, 8), V, "block_size"),
    ("manager negative pool", None, lambda _: BlockSpaceManager(4, -1), V, "num_gpu_blocks"),
    ("allocate duplicate", manager, lambda m: m.allocate("a", [1]), V, "already exists"),
    ("allocate empty", manager, lambda m: m.allocate("b", []), V, "empty"),
    ("allocate unhashable id", manager, lambda m: m.allocate(["b"], [1]), V, "hashable"),
    ("allocate float tokens", manager, lambda m: m.allocate("b", [0.5, 1.5]), V, "integers"),
    ("allocate string", manager, lambda m: m.allocate("b", "hello"), V, "list of integer"),
    ("allocate None", manager, lambda m: m.allocate("b", None), V, "list of integer"),
    ("allocate nested", manager, lambda m: m.allocate("b", [[1, 2]]), V, "integers"),
    ("allocate 2-D array", manager, lambda m: m.allocate("b", np.ones((2, 2), int)), V, "integers"),
    ("allocate 2**63", manager, lambda m: m.allocate("b", [2**63]), V, "int64"),
    ("allocate too big", manager, lambda m: m.allocate("b", list(range(40))), V, "free GPU blocks"),
    ("allocate no caching floats", lambda: manager(False), lambda m: m.allocate("b", [1.0]), V, "integers"),
    ("can_allocate string", manager, lambda m: m.can_allocate("x"), V, "list of integer"),
    ("can_allocate negative", manager, lambda m: m.can_allocate(-5), V, ">= 1"),
    ("can_allocate zero", manager, lambda m: m.can_allocate(0), V, ">= 1"),
    ("can_allocate float", manager, lambda m: m.can_allocate(2.5), V, "integer"),
    ("can_allocate bool", manager, lambda m: m.can_allocate(True), V, "integer"),
    ("append float token (caching)", manager, lambda m: m.append_slots("a", [1.5]), V, "integers"),
    ("append None token (caching)", manager, lambda m: m.append_slots("a", [None]), V, "integers"),
    ("append 2**63 (caching)", manager, lambda m: m.append_slots("a", [2**63]), V, "int64"),
    ("append 'x' (no caching)", lambda: manager(False), lambda m: m.append_slots("a", ["x"]), V, "integers"),
    ("append unknown", manager, lambda m: m.append_slots("zz", [1]), K, "unknown sequence"),
    ("append unhashable", manager, lambda m: m.append_slots(["a"], [1]), K, "unknown sequence"),
    ("can_append_slots float", manager, lambda m: m.can_append_slots("a", 1.5), V, "integer"),
    ("fork into existing", manager, lambda m: m.fork("a", "a"), V, "already exists"),
    ("fork unhashable child", manager, lambda m: m.fork("a", ["c"]), V, "hashable"),
    ("free unknown", manager, lambda m: m.free("zz"), K, "unknown sequence"),
    ("swap out without CPU room", manager, lambda m: m.swap_out("a"), V, "num_cpu_blocks"),
    ("swap in a GPU sequence", manager, lambda m: m.swap_in("a"), V, "already on the GPU"),
    ("free_block_ids bad device", manager, lambda m: m.free_block_ids("tpu"), V, "'gpu' or 'cpu'"),
    # cache engine and the facade
    ("CacheEngine negative", None, lambda _: CacheEngine(-1, 4, 1, 2), V, "num_gpu_blocks"),
    ("CacheEngine zero heads", None, lambda _: CacheEngine(4, 4, 0, 2), V, "num_kv_heads"),
    ("CacheEngine string dtype", None, lambda _: CacheEngine(4, 4, 1, 2, dtype="float16"), V, "dtype"),
    ("CacheEngine int dtype", None, lambda _: CacheEngine(4, 4, 1, 2, dtype=torch.int32), V, "floating"),
    ("CacheEngine missing GPU", None, lambda _: CacheEngine(4, 4, 1, 2, device="cuda:7"), V, "not available"),
    ("CacheEngine bad device", None, lambda _: CacheEngine(4, 4, 1, 2, device="gpu0"), V, "device"),
    ("copy_blocks one id", lambda: CacheEngine(4, 2, 1, 2), lambda e: e.copy_blocks([(1,)]), V, r"\(src, dst\)"),
    ("copy_blocks float", lambda: CacheEngine(4, 2, 1, 2), lambda e: e.copy_blocks([(1.5, 2)]), V, "integer"),
    ("copy_blocks outside", lambda: CacheEngine(4, 2, 1, 2), lambda e: e.copy_blocks([(0, 9)]), V, "outside"),
    ("swap bad pool", lambda: CacheEngine(4, 2, 1, 2), lambda e: e.swap("gpu", "disk", [(0, 1)]), V, "pool"),
    ("write wrong shape", lambda: CacheEngine(4, 2, 1, 2), lambda e: e.write([0], torch.ones(1, 2), torch.ones(1, 2)),
     V, "shape"),
    ("add_sequence float token ids", cache,
     lambda c: c.add_sequence("b", torch.ones(2, 1, 2), torch.ones(2, 1, 2), token_ids=[0.5, 1.5]), V, "integers"),
    ("add_sequence wrong count", cache,
     lambda c: c.add_sequence("b", torch.ones(2, 1, 2), torch.ones(2, 1, 2), token_ids=[1]), V, "one token id"),
    ("add_sequence no token ids (caching)", cache,
     lambda c: c.add_sequence("b", torch.ones(2, 1, 2), torch.ones(2, 1, 2)), V, "token_ids"),
    ("add_sequence meta tensors", cache,
     lambda c: c.add_sequence("b", torch.empty(2, 1, 2, device="meta"), torch.empty(2, 1, 2, device="meta"),
                              token_ids=[1, 2]), V, "dense tensor"),
    ("add_sequence wrong dtype", cache,
     lambda c: c.add_sequence("b", torch.ones(2, 1, 2).half(), torch.ones(2, 1, 2).half(), token_ids=[1, 2]),
     V, "dtype"),
    ("add_sequence unhashable", cache,
     lambda c: c.add_sequence(["b"], torch.ones(2, 1, 2), torch.ones(2, 1, 2), token_ids=[1, 2]), V, "hashable"),
    ("append token 2**63", cache,
     lambda c: c.append("a", torch.ones(2, 1, 2), torch.ones(2, 1, 2), token_id=[1, 2**63]), V, "int64"),
    ("append unknown", cache, lambda c: c.append("zz", torch.ones(1, 2), torch.ones(1, 2), token_id=1), K,
     "unknown sequence"),
    ("attention unknown sequence", cache, lambda c: c.attention(torch.ones(1, 1, 2), ["zz"]), K, "unknown"),
    # attention
    ("attention zero KV heads", attention_inputs,
     lambda a: paged_attention(**{**a, "key_cache": torch.ones(4, 2, 0, 4), "value_cache": torch.ones(4, 2, 0, 4)}),
     V, "num_kv_heads"),
    ("attention string scale", attention_inputs, lambda a: paged_attention(**a, scale="x"), V, "scale"),
    ("attention list scale", attention_inputs, lambda a: paged_attention(**a, scale=[1.0]), V, "scale"),
    ("attention int32 torch backend", attention_inputs,
     lambda a: paged_attention(**{k: (v.int() if k.endswith(("query", "cache")) else v) for k, v in a.items()},
                               backend="torch"), V, "floating"),
    ("attention partition True", attention_inputs, lambda a: paged_attention(**a, partition_size=True), V,
     "partition_size"),
    ("attention sparse query", attention_inputs, lambda a: paged_attention(**{**a, "query": a["query"].to_sparse()}),
     V, "dense tensor"),
    ("attention block id outside", attention_inputs,
     lambda a: paged_attention(**{**a, "block_tables": torch.tensor([[0, 9], [2, 3]], dtype=torch.int32)}), V,
     "outside"),
    ("attention seq_len beyond table", attention_inputs,
     lambda a: paged_attention(**{**a, "seq_lens": torch.tensor([3, 5], dtype=torch.int32)}), V, "exceed"),
    ("attention bad backend", attention_inputs, lambda a: paged_attention(**a, backend="tpu"), V, "backend"),
    # decoding and simulation
    ("sharing_savings width 0", None, lambda _: sharing_savings("beam", 0, 10, 10), V, "width"),
    ("sharing_savings bad mode", None, lambda _: sharing_savings("greedy", 2, 10, 10), V, "mode"),
    ("run_decoding float prompt", None, lambda _: run_decoding("beam", 2, [1.5], 3), V, "integers"),
    ("memory_breakdown bad policy", None, lambda _: memory_breakdown("buddy", num_requests=5), V, "policy"),
    ("memory_breakdown block 0", None, lambda _: memory_breakdown("paged", block_size=0, num_requests=5), V,
     "block_size"),
    ("memory_breakdown never fits", None,
     lambda _: memory_breakdown("paged", budget_tokens=2048, max_len=2048, lengths=[(2040, 8)], progress=False), V,
     "never fit"),
    ("memory_breakdown huge block", None,
     lambda _: memory_breakdown("paged", budget_tokens=4096, block_size=8192, num_requests=5, progress=False), V,
     "never fit"),
    ("memory_breakdown never saturated", None,
     lambda _: memory_breakdown("oracle", lengths=[(10, 5)] * 3, budget_tokens=4096, progress=False), V,
     "never saturated"),
    ("synthetic_lengths negative", None, lambda _: synthetic_lengths("sharegpt", -1), V, "num_requests"),
    ("synthetic_lengths negative seed", None, lambda _: synthetic_lengths("sharegpt", 5, seed=-1), V, "seed"),
    ("max_concurrent_requests block 0", None, lambda _: max_concurrent_requests("paged", block_size=0), V,
     "block_size"),
    ("max_concurrent_requests length 0", None, lambda _: max_concurrent_requests("paged", request_len=0), V,
     "request_len"),
    # scheduler and engine
    ("scheduler bad mode", None, lambda _: Scheduler(BlockSpaceManager(4, 8), preemption_mode="evict"), V,
     "recompute"),
    ("scheduler budget 0", None, lambda _: Scheduler(BlockSpaceManager(4, 8), max_num_batched_tokens=0), V, ">= 1"),
    ("add_request duplicate", scheduler, lambda s: s.add_request("a", [1], 1), V, "already"),
    ("add_request empty", scheduler, lambda s: s.add_request("b", [], 1), V, "empty"),
    ("add_request max_tokens 0", scheduler, lambda s: s.add_request("b", [1], 0), V, ">= 1"),
    ("add_request float token", scheduler, lambda s: s.add_request("b", [1.0], 1), V, "integers"),
    ("engine out-of-vocabulary", engine, lambda e: e.generate([[1], [32]], 2), V, "vocabulary"),
    ("engine empty prompt", engine, lambda e: e.generate([[1], []], 2), V, "empty"),
    ("engine max_tokens 0", engine, lambda e: e.generate([[1]], 0), V, ">= 1"),
    ("engine add_request bad id", engine, lambda e: e.add_request("x", [-1], 2), V, "vocabulary"),
    ("engine not a model", None, lambda _: LLMEngine(torch.nn.Linear(2, 2), num_gpu_blocks=4), V,
     "LlamaForCausalLM"),
    ("LlamaConfig heads", None, lambda _: LlamaConfig(32, 16, 32, 1, 3, 1, 64), V, "multiple"),
    # drawing and widgets
    ("draw_block_map highlight None", None, lambda _: draw_block_map(manager().snapshot(), highlight=None), V,
     r"\(\) for none"),
    ("BlockTableVisualizer a str", None, lambda _: BlockTableVisualizer("cache"), V, "PagedKVCache"),
    ("BlockTableVisualizer an int", None, lambda _: BlockTableVisualizer(42), V, "PagedKVCache"),
    ("BlockTableVisualizer beam_width 0", None, lambda _: BlockTableVisualizer(beam_width=0), V, "beam_width"),
    # the last foreign TypeErrors (issue: CI you can trust)
    ("CacheEngine.write slots None", lambda: CacheEngine(4, 4, 1, 2),
     lambda c: c.write(None, torch.ones(1, 1, 2), torch.ones(1, 1, 2)), V, "slot_mapping"),
    ("CacheEngine.write slots a str", lambda: CacheEngine(4, 4, 1, 2),
     lambda c: c.write("0", torch.ones(1, 1, 2), torch.ones(1, 1, 2)), V, "slot_mapping"),
    ("CacheEngine.write float slots", lambda: CacheEngine(4, 4, 1, 2),
     lambda c: c.write([0.0, 1.0], torch.ones(2, 1, 2), torch.ones(2, 1, 2)), V, "integer"),
    ("CacheEngine.write float slot tensor", lambda: CacheEngine(4, 4, 1, 2),
     lambda c: c.write(torch.tensor([0.0]), torch.ones(1, 1, 2), torch.ones(1, 1, 2)), V, "integer slots"),
    ("append value None", cache, lambda c: c.append("a", torch.ones(1, 2), None, token_id=6), V, "torch.Tensor"),
    ("append a numpy value", cache, lambda c: c.append("a", torch.ones(1, 2), np.ones((1, 2)), token_id=6), V,
     "torch.Tensor"),
    ("attention seq_ids None", cache, lambda c: c.attention(torch.ones(1, 1, 2), None), V, "seq_ids"),
    ("allocate a 0-d array", manager, lambda m: m.allocate("b", np.array(3)), V, "flat list"),
    ("free_block_ids a list", manager, lambda m: m.free_block_ids(["gpu"]), V, "'gpu' or 'cpu'"),
    ("memory_breakdown a list", None, lambda _: memory_breakdown(["sharegpt"]), V, "policy"),
    ("memory_breakdown workload a list", None, lambda _: memory_breakdown("paged", ["sharegpt"]), V, "workload"),
    ("draw_block_map None", None, lambda _: draw_block_map(None), V, "snapshot"),
    ("draw_block_map a manager", None, lambda _: draw_block_map(BlockSpaceManager(4, 4)), V, "snapshot"),
]


@pytest.mark.parametrize("name, make, call, builtin, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error_and_changes_nothing(name, make, call, builtin, match):
    target = make() if make else None
    before = state(target)
    with pytest.raises(PagedKVError, match=match) as info:
        call(target)
    assert isinstance(info.value, builtin), type(info.value).__mro__
    assert len(str(info.value)) > 20  # a sentence, not a bare value
    assert equal(state(target), before), f"{name} changed state"


def test_gather_of_a_swapped_out_sequence():
    c = PagedKVCache(8, 4, 1, 2, num_cpu_blocks=4)
    c.add_sequence("a", torch.ones(5, 1, 2), torch.ones(5, 1, 2))
    c.swap_out("a")
    before = state(c)
    with pytest.raises(PagedKVError, match="swap_in"):
        c.gather("a")
    assert equal(state(c), before)


@pytest.mark.parametrize("call", [
    lambda v: v.append("A", 0), lambda v: v.append("A", -3), lambda v: v.append("A", "2"), lambda v: v.append("A", 1.5),
    lambda v: v.add_sequence("x"), lambda v: v.beam_step(2.5), lambda v: v.reset(block_size=0),
    lambda v: v.reset(num_gpu_blocks="8"), lambda v: v.reset(colour="red"), lambda v: v.fork("zz"),
])
def test_visualizer_refuses_with_a_message_and_keeps_its_state(call):
    v = BlockTableVisualizer()
    v.add_sequence(5)
    before = state(v)
    assert not call(v) and "failed" in v.message
    assert equal(state(v), before)
    assert v.reset() and v.settings["block_size"] == 4  # a later reset still works


def test_inputs_that_require_grad_never_break_the_cache():
    c = PagedKVCache(8, 4, 1, 2)
    keys = torch.randn(5, 1, 2, requires_grad=True)
    c.add_sequence("a", keys, keys * 2)
    c.append("a", torch.randn(1, 2, requires_grad=True), torch.randn(1, 2, requires_grad=True))
    assert not c.key_cache.requires_grad and not c.value_cache.requires_grad
    query = torch.randn(1, 2, 2, requires_grad=True)
    for backend in ("cpu", "torch", "cuda"):
        out = c.attention(query, ["a"], backend=backend)
        assert not out.requires_grad and out.shape == (1, 2, 2)
    torch.testing.assert_close(c.gather("a")[0][:5], keys.detach())


def test_an_empty_batch_returns_an_empty_output_without_a_launch():
    a = attention_inputs()
    empty = dict(a, query=torch.randn(0, 2, 4), block_tables=torch.zeros(0, 2, dtype=torch.int32),
                 seq_lens=torch.zeros(0, dtype=torch.int32))
    for backend in ("cpu", "torch", "cuda"):
        assert paged_attention(**empty, backend=backend).shape == (0, 2, 4)


@pytest.mark.parametrize("call, match", [
    (lambda: __import__("pagedkv").hash_block_tokens(None, [1.5]), "int64"),
    (lambda: memory_breakdown("paged", lengths=[(1,)], progress=False), "prompt_len, output_len"),
    (lambda: memory_breakdown("paged", lengths="10,5", progress=False), "pairs"),
    (lambda: memory_breakdown("paged", lengths=[(1.5, 2)], progress=False), "integer"),
    (lambda: Scheduler("a manager"), "BlockSpaceManager"),
    (lambda: __import__("pagedkv").generate_dense(None, [1], 1), "LlamaForCausalLM"),
    (lambda: LlamaForCausalLM.from_pretrained(None), "local folder"),
    (lambda: cache().format_events("3"), "integer"),
])
def test_more_entry_points_answer_with_a_pagedkv_error(call, match):
    with pytest.raises(PagedKVError, match=match) as info:
        call()
    assert isinstance(info.value, ValueError)
