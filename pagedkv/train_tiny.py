"""Train the tiny Llama that pagedkv ships:  ``python -m pagedkv.train_tiny [--out DIR] [--steps N]``.

The corpus is the English prose of the Python documentation's topics
(``pydoc_data/topics.py``, part of every CPython install, under the Python
Software Foundation License), read from the running Python, as UTF-8 bytes.
The model reads bytes (256 token ids), so there is no tokenizer to download.

The run is deterministic on one machine: a fixed seed, deterministic torch
algorithms and a fixed number of threads.  It writes ``config.json``,
``model.safetensors`` and a ``README.md`` with the numbers of the run.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import TINY_DIR, ByteTokenizer, LlamaConfig, LlamaForCausalLM, generate_dense

CONFIG = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
SEQ_LEN, BATCH, LR, WARMUP = 128, 32, 3e-3, 100


def corpus() -> bytes:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics)).encode("utf-8")


def batches(data: torch.Tensor, generator: torch.Generator):
    while True:
        starts = torch.randint(0, len(data) - SEQ_LEN - 1, (BATCH,), generator=generator)
        chunk = torch.stack([data[s:s + SEQ_LEN + 1] for s in starts.tolist()])
        yield chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def evaluate(model, data: torch.Tensor, generator: torch.Generator, num_batches: int = 8) -> float:
    model.eval()
    losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
              for _, (x, y) in zip(range(num_batches), batches(data, generator))]
    model.train()
    return sum(losses) / len(losses)


def train(steps: int, out: Path, threads: int = 2, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    text = corpus()
    data = torch.tensor(list(text), dtype=torch.long)
    split = int(0.95 * len(data))
    train_data, val_data = data[:split], data[split:]
    model = LlamaForCausalLM(CONFIG)
    for p in model.parameters():  # small init, as GPT-2 / Llama do
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARMUP) * 0.5 * (
        1 + math.cos(math.pi * min(s, steps) / steps)))
    stream = batches(train_data, torch.Generator().manual_seed(seed))
    start, loss = time.time(), float("nan")
    for step in range(1, steps + 1):
        x, y = next(stream)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps:
            print(f"step {step:>5}  loss {loss.item():.3f}  {time.time() - start:6.0f} s", flush=True)
    minutes = (time.time() - start) / 60
    val_loss = evaluate(model, val_data, torch.Generator().manual_seed(seed + 1))
    model.eval()
    model.save_pretrained(out)
    sample = ByteTokenizer().decode(generate_dense(model, ByteTokenizer().encode("The "), 120))
    numbers = dict(steps=steps, minutes=minutes, train_loss=loss.item(), val_loss=val_loss,
                   params=sum(p.numel() for p in model.parameters()), corpus_bytes=len(text),
                   corpus_sha256=hashlib.sha256(text).hexdigest()[:16], sample=sample,
                   machine=f"{platform.processor() or platform.machine()}, {threads} threads, "
                           f"torch {torch.__version__}, Python {platform.python_version()}")
    write_readme(out, numbers)
    return numbers


def write_readme(out: Path, n: dict) -> None:
    size_mb = (out / "model.safetensors").stat().st_size / 1e6
    c = CONFIG
    (out / "README.md").write_text(f"""# tiny-llama: the model pagedkv serves

A Llama-architecture decoder (RoPE, RMSNorm, SwiGLU, grouped-query attention) small enough to train on a
laptop CPU, trained by `python -m pagedkv.train_tiny`. Loaded by `pagedkv.model.load_tiny()`; no download.

| | |
|---|---|
| layers, hidden, MLP | {c.num_hidden_layers}, {c.hidden_size}, {c.intermediate_size} |
| heads (query / KV), head size | {c.num_attention_heads} / {c.num_key_value_heads}, {c.head_dim} |
| parameters | {n['params']:,} ({size_mb:.1f} MB in float32 safetensors) |
| tokenizer | UTF-8 bytes (256 ids) |
| corpus | the Python documentation's topics, `pydoc_data/topics.py` of Python {platform.python_version()}: \
{n['corpus_bytes']:,} bytes (sha256 {n['corpus_sha256']}...) |
| licence of the corpus | Python Software Foundation License v2 (permissive), as the Python documentation |
| training | {n['steps']:,} steps of {BATCH} x {SEQ_LEN} bytes, AdamW, lr {LR} with warm-up and cosine decay, seed 0 |
| training time | {n['minutes']:.1f} min on {n['machine']} |
| final loss (nats/byte) | train {n['train_loss']:.3f}, validation (last 5% of the corpus) {n['val_loss']:.3f} |

Greedy continuation of `"The "` (120 bytes):

```text
{n['sample']}
```

It writes English-looking prose about Python with a byte-level model of under a million parameters: good
enough to show that paging changes nothing in the output, which is all it is for.
""")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TINY_DIR)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    numbers = train(args.steps, args.out, args.threads)
    print(f"wrote {args.out}: val loss {numbers['val_loss']:.3f} after {numbers['minutes']:.1f} min")
    print(numbers["sample"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
