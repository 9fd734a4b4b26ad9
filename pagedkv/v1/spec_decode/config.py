"""``SpeculativeConfig``: what ``LLMEngine(..., speculative_config={...})`` accepts, checked before anything is built.

vLLM 0.33 validates the same dict in ``vllm/config/speculative.py`` (``SpeculativeConfig``). pagedkv implements one
method, ``"ngram"`` (prompt lookup: no second model, no lookahead slots), with vLLM's keys and defaults:
``num_speculative_tokens`` (required, > 0), ``prompt_lookup_min`` and ``prompt_lookup_max`` (both missing: 5 and 5;
one missing: it takes the other's value; min <= max).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import PagedKVValueError

METHODS = ("ngram",)
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
DEFAULT_PROMPT_LOOKUP = 5  # vLLM 0.33's default when neither bound is given ("arbitrarily chosen", its TODO says)


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots a drafter writes past the scheduled tokens (vLLM: ``VllmConfig.num_lookahead_tokens``):
        ``num_speculative_tokens`` for EAGLE or a draft model, which run on the new tokens and write their own
        K/V; 0 for n-gram, which only looks tokens up."""
        return 0

    @classmethod
    def from_dict(cls, config) -> SpeculativeConfig:
        """The dict checked: unknown keys, a method other than ``"ngram"`` and bad numbers raise
        ``PagedKVValueError`` naming the key."""
        if not isinstance(config, dict):
            raise PagedKVValueError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                                    f"'num_speculative_tokens': 4}}, got {config!r}.")
        unknown = [k for k in config if k not in KEYS]
        if unknown:
            raise PagedKVValueError(f"speculative_config has unknown key {unknown[0]!r}; pagedkv knows vLLM's "
                                    f"{', '.join(KEYS)}.")
        method = config.get("method")
        if method not in METHODS:
            raise PagedKVValueError(f"speculative_config['method']={method!r}: pagedkv runs vLLM's 'ngram' "
                                    "method (prompt lookup) only; draft models and EAGLE need a second model.")
        if "num_speculative_tokens" not in config:
            raise PagedKVValueError("speculative_config['num_speculative_tokens'] is missing: say how many "
                                    "tokens the proposer guesses per step (e.g. 4).")
        k = _positive("num_speculative_tokens", config["num_speculative_tokens"])
        lo, hi = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        lo = None if lo is None else _positive("prompt_lookup_min", lo)
        hi = None if hi is None else _positive("prompt_lookup_max", hi)
        if lo is None and hi is None:
            lo = hi = DEFAULT_PROMPT_LOOKUP
        lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
        if lo > hi:
            raise PagedKVValueError(f"speculative_config['prompt_lookup_min']={lo} must be <= "
                                    f"prompt_lookup_max={hi} (the n-gram lengths tried, longest first).")
        return cls(method, k, lo, hi)


def _positive(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PagedKVValueError(f"speculative_config[{key!r}] must be an int >= 1, got {value!r}.")
    return value
