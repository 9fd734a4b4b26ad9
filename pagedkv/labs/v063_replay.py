"""vLLM 0.6.3's default scheduler (``_schedule_default``) on its default block manager (v2), replayed on block counts.

A small, separate model for notebook 09's E3: how 0.6.3 would schedule a workload of its own, step by step. It
keeps only the rules such a workload meets: requests of one sequence each, no prefix caching, no chunked prefill,
no LoRA, no priorities, no speculative decoding, and no asynchronous output processing (the default on CUDA; with
it a finished request frees its blocks a step later). The rules, from ``vllm/core/scheduler.py`` (S),
``core/block_manager_v2.py`` (M) and ``core/block/block_table.py`` (T) of 0.6.3:

* A step (S ``_schedule_default``): if nobody is swapped out, admit waiting prompts first come, first served
  (``_schedule_prefills``). Only if it admitted nobody: the running requests (``_schedule_running``), then, if that
  preempted nobody, the swapped ones (``_schedule_swapped``). Afterwards ``waiting.extendleft(preempted)``, the
  admitted, decoded and swapped-in requests join ``running`` at its tail in that order, and the swapped-out ones
  join ``swapped`` at its tail (``self.swapped.extend``).
* Admission (M ``can_allocate``): blocks for every token; ``NEVER`` if the whole pool minus them is under the
  watermark (the request is ignored), ``LATER`` (stop) if the free blocks minus them are.
* A running request's next token (M ``can_append_slots``, the "worst-case heuristic"): every block the append
  touches counts as a new one. For one unseen token T ``get_num_blocks_touched_by_append_slots`` is 1 whatever
  the last block's fill, so the request needs one free block even when its token fits in its own last block.
  No watermark. When it fails, the request at the tail of the unprocessed running queue is preempted
  (``running_queue.pop()``), or the request itself if nobody is left, and the check is made again.
* Preemption mode (S ``_preempt``): the one forced (``--preemption-mode``), else recompute for a group of one
  running sequence, swap for several. Swap out (M ``_can_swap`` on the CPU, no watermark; S ``_swap_out`` raises
  ``RuntimeError`` if the CPU pool is short) moves all the request's blocks; recompute frees them and the request
  prefills all its tokens again.
* Swap in (M ``can_swap_in`` -> ``_can_swap`` on the GPU): the blocks the newest token's append touches plus the
  request's full blocks (so its blocks, and one more only when its last block is full), against the free blocks
  minus the watermark; ``LATER`` stops the queue. The request then gets its newest token's slot and decodes in the
  same step.
* The budget (S ``SchedulingBudget``): ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens, checked on
  admission and swap-in.

Every scheduled request samples one token; one that has ``max_tokens`` of them finishes and frees its blocks before
the next step. ``exact_append=True`` replaces the worst-case rule by the exact count (a new block only when the last
one is full), as pagedkv's ``can_append_slots`` counts, for a comparison.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


@dataclass
class _Request:
    name: str
    num_tokens: int  # token ids, the newest sampled one included
    max_tokens: int
    num_output: int = 0
    num_full_slots: int = 0  # tokens with a slot in its block table (T ``_num_full_slots``)
    num_blocks: int = 0
    device: str = "gpu"


@dataclass
class Step:
    """What one step scheduled, in order, and the free GPU blocks once it was scheduled."""

    prefills: list = field(default_factory=list)
    decodes: list = field(default_factory=list)
    swapped_in: list = field(default_factory=list)
    swapped_out: list = field(default_factory=list)
    preempted: list = field(default_factory=list)  # by recompute
    finished: list = field(default_factory=list)
    free_gpu_blocks: int = 0

    @property
    def scheduled(self) -> list:
        return self.prefills + self.decodes + self.swapped_in


class Replay063:
    def __init__(self, block_size, num_gpu_blocks, num_cpu_blocks=0, watermark=0.01, preemption_mode=None,
                 max_num_seqs=256, max_num_batched_tokens=2048, exact_append=False):
        self.block_size, self.num_gpu_blocks = block_size, num_gpu_blocks
        self.free = {"gpu": num_gpu_blocks, "cpu": num_cpu_blocks}
        self.watermark_blocks = int(watermark * num_gpu_blocks)  # M __init__
        self.preemption_mode, self.exact_append = preemption_mode, exact_append
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting, self.running, self.swapped = deque(), deque(), deque()

    def add_request(self, name, prompt_len, max_tokens):
        self.waiting.append(_Request(name, prompt_len, max_tokens))

    # ------------------------------------------------------------ block counts
    def _touched_by_append(self, r) -> int:
        """T get_num_blocks_touched_by_append_slots, for the tokens without a slot yet."""
        first_chunk_size = self.block_size - r.num_full_slots % self.block_size
        return 1 + _cdiv(r.num_tokens - r.num_full_slots - first_chunk_size, self.block_size)

    def _num_full_blocks(self, r) -> int:
        return r.num_full_slots // self.block_size

    def _can_append(self, r) -> bool:
        need = (_cdiv(r.num_tokens, self.block_size) - r.num_blocks if self.exact_append
                else self._touched_by_append(r))
        return need <= self.free["gpu"]

    def _append_slots(self, r):
        new = _cdiv(r.num_tokens, self.block_size) - r.num_blocks  # what is really allocated
        self.free["gpu"] -= new
        r.num_blocks += new
        r.num_full_slots = r.num_tokens

    def _move(self, r, dst):
        self.free[r.device] += r.num_blocks
        self.free[dst] -= r.num_blocks
        r.device = dst

    # ------------------------------------------------------------ the step
    def _preempt(self, r, step):
        mode = self.preemption_mode or "recompute"  # a group of one running sequence
        if mode == "swap":
            if self.free["cpu"] < self._touched_by_append(r) + self._num_full_blocks(r):
                raise RuntimeError("Aborted due to the lack of CPU swap space.")
            self._move(r, "cpu")
            step.swapped_out.append(r)
        else:
            self.free["gpu"] += r.num_blocks
            r.num_blocks = r.num_full_slots = 0
            step.preempted.append(r)

    def schedule(self) -> Step:
        step, num_seqs, num_tokens = Step(), len(self.running), 0
        if not self.swapped:
            while self.waiting:
                r = self.waiting[0]
                need = _cdiv(r.num_tokens, self.block_size)
                if self.num_gpu_blocks - need < self.watermark_blocks:
                    self.waiting.popleft()  # NEVER: ignored
                    continue
                if self.free["gpu"] - need < self.watermark_blocks:
                    break  # LATER
                if num_tokens + r.num_tokens > self.max_num_batched_tokens or num_seqs + 1 > self.max_num_seqs:
                    break
                self.waiting.popleft()
                r.num_blocks, r.num_full_slots, r.device = need, r.num_tokens, "gpu"
                self.free["gpu"] -= need
                num_tokens, num_seqs = num_tokens + r.num_tokens, num_seqs + 1
                step.prefills.append(r)
        if not step.prefills:
            queue, self.running = self.running, deque()
            while queue:
                r = queue.popleft()
                while not self._can_append(r):
                    victim = queue.pop() if queue else r
                    self._preempt(victim, step)
                    if victim is r:
                        break
                else:
                    self._append_slots(r)
                    num_tokens += 1
                    step.decodes.append(r)
            num_seqs = len(step.decodes)
            if not step.preempted and not step.swapped_out:
                while self.swapped:
                    r = self.swapped[0]
                    need = self._touched_by_append(r) + self._num_full_blocks(r)
                    if self.num_gpu_blocks < need:
                        self.swapped.popleft()  # NEVER: the request fails
                        continue
                    if self.free["gpu"] - need < self.watermark_blocks:
                        break  # LATER
                    if num_tokens + 1 > self.max_num_batched_tokens or num_seqs + 1 > self.max_num_seqs:
                        break
                    self.swapped.popleft()
                    self._move(r, "gpu")
                    self._append_slots(r)
                    num_tokens, num_seqs = num_tokens + 1, num_seqs + 1
                    step.swapped_in.append(r)
        self.waiting.extendleft(step.preempted)
        self.running.extend(step.prefills + step.decodes + step.swapped_in)
        self.swapped.extend(step.swapped_out)
        step.free_gpu_blocks = self.free["gpu"]
        return step

    def update(self, step: Step):
        """The model sampled one token for each scheduled request; finished ones free their blocks."""
        for r in step.scheduled:
            r.num_tokens += 1
            r.num_output += 1
            if r.num_output == r.max_tokens:
                self.running.remove(r)
                self.free["gpu"] += r.num_blocks
                step.finished.append(r)

    def run(self, max_steps=1000) -> list[Step]:
        """Every step until all requests are done, each as a ``Step`` of request names."""
        steps = []
        while (self.waiting or self.running or self.swapped) and len(steps) < max_steps:
            step = self.schedule()
            self.update(step)
            for name in ("prefills", "decodes", "swapped_in", "swapped_out", "preempted", "finished"):
                setattr(step, name, [r.name for r in getattr(step, name)])
            steps.append(step)
        return steps
