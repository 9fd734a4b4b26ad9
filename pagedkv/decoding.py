"""Layer 12a — parallel sampling and beam search watched step by step: what sharing saves, on a real model.

The engine does the work: a request of ``n`` samples or of a beam search is a sequence group
(``scheduler.py``), its prompt is prefilled once and forked, the first append into a shared partial block is a
copy-on-write copy, and beam search frees the beams it drops (``output_processor.py``; paper §4.4). This module
only drives one such request through an :class:`LLMEngine` a step at a time and counts, at every step:

* the distinct blocks the group's sequences hold (a shared block once),
* the blocks they would hold if each kept its own copy of its tokens (no sharing),
* the copy-on-write copies the step made and the blocks it freed by dropping beams.

The first two are counted where the step allocates its blocks: right after scheduling, when every live sequence
has a slot for its next token, and before sampling drops beams or finishes the request. That is where the engine
counts ``stats.peak_gpu_blocks`` too, so a group alone on an engine has ``peak_in_use == peak_gpu_blocks``: one
definition of the peak: the most blocks ever allocated at once.

``sharing_savings`` is the paper's Fig. 15 measure on the shipped tiny Llama:
``1 - peak blocks with sharing / peak blocks without``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from .engine import LLMEngine
from .model import LlamaForCausalLM, load_tiny
from .sampling import BeamSearchParams, RequestOutput, SamplingParams
from .validate import check_choice, check_int

# The tiny Llama reads bytes; prompts are cut from this text (its training prose is Python's documentation).
TEXT = (b"The KV cache stores the keys and values of every token a request has seen, so that each new token "
        b"attends to them without computing them again. A paged cache splits it into blocks of a fixed number "
        b"of tokens. A block table maps each request's logical blocks to physical ones, which need not be "
        b"contiguous, so memory is handed out a block at a time as the request grows. Requests that share a "
        b"prefix share its blocks, and a block is copied only when one of them writes into it. ")


@dataclass
class StepStats:
    """The group's blocks in one engine step (step 1 prefills the prompt), counted where the step allocates them:
    after scheduling, before sampling forks, drops or finishes sequences."""

    step: int
    num_seqs: int  # live sequences of the group when the step's slots are allocated
    blocks_in_use: int  # distinct blocks they hold then: a shared block counts once
    blocks_without_sharing: int  # blocks they would hold then if each had its own copy of its tokens
    cow_copies: int  # copy-on-write copies made in this step
    blocks_freed: int  # blocks returned to the free list by dropped beams in this step
    copies: tuple = ()  # the copy-on-write copies, (source block, new block)
    freed_block_ids: tuple = ()  # the blocks dropped beams returned to the free list


@dataclass
class DecodeResult:
    output: RequestOutput  # the samples, or the beams best first
    steps: list = field(default_factory=list)

    @property
    def peak_in_use(self) -> int:
        return max(s.blocks_in_use for s in self.steps)

    @property
    def peak_without_sharing(self) -> int:
        return max(s.blocks_without_sharing for s in self.steps)

    @property
    def savings(self) -> float:
        """``1 - peak blocks with sharing / peak blocks without``."""
        return 1 - self.peak_in_use / self.peak_without_sharing

    def table(self) -> str:
        rows = [f"{'step':>4} {'seqs':>4} {'in use':>6} {'without sharing':>15} {'CoW':>4} {'freed':>5}"]
        rows += [f"{s.step:>4} {s.num_seqs:>4} {s.blocks_in_use:>6} {s.blocks_without_sharing:>15} {s.cow_copies:>4} "
                 f"{s.blocks_freed:>5}" for s in self.steps]
        return "\n".join(rows)


class GroupDecoding:
    """One request (``SamplingParams`` with ``n`` samples, or ``BeamSearchParams``) through ``engine``, a step at
    a time, with the group's blocks counted after each step."""

    def __init__(self, engine: LLMEngine, prompt_token_ids, params, request_id="group"):
        self.engine, self.request_id = engine, request_id
        engine.add_request(request_id, prompt_token_ids, params)
        self.steps: list[StepStats] = []

    @property
    def seq_ids(self) -> list:
        """The group's live sequences (none before its prefill is scheduled, none once it finished)."""
        request = self.engine.scheduler.requests.get(self.request_id)
        manager = self.engine.block_manager
        return [s.seq_id for s in request.seqs if manager.has_seq(s.seq_id)] if request else []

    @property
    def finished(self) -> bool:
        return self.request_id not in self.engine.scheduler.requests

    def block_tables(self) -> dict:
        manager = self.engine.block_manager
        return {s: manager.get_block_table(s) for s in self.seq_ids}

    def held_blocks(self) -> set:
        """The distinct GPU blocks the group's sequences hold."""
        return {b for table in self.block_tables().values() for b in table}

    def step(self) -> StepStats:
        """One engine step (it also runs every other request the engine holds), the group's blocks counted right
        after ``schedule()`` has allocated them, where ``engine.stats.peak_gpu_blocks`` is counted."""
        scheduler, tables = self.engine.scheduler, {}
        # every live sequence holds a slot for its next token right after scheduling: count the tables there
        out = self.engine.step(after_schedule=lambda _: tables.update(self.block_tables()))
        held = {b for table in tables.values() for b in table}
        freed = tuple(sorted(scheduler.pruned_block_ids))
        stats = StepStats(len(self.steps) + 1, len(tables), len(held), sum(len(t) for t in tables.values()),
                          len(out.blocks_to_copy), len(freed), tuple(out.blocks_to_copy), freed)
        self.steps.append(stats)
        return stats

    def run(self) -> DecodeResult:
        """Step until the request finishes; its output and every step's counts."""
        while not self.finished:
            self.step()
        return DecodeResult(self.engine.pop_finished(self.request_id), self.steps)


@functools.cache
def tiny_model() -> LlamaForCausalLM:
    """The shipped tiny Llama (4 layers, 4 query / 2 KV heads, byte vocabulary), loaded once."""
    return load_tiny()[0]


def tiny_engine(num_gpu_blocks: int, block_size: int = 16, **kwargs) -> LLMEngine:
    """An engine on the tiny Llama."""
    return LLMEngine(tiny_model(), num_gpu_blocks=num_gpu_blocks, block_size=block_size, **kwargs)


def run_decoding(mode: str, width: int, prompt, output_len: int, block_size: int = 16, seed: int = 0,
                 engine: LLMEngine | None = None) -> DecodeResult:
    """Decode ``output_len`` tokens of ``prompt`` in ``mode``: "parallel" (``width`` seeded samples) or "beam"
    (beam search of width ``width``), on the tiny Llama through the engine; its blocks are freed at the end."""
    check_choice("mode", mode, ("parallel", "beam"))
    check_int("width", width, minimum=1)
    check_int("output_len", output_len, minimum=1)
    check_int("block_size", block_size, minimum=1)
    check_int("seed", seed, minimum=0)
    params = (SamplingParams(n=width, seed=seed, max_tokens=output_len, ignore_eos=True) if mode == "parallel"
              else BeamSearchParams(beam_width=width, max_tokens=output_len, ignore_eos=True))
    if engine is None:  # a pool big enough that nothing is ever preempted
        engine = tiny_engine(width * (-(-(len(prompt) + output_len) // block_size) + 1) + 1, block_size,
                             watermark=0.0)
    return GroupDecoding(engine, prompt, params).run()


def synthetic_prompt(prompt_len: int, seed: int = 0) -> list[int]:
    """``prompt_len`` bytes of English prose (the tiny Llama's vocabulary), starting at a place ``seed`` picks."""
    check_int("prompt_len", prompt_len, minimum=1)
    start = check_int("seed", seed, minimum=0) * 37 % len(TEXT)
    return [TEXT[(start + i) % len(TEXT)] for i in range(prompt_len)]


def sharing_savings(mode: str, width: int, prompt_len: int, output_len: int, block_size: int = 16,
                    seed: int = 0) -> float:
    """Fraction of KV blocks sharing saves at the peak: ``1 - peak in use / peak without sharing``."""
    check_int("prompt_len", prompt_len, minimum=1)
    check_int("seed", seed, minimum=0)
    return run_decoding(mode, width, synthetic_prompt(prompt_len, seed), output_len, block_size, seed).savings


def replayed_parallel_savings(width: int, prompt_len: int, output_len: int, block_size: int = 16) -> float:
    """``sharing_savings("parallel", ...)`` without the model: parallel samples share exactly the prompt, so the
    blocks depend only on the lengths. Replays what the engine asks of the block manager (the prompt allocated once
    and forked ``width - 1`` times, then every step a slot for each sample's previous token: the last sampled
    token is never written) and counts the peak where each step allocates, as ``run_decoding`` does."""
    from .manager import BlockSpaceManager
    from .sizing import blocks_needed

    check_int("width", width, minimum=1)
    check_int("prompt_len", prompt_len, minimum=1)
    check_int("output_len", output_len, minimum=1)
    pool = width * blocks_needed(prompt_len + output_len, block_size)
    manager = BlockSpaceManager(block_size, pool, watermark=0.0)
    manager.allocate(0, range(prompt_len))
    for sample in range(1, width):
        manager.fork(0, sample)
    peak = pool - manager.num_free_gpu_blocks
    for token in range(output_len - 1):
        for sample in range(width):
            manager.append_slots(sample, [token])
        peak = max(peak, pool - manager.num_free_gpu_blocks)
    return 1 - peak / (width * blocks_needed(prompt_len + output_len - 1, block_size))
