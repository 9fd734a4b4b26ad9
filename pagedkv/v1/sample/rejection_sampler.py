"""The rejection sampler: which of a request's draft tokens the target model keeps, and the token it adds.

vLLM 0.33: ``vllm/v1/sample/rejection_sampler.py``. One forward pass gives the target's logits at every draft
position (row ``i`` predicts the token that draft ``i`` guessed) and one past them. For a draft ``x_1 .. x_k``:

* **greedy**: accept drafts left to right while ``x_i`` equals the target's argmax at row ``i``; at the first
  mismatch emit the argmax instead and stop; if all ``k`` match, emit the argmax of row ``k`` too (the *bonus*
  token). A step yields between 1 and ``k + 1`` tokens, each the one plain greedy decoding would have produced.
* **temperature > 0**: a prompt-lookup draft is deterministic (a one-hot ``q``), so speculative sampling's rule
  "accept with probability ``min(1, p(x)/q(x))``, else draw from ``max(p - q, 0)`` renormalised" becomes: accept
  ``x`` with probability ``p(x)``; otherwise draw from ``p`` with ``x`` removed and renormalised. vLLM draws a
  uniform ``u`` and accepts when ``p(x) >= u`` (``rejection_random_sample_kernel`` with ``NO_DRAFT_PROBS``), then
  draws the replacement with an exponential race over ``p`` with ``x`` masked out (``sample_recovered_tokens``).

**How pagedkv draws it.** Here the target's token ``T`` at row ``i`` is drawn exactly as the plain sampler draws
one (``pagedkv.sampling.sample``: one exponential race from the request's seeded generator), the draft is accepted
when ``T == x`` and ``T`` is emitted either way. That is the same distribution as vLLM's: ``P(T = x) = p(x)`` is the
acceptance probability, and given ``T != x``, ``T`` follows ``p`` with ``x`` removed and renormalised. It is coupled
differently from vLLM's two draws (vLLM's tokens for a seed differ from these), and chosen so that **each emitted
token costs exactly one draw** (drawing stops at the first rejection): a speculative run then produces, for a seed,
the very tokens of a run without speculation and of ``generate_dense``, whatever was drafted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...sampling import SamplingParams, sample, sampling_probs


def rejection_sample(draft_token_ids: list[int], target_token: Callable[[int], int]) -> list[int]:
    """The tokens a verified draft yields: the accepted drafts, then the target's own token (a replacement at the
    first rejection, or the bonus). ``target_token(i)``: the target's token at row ``i``, asked for lazily, in
    order, and only while drafts are accepted, so a sampler spends one draw per emitted token."""
    output = []
    for i, draft in enumerate(draft_token_ids):
        token = target_token(i)
        output.append(token)
        if token != draft:  # rejected: the target's token replaces it, and the rest of the draft is dropped
            return output
    output.append(target_token(len(draft_token_ids)))  # every draft accepted: the bonus token
    return output


class RejectionSampler:
    """Verify one request's draft on its ``k + 1`` rows of logits, greedy or seeded (vLLM's ``RejectionSampler``)."""

    def __call__(self, draft_token_ids: list[int], logits: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[int]:
        """``logits``: ``[len(draft_token_ids) + 1, vocab]``; ``generator``: the request's (None when greedy)."""
        if params.greedy or generator is None:
            argmax = logits.argmax(dim=-1).tolist()
            return rejection_sample(draft_token_ids, argmax.__getitem__)
        return rejection_sample(draft_token_ids, lambda i: sample(logits[i], params, generator))

    @staticmethod
    def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """``p`` at one row: what the plain sampler draws from (temperature, top-k, top-p applied)."""
        return sampling_probs(logits, params)
