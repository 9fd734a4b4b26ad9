"""Beam search as vLLM does it today: a loop *outside* the engine, one request per beam per step.

vLLM's engine lost beam search in v0.6.3 (PR #9105); since then ``LLM.beam_search`` (0.33:
``vllm/entrypoints/generate/beam_search/``) drives the engine from outside. Every step it sends each live beam's
whole token list (prompt + generated so far) as a new request with ``max_tokens=1`` and ``logprobs=2 *
beam_width``, ranks the proposals with ``beam_search_score`` and keeps the best ``beam_width``. Nothing is
forked and nothing is copied on write: the beams share their common prefix only through the **prefix cache**,
so each step recomputes at most the tokens after a beam's last cached full block.

Works on either engine version; on v0 turn prefix caching on, or every step recomputes every beam.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PagedKVValueError
from ..sampling import BeamSearchParams, CompletionOutput, RequestOutput, SamplingParams, beam_search_score


@dataclass
class BeamSearchSequence:
    """One beam (vLLM: ``BeamSearchSequence``): its generated tokens and their summed log-probability."""

    token_ids: list
    cumulative_logprob: float = 0.0


def beam_search(engine, prompts: list, params: BeamSearchParams) -> list[RequestOutput]:
    """vLLM's ``LLM.beam_search`` loop on ``engine``: one ``RequestOutput`` per prompt, beams best first; equal
    to ``beam_search_dense`` for each prompt."""
    if not isinstance(params, BeamSearchParams):
        raise PagedKVValueError(f"params must be a BeamSearchParams, got {params!r}.")
    prompts = [engine.model.check_prompt(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
    eos = None if params.ignore_eos else engine.model.config.eos_token_id
    step_params = SamplingParams(temperature=0, max_tokens=1, logprobs=2 * params.beam_width, ignore_eos=True)
    beams = [[BeamSearchSequence([])] for _ in prompts]  # live beams per prompt
    completed = [[] for _ in prompts]

    def score(beam):
        return beam_search_score(len(beam.token_ids), beam.cumulative_logprob, params.length_penalty)

    for _ in range(params.max_tokens):
        live = [(i, beam) for i, group in enumerate(beams) for beam in group]
        if not live:
            break
        outputs = engine.generate([prompts[i] + beam.token_ids for i, beam in live], step_params)
        candidates = [[] for _ in prompts]
        for (i, beam), output in zip(live, outputs):
            if not output.outputs[0].token_ids:  # the engine ignored it: it can never fit the pool
                raise PagedKVValueError(f"a beam of prompt {i} ({len(prompts[i]) + len(beam.token_ids)} tokens) does "
                                        "not fit the engine's pool; give it more num_gpu_blocks.")
            for token, logprob in output.outputs[0].logprobs[0].items():
                child = BeamSearchSequence(beam.token_ids + [token], beam.cumulative_logprob + logprob)
                (completed[i] if token == eos else candidates[i]).append(child)
        beams = [sorted(c, key=score, reverse=True)[:params.beam_width] for c in candidates]
    results = []
    for i, prompt in enumerate(prompts):
        best = sorted(completed[i] + beams[i], key=score, reverse=True)[:params.beam_width]
        results.append(RequestOutput(None, prompt, [
            CompletionOutput(j, b.token_ids, b.cumulative_logprob, "stop" if b.token_ids[-1:] == [eos] else "length")
            for j, b in enumerate(best)]))
    return results
