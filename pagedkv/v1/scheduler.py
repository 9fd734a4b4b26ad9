"""vLLM v1's scheduler, readable: one token budget, chunked prefill, preemption by recompute only.

vLLM 0.33 does this in ``vllm/v1/core/sched/scheduler.py`` (``schedule``, ``_preempt_request``,
``update_from_output``; 3,783 lines with everything this course leaves out). There are no prefill and decode
phases: every request has ``num_computed_tokens`` and ``num_tokens``, and each step the scheduler hands out one
budget of ``max_num_batched_tokens`` so that requests catch up:

1. **running** requests first, in order: each gets ``num_tokens - num_computed_tokens`` tokens (one for a
   decode; the rest of its prompt for a long prefill), at most ``long_prefill_token_threshold`` if set (and
   more than one request was running or waiting when the step began) and at most the budget left, so a long
   prompt is **chunked** over several steps beside the others' decodes. When ``allocate_slots`` returns None,
   the **last** running request is preempted by recompute (its blocks freed, ``num_computed_tokens = 0``,
   front of ``waiting``) and the allocation is tried again;
2. then **waiting** requests in order (first come, first served), not in a step that preempted: their cached
   prefix from ``get_computed_blocks``, then a chunk of the rest, while the budget and ``max_num_seqs`` allow,
   and (``scheduler_reserve_full_isl``, on by default) only while the request's full input sequence
   (``num_tokens``) fits the free blocks: admitting it for its first chunk alone would mean preempting it a few
   steps later.

A request samples a token only in a step whose chunk reaches the end of its tokens.

**Speculative decoding** (vLLM 0.33 the same: ``num_tokens_with_spec``, ``scheduled_spec_decode_tokens``,
``update_draft_token_ids``, the rollback in ``update_from_output``): a running request's draft tokens
(``spec_token_ids``, set after the step that sampled) count as tokens to catch up, so a decode asks the budget for
``1 + k`` tokens and ``allocate_slots`` gives the drafts KV slots like any token (plus ``num_lookahead_tokens``
past them for a drafter that writes its own K/V: none for n-gram). The target verifies them in that step's forward;
``update_from_output`` receives the accepted drafts and one more token, and rolls ``num_computed_tokens`` back by
the rejected ones, whose slots the next step overwrites. The blocks stay: a request keeps the blocks its drafts
were given, and the prefix cache names a block only when ``num_tokens`` (never a draft) fills it.

Under async scheduling (``AsyncScheduler``, ``async_scheduler.py``) a request's ``num_computed_tokens`` also counts
``num_output_placeholders``: tokens a step in flight will sample, whose slots are allocated before anyone has seen
them; ``update_from_output`` resolves them, and forgets them for a request that was preempted or finished with a
step in flight (vLLM 0.33: the "stale" output of ``_preempt_request`` and ``update_from_output``). Synchronously
there is never a placeholder, and every line below does what it did before.

With a KV connector (``connector``, e.g. ``kv_connector.OffloadingConnector``), admission asks it, after the GPU
prefix hit, for more computed tokens (``get_num_new_matched_tokens``: ``num_external_computed_tokens``); a request
whose tokens arrive asynchronously gets its blocks and waits in ``WAITING_FOR_REMOTE_KVS`` (in a queue of requests
holding blocks, served before ``waiting``) until the load lands. The hooks are called where 0.33 calls them
(``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` lists them).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from ..errors import DuplicateSequenceError, PagedKVValueError
from ..sampling import SamplingParams
from ..validate import check_hashable, check_int, check_token_ids
from .kv_cache_manager import KVCacheManager
from .kv_connector.base import KVConnectorBase_V1
from .spec_decode.metrics import SpecDecodingStats


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, to be recomputed
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"  # holds its blocks while a KV connector loads into them
    FINISHED = "finished"
    FINISHED_ABORTED = "finished_aborted"  # finish_requests: the caller gave up on it (vLLM: abort_request)


@dataclass(eq=False)
class Request:
    """One request (vLLM: ``vllm/v1/request.py``): its tokens and how many of them have K/V in the cache."""

    request_id: object
    prompt_token_ids: list[int]
    max_tokens: int
    stop_token_ids: frozenset = frozenset()
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at its (last) admission
    # async scheduling (vLLM 0.33's names, vllm/v1/request.py): tokens of steps in flight, counted in
    # num_computed_tokens before their outputs are processed ...
    num_in_flight_tokens: int = 0
    # ... of which sampled tokens nobody has seen yet (their slots are allocated; AsyncScheduler sets them)
    num_output_placeholders: int = 0
    # tokens in flight when the request was preempted: their output is appended (num_tokens grows), but changes
    # neither num_computed_tokens nor num_output_placeholders (the preemption reset them)
    num_stale_output_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)  # draft tokens to verify in its next step
    is_prefill_chunk: bool = False  # its last scheduled chunk stopped short of its tokens (samples nothing)
    shared_prefix_boundary: int = 0  # end of a prefix shared with an earlier request, set at each lookup; 0: none

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """Its tokens and its drafts: what ``num_computed_tokens`` catches up to in a step."""
        return self.num_tokens + len(self.spec_token_ids)


@dataclass
class SchedulerOutput:
    """What one step runs: how many tokens of each request (vLLM: ``vllm/v1/core/sched/output.py``)."""

    num_scheduled_tokens: dict = field(default_factory=dict)  # request_id -> tokens this step, in batch order
    scheduled_new_reqs: list = field(default_factory=list)  # admitted from waiting this step
    scheduled_running_reqs: list = field(default_factory=list)  # were running already
    preempted_req_ids: list = field(default_factory=list)
    scheduled_spec_decode_tokens: dict = field(default_factory=dict)  # request_id -> draft tokens to verify
    finished_req_ids: set = field(default_factory=set)  # finished since the last step (for the KV connector)
    kv_connector_metadata: object = None  # the connector's plan for this step's loads and stores

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


class Scheduler:
    """One token budget over ``running`` then ``waiting``, on a :class:`KVCacheManager`."""

    def __init__(self, kv_cache_manager: KVCacheManager, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 long_prefill_token_threshold: int = 0, scheduler_reserve_full_isl: bool = True,
                 num_spec_tokens: int = 0, num_lookahead_tokens: int = 0,
                 connector: KVConnectorBase_V1 | None = None):
        """``scheduler_reserve_full_isl`` (vLLM 0.33's ``SchedulerConfig`` setting, on by default): admit a
        waiting or preempted request only if its full input sequence (``num_tokens``) fits the free blocks, not just
        its first chunk
        ("prevents over-admission and KV cache thrashing with chunked prefill").
        ``num_spec_tokens``: the most drafts a request verifies per step (0: no speculation);
        ``num_lookahead_tokens``: slots reserved past the scheduled tokens for a drafter's own K/V (vLLM's
        ``VllmConfig.num_lookahead_tokens``; 0 for n-gram);
        ``connector``: a scheduler-side KV connector, or None."""
        if not isinstance(kv_cache_manager, KVCacheManager):
            raise PagedKVValueError(f"kv_cache_manager must be a pagedkv.v1.KVCacheManager, got "
                                    f"{type(kv_cache_manager).__name__}.")
        self.kv_cache_manager = kv_cache_manager
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, minimum=1)
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens, minimum=1)
        self.long_prefill_token_threshold = check_int("long_prefill_token_threshold", long_prefill_token_threshold,
                                                      minimum=0)
        if not isinstance(scheduler_reserve_full_isl, bool):
            raise PagedKVValueError(f"scheduler_reserve_full_isl must be True (admit a request only if its whole "
                                    f"sequence fits, vLLM's default) or False, got {scheduler_reserve_full_isl!r}.")
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl
        self.num_spec_tokens = check_int("num_spec_tokens", num_spec_tokens, minimum=0)
        self.num_lookahead_tokens = check_int("num_lookahead_tokens", num_lookahead_tokens, minimum=0)
        self.spec_decoding_stats = SpecDecodingStats.new(self.num_spec_tokens)  # every draft verified so far
        if connector is not None and not isinstance(connector, KVConnectorBase_V1):
            raise PagedKVValueError(f"connector must be a pagedkv.v1.kv_connector.KVConnectorBase_V1 (scheduler role) "
                                    f"or None, got {type(connector).__name__}.")
        self.connector = connector
        if connector is not None:
            connector.bind_kv_cache_manager(kv_cache_manager)
        self.requests: dict = {}  # request_id -> Request, every unfinished one
        self.finished: dict = {}  # request_id -> its output token ids, in finishing order
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._kv_holding_waiting: deque[Request] = deque()  # waiting requests that hold blocks (a KV load)
        self._inflight_prefills: set = set()  # admitted, prefill not done: their blocks are promised
        self.finished_req_ids: set = set()
        self.finished_recving_kv_req_ids: set = set()
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0  # computed tokens thrown away by preemptions (computed again later)
        self.num_stale_tokens_delivered = 0  # async: tokens of a step in flight at a preemption, still appended
        self.num_external_computed_tokens = 0  # tokens a KV connector's loads supplied (not computed here)

    @property
    def prefix_cache_retention_interval(self) -> int | None:
        """Its manager's setting (``KVCacheManager(..., prefix_cache_retention_interval=0)``): vLLM's scheduler
        builds its manager from the cache config; this one is handed its manager, so the setting lives there."""
        return self.kv_cache_manager.prefix_cache_retention_interval

    @property
    def waiting(self) -> list:
        return [r.request_id for r in (*self._kv_holding_waiting, *self._waiting)]

    @property
    def running(self) -> list:
        return [r.request_id for r in self._running]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def has_requests(self) -> bool:
        """Unfinished requests, or a KV connector with work left (finished requests' stores, copies in flight): the
        engine keeps stepping until it is done (vLLM 0.33: ``Scheduler.has_requests``)."""
        return self.has_unfinished_requests() or (self.connector is not None and (
            bool(self.finished_req_ids) or self.connector.has_pending_push_work()))

    def add_request(self, request_id, prompt_token_ids, params, stop_token_ids=()) -> None:
        """Queue a request at the back of ``waiting``. ``params``: an int ``max_tokens``, or ``SamplingParams``
        with ``n == 1`` (the engine fans ``n > 1`` out into child requests first); sampling any of
        ``stop_token_ids`` (or the params') finishes it."""
        check_hashable("request_id", request_id)
        if request_id in self.requests or request_id in self.finished:
            raise DuplicateSequenceError(f"request {request_id!r} was already added; use a new request_id.")
        tokens = check_token_ids("prompt_token_ids", prompt_token_ids)
        if isinstance(params, SamplingParams):
            if params.n != 1:
                raise PagedKVValueError(f"the v1 scheduler runs one sequence per request, got n={params.n}; "
                                        "LLMEngine(version='v1') fans n > 1 out into child requests.")
            max_tokens, stop = params.max_tokens, set(params.stop_token_ids)
        else:
            max_tokens, stop = check_int("max_tokens", params, minimum=1), set()
        stop |= set(check_token_ids("stop_token_ids", stop_token_ids, allow_empty=True))
        request = Request(request_id, tokens, max_tokens, frozenset(stop))
        self.requests[request_id] = request
        self._waiting.append(request)
        if self.connector is not None:
            self.connector.on_new_request(request)

    # ---------------------------------------------------------------- one step
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        threshold = self._long_prefill_threshold()
        budget = self._schedule_running(out, self.max_num_batched_tokens, threshold)
        if not out.preempted_req_ids:  # vLLM admits nobody in a step that had to preempt
            self._schedule_waiting(out, budget, threshold)
        out.finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        if self.connector is not None:  # plan the step's loads and stores, before the counts below move
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        self._update_after_schedule(out)
        return out

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        """Count the step's tokens as computed now, so the next ``schedule()`` may hand out the tokens after them
        before this step has run (vLLM 0.33: ``Scheduler._update_after_schedule``)."""
        for request_id, num_tokens in out.num_scheduled_tokens.items():
            request = self.requests[request_id]
            request.num_computed_tokens += num_tokens
            request.num_in_flight_tokens += num_tokens
            if request.num_computed_tokens >= request.num_tokens:
                self._inflight_prefills.discard(request)
            request.is_prefill_chunk = request.num_computed_tokens < (request.num_tokens
                                                                      + request.num_output_placeholders)

    def _long_prefill_threshold(self) -> int:
        """This step's cap on a chunk: ``long_prefill_token_threshold``, or 0 (none) when at most one request is
        running or waiting as the step begins, since a lone request starves nobody (vLLM 0.33: the start of
        ``Scheduler.schedule``)."""
        num_waiting = len(self._waiting) + len(self._kv_holding_waiting)
        return self.long_prefill_token_threshold if len(self._running) + num_waiting > 1 else 0

    @staticmethod
    def _chunk(request: Request, num_computed: int, budget: int, threshold: int) -> int:
        """How many of the request's uncomputed tokens fit this step."""
        # placeholders: tokens a step in flight samples (async scheduling)
        num_new = request.num_tokens_with_spec + request.num_output_placeholders - num_computed
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget)

    def _schedule_running(self, out: SchedulerOutput, budget: int, threshold: int) -> int:
        i = 0
        while i < len(self._running) and budget > 0:
            request = self._running[i]
            if (request.num_output_placeholders > 0 and request.num_computed_tokens + 2
                    - request.num_output_placeholders >= len(request.prompt_token_ids) + request.max_tokens):
                i += 1  # async: the step in flight samples its last token (max_tokens); schedule no extra step
                continue
            num_new = self._chunk(request, request.num_computed_tokens, budget, threshold)
            while self.kv_cache_manager.allocate_slots(request, num_new,
                                                       num_lookahead_tokens=self.num_lookahead_tokens) is None:
                victim = self._running.pop()  # FCFS: the latest arrival goes first
                self._preempt(victim, out)
                if victim is request:
                    break
            else:
                out.num_scheduled_tokens[request.request_id] = num_new
                out.scheduled_running_reqs.append(request.request_id)
                budget -= num_new
                i += 1
                if request.spec_token_ids:  # the drafts that fit the chunk (the budget may cut some)
                    num_scheduled_spec_tokens = (num_new + request.num_computed_tokens - request.num_tokens
                                                 - request.num_output_placeholders)
                    if num_scheduled_spec_tokens > 0:
                        out.scheduled_spec_decode_tokens[request.request_id] = \
                            request.spec_token_ids[:num_scheduled_spec_tokens]
                    request.spec_token_ids = []  # new ones come from update_draft_token_ids after the step
                continue
            break  # the request itself was preempted: nobody after it runs either
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int) -> None:
        """Admit waiting requests, those holding blocks first; a request that cannot go yet for a reason of its own
        (its load has not landed, the connector cannot answer yet) is skipped, keeping its place."""
        skipped: dict = {id(self._kv_holding_waiting): [], id(self._waiting): []}
        while budget > 0 and len(self._running) < self.max_num_seqs:
            queue = self._kv_holding_waiting or self._waiting
            if not queue:
                break
            request = queue[0]
            if not self._handle_blocked_waiting_request(request):
                self._skip_request(queue, skipped)
                continue
            num_external, load_kv_async = 0, False
            if request.num_computed_tokens == 0:  # the GPU prefix cache first, then the connector beyond it
                hits, num_local = self.kv_cache_manager.get_computed_blocks(request)
                if self.connector is not None:
                    num_external, load_kv_async = self.connector.get_num_new_matched_tokens(request, num_local)
                    if num_external is None:  # it cannot tell yet: ask again next step
                        self._skip_request(queue, skipped)
                        continue
                request.num_cached_tokens = num_local
            else:  # its load landed: the blocks and their tokens are its own already
                hits, num_local = None, 0
            num_computed = request.num_computed_tokens + num_local + num_external
            num_new = 0 if load_kv_async else self._chunk(request, num_computed, budget, threshold)
            # an asynchronous load holds its blocks without progress: it must leave the in-flight prefills theirs
            reserved = self._inflight_prefill_reserved_blocks() if load_kv_async else 0
            if self.kv_cache_manager.allocate_slots(request, num_new, num_local, hits,
                                                    num_lookahead_tokens=self.num_lookahead_tokens,
                                                    full_sequence_must_fit=self.scheduler_reserve_full_isl,
                                                    num_external_computed_tokens=num_external,
                                                    delay_cache_blocks=load_kv_async,
                                                    reserved_blocks=reserved) is None:
                break
            if self.connector is not None:
                self.connector.update_state_after_alloc(request, self.kv_cache_manager.get_block_ids(
                    request.request_id), num_external)
            if load_kv_async:  # counted as computed now; not scheduled until the load lands
                request.status, request.num_computed_tokens = RequestStatus.WAITING_FOR_REMOTE_KVS, num_computed
                self._inflight_prefills.add(request)
                self._skip_request(queue, skipped)
                continue
            queue.popleft()
            request.status, request.num_computed_tokens = RequestStatus.RUNNING, num_computed
            self._running.append(request)
            out.num_scheduled_tokens[request.request_id] = num_new
            out.scheduled_new_reqs.append(request.request_id)
            budget -= num_new
            if num_computed + num_new < request.num_tokens:
                self._inflight_prefills.add(request)
        for queue in (self._kv_holding_waiting, self._waiting):  # the skipped ones back in front, in order
            queue.extendleft(reversed(skipped[id(queue)]))

    def _skip_request(self, queue: deque, skipped: dict) -> None:
        request = queue.popleft()
        holds_blocks = request.num_computed_tokens > 0 or request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
        skipped[id(self._kv_holding_waiting if holds_blocks else self._waiting)].append(request)

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        """False while its asynchronous load is in flight; once it landed, the loaded blocks are cached and the
        request is waiting (or preempted) again, with its loaded tokens computed (vLLM:
        ``_update_waiting_for_remote_kv``: a load of the whole sequence still recomputes its last token)."""
        if request.status is not RequestStatus.WAITING_FOR_REMOTE_KVS:
            return True
        if request.request_id not in self.finished_recving_kv_req_ids:
            return False
        self.finished_recving_kv_req_ids.remove(request.request_id)
        self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens -= 1
        self.num_external_computed_tokens += request.num_computed_tokens - request.num_cached_tokens
        request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        return True

    def _inflight_prefill_reserved_blocks(self) -> int:
        """Blocks the admitted, unfinished prefills still need to hold their full sequences."""
        kv = self.kv_cache_manager
        return sum(kv.coordinator.get_num_blocks_to_allocate(r.request_id, r.num_tokens,
                                                             tuple([] for _ in kv.kv_cache_groups),
                                                             r.num_computed_tokens, kv.max_admission_blocks)
                   for r in self._inflight_prefills)

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Recompute: free its blocks, forget its computed tokens, put it at the front of ``waiting``."""
        self.kv_cache_manager.free(request)
        self._inflight_prefills.discard(request)
        self.num_recomputed_tokens += request.num_computed_tokens
        request.status, request.num_computed_tokens = RequestStatus.PREEMPTED, 0
        request.spec_token_ids = []
        # async: the output of a step in flight is stale; it is appended to the output, but changes neither
        # num_computed_tokens nor num_output_placeholders (vLLM 0.33: "must not mutate the reset counters")
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(request)
        out.preempted_req_ids.append(request.request_id)
        out.num_scheduled_tokens.pop(request.request_id, None)
        out.scheduled_spec_decode_tokens.pop(request.request_id, None)
        for queue in (out.scheduled_running_reqs, out.scheduled_new_reqs):
            if request.request_id in queue:
                queue.remove(request.request_id)

    def sampling_request_ids(self, out: SchedulerOutput) -> list:
        """The scheduled requests whose chunk reaches the end of their tokens: they sample this step. Ask right
        after ``schedule()`` (under async scheduling the next ``schedule()`` comes before this step's output)."""
        return [r for r in out.num_scheduled_tokens if not self.requests[r].is_prefill_chunk]

    def update_from_output(self, out: SchedulerOutput, sampled: dict, kv_connector_output=None) -> list:
        """Append each sampled token (a request that verified drafts: its list, the accepted drafts and one more);
        roll ``num_computed_tokens`` back by the rejected drafts; finish requests that hit ``max_tokens`` or a
        stop token (tokens after it are dropped). Returns the request ids finished in this step.

        ``sampled``: request id -> token(s), for the requests that sampled (a prefill chunk samples nothing). Under
        async scheduling the output may be stale (vLLM 0.33's ``update_from_output``): a request finished or aborted
        while the step ran gets nothing; one preempted while it ran still gets its tokens (real ones: the step read
        the blocks before anyone reused them), appended to the output, but changing neither ``num_computed_tokens`` nor
        ``num_output_placeholders``; otherwise the tokens resolve placeholders
        (rejected drafts too). With speculation or async placeholders, the blocks full within the (rolled back)
        ``num_computed_tokens``, less the tokens still in flight, are then cached (``cache_blocks``): with drafts
        accepted, a block they completed is named now, not at the next ``allocate_slots``. A stop among the new
        tokens drops those after it, from ``num_computed_tokens`` too, as vLLM does.
        ``kv_connector_output``: what the KV connector's worker side finished (loads landed, stores done)."""
        done = []
        for request_id, num_tokens in out.num_scheduled_tokens.items():
            request = self.requests.get(request_id)
            if request is None:  # finished or aborted while this step ran (async): its output is dropped
                continue
            request.num_in_flight_tokens -= num_tokens
            is_stale = request.num_stale_output_tokens > 0  # preempted while this step ran (async)
            if is_stale:
                request.num_stale_output_tokens -= num_tokens
            if request_id not in sampled:  # a prefill chunk that stops short of the end
                continue
            new_token_ids = sampled[request_id]
            new_token_ids = [new_token_ids] if isinstance(new_token_ids, int) else list(new_token_ids)
            draft = out.scheduled_spec_decode_tokens.get(request_id)
            if draft:  # vLLM: num_rejected = num_draft_tokens - num_accepted; their slots are written again
                num_accepted = len(new_token_ids) - 1
                if not is_stale:  # a stale count predates the preemption, which reset the counters already
                    request.num_computed_tokens -= len(draft) - num_accepted
                    if request.num_output_placeholders > 0:  # async: the rejected drafts were placeholders
                        request.num_output_placeholders -= len(draft) - num_accepted
                self.spec_decoding_stats.observe_draft(len(draft), num_accepted)
            has_output_placeholders = request.num_output_placeholders > 0
            status_before_stop = request.status
            stopped = False
            for num_new, token in enumerate(new_token_ids, 1):
                request.output_token_ids.append(token)
                self.num_stale_tokens_delivered += is_stale
                stopped = len(request.output_token_ids) >= request.max_tokens or token in request.stop_token_ids
                if stopped:
                    if not is_stale:  # vLLM: num_computed_tokens covers every kept token but the last one
                        request.num_computed_tokens -= len(new_token_ids) - num_new
                    break
            if not is_stale and has_output_placeholders:  # async: the placeholders are tokens now
                request.num_output_placeholders -= len(new_token_ids)  # those cut after a stop too
            if (not is_stale and status_before_stop == RequestStatus.RUNNING
                    and (has_output_placeholders or self.num_spec_tokens > 0)):
                # vLLM 0.33: name the blocks now full of verified K/V (with speculation, accepted drafts' blocks)
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens - request.num_in_flight_tokens)
            if stopped:
                self._remove_from_queue(request)
                self._free_request(request, RequestStatus.FINISHED)
                self.finished[request_id] = list(request.output_token_ids)
                done.append(request_id)
        if kv_connector_output is not None:  # vLLM: _update_from_kv_xfer_finished
            self.connector.update_connector_output(kv_connector_output)
            self.finished_recving_kv_req_ids |= kv_connector_output.finished_recving
        return done

    def update_draft_token_ids(self, draft_token_ids: dict) -> None:
        """Give each running request its new drafts (``{request_id: tokens}``), to verify in its next step;
        finished requests and those still in a prefill chunk get none (vLLM: ``update_draft_token_ids``)."""
        for request_id, spec_token_ids in draft_token_ids.items():
            request = self.requests.get(request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue
            if request.is_prefill_chunk:  # it sampled nothing this step: no drafts
                request.spec_token_ids = []
                continue
            request.spec_token_ids = list(spec_token_ids)[:self.num_spec_tokens]

    def _free_request(self, request: Request, status: RequestStatus) -> None:
        """Its blocks back to the pool, at once, even with a step in flight that reads them: that step runs before
        any later one can write them (vLLM 0.33: ``_free_request``); a KV connector hears of it first
        (``_connector_finished``)."""
        if self.connector is not None:
            self.connector.request_finished(request, self.kv_cache_manager.get_block_ids(request.request_id))
            self.finished_req_ids.add(request.request_id)
        self._inflight_prefills.discard(request)
        self.kv_cache_manager.free(request)
        request.status = status
        del self.requests[request.request_id]

    def finish_requests(self, request_ids, finished_status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> list:
        """Finish requests from outside, e.g. a client that went away (vLLM 0.33: ``Scheduler.finish_requests``,
        behind ``abort_request``). ``request_ids``: a list; ids not unfinished are skipped. Their blocks are freed
        now, even with a step in flight for them; that step's output for them is dropped. Returns the ids finished."""
        if not isinstance(request_ids, (list, set, frozenset)):
            raise PagedKVValueError(f"request_ids must be a list of request ids, got {request_ids!r}.")
        if finished_status not in (RequestStatus.FINISHED, RequestStatus.FINISHED_ABORTED):
            raise PagedKVValueError(f"finished_status must be a finished RequestStatus, got {finished_status!r}.")
        for request_id in request_ids:
            check_hashable("request_ids[...]", request_id)
        valid = [self.requests[r] for r in dict.fromkeys(request_ids) if r in self.requests]
        for request in valid:
            self._remove_from_queue(request)
            self._free_request(request, finished_status)
        return [r.request_id for r in valid]

    def _remove_from_queue(self, request: Request) -> None:
        for queue in (self._running, self._waiting, self._kv_holding_waiting):
            if request in queue:
                queue.remove(request)
                return

    def finish_ignored(self, request_id) -> None:
        """Finish a waiting request that can never fit, with the tokens it has (the engine warns)."""
        request = self.requests.pop(request_id)
        self._waiting.remove(request)
        request.status = RequestStatus.FINISHED
        self.finished[request_id] = list(request.output_token_ids)

    def __repr__(self) -> str:
        return (f"v1.{type(self).__name__}(running={self.running}, waiting={self.waiting}, "
                f"budget={self.max_num_batched_tokens}, preemptions={self.num_preemptions})")
