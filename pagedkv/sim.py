"""Layer 10 — a serving-loop simulator: where does KV memory go under each allocation policy?

Requests wait in a queue, are admitted first come first served while memory
allows, store their prompt, then decode one token per step until done.  The
KV budget is a number of token slots.  The policies share the loop:

* ``reserve_max``: at admission, a contiguous chunk for the model's maximum length;
* ``reserve_pow2``: a contiguous chunk of the next power of two of the request's final length;
* ``reserve_pow2_output``: the prompt plus the next power of two of the output, the vLLM paper's Orca (Pow2)
  rule ("over-reserves the space for outputs by at most 2x", §6.1);
* ``oracle``: a contiguous chunk of exactly prompt + true output length;
* ``paged``: blocks from pagedkv's own ``BlockSpaceManager``, one more whenever the last is full
  (with vLLM's preemption: the newest request is evicted and recomputed when a block is missing);
* ``paged_v1``: the same blocks under vLLM today's scheduler (``pagedkv.v1``: one token budget, prompts
  chunked when it runs out, recompute only; prefix caching off, as the paper measured).

The contiguous policies place chunks over slot addresses, so external
fragmentation (free memory in holes too small to use) happens, it is not
assumed: first fit by default (``FirstFit``), or ``allocator="buddy"``
(``Buddy``), the binary buddy allocator the vLLM paper (Kwon et al., SOSP 2023)
assumes its Orca baselines use (§6.1), which rounds every chunk up to a power
of two.  Against the paper's Fig. 2 (token states 20.4% / 26.8% / 38.2% of KV
memory for Orca with max / pow2 / oracle reservation, 96.3% for vLLM), the
ordering and the max bar come out under either allocator; Orca's pow2 and
oracle bars come within a few points of the paper's (over it) only with the
paper's own baselines, the buddy allocator and ``reserve_pow2_output``: under
first fit they waste much less than the paper's (notebook 02, section 3).

Every slot of the budget is, at every step, exactly one of: a stored token
(**token_states**), reserved for a token the request will still produce
(**reservation**), reserved or in a block but never to be used
(**internal_fragmentation**, a buddy block's rounding included), or free
(**external_fragmentation**: while requests are waiting, free memory is memory
they cannot use).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from .errors import PagedKVValueError
from .manager import BlockSpaceManager
from .scheduler import Scheduler
from .sizing import blocks_needed
from .validate import check_choice, check_int

POLICIES = ("reserve_max", "reserve_pow2", "reserve_pow2_output", "oracle", "paged", "paged_v1")
ALLOCATORS = ("first_fit", "buddy")  # how the contiguous policies place their chunks
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
    if not isinstance(workload, str) or workload not in WORKLOADS:
        raise PagedKVValueError(f"unknown workload {workload!r}; use one of {sorted(WORKLOADS)} or pass lengths=.")
    check_int("num_requests", num_requests, minimum=0)
    check_int("seed", seed, minimum=0)
    check_int("max_len", max_len, minimum=2)  # room for a prompt token and an output token
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

    @staticmethod
    def held(length: int) -> int:
        """The slots a chunk of ``length`` takes: exactly its length."""
        return length

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


class Buddy:
    """A binary buddy allocator, as the vLLM paper assumes its Orca baselines place KV memory (§6.1).

    A chunk is rounded up to a power of two and placed in the smallest free block that holds it, the lowest
    address first; a bigger block is halved until it fits, its upper halves left free. A freed block merges with
    its buddy (the other half of the block it was split from) for as long as that is free. A budget that is not a
    power of two starts as its binary digits, lowest address the largest: 15,700 = 8,192 + 4,096 + 2,048 + 1,024
    + 256 + 64 + 16 + 4 (a block never merges past its part: the next part up is always smaller).
    """

    def __init__(self, size: int):
        self.free_blocks = {}  # start -> size, of every free block
        start = 0
        for bit in reversed(range(size.bit_length())):
            if size >> bit & 1:
                self.free_blocks[start] = 1 << bit
                start += 1 << bit

    @staticmethod
    def held(length: int) -> int:
        """The slots a chunk of ``length`` takes: the next power of two."""
        return 1 << (length - 1).bit_length()

    @property
    def holes(self) -> list[tuple[int, int]]:
        """(start, length) of the free blocks, sorted by start, as ``FirstFit.holes``."""
        return sorted(self.free_blocks.items())

    def allocate(self, length: int) -> int | None:
        size = self.held(length)
        fits = [(block, start) for start, block in self.free_blocks.items() if block >= size]
        if not fits:
            return None
        block, start = min(fits)
        del self.free_blocks[start]
        while block > size:  # halve it: keep the lower half, free the upper one
            block //= 2
            self.free_blocks[start + block] = block
        return start

    def free(self, start: int, length: int) -> None:
        size = self.held(length)
        while self.free_blocks.get(start ^ size) == size:  # its buddy is free: the two halves merge
            del self.free_blocks[start ^ size]
            start &= ~size
            size *= 2
        self.free_blocks[start] = size


@dataclass
class SimResult:
    policy: str
    workload: str
    budget_tokens: int
    breakdown: dict  # time-averaged fractions while saturated, keyed by PARTS
    peak: dict  # the step with the most token states: its fractions
    mean_running: float  # requests decoding at once, time-averaged while saturated
    finished_per_1000_steps: float  # requests finished per 1,000 decode-step times, while saturated
    steps: int  # scheduler steps
    preemptions: int = 0
    recomputed_tokens: int = 0  # tokens prefilled again after a recompute preemption
    swapped_blocks: int = 0  # blocks copied out to the CPU pool by swap preemptions
    time: float = 0.0  # the run's length in decode-step times (CostModel)
    history: list = field(default_factory=list)  # per step: (step, running, token_states share, start time)
    saturated_time: float = 0.0  # decode-step times with requests waiting: what breakdown averages over
    saturated_until: float = 0.0  # when the last step with requests waiting ended (none wait after it)
    # Of external_fragmentation, the share from steps where the next waiting request would fit in the free slots
    # taken together but in no single hole: fragmentation proper. The rest is free memory too small in total
    # (a remainder: 15,700 slots hold 7 chunks of 2,048 and 1,364 slots more). Contiguous policies only; 0 for paged.
    external_in_holes: float = 0.0
    # Of internal_fragmentation, the share of the budget (time-averaged while saturated) that is a buddy block's
    # rounding: the slots past the chunk a request asked for. 0 under first fit and for paged.
    rounding: float = 0.0


@dataclass(frozen=True)
class CostModel:
    """What a step costs, from rough figures for OPT-13B on an A100-40GB: a stated model, not a measurement.

    * a **decode step** reads every weight once (26 GB at about 1.5 TB/s, plus the KV cache): ~30 ms;
    * a **prefill** is compute-bound: ~2 x 13e9 FLOP a token at ~220 TFLOP/s, ~0.12 ms a token, so a
      recompute preemption costs its victim's tokens again;
    * a **swap** copies each block of each layer's K and of V with its own ``cudaMemcpyAsync``
      (~10 us of overhead each, as vLLM's ``swap_blocks`` does) and moves the bytes over PCIe 4.0 x16
      (~25 GB/s): small blocks mean many small copies, which is why swap loses at small block sizes
      (the vLLM paper's Fig. 19).

    The simulator counts time in decode steps: a step lasts ``1 + (prefill + swap ms) / decode_step_ms``.
    """

    decode_step_ms: float = 30.0
    prefill_ms_per_token: float = 0.12
    pcie_bytes_per_ms: float = 25e6
    copy_overhead_ms: float = 0.01
    kv_bytes_per_token: int = 819_200  # OPT-13B in fp16 (notebook 01)
    num_layers: int = 40

    def recompute_ms(self, num_tokens: int) -> float:
        return num_tokens * self.prefill_ms_per_token

    def swap_ms(self, num_tokens: int, block_size: int) -> float:
        """One direction (out, or in) for ``num_tokens`` tokens held in blocks of ``block_size``."""
        copies = blocks_needed(num_tokens, block_size) * 2 * self.num_layers  # K and V, every layer
        return copies * self.copy_overhead_ms + num_tokens * self.kv_bytes_per_token / self.pcie_bytes_per_ms

    def step_time(self, prefill_tokens: int = 0, swapped_blocks: int = 0, block_size: int = 16) -> float:
        extra = self.recompute_ms(prefill_tokens) + (self.swap_ms(swapped_blocks * block_size, block_size)
                                                     if swapped_blocks else 0.0)
        return 1.0 + extra / self.decode_step_ms


@dataclass
class _Step:
    """What one serving step looks like to the meter."""

    saturated: bool  # requests were waiting (or swapped out) during this step
    running: int
    parts: tuple  # slots holding (token states, reservation, never used) over the running requests
    time: float  # the step's duration in decode-step times
    finished: int
    held_back_by_holes: bool = False  # the next waiting request fits the free slots in total, but no single hole
    rounding: int = 0  # of the slots never used, those a buddy block holds past the chunk asked for
    preemptions: int = 0  # running totals so far (paged only)
    recomputed_tokens: int = 0
    swapped_blocks: int = 0


def _serve_contiguous(pairs, budget: int, max_len: int, chunk_of, cost: CostModel, allocator: str):
    """Orca-style serving: a request holds one contiguous chunk from admission to its end. Yields _Step."""
    space = FirstFit(budget) if allocator == "first_fit" else Buddy(budget)
    waiting = deque(pairs)
    running = []  # [start, chunk, held, prompt_len, output_len, generated]
    while waiting or running:
        prefill_tokens, held_back_by_holes = 0, False
        while waiting:  # first come, first served: no overtaking
            prompt_len, output_len = waiting[0]
            chunk = min(chunk_of(prompt_len, output_len), max_len)
            start = space.allocate(chunk)
            if start is None:
                held_back_by_holes = sum(size for _, size in space.holes) >= space.held(chunk)
                break
            waiting.popleft()
            running.append([start, chunk, space.held(chunk), prompt_len, output_len, 0])
            prefill_tokens += prompt_len
        for r in running:
            r[5] += 1  # every running request produces a token
        tokens = sum(r[3] + r[5] for r in running)
        future = sum(r[4] - r[5] for r in running)
        never = sum(r[2] - r[3] - r[4] for r in running)
        rounding = sum(r[2] - r[1] for r in running)
        done = [r for r in running if r[5] == r[4]]
        for r in done:
            space.free(r[0], r[1])
            running.remove(r)
        yield _Step(bool(waiting), len(running) + len(done), (tokens, future, never),
                    cost.step_time(prefill_tokens), len(done), held_back_by_holes, rounding=rounding)


def _serve_paged(pairs, budget: int, max_len: int, block_size: int, cost: CostModel, preemption_mode: str,
                 watermark: float):
    """vLLM-style serving: pagedkv's Scheduler over a BlockSpaceManager, one step at a time. Yields _Step."""
    manager = BlockSpaceManager(block_size, budget // block_size, num_cpu_blocks=budget // block_size,
                                watermark=watermark)
    # No caps but memory: each running request holds a block, and a step may prefill the whole budget.
    max_num_seqs = max(1, manager.num_total_gpu_blocks)
    scheduler = Scheduler(manager, max_num_seqs, max_num_batched_tokens=max(max_len, budget, max_num_seqs),
                          preemption_mode=preemption_mode)
    for rid, (prompt_len, output_len) in enumerate(pairs):
        scheduler.add_request(rid, [0] * prompt_len, output_len)
    final_len = [prompt_len + output_len for prompt_len, output_len in pairs]  # indexed by request id
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        if out.ignored:
            raise PagedKVValueError(f"requests {out.ignored} can never fit in {budget} token slots; give the "
                                    "simulator a bigger budget_tokens or shorter requests.")
        running, requests = scheduler.running, scheduler.requests
        tokens = filled = 0  # stored tokens; and the slots of their blocks that will hold a token one day
        for request_id in running:
            n = requests[request_id].num_tokens
            tokens += n
            block_end, final = n + (-n) % block_size, final_len[request_id]
            filled += block_end if block_end < final else final  # min(), without the call: the hot loop
        future = filled - tokens
        used = (manager.num_total_gpu_blocks - manager.num_free_gpu_blocks) * block_size
        prefill_tokens = out.num_batched_tokens - len(out.decodes)
        swapped_blocks = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
        saturated = len(requests) > len(running)  # someone is waiting or swapped out
        finished = len(scheduler.update(out, dict.fromkeys(out.scheduled, 0)))
        yield _Step(saturated, len(running), (tokens, future, used - tokens - future),
                    cost.step_time(prefill_tokens, swapped_blocks, block_size), finished,
                    preemptions=scheduler.num_preemptions, recomputed_tokens=scheduler.num_recomputed_tokens,
                    swapped_blocks=scheduler.num_swapped_blocks)


def _serve_paged_v1(pairs, budget: int, max_len: int, block_size: int, cost: CostModel, max_num_batched_tokens):
    """vLLM v1-style serving: ``pagedkv.v1``'s Scheduler over a KVCacheManager. Yields _Step."""
    from .v1 import KVCacheManager
    from .v1 import Scheduler as V1Scheduler

    manager = KVCacheManager(block_size, budget // block_size, enable_caching=False)
    scheduler = V1Scheduler(manager, max(1, manager.num_gpu_blocks),
                            max_num_batched_tokens or max(max_len, budget, manager.num_gpu_blocks))
    for rid, (prompt_len, output_len) in enumerate(pairs):
        scheduler.add_request(rid, [0] * prompt_len, output_len)
    final_len = [prompt_len + output_len for prompt_len, output_len in pairs]
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        if out.is_empty and not scheduler.running:
            raise PagedKVValueError(f"request {scheduler.waiting[0]} can never fit in {budget} token slots; give the "
                                    "simulator a bigger budget_tokens or shorter requests.")
        requests = scheduler.requests
        tokens = filled = 0  # tokens with K/V this step; slots of their blocks that will hold a token one day
        for request_id in scheduler.running:
            n = requests[request_id].num_computed_tokens
            tokens += n
            block_end, final = n + (-n) % block_size, final_len[request_id]
            filled += block_end if block_end < final else final
        used = (manager.num_gpu_blocks - manager.num_free_blocks) * block_size
        sampling = scheduler.sampling_request_ids(out)
        decodes = sum(1 for r in sampling if out.num_scheduled_tokens[r] == 1 and requests[r].output_token_ids)
        saturated = len(requests) > len(scheduler.running)
        running = len(scheduler.running)
        finished = len(scheduler.update_from_output(out, dict.fromkeys(sampling, 0)))
        yield _Step(saturated, running, (tokens, filled - tokens, used - filled),
                    cost.step_time(out.total_num_scheduled_tokens - decodes), finished,
                    preemptions=scheduler.num_preemptions, recomputed_tokens=scheduler.num_recomputed_tokens)


def simulate(policy: str, workload: str = "sharegpt", seed: int = 0, *, num_requests: int = 1000,
             budget_tokens: int = PAPER_BUDGET_TOKENS, block_size: int = 16, max_len: int = 2048,
             lengths=None, progress: bool | None = None, record_history: bool = False,
             preemption_mode: str = "recompute", watermark: float = 0.01, cost: CostModel = CostModel(),
             max_num_batched_tokens: int | None = None, allocator: str = "first_fit") -> SimResult:
    """Serve every request; measure memory while requests are waiting, weighting each step by its duration.

    ``max_num_batched_tokens`` (``paged_v1`` only): v1's token budget; by default one that never chunks.
    ``allocator`` (contiguous policies only): ``"first_fit"`` or ``"buddy"``, how chunks are placed."""
    check_choice("policy", policy, POLICIES)
    check_choice("allocator", allocator, ALLOCATORS)
    if policy in ("paged", "paged_v1") and allocator != "first_fit":
        raise PagedKVValueError(f"allocator= places contiguous chunks; {policy!r} hands out blocks, so leave it out.")
    for name, value in (("budget_tokens", budget_tokens), ("block_size", block_size), ("max_len", max_len),
                        ("num_requests", num_requests)):
        check_int(name, value, minimum=1)
    pairs = _pairs(lengths) if lengths is not None else synthetic_lengths(workload, num_requests, seed, max_len)
    if any(p < 1 or o < 1 or p + o > max_len for p, o in pairs):
        raise PagedKVValueError(f"every request needs prompt_len >= 1, output_len >= 1 and prompt_len + output_len "
                                f"<= max_len ({max_len}).")
    if max_len > budget_tokens:
        raise PagedKVValueError(f"budget_tokens ({budget_tokens}) must hold at least one max_len ({max_len}) "
                                "request.")
    if max_num_batched_tokens is not None:
        check_int("max_num_batched_tokens", max_num_batched_tokens, minimum=1)
    if policy == "paged":
        steps = _serve_paged(pairs, budget_tokens, max_len, block_size, cost, preemption_mode, watermark)
    elif policy == "paged_v1":
        steps = _serve_paged_v1(pairs, budget_tokens, max_len, block_size, cost, max_num_batched_tokens)
    else:
        steps = _serve_contiguous(pairs, budget_tokens, max_len,
                                  lambda prompt, output: chunk_slots(policy, prompt, output, max_len), cost, allocator)

    sums = dict.fromkeys(PARTS, 0.0)
    peak, saturated_time, running_time, finished_while_saturated, total_time = None, 0.0, 0.0, 0, 0.0
    external_in_holes, saturated_until, rounding = 0.0, 0.0, 0.0
    history, num_steps, step = [], 0, None
    bar = tqdm(total=len(pairs), desc=f"{policy} on {workload}", delay=1.0, disable=progress is False, leave=False)
    for step in steps:
        fractions = tuple(part / budget_tokens for part in step.parts)
        fractions += (1 - sum(fractions),)  # the rest is free: external fragmentation while anyone waits
        if step.saturated:
            for part, value in zip(PARTS, fractions):
                sums[part] += value * step.time
            if peak is None or fractions[0] > peak[PARTS[0]]:
                peak = dict(zip(PARTS, fractions))
            saturated_time += step.time
            running_time += step.running * step.time
            finished_while_saturated += step.finished
            saturated_until = total_time + step.time
            if step.held_back_by_holes:
                external_in_holes += fractions[3] * step.time
            rounding += step.rounding / budget_tokens * step.time
        if record_history:
            history.append((num_steps, step.running, fractions[0], total_time))
        total_time += step.time
        num_steps += 1
        bar.update(step.finished)
    bar.close()
    if saturated_time == 0:
        raise PagedKVValueError(f"the server was never saturated (every request fit at once), so there is no "
                                f"waste to measure; use more requests or a smaller budget_tokens ({budget_tokens}).")
    external = sums["external_fragmentation"]
    return SimResult(policy, workload if lengths is None else "custom", budget_tokens,
                     {part: sums[part] / saturated_time for part in PARTS}, peak, running_time / saturated_time,
                     1000 * finished_while_saturated / saturated_time, num_steps, step.preemptions,
                     step.recomputed_tokens, step.swapped_blocks, total_time, history, saturated_time,
                     saturated_until, external_in_holes / external if external > 0 else 0.0,
                     rounding / saturated_time)


def chunk_slots(policy: str, prompt_len: int, output_len: int, max_len: int = 2048) -> int:
    """The contiguous chunk a request asks for under a contiguous ``policy``, capped at ``max_len`` (the allocator
    may hold more: ``Buddy.held``)."""
    if policy == "reserve_max":
        return max_len
    if policy == "reserve_pow2":
        return min(1 << (prompt_len + output_len - 1).bit_length(), max_len)
    if policy == "reserve_pow2_output":
        return min(prompt_len + (1 << (output_len - 1).bit_length()), max_len)
    check_choice("policy", policy, ("reserve_max", "reserve_pow2", "reserve_pow2_output", "oracle"))
    return min(prompt_len + output_len, max_len)


def _pairs(lengths) -> list[tuple[int, int]]:
    """``lengths`` as a list of ``(prompt_len, output_len)`` int pairs."""
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise PagedKVValueError(f"lengths must be a list of (prompt_len, output_len) pairs, got {lengths!r}.")
    pairs = []
    for pair in lengths:
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise PagedKVValueError(f"each entry of lengths is (prompt_len, output_len), got {pair!r}.")
        pairs.append((check_int("prompt_len", pair[0]), check_int("output_len", pair[1])))
    return pairs


def memory_breakdown(policy: str, workload: str = "sharegpt", seed: int = 0, **kwargs) -> dict:
    """Fractions of the KV budget (time-averaged while saturated) under the four PARTS keys; they sum to 1."""
    return simulate(policy, workload, seed, **kwargs).breakdown


def max_concurrent_requests(policy: str, budget_tokens: int = PAPER_BUDGET_TOKENS, request_len: int = 500,
                            block_size: int = 16, max_len: int = 2048) -> int:
    """How many requests of ``request_len`` final tokens fit at once in the budget under ``policy`` (not
    ``reserve_pow2_output``, whose chunk depends on the prompt's share of the length), placed first fit."""
    for name, value in (("budget_tokens", budget_tokens), ("request_len", request_len), ("block_size", block_size),
                        ("max_len", max_len)):
        check_int(name, value, minimum=1)
    if request_len > max_len:
        raise PagedKVValueError(f"request_len ({request_len}) is longer than max_len ({max_len}).")
    per_request = {"reserve_max": max_len, "reserve_pow2": 1 << (request_len - 1).bit_length(),
                   "oracle": request_len, "paged": blocks_needed(request_len, block_size) * block_size,
                   "paged_v1": blocks_needed(request_len, block_size) * block_size}
    return budget_tokens // per_request[check_choice("policy", policy, tuple(per_request))]
