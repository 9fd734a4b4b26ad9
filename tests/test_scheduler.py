"""The scheduler's contract: queues, admission, budgets, preemption by recompute and by swap."""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv import BlockSpaceManager, PagedKVError
from pagedkv.manager import AllocStatus
from pagedkv.scheduler import PreemptionMode, Scheduler, SchedulerOutputs

from invariants import check_manager_invariants


def make(num_gpu_blocks=8, block_size=4, num_cpu_blocks=8, watermark=0.0, caching=False, max_num_seqs=8,
         max_num_batched_tokens=64, **kwargs):
    manager = BlockSpaceManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark, caching)
    return Scheduler(manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, **kwargs)


def stand_in_model(request_tokens: list[int]) -> int:
    """A deterministic 'model': the next token is a function of the whole sequence so far."""
    return (sum((i + 1) * t for i, t in enumerate(request_tokens)) * 31 + len(request_tokens)) % 1000


def run(scheduler, prompts: dict, max_tokens, steps_limit=10_000):
    """Serve every prompt with the stand-in model; returns (generated tokens, every step's outputs)."""
    for request_id, prompt in prompts.items():
        scheduler.add_request(request_id, prompt, max_tokens if isinstance(max_tokens, int) else max_tokens[request_id])
    history = []
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        history.append(out)
        sampled = {r: stand_in_model(scheduler.requests[r].token_ids) for r in out.scheduled}
        scheduler.update(out, sampled)
        assert len(history) < steps_limit, "the scheduler made no progress"
    return scheduler.finished, history


def test_first_come_first_served_and_decodes_after_prefill():
    s = make(num_gpu_blocks=16)
    s.add_request("a", [1, 2, 3], 3)
    s.add_request("b", [4, 5], 3)
    out = s.schedule()
    assert out.prefills == [("a", [1, 2, 3]), ("b", [4, 5])] and out.decodes == []
    assert out.num_batched_tokens == 5 and s.running == ["a", "b"] and s.waiting == []
    s.update(out, {"a": 7, "b": 8})
    out = s.schedule()
    assert out.prefills == [] and out.decodes == ["a", "b"] and out.num_batched_tokens == 2
    assert s.block_manager.get_token_ids("a") == [1, 2, 3, 7]  # the sampled token's slot is reserved


def test_request_finishes_with_exactly_max_tokens_and_frees_its_blocks():
    s = make(num_gpu_blocks=16)
    finished, history = run(s, {"a": [1, 2, 3, 4, 5]}, max_tokens=4)
    assert len(finished["a"]) == 4 and len(history) == 4  # one prefill step, then three decodes
    assert s.block_manager.num_free_gpu_blocks == 16 and not s.has_unfinished_requests()


def test_waiting_request_is_admitted_later_when_blocks_free_up():
    s = make(num_gpu_blocks=4, block_size=4)
    s.add_request("big", list(range(12)), 2)  # 3 blocks
    s.add_request("next", list(range(8)), 2)  # 2 blocks: LATER while "big" runs
    out = s.schedule()
    assert [r for r, _ in out.prefills] == ["big"] and s.waiting == ["next"]
    assert s.block_manager.can_allocate(8) is AllocStatus.LATER
    s.update(out, {"big": 1})
    out = s.schedule()
    assert out.decodes == ["big"] and out.prefills == []  # still no room
    s.update(out, {"big": 2})  # "big" finishes
    out = s.schedule()
    assert [r for r, _ in out.prefills] == ["next"]


def test_budgets_per_step():
    s = make(num_gpu_blocks=64, max_num_seqs=2, max_num_batched_tokens=16)
    for i in range(4):
        s.add_request(i, [1, 2, 3, 4], 5)
    out = s.schedule()
    assert [r for r, _ in out.prefills] == [0, 1]  # max_num_seqs
    s = make(num_gpu_blocks=64, max_num_seqs=4, max_num_batched_tokens=10)
    for i in range(4):
        s.add_request(i, [1, 2, 3, 4], 5)
    out = s.schedule()
    assert [r for r, _ in out.prefills] == [0, 1] and out.num_batched_tokens == 8  # 8 + 4 > 10


def test_ignored_prompts_never_hang():
    s = make(num_gpu_blocks=4, block_size=4, max_num_batched_tokens=12, max_num_seqs=4)
    s.add_request("too_long_for_batch", list(range(13)), 1)
    s.add_request("fits", [1], 1)
    out = s.schedule()
    assert out.ignored == ["too_long_for_batch"] and [r for r, _ in out.prefills] == ["fits"]
    assert s.finished["too_long_for_batch"] == []
    s = make(num_gpu_blocks=4, block_size=4, watermark=0.25)  # watermark: 1 block always kept free
    s.add_request("never", list(range(16)), 1)
    assert s.schedule().ignored == ["never"]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempts_the_most_recently_arrived(mode):
    s = make(num_gpu_blocks=6, block_size=2, preemption_mode=mode, max_num_seqs=8, max_num_batched_tokens=16)
    for r in "abc":
        s.add_request(r, [1, 2], 10)
    out = s.schedule()
    s.update(out, dict.fromkeys("abc", 5))  # 3 blocks used, each sequence's block is full
    out = s.schedule()  # each needs a fresh block: 3 more, exactly the 3 free ones
    s.update(out, dict.fromkeys("abc", 5))
    out = s.schedule()  # the blocks have a free slot each: no new block needed
    s.update(out, dict.fromkeys("abc", 5))
    out = s.schedule()  # now each needs one more block and none is free: "c" (newest) goes first
    assert out.preempted[0] == "c"
    if mode == "recompute":
        assert s.waiting[0] == "c" and "c" not in s.running and out.blocks_to_swap_out == []
    else:
        assert s.swapped == ["c"] and out.swapped_out == ["c"] and len(out.blocks_to_swap_out) == 2
    assert out.prefills == [] and out.blocks_to_swap_in == []  # a step that preempted admits nobody


def test_recompute_goes_to_the_front_and_prefills_generated_tokens():
    s = make(num_gpu_blocks=4, block_size=2, max_num_seqs=4, max_num_batched_tokens=16)
    s.add_request("old", [1, 2], 4)
    s.add_request("new", [3, 4], 4)
    s.add_request("waits", [9, 9, 9, 9, 9, 9, 9], 1)  # 4 blocks: LATER until both finish
    out = s.schedule()
    s.update(out, {"old": 10, "new": 20})
    for token in (11, 12):  # 4 blocks in use after these; each sequence's second block fills up
        out = s.schedule()
        s.update(out, {"old": token, "new": token + 10})
    out = s.schedule()  # both need a third block and none is free: "new" (the newest) is preempted
    assert out.preempted == ["new"] and s.waiting[:2] == ["new", "waits"]
    assert out.recomputed_tokens == {"new": 4}  # the step that preempts says what the victim will compute again
    s.update(out, {"old": 13})
    while "new" not in [r for r, _ in out.prefills]:
        out = s.schedule()
        s.update(out, {r: 13 for r in out.scheduled})
    prefill = dict(out.prefills)["new"]
    assert prefill == [3, 4, 20, 21, 22]  # prompt + every generated token, computed again
    assert s.num_recomputed_tokens == 4  # all but 22 had K/V already: that work is done twice


def test_swap_brings_blocks_back_without_recompute():
    s = make(num_gpu_blocks=4, block_size=2, preemption_mode=PreemptionMode.SWAP, max_num_seqs=4,
             max_num_batched_tokens=16)
    finished, history = run(s, {"old": [1, 2], "new": [3, 4]}, max_tokens=5)
    swapped_in = [out for out in history if out.blocks_to_swap_in]
    assert any(out.swapped_out for out in history) and swapped_in
    assert all(r not in [p for p, _ in out.prefills] for out in swapped_in for r in out.decodes)
    assert s.num_recomputed_tokens == 0
    assert s.block_manager.num_free_cpu_blocks == 8


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full():
    s = make(num_gpu_blocks=4, block_size=2, num_cpu_blocks=0, preemption_mode="swap", max_num_seqs=4,
             max_num_batched_tokens=16)
    finished, history = run(s, {"old": [1, 2], "new": [3, 4]}, max_tokens=5)
    fallbacks = [r for out in history for r in out.swap_fallbacks]
    assert fallbacks and fallbacks == [r for out in history for r in out.preempted]  # every one recomputed
    assert not any(out.blocks_to_swap_out for out in history)
    assert len(finished["old"]) == len(finished["new"]) == 5


def test_a_request_that_outgrows_the_pool_finishes_early():
    for mode in ("recompute", "swap"):
        s = make(num_gpu_blocks=2, block_size=2, preemption_mode=mode, max_num_seqs=2, max_num_batched_tokens=16)
        finished, history = run(s, {"grows": [1, 2]}, max_tokens=10)
        assert 1 <= len(finished["grows"]) < 10 and any(out.ignored == ["grows"] for out in history)
        assert s.block_manager.num_free_gpu_blocks == 2 and s.block_manager.num_free_cpu_blocks == 8


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("caching", [False, True])
def test_output_identical_whatever_the_pool(mode, caching):
    """Preemption and pool size change when tokens are computed, never which come out (each fits alone: 8 blocks)."""
    prompts = {f"r{i}": [7, 7, 7, 7, i, i + 1, 2 * i][: 3 + i % 5] for i in range(7)}
    roomy, _ = run(make(num_gpu_blocks=64, caching=caching), prompts, max_tokens=9)
    tight_sched = make(num_gpu_blocks=8, block_size=2, num_cpu_blocks=16, preemption_mode=mode, caching=caching,
                       max_num_seqs=8, max_num_batched_tokens=16)
    tight, history = run(tight_sched, prompts, max_tokens=9)
    assert tight == roomy
    assert sum(len(out.preempted) for out in history) > 0
    manager = tight_sched.block_manager
    assert manager.num_free_gpu_blocks == 8 and manager.num_free_cpu_blocks == 16 and not manager.seq_ids


def test_prefix_cached_tokens_are_not_batched_twice():
    s = make(num_gpu_blocks=32, caching=True, max_num_seqs=8, max_num_batched_tokens=64)
    system = list(range(8))
    s.add_request("first", system + [100], 2)
    out = s.schedule()
    s.update(out, {"first": 1})
    s.add_request("second", system + [200], 2)
    out = s.schedule()
    assert ("second", system + [200]) in out.prefills
    assert s.block_manager.num_cached_tokens("second") == 8
    assert out.num_batched_tokens == 1 + 1  # the decode of "first" + the one uncached prompt token


def test_can_allocate_counts_only_the_blocks_really_taken():
    m = BlockSpaceManager(4, num_gpu_blocks=4, watermark=0.0, enable_prefix_caching=True)
    m.allocate("a", list(range(12)))  # 3 blocks, two of them full and cached (and the third)
    prompt = list(range(12)) + [99]  # shares three full blocks, needs one fresh one
    assert m.can_allocate(len(prompt)) is AllocStatus.LATER  # the token count alone: 4 blocks, 1 free
    assert m.can_allocate(prompt) is AllocStatus.OK  # really taken: 1 block
    m.free("a")  # now the three cached blocks wait in the free queue: reusing them takes them out
    assert m.can_allocate(prompt) is AllocStatus.OK and m.count_cached_tokens(prompt) == 12


@pytest.mark.parametrize("call, match", [
    (lambda s: s.add_request("a", [1], 1), "already"),
    (lambda s: s.add_request("x", [], 1), "empty"),
    (lambda s: s.add_request("x", [1.5], 1), "integers"),
    (lambda s: s.add_request("x", ["a"], 1), "integers"),
    (lambda s: s.add_request("x", "abc", 1), "list of integer"),
    (lambda s: s.add_request("x", [1], 0), ">= 1"),
    (lambda s: s.add_request("x", [1], True), "integer"),
    (lambda s: s.add_request(["unhashable"], [1], 1), "hashable"),
    (lambda s: s.add_request("x", [2**64], 1), "int64"),
])
def test_bad_requests_change_nothing(call, match):
    s = make()
    s.add_request("a", [1], 1)
    before = (s.waiting, dict(s.finished))
    with pytest.raises(PagedKVError, match=match) as info:
        call(s)
    assert isinstance(info.value, ValueError) and (s.waiting, dict(s.finished)) == before


@pytest.mark.parametrize("kwargs, match", [
    ({"preemption_mode": "evict"}, "recompute"), ({"max_num_seqs": 0}, ">= 1"),
    ({"max_num_batched_tokens": -1}, ">= 1"), ({"max_num_seqs": 8, "max_num_batched_tokens": 4}, ">= max_num_seqs"),
    ({"max_num_seqs": 2.0}, "integer"),
])
def test_bad_settings(kwargs, match):
    with pytest.raises(PagedKVError, match=match):
        make(**kwargs)


def test_update_checks_before_changing_anything():
    s = make()
    s.add_request("a", [1], 3)
    s.add_request("b", [2], 3)
    out = s.schedule()
    with pytest.raises(PagedKVError, match="no token"):
        s.update(out, {"a": 1})
    with pytest.raises(PagedKVError, match="integers"):
        s.update(out, {"a": 1, "b": "x"})
    with pytest.raises(PagedKVError, match="update"):
        s.schedule()  # the step is still in flight
    with pytest.raises(PagedKVError, match="last schedule"):
        s.update(SchedulerOutputs(), {})
    assert s.requests["a"].output_token_ids == []
    s.update(out, {"a": 1, "b": 2})
    assert s.requests["a"].output_token_ids == [1]


class SchedulerMachine(RuleBasedStateMachine):
    """Random arrivals into a tight pool; after every step: no leaks, queues disjoint, counts right."""

    @initialize(mode=st.sampled_from(["recompute", "swap"]), blocks=st.integers(3, 10),
                cpu=st.integers(0, 12), caching=st.booleans(), watermark=st.sampled_from([0.0, 0.2]))
    def setup(self, mode, blocks, cpu, caching, watermark):
        self.s = make(num_gpu_blocks=blocks, block_size=2, num_cpu_blocks=cpu, watermark=watermark,
                      caching=caching, preemption_mode=mode, max_num_seqs=4, max_num_batched_tokens=12)
        self.max_tokens = {}
        self.ignored = set()
        self.next_id = 0

    @rule(prompt=st.lists(st.integers(0, 3), min_size=1, max_size=9), max_tokens=st.integers(1, 6))
    def add(self, prompt, max_tokens):
        self.s.add_request(self.next_id, prompt, max_tokens)
        self.max_tokens[self.next_id] = max_tokens
        self.next_id += 1

    @rule()
    def bad_add(self):
        before = self.s.waiting
        with pytest.raises(PagedKVError):
            self.s.add_request("bad", [], 1)
        assert self.s.waiting == before

    @precondition(lambda self: self.s.has_unfinished_requests())
    @rule()
    def step(self):
        out = self.s.schedule()
        assert out.num_batched_tokens <= self.s.max_num_batched_tokens and len(self.s.running) <= 4
        self.ignored |= set(out.ignored)
        self.s.update(out, {r: stand_in_model(self.s.requests[r].token_ids) for r in out.scheduled})

    @invariant()
    def queues_and_blocks(self):
        s, manager = self.s, self.s.block_manager
        queues = [set(s.waiting), set(s.running), set(s.swapped)]
        assert sum(map(len, queues)) == len(set().union(*queues)) == len(s.requests)
        assert set(manager.seq_ids) == queues[1] | queues[2]  # only running and swapped hold blocks
        assert all(manager.get_device(r) == "cpu" for r in s.swapped)
        check_manager_invariants(manager)
        for r, tokens in s.finished.items():  # exactly max_tokens, unless it could never fit (then fewer)
            assert len(tokens) < self.max_tokens[r] if r in self.ignored else len(tokens) == self.max_tokens[r]

    def teardown(self):
        if not hasattr(self, "s"):
            return
        steps = 0
        while self.s.has_unfinished_requests():  # drain: everything finishes, nothing leaks
            self.step()
            steps += 1
            assert steps < 2000
        manager = self.s.block_manager
        assert manager.num_free_gpu_blocks == manager.num_total_gpu_blocks
        assert manager.num_free_cpu_blocks == manager.num_total_cpu_blocks


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
