"""vLLM 0.33's ``AsyncScheduler``, readable: schedule step N+1 while step N still runs.

vLLM 0.33 does this in ``vllm/v1/core/sched/async_scheduler.py`` (56 lines) and turns it on by default
(``VllmConfig``, ``vllm/config/vllm.py``: ``async_scheduling=None`` becomes True unless an option is incompatible);
pagedkv's ``LLMEngine`` keeps it off unless asked (``async_scheduling=True``), since the course teaches the
synchronous loop first.

The engine keeps two steps in flight (``LLMEngine``'s batch queue, vLLM's ``EngineCore.step_with_batch_queue``), so
``schedule()`` for step N+1 runs before step N's sampled tokens are known. A request that samples in step N gets a
**placeholder**: ``num_output_placeholders`` counts its token nobody has seen yet, and since
``num_computed_tokens`` already counts step N's tokens, the next ``schedule()`` hands it ``num_tokens +
num_output_placeholders - num_computed_tokens = 1`` token: a slot is allocated, and the model runner feeds the
token that step N samples (vLLM 0.33's default Model Runner V2: ``combine_sampled_and_draft_tokens`` reads
``req_states.last_sampled_tokens`` on the GPU; the older V1 runner: ``_prepare_input_ids`` and
``prev_sampled_token_ids``).

The rest lives where 0.33 puts it, in ``Scheduler`` (``scheduler.py``), and does nothing when there is no
placeholder: ``update_from_output`` turns each returned token's placeholder into a token (``-1``), drops the output
of a request finished or aborted while the step ran, and delivers the output of one preempted while it ran as
"stale" (its token is appended to the output, but changes neither ``num_computed_tokens`` nor
``num_output_placeholders``: ``_preempt_request`` already reset them). ``schedule()`` gives no
extra step to a request whose step in flight samples its last token (``max_tokens``); a stop token or EOS cannot
be known in advance, so that request has one step too many: one slot allocated and one token computed, then thrown
away.

With speculative decoding the placeholders cover the drafts a step verifies too, and the next step's drafts are
``-1`` placeholders in ``spec_token_ids`` that vLLM's model runner fills in on the GPU (``ngram_gpu``, EAGLE);
0.33's V1 model runner refuses async scheduling with the CPU ``ngram`` method, and so does pagedkv's engine, whose
n-gram proposer runs on the main thread after each step's output.
"""

from __future__ import annotations

from .scheduler import Scheduler, SchedulerOutput


class AsyncScheduler(Scheduler):
    """``Scheduler`` that leaves a placeholder for each token a scheduled step will sample."""

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        super()._update_after_schedule(out)
        for request_id in out.num_scheduled_tokens:
            request = self.requests[request_id]
            if request.is_prefill_chunk:
                continue  # samples nothing this step
            # the token it samples, and the drafts it verifies (each becomes a token or is rolled back)
            request.num_output_placeholders += 1 + len(out.scheduled_spec_decode_tokens.get(request_id, ()))
            # its next drafts are not known either: -1 placeholders, which vLLM's worker fills in on the GPU
            request.spec_token_ids = [-1] * self.num_spec_tokens
