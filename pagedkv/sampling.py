"""Layer 10a — what a request asks for (``SamplingParams``, ``BeamSearchParams``), what it gets back
(``RequestOutput``), and the sampler that turns one row of logits into one token.

The names and meanings are vLLM's (``vllm/sampling_params.py``, ``vllm/outputs.py``,
``vllm/v1/sample/sampler.py``): ``temperature=0`` is greedy, ``top_k=0`` is off, ``top_p=1`` is off, ``n``
samples per prompt, ``stop_token_ids`` end a sample, ``ignore_eos`` keeps going past the model's EOS.

**Reproducible by construction.** Every sample owns a ``torch.Generator`` seeded from ``(seed, index)``,
and each of its tokens costs exactly one draw from it: an exponential race over the vocabulary
(``argmax(probs / Exponential(1))``, vLLM's ``random_sample``), which picks token ``t`` with probability
``probs[t]``. So sample ``i``'s tokens depend only on the model, the prompt, the params and the seed: never on
which other requests share the batch, the block size, the pool, preemption, prefix caching or the engine.

``cumulative_logprob`` sums the log-probabilities of the chosen tokens under the model's raw distribution
(temperature 1, nothing truncated), as vLLM v1 reports them by default.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from numbers import Real

import torch

from .errors import PagedKVValueError
from .validate import check_int, check_int_list

SEED_MIX = 0x9E3779B97F4A7C15  # spreads (seed, index) over the generator's seed space (the golden ratio, in bits)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a request's continuation (vLLM's ``SamplingParams``)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # also return this many most likely tokens' log-probabilities per step

    def __post_init__(self):
        check_int("n", self.n, minimum=1)
        if self.logprobs is not None:
            check_int("logprobs", self.logprobs, minimum=0)
        check_int("max_tokens", self.max_tokens, minimum=1)
        check_int("top_k", self.top_k, minimum=0)
        _check_real("temperature", self.temperature, lambda t: t >= 0, ">= 0 (0 is greedy)")
        _check_real("top_p", self.top_p, lambda p: 0 < p <= 1, "in (0, 1] (1 keeps every token)")
        if self.seed is not None:
            check_int("seed", self.seed)
        if not isinstance(self.ignore_eos, bool):
            raise PagedKVValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}.")
        object.__setattr__(self, "stop_token_ids", tuple(check_int_list("stop_token_ids", self.stop_token_ids, 0)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generators(self) -> list[torch.Generator]:
        """One generator per sample; seeded: sample ``i``'s comes from ``(seed, i)`` alone."""
        base = self.seed if self.seed is not None else random.SystemRandom().getrandbits(63)
        return [torch.Generator().manual_seed((base * SEED_MIX + i) % 2**63) for i in range(self.n)]


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``: keep the ``beam_width`` most likely continuations, one token at a time."""

    beam_width: int
    max_tokens: int
    length_penalty: float = 1.0
    ignore_eos: bool = False

    def __post_init__(self):
        check_int("beam_width", self.beam_width, minimum=1)
        check_int("max_tokens", self.max_tokens, minimum=1)
        _check_real("length_penalty", self.length_penalty, math.isfinite, "a finite number")
        if not isinstance(self.ignore_eos, bool):
            raise PagedKVValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}.")


@dataclass
class CompletionOutput:
    """One sample or beam of a request (vLLM's ``CompletionOutput``)."""

    index: int
    token_ids: list[int]
    cumulative_logprob: float
    finish_reason: str  # "stop" (EOS or a stop token, included) or "length" (max_tokens)
    logprobs: list | None = None  # with SamplingParams(logprobs=k): per token, {token id: log-prob} of the top k


@dataclass
class RequestOutput:
    """Everything a request produced: its outputs by index (beams: best first)."""

    request_id: object
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- the sampler
def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from one row of logits: greedy at temperature 0, else temperature, top-k, top-p and a draw."""
    if params.greedy:
        return int(logits.argmax())
    probs = sampling_probs(logits, params)
    race = torch.empty_like(probs).exponential_(generator=generator)  # the sample's one draw for this token
    return int((probs / race).argmax())


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution ``sample`` draws from at temperature > 0: temperature, then top-k, then top-p."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        logits = _top_p(logits, params.top_p)
    return torch.softmax(logits, dim=-1)


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities add up to ``top_p`` (at least one)."""
    ascending, order = logits.sort()
    cumulative = ascending.softmax(-1).cumsum(-1)
    drop = cumulative <= 1 - top_p
    drop[-1] = False  # the most likely token always stays
    return logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))


def logprob(logits: torch.Tensor, token: int) -> float:
    """log P(token) under the model's raw distribution (no temperature, nothing truncated)."""
    return float(torch.log_softmax(logits.float(), dim=-1)[token])


def beam_search_score(num_generated_tokens: int, cumulative_logprob: float, length_penalty: float = 1.0) -> float:
    """vLLM 0.33's ``get_beam_search_score`` (``vllm/entrypoints/generate/beam_search/utils.py``): log-probability
    per generated token (a final EOS counts), the length raised to ``length_penalty``, as transformers does."""
    return cumulative_logprob / (max(num_generated_tokens, 1) ** length_penalty)


def _check_real(name: str, value, ok, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value) or not ok(value):
        raise PagedKVValueError(f"{name} must be {what}, got {value!r}.")
