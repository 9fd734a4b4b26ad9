"""``SpecDecodingStats``: drafts proposed, draft tokens, accepted tokens, and acceptance per position.

As vLLM 0.33's ``vllm/v1/spec_decode/metrics.py``: the scheduler observes every verified draft in
``update_from_output`` (``observe_draft``). Position ``i`` counts the drafts whose token ``i`` was accepted; a
draft is accepted left to right, so the counts never rise with ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list = field(default_factory=list)
    num_draft_tokens_per_pos: list = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(num_spec_tokens, num_accepted_tokens_per_pos=[0] * num_spec_tokens,
                   num_draft_tokens_per_pos=[0] * num_spec_tokens)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1
        for i in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over proposed ones (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_rate_per_pos(self) -> list:
        """For each position ``i``: the share of drafts whose first ``i + 1`` tokens were all accepted (what vLLM's
        log prints as "per-position acceptance rate": accepted at ``i`` over drafts)."""
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.num_accepted_tokens_per_pos]

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verified draft yields per step: 1 (the target's own token) + accepted drafts on average."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
