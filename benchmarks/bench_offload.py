"""A CPU tier behind the GPU pool (issue #43): multi-turn chat on SmolLM2, with and without offloading.

Every turn resends the conversation's history (as a chat server's clients do), and the GPU pool keeps only about two
conversations: by the time a conversation's next turn arrives, its blocks have left the GPU pool. Without a CPU
tier its whole history is computed again; with vLLM 0.33's native ``OffloadingConnector`` (``kv_offloading_size``
GiB) the prompt blocks stored to CPU come back by a copy. The answers are asserted equal across every
configuration before any figure is printed.

    python benchmarks/bench_offload.py [--conversations 6] [--turns 3] [--max-tokens 32] [--sizes 0.01 0.03 0.1]

Figures: prompt tokens computed (and the share the tier saved), tokens copied to and from the CPU tier, and useful
tokens/s (answers up to EOS, over the wall time of all turns). The speed is a ratio inside one run (the machine is
shared: the load average is printed beside it).
"""

import argparse
import os
import time

from pagedkv import LLMEngine
from pagedkv.model import load_smollm2, load_tiny

from _common import machine, python_speed

FIRST = ["Name the planets of the solar system.", "Why is the sky blue?", "How do vaccines work?",
         "Describe the water cycle.", "Suggest a name for a bakery.", "What causes the seasons on Earth?",
         "Write a limerick about a cat.", "What is the difference between a list and a tuple in Python?"]
FOLLOW_UPS = ["Tell me more about that.", "Can you give an example?", "Summarize your answer in one sentence.",
              "Why does that matter?"]


def serve_chat(model, tokenizer, conversations, turns, max_tokens, pool, **offload):
    """Every conversation's turns, round by round (each round: every conversation's next turn at once). Returns
    (answers per round, seconds, engine stats, useful tokens, the last prompts, CPU tier blocks)."""
    engine = LLMEngine(model, version="v1", **pool, **offload)
    chat = hasattr(tokenizer, "apply_chat_template") and getattr(tokenizer, "chat_template", None)
    history = [tokenizer.apply_chat_template([{"role": "user", "content": q}]) if chat else tokenizer.encode(q + " ")
               for q in FIRST[:conversations]]
    eos, rounds, useful = getattr(tokenizer, "eos_token_id", None), [], 0
    start = time.perf_counter()
    for turn in range(turns):
        answers = engine.generate(history, max_tokens)
        rounds.append(answers)
        useful += sum(len(a) for a in answers)
        if turn + 1 < turns:
            question = FOLLOW_UPS[turn % len(FOLLOW_UPS)]
            if chat:
                follow = tokenizer.encode("\n<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n")
                history = [h + a + ([] if a[-1:] == [eos] else [eos]) + follow for h, a in zip(history, answers)]
            else:
                history = [h + a + tokenizer.encode(" " + question + " ") for h, a in zip(history, answers)]
    seconds = time.perf_counter() - start
    connector = engine.scheduler.connector
    return rounds, seconds, engine.stats, useful, history, connector.num_cpu_blocks if connector else "-"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.01, 0.03, 0.1], help="CPU tiers in GiB")
    args = parser.parse_args()
    print(machine(), f"| load average {os.getloadavg()[0]:.1f} | python loop {python_speed():.2f} s")
    model, tokenizer = load_smollm2() if args.model == "smollm2" else load_tiny()
    # the pool runs two conversations at their longest (max_num_seqs=2) and keeps little more between turns
    longest = 40 + args.turns * (args.max_tokens + 20)
    blocks_per_conversation = -(-longest // args.block_size)
    pool = dict(num_gpu_blocks=2 * blocks_per_conversation + 2, block_size=args.block_size, max_num_seqs=2)
    runs = {"no CPU tier": serve_chat(model, tokenizer, args.conversations, args.turns, args.max_tokens, pool)}
    for gib in args.sizes:
        runs[f"CPU tier {gib:g} GiB"] = serve_chat(model, tokenizer, args.conversations, args.turns, args.max_tokens,
                                                   pool, kv_offloading_size=gib)
    answers = [r[0] for r in runs.values()]
    assert all(a == answers[0] for a in answers), "offloading changed an answer"
    prompts = sum(len(h) for h in runs["no CPU tier"][4])  # the last round's prompts
    print(f"{args.model}: {args.conversations} conversations x {args.turns} turns, at most {args.max_tokens} tokens "
          "an answer; "
          f"GPU pool {pool['num_gpu_blocks']} blocks of {args.block_size} (two conversations running), last round's "
          f"prompts {prompts} tokens in all; answers equal in every run")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    base_computed, base_speed = runs["no CPU tier"][2].num_computed_tokens, None
    print(f"{'':24s}{'CPU blocks':>11s}{'computed':>10s}{'saved':>8s}{'stored':>8s}{'loaded':>8s}{'evicted':>8s}"
          f"{'preempt':>8s}{'seconds':>9s}{'useful tok/s':>13s}{'vs none':>8s}")
    for name, (_, seconds, stats, useful, _, engine_blocks) in runs.items():
        speed = useful / seconds
        base_speed = base_speed or speed
        print(f"{name:24s}{engine_blocks!s:>11s}{stats.num_computed_tokens:>10,d}{stats.num_offload_saved_tokens:>8,d}"
              f"{stats.num_offload_stored_tokens:>8,d}{stats.num_offload_loaded_tokens:>8,d}"
              f"{stats.num_offload_evicted_tokens:>8,d}{stats.num_preemptions:>8d}{seconds:>9.1f}{speed:>13.1f}"
              f"{speed / base_speed:>7.2f}x")
    print(f"tokens computed include decodes; without a tier {base_computed:,d}")


if __name__ == "__main__":
    main()
