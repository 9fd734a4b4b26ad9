"""The engine end to end with the tiny Llama on CPU: paged continuous batching vs static contiguous batches.

    python benchmarks/bench_engine.py [--requests 48] [--budget 4096]

Both sides run the same model code and the same attention kernel (the numba CPU twin); only the policy differs:

* **paged**: ``LLMEngine`` with ``budget / block_size`` blocks, continuous batching, preemption by recompute;
* **static + reserve_max**: each request reserves a contiguous ``max_len`` chunk, so ``budget // max_len``
  requests fit; they run as one batch until the longest finishes, then the next batch starts.

Requests: a ShareGPT-like length mix (log-normal, ``pagedkv.sim.synthetic_lengths``) scaled by 1/4 to the tiny
model's context (means ~40 prompt / ~85 output tokens, at most ``max_len`` = 512), prompts cut from the corpus.
Also: tokens/s of one request alone, paged vs dense, which is the cost of paging itself.
"""

import argparse
import time

from pagedkv import ModelSpec
from pagedkv.engine import LLMEngine
from pagedkv.model import generate_dense, load_tiny
from pagedkv.sim import synthetic_lengths
from pagedkv.train_tiny import corpus

from _common import machine

BLOCK_SIZE, MAX_LEN = 16, 512


def workload(num_requests, seed=0):
    text = corpus()
    lengths = synthetic_lengths("sharegpt", num_requests, seed, 4 * MAX_LEN)
    pairs = [(max(1, p // 4), max(1, o // 4)) for p, o in lengths]
    return [(list(text[i * 997:i * 997 + p]), o) for i, (p, o) in enumerate(pairs)]


def serve(engine, requests, batch_size=None):
    """Run every request; ``batch_size`` set: static batches. Returns (seconds, tokens generated)."""
    start, generated = time.perf_counter(), 0
    batches = [requests] if batch_size is None else [requests[i:i + batch_size]
                                                      for i in range(0, len(requests), batch_size)]
    for n, batch in enumerate(batches):
        for i, (prompt, max_tokens) in enumerate(batch):
            engine.add_request((n, i), prompt, max_tokens)
        while engine.has_unfinished_requests():
            engine.step()
        generated += sum(len(t) for t in engine.scheduler.finished.values())
        engine.scheduler.finished.clear()
    return time.perf_counter() - start, generated


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--budget", type=int, default=4096, help="KV budget in token slots, the same for both")
    args = parser.parse_args()
    model, _ = load_tiny()
    c = model.config
    spec = ModelSpec("tiny", c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                     "float32")
    requests = workload(args.requests)
    print(f"machine: {machine()}")
    print(f"{args.requests} requests, mean prompt {sum(len(p) for p, _ in requests) / len(requests):.0f}, "
          f"mean output {sum(o for _, o in requests) / len(requests):.0f} tokens; KV budget {args.budget:,} token "
          f"slots = {args.budget * spec.kv_bytes_per_token / 2**20:.1f} MiB for both")
    LLMEngine(model, num_gpu_blocks=8, block_size=BLOCK_SIZE).generate([[1, 2]], 2)  # compile the kernel first

    paged = LLMEngine(model, num_gpu_blocks=args.budget // BLOCK_SIZE, block_size=BLOCK_SIZE,
                      max_num_batched_tokens=MAX_LEN * 4)
    seconds, tokens = serve(paged, requests)
    peak = paged.stats.peak_gpu_blocks * BLOCK_SIZE * spec.kv_bytes_per_token
    print(f"paged, continuous : {args.requests / seconds:6.2f} requests/s {tokens / seconds:8.1f} tokens/s  "
          f"peak KV {peak / 2**20:5.2f} MiB  ({paged.stats.steps} steps, {paged.stats.num_preemptions} preemptions)")
    batch = args.budget // MAX_LEN
    static = LLMEngine(model, num_gpu_blocks=args.budget // BLOCK_SIZE, block_size=BLOCK_SIZE, max_num_seqs=batch,
                       max_num_batched_tokens=MAX_LEN * 4)
    s_seconds, s_tokens = serve(static, requests, batch_size=batch)
    reserved = batch * MAX_LEN * spec.kv_bytes_per_token
    print(f"static, reserve_max: {args.requests / s_seconds:6.2f} requests/s {s_tokens / s_seconds:8.1f} tokens/s  "
          f"peak KV {reserved / 2**20:5.2f} MiB reserved  (batches of {batch}, {static.stats.steps} steps)")
    print(f"throughput, paged / static: {s_seconds / seconds:.2f}x")

    prompt, n = requests[0][0], 200
    dense_s = time.perf_counter()
    dense_out = generate_dense(model, prompt, n)
    dense_s = time.perf_counter() - dense_s
    single = LLMEngine(model, num_gpu_blocks=64, block_size=BLOCK_SIZE)
    paged_s = time.perf_counter()
    paged_out = single.generate([prompt], n)[0]
    paged_s = time.perf_counter() - paged_s
    assert paged_out == dense_out
    print(f"one request, {n} tokens: dense {n / dense_s:6.1f} tokens/s, paged {n / paged_s:6.1f} tokens/s "
          f"(paged / dense time {paged_s / dense_s:.2f}x)")


if __name__ == "__main__":
    main()
