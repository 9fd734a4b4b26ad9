"""Speculative decoding through the paged cache (issue #47), as vLLM 0.33 schedules it.

The n-gram proposer against its rule written plainly; the scheduler's drafts, budget, rollback and blocks by hand;
the engine's greedy and seeded outputs against decoding without speculation and ``generate_dense`` (prefix caching
on and off, a tight pool that preempts, chunked prefill beside drafts), every step checked: no block holding a draft
is ever in the prefix cache, a rejected draft's slot is poisoned with NaN and must be written again before any row
reads it, the pool is whole at the end. The rejection sampler against exact probabilities (fixed seeds, so the
counts are the same every run). SmolLM2's run shares tests/test_smollm2.py's one load of the model.
"""

import math
import random
from collections import Counter

import pytest
import torch

from pagedkv import LLMEngine, PagedKVValueError, SamplingParams, generate_dense, load_tiny
from pagedkv.v1 import KVCacheManager, Scheduler
from pagedkv.v1.sample import RejectionSampler, rejection_sample
from pagedkv.v1.spec_decode import NgramProposer, SpeculativeConfig
from pagedkv.viz.spec_decode import slot_map

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tokenizer = tiny
    return [tokenizer.encode(t) for t in ("x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2",
                                          "The list of keys. The list of keys. The list",
                                          "def f(x): return x\ndef g(x): return")]


@pytest.fixture(scope="module")
def dense(tiny, prompts):
    model, _ = tiny
    return [generate_dense(model, p, 16) for p in prompts]


# --------------------------------------------------------------- the n-gram proposer
def ngram_rule(tokens, lo, hi, k):
    """vLLM's rule, said plainly: the longest n in [lo, hi] whose last-n-gram occurs earlier (ending before the last
    token); its earliest occurrence; the (at most k) tokens after it."""
    for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_the_longest_n_gram_wins_and_its_earliest_occurrence():
    p = NgramProposer(1, 3, 2)
    assert p.propose_one([1, 2, 3, 7, 9, 2, 3, 8, 5, 2, 3]) == [7, 9]  # "2 3" twice before: the first one
    assert p.propose_one([9, 3, 4, 1, 2, 3, 5, 6, 2, 3]) == [5, 6]  # "2 3" (n=2) beats the earlier "3" (n=1)
    assert p.propose_one([1, 2, 3, 4, 1, 2]) == [3, 4]
    assert p.propose_one([1, 2, 3, 1, 2, 3]) == [1, 2]  # the match may overlap the suffix
    assert p.propose_one([5, 6, 1, 2]) == []  # nothing recurs
    assert NgramProposer(1, 3, 4).propose_one([7, 8, 9, 7, 8]) == [9, 7, 8]  # fewer than k left after the match
    assert NgramProposer(3, 4, 2).propose_one([1, 2, 1, 2]) == []  # only n = 2 recurs: below prompt_lookup_min
    assert NgramProposer(2, 2, 3, max_model_len=6).propose_one([4, 5, 6, 4, 5]) == [6]  # never past the model


def test_the_proposer_follows_the_rule_on_random_text():
    rng = random.Random(0)
    for _ in range(400):
        lo = rng.randint(1, 3)
        hi, k = rng.randint(lo, 5), rng.randint(1, 5)
        tokens = [rng.randrange(rng.choice((2, 3, 6))) for _ in range(rng.randint(0, 40))]
        assert NgramProposer(lo, hi, k).propose_one(tokens) == ngram_rule(tokens, lo, hi, k), (tokens, lo, hi, k)


# --------------------------------------------------------------- the rejection sampler
def test_greedy_accepts_the_longest_matching_prefix_and_one_more():
    assert rejection_sample([5, 6, 7], [5, 6, 7, 8].__getitem__) == [5, 6, 7, 8]  # all accepted: the bonus
    assert rejection_sample([5, 6, 7], [5, 9, 7, 8].__getitem__) == [5, 9]  # 6 rejected: the target's 9 instead
    assert rejection_sample([5, 6, 7], [4, 6, 7, 8].__getitem__) == [4]
    assert rejection_sample([], [3].__getitem__) == [3]
    logits = torch.full((3, 10), -5.0)
    logits[0, 2], logits[1, 3], logits[2, 1] = 1.0, 1.0, 1.0
    assert RejectionSampler()([2, 4], logits, SamplingParams(temperature=0)) == [2, 3]


def chi_square(counts: Counter, expected: dict) -> tuple[float, int]:
    """Pearson's statistic over the categories expected at least 5 times (the rest pooled), and its degrees of
    freedom."""
    big = [c for c in expected if expected[c] >= 5]
    rest_expected = sum(e for c, e in expected.items() if c not in big)
    rest_seen = sum(n for c, n in counts.items() if c not in big)
    stat = sum((counts[c] - expected[c]) ** 2 / expected[c] for c in big)
    if rest_expected >= 5:
        stat += (rest_seen - rest_expected) ** 2 / rest_expected
    return stat, len(big) - (rest_expected < 5)


def test_sampled_drafts_follow_the_exact_target_distribution():
    """Two drafted positions on fixed logits, 4,000 seeded runs: the output's length and tokens must follow
    P(accept x1) = p1(x1), a rejected token ~ p1 without x1 renormalised, then the same at row 2, then the bonus ~ p3.
    The seeds are fixed, so the statistics are the same numbers on every run; the bounds are loose (chi-square at
    about 5 sigma), and exact distributions would still be told apart from, e.g., a sampler that ignores the
    draft."""
    torch.manual_seed(0)
    logits = torch.randn(3, 40) * 1.5
    params = SamplingParams(temperature=0.9, seed=0)
    p = torch.stack([RejectionSampler.target_probs(row, params) for row in logits]).double()
    x1, x2 = int(p[0].argsort()[-2]), int(p[1].argsort()[-1])  # the second most likely, then the most likely
    sampler, n = RejectionSampler(), 4000
    outputs = [tuple(sampler([x1, x2], logits, params, torch.Generator().manual_seed(1000 + i))) for i in range(n)]
    lengths = Counter(len(o) for o in outputs)
    a1, a2 = float(p[0, x1]), float(p[1, x2])
    expected = {1: n * (1 - a1), 2: n * a1 * (1 - a2), 3: n * a1 * a2}
    stat, df = chi_square(lengths, expected)
    assert stat < df + 5 * math.sqrt(2 * df), (lengths, expected)
    first_rejected = Counter(o[0] for o in outputs if len(o) == 1)  # p1 with x1 removed, renormalised
    assert x1 not in first_rejected
    residual = p[0].clone()
    residual[x1] = 0
    residual /= residual.sum()
    total = sum(first_rejected.values())
    stat, df = chi_square(first_rejected, {t: total * float(residual[t]) for t in range(40)})
    assert stat < df + 5 * math.sqrt(2 * df)
    bonus = Counter(o[2] for o in outputs if len(o) == 3)  # every draft accepted: the bonus token ~ p3
    total = sum(bonus.values())
    stat, df = chi_square(bonus, {t: total * float(p[2, t]) for t in range(40)})
    assert stat < df + 5 * math.sqrt(2 * df)
    assert all(o[:2] == (x1, x2) for o in outputs if len(o) == 3)


# --------------------------------------------------------------- configuration
@pytest.mark.parametrize("config, key", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "method"),
    ({"num_speculative_tokens": 2}, "method"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2.0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0}, "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "model"),
    ("ngram", "speculative_config"),
])
def test_bad_speculative_configs_name_the_key(tiny, config, key):
    model, _ = tiny
    with pytest.raises(PagedKVValueError, match=key):
        LLMEngine(model, version="v1", num_gpu_blocks=8, block_size=4, speculative_config=config)


def test_speculation_needs_v1_and_vllms_defaults_fill_the_lookup_bounds(tiny):
    model, _ = tiny
    with pytest.raises(PagedKVValueError, match="version='v1'"):
        LLMEngine(model, num_gpu_blocks=8, block_size=4, speculative_config=NGRAM)
    assert SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3}) == \
        SpeculativeConfig("ngram", 3, 5, 5)
    assert SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}) \
        == SpeculativeConfig("ngram", 3, 2, 2)
    assert SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}) \
        == SpeculativeConfig("ngram", 3, 2, 2)
    assert SpeculativeConfig.from_dict(NGRAM).num_lookahead_tokens == 0  # n-gram writes no K/V of its own


# --------------------------------------------------------------- blocks and the scheduler, by hand
def test_allocate_slots_gives_lookahead_slots_blocks_but_never_caches_past_num_tokens():
    kv = KVCacheManager(4, 8)
    s = Scheduler(kv)
    s.add_request("a", list(range(6)), 10)
    request = s.requests["a"]
    assert len(kv.allocate_slots(request, 6, num_lookahead_tokens=3)) == 3  # 9 slots: 3 blocks of 4, not 2
    assert len(kv.prefix_cache.block_to_hash) == 1  # 6 known tokens: one full block named, never a lookahead one
    assert kv.allocate_slots(request, 6, num_lookahead_tokens=30) is None  # 36 slots: 9 blocks of 8
    assert len(kv.get_block_ids("a")) == 3  # the refusal changed nothing
    assert kv.num_free_blocks == 5


def draft_step(s, request_id, draft, accepted_and_bonus):
    """One scheduler step with a hand-made draft; the request samples ``accepted_and_bonus``."""
    s.requests[request_id].spec_token_ids = list(draft)
    out = s.schedule()
    s.update_from_output(out, {r: accepted_and_bonus if r == request_id else 7 for r in s.sampling_request_ids(out)})
    return out


def test_four_drafts_one_accepted_rolls_back_three_slots_and_keeps_the_blocks():
    kv = KVCacheManager(4, 16)
    s = Scheduler(kv, num_spec_tokens=4)
    s.add_request("a", [1, 2, 3, 4, 5], 20)
    s.update_from_output(s.schedule(), {"a": 6})  # prefill: 5 computed, 6 tokens
    request = s.requests["a"]
    out = draft_step(s, "a", [7, 8, 9, 10], [7, 11])  # draft 7 accepted, 8 rejected: the target says 11
    assert out.num_scheduled_tokens == {"a": 5} and out.scheduled_spec_decode_tokens == {"a": [7, 8, 9, 10]}
    assert request.output_token_ids == [6, 7, 11] and request.num_tokens == 8
    assert request.num_computed_tokens == 5 + 5 - 3 == request.num_tokens - 1  # the rejected 3 rolled back
    assert len(kv.get_block_ids("a")) == 3  # slots 0..9 were given: 3 blocks stay though 8 tokens need 2
    assert len(kv.prefix_cache.block_to_hash) == 1  # block 0 (tokens 1-4); block 1 held drafts: never named
    assert s.spec_decoding_stats.num_accepted_tokens_per_pos == [1, 0, 0, 0]
    drawn = slot_map(kv.snapshot(), "a", request.num_computed_tokens, request.num_tokens)
    assert str(drawn).splitlines()[1:3] == ["  block   1  [###x]", "  block   2  [xx..]"]  # 7-9: rejected drafts
    assert drawn.pending == (7,)  # and 7 is where the pending token 11 goes: written next step
    out = draft_step(s, "a", [12], [12, 13])  # the next step writes slot 7 again (the rejected 8's slot)
    assert out.num_scheduled_tokens == {"a": 2} and request.num_computed_tokens == 9
    assert len(kv.get_block_ids("a")) == 3 and kv.num_free_blocks == 13  # no new block: it had them
    assert s.spec_decoding_stats.num_drafts == 2 and s.spec_decoding_stats.num_draft_tokens == 5


@pytest.mark.parametrize("accepted", range(7))
def test_update_from_output_names_the_blocks_that_accepted_drafts_fill(accepted):
    """vLLM 0.33's ``update_from_output`` calls ``cache_blocks(request, num_computed_tokens - num_in_flight_tokens)``
    whenever speculation is on (``scheduler.py``, after ``_update_request_with_output``): a block the accepted drafts
    fill is named right after the step, not at the next ``allocate_slots``. Blocks of 16, 28 tokens, 27 computed,
    6 drafts (positions 28-33); block 1 (positions 16-31) is full of verified K/V from 4 accepted drafts on."""
    kv = KVCacheManager(16, 8)
    s = Scheduler(kv, num_spec_tokens=6)
    s.add_request("a", list(range(27)), 40)
    s.update_from_output(s.schedule(), {"a": 27})
    drafts = list(range(100, 106))
    s.update_draft_token_ids({"a": drafts})
    out = s.schedule()
    table = kv.get_block_ids("a")
    assert len(table) == 3 and len(kv.prefix_cache.block_to_hash) == 1  # allocate_slots: up to num_tokens (28)
    s.update_from_output(out, {"a": drafts[:accepted] + [200]})
    request = s.requests["a"]
    assert request.num_computed_tokens == 28 + accepted and request.num_tokens == 29 + accepted
    named = (28 + accepted) // 16  # full blocks of verified K/V; the last sampled token has none yet
    assert [kv.block_pool.block_hash(b) is not None for b in table] == [i < named for i in range(3)]
    # the name is the one a prompt with the same tokens looks up: a second request hits those blocks
    s.add_request("b", request.all_token_ids[:32] + [300], 5)
    hit, num_hit = kv.get_computed_blocks(s.requests["b"])
    assert num_hit == 16 * named and list(hit) == table[:named]


def test_the_budget_cuts_drafts_and_preemption_drops_them():
    s = Scheduler(KVCacheManager(4, 16), max_num_batched_tokens=3, num_spec_tokens=4)
    s.add_request("a", [1, 2, 3], 20)
    s.update_from_output(s.schedule(), {"a": 4})
    s.requests["a"].spec_token_ids = [5, 6, 7, 8]
    out = s.schedule()  # budget 3: the last token and 2 drafts
    assert out.num_scheduled_tokens == {"a": 3} and out.scheduled_spec_decode_tokens == {"a": [5, 6]}
    assert s.requests["a"].spec_token_ids == []  # the next drafts come after this step
    s.update_from_output(out, {"a": [5, 6, 9]})
    assert s.requests["a"].num_computed_tokens == 6 and s.requests["a"].num_tokens == 7
    s.requests["a"].spec_token_ids = [1]
    s._running.remove(s.requests["a"])
    s._preempt(s.requests["a"], out)
    assert s.requests["a"].spec_token_ids == [] and s.requests["a"].num_computed_tokens == 0


def test_drafts_go_only_to_running_requests_past_their_prefill():
    s = Scheduler(KVCacheManager(4, 16), max_num_batched_tokens=4, num_spec_tokens=2)
    s.add_request("a", list(range(10)), 5)
    out = s.schedule()  # a 4-token chunk of a 10-token prompt
    s.update_from_output(out, {})
    s.update_draft_token_ids({"a": [1, 2], "gone": [3]})
    assert s.requests["a"].spec_token_ids == []  # still prefilling: vLLM ignores drafts for a prefill chunk
    s.update_from_output(s.schedule(), {})
    s.update_from_output(s.schedule(), {"a": 9})  # the chunk reaches the end: it samples
    s.update_draft_token_ids({"a": [1, 2, 3]})
    assert s.requests["a"].spec_token_ids == [1, 2]  # at most num_spec_tokens


def test_a_stop_token_among_accepted_drafts_ends_the_request_there():
    s = Scheduler(KVCacheManager(4, 16), num_spec_tokens=3)
    s.add_request("a", [1, 2, 3], 10, stop_token_ids=[0])
    s.update_from_output(s.schedule(), {"a": 4})
    request = s.requests["a"]
    draft_step(s, "a", [5, 0, 6], [5, 0, 6, 8])
    assert s.finished["a"] == [4, 5, 0] and s.kv_cache_manager.num_free_blocks == 16
    assert request.num_computed_tokens == request.num_tokens - 1 == 5  # vLLM 0.33: the cut tokens are not computed


# --------------------------------------------------------------- the engine, every step checked
def run_checked(engine, prompts, params, arrivals=None):
    """Step ``engine`` until every request finishes, checking every step: no block that holds a draft (scheduled,
    or rejected and not yet written again) is in the prefix cache; ref counts; and each rejected draft's slots
    (every slot past ``num_computed_tokens``) poisoned with NaN in every layer, so a row that read one before it
    is written again would turn the logits to NaN. Returns the outputs and what was seen."""
    kv, scheduler, bs = engine.kv_cache_manager, engine.scheduler, engine.block_size
    arrivals = arrivals or {0: list(range(len(prompts)))}
    seen = Counter()
    schedule = scheduler.schedule

    def checked_schedule():
        out = schedule()
        for request_id, draft in out.scheduled_spec_decode_tokens.items():
            request, table = scheduler.requests[request_id], kv.get_block_ids(request_id)
            assert all(kv.block_pool.block_hash(table[p // bs]) is None
                       for p in range(request.num_tokens, request.num_tokens + len(draft)))
            seen["drafted_steps"] += 1
            if any(scheduler.requests[r].is_prefill_chunk for r in out.num_scheduled_tokens):
                seen["drafts_beside_a_prefill_chunk"] += 1
        return out

    scheduler.schedule = checked_schedule
    step = 0
    while step in arrivals or any(a > step for a in arrivals) or engine.has_unfinished_requests():
        for i in arrivals.get(step, ()):
            engine.add_request(i, prompts[i], params)
        engine.step()
        step += 1
        users = Counter(b for blocks in kv.req_to_blocks.values() for b in blocks)
        assert all(kv.allocator.refcount(b) == users[b] for b in range(kv.num_gpu_blocks))
        for request_id in scheduler.running:
            request, table = scheduler.requests[request_id], kv.get_block_ids(request_id)
            stale = range(request.num_computed_tokens, len(table) * bs)
            assert all(kv.block_pool.block_hash(table[p // bs]) is None for p in stale)
            seen["poisoned_slots"] += len(stale) - 1  # beyond the one slot every decode leaves to the next step
            for p in stale:
                for cache in engine.caches:
                    cache.key_cache[table[p // bs], p % bs] = float("nan")
                    cache.value_cache[table[p // bs], p % bs] = float("nan")
    assert kv.num_free_blocks == kv.num_gpu_blocks and not kv.num_slots  # the pool is whole again
    assert all(kv.allocator.refcount(b) == 0 for b in range(kv.num_gpu_blocks))
    outputs = [engine.pop_finished(i) for i in range(len(prompts))]
    return [o.outputs[0].token_ids if len(o.outputs) == 1 else [c.token_ids for c in o.outputs] for o in outputs], seen


@pytest.mark.parametrize("kwargs, arrivals", [
    (dict(num_gpu_blocks=64, block_size=4), None),
    (dict(num_gpu_blocks=64, block_size=4, enable_prefix_caching=False), None),
    (dict(num_gpu_blocks=24, block_size=4), {0: [0, 1, 2]}),  # tight: preempts
    (dict(num_gpu_blocks=64, block_size=4, max_num_batched_tokens=12, long_prefill_token_threshold=6),
     {0: [0], 2: [1], 4: [2]}),  # later prompts are chunked beside the first one's drafts
], ids=["caching", "no-caching", "tight-pool", "chunked-prefill"])
def test_greedy_speculation_equals_decoding_without_it_and_dense(tiny, prompts, dense, kwargs, arrivals):
    model, _ = tiny
    engine = LLMEngine(model, version="v1", speculative_config=NGRAM, **kwargs)
    outputs, seen = run_checked(engine, prompts, 16, arrivals)
    plain = LLMEngine(model, version="v1", **kwargs)
    assert outputs == dense == plain.generate(prompts, 16)
    stats = engine.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # accepted and rejected drafts both ran
    assert seen["poisoned_slots"] > 0 and seen["drafted_steps"] > 0
    assert stats.num_accepted_tokens == sum(stats.num_accepted_tokens_per_pos)
    assert stats.num_accepted_tokens_per_pos == sorted(stats.num_accepted_tokens_per_pos, reverse=True)
    assert len(stats.acceptance_rate_per_pos) == NGRAM["num_speculative_tokens"]
    if kwargs["num_gpu_blocks"] == 24:
        assert stats.num_preemptions > 0 and plain.stats.num_preemptions > 0
    if arrivals and len(arrivals) > 1:
        assert seen["drafts_beside_a_prefill_chunk"] > 0
    assert stats.num_computed_tokens > plain.stats.num_computed_tokens  # rejected drafts cost compute


def test_seeded_sampling_with_speculation_equals_dense_token_for_token(tiny, prompts):
    """One draw per emitted token: the drafts change how many steps a sample takes, never its tokens."""
    model, _ = tiny
    params = SamplingParams(n=2, seed=11, temperature=0.8, top_k=40, max_tokens=16)
    engine = LLMEngine(model, version="v1", num_gpu_blocks=64, block_size=4, speculative_config=NGRAM)
    outputs, _ = run_checked(engine, prompts[:2], params)
    expected = [[s.token_ids for s in generate_dense(model, p, params).outputs] for p in prompts[:2]]
    assert outputs == expected
    assert engine.stats.num_accepted_tokens > 0
