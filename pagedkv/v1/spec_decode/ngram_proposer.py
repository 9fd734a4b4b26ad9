"""The n-gram proposer (prompt lookup): guess the next tokens by finding the text's own ending earlier in it.

vLLM 0.33: ``vllm/v1/spec_decode/ngram_proposer.py`` (``NgramProposer``, and the numba function
``_find_longest_matched_ngram_and_propose_tokens`` that this module ports line for line). The rule:

* look for an earlier occurrence of the context's last ``n`` tokens, for ``n`` in
  ``[prompt_lookup_min, prompt_lookup_max]``; the **longest** ``n`` that occurs wins;
* among the occurrences of that n-gram, the **earliest** (leftmost) one wins;
* the draft is the (at most ``num_speculative_tokens``) tokens that followed it, fewer if the context ends first,
  none if nothing matched (and never past ``max_model_len``).

It is one KMP pass over the reversed tokens: ``lps[i]`` is the longest prefix of the reversed text (a suffix of the
real one) that also ends at reversed position ``i``, capped at ``prompt_lookup_max``. No model, no KV cache, no
lookahead slots: that is why it runs anywhere, and why it pays only when the output repeats its input (code edits,
summaries that quote, retrieval answers).
"""

from __future__ import annotations

from ...validate import check_int


class NgramProposer:
    """Drafts for each request that sampled a token this step (vLLM's ``NgramProposer.propose``)."""

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int, num_speculative_tokens: int,
                 max_model_len: int = 2**31 - 1):
        self.min_n = check_int("prompt_lookup_min", prompt_lookup_min, minimum=1)
        self.max_n = check_int("prompt_lookup_max", prompt_lookup_max, minimum=self.min_n)
        self.k = check_int("num_speculative_tokens", num_speculative_tokens, minimum=1)
        self.max_model_len = check_int("max_model_len", max_model_len, minimum=1)

    def propose_one(self, token_ids) -> list[int]:
        """The draft for one request's tokens (prompt and outputs, no earlier draft)."""
        tokens = [int(t) for t in token_ids]
        if len(tokens) >= self.max_model_len:  # vLLM skips a request that reached the model's length
            return []
        return _find_longest_matched_ngram_and_propose_tokens(tokens, self.min_n, self.max_n,
                                                              self.max_model_len, self.k)

    def propose(self, token_ids_by_request: dict) -> dict:
        """``{request_id: tokens}`` -> ``{request_id: draft}`` (an empty draft where nothing matched)."""
        return {r: self.propose_one(tokens) for r, tokens in token_ids_by_request.items()}

    def __repr__(self) -> str:
        return f"NgramProposer(prompt_lookup_min={self.min_n}, prompt_lookup_max={self.max_n}, k={self.k})"


def _find_longest_matched_ngram_and_propose_tokens(origin_tokens: list, min_ngram: int, max_ngram: int,
                                                  max_model_len: int, k: int) -> list:
    """vLLM 0.33's function of the same name (Apache-2.0), its comments shortened; vLLM compiles it with numba
    (``@jit(nopython=True)``), here it is plain Python on a list: one pass, well under a millisecond for a few
    thousand tokens, with no compilation to wait for."""
    total_token = len(origin_tokens)
    if total_token < min_ngram:  # context shorter than the shortest n-gram
        return []
    k = min(k, max_model_len - total_token)  # never draft past the model's length
    if k <= 0:
        return []
    # reversed: find the longest prefix (the real suffix) that recurs, at its rightmost reversed position
    tokens = origin_tokens[::-1]
    lps = [0] * max_ngram  # lps[i] = max{v : tokens[0:v] == tokens[i+1-v:i+1]}, i < max_ngram
    longest_ngram = 0
    position = 0
    prev_lps = 0
    i = 1
    while i < total_token:
        if tokens[prev_lps] == tokens[i]:
            prev_lps += 1
            if prev_lps >= longest_ngram:  # ">=": a later reversed match is an earlier one in the real text
                longest_ngram = prev_lps
                position = i
            if i < max_ngram:
                lps[i] = prev_lps
            if prev_lps == max_ngram:  # never match longer than max_ngram
                prev_lps = lps[max_ngram - 1]
            i += 1
        elif prev_lps != 0:
            prev_lps = lps[prev_lps - 1]
        else:
            i += 1
    if longest_ngram < min_ngram:
        return []
    # origin_tokens[total_token-1-position : ... + longest_ngram] is the match; the draft follows it
    start_position = total_token - 1 - position + longest_ngram
    k = min(k, total_token - start_position)
    return origin_tokens[start_position:start_position + k]
