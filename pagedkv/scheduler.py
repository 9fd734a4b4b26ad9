"""Layer 9 — the scheduler: continuous batching over waiting / running / swapped queues.

Every step the scheduler decides which requests run, given the blocks the
``BlockSpaceManager`` has.  It mirrors vLLM v0's ``vllm/core/scheduler.py``
(0.6.3: queues, ``AllocStatus``, watermark, preemption by recompute or swap)
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
chooses, to compare the two.

A request is a **sequence group** (v0's ``SequenceGroup``): one sequence, whose id is the request id, or
several (``n`` samples, or beams), named ``(request_id, i)``. The group is admitted, preempted and swapped as
one, and ``max_num_seqs`` counts sequences. Its prompt is prefilled once, for ``(request_id, 0)``; the engine
then forks the sequences it needs (``fork_seq``: the children share every block) and frees the beams it drops
(``free_seq``), between ``schedule()`` and ``update()``, as v0's output processor does. A group swaps out with its
sharing kept (a block shared by k sequences moves once). A group is recomputed (mode ``recompute``, or swap with
the CPU pool full; vLLM v0 could do neither for a group, and aborted) with its sharing kept too: the prompt is
allocated once and forked, and each sequence prefills only its tokens after the last full prompt block.

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
class Sequence:
    """One sequence of a request (vLLM: ``Sequence``): its id in the block manager and its tokens so far."""

    seq_id: object
    request_id: object
    output_token_ids: list[int] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class Request:
    """One request and everything the scheduler knows about it (vLLM: ``SequenceGroup``)."""

    request_id: object
    prompt_token_ids: list[int]
    max_tokens: int
    arrival: int  # order of arrival: first come, first served
    stop_token_ids: frozenset = frozenset()  # sampling one of these finishes a sequence (the model's EOS)
    max_num_seqs: int = 1  # sequences it runs at once: n samples, or the beam width
    seqs: list[Sequence] = field(default_factory=list)  # the live ones
    done: dict = field(default_factory=dict)  # seq_id -> tokens of its finished sequences
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    counted: int = 0  # what it adds to the scheduler's count of running sequences

    @property
    def output_token_ids(self) -> list[int]:
        """The first live sequence's tokens (a single-sequence request's only ones)."""
        return self.seqs[0].output_token_ids if self.seqs else []

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_group(self) -> bool:
        return self.max_num_seqs > 1

    @property
    def num_seqs_needed(self) -> int:
        """What it counts against ``max_num_seqs``: all its sequences before the first token, then the live ones
        (vLLM v0's ``get_max_num_running_seqs``)."""
        started = any(seq.output_token_ids for seq in self.seqs) or self.done
        return len(self.seqs) if started else self.max_num_seqs


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
    recomputed_tokens: dict = field(default_factory=dict)  # a recomputed victim -> tokens it will compute again
    # A recomputed group's sequences after the first: how many leading tokens of their prefill sit in the shared
    # prompt blocks that the first sequence computes in this same step (the engine starts them there).
    shared_prefix: dict = field(default_factory=dict)

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
        self.finished: dict = {}  # request_id -> generated token ids (a group: {seq_id: token ids}), in order
        self._seqs: dict = {}  # seq_id -> Sequence, every live sequence
        self._num_running_seqs = 0  # sum of num_seqs_needed over running requests (max_num_seqs counts these)
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []  # sorted by arrival: the newest is last (the next victim)
        self._swapped: list[Request] = []  # sorted by arrival
        self._num_arrived = 0
        self._in_flight: SchedulerOutputs | None = None  # scheduled, waiting for update()
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0  # tokens prefilled again after a recompute preemption
        self.num_swapped_blocks = 0  # blocks moved out to the CPU pool
        self.num_pruned_blocks = 0  # blocks that free_seq (a dropped beam) returned to the free list
        self.pruned_block_ids: list = []  # the ones of the step in flight (cleared by schedule())

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

    def add_request(self, request_id, prompt_token_ids, max_tokens: int, stop_token_ids=(),
                    num_seqs: int = 1) -> None:
        """Queue a request at the back of ``waiting``; each of its sequences generates up to ``max_tokens``
        tokens and stops early after any of ``stop_token_ids`` (vLLM's ``stop_checker.py``). ``num_seqs`` > 1:
        a sequence group that will run that many sequences at once (n samples, or the beam width)."""
        check_hashable("request_id", request_id)
        if request_id in self.requests or request_id in self.finished or request_id in self._seqs:
            raise DuplicateSequenceError(f"request {request_id!r} was already added; use a new request_id.")
        tokens = check_token_ids("prompt_token_ids", prompt_token_ids)
        max_tokens = check_int("max_tokens", max_tokens, minimum=1)
        stop = frozenset(check_token_ids("stop_token_ids", stop_token_ids, allow_empty=True))
        num_seqs = check_int("num_seqs", num_seqs, minimum=1)
        if num_seqs > self.max_num_seqs:
            raise PagedKVValueError(f"a request of {num_seqs} sequences can never run with max_num_seqs="
                                    f"{self.max_num_seqs}; raise max_num_seqs or ask for fewer.")
        first = Sequence(request_id if num_seqs == 1 else (request_id, 0), request_id)
        request = Request(request_id, tokens, max_tokens, arrival=self._num_arrived, stop_token_ids=stop,
                          max_num_seqs=num_seqs, seqs=[first])
        self._num_arrived += 1
        self.requests[request_id] = request
        self._seqs[first.seq_id] = first
        self._waiting.append(request)

    def get_seq(self, seq_id) -> Sequence:
        """A live sequence (its tokens, its request)."""
        try:
            return self._seqs[seq_id]
        except (KeyError, TypeError):
            raise UnknownSequenceError(f"no live sequence {seq_id!r}; live ones: {list(self._seqs)[:8]}.") from None

    def fork_seq(self, parent_seq_id, child_seq_id) -> None:
        """Between ``schedule()`` and ``update()``: a new sequence of the same request, sharing every block
        and token of its parent (vLLM v0's ``fork_seq``; the manager's ``fork`` raises the ref counts)."""
        parent = self.get_seq(parent_seq_id)
        request = self.requests[parent.request_id]
        if len(request.seqs) >= request.max_num_seqs:
            raise PagedKVValueError(f"request {parent.request_id!r} already runs {len(request.seqs)} sequences, "
                                    f"its limit (num_seqs={request.max_num_seqs}).")
        if child_seq_id in self._seqs:
            raise DuplicateSequenceError(f"sequence {child_seq_id!r} exists already; pick a new id.")
        self.block_manager.fork(parent_seq_id, child_seq_id)
        child = Sequence(child_seq_id, parent.request_id, list(parent.output_token_ids))
        request.seqs.append(child)
        self._seqs[child_seq_id] = child

    def free_seq(self, seq_id) -> None:
        """Between ``schedule()`` and ``update()``: drop a live sequence (a pruned beam); its blocks are freed.
        A request left with no live sequence finishes at ``update()``."""
        seq = self.get_seq(seq_id)
        table = self.block_manager.get_block_table(seq_id)
        self.block_manager.free(seq_id)
        freed = [b for b in table if self.block_manager.refcount(b) == 0]
        self.num_pruned_blocks += len(freed)
        self.pruned_block_ids += freed
        self.requests[seq.request_id].seqs.remove(seq)
        del self._seqs[seq_id]

    def num_running_seqs(self) -> int:
        return self._num_running_seqs

    def _count_seqs(self, request: Request, running: bool = True) -> None:
        """Keep ``num_running_seqs`` right after ``request`` started, changed its sequences, or stopped running."""
        now = request.num_seqs_needed if running else 0
        self._num_running_seqs += now - request.counted
        request.counted = now

    # ---------------------------------------------------------------- one step
    def schedule(self) -> SchedulerOutputs:
        """Decide the next step: running first, then swapped back in, then waiting admitted."""
        if self._in_flight is not None:
            raise PagedKVValueError("the last step has not been reported yet: call update(outputs, next_tokens) "
                                    "with the tokens it sampled before scheduling again.")
        out = SchedulerOutputs()
        self.pruned_block_ids = []
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
        running, i = self._running, 0
        while i < len(running):
            if self._append_slots(running[i], out):  # the slot of each sequence's last sampled token
                i += 1
            else:
                self._preempt(running.pop(), out)
        out.decodes = [seq.seq_id for request in running for seq in request.seqs]
        out.num_batched_tokens += len(out.decodes)

    def _append_slots(self, request: Request, out: SchedulerOutputs) -> bool:
        """Reserve a slot for every live sequence's next token, or for none (and say so)."""
        manager = self.block_manager
        if len(request.seqs) == 1:
            seq = request.seqs[0]
            try:
                out.blocks_to_copy += manager.append_slots(seq.seq_id, seq.output_token_ids[-1:])
                return True
            except NoFreeBlocksError:  # a failed append changes nothing
                return False
        # A group appends all or nothing. Its blocks are counted first, each sequence alone (vLLM v0's
        # can_append_slots): siblings sharing a last block count a copy each, although the last of them
        # to append will find it private. A little cautious, never short.
        if sum(manager.num_blocks_to_append(seq.seq_id) for seq in request.seqs) > manager.num_free_gpu_blocks:
            return False
        for seq in request.seqs:
            out.blocks_to_copy += manager.append_slots(seq.seq_id, seq.output_token_ids[-1:])
        return True

    def _schedule_swapped(self, out: SchedulerOutputs) -> None:
        manager = self.block_manager
        while self._swapped:
            request = self._swapped[0]
            seq_ids = [seq.seq_id for seq in request.seqs]
            if request.is_group:  # its distinct blocks, and at most one more per sequence for the next token
                needed = manager.num_group_blocks(seq_ids) + len(seq_ids)
            else:
                needed = blocks_needed(request.num_tokens, manager.block_size)  # its blocks + its next token
            if needed > manager.num_total_gpu_blocks - manager.watermark_blocks:
                self._ignore(self._swapped.pop(0), out)  # it outgrew the whole GPU pool
                continue
            if (self.num_running_seqs() + len(seq_ids) > self.max_num_seqs
                    or out.num_batched_tokens + len(seq_ids) > self.max_num_batched_tokens
                    or manager.num_free_gpu_blocks - needed < manager.watermark_blocks):
                break
            self._swapped.pop(0)
            out.blocks_to_swap_in += manager.swap_in_group(seq_ids)
            self._append_slots(request, out)  # room was checked above
            out.num_batched_tokens += len(seq_ids)
            self._start_running(request)
            out.decodes += seq_ids

    def _schedule_waiting(self, out: SchedulerOutputs) -> None:
        while self._waiting:
            request = self._waiting[0]
            status, num_new = self._admission(request)
            if status is AllocStatus.NEVER or self._prefill_tokens(request) > self.max_num_batched_tokens:
                self._ignore(self._waiting.popleft(), out)
                continue
            if (status is AllocStatus.LATER or self.num_running_seqs() + request.num_seqs_needed > self.max_num_seqs
                    or out.num_batched_tokens + num_new > self.max_num_batched_tokens):
                break
            self._waiting.popleft()
            self._allocate(request, out)
            self._start_running(request)
            out.num_batched_tokens += num_new

    def _allocate(self, request: Request, out: SchedulerOutputs) -> None:
        """Blocks for a request's prefill (a recomputed request prefills its generated tokens too).

        A recomputed group keeps its sharing: the prompt is allocated once and forked, then each sequence
        appends its own tokens. The copies those appends ask for are dropped: the copied block's K/V is
        recomputed in this step anyway, by the sequence that owns the copy, from its last full prompt block on.
        """
        manager, prompt = self.block_manager, request.prompt_token_ids
        first = request.seqs[0]
        if len(request.seqs) == 1:
            tokens = prompt + first.output_token_ids
            manager.allocate(first.seq_id, tokens)
            out.prefills.append((first.seq_id, tokens))
            return
        manager.allocate(first.seq_id, prompt)
        for seq in request.seqs[1:]:
            manager.fork(first.seq_id, seq.seq_id)
        shared = len(prompt) // manager.block_size * manager.block_size  # tokens in full prompt blocks
        for seq in request.seqs:
            manager.append_slots(seq.seq_id, seq.output_token_ids)
            out.prefills.append((seq.seq_id, prompt + seq.output_token_ids))
            if seq is not first:
                out.shared_prefix[seq.seq_id] = shared

    def _admission(self, request: Request) -> tuple[AllocStatus, int]:
        """``can_allocate``'s answer for a waiting request, and how many tokens its prefill computes.

        Only prefix caching needs the token ids (cached blocks are taken for free, their tokens not
        computed); without it the count says the same, in O(1) for a request that waits many steps.
        """
        manager = self.block_manager
        if len(request.seqs) > 1:  # a recomputed group: each sequence comes back on its own blocks
            return self._group_admission(request)
        if not manager.enable_prefix_caching:
            return manager.can_allocate(request.num_tokens), request.num_tokens
        tokens = request.token_ids
        return manager.can_allocate(tokens), len(tokens) - manager.count_cached_tokens(tokens)

    def _group_admission(self, request: Request) -> tuple[AllocStatus, int]:
        """``can_allocate``'s rule for a recomputed group: its full prompt blocks once (shared), each sequence's
        other blocks on its own (no prefix-cache credit: a little cautious)."""
        manager, prompt_len = self.block_manager, len(request.prompt_token_ids)
        shared = prompt_len // manager.block_size
        needed = shared + sum(blocks_needed(prompt_len + len(s.output_token_ids), manager.block_size) - shared
                              for s in request.seqs)
        if manager.num_total_gpu_blocks - needed < manager.watermark_blocks:
            return AllocStatus.NEVER, self._prefill_tokens(request)
        ok = manager.num_free_gpu_blocks - needed >= manager.watermark_blocks
        return (AllocStatus.OK if ok else AllocStatus.LATER), self._prefill_tokens(request)

    def _prefill_tokens(self, request: Request) -> int:
        """Tokens its prefill computes: all of them for one sequence; for a recomputed group, the prompt's
        full blocks once and every sequence's tokens after them."""
        prompt_len = len(request.prompt_token_ids)
        shared = 0 if len(request.seqs) == 1 else prompt_len // self.block_manager.block_size * \
            self.block_manager.block_size
        return shared + sum(prompt_len - shared + len(seq.output_token_ids) for seq in request.seqs)

    # -------------------------------------------------------------- after a step
    def update(self, outputs: SchedulerOutputs, next_tokens: dict) -> list:
        """Record the token each scheduled request sampled; finish those with ``max_tokens`` tokens or a stop token.

        Returns the ids of the requests that finished in this step.
        """
        if outputs is not self._in_flight:
            raise PagedKVValueError("update() takes the SchedulerOutputs of the last schedule() call, once.")
        requests = list({self._seqs[s].request_id if s in self._seqs else s: None for s in outputs.scheduled})
        requests = [self.requests[r] for r in requests if r in self.requests]  # a group may have freed every seq
        live = [seq for request in requests for seq in request.seqs]
        try:  # check everything before changing anything
            sampled = [next_tokens[seq.seq_id] for seq in live]
        except KeyError:
            missing = [seq.seq_id for seq in live if seq.seq_id not in next_tokens]
            raise UnknownSequenceError(f"next_tokens has no token for sequences {missing}, which ran this step; "
                                       "pass one sampled token per live sequence of each scheduled request.") from None
        tokens = iter(check_token_ids("next_tokens", sampled, True))
        done = []
        for request in requests:
            for seq in list(request.seqs):
                token = next(tokens)
                seq.output_token_ids.append(token)
                if len(seq.output_token_ids) >= request.max_tokens or token in request.stop_token_ids:
                    self._finish_seq(request, seq)
            if not request.seqs:
                self._running.remove(request)
                self._count_seqs(request, running=False)
                self._retire(request)
                done.append(request.request_id)
            else:
                self._count_seqs(request)
        self._in_flight = None
        return done

    # ----------------------------------------------------------------- helpers
    def _start_running(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        bisect.insort(self._running, request, key=lambda r: r.arrival)
        self._count_seqs(request)

    def _preempt(self, victim: Request, out: SchedulerOutputs) -> None:
        manager, request_id = self.block_manager, victim.request_id
        seq_ids = [seq.seq_id for seq in victim.seqs]
        self._count_seqs(victim, running=False)
        mode = self.preemption_mode
        if mode is PreemptionMode.SWAP and not manager.can_swap_out_group(seq_ids):
            mode = PreemptionMode.RECOMPUTE  # the CPU pool is full (vLLM v0 would abort the engine)
            out.swap_fallbacks.append(request_id)
        if mode is PreemptionMode.SWAP:
            moved = manager.swap_out_group(seq_ids)
            out.blocks_to_swap_out += moved
            out.swapped_out.append(request_id)
            self.num_swapped_blocks += len(moved)
            victim.status = RequestStatus.SWAPPED
            bisect.insort(self._swapped, victim, key=lambda r: r.arrival)
        else:
            for seq_id in seq_ids:
                manager.free(seq_id)
            victim.status = RequestStatus.WAITING
            self._waiting.appendleft(victim)
            out.recomputed_tokens[request_id] = self._prefill_tokens(victim) - len(seq_ids)  # all but each last token
            self.num_recomputed_tokens += out.recomputed_tokens[request_id]
        victim.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(request_id)

    def _ignore(self, request: Request, out: SchedulerOutputs) -> None:
        """A request that can never fit: it finishes now with the tokens it has (``[]`` if none)."""
        for seq in list(request.seqs):
            if self.block_manager.has_seq(seq.seq_id):  # a swapped request still holds CPU blocks
                self.block_manager.free(seq.seq_id)
            request.done[seq.seq_id] = list(seq.output_token_ids)
            del self._seqs[seq.seq_id]
        request.seqs.clear()
        out.ignored.append(request.request_id)
        self._retire(request)

    def _finish_seq(self, request: Request, seq: Sequence) -> None:
        self.block_manager.free(seq.seq_id)
        request.seqs.remove(seq)
        request.done[seq.seq_id] = list(seq.output_token_ids)
        del self._seqs[seq.seq_id]

    def _retire(self, request: Request) -> None:
        request.status = RequestStatus.FINISHED
        if request.is_group:
            self.finished[request.request_id] = dict(request.done)
        else:
            self.finished[request.request_id] = next(iter(request.done.values()), [])
        del self.requests[request.request_id]

    def __repr__(self) -> str:
        return (f"Scheduler(waiting={self.waiting}, running={self.running}, swapped={self.swapped}, "
                f"finished={len(self.finished)}, preemption_mode={self.preemption_mode.value!r})")


def stand_in_model(token_ids: list[int]) -> int:
    """A stand-in for the model in the loop: the next token. The scheduler sees only counts, so any deterministic
    function of the sequence would do."""
    return (sum(token_ids) * 31 + len(token_ids)) % 1000


def _preemption_mode(mode) -> PreemptionMode:
    if isinstance(mode, PreemptionMode):
        return mode
    try:
        return PreemptionMode(mode)
    except ValueError:
        raise PagedKVValueError(f"preemption_mode must be 'recompute' or 'swap' (or a PreemptionMode), "
                                f"got {mode!r}.") from None
