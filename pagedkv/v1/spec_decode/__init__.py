"""Speculative decoding, as vLLM 0.33 runs it: a proposer guesses the next tokens, the target model checks them.

``config``: ``SpeculativeConfig`` (vLLM: ``vllm/config/speculative.py``), the ``speculative_config`` dict checked;
``ngram_proposer``: prompt lookup (vLLM: ``vllm/v1/spec_decode/ngram_proposer.py``); ``metrics``:
``SpecDecodingStats`` (vLLM: ``vllm/v1/spec_decode/metrics.py``). The scheduler's part (drafts as query tokens,
rollback) is in ``pagedkv.v1.scheduler``; the verification in ``pagedkv.v1.sample.rejection_sampler``.
"""

from .config import SpeculativeConfig
from .metrics import SpecDecodingStats
from .ngram_proposer import NgramProposer

__all__ = ["NgramProposer", "SpecDecodingStats", "SpeculativeConfig"]
