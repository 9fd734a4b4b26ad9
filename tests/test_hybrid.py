"""Hybrid KV caches: sliding-window layers beside full-attention ones (issue #35).

The model against Hugging Face's Ministral (Llama's layers with per-layer windows, code nobody here wrote).
"""

import dataclasses

import pytest
import torch

from pagedkv import PagedKVError
from pagedkv.model import LlamaConfig, LlamaForCausalLM, generate_dense, load_tiny

transformers = pytest.importorskip("transformers")

WINDOW = 8
LAYER_TYPES = ("sliding_attention", "full_attention") * 2


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def hybrid(tiny):
    """The shipped tiny Llama with an 8-token window on layers 0 and 2."""
    config = dataclasses.replace(tiny[0].config, sliding_window=WINDOW, layer_types=LAYER_TYPES)
    model = LlamaForCausalLM(config)
    model.load_state_dict(tiny[0].state_dict())
    return model.eval()


@pytest.fixture(scope="module")
def ministral(hybrid):
    hf = {k: v for k, v in hybrid.config.to_hf_dict().items() if k not in ("architectures", "model_type", "rope_theta")}
    model = transformers.MinistralForCausalLM(transformers.MinistralConfig(**hf, attn_implementation="sdpa"))
    model.load_state_dict(hybrid.state_dict())
    return model.eval()


def test_config_writes_hugging_faces_names(hybrid):
    hf = hybrid.config.to_hf_dict()
    assert (hf["model_type"], hf["sliding_window"], hf["layer_types"]) == ("ministral", WINDOW, list(LAYER_TYPES))
    assert LlamaConfig.from_hf_dict(hf) == hybrid.config
    assert [hybrid.config.layer_window(i) for i in range(4)] == [WINDOW, None, WINDOW, None]
    plain = load_tiny()[0].config.to_hf_dict()  # today's Llama files do not change
    assert plain["model_type"] == "llama" and "layer_types" not in plain


def test_logits_equal_ministral(hybrid, ministral, tiny):
    ids = torch.tensor([tiny[1].encode("The quick brown fox jumps over the lazy dog, again and again.")])
    with torch.no_grad():
        theirs, mine, full = ministral(ids).logits, hybrid(ids), tiny[0](ids)
    torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(mine, full, atol=1e-3)  # the window changes the answer: the test can fail


def test_greedy_tokens_equal_ministral_generate(hybrid, ministral, tiny):
    prompt = tiny[1].encode("The list of ")
    with torch.no_grad():
        theirs = ministral.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)[0, len(prompt):]
    assert generate_dense(hybrid, prompt, 30) == theirs.tolist()


@pytest.mark.parametrize("change, field", [
    ({"sliding_window": 0}, "sliding_window"), ({"sliding_window": 4.0}, "sliding_window"),
    ({"sliding_window": True}, "sliding_window"),
    ({"layer_types": ("full_attention",) * 3}, "layer_types"),
    ({"layer_types": ("sliding_attention", "local", "full_attention", "full_attention")}, "layer_types"),
    ({"layer_types": "full_attention"}, "layer_types"),
    ({"sliding_window": None, "layer_types": LAYER_TYPES}, "sliding_window"),
])
def test_bad_layer_settings_name_the_field(tiny, change, field):
    with pytest.raises(PagedKVError, match=field):
        dataclasses.replace(tiny[0].config, **{"sliding_window": WINDOW, "layer_types": LAYER_TYPES, **change})


# ------------------------------------------------------------------ the v1 manager: groups over one pool
from pagedkv.v1 import KVCacheManager  # noqa: E402
from pagedkv.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheGroupSpec,
    SlidingWindowSpec,
    get_kv_cache_groups,
)
from pagedkv.v1.scheduler import Request  # noqa: E402

BS = 4


def hybrid_manager(num_gpu_blocks=64, window=WINDOW, enable_caching=True):
    specs = [SlidingWindowSpec(BS, 2, 32, sliding_window=window), FullAttentionSpec(BS, 2, 32)] * 2
    return KVCacheManager(BS, num_gpu_blocks, enable_caching, get_kv_cache_groups(specs))


def skipped_blocks(num_computed, window=WINDOW):
    """The rule, written from the issue: blocks wholly before the next token's window."""
    return max(0, num_computed - window + 1) // BS


def test_a_window_changes_how_many_pages_a_layer_keeps_never_a_pages_bytes():
    """vLLM 0.33's SlidingWindowSpec inherits AttentionSpec.page_size_bytes: gpt-oss-120b's sliding and full layers
    (8 KV heads of 64, bf16) have one page size (notebook 01, section 5); only the blocks each keeps differ."""
    for window in (1, 128, 4096):
        sliding = SlidingWindowSpec(16, 8, 64, "bfloat16", window)
        assert sliding.page_size_bytes == FullAttentionSpec(16, 8, 64, "bfloat16").page_size_bytes == 32_768
    sliding, full = SlidingWindowSpec(16, 8, 64, "bfloat16", 128), FullAttentionSpec(16, 8, 64, "bfloat16")
    groups = get_kv_cache_groups([sliding, full])
    assert len({g.page_size_bytes for g in groups}) == 1  # one pool block size serves both groups


def test_mla_and_mamba_pages_are_vllms():
    """vLLM 0.33: MLAAttentionSpec is one KV head of the latent plus the RoPE key, head_size_v 0 (DeepSeek-V3, bf16);
    MambaSpec is the states' bytes (Jamba-v0.1's mamba1_state_shape, bf16), padded to one attention page of 80
    tokens by _align_hybrid_block_size (notebook 01, section 5)."""
    from pagedkv.v1.kv_cache_interface import MambaSpec, MLAAttentionSpec

    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=512 + 64, dtype="bfloat16")
    assert mla.head_size_v == 0 and mla.page_size_bytes == 18_432
    mamba = MambaSpec(shapes=((8192, 3), (8192, 16)), dtypes=("bfloat16", "bfloat16"))
    assert mamba.page_size_bytes == 311_296
    page = FullAttentionSpec(80, 8, 128, "bfloat16").page_size_bytes
    assert page == 327_680 and MambaSpec(mamba.shapes, mamba.dtypes, page_size_padded=page).page_size_bytes == page
    with pytest.raises(PagedKVError, match="smaller than the states"):
        MambaSpec(mamba.shapes, mamba.dtypes, page_size_padded=page // 2)


def test_groups_are_formed_as_vllm_forms_them():
    sw, full = SlidingWindowSpec(16, 16, 128, "bfloat16", 1024), FullAttentionSpec(16, 16, 128, "bfloat16")
    gemma = get_kv_cache_groups([full if (i + 1) % 6 == 0 else sw for i in range(62)])  # Gemma 3 27B's pattern
    assert [g.name for g in gemma] == ["sliding 1024"] * 6 + ["full"]
    assert {len(g.layer_names) + g.num_padding_layers for g in gemma} == {10}
    assert sum(g.num_padding_layers for g in gemma) == 8 and gemma[0].layer_names[:2] == (0, 7)  # dealt i::6
    oss = get_kv_cache_groups([sw, full] * 18)
    assert [(g.name, len(g.layer_names)) for g in oss] == [("sliding 1024", 18), ("full", 18)]
    assert get_kv_cache_groups([full] * 4) == [KVCacheGroupSpec((0, 1, 2, 3), full)]


def test_sliding_group_gives_blocks_back_step_by_step():
    kv = hybrid_manager()
    request = Request("r", list(range(10)), max_tokens=30)
    assert kv.null_block == 0 and kv.allocate_slots(request, 10) is not None
    request.num_computed_tokens = 10
    for step in range(30):
        request.output_token_ids.append(100 + step)
        free_before = set(kv.allocator.free_block_ids())
        sliding_before, _ = kv.get_block_ids("r")
        assert kv.allocate_slots(request, 1) is not None
        sliding, full = kv.get_block_ids("r")
        n = request.num_computed_tokens
        nulls = [i for i, b in enumerate(sliding) if b == kv.null_block]
        assert nulls == list(range(skipped_blocks(n)))  # exactly the blocks before the window are null
        assert len(sliding) == len(full) == -(-(n + 1) // BS) and kv.null_block not in full
        freed = [b for i, b in enumerate(sliding_before) if b != kv.null_block and sliding[i] == kv.null_block]
        assert set(freed) <= set(kv.allocator.free_block_ids()) - free_before | set(sliding + full)
        request.num_computed_tokens += 1
    assert len([b for b in sliding if b != kv.null_block]) <= -(-(WINDOW - 1) // BS) + 1  # the window, not 40
    used = {b for b in sliding + full if b != kv.null_block}
    assert kv.num_used_blocks == len(used) and kv.snapshot().null_block == 0
    kv.free(request)
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == 63  # the null block is never freed


def test_a_chunk_frees_a_run_tail_first():
    kv = hybrid_manager(enable_caching=False)
    request = Request("r", list(range(40)), max_tokens=1)
    kv.allocate_slots(request, 24)
    sliding, _ = kv.get_block_ids("r")
    request.num_computed_tokens = 24
    queue_before = kv.allocator.free_block_ids()
    new_sliding, new_full = kv.allocate_slots(request, 16)
    freed = sliding[:skipped_blocks(24)]  # blocks 0..3 leave at once, before the chunk's blocks are taken
    assert len(freed) == 4 and new_sliding == freed[::-1]  # hash-less: to the free queue's head, tail first
    assert new_full == queue_before[:4] and kv.allocator.free_block_ids() == queue_before[4:]


def test_allocation_counts_only_the_window():
    kv = hybrid_manager(num_gpu_blocks=20)
    request = Request("r", list(range(12)), max_tokens=40)
    kv.allocate_slots(request, 12)
    request.num_computed_tokens = 12
    for step in range(36):  # a full-attention-only pool of 19 blocks would hold 48 tokens in two tables: 24
        request.output_token_ids.append(step)
        assert kv.allocate_slots(request, 1) is not None, step
        request.num_computed_tokens += 1
    sliding, full = kv.get_block_ids("r")
    assert len(full) == 12 and sum(b != kv.null_block for b in sliding) <= 3


def cached(kv, hashes, group, indices):
    """Name blocks ``indices`` of ``group`` by the request's hashes, as if another request had cached them."""
    blocks = kv.block_pool.get_new_blocks(len(hashes))
    kv.block_pool.cache_full_blocks(group, blocks, hashes, 0, len(hashes))
    for i, block in enumerate(blocks):
        if i not in indices:
            kv.block_pool.prefix_caches[group].evict(block)
    kv.block_pool.free_blocks(blocks)
    return blocks


@pytest.mark.parametrize("window, sliding_cached, expected", [
    (8, {3, 4}, 20),  # needs ceil(7 / 4) = 2 blocks before the hit point: blocks 3, 4 -> 5 blocks
    (8, {0, 1, 2, 3, 4, 5}, 24),
    (8, {1, 2, 4}, 12),  # block 3 missing: the run 1, 2 ends the hit at 3 blocks; the full group could serve 24
    (8, {5}, 0),
    (16, {0, 1}, 8),  # needs 4 blocks in a row, but a run from block 0 is a hit too
    (16, {2, 3, 4, 5}, 24),
])
def test_hit_rules_for_both_groups(window, sliding_cached, expected):
    specs = [SlidingWindowSpec(BS, 2, 32, sliding_window=window), FullAttentionSpec(BS, 2, 32)]
    kv = KVCacheManager(BS, 64, True, get_kv_cache_groups(specs))
    request = Request("r", list(range(25)), max_tokens=1)  # 6 full blocks before the last token
    hashes = kv.block_hashes(request, 24)
    sliding_blocks = cached(kv, hashes, 0, sliding_cached)
    full_blocks = cached(kv, hashes, 1, set(range(6)))
    (sliding, full), num_tokens = kv.get_computed_blocks(request)
    assert num_tokens == expected
    assert full == full_blocks[:expected // BS]
    needed = -(-(window - 1) // BS)
    tail = range(max(0, expected // BS - needed), expected // BS)
    assert sliding == [sliding_blocks[i] if i in tail else kv.null_block for i in range(expected // BS)]


def test_longest_hit_every_group_can_serve_matches_brute_force():
    import random

    rng = random.Random(0)
    for trial in range(60):
        window = rng.choice([3, 5, 8, 13])
        specs = [SlidingWindowSpec(BS, 1, 2, sliding_window=window), FullAttentionSpec(BS, 1, 2)]
        kv = KVCacheManager(BS, 64, True, get_kv_cache_groups(specs))
        request = Request(trial, list(range(rng.randint(2, 40))), max_tokens=1)
        hashes = kv.block_hashes(request, request.num_tokens - 1)
        in_sliding = {i for i in range(len(hashes)) if rng.random() < 0.7}
        in_full = set(range(rng.randint(0, len(hashes))))
        cached(kv, hashes, 0, in_sliding)
        cached(kv, hashes, 1, in_full)
        needed = -(-(window - 1) // BS)

        # n blocks are a hit if the full group has them all and the sliding group its last `needed`
        best = max(n for n in range(len(hashes) + 1)
                   if set(range(n)) <= in_full and set(range(max(0, n - needed), n)) <= in_sliding)
        assert kv.get_computed_blocks(request)[1] == best * BS, (trial, window, in_sliding, in_full)


# ------------------------------------------------------------------ retention: what a sliding group names
# Issue #48, both cases as vLLM 0.33.0's own Scheduler and KVCacheManager step them (steps counted from 0).
from pagedkv.v1 import Scheduler  # noqa: E402
from pagedkv.v1.kv_cache_coordinator import KVCacheCoordinator  # noqa: E402
from pagedkv.v1.single_type_kv_cache_manager import SingleTypeKVCacheManager, SlidingWindowManager  # noqa: E402


def sliding_only(window, num_gpu_blocks, retention):
    groups = get_kv_cache_groups([SlidingWindowSpec(1, 1, 2, sliding_window=window)])
    kv = KVCacheManager(1, num_gpu_blocks, True, groups, prefix_cache_retention_interval=retention)
    return Scheduler(kv, max_num_batched_tokens=1)


def tables_per_step(scheduler, request_id, prompt, max_tokens):
    """The request's table after each step's ``schedule()`` (None for the null block)."""
    scheduler.add_request(request_id, prompt, max_tokens)
    kv, tables = scheduler.kv_cache_manager, []
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        tables.append([None if b == kv.null_block else b for b in kv.get_block_ids(request_id)])
        scheduler.update_from_output(out, {r: 7 for r in scheduler.sampling_request_ids(out)})
    return tables


@pytest.mark.parametrize("retention, step_2", [
    (0, [None, 2, 1]),  # vLLM 0.33's default: block 1 was never named, went to the head, is reused at once
    (None, [None, 2, 3]),  # dense: block 1 is named, waits at the tail; the head is block 3
])
def test_sparse_retention_reuses_an_unnamed_block_at_once(retention, step_2):
    """Case S: window 2, block size 1, 3 usable blocks, prompt [554, 898, 212], one output token, 1 token a step.
    Under 0 only the block before the replay boundary (token 2) is named: block 2, not block 1."""
    scheduler = sliding_only(2, 4, retention)
    assert tables_per_step(scheduler, "r", [554, 898, 212], 1) == [[1], [1, 2], step_2]
    assert scheduler.prefix_cache_retention_interval == retention


@pytest.mark.parametrize("retention", [None, 0])
def test_a_window_of_one_never_caches(retention, monkeypatch):
    """Case W: window 1, block size 1, 2 usable blocks, prompt [291], two output tokens: a hit would need no
    block, so vLLM names none and block 1 comes straight back. With the rule off (every block named) it is 2."""
    assert tables_per_step(sliding_only(1, 3, retention), "r", [291], 2) == [[1], [None, 1]]
    again = sliding_only(1, 8, retention)
    tables_per_step(again, "a", [5, 6, 7, 8], 1)
    again.add_request("b", [5, 6, 7, 8], 1)
    again.schedule()
    assert again.requests["b"].num_cached_tokens == 0  # never a hit either
    monkeypatch.setattr(SlidingWindowManager, "reachable_block_mask", SingleTypeKVCacheManager.reachable_block_mask)
    assert tables_per_step(sliding_only(1, 3, retention), "r", [291], 2) == [[1], [None, 2]]


def three_requests(retention):
    """Notebook 12 section 5: block size 4, window 8 beside a full group; A, B, C share a 24-token prefix and
    arrive one after another. For each: (hit tokens, junction, which of the prefix's 6 sliding blocks are named)."""
    specs = [SlidingWindowSpec(BS, 1, 2, sliding_window=WINDOW), FullAttentionSpec(BS, 1, 2)]
    kv = KVCacheManager(BS, 40, True, get_kv_cache_groups(specs), prefix_cache_retention_interval=retention)
    scheduler, prefix, seen = Scheduler(kv), list(range(100, 124)), []
    for request_id, prompt, max_tokens in (("A", prefix + list(range(15)), 6), ("B", prefix + [50, 51, 52, 53, 54], 1),
                                           ("C", prefix + [60, 61], 1)):
        scheduler.add_request(request_id, prompt, max_tokens)
        request = scheduler.requests[request_id]
        while scheduler.has_unfinished_requests():
            out = scheduler.schedule()
            scheduler.update_from_output(out, {r: 7 for r in scheduler.sampling_request_ids(out)})
        named = "".join("#" if kv.block_pool.get_cached_block(h, [0]) else "." for h in kv.block_hashes(request, 24))
        seen.append((request.num_cached_tokens, request.shared_prefix_boundary, named))
    return seen


@pytest.mark.parametrize("retention, expected", [
    (0, [(0, 0, "......"), (0, 24, "....##"), (24, 0, "....##")]),  # 0.33: B pins the junction that C hits
    (None, [(0, 0, "######"), (24, 0, "######"), (24, 0, "######")]),  # dense: B and C both hit
])
def test_the_second_request_pins_the_junction_the_third_hits(retention, expected):
    """A names only blocks 7, 8 (before its replay boundary, 36), so B's full group hits 24 tokens but its sliding
    group none: the groups agree on 0, and 24 becomes B's junction, whose two blocks (4, 5) B names for C. B's own
    replay boundary (28) names blocks 5, 6: not enough for C without the junction."""
    assert three_requests(retention) == expected


def test_without_the_junction_nobody_hits(monkeypatch):
    """The junction switched off (no one-group hit is remembered): C gets nothing either."""
    find = KVCacheCoordinator.find_longest_cache_hit
    monkeypatch.setattr(KVCacheCoordinator, "find_longest_cache_hit", lambda *a: find(*a)[:2] + (0,))
    assert three_requests(0) == [(0, 0, "......"), (0, 0, ".....#"), (0, 0, "....##")]  # C names its own


def test_periodic_checkpoints_name_a_run_before_every_multiple():
    """A positive interval (here 16 tokens, 4 blocks) names the 2 blocks before each multiple of it too."""
    specs = [SlidingWindowSpec(BS, 1, 2, sliding_window=WINDOW), FullAttentionSpec(BS, 1, 2)]
    for retention, named in ((16, "..##..##..##"), (0, "..........##"), (None, "############")):
        kv = KVCacheManager(BS, 40, True, get_kv_cache_groups(specs), prefix_cache_retention_interval=retention)
        request = Request("r", list(range(49)), max_tokens=1)  # replay boundary 48: blocks 10, 11
        kv.get_computed_blocks(request)
        kv.allocate_slots(request, 49)
        assert "".join("#" if kv.block_pool.get_cached_block(h, [0]) else "." for h in kv.block_hashes(request, 48)) \
            == named, retention
        full_named = [kv.block_pool.get_cached_block(h, [1]) is not None for h in kv.block_hashes(request, 48)]
        assert all(full_named)  # full attention names every full block, whatever the setting


def test_engine_defaults_to_vllms_retention(hybrid, tiny):
    engine = LLMEngine(hybrid, num_gpu_blocks=40, block_size=BS, version="v1")
    assert engine.kv_cache_manager.prefix_cache_retention_interval == 0
    assert engine.scheduler.prefix_cache_retention_interval == 0
    dense = LLMEngine(hybrid, num_gpu_blocks=40, block_size=BS, version="v1", prefix_cache_retention_interval=None)
    assert dense.scheduler.prefix_cache_retention_interval is None


@pytest.mark.parametrize("value", [-4, 6, 4.0, True, "0"])
def test_bad_retention_interval_names_the_field(value):
    specs = [SlidingWindowSpec(BS, 1, 2, sliding_window=WINDOW), FullAttentionSpec(BS, 1, 2)]
    with pytest.raises(PagedKVError, match="prefix_cache_retention_interval"):
        KVCacheManager(BS, 16, True, get_kv_cache_groups(specs), prefix_cache_retention_interval=value)


def test_retention_needs_a_sliding_group_and_v1(hybrid, tiny):
    with pytest.raises(PagedKVError, match="no sliding-window group"):
        KVCacheManager(BS, 16, prefix_cache_retention_interval=8)
    assert KVCacheManager(BS, 16, prefix_cache_retention_interval=None).prefix_cache_retention_interval is None
    with pytest.raises(PagedKVError, match="prefix_cache_retention_interval"):
        LLMEngine(hybrid, num_gpu_blocks=40, block_size=BS, prefix_cache_retention_interval=None)  # v0


def test_one_full_group_reserves_no_null_block():
    kv = KVCacheManager(BS, 8)
    assert kv.null_block is None and kv.num_free_blocks == 8 and not kv.is_hybrid
    kv = KVCacheManager(BS, 8, True, get_kv_cache_groups([SlidingWindowSpec(BS, 1, 2, sliding_window=5)] * 2))
    assert kv.null_block == 0 and kv.num_free_blocks == 7 and not kv.is_hybrid  # one sliding group: a null block


@pytest.mark.parametrize("call, field", [
    (lambda: SlidingWindowSpec(BS, 2, 32, sliding_window=0), "sliding_window"),
    (lambda: SlidingWindowSpec(BS, 2, 32, sliding_window=2.5), "sliding_window"),
    (lambda: FullAttentionSpec(0, 2, 32), "block_size"),
    (lambda: get_kv_cache_groups([]), "layer_specs"),
    (lambda: get_kv_cache_groups([FullAttentionSpec(BS, 2, 32), "full"]), r"layer_specs\[1\]"),
    (lambda: get_kv_cache_groups([FullAttentionSpec(BS, 2, 32), FullAttentionSpec(BS, 4, 32)]), "page size"),
    (lambda: KVCacheManager(8, 16, True, get_kv_cache_groups([FullAttentionSpec(BS, 2, 32)])), "block_size"),
    (lambda: KVCacheManager(BS, 16, True, []), "kv_cache_groups"),
    (lambda: KVCacheManager(BS, 16, True, [KVCacheGroupSpec((0, 2), FullAttentionSpec(BS, 2, 32))]), "cover"),
    (lambda: KVCacheManager(BS, 1, True, get_kv_cache_groups([SlidingWindowSpec(BS, 1, 2, sliding_window=3)])),
     "num_gpu_blocks"),
])
def test_bad_specs_and_groups_name_the_field(call, field):
    with pytest.raises(PagedKVError, match=field):
        call()


# ------------------------------------------------------------------ the engine: paged == dense
from pagedkv.engine import LLMEngine  # noqa: E402


@pytest.fixture(scope="module")
def three_to_one(tiny):
    """Three sliding layers to one full one (Gemma's kind of pattern): four KV cache groups of one layer."""
    config = dataclasses.replace(tiny[0].config, sliding_window=6,
                                 layer_types=("sliding_attention",) * 3 + ("full_attention",))
    model = LlamaForCausalLM(config)
    model.load_state_dict(tiny[0].state_dict())
    return model.eval()


PROMPTS = ["The list of ", "The list of items in a dict", "A function that returns the", "The list of items in"]


@pytest.mark.parametrize("case, settings", [
    ("roomy", dict(num_gpu_blocks=64)),
    ("tight", dict(num_gpu_blocks=20)),
    ("tight", dict(num_gpu_blocks=18, prefix_cache_retention_interval=None)),
    ("chunked", dict(num_gpu_blocks=64, max_num_batched_tokens=8, long_prefill_token_threshold=5)),
    ("no prefix caching", dict(num_gpu_blocks=18, enable_prefix_caching=False)),
])
def test_paged_engine_equals_dense_reference(hybrid, tiny, case, settings):
    prompts = [tiny[1].encode(p) for p in PROMPTS]
    engine = LLMEngine(hybrid, block_size=BS, version="v1", **settings)
    assert engine.generate(prompts, 10) == [generate_dense(hybrid, p, 10) for p in prompts]
    if case == "tight":
        assert engine.stats.num_preemptions > 0
    if settings.get("enable_prefix_caching", True):
        assert engine.stats.num_prefix_cached_tokens > 0  # the shared "The list of " prefix hit both groups


def test_four_groups_and_the_paper_engine_equal_dense_too(three_to_one, tiny):
    prompts = [tiny[1].encode(p) for p in PROMPTS]
    expected = [generate_dense(three_to_one, p, 12) for p in prompts]
    engine = LLMEngine(three_to_one, num_gpu_blocks=40, block_size=BS, version="v1")
    assert len(engine.kv_cache_groups) == 4 and engine.generate(prompts, 12) == expected
    assert LLMEngine(three_to_one, num_gpu_blocks=40, block_size=BS).generate(prompts, 12) == expected  # v0: masks


def test_peak_counts_pool_blocks_of_every_group(hybrid, tiny):
    engine = LLMEngine(hybrid, num_gpu_blocks=40, block_size=BS, version="v1")
    for i, text in enumerate(PROMPTS[:2]):
        engine.add_request(i, tiny[1].encode(text), 20)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        state = engine.snapshot()
        held = {b for tables in state.group_tables.values() for t in tables for b in t} - {state.null_block}
        assert state.num_used("gpu") == len(held)  # the null block is reserved, not used
        peak = max(peak, len(held))
    assert engine.stats.peak_gpu_blocks >= peak > 0


# ------------------------------------------------------------------ sizing
from pagedkv import HYBRID_MODELS, MODELS, ModelSpec, cache_block_bytes, num_gpu_blocks  # noqa: E402
from pagedkv.sizing import request_kv_blocks  # noqa: E402


def test_presets_have_the_published_shapes():
    gemma, oss, mistral = (HYBRID_MODELS[k] for k in ("gemma-3-27b", "gpt-oss-120b", "mistral-7b-v0.1"))
    assert (gemma.num_layers, gemma.num_sliding_layers, gemma.num_kv_heads, gemma.head_size,
            gemma.sliding_window) == (62, 52, 16, 128, 1024)
    assert gemma.layer_types[5] == "full_attention" and gemma.layer_types[:5] == ("sliding_attention",) * 5
    assert (oss.num_layers, oss.num_sliding_layers, oss.num_kv_heads, oss.head_size, oss.sliding_window) == \
        (36, 18, 8, 64, 128) and oss.layer_types[:2] == ("sliding_attention", "full_attention")
    assert mistral.num_sliding_layers == 32 and mistral.kv_bytes_per_token == MODELS["mistral-7b"].kv_bytes_per_token
    assert "mistral-7b" in MODELS and repr(MODELS["opt-13b"]).endswith("num_params=12853000000)")  # as before


def test_bytes_per_token_at_a_context_length():
    gemma = HYBRID_MODELS["gemma-3-27b"]
    per_layer = 2 * 16 * 128 * 2
    assert gemma.kv_bytes_per_token_at(1024) == gemma.kv_bytes_per_token == 62 * per_layer  # inside the window
    assert gemma.request_kv_bytes(131072) == (10 * 131072 + 52 * 1024) * per_layer
    all_global = ModelSpec("all-global", 62, 32, 16, 128, dtype="bfloat16")
    ratio = all_global.request_kv_bytes(131072) / gemma.request_kv_bytes(131072)
    assert 5.9 < ratio < 6.0  # "about 6x more 128k-token requests"
    assert MODELS["llama-3-8b"].kv_bytes_per_token_at(5000) == MODELS["llama-3-8b"].kv_bytes_per_token


def test_hybrid_blocks_follow_vllms_page_rule():
    gemma = HYBRID_MODELS["gemma-3-27b"]
    assert gemma.kv_cache_group_size == 10 and cache_block_bytes(gemma, 16) == 16 * 10 * 2 * 16 * 128 * 2
    assert cache_block_bytes(MODELS["opt-13b"], 16) == 16 * 819_200  # a uniform model: one group, as before
    assert num_gpu_blocks(gemma, 16, 80 * 2**30, 60 * 2**30, 0.9) == int((72 * 2**30 - 60 * 2**30) // 1310720)
    assert request_kv_blocks(gemma, 16, 131072) == 8192 + 6 * (8192 - (131072 - 1023) // 16)
    assert request_kv_blocks(MODELS["llama-3-8b"], 16, 100) == 7


@pytest.mark.parametrize("kwargs, field", [
    (dict(sliding_window=0), "sliding_window"), (dict(sliding_window=1.5), "sliding_window"),
    (dict(sliding_window=8, layer_types=("full_attention",)), "layer_types"),
    (dict(sliding_window=8, layer_types=("global", "full_attention")), "layer_types"),
    (dict(layer_types=("sliding_attention", "full_attention")), "sliding_window"),
])
def test_bad_hybrid_specs_name_the_field(kwargs, field):
    with pytest.raises(PagedKVError, match=field):
        ModelSpec("m", 2, 4, 2, 8, **kwargs)


def test_admission_counts_a_sliding_group_only_up_to_its_window(hybrid, tiny):
    """vLLM's admission gate caps a sliding group at the window plus one step's chunk (+1 block): a 40-token prompt
    whose two full tables would need 20 blocks runs, chunked, in a pool of 19 usable blocks."""
    prompt = (tiny[1].encode("The list of items in a dict is ordered by ") * 2)[:40]
    kv = KVCacheManager(BS, 20, True, hybrid_manager().kv_cache_groups, max_num_batched_tokens=8)
    assert kv.max_admission_blocks == [-(-(WINDOW - 1 + 8) // BS) + 1, None]
    assert kv.can_fit_full_sequence(Request("r", prompt, 4))
    uncapped = KVCacheManager(BS, 20, True, hybrid_manager().kv_cache_groups)
    assert not uncapped.can_fit_full_sequence(Request("r", prompt, 4))
    engine = LLMEngine(hybrid, num_gpu_blocks=20, block_size=BS, version="v1", max_num_batched_tokens=8)
    assert engine.generate([prompt], 4) == [generate_dense(hybrid, prompt, 4)]
    assert engine.stats.num_ignored == 0 and engine.stats.peak_gpu_blocks <= 19


def test_async_scheduling_caps_a_sliding_group_at_two_steps_in_flight(hybrid, tiny):
    """vLLM 0.33 counts ``max_in_flight_tokens`` (``max_concurrent_batches * max_num_batched_tokens``: two steps with
    async scheduling) in a sliding group's admission cap, since blocks leave the window only once their step is
    processed. pagedkv's engine does the same: with two steps in flight a request really holds more sliding blocks
    than one step's cap, and never more than two steps' cap."""
    prompt = (tiny[1].encode("The list of items in a dict is ordered by ") * 2)[:40]
    one_step, two_steps = (-(-(WINDOW - 1 + n * 8) // BS) + 1 for n in (1, 2))
    kv = KVCacheManager(BS, 40, True, hybrid_manager().kv_cache_groups, max_num_batched_tokens=8,
                        max_in_flight_tokens=16)
    assert (kv.max_in_flight_tokens, kv.max_admission_blocks) == (16, [two_steps, None])
    peaks = {}
    for async_scheduling in (False, True):
        engine = LLMEngine(hybrid, num_gpu_blocks=40, block_size=BS, version="v1", max_num_batched_tokens=8,
                           async_scheduling=async_scheduling)
        kv = engine.kv_cache_manager
        assert kv.max_admission_blocks == [two_steps if async_scheduling else one_step, None]
        engine.add_request("r", prompt, 6)
        peak = 0
        while engine.has_unfinished_requests():
            engine.step()
            if "r" in engine.scheduler.requests:
                peak = max(peak, sum(b != kv.null_block for b in kv.get_block_ids("r")[0]))
        peaks[async_scheduling] = peak
    assert peaks[False] <= one_step < peaks[True] <= two_steps


# ------------------------------------------------------------------ drawing
def test_block_map_and_text_map_show_every_groups_table_and_the_null_block():
    import matplotlib

    matplotlib.use("Agg")
    from pagedkv.viz import draw_block_map

    kv = hybrid_manager(24)
    request = Request("A", list(range(14)), max_tokens=8)
    kv.allocate_slots(request, 14)
    request.num_computed_tokens = 14
    for token in range(6):
        request.output_token_ids.append(token)
        kv.allocate_slots(request, 1)
        request.num_computed_tokens += 1
    state = kv.snapshot()
    sliding, full = state.group_tables["A"]
    assert sliding[:3] == [0, 0, 0] and 0 not in full and state.num_used() == 2 + len(full)
    ax = draw_block_map(state, key=True)
    texts = [t.get_text() for t in ax.texts]
    assert "seq A · sliding 8" in texts and "seq A · full" in texts
    assert texts.count("null") == 1 + 3  # the pool's block 0 and three table entries
    legend = [t.get_text() for t in ax.figure.legends[0].get_texts()]
    assert any(label.startswith("null block") for label in legend)
    text_map = str(state)
    assert "sliding 8 -> [null, null, null, " in text_map and "null block (stands for" in text_map
    matplotlib.pyplot.close(ax.figure)
