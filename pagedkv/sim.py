"""Layer 9 — a serving-loop simulator: where does KV memory go under each allocation policy?

Requests wait in a queue, are admitted first come first served while memory
allows, store their prompt, then decode one token per step until done.  The
KV budget is a number of token slots.  Four policies share the loop:

* ``reserve_max``: at admission, a contiguous chunk for the model's maximum length;
* ``reserve_pow2``: a contiguous chunk of the next power of two of the request's final length;
* ``oracle``: a contiguous chunk of exactly prompt + true output length;
* ``paged``: blocks from pagedkv's own ``BlockSpaceManager``, one more whenever the last is full
  (with vLLM's preemption: the newest request is evicted and recomputed when a block is missing).

The contiguous policies use a first-fit allocator over slot addresses, so
external fragmentation (free memory in holes too small to use) happens, it is
not assumed.  This reproduces Fig. 2 of the vLLM paper (Kwon et al., SOSP 2023):
token states are 20.4% / 26.8% / 38.2% of KV memory for Orca with max / pow2 /
oracle reservation, and 96.3% for vLLM.

Every slot of the budget is, at every step, exactly one of: a stored token
(**token_states**), reserved for a token the request will still produce
(**reservation**), reserved or in a block but never to be used
(**internal_fragmentation**), or free (**external_fragmentation**: while
requests are waiting, free memory is memory they cannot use).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from .errors import NoFreeBlocksError, PagedKVValueError
from .manager import AllocStatus, BlockSpaceManager
from .sizing import blocks_needed

POLICIES = ("reserve_max", "reserve_pow2", "oracle", "paged")
PARTS = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation")
# Mean prompt / output lengths of the paper's datasets, and the log-normal spread we give them.
WORKLOADS = {"sharegpt": (161.31, 337.99, 0.9), "alpaca": (19.31, 58.45, 0.6)}
# OPT-13B on an A100-40GB: about 12 GB left for KV cache at 800 KB a token.
PAPER_BUDGET_TOKENS = 15_700


def synthetic_lengths(workload: str, num_requests: int, seed: int = 0, max_len: int = 2048) -> list[tuple]:
    """``(prompt_len, output_len)`` pairs with the dataset's mean lengths.

    Log-normal (right-skewed, long-tailed, like both datasets' real lengths)
    with sigma 0.9 for ShareGPT conversations and 0.6 for Alpaca's short
    instructions; each request's total is capped at ``max_len``.
    """
    if workload not in WORKLOADS:
        raise PagedKVValueError(f"unknown workload {workload!r}; use one of {sorted(WORKLOADS)} or pass lengths=.")
    mean_in, mean_out, sigma = WORKLOADS[workload]
    rng = np.random.default_rng(seed)

    def draw(mean):
        mu = math.log(mean) - sigma**2 / 2  # makes the log-normal's mean equal `mean`
        return np.maximum(1, rng.lognormal(mu, sigma, num_requests).round().astype(int))

    prompts, outputs = np.minimum(draw(mean_in), max_len - 1), draw(mean_out)
    outputs = np.minimum(outputs, max_len - prompts)
    return list(zip(prompts.tolist(), outputs.tolist()))


class FirstFit:
    """Contiguous allocation of slot ranges: the first hole big enough wins."""

    def __init__(self, size: int):
        self.holes = [(0, size)]  # (start, length), sorted by start, never adjacent

    def allocate(self, length: int) -> int | None:
        for i, (start, size) in enumerate(self.holes):
            if size >= length:
                self.holes[i:i + 1] = [(start + length, size - length)] if size > length else []
                return start
        return None

    def free(self, start: int, length: int) -> None:
        holes = self.holes
        i = next((k for k, (s, _) in enumerate(holes) if s > start), len(holes))
        holes.insert(i, (start, length))
        if i + 1 < len(holes) and start + length == holes[i + 1][0]:  # merge with the next hole
            holes[i] = (start, length + holes[i + 1][1])
            del holes[i + 1]
        if i > 0 and holes[i - 1][0] + holes[i - 1][1] == start:  # and with the previous one
            holes[i - 1] = (holes[i - 1][0], holes[i - 1][1] + holes[i][1])
            del holes[i]


@dataclass
class _Request:
    rid: int
    prompt_len: int
    output_len: int
    generated: int = 0
    start: int = -1  # contiguous policies: first slot of the reserved chunk
    chunk: int = 0  # contiguous policies: reserved slots
    admitted_at: int = 0

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.output_len

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.generated


@dataclass
class SimResult:
    policy: str
    workload: str
    budget_tokens: int
    breakdown: dict  # time-averaged fractions while saturated, keyed by PARTS
    peak: dict  # the step with the most token states: its fractions
    mean_running: float  # requests decoding at once, averaged while saturated
    finished_per_1000_steps: float
    steps: int
    preemptions: int = 0
    history: list = field(default_factory=list)  # per-step (step, running, token_states fraction)


class _Policy:
    def __init__(self, budget: int, max_len: int):
        self.budget, self.max_len = budget, max_len


class _Contiguous(_Policy):
    def __init__(self, budget, max_len, chunk_of):
        super().__init__(budget, max_len)
        self.space, self.chunk_of = FirstFit(budget), chunk_of

    def admit(self, r: _Request) -> bool:
        chunk = min(self.chunk_of(r), self.max_len)
        start = self.space.allocate(chunk)
        if start is None:
            return False
        r.start, r.chunk = start, chunk
        return True

    def grow(self, r: _Request) -> bool:
        return True  # the chunk already covers every token the request will produce

    def release(self, r: _Request) -> None:
        self.space.free(r.start, r.chunk)

    def parts(self, running) -> tuple:
        tokens = sum(r.num_tokens for r in running)
        future = sum(r.final_len - r.num_tokens for r in running)
        never = sum(r.chunk - r.final_len for r in running)
        return tokens, future, never


class _Paged(_Policy):
    """Blocks from BlockSpaceManager; the manager is synced whenever a request needs a new block."""

    def __init__(self, budget, max_len, block_size):
        super().__init__(budget, max_len)
        self.block_size = block_size
        self.manager = BlockSpaceManager(block_size, budget // block_size, watermark=0.01)
        self.synced: dict = {}  # rid -> tokens the manager knows about

    def admit(self, r: _Request) -> bool:
        if self.manager.can_allocate(r.num_tokens) is not AllocStatus.OK:
            return False
        self.manager.allocate(r.rid, [0] * r.num_tokens)
        self.synced[r.rid] = r.num_tokens
        return True

    def grow(self, r: _Request) -> bool:
        """Room for the request's newest token; False if no block is free (the caller preempts)."""
        capacity = blocks_needed(self.synced[r.rid], self.block_size) * self.block_size
        if r.num_tokens <= capacity:
            return True  # still inside the last block: nothing to ask the manager
        try:
            self.manager.append_slots(r.rid, [0] * (r.num_tokens - self.synced[r.rid]))
        except NoFreeBlocksError:
            return False
        self.synced[r.rid] = r.num_tokens
        return True

    def release(self, r: _Request) -> None:
        self.manager.free(r.rid)
        del self.synced[r.rid]

    def parts(self, running) -> tuple:
        tokens = sum(r.num_tokens for r in running)
        used_slots = (self.manager.num_total_gpu_blocks - self.manager.num_free_gpu_blocks) * self.block_size
        unused = used_slots - tokens  # empty slots in last blocks; part will be filled, part never
        future = sum(min(r.final_len, blocks_needed(r.num_tokens, self.block_size) * self.block_size) - r.num_tokens
                     for r in running)
        return tokens, future, unused - future


def _make_policy(policy: str, budget: int, max_len: int, block_size: int) -> _Policy:
    if policy == "reserve_max":
        return _Contiguous(budget, max_len, lambda r: max_len)
    if policy == "reserve_pow2":
        return _Contiguous(budget, max_len, lambda r: 1 << (r.final_len - 1).bit_length())
    if policy == "oracle":
        return _Contiguous(budget, max_len, lambda r: r.final_len)
    if policy == "paged":
        return _Paged(budget, max_len, block_size)
    raise PagedKVValueError(f"unknown policy {policy!r}; use one of {POLICIES}.")


def simulate(policy: str, workload: str = "sharegpt", seed: int = 0, *, num_requests: int = 1000,
             budget_tokens: int = PAPER_BUDGET_TOKENS, block_size: int = 16, max_len: int = 2048,
             lengths=None, progress: bool | None = None, record_history: bool = False) -> SimResult:
    """Run the serving loop until every request is done; measure while requests are waiting."""
    pairs = list(lengths) if lengths is not None else synthetic_lengths(workload, num_requests, seed, max_len)
    if any(p < 1 or o < 0 or p + o > max_len for p, o in pairs):
        raise PagedKVValueError(f"every request needs prompt_len >= 1 and prompt_len + output_len <= max_len "
                                f"({max_len}).")
    if max_len > budget_tokens:
        raise PagedKVValueError(f"budget_tokens ({budget_tokens}) must hold at least one max_len ({max_len}) "
                                "request.")
    mem = _make_policy(policy, budget_tokens, max_len, block_size)
    waiting = deque(_Request(i, p, o) for i, (p, o) in enumerate(pairs))
    running: list[_Request] = []
    sums = dict.fromkeys(PARTS, 0.0)
    peak, saturated_steps, running_sum, finished, preemptions, step = None, 0, 0, 0, 0, 0
    finished_while_saturated, history = 0, []
    bar = tqdm(total=len(pairs), desc=f"{policy} on {workload}", delay=1.0, disable=progress is False,
               leave=False)
    while waiting or running:
        while waiting and mem.admit(waiting[0]):  # first come, first served: no overtaking
            r = waiting.popleft()
            r.admitted_at = step
            running.append(r)
        saturated = bool(waiting)
        preempted = set()
        for r in list(running):  # one decode step: each running request produces a token
            if r.generated == r.output_len or r.rid in preempted:
                continue
            r.generated += 1
            while not mem.grow(r):  # paged only: evict the newest request, it will be recomputed
                victim = max(running, key=lambda x: x.admitted_at)
                mem.release(victim)
                running.remove(victim)
                victim.prompt_len, victim.output_len = victim.num_tokens, victim.output_len - victim.generated
                victim.generated = 0
                waiting.appendleft(victim)
                preempted.add(victim.rid)
                preemptions += 1
                if victim is r:
                    break
        if saturated:
            tokens, future, never = mem.parts(running)
            fractions = (tokens / mem.budget, future / mem.budget, never / mem.budget)
            fractions += (1 - sum(fractions),)
            for part, value in zip(PARTS, fractions):
                sums[part] += value
            if peak is None or fractions[0] > peak[PARTS[0]]:
                peak = dict(zip(PARTS, fractions))
            saturated_steps += 1
            running_sum += len(running)
        if record_history:
            history.append((step, len(running), mem.parts(running)[0] / mem.budget))
        for r in [r for r in running if r.generated == r.output_len]:
            mem.release(r)
            running.remove(r)
            finished += 1
            finished_while_saturated += saturated
            bar.update()
        step += 1
    bar.close()
    n = max(saturated_steps, 1)
    return SimResult(policy, workload if lengths is None else "custom", budget_tokens,
                     {part: sums[part] / n for part in PARTS}, peak or dict.fromkeys(PARTS, 0.0),
                     running_sum / n, 1000 * finished_while_saturated / n, step, preemptions, history)


def memory_breakdown(policy: str, workload: str = "sharegpt", seed: int = 0, **kwargs) -> dict:
    """Fractions of the KV budget (time-averaged while saturated) under the four PARTS keys; they sum to 1."""
    return simulate(policy, workload, seed, **kwargs).breakdown


def max_concurrent_requests(policy: str, budget_tokens: int = PAPER_BUDGET_TOKENS, request_len: int = 500,
                            block_size: int = 16, max_len: int = 2048) -> int:
    """How many requests of ``request_len`` final tokens fit at once in the budget under ``policy``."""
    per_request = {"reserve_max": max_len, "reserve_pow2": 1 << (request_len - 1).bit_length(),
                   "oracle": request_len, "paged": blocks_needed(request_len, block_size) * block_size}
    if policy not in per_request:
        raise PagedKVValueError(f"unknown policy {policy!r}; use one of {POLICIES}.")
    return budget_tokens // per_request[policy]
