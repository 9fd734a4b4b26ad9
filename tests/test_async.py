"""Async scheduling (vLLM 0.33's AsyncScheduler and EngineCore.step_with_batch_queue): step N+1 is scheduled while
step N runs on the forward thread, and nothing a user sees changes.

Outputs equal the synchronous engine's and the dense reference's, token for token; every forward is checked against
a shadow of the pages (no slot is read before this sequence's token at that position was written into it); every
engine ends with its pool whole and its thread joined, even when a test fails. Waits are bounded: a stuck forward
fails its test after EXECUTE_MODEL_TIMEOUT_S, never hangs it.
"""

import dataclasses
import threading
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv.engine as engine_module
from pagedkv import LLMEngine, PagedKVError, SamplingParams, generate_dense, load_tiny
from pagedkv.model import LlamaForCausalLM
from pagedkv.v1 import AsyncScheduler, KVCacheManager, RequestStatus, Scheduler

ENGINES = [
    dict(num_gpu_blocks=64, block_size=4),  # roomy: prefix hits, no preemption
    dict(num_gpu_blocks=12, block_size=4, max_num_batched_tokens=8, max_num_seqs=4),  # chunks and preemptions
    dict(num_gpu_blocks=20, block_size=2, max_num_batched_tokens=5, max_num_seqs=3, long_prefill_token_threshold=3),
    dict(num_gpu_blocks=40, block_size=16, enable_prefix_caching=False),
]
TEXTS = ["The list ", "A dict maps keys", "x = [1, 2]", "print(", "def f(x):\n"]


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.fixture(scope="module")
def tiny_eos(tiny):
    """The tiny model with an EOS: the newline (10), which it samples first, second, 12th and 29th after TEXTS."""
    model, tokenizer = tiny
    with_eos = LlamaForCausalLM(dataclasses.replace(model.config, eos_token_id=10))
    with_eos.load_state_dict(model.state_dict())
    return with_eos.eval(), tokenizer


SEEDED = SamplingParams(n=3, seed=5, max_tokens=8, temperature=0.9)
STOP = SamplingParams(temperature=0.8, seed=3, max_tokens=24, stop_token_ids=[32])  # stop at a space


@pytest.fixture(scope="module")
def prompts(tiny):
    tokenizer = tiny[1]
    prompts = [tokenizer.encode(t) for t in TEXTS]
    return prompts[:3] + [prompts[0] + tokenizer.encode("of keys")]  # the first's two full blocks of 4: a hit


@pytest.fixture(scope="module")
def dense(tiny, prompts):
    """The dense reference, once per module: greedy and seeded answers to ``prompts``."""
    model = tiny[0]
    return [generate_dense(model, p, 16) for p in prompts], [generate_dense(model, p, SEEDED) for p in prompts]


@pytest.fixture(scope="module")
def dense_eos(tiny_eos):
    model, tokenizer = tiny_eos
    prompts = [tokenizer.encode(t) for t in TEXTS]
    return prompts, [generate_dense(model, p, 32) for p in prompts], [generate_dense(model, p, STOP) for p in prompts]


def forward_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "pagedkv-forward"]


@pytest.fixture(autouse=True)
def checked(monkeypatch):
    """Around every test: bounded waits, a shadow of every engine's pages checked at each forward, and at the end
    every engine closed and no forward thread left (the teardown runs when the test failed too)."""
    monkeypatch.setattr(engine_module, "EXECUTE_MODEL_TIMEOUT_S", 60)
    engines, prompts, shadow, own = [], {}, {}, {}
    make, add, forward = LLMEngine.__init__, Scheduler.add_request, LLMEngine._forward

    def init(self, *args, **kwargs):
        make(self, *args, **kwargs)
        engines.append(self)

    def add_request(self, request_id, prompt_token_ids, *args, **kwargs):
        add(self, request_id, prompt_token_ids, *args, **kwargs)
        prompts[id(self), request_id] = list(prompt_token_ids)

    def checked_forward(self, chunks, sampling, *args):
        """The kernel writes every chunk's K/V, then attends: so first record the writes, then check each read
        (a position of the sequence, inside the window) finds this sequence's own token there."""
        if self.version == "v1":
            bs, me = self.block_size, id(self)
            for chunk in chunks:
                prompt = prompts[id(self.scheduler), chunk.key]
                for position, token in enumerate(chunk.token_ids, chunk.start):
                    assert token >= 0, f"a placeholder reached the model: {chunk}"
                    assert position >= len(prompt) or token == prompt[position]
                    own[me, chunk.key, position] = token
                    for g in range(len(self.kv_cache_groups)):
                        table = chunk.block_tables[g]
                        shadow[me, g, table[position // bs] * bs + position % bs] = (position, token)
            for chunk in chunks:
                prompt = prompts[id(self.scheduler), chunk.key]
                end = chunk.start + len(chunk.token_ids)
                for g, group in enumerate(self.kv_cache_groups):
                    window, table = group.sliding_window, chunk.block_tables[g]
                    for position in range(0 if window is None else max(0, chunk.start - window + 1), end):
                        want = own.get((me, chunk.key, position), prompt[position] if position < len(prompt)
                                       else None)
                        got = shadow.get((me, g, table[position // bs] * bs + position % bs))
                        assert got == (position, want), (f"request {chunk.key!r} read position {position} from a "
                                                         f"slot holding {got}, not {(position, want)}")
        return forward(self, chunks, sampling, *args)

    monkeypatch.setattr(LLMEngine, "__init__", init)
    monkeypatch.setattr(Scheduler, "add_request", add_request)
    monkeypatch.setattr(LLMEngine, "_forward", checked_forward)
    yield engines
    for engine in engines:
        engine.close()
    assert not forward_threads()


def whole(engine: LLMEngine) -> None:
    """Nothing left: no request, no step in flight, every block back in the pool, no forward thread."""
    kv = engine.kv_cache_manager
    assert not engine.scheduler.requests and not engine.batch_queue and engine._executor is None
    assert kv.num_used_blocks == 0 and not kv.num_slots
    assert all(kv.allocator.refcount(b) == 0 for b in range(kv.num_gpu_blocks) if b != kv.null_block)
    assert not forward_threads()


def engines(model, kwargs):
    return (LLMEngine(model, version="v1", **kwargs),
            LLMEngine(model, version="v1", async_scheduling=True, **kwargs))


# --------------------------------------------------------------- outputs
@pytest.mark.parametrize("kwargs", ENGINES)
def test_greedy_and_seeded_outputs_equal_the_synchronous_engine_and_dense(tiny, prompts, dense, kwargs):
    model = tiny[0]
    sync, run = engines(model, kwargs)
    assert run.generate(prompts, 16) == sync.generate(prompts, 16) == dense[0]
    whole(run)
    if "max_num_batched_tokens" in kwargs:
        assert run.stats.num_preemptions > 0  # with steps in flight (test_a_preempted_... pins the stale output)
    else:  # every request ends at max_tokens: no step too many
        assert run.stats.num_computed_tokens == sync.stats.num_computed_tokens
    if kwargs.get("enable_prefix_caching", True) and kwargs["block_size"] <= 4:
        assert run.stats.num_prefix_cached_tokens > 0
    sync, run = engines(model, kwargs)
    got, want = run.generate(prompts, SEEDED), sync.generate(prompts, SEEDED)
    for a, b, c in zip(got, want, dense[1]):
        assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs] == [o.token_ids for o in c.outputs]
        assert [o.cumulative_logprob for o in a.outputs] == pytest.approx([o.cumulative_logprob for o in b.outputs],
                                                                          abs=1e-4)
    whole(run)


@pytest.mark.parametrize("kwargs", [ENGINES[0], ENGINES[1], {**ENGINES[2], "num_gpu_blocks": 32}])
def test_eos_and_stop_tokens_sampled_with_the_next_step_in_flight(tiny_eos, dense_eos, kwargs):
    """EOS (first, second, 12th, 29th token) and a stop token end requests whose next step is already scheduled:
    the same tokens, and in a roomy pool exactly one token computed and thrown away per request that stopped
    early."""
    model = tiny_eos[0]
    prompts, greedy, stopped = dense_eos
    assert [len(d) for d in greedy] == [32, 29, 1, 2, 12]  # EOS mid-flight in four of five
    sync, run = engines(model, kwargs)
    assert run.generate(prompts, 32) == sync.generate(prompts, 32) == greedy
    whole(run)
    if kwargs is ENGINES[0]:
        assert run.stats.num_computed_tokens == sync.stats.num_computed_tokens + 4
    sync, run = engines(model, kwargs)
    got, want = run.generate(prompts, STOP), sync.generate(prompts, STOP)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want] == \
        [o.outputs[0].token_ids for o in stopped]
    assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in stopped]
    assert "stop" in [o.outputs[0].finish_reason for o in got]
    whole(run)


def test_beam_search_and_fan_out_run_on_the_async_engine(tiny):
    from pagedkv import BeamSearchParams, beam_search_dense

    model, tokenizer = tiny
    prompts = [tokenizer.encode(t) for t in TEXTS[:2]]
    run = LLMEngine(model, version="v1", async_scheduling=True, num_gpu_blocks=24, block_size=4)
    params = BeamSearchParams(beam_width=2, max_tokens=4)
    got = run.generate(prompts, params)
    for out, prompt in zip(got, prompts):
        assert [o.token_ids for o in out.outputs] == [o.token_ids for o in beam_search_dense(model, prompt,
                                                                                              params).outputs]
    whole(run)


# --------------------------------------------------------------- the scheduler alone
def token_of(request_id, position: int) -> int:
    """A stand-in model: the token a request samples at a position depends on nothing else, so any schedule
    must produce the same outputs."""
    return (7 * hash(request_id) + 3 * position) % 5


def drive_sync(s: Scheduler, steps: int = 3000) -> None:
    for _ in range(steps):
        if not s.has_unfinished_requests():
            return
        out = s.schedule()
        s.update_from_output(out, {r: token_of(r, s.requests[r].num_computed_tokens)
                                   for r in s.sampling_request_ids(out)})
    raise AssertionError("the synchronous scheduler did not finish")


def schedule_into(s: Scheduler, queue: deque):
    """Schedule a step and queue it with the tokens it will sample (drawn now: the positions are known now)."""
    out = s.schedule()
    if not out.is_empty:
        queue.appendleft((out, {r: token_of(r, s.requests[r].num_computed_tokens)
                                for r in s.sampling_request_ids(out)}))
    return out


def drive_async(s: AsyncScheduler, queue: deque | None = None, steps: int = 3000, check=None) -> list:
    """The engine's batch queue without a model: schedule step N+1, then process step N's output. Returns the
    stale deliveries seen: (request id, token) of requests preempted with that step in flight."""
    queue, stale = deque() if queue is None else queue, []
    for _ in range(steps):
        if s.has_unfinished_requests():
            assert not any(r.num_stale_output_tokens for r in s._waiting)  # 0.33's skip is never needed at depth 2
            out = schedule_into(s, queue)
            if not out.is_empty and len(queue) < 2:
                continue
        if not queue:
            if not s.has_unfinished_requests():
                return stale
            continue
        out, sampled = queue.pop()
        stale += [(r, t) for r, t in sampled.items() if r in s.requests and s.requests[r].num_stale_output_tokens]
        s.update_from_output(out, sampled)
        if check:
            check(s)
    raise AssertionError("the async scheduler did not finish")


def check_counters(s: Scheduler) -> None:
    """Between steps (one in flight): a running request that samples in it has one placeholder, and has computed
    every known token but its last, plus that placeholder's; nobody else holds a placeholder or a slot."""
    kv = s.kv_cache_manager
    for request in s.requests.values():
        assert request.num_output_placeholders in (0, 1) and request.num_in_flight_tokens >= 0
        if request.status == RequestStatus.RUNNING:
            if request.num_output_placeholders:
                assert request.num_computed_tokens == request.num_tokens
            assert request.num_computed_tokens <= request.num_tokens
            assert kv.num_slots[request.request_id] == request.num_computed_tokens
        else:
            assert request.num_computed_tokens == 0 and request.num_output_placeholders == 0
            assert request.request_id not in kv.num_slots


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_workload_gives_the_synchronous_outputs_and_leaks_nothing(data):
    block_size = data.draw(st.sampled_from([1, 2, 4]))
    num_blocks = data.draw(st.integers(6, 20))
    kwargs = dict(max_num_batched_tokens=data.draw(st.integers(3, 16)), max_num_seqs=data.draw(st.integers(1, 4)),
                  long_prefill_token_threshold=data.draw(st.integers(0, 5)),
                  scheduler_reserve_full_isl=data.draw(st.booleans()))
    caching = data.draw(st.booleans())
    sync = Scheduler(KVCacheManager(block_size, num_blocks, caching), **kwargs)
    run = AsyncScheduler(KVCacheManager(block_size, num_blocks, caching), **kwargs)
    capacity = num_blocks * block_size
    for i in range(data.draw(st.integers(1, 5))):
        prompt = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=capacity // 2))
        max_tokens = data.draw(st.integers(1, max(1, capacity // 2 - len(prompt))))
        stop = data.draw(st.sets(st.integers(0, 4), max_size=1))
        for s in (sync, run):
            s.add_request(i, prompt, max_tokens, stop_token_ids=sorted(stop))
    drive_sync(sync)
    stale = drive_async(run, check=check_counters)
    assert run.finished == sync.finished
    for request_id, token in stale:  # a stale token is a real one: it is in the output
        assert token in run.finished[request_id]
    kv = run.kv_cache_manager
    assert not run.requests and kv.num_free_blocks == kv.num_gpu_blocks and not kv.num_slots


def test_a_request_holds_a_slot_for_its_eos_when_it_is_sampled():
    """Prompt 7 tokens, blocks of 4, EOS as the second output token. Synchronously the EOS arrives with slots for
    the 8 tokens computed: 2 blocks. Asynchronously step 2 was scheduled before step 1's output (the EOS) came back,
    with a slot for the EOS's own position: 9 tokens, 3 blocks; then all three go back."""
    held = {}
    for cls in (Scheduler, AsyncScheduler):
        s = cls(KVCacheManager(4, 8, enable_caching=False))
        s.add_request("r", [1, 2, 3, 4, 5, 6, 7], 10, stop_token_ids=[0])
        queue = deque()
        tokens = iter([9, 0, 7])  # the second sampled token is the stop token (async: a third is drawn, dropped)
        while s.has_unfinished_requests():
            out = s.schedule()
            queue.appendleft((out, {r: next(tokens) for r in s.sampling_request_ids(out)}))
            if cls is AsyncScheduler and len(queue) < 2:
                continue
            out, sampled = queue.pop()
            if 0 in sampled.values():
                held[cls.__name__] = len(s.kv_cache_manager.req_to_blocks["r"])
            s.update_from_output(out, sampled)
        if queue:  # the extra step, scheduled for a request that is done: its output is dropped
            s.update_from_output(*queue.pop())
        assert s.finished == {"r": [9, 0]} and s.kv_cache_manager.num_used_blocks == 0
    assert held == {"Scheduler": 2, "AsyncScheduler": 3}


def test_a_request_that_reaches_max_tokens_gets_no_extra_step():
    s = AsyncScheduler(KVCacheManager(4, 8))
    s.add_request("r", [1, 2, 3], 3)
    scheduled = []
    queue = deque()
    while s.has_unfinished_requests() or queue:
        if s.has_unfinished_requests():
            out = s.schedule()
            if not out.is_empty:
                scheduled.append(out.num_scheduled_tokens["r"])
                queue.appendleft((out, {r: 5 for r in s.sampling_request_ids(out)}))
                if len(queue) < 2:
                    continue
        s.update_from_output(*queue.pop())
    assert scheduled == [3, 1, 1] and s.finished == {"r": [5, 5, 5]}  # the prompt, then the 2nd and 3rd tokens


def test_a_preempted_request_keeps_the_token_of_its_step_in_flight():
    """Two requests fill the pool; scheduling step N+1 preempts the later one while step N (which samples for it)
    is in flight. Its counters are reset at once; step N's token arrives stale: kept, no counter moved; it comes
    back later and recomputes prompt and outputs."""
    s = AsyncScheduler(KVCacheManager(2, 5, enable_caching=False), max_num_batched_tokens=16)
    s.add_request("a", [1, 2, 3], 6)
    s.add_request("b", [4, 5, 6], 6)
    queue = deque()
    schedule_into(s, queue)  # step 0: both prompts, 4 of the 5 blocks; each samples a token
    schedule_into(s, queue)  # step 1, before step 0's output: each decodes a placeholder (in their 2nd blocks)
    s.update_from_output(*queue.pop())
    b = s.requests["b"]
    assert (b.output_token_ids, b.num_output_placeholders, b.num_in_flight_tokens) == ([token_of("b", 3)], 1, 1)
    out = schedule_into(s, queue)  # step 2: a needs a 3rd block and takes the last; b needs one too: preempted
    assert out.preempted_req_ids == ["b"] and b.status == RequestStatus.PREEMPTED
    assert (b.num_computed_tokens, b.num_output_placeholders, b.num_stale_output_tokens) == (0, 0, 1)
    s.update_from_output(*queue.pop())  # step 1's output: b's token is delivered, stale
    assert b.output_token_ids == [token_of("b", 3), token_of("b", 4)] and b.num_computed_tokens == 0
    assert b.num_stale_output_tokens == 0 and b.num_in_flight_tokens == 0
    drive_async(s, queue)
    assert s.finished == {r: [token_of(r, p) for p in range(3, 9)] for r in ("a", "b")}


def test_drafts_are_placeholders_too_and_a_rejection_gives_them_back():
    """vLLM 0.33's arithmetic with speculation (k = 2): a decode step's placeholders are its token and the drafts
    it verifies; its next drafts are -1 placeholders; rejected drafts roll back num_computed_tokens and their
    placeholders. Between steps a request has computed every known token but its last, plus the step in flight's
    placeholders."""
    s = AsyncScheduler(KVCacheManager(4, 16), num_spec_tokens=2)
    s.add_request("r", [1, 2, 3], 20)
    r, queue = s.requests["r"], deque()
    queue.appendleft(s.schedule())  # step 0: the prompt; it samples one token
    assert (r.num_computed_tokens, r.num_output_placeholders, r.spec_token_ids) == (3, 1, [-1, -1])
    queue.appendleft(s.schedule())  # step 1: the placeholder and two placeholder drafts
    assert queue[0].num_scheduled_tokens == {"r": 3} and queue[0].scheduled_spec_decode_tokens == {"r": [-1, -1]}
    assert (r.num_computed_tokens, r.num_output_placeholders) == (6, 4)
    s.update_from_output(queue.pop(), {"r": [7]})  # step 0: one token
    assert (r.num_tokens, r.num_computed_tokens, r.num_output_placeholders) == (4, 6, 3)
    queue.appendleft(s.schedule())  # step 2, assuming step 1's drafts are accepted
    assert (r.num_computed_tokens, r.num_output_placeholders) == (9, 6)
    s.update_from_output(queue.pop(), {"r": [8]})  # step 1: both drafts rejected, one token
    assert (r.num_tokens, r.num_computed_tokens, r.num_output_placeholders) == (5, 7, 3)
    assert r.num_computed_tokens == r.num_tokens + r.num_output_placeholders - 1
    s.update_from_output(queue.pop(), {"r": [9, 10, 11]})  # step 2: both accepted, and the bonus token
    assert (r.num_tokens, r.num_computed_tokens, r.num_output_placeholders) == (8, 7, 0)
    assert r.output_token_ids == [7, 8, 9, 10, 11]


# --------------------------------------------------------------- the engine's loop and thread
def test_step_n_plus_1_is_scheduled_while_step_n_runs(tiny, monkeypatch):
    """One request, 6 tokens: steps 0-5, each sampling one. The forward of step k (but the last) waits, bounded,
    until the main thread has scheduled step k + 1: a synchronous loop would fail here."""
    model, tokenizer = tiny
    state, forward, schedule = threading.Condition(), LLMEngine._forward, AsyncScheduler.schedule
    counts = {"scheduled": 0, "forwards": 0}

    def counting_schedule(self):
        out = schedule(self)
        with state:
            counts["scheduled"] += not out.is_empty
            state.notify_all()
        return out

    def waiting_forward(self, chunks, sampling, *args):
        assert threading.current_thread().name == "pagedkv-forward"
        step = counts["forwards"]
        counts["forwards"] += 1
        if step < 5:
            with state:
                assert state.wait_for(lambda: counts["scheduled"] >= step + 2, timeout=30), \
                    f"step {step + 1} was not scheduled while step {step} ran"
        return forward(self, chunks, sampling, *args)

    monkeypatch.setattr(AsyncScheduler, "schedule", counting_schedule)
    monkeypatch.setattr(LLMEngine, "_forward", waiting_forward)
    run = LLMEngine(model, version="v1", async_scheduling=True, num_gpu_blocks=32, block_size=4)
    prompt = tokenizer.encode(TEXTS[0])
    assert run.generate([prompt], 6) == [generate_dense(model, prompt, 6)]
    assert counts == {"scheduled": 6, "forwards": 6}
    whole(run)


def test_the_trace_records_each_step_on_its_thread(tiny):
    """``engine.trace``: per step a schedule, a forward (on the forward thread), a wait and an update; a wait ends
    after its forward, and step k + 1 is scheduled before step k's output is processed."""
    model, tokenizer = tiny
    run = LLMEngine(model, version="v1", async_scheduling=True, num_gpu_blocks=32, block_size=4)
    run.trace = []
    run.generate([tokenizer.encode(TEXTS[0])], 5)
    spans = {(e.kind, e.step): e for e in run.trace}
    assert sorted(spans) == sorted((kind, step) for step in range(5)
                                   for kind in ("schedule", "forward", "wait", "update"))
    assert {e.thread for e in run.trace if e.kind == "forward"} == {"forward"}
    for step in range(5):
        assert spans["forward", step].end <= spans["wait", step].end <= spans["update", step].start
    for step in range(4):
        assert spans["schedule", step + 1].end <= spans["wait", step].start
    whole(run)


def test_the_synchronous_loop_records_its_spans_and_simulated_work_changes_no_output(tiny):
    """The v1 synchronous loop's trace: per step a schedule, a forward and an update, in that order, none
    overlapping; ``simulated_host_ms`` lengthens the schedule and update spans of either loop,
    ``simulated_forward_ms`` the forward spans, and nothing else changes."""
    model, tokenizer = tiny
    prompt = [tokenizer.encode(TEXTS[0])]
    plain = LLMEngine(model, version="v1", num_gpu_blocks=32, block_size=4).generate(prompt, 4)
    for async_scheduling in (False, True):
        with LLMEngine(model, version="v1", async_scheduling=async_scheduling, num_gpu_blocks=32, block_size=4,
                       simulated_host_ms=2, simulated_forward_ms=3) as run:
            run.trace = []
            assert run.generate(prompt, 4) == plain
        host = [e for e in run.trace if e.kind in ("schedule", "update")]
        assert len(host) == 8 and all(e.end - e.start >= 0.002 for e in host)
        forward = [e for e in run.trace if e.kind == "forward"]
        assert len(forward) == 4 and all(e.end - e.start >= 0.003 for e in forward)
        if not async_scheduling:
            spans = sorted(run.trace, key=lambda e: e.start)
            assert [(e.kind, e.step) for e in spans] == [(kind, step) for step in range(4)
                                                         for kind in ("schedule", "forward", "update")]
            assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))


def test_abort_with_a_step_in_flight_frees_at_once_and_drops_its_output(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer.encode(t) for t in TEXTS[:3]]
    run = LLMEngine(model, version="v1", async_scheduling=True, num_gpu_blocks=32, block_size=4)
    for i, prompt in enumerate(prompts):
        run.add_request(i, prompt, 12)
    for _ in range(4):
        run.step()
    assert len(run.batch_queue) == 1 and run.scheduler.requests[1].num_output_placeholders > 0
    used = run.kv_cache_manager.num_used_blocks
    run.abort_request(1)
    assert run.kv_cache_manager.num_used_blocks < used and 1 not in run.scheduler.requests
    while run.has_unfinished_requests():
        run.step()
    assert [run.pop_finished(i).outputs[0].token_ids for i in (0, 2)] == \
        [generate_dense(model, prompts[i], 12) for i in (0, 2)]
    with pytest.raises(PagedKVError, match="has not finished"):
        run.pop_finished(1)
    whole(run)


def test_close_processes_the_steps_in_flight_and_the_engine_goes_on(tiny):
    model, tokenizer = tiny
    prompts = [tokenizer.encode(t) for t in TEXTS[:2]]
    with LLMEngine(model, version="v1", async_scheduling=True, num_gpu_blocks=32, block_size=4) as run:
        for i, prompt in enumerate(prompts):
            run.add_request(i, prompt, 8)
        for _ in range(3):
            run.step()
        assert run.batch_queue and forward_threads()
    assert not run.batch_queue and not forward_threads()  # joined on leaving the with block
    while run.has_unfinished_requests():
        run.step()  # a new forward thread
    assert [run.pop_finished(i).outputs[0].token_ids for i in (0, 1)] == [generate_dense(model, p, 8)
                                                                          for p in prompts]
    whole(run)


def test_a_forward_that_raises_reaches_the_caller_and_the_thread_is_joined(tiny, monkeypatch):
    model, tokenizer = tiny
    calls, forward = [], LLMEngine._forward

    def failing_forward(self, chunks, sampling, *args):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the model broke")
        return forward(self, chunks, sampling, *args)

    monkeypatch.setattr(LLMEngine, "_forward", failing_forward)
    run = LLMEngine(model, version="v1", async_scheduling=True, num_gpu_blocks=32, block_size=4)
    with pytest.raises(RuntimeError, match="the model broke"):
        run.generate([tokenizer.encode(TEXTS[0])], 8)
    assert not forward_threads() and not run.batch_queue
    with pytest.raises(PagedKVError, match="make a new LLMEngine"):
        run.step()


def test_a_stuck_forward_fails_within_the_timeout(tiny, monkeypatch):
    model, tokenizer = tiny
    release, forward = threading.Event(), LLMEngine._forward

    def stuck_forward(self, chunks, sampling, *args):
        release.wait(30)
        return forward(self, chunks, sampling, *args)

    monkeypatch.setattr(engine_module, "EXECUTE_MODEL_TIMEOUT_S", 0.5)
    monkeypatch.setattr(LLMEngine, "_forward", stuck_forward)
    run = LLMEngine(model, version="v1", async_scheduling=True, num_gpu_blocks=32, block_size=4)
    stuck = []
    try:
        with pytest.raises(TimeoutError):
            run.generate([tokenizer.encode(TEXTS[0])], 4)
        stuck = forward_threads()
    finally:
        release.set()
        for thread in stuck:
            thread.join(30)
    assert not forward_threads()


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, words", [
    (dict(version="v0", async_scheduling=True), "needs the v1 engine"),
    (dict(version="v1", async_scheduling=1), "async_scheduling must be True"),
    (dict(version="v1", async_scheduling="yes"), "async_scheduling must be True"),
    (dict(version="v1", async_scheduling=None), "async_scheduling must be True"),
    (dict(version="v1", simulated_host_ms=-1), "simulated_host_ms must be a number"),
    (dict(version="v1", simulated_host_ms="5"), "simulated_host_ms must be a number"),
    (dict(version="v0", simulated_host_ms=5), "pass version='v1'"),
    (dict(version="v1", simulated_forward_ms=1001), "simulated_forward_ms must be a number"),
    (dict(version="v1", simulated_forward_ms=True), "simulated_forward_ms must be a number"),
    (dict(version="v0", simulated_forward_ms=5), "pass version='v1'"),
    (dict(version="v1", async_scheduling=True, speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
     "follows that runner.s restriction"),
])
def test_bad_async_settings_say_what_to_do(tiny, kwargs, words):
    with pytest.raises(PagedKVError, match=words):
        LLMEngine(tiny[0], num_gpu_blocks=8, block_size=4, **kwargs)


def test_bad_aborts_change_nothing(tiny):
    model, _ = tiny
    run = LLMEngine(model, version="v1", async_scheduling=True, num_gpu_blocks=8, block_size=4)
    run.add_request("a", [1, 2, 3], 2)
    for call, words in [(lambda: run.abort_request("b"), "not unfinished"),
                        (lambda: run.abort_request([1]), "request_id"),
                        (lambda: LLMEngine(model, num_gpu_blocks=8, block_size=4).abort_request("a"), "v1"),
                        (lambda: run.scheduler.finish_requests("a"), "list of request ids")]:
        with pytest.raises(PagedKVError, match=words):
            call()
    assert run.scheduler.waiting == ["a"] and list(run.scheduler.requests) == ["a"]
    assert run.generate([[4, 5]], 2) == [generate_dense(model, [4, 5], 2)]
    while run.has_unfinished_requests() or run.batch_queue:
        run.step()
    assert run.pop_finished("a").outputs[0].token_ids == generate_dense(model, [1, 2, 3], 2)
    whole(run)
