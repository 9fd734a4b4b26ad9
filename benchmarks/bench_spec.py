"""Speculative decoding with n-gram drafts (prompt lookup) on SmolLM2-135M-Instruct, on this CPU.

    python benchmarks/bench_spec.py [--k 4] [--min 2] [--max 4] [--max-tokens 48] [--requests-b1 4]

Two workloads of 8 chat prompts each:

* **lookup pays** (written here): code edits that print the whole file back with one change, and answers that
  quote their source (extract the sentence, fix the typos, turn a list into a table). The answer repeats long runs
  of the prompt, so a draft copied from the prompt is often right.
* **open-ended**: questions whose answers quote nothing (a poem, an explanation, a story). Drafts are proposed
  only where a 2-gram recurs, and are mostly rejected: the extra query rows are pure cost.

Each runs at batch 1 (one request at a time) and at batch 8 (all at once), with and without
``speculative_config={"method": "ngram", ...}``, through the same ``LLMEngine(version="v1")``; the answers are
asserted equal token for token first, then: useful tokens/s (tokens a user gets, per wall second), the speedup, the
acceptance rate and tokens per step, and the rows the model computed (drafts cost compute even when rejected).
Greedy decoding; the pool holds every request (no preemption); prefix caching on (vLLM's default).
"""

import argparse
import os
import time

from pagedkv.engine import LLMEngine
from pagedkv.model import load_smollm2

from _common import machine, python_speed

CODE = '''def load_config(path):
    with open(path) as f:
        lines = f.read().splitlines()
    config = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config
'''

TEXT = ("The Amazon rainforest covers about five and a half million square kilometres. It is home to around ten "
        "percent of all known species on Earth. Scientists estimate that the forest holds more than one hundred "
        "billion tonnes of carbon. Deforestation has removed roughly seventeen percent of the forest in the last fifty "
        "years. Many researchers warn that losing another fifth could turn parts of it into dry savanna.")

LOOKUP = [
    f"Rename the variable `lines` to `rows` in this Python function. Print the whole function.\n\n{CODE}",
    f"Add a docstring to this Python function and print the whole function.\n\n{CODE}",
    f"Change this function so that it skips lines starting with ';' too. Print the whole function.\n\n{CODE}",
    f"Copy this text exactly, fixing only the spelling mistakes:\n\n{TEXT.replace('species', 'speceis')}",
    f"Quote the sentence about carbon from this text, word for word.\n\n{TEXT}",
    f"Quote the first two sentences of this text exactly.\n\n{TEXT}",
    f"Repeat this text exactly:\n\n{TEXT}",
    "Turn this list into a Markdown table with columns Name and Role:\n- Alice: engineer\n- Bob: designer\n"
    "- Carol: manager\n- Dave: analyst\n- Eve: tester\n- Frank: writer",
]

OPEN = ["Write a short poem about the sea.", "Why is the sky blue? Answer in a paragraph.",
        "Tell me a short story about a robot who learns to paint.", "Give me three ideas for a birthday party.",
        "What are the benefits of learning a second language?", "Describe a sunrise in the mountains.",
        "How do airplanes stay in the air?", "Invent a name and a slogan for a coffee shop."]


def engine_for(model, prompts, max_tokens, spec):
    blocks = sum(-(-(len(p) + max_tokens + 8) // 16) for p in prompts) + 4  # everyone fits: no preemption
    return LLMEngine(model, version="v1", num_gpu_blocks=blocks, block_size=16, speculative_config=spec)


def run(model, prompts, max_tokens, spec, batch):
    """Both engines on ``prompts``, ``batch`` at a time, the two alternating batch by batch (so a change in the
    machine's load hits both alike). Returns {name: (seconds, outputs, stats)}."""
    engines = {"base": engine_for(model, prompts, max_tokens, None), "spec": engine_for(model, prompts, max_tokens,
                                                                                          spec)}
    seconds, outputs = {"base": 0.0, "spec": 0.0}, {"base": [], "spec": []}
    for i in range(0, len(prompts), batch):
        for name, engine in engines.items():
            start = time.perf_counter()
            outputs[name] += engine.generate(prompts[i:i + batch], max_tokens)
            seconds[name] += time.perf_counter() - start
    eos = model.config.eos_token_id
    assert all(o[-1] == eos or len(o) == max_tokens for o in outputs["base"])
    return {name: (seconds[name], outputs[name], engines[name].stats) for name in engines}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--min", type=int, default=2, help="prompt_lookup_min")
    parser.add_argument("--max", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--requests-b1", type=int, default=4, help="prompts run one at a time (batch 1)")
    parser.add_argument("--workloads", default="lookup,open")
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args()
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": args.min,
            "prompt_lookup_max": args.max}
    print(f"# {machine()}; load average {os.getloadavg()[0]:.2f} at start; python loop {python_speed():.2f} s")
    model, tokenizer = load_smollm2()
    chat = [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in LOOKUP + OPEN]
    workloads = {"lookup": chat[:len(LOOKUP)], "open": chat[len(LOOKUP):]}
    run(model, chat[:1], 4, spec, 1)  # warm up (kernels, allocator)
    print(f"# speculative_config={spec}; max_tokens={args.max_tokens}; greedy; block_size 16; batch 1 runs the "
          f"first {args.requests_b1} prompts one at a time, batch 8 all 8 at once")
    print("| workload | batch | tokens | no spec tok/s | ngram tok/s | speedup | acceptance | tokens/step | "
          "rows computed (x) | step time (x) | accepted per position |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.workloads.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            prompts = workloads[name][:args.requests_b1 if batch == 1 else batch]
            result = run(model, prompts, args.max_tokens, spec, batch)
            (base_s, base_out, base), (spec_s, spec_out, stats) = result["base"], result["spec"]
            assert spec_out == base_out, "speculation changed an answer"
            tokens = sum(len(o) for o in base_out)
            per_step = (stats.num_accepted_tokens + stats.num_drafts) / stats.num_drafts if stats.num_drafts else 1
            print(f"| {name} | {batch} | {tokens} | {tokens / base_s:.1f} | {tokens / spec_s:.1f} | "
                  f"{base_s / spec_s:.2f}x | {stats.acceptance_rate:.0%} | {per_step:.2f} | "
                  f"{stats.num_computed_tokens / base.num_computed_tokens:.2f} | "
                  f"{(spec_s / stats.steps) / (base_s / base.steps):.2f} | "
                  f"{[round(r, 2) for r in stats.acceptance_rate_per_pos]} |", flush=True)
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
