"""A CPU tier behind the GPU pool: vLLM 0.33's native OffloadingConnector through the KV connector hooks.

The measure is the dense decoder, which never pages anything: with blocks evicted from the GPU, stored to the CPU tier
and loaded back (half a prefix from each tier, under preemption, chunked prefill and a CPU tier that evicts too),
every answer equals the dense one and the same engine's without offloading. Around that: the hooks in 0.33's order,
the stats adding up, the tier's size in GiB as 0.33 computes it, bad input refused, and SmolLM2 in a multi-turn chat.
"""

import math
import mmap
import random
import re

import pytest
import torch

from pagedkv import PagedKVValueError
from pagedkv.engine import LLMEngine
from pagedkv.model import LlamaConfig, LlamaForCausalLM, generate_dense
from pagedkv.v1 import Request, RequestStatus
from pagedkv.v1.kv_offload.base import LookupResult, ReqContext
from pagedkv.v1.kv_offload.cpu import CPUOffloadingManager

CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=256, rope_theta=500.0, rms_norm_eps=1e-5)
HOOKS = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
         "update_connector_output", "request_finished")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG).eval()


def make_engine(model, **kwargs):
    """A v1 engine on the torch reference kernel (the kernels are tested elsewhere; this file tests scheduling)."""
    return LLMEngine(model, version="v1", backend="torch", **kwargs)


def chat_turns(seed: int, num_conversations: int, num_turns: int = 3, system: int = 6):
    """Conversations whose every turn resends the history: prompts of turn t, for t in 0..num_turns-1 (each a
    prefix of the next, with the answer spliced in by ``run_chat``)."""
    rng = random.Random(seed)
    head = [rng.randrange(64) for _ in range(system)]
    firsts = [head + [rng.randrange(64) for _ in range(rng.randint(3, 9))] for _ in range(num_conversations)]
    users = [[[rng.randrange(64) for _ in range(rng.randint(3, 7))] for _ in range(num_turns - 1)]
             for _ in range(num_conversations)]
    return firsts, users


def run_chat(engine, firsts, users, max_tokens: int, together: bool):
    """Every conversation's turns; ``together``: each turn of all conversations submitted at once, else one
    conversation's turn after another's (the GPU pool holds only some of them)."""
    history, answers = [list(p) for p in firsts], []
    for turn in range(len(users[0]) + 1):
        batch = engine.generate(history, max_tokens, ignore_eos=True) if together else \
            [engine.generate([h], max_tokens, ignore_eos=True)[0] for h in history]
        answers.append(batch)
        if turn < len(users[0]):
            history = [h + a + u[turn] for h, a, u in zip(history, batch, users)]
    return answers, history


def dense_chat(model, firsts, users, max_tokens):
    history, answers = [list(p) for p in firsts], []
    for turn in range(len(users[0]) + 1):
        answers.append([generate_dense(model, h, max_tokens) for h in history])
        if turn < len(users[0]):
            history = [h + a + u[turn] for h, a, u in zip(history, answers[-1], users)]
    return answers


def check_stats_add_up(engine):
    s, tier = engine.stats, engine.scheduler.connector.manager
    bs = engine.block_size
    assert s.num_offload_stored_tokens == tier.num_stored_chunks * bs
    assert s.num_offload_evicted_tokens == tier.num_evicted_chunks * bs
    assert len(tier.keys()) * bs == s.num_offload_stored_tokens - s.num_offload_evicted_tokens  # what the tier holds
    assert len(tier.keys()) <= engine.scheduler.connector.num_cpu_blocks
    assert s.num_offload_loaded_tokens == tier.num_loaded_chunks * bs
    # a load of a whole prompt recomputes its last token: saved is loaded less at most one token per load
    assert 0 <= s.num_offload_loaded_tokens - s.num_offload_saved_tokens <= s.num_offload_loaded_tokens // bs


POOLS = {  # each request fits the GPU pool alone; not every conversation fits it together
    "tight": dict(num_gpu_blocks=10, block_size=4),
    "chunked": dict(num_gpu_blocks=12, block_size=4, max_num_batched_tokens=8, long_prefill_token_threshold=4),
    "preempting": dict(num_gpu_blocks=20, block_size=2, max_num_seqs=4, max_num_batched_tokens=16),
}


@pytest.mark.parametrize("pool, cpu, together", [
    ("tight", 64, False), ("tight", 3, True), ("chunked", 3, False), ("chunked", 64, True), ("preempting", 5, True),
])
def test_outputs_equal_dense_and_no_offload(model, pool, cpu, together):
    pool = POOLS[pool]
    firsts, users = chat_turns(seed=len(str(pool)) + cpu, num_conversations=4)
    expected = dense_chat(model, firsts, users, 5)
    plain = make_engine(model, **pool)
    offload = make_engine(model, kv_offloading_blocks=cpu, **pool)
    assert run_chat(plain, firsts, users, 5, together)[0] == expected
    assert run_chat(offload, firsts, users, 5, together)[0] == expected
    check_stats_add_up(offload)
    assert offload.stats.num_offload_stored_tokens > 0
    if cpu == 3:
        assert offload.stats.num_offload_evicted_tokens > 0


def test_preemption_and_loads_in_one_run(model):
    """Many conversations at once in a pool that preempts, with loads from the CPU tier between preemptions."""
    firsts, users = chat_turns(seed=7, num_conversations=6, system=8)
    pool = POOLS["preempting"]
    offload = make_engine(model, kv_offloading_blocks=32, **pool)
    assert run_chat(offload, firsts, users, 5, together=True)[0] == dense_chat(model, firsts, users, 5)
    assert offload.stats.num_preemptions > 0 and offload.stats.num_offload_loaded_tokens > 0
    check_stats_add_up(offload)


def test_computed_tokens_drop_by_the_tokens_saved(model):
    """One conversation after another: the same steps run with and without the tier, except that the prompt tokens
    the tier brings back are not computed."""
    firsts, users = chat_turns(seed=3, num_conversations=3)
    plain = make_engine(model, **POOLS["tight"])
    offload = make_engine(model, kv_offloading_blocks=64, **POOLS["tight"])
    assert run_chat(plain, firsts, users, 4, False)[0] == run_chat(offload, firsts, users, 4, False)[0]
    saved = offload.stats.num_offload_saved_tokens
    assert saved > 0 and offload.stats.num_preemptions == plain.stats.num_preemptions == 0
    assert offload.stats.num_computed_tokens == plain.stats.num_computed_tokens - saved


def record_hooks(engine):
    """Wrap the scheduler-side hooks so each call is logged (name, request id or None, step)."""
    log, connector, kv = [], engine.scheduler.connector, engine.kv_cache_manager

    def wrap(name):
        hook = getattr(connector, name)

        def call(*args):
            request = args[0] if name not in ("build_connector_meta", "update_connector_output") else None
            rid = getattr(request, "request_id", None)
            if name == "request_finished":  # called before the request's blocks are freed
                assert rid in kv.num_slots and args[1] == kv.get_block_ids(rid)
            log.append((engine.stats.steps, name, rid))
            return hook(*args)
        return call

    for name in HOOKS:
        setattr(connector, name, wrap(name))
    return log


def evicting_pair(model):
    """Conversation A's first turn, then B filling the GPU pool (A's blocks leave it), then A's second turn."""
    engine = make_engine(model, num_gpu_blocks=8, block_size=4, kv_offloading_blocks=16)
    g = torch.Generator().manual_seed(5)
    a1, b1 = torch.randint(0, 64, (13,), generator=g).tolist(), torch.randint(0, 64, (28,), generator=g).tolist()
    log = record_hooks(engine)
    answer_a1 = engine.generate([a1], 3, ignore_eos=True)[0]
    engine.generate([b1], 4, ignore_eos=True)
    a2 = a1 + answer_a1 + [7, 8, 9, 10, 11]
    return engine, log, a2


def test_hooks_called_in_vllm_order(model):
    engine, log, a2 = evicting_pair(model)
    engine.add_request("a2", a2, 3, ignore_eos=True)
    while not engine.is_finished("a2"):
        engine.step()
    # each step: admissions (a lookup, then the load plan when blocks were allocated; a request whose load landed
    # is admitted without a lookup), the step's plan, the finished requests (in update_from_output, before their
    # blocks are freed), the worker's report last
    step = re.compile(r"(on_new_request )*(get_num_new_matched_tokens (update_state_after_alloc )?|"
                      r"update_state_after_alloc )*build_connector_meta (request_finished )*update_connector_output ")
    calls = " ".join(name for _, name, _ in log) + " "
    steps = re.findall(r".*?update_connector_output ", calls)
    assert "".join(steps) == calls and all(step.fullmatch(s) for s in steps)
    assert len(steps) == engine.stats.steps
    a2_calls = [name for _, name, rid in log if rid == "a2"]
    assert a2_calls == ["on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc",
                        "update_state_after_alloc", "request_finished"]  # the second: after its load landed
    finishes = [s for s, n, _ in log if n == "request_finished"]
    assert len(finishes) == 3  # a1, b1, a2, each once


def test_async_load_waits_in_waiting_for_remote_kvs(model):
    """A's second turn finds its first 12 tokens only in the CPU tier: admitted with blocks but not scheduled while
    the load runs, then scheduled from token 12."""
    engine, _, a2 = evicting_pair(model)
    kv = engine.kv_cache_manager
    hits, num_local = kv.get_computed_blocks(type("R", (), {"request_id": "probe", "all_token_ids": a2,
                                                            "num_tokens": len(a2)})())
    assert num_local == 0  # B pushed A out of the GPU pool
    engine.add_request("a2", a2, 3, ignore_eos=True)
    request = engine.scheduler.requests["a2"]
    out = engine.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS and "a2" not in out.num_scheduled_tokens
    assert request.num_computed_tokens == 12 and len(kv.get_block_ids("a2")) == 3  # blocks for the loaded tokens
    assert len(out.kv_connector_metadata.load_jobs) == 1
    out = engine.step()
    assert request.status is RequestStatus.RUNNING and out.num_scheduled_tokens["a2"] == len(a2) - 12
    while not engine.is_finished("a2"):
        engine.step()
    assert engine.pop_finished("a2").outputs[0].token_ids == generate_dense(model, a2, 3)
    assert engine.stats.num_offload_loaded_tokens == engine.stats.num_offload_saved_tokens == 12


def test_prefix_half_on_gpu_half_on_cpu(model):
    """A hit whose head is still in the GPU pool and whose tail comes back from the CPU tier: the connector is asked
    for tokens beyond the local hit, and the load fills the blocks after it."""
    engine = make_engine(model, num_gpu_blocks=10, block_size=4, kv_offloading_blocks=16)
    calls = []
    hook = engine.scheduler.connector.get_num_new_matched_tokens

    def spy(request, num_computed_tokens):
        result = hook(request, num_computed_tokens)
        calls.append((request.request_id, num_computed_tokens, result))
        return result
    engine.scheduler.connector.get_num_new_matched_tokens = spy
    g = torch.Generator().manual_seed(11)
    a1 = torch.randint(0, 64, (17,), generator=g).tolist()
    answer = engine.generate([a1], 2, ignore_eos=True)[0]
    # B takes the free blocks, then the tail of A's cached blocks (v1 frees a table tail first)
    engine.generate([torch.randint(0, 64, (27,), generator=g).tolist()], 2, ignore_eos=True)
    a2 = a1 + answer + [1, 2, 3]
    assert engine.generate([a2], 4, ignore_eos=True)[0] == generate_dense(model, a2, 4)
    (_, local, (external, load_async)), = [c for c in calls if c[0] == ("generate", 2)]
    assert local > 0 and external > 0 and load_async and local + external == 16


def test_full_sequence_gate_counts_loaded_tokens(model):
    """Loaded tokens need GPU blocks like computed ones: the admission gate asks for the whole sequence less the
    GPU hit, as 0.33's allocate_slots(full_sequence_must_fit=True) does."""
    engine = make_engine(model, num_gpu_blocks=8, block_size=4, kv_offloading_blocks=16)
    kv = engine.kv_cache_manager
    request = Request("x", list(range(30)), max_tokens=1)
    assert kv.allocate_slots(request, 0, num_external_computed_tokens=28, full_sequence_must_fit=True,
                             delay_cache_blocks=True) is not None  # 8 blocks: the whole pool
    kv.free(request)
    engine2 = make_engine(model, num_gpu_blocks=7, block_size=4, kv_offloading_blocks=16)
    snapshot = engine2.kv_cache_manager.snapshot()
    assert engine2.kv_cache_manager.allocate_slots(request, 0, num_external_computed_tokens=28,
                                                   full_sequence_must_fit=True) is None
    assert engine2.kv_cache_manager.snapshot() == snapshot


def test_lru_evicts_the_tail_of_the_least_recent_request():
    """0.33's LRU: a finished request's chunks are re-ranked tail to head, so its head is kept longest."""
    tier = CPUOffloadingManager(4)
    first, second = ReqContext("first"), ReqContext("second")
    keys = [(f"h{i}", 0) for i in range(5)]
    for i, key in enumerate(keys[:3]):
        first.set_offload_key_position(key, 4 * (i + 1))
    store = tier.prepare_store(keys[:3], first)
    assert store.keys_to_store == keys[:3] and store.store_spec == [0, 1, 2]
    assert tier.lookup(keys[0]) is LookupResult.HIT_PENDING
    tier.complete_store(keys[:3])
    tier.on_request_finished(first)
    second.set_offload_key_position(keys[3], 4)
    second.set_offload_key_position(keys[4], 8)
    store = tier.prepare_store(keys[3:], second)
    assert store.evicted_keys == [keys[2]]  # the first request's tail
    assert tier.lookup(keys[2]) is LookupResult.MISS and tier.lookup(keys[0]) is LookupResult.HIT
    tier.prepare_load([keys[0], keys[1]], first)  # pinned while loading: never evicted
    tier.complete_store(keys[3:])
    assert tier.prepare_store([("h9", 0), ("h8", 0), ("h7", 0)], ReqContext("third")) is None  # 2 evictable < 3


def test_kv_offloading_size_in_gib_as_vllm_counts_it(model):
    page = 2 * 4 * CONFIG.num_key_value_heads * CONFIG.head_dim * 4  # K and V, 4 tokens, float32
    per_block = math.ceil(CONFIG.num_hidden_layers * page / mmap.PAGESIZE) * mmap.PAGESIZE
    for gib in (0.001, 1 / 1024, 0.25):
        engine = make_engine(model, num_gpu_blocks=8, block_size=4, kv_offloading_size=gib)
        assert engine.scheduler.connector.num_cpu_blocks == int(gib * 2 ** 30) // per_block
        assert engine.caches[0].num_blocks("cpu") == engine.scheduler.connector.num_cpu_blocks


@pytest.mark.parametrize("kwargs, match", [
    (dict(kv_offloading_size=0), "positive"),
    (dict(kv_offloading_size=-1.0), "positive"),
    (dict(kv_offloading_size=float("nan")), "positive"),
    (dict(kv_offloading_size="1"), "positive"),
    (dict(kv_offloading_size=True), "positive"),
    (dict(kv_offloading_blocks=0), "kv_offloading_blocks"),
    (dict(kv_offloading_blocks=2.5), "kv_offloading_blocks"),
    (dict(kv_offloading_size=1e-9), "holds no block"),
    (dict(kv_offloading_size=1, kv_offloading_blocks=4), "one way"),
    (dict(kv_offloading_blocks=4, version="v0"), "version='v1'"),
    (dict(kv_offloading_size=1.0, version="v0"), "version='v1'"),
])
def test_bad_input_is_refused(model, kwargs, match):
    kwargs = {"version": "v1", **kwargs}
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(PagedKVValueError, match=match):
        LLMEngine(model, num_gpu_blocks=8, block_size=4, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_sliding_window_models_are_refused():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=8,
                         layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(PagedKVValueError, match="sliding"):
        LLMEngine(LlamaForCausalLM(config), num_gpu_blocks=8, block_size=4, version="v1", kv_offloading_blocks=4)


@pytest.fixture(scope="module")
def smollm2(smollm2_loaded):
    return smollm2_loaded  # one load per session (tests/conftest.py), shared with test_smollm2.py


def test_smollm2_chat_history_comes_back_from_cpu(smollm2):
    """SmolLM2 in a two-conversation chat, each turn resending the history, in a GPU pool that keeps one
    conversation: the other's history comes back from the CPU tier, and every answer equals the dense one."""
    model, tokenizer = smollm2
    questions = [["Name a planet.", "And a moon of it?", "How far is it?"],
                 ["Say hi in French.", "And in German?", "And in Spanish?"]]
    history = [tokenizer.apply_chat_template([{"role": "user", "content": q[0]}]) for q in questions]
    engine = make_engine(model, num_gpu_blocks=6, block_size=16, kv_offloading_blocks=32)
    for turn in range(3):
        for i, prompt in enumerate(history):
            answer = engine.generate([prompt], 6, ignore_eos=True)[0]
            assert answer == generate_dense(model, prompt, 6, ignore_eos=True)
            if turn < 2:
                follow = ("<|im_end|>\n<|im_start|>user\n" + questions[i][turn + 1] +
                          "<|im_end|>\n<|im_start|>assistant\n")
                history[i] = prompt + answer + tokenizer.encode(follow)
    assert engine.stats.num_offload_loaded_tokens > 0
    check_stats_add_up(engine)


def test_tier_maps_follow_a_conversation_by_name(model):
    """The text map names each block by content: A's prompt blocks sit in the CPU tier once B pushed them out of the
    GPU pool, tail first in the tier's eviction order; the drawing reads the same snapshots."""
    from pagedkv.viz import block_names, draw_tiers, render_tiers

    engine, _, a2 = evicting_pair(model)
    names = block_names(a2, 4, "A")
    gpu, cpu = engine.snapshot(), engine.scheduler.connector.snapshot()
    text = render_tiers(gpu, cpu, names)
    assert "0:A0 1:A1 2:A2" in text and "CPU blocks, evicted first to last: A2 A1 A0" in text
    assert "A" not in text.split("CPU tier")[0]  # no block of A is left in the GPU pool
    assert [c.chunk_id for c in cpu.chunks if names.get(c.block_hash)] == [0, 1, 2]
    ax = draw_tiers(gpu, cpu, names, highlight=["A0"])
    assert any(t.get_text() == "A2" for t in ax.texts)
    ax = draw_tiers(gpu, cpu, names, loads={5: "A1"})  # a free block is no load target: drawn as it is
    assert not any(t.get_text().endswith("↓") for t in ax.texts)
    from pagedkv.viz import compact_png

    assert compact_png(ax.figure).data[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(PagedKVValueError, match="snapshot"):
        render_tiers(cpu, gpu, names)
