"""The engine end to end on CPU: the tiny Llama (paged vs static batches), or SmolLM2 against transformers.

    python benchmarks/bench_engine.py [--requests 48] [--budget 4096]
    python benchmarks/bench_engine.py --model smollm2 [--requests 32] [--hf-batch 16]
    python benchmarks/bench_engine.py --model smollm2 --async-scheduling [--requests 32] [--repeats 2]

``--model smollm2``: a real chat model, SmolLM2-135M-Instruct, served four ways on the same prompts: pagedkv's
``LLMEngine`` v0 and v1 (chunked prefill), transformers' ``generate`` in padded static batches, and transformers' own
continuous batching (``init_continuous_batching``, paged attention, on CPU here); greedy answers asserted equal
first; useful tokens/s and tokens/s over every token the model computed, against the matmul limit the script
measures. See :func:`smollm2_main`.

``--async-scheduling``: the same SmolLM2 workload through ``LLMEngine(version="v1")`` synchronous and with
``async_scheduling=True`` (vLLM 0.33's default: step N+1 scheduled while step N runs, the model on a worker
thread), runs alternated (ABBA...), answers asserted equal; useful tokens/s, and where the wall time went. See
:func:`smollm2_async_main`.

Both sides run the same model code and the same attention call (``unified_paged_attention``); only the policy
differs:

* **paged**: ``LLMEngine`` with ``budget / block_size`` blocks, continuous batching, preemption by recompute;
* **static + reserve_max**: each request reserves a contiguous ``max_len`` chunk, so ``budget // max_len``
  requests fit; they run as one batch until the longest finishes, then the next batch starts.

Requests: a ShareGPT-like length mix (log-normal, ``pagedkv.sim.synthetic_lengths``) scaled by 1/4 to the tiny
model's context (means ~40 prompt / ~85 output tokens, at most ``max_len`` = 512), prompts cut from the corpus.
Also: tokens/s of one request alone, paged vs dense, which is the cost of paging itself.
"""

import argparse
import os
import time

from pagedkv import ModelSpec
from pagedkv.engine import LLMEngine
from pagedkv.model import generate_dense, load_tiny
from pagedkv.sim import synthetic_lengths
from pagedkv.train_tiny import corpus

from _common import best_of, machine

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
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--requests", type=int, default=None, help="48 for the tiny model, 32 for SmolLM2")
    parser.add_argument("--budget", type=int, default=4096, help="KV budget in token slots, the same for both")
    parser.add_argument("--hf-batch", type=int, default=16, help="SmolLM2: transformers generate's batch size")
    parser.add_argument("--block-size", type=int, default=16, help="SmolLM2: pagedkv's block size")
    parser.add_argument("--async-scheduling", action="store_true", help="SmolLM2: v1 synchronous vs async")
    parser.add_argument("--repeats", type=int, default=2, help="--async-scheduling: runs of each, alternated")
    args = parser.parse_args()
    if args.model == "smollm2":
        args.requests = args.requests or 32
        return smollm2_async_main(args) if args.async_scheduling else smollm2_main(args)
    args.requests = args.requests or 48
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


# ----------------------------------------------------------------------------------- SmolLM2 vs transformers
QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Who wrote Hamlet?", "What is 12 times 7?",
    "Give me three tips for a good night's sleep.", "Explain photosynthesis to a ten-year-old.",
    "What is the difference between a list and a tuple in Python?", "Name the planets of the solar system.",
    "Write a short story about a robot who learns to paint.", "How do vaccines work?",
    "Translate 'good morning' into Spanish and French.", "What causes the seasons on Earth?",
    "Suggest a name for a bakery.", "Describe the water cycle.", "Why is the sky blue?",
    "Write a limerick about a cat.",
]


def chat_workload(tokenizer, num_requests, seed=0):
    """``(prompt ids, max_tokens)``: chat prompts of mixed length and ShareGPT-like output limits (16-128).

    Every other request after the first 16 asks about a passage of the Python docs (100-600 words), so prompt
    lengths spread from ~35 to ~900 tokens, as real conversations do.
    """
    text = corpus().decode("utf-8", errors="replace").split()
    lengths = synthetic_lengths("sharegpt", num_requests, seed, 4096)
    requests = []
    for i, (prompt_len, output_len) in enumerate(lengths):
        question = QUESTIONS[i % len(QUESTIONS)]
        if i >= len(QUESTIONS) and i % 2:
            words = min(600, max(100, prompt_len))
            start = (i * 7919) % (len(text) - words)
            question = f"Summarize this passage in two sentences:\n\n{' '.join(text[start:start + words])}"
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        requests.append((ids, min(128, max(16, output_len // 2))))
    return requests


def useful(tokens, max_tokens, eos):
    """What a user gets: tokens up to the request's limit and its EOS, nothing generated after either."""
    tokens = list(tokens)[:max_tokens]
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def run_pagedkv(model, requests, block_size=16, version="v0", max_num_batched_tokens=4096):
    """All requests at once through LLMEngine; (seconds, outputs, time to first token of each, peak blocks,
    tokens the model computed (prompt tokens not served by the prefix cache, and outputs)).

    The pool holds every request at its longest (no preemption, as transformers holds them all too), and is
    allocated before the clock starts, as vLLM sizes its cache at start-up. Prefix caching on (vLLM's default).
    ``version="v1"`` with a small ``max_num_batched_tokens``: chunked prefill, prompts split across steps that
    also carry the running requests' decodes.
    """
    blocks = sum(-(-(len(p) + m) // block_size) for p, m in requests)
    engine = LLMEngine(model, num_gpu_blocks=blocks, block_size=block_size, version=version,
                       max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=True)
    start, first = time.perf_counter(), {}
    for i, (prompt, max_tokens) in enumerate(requests):
        engine.add_request(i, prompt, max_tokens)
    while engine.has_unfinished_requests():
        engine.step()
        now = time.perf_counter() - start
        for i in range(len(requests)):  # a request's first token: the end of the step that sampled it
            if i not in first and (i in engine.scheduler.finished or _num_output_tokens(engine, i)):
                first[i] = now
    seconds = time.perf_counter() - start
    outputs = [engine.scheduler.finished[i] for i in range(len(requests))]
    return (seconds, outputs, [first[i] for i in range(len(requests))], engine.stats.peak_gpu_blocks,
            engine.stats.num_computed_tokens)


def _num_output_tokens(engine, request_id) -> int:
    request = engine.scheduler.requests.get(request_id)  # v0 and v1 alike
    return len(request.output_token_ids) if request is not None else 0


def run_hf_static(hf, requests, batch_size, pad_id):
    """transformers ``generate``, greedy, left-padded static batches in arrival order."""
    import torch

    start, outputs, first = time.perf_counter(), [], []
    for b in range(0, len(requests), batch_size):
        batch = requests[b:b + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        batch_start = time.perf_counter() - start
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=max(m for _, m in batch), do_sample=False,
                          pad_token_id=pad_id)
        outputs += [row[width:].tolist() for row in out]
        first += [batch_start] * len(batch)  # a static batch's first tokens come after its prefill (not timed)
    return time.perf_counter() - start, outputs, first


def run_hf_continuous(hf, requests, eos):
    """transformers' continuous batching: every request added with its own max_new_tokens, results collected."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max(m for _, m in requests), do_sample=False, eos_token_id=eos,
                              pad_token_id=eos)
    start, results = time.perf_counter(), {}
    with hf.continuous_batching_context_manager(generation_config=config, block=True, timeout=5) as manager:
        ids = [manager.add_request(p, request_id=f"r{i}", max_new_tokens=m) for i, (p, m) in enumerate(requests)]
        while len(results) < len(ids):
            result = manager.get_result(timeout=1)
            if result is not None and result.is_finished():
                results[result.request_id] = result.generated_tokens
    return time.perf_counter() - start, [results[i] for i in ids]


def matmul_rate(config, rows):
    """Best measured float32 GFLOP/s of torch on this model's own weight shapes, ``rows`` tokens at a time."""
    import torch

    h, i, kv = config.hidden_size, config.intermediate_size, config.num_key_value_heads * config.head_dim
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]
    weights = [torch.randn(o, n) for o, n in shapes]
    x, y = torch.randn(rows, h), torch.randn(rows, i)
    flops = sum(2 * rows * o * n for o, n in shapes)

    def layer():
        for (_, n), w in zip(shapes, weights):
            (y if n == i else x) @ w.T
    return flops / best_of(lambda: [layer() for _ in range(10)], 5) * 10 / 1e9


def smollm2_main(args):
    """SmolLM2-135M-Instruct: pagedkv vs transformers generate vs transformers continuous batching."""
    import torch
    import transformers

    from pagedkv.model import load_smollm2, smollm2_path

    load_start = time.perf_counter()
    model, tokenizer = load_smollm2()
    load_seconds = time.perf_counter() - load_start
    path = smollm2_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    c, eos = model.config, model.config.eos_token_id
    spec = ModelSpec("smollm2", c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                     "float32")
    requests = chat_workload(tokenizer, args.requests)
    print(f"machine: {machine()}, torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"transformers {transformers.__version__}")
    print(f"load_smollm2(): {load_seconds:.1f} s")
    print(f"{len(requests)} chat requests: prompts {min(len(p) for p, _ in requests)}-"
          f"{max(len(p) for p, _ in requests)} tokens (mean {sum(len(p) for p, _ in requests) / len(requests):.0f}),"
          f" max_tokens {min(m for _, m in requests)}-{max(m for _, m in requests)} "
          f"(mean {sum(m for _, m in requests) / len(requests):.0f}), greedy, EOS stops")
    run_pagedkv(model, requests[:2])  # compile the CPU attention kernel before timing

    p_seconds, p_out, p_first, p_peak, p_computed = run_pagedkv(model, requests)
    v_seconds, v_out, v_first, v_peak, v_computed = run_pagedkv(model, requests, version="v1",
                                                                max_num_batched_tokens=512)
    with torch.inference_mode():
        s_seconds, s_out, s_first = run_hf_static(hf, requests, args.hf_batch, eos)
    c_seconds, c_out = run_hf_continuous(hf, requests, eos)  # its own thread: not under inference_mode
    p_out, v_out, s_out, c_out = ([useful(t, m, eos) for t, (_, m) in zip(out, requests)]
                                  for out in (p_out, v_out, s_out, c_out))
    same_v1 = sum(a == b for a, b in zip(p_out, v_out))
    same_static = sum(a == b for a, b in zip(p_out, s_out))
    same_cb = sum(a == b for a, b in zip(p_out, c_out))
    print(f"greedy outputs equal to pagedkv v0's: pagedkv v1 {same_v1}/{len(requests)}, transformers generate "
          f"{same_static}/{len(requests)}, continuous batching {same_cb}/{len(requests)}")
    assert same_v1 == len(requests), "v0 and v1 run the same model on the same pages: they must agree"
    assert same_cb == len(requests), "pagedkv and transformers' unpadded continuous batching must agree"
    assert same_static >= len(requests) - 2, "padding may flip a near-tie, not more"

    kv_token = spec.kv_bytes_per_token
    static_peak = max(len(p) for p, _ in requests) + max(m for _, m in requests)
    rate = matmul_rate(c, rows=len(requests))
    flops_per_token = 2 * sum(p.numel() for n, p in model.named_parameters() if "norm" not in n)
    limit = rate * 1e9 / flops_per_token
    print(f"the limit: torch float32 matmul on this model's shapes, {len(requests)} rows: {rate:.1f} GFLOP/s; "
          f"{flops_per_token / 1e6:.0f} MFLOP per token -> at most {limit:.0f} tokens/s")
    prompts = sum(len(p) for p, _ in requests)
    print(f"{'':40} useful tok/s  mean TTFT  peak KV     useful/limit  all tok/s  all/limit")
    rows = [("pagedkv LLMEngine v0", p_out, p_seconds, p_first, p_peak, p_computed),
            ("pagedkv LLMEngine v1 (chunked, 512)", v_out, v_seconds, v_first, v_peak, v_computed),
            (f"transformers generate (batch {args.hf_batch})", s_out, s_seconds, s_first, None, None),
            ("transformers continuous batching", c_out, c_seconds, None, None, None)]
    for name, out, seconds, first, peak, computed in rows:
        n = sum(len(t) for t in out)
        computed = computed or prompts + n  # transformers computes every prompt token (no prefix cache)
        ttft = f"{sum(first) / len(first):6.2f} s" if first else "     n/a"
        kv = (f"{peak * args.block_size * kv_token / 2**20:6.1f} MiB" if peak else
              f"{args.hf_batch * static_peak * kv_token / 2**20:6.1f} MiB" if first else "       n/a")
        print(f"{name:40} {n / seconds:10.1f}  {ttft}  {kv}  {n / seconds / limit:8.1%}  {computed / seconds:9.1f}"
              f"  {computed / seconds / limit:8.1%}")
    tokens = sum(len(t) for t in p_out)
    cb, gen = sum(len(t) for t in c_out), sum(len(t) for t in s_out)
    print(f"tokens the model computed: pagedkv v0 {p_computed:,}, v1 {v_computed:,} (prompt tokens from the prefix "
          f"cache not counted); transformers {prompts + gen:,} (generate) / {prompts + cb:,} (continuous batching)")
    for name, seconds in (("v0", p_seconds), ("v1", v_seconds)):
        print(f"summary: pagedkv {name} / transformers continuous batching {c_seconds / seconds * tokens / cb:.2f}x,"
              f" pagedkv {name} / transformers generate {s_seconds / seconds * tokens / gen:.2f}x")


# ----------------------------------------------------------------------------------- async scheduling
def run_v1_timed(model, requests, async_scheduling: bool, block_size=16, max_num_batched_tokens=512):
    """``run_pagedkv``'s v1 engine (chunked prefill, budget 512, the pool holds every request), synchronous or
    async; every request added at once, then ``step()`` until all are done. Returns (seconds, outputs, times): the
    seconds the model side was busy (``_forward`` and the draws: what a GPU does in vLLM) and, on the main thread,
    the seconds spent waiting for a step's output (async only; the synchronous loop runs the model itself)."""
    import torch

    blocks = sum(-(-(len(p) + m) // block_size) for p, m in requests)
    engine = LLMEngine(model, num_gpu_blocks=blocks, block_size=block_size, version="v1",
                       max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling)
    times = {"device": 0.0, "wait": 0.0}

    def timed(name, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[name] += time.perf_counter() - start
        return call

    if async_scheduling:
        engine.trace = []  # the forward thread's spans (placeholders filled, forward, draws) and the main's waits
    else:
        engine._forward = timed("device", engine._forward)
        engine._sample = timed("device", engine._sample)
    with torch.inference_mode(), engine:
        start = time.perf_counter()
        for i, (prompt, max_tokens) in enumerate(requests):
            engine.add_request(i, prompt, max_tokens)
        while engine.has_unfinished_requests() or engine.batch_queue:
            engine.step()
        seconds = time.perf_counter() - start
    for event in engine.trace or ():
        if event.kind in ("forward", "wait"):
            times["device" if event.kind == "forward" else "wait"] += event.end - event.start
    return seconds, [engine.scheduler.finished[i] for i in range(len(requests))], times, engine.stats


def smollm2_async_main(args):
    """SmolLM2-135M-Instruct, the chat workload, v1 synchronous vs async scheduling, alternated runs.

    Reported per mode (summed over its runs): useful tokens/s; the model side's busy share of the wall (the
    forward and the draws, what the GPU does in vLLM) and its idle share, the time async scheduling exists to fill;
    the main thread's host share (scheduling, building the batch, processing outputs: for the synchronous loop the
    wall less the model side, for the async one the wall less its waits for a step's output).
    """
    import torch

    from pagedkv.model import load_smollm2

    model, tokenizer = load_smollm2()
    eos = model.config.eos_token_id
    requests = chat_workload(tokenizer, args.requests)
    print(f"machine: {machine()}, torch {torch.__version__} with {torch.get_num_threads()} threads; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the start")
    print(f"{len(requests)} chat requests (bench_engine.py's SmolLM2 workload), v1, chunked prefill (512), greedy, "
          f"EOS stops; {args.repeats} runs of each, alternated")
    run_pagedkv(model, requests[:2])  # compile the CPU attention kernel before timing
    totals = {mode: {"seconds": 0.0, "device": 0.0, "wait": 0.0, "useful": 0, "computed": 0} for mode in (0, 1)}
    answers = {}
    order = [(0, 1) if r % 2 == 0 else (1, 0) for r in range(args.repeats)]
    for r, pair in enumerate(order):
        for mode in pair:
            seconds, outputs, times, stats = run_v1_timed(model, requests, bool(mode))
            useful_out = [useful(t, m, eos) for t, (_, m) in zip(outputs, requests)]
            answers.setdefault(mode, useful_out)
            assert useful_out == answers[mode], "one mode must answer the same in every run"
            t = totals[mode]
            t["seconds"] += seconds
            t["device"] += times["device"]
            t["wait"] += times["wait"]
            t["useful"] += sum(len(o) for o in useful_out)
            t["computed"] += stats.num_computed_tokens
            print(f"  run {r + 1} {('sync', 'async')[mode]:5}: {seconds:6.1f} s, "
                  f"{sum(len(o) for o in useful_out) / seconds:6.1f} useful tok/s, {stats.steps} steps, "
                  f"load average {os.getloadavg()[0]:.1f}")
    assert answers[0] == answers[1], "async scheduling must not change a single token"
    print(f"answers equal, token for token: {len(requests)}/{len(requests)}")
    print(f"{'':28} useful tok/s  model busy  model idle  main-thread host work  tokens computed")
    rates = {}
    for mode, name in ((0, "v1 synchronous"), (1, "v1 async scheduling")):
        t = totals[mode]
        host = t["seconds"] - (t["wait"] if mode else t["device"])
        rates[mode] = t["useful"] / t["seconds"]
        busy = t["device"] / t["seconds"]
        print(f"{name:28} {rates[mode]:11.1f}  {busy:9.1%}  {1 - busy:9.1%}  {host / t['seconds']:20.1%}  "
              f"{t['computed'] // args.repeats:15,}")
    print(f"summary: async / sync useful tokens/s {rates[1] / rates[0]:.2f}x")


if __name__ == "__main__":
    main()
