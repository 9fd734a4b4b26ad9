"""Layer 11b — what the engine does with a step's logits, per request: sample, fork, prune, and report.

vLLM v0 split this between the ``Sampler`` (``vllm/model_executor/layers/sampler.py``, beam selection
included up to v0.6.2) and the output processor (``vllm/engine/output_processor/single_step.py``), which
forked and freed sequences of a group through the scheduler. One object per request here:

* :class:`Samples`: ``n`` samples. The prompt is prefilled once, for sequence ``(request_id, 0)``; its logits
  give every sample its first token, each drawn with the sample's own generator, and the other ``n - 1``
  sequences are forked from it: they share the prompt's blocks, and the first append into the shared
  partial block is a copy-on-write (paper §4.4, parallel sampling). With ``n = 1`` the request is a single
  sequence whose id is the request id.
* :class:`Beams`: beam search as vLLM 0.33's ``LLM.beam_search`` scores it (see ``beam_search_dense``), inside
  the engine as v0 did: every step the ``beam_width`` best candidates live on; a parent with several surviving
  children is forked (blocks shared), a parent with none is freed (paper §4.4, beam search).

``process`` returns the token of every live sequence of its request, for ``Scheduler.update``.
"""

from __future__ import annotations

import torch

from .sampling import BeamSearchParams, CompletionOutput, RequestOutput, SamplingParams, beam_search_score, sample
from .v1.sample.rejection_sampler import rejection_sample


class Samples:
    """``n`` samples of one request; each sequence draws with its own generator, seeded from (seed, index)."""

    def __init__(self, request_id, prompt_token_ids: list, params: SamplingParams, stop_token_ids: frozenset,
                 index: int | None = None):
        """``index``: this request is sample ``index`` of ``params.n``, alone (vLLM v1 fans ``n > 1`` out into
        child requests); its draws are that sample's, so v1's samples equal v0's."""
        self.request_id, self.prompt_token_ids, self.params = request_id, prompt_token_ids, params
        self.stop_token_ids = stop_token_ids
        self.generators = [None] * params.n if params.greedy else params.generators()
        self.num_samples = params.n if index is None else 1
        first = request_id if self.num_samples == 1 else (request_id, 0)
        self.index = {first: index or 0}  # seq_id -> sample index
        self.cumulative_logprob = {first: 0.0}
        self.top_logprobs: dict = {}  # seq_id -> per token {token: log-prob}, with params.logprobs

    def process(self, scheduler, rows: dict, logits: torch.Tensor, logprobs: torch.Tensor, argmax: list) -> dict:
        tokens = {}
        for seq_id, row in rows.items():
            if len(self.index) < self.num_samples:  # the prompt's logits: every sample's first token, then fork
                return self._fork_samples(scheduler, seq_id, row, logits, logprobs, argmax)
            tokens[seq_id] = self.draw(seq_id, row, logits, argmax)
            self.record(seq_id, tokens[seq_id], logprobs[row])
        return tokens

    def draw(self, seq_id, row: int, logits: torch.Tensor, argmax: list) -> int:
        """The sequence's next token, drawn from its row (an async engine draws on the forward thread)."""
        return self._draw(self.index[seq_id], row, logits, argmax)

    def record(self, seq_id, token: int, row_logprobs: torch.Tensor) -> None:
        """Count a token the request keeps: its log-probability (an async engine records only tokens it
        delivers, on the main thread)."""
        self.cumulative_logprob[seq_id] += float(row_logprobs[token])
        self._keep_top(seq_id, row_logprobs)

    def verify(self, seq_id, rows: list, draft: list, logits: torch.Tensor, logprobs: torch.Tensor, argmax: list,
               num_generated: int) -> list:
        """v1 speculative decoding: the tokens a draft yields on its ``len(draft) + 1`` rows (the rejection
        sampler: argmax, or one seeded draw per emitted token), cut after a stop token or at ``max_tokens``
        (the scheduler drops those too), each counted in the log-probabilities as a plain step's token."""
        index = self.index[seq_id]
        tokens = rejection_sample(draft, lambda i: self._draw(index, rows[i], logits, argmax))
        kept = []
        for row, token in zip(rows, tokens):
            kept.append(token)
            self.cumulative_logprob[seq_id] += float(logprobs[row, token])
            self._keep_top(seq_id, logprobs[row])
            if token in self.stop_token_ids or num_generated + len(kept) >= self.params.max_tokens:
                break
        return kept

    def _keep_top(self, seq_id, row_logprobs: torch.Tensor) -> None:
        """vLLM's ``logprobs=k``: the k most likely tokens of this step, most likely first."""
        if self.params.logprobs:
            top = torch.topk(row_logprobs, min(self.params.logprobs, row_logprobs.numel()))
            self.top_logprobs.setdefault(seq_id, []).append(dict(zip(top.indices.tolist(), top.values.tolist())))

    def _fork_samples(self, scheduler, parent, row, logits, logprobs, argmax) -> dict:
        tokens = {}
        for i in range(self.params.n):
            seq_id = (self.request_id, i)
            if i:
                scheduler.fork_seq(parent, seq_id)
            self.index[seq_id] = i
            tokens[seq_id] = self._draw(i, row, logits, argmax)
            self.cumulative_logprob[seq_id] = float(logprobs[row, tokens[seq_id]])
            self._keep_top(seq_id, logprobs[row])
        return tokens

    def _draw(self, index: int, row: int, logits: torch.Tensor, argmax: list) -> int:
        generator = self.generators[index]
        return argmax[row] if generator is None else sample(logits[row], self.params, generator)

    def output(self, finished) -> RequestOutput:
        """``finished``: the scheduler's record (a token list for one sequence, {seq_id: tokens} for a group)."""
        by_seq = finished if isinstance(finished, dict) else {self.request_id: finished}
        outputs = sorted((CompletionOutput(self.index[s], t, self.cumulative_logprob[s], self._reason(t),
                                           self.top_logprobs.get(s) if self.params.logprobs else None)
                          for s, t in by_seq.items()), key=lambda o: o.index)
        return RequestOutput(self.request_id, self.prompt_token_ids, outputs)

    def _reason(self, tokens: list) -> str:
        return "stop" if tokens and tokens[-1] in self.stop_token_ids else "length"


class Beams:
    """Beam search over a sequence group: fork the kept candidates, free the dropped beams, every step."""

    def __init__(self, request_id, prompt_token_ids: list, params: BeamSearchParams, eos_token_id):
        self.request_id, self.prompt_token_ids, self.params = request_id, prompt_token_ids, params
        self.eos = None if params.ignore_eos else eos_token_id
        first = request_id if params.beam_width == 1 else (request_id, 0)  # the scheduler's name for it
        self.beams = [first]  # live beams, best first (the order candidates are made in)
        self.cumulative_logprob = {first: 0.0}
        self.completed = []  # (token_ids, cumulative_logprob) of beams that ended with EOS
        self.num_forked = 1

    def process(self, scheduler, rows: dict, logits: torch.Tensor, logprobs: torch.Tensor, argmax: list) -> dict:
        width = self.params.beam_width
        candidates = []
        for parent in self.beams:
            past, score = scheduler.get_seq(parent).output_token_ids, self.cumulative_logprob[parent]
            top = torch.topk(logprobs[rows[parent]], min(2 * width, logprobs.shape[-1]))
            for token, lp in zip(top.indices.tolist(), top.values.tolist()):
                if token == self.eos:
                    self.completed.append((past + [token], score + lp))
                else:
                    candidates.append((parent, token, score + lp, len(past) + 1))
        kept = sorted(candidates, key=lambda c: beam_search_score(c[3], c[2], self.params.length_penalty),
                      reverse=True)[:width]
        for parent in self.beams:  # dropped first, so the forks below stay within the group's width
            if parent not in {c[0] for c in kept}:
                scheduler.free_seq(parent)
        tokens, beams, cumulative = {}, [], {}
        for parent, token, score, _ in kept:
            child = parent
            if parent in tokens:  # the parent already continues with a better token: a new sequence forks
                child = (self.request_id, self.num_forked)
                self.num_forked += 1
                scheduler.fork_seq(parent, child)
            tokens[child], cumulative[child] = token, score
            beams.append(child)
        self.beams, self.cumulative_logprob = beams, cumulative
        return tokens

    def output(self, finished) -> RequestOutput:
        """The best ``beam_width`` of the completed and the live-to-the-end beams, best first."""
        finished = finished if isinstance(finished, dict) else {self.request_id: finished}  # width 1: one sequence
        ended = [(tokens, self.cumulative_logprob[s]) for s, tokens in finished.items()]
        best = sorted(self.completed + ended, reverse=True,
                      key=lambda b: beam_search_score(len(b[0]), b[1], self.params.length_penalty))
        outputs = [CompletionOutput(i, tokens, score, "stop" if tokens[-1:] == [self.eos] else "length")
                   for i, (tokens, score) in enumerate(best[:self.params.beam_width])]
        return RequestOutput(self.request_id, self.prompt_token_ids, outputs)
