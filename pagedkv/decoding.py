"""Layer 8 — parallel sampling and beam search on shared blocks, with memory accounting.

Both decoders fork sequences so that they share their common prefix's blocks,
and count, step by step, the blocks in use against the blocks the same
sequences would need if each held its own copy.  The "model" is a seeded toy
scorer over token ids (no weights); any callable ``tokens -> log-probs over the
vocabulary`` can replace it.

vLLM v0 does this in ``vllm/sequence.py`` (``SequenceGroup``) and the beam
search logic of ``vllm/model_executor/layers/sampler.py``; the block sharing is
``BlockSpaceManager.fork`` plus copy-on-write.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from .manager import BlockSpaceManager
from .paged_cache import PagedKVCache
from .sizing import blocks_needed
from .validate import check_choice, check_int, check_token_ids


class ToyScorer:
    """Deterministic log-probabilities from the last ``context`` tokens and a seed.

    Peaked (a few likely tokens per context) so beams behave like a real
    model's: they mostly extend a few strong prefixes.
    """

    def __init__(self, vocab_size: int = 64, seed: int = 0, context: int = 2, temperature: float = 0.7):
        self.vocab_size, self.seed, self.context, self.temperature = vocab_size, seed, context, temperature

    def __call__(self, tokens) -> np.ndarray:
        key = repr((self.seed, list(tokens[-self.context:]))).encode()
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
        logits = rng.standard_normal(self.vocab_size) / self.temperature
        return logits - np.logaddexp.reduce(logits)  # log-softmax


@dataclass
class StepStats:
    """Memory accounting after one decoding step (step 0 is the prompt)."""

    step: int
    num_seqs: int
    blocks_in_use: int  # GPU blocks in use, with sharing
    blocks_without_sharing: int  # blocks if every sequence held its own copy of its tokens
    cow_copies: int  # copy-on-write copies made in this step
    blocks_freed: int  # blocks returned to the free list by pruning in this step


@dataclass
class DecodeResult:
    sequences: dict  # seq_id -> token ids (prompt + generated) of the survivors
    scores: dict  # seq_id -> cumulative log-probability
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


class SequenceOps:
    """Sequence operations on a manager alone, or on a PagedKVCache (then K/V are written too).

    With a cache, token ``t``'s key and value are ``embed(t)``, so gathering a
    sequence must give back the embeddings of its tokens.
    """

    def __init__(self, target):
        self.cache = target if isinstance(target, PagedKVCache) else None
        self.manager: BlockSpaceManager = target.manager if self.cache else target

    def embed(self, tokens) -> torch.Tensor:
        engine = self.cache.engine
        t = torch.as_tensor(list(tokens), dtype=engine.dtype).view(-1, 1, 1)
        return t.expand(-1, engine.num_kv_heads, engine.head_size).contiguous()

    def allocate(self, seq_id, tokens):
        if self.cache:
            self.cache.add_sequence(seq_id, self.embed(tokens), -self.embed(tokens), token_ids=tokens)
        else:
            self.manager.allocate(seq_id, tokens)

    def append(self, seq_id, tokens) -> int:
        """Append ``tokens`` (all or nothing); returns the number of copy-on-write copies."""
        if self.cache:
            k = self.embed(tokens)
            return len(self.cache.append(seq_id, k, -k, token_id=list(tokens)))
        return len(self.manager.append_slots(seq_id, list(tokens)))

    def fork(self, parent, child):
        (self.cache or self.manager).fork(parent, child)

    def free(self, seq_id):
        (self.cache or self.manager).free(seq_id)

    def swap_out(self, seq_id):
        return (self.cache or self.manager).swap_out(seq_id)

    def swap_in(self, seq_id):
        return (self.cache or self.manager).swap_in(seq_id)


class _Decoder:
    def __init__(self, target, scorer=None, id_prefix: str = ""):
        self.blocks = SequenceOps(target)
        self.id_prefix = id_prefix
        self.manager = self.blocks.manager
        self.scorer = scorer or ToyScorer()
        self.tokens: dict = {}
        self.scores: dict = {}
        self.steps: list[StepStats] = []
        self._next_id = 0

    def _new_id(self):
        """Sequence ids 0, 1, 2, ... (or "b0", "b1", ... with ``id_prefix="b"``)."""
        self._next_id += 1
        return f"{self.id_prefix}{self._next_id - 1}" if self.id_prefix else self._next_id - 1

    def _record(self, cow: int = 0, freed: int = 0) -> StepStats:
        m = self.manager
        stats = StepStats(len(self.steps), len(self.tokens), m.num_total_gpu_blocks - m.num_free_gpu_blocks,
                          sum(blocks_needed(len(t), m.block_size) for t in self.tokens.values()), cow, freed)
        self.steps.append(stats)
        return stats

    def _start(self, prompt) -> int:
        seq = self._new_id()
        self.blocks.allocate(seq, list(prompt))
        self.tokens[seq], self.scores[seq] = list(prompt), 0.0
        return seq

    def result(self) -> DecodeResult:
        return DecodeResult({s: list(t) for s, t in self.tokens.items()}, dict(self.scores), list(self.steps))

    def finish(self) -> None:
        """Free every sequence (the requests are done)."""
        for seq in list(self.tokens):
            self.blocks.free(seq)
        self.tokens.clear()


class ParallelSampler(_Decoder):
    """One prompt, ``n`` continuations forked from it, each sampling its own tokens."""

    def __init__(self, target, prompt, n: int, scorer=None, seed: int = 0, id_prefix: str = ""):
        super().__init__(target, scorer, id_prefix)
        self.rng = np.random.default_rng(seed)
        first = self._start(prompt)
        for _ in range(n - 1):
            child = self._new_id()
            self.blocks.fork(first, child)
            self.tokens[child], self.scores[child] = list(prompt), 0.0
        self._record()

    def step(self) -> StepStats:
        cow = 0
        for seq, tokens in self.tokens.items():
            logprobs = self.scorer(tokens)
            token = int(self.rng.choice(len(logprobs), p=np.exp(logprobs)))
            cow += self.blocks.append(seq, [token])
            tokens.append(token)
            self.scores[seq] += float(logprobs[token])
        return self._record(cow)


class BeamSearch(_Decoder):
    """Beam search of width ``width``: every step keeps the ``width`` best extensions of all beams.

    A parent with several surviving children is forked (they share its blocks);
    a parent with none is freed at once, its unshared blocks back in the free list.
    """

    def __init__(self, target, prompt, width: int, scorer=None, id_prefix: str = ""):
        super().__init__(target, scorer, id_prefix)
        self.width = width
        self._start(prompt)
        self._record()

    def candidates(self) -> list[tuple[float, int, int]]:
        """``(score, parent, token)`` for the ``width`` best extensions, best first (ties: lower ids)."""
        options = []
        for seq, tokens in self.tokens.items():
            logprobs = self.scorer(tokens)
            for token in np.argsort(-logprobs, kind="stable")[: self.width]:
                options.append((self.scores[seq] + float(logprobs[token]), seq, int(token)))
        options.sort(key=lambda c: (-c[0], c[1], c[2]))
        return options[: self.width]

    def step(self) -> StepStats:
        survivors = self.candidates()
        children: dict = {}
        for score, parent, token in survivors:
            children.setdefault(parent, []).append((score, token))
        free_before = self.manager.num_free_gpu_blocks
        for seq in [s for s in self.tokens if s not in children]:  # pruned beams go first
            self.blocks.free(seq)
            del self.tokens[seq], self.scores[seq]
        freed = self.manager.num_free_gpu_blocks - free_before
        cow = 0
        for parent, extensions in children.items():
            ids = [parent] + [self._new_id() for _ in extensions[1:]]
            for child in ids[1:]:  # fork before anyone appends: children share the parent's blocks
                self.blocks.fork(parent, child)
                self.tokens[child] = list(self.tokens[parent])
            for seq, (score, token) in zip(ids, extensions):
                cow += self.blocks.append(seq, [token])
                self.tokens[seq].append(token)
                self.scores[seq] = score
        return self._record(cow, freed)


def run_decoding(mode: str, width: int, prompt, output_len: int, block_size: int = 16, seed: int = 0,
                 target=None, scorer=None) -> DecodeResult:
    """Decode ``output_len`` tokens in ``mode`` ("parallel" or "beam"); blocks are freed at the end."""
    check_choice("mode", mode, ("parallel", "beam"))
    check_int("width", width, minimum=1)
    check_int("output_len", output_len, minimum=1)
    check_int("block_size", block_size, minimum=1)
    prompt = check_token_ids("prompt", prompt)
    if target is None:  # a pool big enough that nothing is ever refused
        target = BlockSpaceManager(block_size, 2 * width * blocks_needed(len(prompt) + output_len, block_size) + 8,
                                   watermark=0.0)
    scorer = scorer or ToyScorer(seed=seed)
    decoder = (ParallelSampler(target, prompt, width, scorer, seed) if mode == "parallel"
               else BeamSearch(target, prompt, width, scorer))
    for _ in range(output_len):
        decoder.step()
    result = decoder.result()
    decoder.finish()
    return result


def synthetic_prompt(prompt_len: int, seed: int = 0, vocab_size: int = 64) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, prompt_len).tolist()


def sharing_savings(mode: str, width: int, prompt_len: int, output_len: int, block_size: int = 16,
                    seed: int = 0) -> float:
    """Fraction of KV blocks sharing saves at the peak: ``1 - peak in use / peak without sharing``."""
    check_int("prompt_len", prompt_len, minimum=1)
    check_int("seed", seed, minimum=0)
    prompt = synthetic_prompt(prompt_len, seed)
    return run_decoding(mode, width, prompt, output_len, block_size, seed).savings
