"""Layer 9 — the scheduler: continuous batching over waiting / running / swapped queues.

Every step the scheduler decides which requests run, given the blocks the
``BlockSpaceManager`` has.  It mirrors vLLM v0's ``vllm/core/scheduler.py``
(v0.5.x: queues, ``AllocStatus``, watermark, preemption by recompute or swap)
with the brevity of nano-vllm's ``nanovllm/engine/scheduler.py``.  One step:

1. **running** requests first, oldest first: reserve a slot for the token each
   sampled last step (``append_slots``).  With no free block, preempt the most
   recently arrived running request, and repeat (the loop has vLLM v1's shape:
   try to append, preempt when that fails);
2. then **swapped** requests back in, oldest first (not in a step that preempted);
3. then **waiting** requests admitted first come, first served while
   ``can_allocate`` says OK and the budgets allow (not in a step that preempted,
   nor while a swapped request still waits to come back).

Preemption by *recompute* frees the victim's blocks and puts it at the front of
``waiting``: later its prompt *and* generated tokens are prefilled again.
Preemption by *swap* copies its blocks to the CPU pool; it comes back later with
nothing to recompute.  vLLM v0 recomputes single-sequence requests and swaps only
multi-sequence groups (beam search); vLLM v1 only recomputes.  Here the caller
chooses, to compare the two.  One request is one sequence (n = 1).

Prefills and decodes share one batch under the token budget, in the order of
v0's chunked-prefill scheduler (``_schedule_chunked_prefill``) and of v1's;
v0's default scheduler instead runs a step of prefills *or* a step of decodes,
admitting waiting requests first.

The scheduler never touches K/V data: the copies it asks for travel in
``SchedulerOutputs`` (``blocks_to_swap_in`` / ``_out`` / ``_copy``) for the engine to do.
"""

from __future__ import annotations

import bisect
import enum
from collections import deque
from dataclasses import dataclass, field

from .errors import DuplicateSequenceError, NoFreeBlocksError, PagedKVValueError, UnknownSequenceError
from .manager import AllocStatus, BlockSpaceManager
from .sizing import blocks_needed
from .validate import check_hashable, check_int, check_token_ids


class PreemptionMode(enum.Enum):
    """How a running request gives its blocks back (vLLM: ``PreemptionMode`` in ``core/scheduler.py``)."""

    RECOMPUTE = "recompute"  # free the blocks; prefill prompt + generated tokens again later
    SWAP = "swap"  # copy the blocks to the CPU pool; copy them back later


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Request:
    """One request and everything the scheduler knows about it (vLLM: ``Sequence`` + ``SequenceGroup``)."""

    request_id: object
    prompt_token_ids: list[int]
    max_tokens: int
    arrival: int  # order of arrival: first come, first served
    stop_token_ids: frozenset = frozenset()  # sampling one of these finishes the request (the model's EOS)
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclass
class SchedulerOutputs:
    """What one step runs, and the block copies the engine must do before running it."""

    prefills: list = field(default_factory=list)  # (request_id, token ids whose K/V the model computes)
    decodes: list = field(default_factory=list)  # request ids; one token each, slot already reserved
    preempted: list = field(default_factory=list)  # request ids preempted this step (either mode)
    ignored: list = field(default_factory=list)  # request ids that can never run; finished as they are
    blocks_to_swap_in: list = field(default_factory=list)  # (cpu_block, gpu_block)
    blocks_to_swap_out: list = field(default_factory=list)  # (gpu_block, cpu_block)
    blocks_to_copy: list = field(default_factory=list)  # (src, dst) copy-on-write copies
    num_batched_tokens: int = 0  # prefill tokens not served from the prefix cache, plus decodes
    swapped_out: list = field(default_factory=list)  # the preempted requests that went to the CPU pool
    swap_fallbacks: list = field(default_factory=list)  # swap wanted, CPU pool full: recomputed instead

    @property
    def scheduled(self) -> list:
        """The requests that produce a token this step: every prefill, then every decode."""
        return [request_id for request_id, _ in self.prefills] + self.decodes

    @property
    def is_empty(self) -> bool:
        return not (self.prefills or self.decodes)


class Scheduler:
    """Continuous batching with preemption, over one :class:`BlockSpaceManager`."""

    def __init__(self, block_manager: BlockSpaceManager, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, preemption_mode="recompute"):
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, minimum=1)
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens, minimum=1)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise PagedKVValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs}): "
                "every running request decodes one token per step (vLLM's SchedulerConfig has the same rule).")
        self.preemption_mode = _preemption_mode(preemption_mode)
        if not isinstance(block_manager, BlockSpaceManager):
            raise PagedKVValueError(f"block_manager must be a BlockSpaceManager, got {type(block_manager).__name__}.")
        self.block_manager = block_manager
        self.requests: dict = {}  # request_id -> Request, every unfinished request
        self.finished: dict = {}  # request_id -> generated token ids, in order of finishing
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []  # sorted by arrival: the newest is last (the next victim)
        self._swapped: list[Request] = []  # sorted by arrival
        self._num_arrived = 0
        self._in_flight: SchedulerOutputs | None = None  # scheduled, waiting for update()
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0  # tokens prefilled again after a recompute preemption
        self.num_swapped_blocks = 0  # blocks moved out to the CPU pool

    # ------------------------------------------------------------------ queues
    @property
    def waiting(self) -> list:
        return [r.request_id for r in self._waiting]

    @property
    def running(self) -> list:
        return [r.request_id for r in self._running]

    @property
    def swapped(self) -> list:
        return [r.request_id for r in self._swapped]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def add_request(self, request_id, prompt_token_ids, max_tokens: int, stop_token_ids=()) -> None:
        """Queue a request at the back of ``waiting``; it generates up to ``max_tokens`` tokens, and stops early
        after any of ``stop_token_ids`` (vLLM's ``vllm/engine/output_processor/stop_checker.py``)."""
        check_hashable("request_id", request_id)
        if request_id in self.requests or request_id in self.finished:
            raise DuplicateSequenceError(f"request {request_id!r} was already added; use a new request_id.")
        tokens = check_token_ids("prompt_token_ids", prompt_token_ids)
        max_tokens = check_int("max_tokens", max_tokens, minimum=1)
        stop = frozenset(check_token_ids("stop_token_ids", stop_token_ids, allow_empty=True))
        request = Request(request_id, tokens, max_tokens, arrival=self._num_arrived, stop_token_ids=stop)
        self._num_arrived += 1
        self.requests[request_id] = request
        self._waiting.append(request)

    # ---------------------------------------------------------------- one step
    def schedule(self) -> SchedulerOutputs:
        """Decide the next step: running first, then swapped back in, then waiting admitted."""
        if self._in_flight is not None:
            raise PagedKVValueError("the last step has not been reported yet: call update(outputs, next_tokens) "
                                    "with the tokens it sampled before scheduling again.")
        out = SchedulerOutputs()
        self._schedule_running(out)
        if not out.preempted:  # a step that had to preempt has no room to bring anyone in
            self._schedule_swapped(out)
            if not self._swapped:  # first come, first served: swapped requests arrived earlier
                self._schedule_waiting(out)
        self._in_flight = out
        return out

    def _schedule_running(self, out: SchedulerOutputs) -> None:
        """Reserve a slot for each running request's next token, oldest first.

        When no block is free, preempt the most recently arrived request (the last of ``running``) and try
        again; if that was the request itself, the loop ends.  vLLM v1's ``schedule()`` has the same loop.
        """
        running, manager, i = self._running, self.block_manager, 0
        while i < len(running):
            request = running[i]
            try:  # the slot of the token sampled last step; its K/V is computed this step
                out.blocks_to_copy += manager.append_slots(request.request_id, request.output_token_ids[-1:])
                i += 1
            except NoFreeBlocksError:  # a failed append changes nothing
                self._preempt(running.pop(), out)
        out.decodes = [request.request_id for request in running]
        out.num_batched_tokens += len(running)

    def _schedule_swapped(self, out: SchedulerOutputs) -> None:
        manager = self.block_manager
        while self._swapped:
            request = self._swapped[0]
            needed = blocks_needed(request.num_tokens, manager.block_size)  # its blocks + its next token
            if needed > manager.num_total_gpu_blocks - manager.watermark_blocks:
                self._ignore(self._swapped.pop(0), out)  # it outgrew the whole GPU pool
                continue
            if (len(self._running) >= self.max_num_seqs or out.num_batched_tokens + 1 > self.max_num_batched_tokens
                    or manager.num_free_gpu_blocks - needed < manager.watermark_blocks):
                break
            self._swapped.pop(0)
            out.blocks_to_swap_in += manager.swap_in(request.request_id)
            out.blocks_to_copy += manager.append_slots(request.request_id, request.output_token_ids[-1:])
            out.num_batched_tokens += 1
            self._start_running(request)
            out.decodes.append(request.request_id)

    def _schedule_waiting(self, out: SchedulerOutputs) -> None:
        manager = self.block_manager
        while self._waiting:
            request = self._waiting[0]
            status, num_new = self._admission(request)
            if status is AllocStatus.NEVER or request.num_tokens > self.max_num_batched_tokens:
                self._ignore(self._waiting.popleft(), out)
                continue
            if (status is AllocStatus.LATER or len(self._running) >= self.max_num_seqs
                    or out.num_batched_tokens + num_new > self.max_num_batched_tokens):
                break
            self._waiting.popleft()
            tokens = request.token_ids  # a recomputed request prefills its generated tokens too
            manager.allocate(request.request_id, tokens)
            self._start_running(request)
            out.prefills.append((request.request_id, tokens))
            out.num_batched_tokens += num_new

    def _admission(self, request: Request) -> tuple[AllocStatus, int]:
        """``can_allocate``'s answer for a waiting request, and how many tokens its prefill computes.

        Only prefix caching needs the token ids (cached blocks are taken for free, their tokens not
        computed); without it the count says the same, in O(1) for a request that waits many steps.
        """
        manager = self.block_manager
        if not manager.enable_prefix_caching:
            return manager.can_allocate(request.num_tokens), request.num_tokens
        tokens = request.token_ids
        return manager.can_allocate(tokens), len(tokens) - manager.count_cached_tokens(tokens)

    # -------------------------------------------------------------- after a step
    def update(self, outputs: SchedulerOutputs, next_tokens: dict) -> list:
        """Record the token each scheduled request sampled; finish those with ``max_tokens`` tokens or a stop token.

        Returns the ids of the requests that finished in this step.
        """
        if outputs is not self._in_flight:
            raise PagedKVValueError("update() takes the SchedulerOutputs of the last schedule() call, once.")
        scheduled = outputs.scheduled
        try:  # check everything before changing anything
            sampled = [next_tokens[request_id] for request_id in scheduled]
        except KeyError:
            missing = [request_id for request_id in scheduled if request_id not in next_tokens]
            raise UnknownSequenceError(f"next_tokens has no token for requests {missing}, which ran this step; "
                                       "pass one sampled token per scheduled request.") from None
        tokens = check_token_ids("next_tokens", sampled, True)
        done = []
        for request_id, token in zip(scheduled, tokens):
            request = self.requests[request_id]
            request.output_token_ids.append(token)
            if len(request.output_token_ids) >= request.max_tokens or token in request.stop_token_ids:
                self._finish(request)
                done.append(request_id)
        self._in_flight = None
        return done

    # ----------------------------------------------------------------- helpers
    def _start_running(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        bisect.insort(self._running, request, key=lambda r: r.arrival)

    def _preempt(self, victim: Request, out: SchedulerOutputs) -> None:
        manager, request_id = self.block_manager, victim.request_id
        mode = self.preemption_mode
        if mode is PreemptionMode.SWAP and not manager.can_swap_out(request_id):
            mode = PreemptionMode.RECOMPUTE  # the CPU pool is full (vLLM v0 would abort the request)
            out.swap_fallbacks.append(request_id)
        if mode is PreemptionMode.SWAP:
            moved = manager.swap_out(request_id)
            out.blocks_to_swap_out += moved
            out.swapped_out.append(request_id)
            self.num_swapped_blocks += len(moved)
            victim.status = RequestStatus.SWAPPED
            bisect.insort(self._swapped, victim, key=lambda r: r.arrival)
        else:
            manager.free(request_id)
            victim.status = RequestStatus.WAITING
            self._waiting.appendleft(victim)
            self.num_recomputed_tokens += victim.num_tokens - 1  # all but the last token had K/V
        victim.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(request_id)

    def _ignore(self, request: Request, out: SchedulerOutputs) -> None:
        """A request that can never fit: it finishes now with the tokens it has (``[]`` if none)."""
        if self.block_manager.has_seq(request.request_id):  # a swapped request still holds CPU blocks
            self.block_manager.free(request.request_id)
        out.ignored.append(request.request_id)
        self._retire(request)

    def _finish(self, request: Request) -> None:
        self.block_manager.free(request.request_id)
        self._running.remove(request)
        self._retire(request)

    def _retire(self, request: Request) -> None:
        request.status = RequestStatus.FINISHED
        self.finished[request.request_id] = list(request.output_token_ids)
        del self.requests[request.request_id]

    def __repr__(self) -> str:
        return (f"Scheduler(waiting={self.waiting}, running={self.running}, swapped={self.swapped}, "
                f"finished={len(self.finished)}, preemption_mode={self.preemption_mode.value!r})")


def _preemption_mode(mode) -> PreemptionMode:
    if isinstance(mode, PreemptionMode):
        return mode
    try:
        return PreemptionMode(mode)
    except ValueError:
        raise PagedKVValueError(f"preemption_mode must be 'recompute' or 'swap' (or a PreemptionMode), "
                                f"got {mode!r}.") from None
