"""Helpers for notebook 15 (KV offloading): run one turn and read the engine's counters, report one step, and read
the loads a step planned. They only read what ``LLMEngine`` and its connector already expose."""

import copy


def serve_turn(engine, request_id, prompt, names, after_admission=None, max_tokens=8):
    """Run one turn to its end and return ``((from_gpu, from_cpu, computed, stored), answer)``.

    ``from_gpu``: prompt tokens from the GPU prefix cache; ``from_cpu``: tokens loaded from the CPU tier;
    ``computed``: prompt tokens the model computed; ``stored``: the blocks this turn stored in the CPU tier, by their
    names in ``names``, in chunk order. ``after_admission(out)`` is called with the output of the step that admitted
    the request.

    The counters are ``engine.stats`` after minus before. ``num_computed_tokens`` counts prompt and answer tokens
    alike: the prompt's last step samples the first answer token, and each later answer token costs one decode step
    of one token, so ``computed`` is the difference minus ``len(answer) - 1``.
    """
    before = copy.copy(engine.stats)
    held = {c.block_hash for c in engine.scheduler.connector.snapshot().chunks}
    engine.add_request(request_id, prompt, max_tokens)
    out = engine.step()
    if after_admission is not None:
        after_admission(out)
    while request_id in engine.scheduler.requests:
        engine.step()
    answer = engine.pop_finished(request_id).outputs[0].token_ids
    s = engine.stats
    from_gpu = s.num_prefix_cached_tokens - before.num_prefix_cached_tokens
    from_cpu = s.num_offload_loaded_tokens - before.num_offload_loaded_tokens
    computed = s.num_computed_tokens - before.num_computed_tokens - (len(answer) - 1)
    chunks = sorted(engine.scheduler.connector.snapshot().chunks, key=lambda c: c.chunk_id)
    stored = [names.get(c.block_hash, "?") for c in chunks if c.block_hash not in held]
    return (from_gpu, from_cpu, computed, stored), answer


def load_targets(engine, out, names):
    """The loads the step that returned ``out`` planned: ``{GPU block id: name of the CPU chunk copied into it}``."""
    chunk_names = {c.chunk_id: names[c.block_hash] for c in engine.scheduler.connector.snapshot().chunks}
    jobs = out.kv_connector_metadata.load_jobs.values()
    return {block: chunk_names[chunk] for job in jobs for chunk, block in zip(job.src, job.dst)}


def report_step(engine, request, out):
    """Prints, for the step just taken (its output ``out``), the request's status, ``num_computed_tokens``, the
    tokens scheduled for it and the connector's load and store jobs."""
    meta = out.kv_connector_metadata
    print(f"step {engine.stats.steps}: {request.status.name}, num_computed_tokens {request.num_computed_tokens}, "
          f"{out.num_scheduled_tokens.get(request.request_id, 0)} tokens scheduled, {len(meta.load_jobs)} load and "
          f"{len(meta.store_jobs)} store jobs planned")


def step_and_report(engine, request_id):
    """One engine step, then ``report_step``. Returns the step's output (a ``SchedulerOutput``)."""
    request = engine.scheduler.requests[request_id]  # before the step, which may finish it
    out = engine.step()
    report_step(engine, request, out)
    return out
