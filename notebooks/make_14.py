"""Writes notebooks/14_speculative_decoding.ipynb (run once, then execute with nbconvert; not shipped)."""

import nbformat as nbf

V = "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm"
cells = []


def md(text):
    cells.append(nbf.v4.new_markdown_cell(text.strip("\n")))


def code(text, **metadata):
    cell = nbf.v4.new_code_cell(text.strip("\n"))
    cell.metadata.update(metadata)
    cells.append(cell)


md(f"""
# 14 · Speculative decoding: KV slots written, then taken back

**Learning goals.** After this notebook you can
1. say how vLLM today (0.33) runs speculative decoding in the scheduler the course already knows: a request's
   **draft tokens** are scheduled as extra query tokens, get KV slots like any token, and are checked by the target
   model in the same forward pass;
2. predict a request's blocks and `num_computed_tokens` after some drafts are **rejected** (the rollback), and
   explain why the blocks stay;
3. explain why a block that holds a draft token is **never hashed** into the prefix cache;
4. read an **acceptance curve** and say when prompt lookup (n-gram drafts) pays and when it costs;
5. say what a draft model or EAGLE adds: **lookahead slots** past the scheduled tokens.

It builds on notebook 10 (vLLM today's scheduler: one token budget, `num_computed_tokens` catching up to
`num_tokens`), 11 (one attention call for every query row of a step, causal within a request) and 04 (a full block
gets a hash and can be shared).
""")

code("""
import matplotlib.pyplot as plt

from pagedkv import LLMEngine, generate_dense, load_tiny
from pagedkv.v1 import KVCacheManager, Request, Scheduler
from pagedkv.v1.spec_decode import NgramProposer
from pagedkv.viz.spec_decode import draw_slot_maps, slot_map

model, tokenizer = load_tiny()  # the small Llama of the course; its tokens are bytes
""")

md(f"""
## 1. Guess cheaply, check in one pass

Decoding makes one token per forward pass, and on a GPU a pass over one new token costs about as much as a pass over
a few: the weights are read once either way. **Speculative decoding** guesses the next `k` tokens cheaply, runs the
target model once over the last token *and* the `k` guesses, and keeps the guesses the model agrees with. Greedy:
guess `i` is kept while it equals the model's argmax after the tokens before it; at the first disagreement the model's
own token replaces it; if all `k` are kept the last row gives one more, the **bonus** token. A step yields 1 to `k + 1`
tokens, exactly the tokens plain decoding would have produced.

The cheapest guesser needs no model at all. vLLM's `ngram` method (**prompt lookup**,
[`ngram_proposer.py`]({V}/v1/spec_decode/ngram_proposer.py)) finds the text's last `n` tokens earlier in the text,
for `n` from `prompt_lookup_max` down to `prompt_lookup_min`, and proposes the `num_speculative_tokens` tokens that
followed. The longest `n` that occurs wins; among its occurrences, the earliest. pagedkv's `NgramProposer` is that
function, line for line.
""")

code("""
text = ("def area(width, height):\\n    return width * height\\n\\nprint(area(2, 3))\\n\\n"
        "def volume(width, height, depth):\\n    return width * ")
proposer = NgramProposer(prompt_lookup_min=2, prompt_lookup_max=4, num_speculative_tokens=6)
draft = proposer.propose_one(tokenizer.encode(text))
print(f"the text ends with {text[-4:]!r}; it occurred earlier, followed by {tokenizer.decode(draft)!r}")
""")

md("""
Code edits, summaries that quote their source and answers about a document repeat long runs of their prompt, so such
guesses are often right. In open prose they rarely are, and a wrong guess still costs its query row.

## 2. Drafts are tokens the scheduler schedules

vLLM 0.33's scheduler has no separate speculative path. A request's drafts sit in `request.spec_token_ids`, and the
scheduler catches `num_computed_tokens` up to
`num_tokens_with_spec = len(prompt_token_ids) + len(output_token_ids) + len(spec_token_ids)` (its own comment at the
top of `schedule()`). So a decode with 4 drafts asks the token budget for 5 tokens, and `allocate_slots` gives all 5 a
KV slot. The drafts that fit go into `SchedulerOutput.scheduled_spec_decode_tokens`, and `spec_token_ids` is emptied:
new drafts arrive after the step (`update_draft_token_ids`).

Below, the scheduler alone, with tokens fed by hand: a 5-token prompt, blocks of 4 slots.
""")

code("""
kv = KVCacheManager(block_size=4, num_gpu_blocks=16)
scheduler = Scheduler(kv, num_spec_tokens=4)
scheduler.add_request("A", [11, 12, 13, 14, 15], 20)
scheduler.update_from_output(scheduler.schedule(), {"A": 16})  # the prefill step samples token 16
request = scheduler.requests["A"]
print(f"num_tokens {request.num_tokens}, num_computed_tokens {request.num_computed_tokens}, "
      f"blocks {kv.get_block_ids('A')}")

scheduler.update_draft_token_ids({"A": [17, 18, 19, 20]})  # what a proposer guessed after that step
out = scheduler.schedule()
print(f"num_scheduled_tokens {out.num_scheduled_tokens}, scheduled_spec_decode_tokens "
      f"{out.scheduled_spec_decode_tokens}, blocks {kv.get_block_ids('A')}")
computed_before = request.num_computed_tokens - out.num_scheduled_tokens["A"]  # schedule() counted the step
scheduled = slot_map(kv.snapshot(), "A", computed_before, request.num_tokens, scheduled_drafts=4,
                     title="step 2 as scheduled")
print(scheduled)
""")

md(f"""
Token 16 (position 5) and the four drafts (positions 6–9) are the step's five query rows; they need slots 5–9, so a
third block arrives. In the forward pass each draft row attends to the rows before it, causally, exactly like the
rows of a prefill chunk (notebook 11): row 6 predicts position 7 as if 17 had been accepted, and so on. Row 5 checks
draft 17, row 6 checks 18, ..., row 9 gives the bonus.

## 3. Predict, then run: one draft accepted

The target model agrees with the first draft (17) and then says 21 where the draft said 18. The model's output for
this request is `[17, 21]`. In 0.33's `update_from_output`
([`scheduler.py`]({V}/v1/core/sched/scheduler.py)): `num_accepted = len(generated_token_ids) - 1`,
`num_rejected = num_draft_tokens - num_accepted`, and `request.num_computed_tokens -= num_rejected`.

**Predict** how many blocks A holds after this step, and its `num_computed_tokens`. Write them as
`prediction = (blocks, num_computed_tokens)` in the cell, then run it.
""")

code("""
prediction = ...  # (blocks, num_computed_tokens)

scheduler.update_from_output(out, {"A": [17, 21]})
truth = (len(kv.get_block_ids("A")), request.num_computed_tokens)
if prediction is Ellipsis:
    print("write your prediction first: prediction = (blocks, num_computed_tokens)")
else:
    print("right" if prediction == truth else "not quite: the map below shows why")
""")

code("""
after = slot_map(kv.snapshot(), "A", request.num_computed_tokens, request.num_tokens, title="after step 2")
print(f"output_token_ids {request.output_token_ids}, num_tokens {request.num_tokens}, "
      f"num_computed_tokens {request.num_computed_tokens}, blocks {kv.get_block_ids('A')}")
print(after)
""")

code("""
fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
draw_slot_maps([scheduled, after], axes)
fig.tight_layout(rect=(0, 0.25, 1, 1))
plt.show()
""", alt="Two slot maps of request A's three blocks: as scheduled, slots 0-4 hold K/V, 5 a new token, 6-9 drafts; "
         "after the step, slots 0-6 hold K/V and 7-9 are rejected drafts' stale slots.")

md("""
Three drafts were rejected (18, 19, 20), so `num_computed_tokens` went from 10 back to 7: positions 0–6 hold verified
K/V (17's K/V is right: it was computed for token 17, which was accepted). Positions 7–9 hold K/V of rejected guesses.
Position 7 is where token 21 goes, and its K/V is written next step, as for any sampled token.

The blocks stay: **3 blocks for 8 tokens**, where `ceil(8 / 4) = 2` would do. vLLM does not give blocks back on a
rejection; the next steps' drafts are likely to need them again, and a block table only grows (until the request
finishes or is preempted).

## 4. The next step overwrites the rejected slots

A rejected draft's slot is never read before it is written again: the next step schedules from
`num_computed_tokens`, so its first query row is position 7, and in every layer the step's new K/V go into the cache
(`reshape_and_cache`) before the attention call reads any of them. The tests poison such slots with NaN after each
step and still get every token right.
""")

code("""
scheduler.update_draft_token_ids({"A": [22, 23]})
out = scheduler.schedule()
computed_before = request.num_computed_tokens - out.num_scheduled_tokens["A"]
print(f"scheduled {out.num_scheduled_tokens}: positions {computed_before}..{request.num_computed_tokens - 1}; "
      f"blocks {kv.get_block_ids('A')}")
print(slot_map(kv.snapshot(), "A", computed_before, request.num_tokens, scheduled_drafts=2,
               title="step 3 as scheduled"))
""")

md(f"""
No new block: the table already covers positions 7–9. And block 1 (positions 4–7) has a hash now, not before.

## 5. Why a block holding a draft is never hashed

After step 2's allocation, slots 4–7 of block 1 were all going to be written (15, 16, 17 and the draft 18). Had
block 1 been hashed then, its hash would name the tokens `15 16 17 18`, and a later request whose prompt continues
that way could hit it, sharing K/V of a token that was never accepted; after the rollback, step 3 rewrites slot 7
with 21's K/V under that same name. So vLLM caches only up to `request.num_tokens`, which never counts a draft
(`KVCacheManager.allocate_slots` in [`kv_cache_manager.py`]({V}/v1/core/kv_cache_manager.py)):

```python
# NOTE(woosuk): We want to commit (cache) up to num_local_computed_tokens
# + num_external_computed_tokens + num_new_tokens, but must exclude
# "non-committable" tokens (e.g., draft tokens that could be rejected).
# Therefore, we cap the number at `request.num_tokens`, ensuring only
# "finalized" tokens are cached.
num_tokens_to_cache = min(
    total_computed_tokens + num_new_tokens,
    request.num_tokens,
)
```

In step 3, `num_tokens` is 8, so block 1 (tokens `15 16 17 21`) is named when it is scheduled, and its slot 7 is
written in that very step before any row reads it, as for every decode. A block gets a hash only for tokens that will
stay.

## 6. The engine: the same tokens, fewer steps

`LLMEngine(..., version="v1", speculative_config={{...}})` takes vLLM's keys. After each step the n-gram proposer
drafts for every request that sampled, the scheduler schedules those drafts, the forward verifies them in its one
attention call per layer, and the rejection sampler decides (greedy: the longest matching prefix plus one).
`engine.stats` counts as vLLM's `SpecDecodingStats` does
([`metrics.py`]({V}/v1/spec_decode/metrics.py)): `num_drafts`, `num_draft_tokens`, `num_accepted_tokens`, and
`num_accepted_tokens_per_pos`, whose ratio to `num_drafts` is the **per-position acceptance rate** vLLM logs.
""")

code("""
spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
prompts = {"repetitive": tokenizer.encode("x = 1\\nx = 1\\nx = 1\\nx"),
           "docstring": tokenizer.encode(">>> a = [1, 2, 3]\\n>>> a\\n[1, 2, 3]\\n>>> b = [1, 2, 3]\\n>>> b\\n")}
curves = {}
for name, prompt in prompts.items():
    engine = LLMEngine(model, version="v1", num_gpu_blocks=32, block_size=4, speculative_config=spec)
    (tokens,) = engine.generate([prompt], 24)
    assert tokens == generate_dense(model, prompt, 24)  # speculation never changes the answer
    s = engine.stats
    curves[name] = s.acceptance_rate_per_pos
    print(f"{name:>10}: {len(tokens)} tokens in {s.steps} steps; {s.num_drafts} drafts, {s.num_draft_tokens} "
          f"draft tokens, {s.num_accepted_tokens} accepted; per position "
          f"{[round(r, 2) for r in s.acceptance_rate_per_pos]}")
""")

code("""
fig, ax = plt.subplots(figsize=(5, 2.8))
for name, curve in curves.items():
    ax.plot(range(1, len(curve) + 1), curve, "o-", label=name)
ax.set_xticks(range(1, 5))
ax.set_xlabel("draft position i")
ax.set_ylabel("drafts with tokens 1..i accepted")
ax.set_ylim(0, 1)
ax.legend(frameon=False)
ax.set_title("acceptance per position (tiny model, k = 4)", fontsize=10)
fig.tight_layout()
plt.show()
""", alt="Acceptance rate per draft position for two prompts: high and falling for the repetitive one, low for the "
        "docstring.")

md("""
The curve never rises: a draft is accepted left to right, so position `i + 1` is accepted only where `i` was. A step
with a draft yields `1 + accepted` tokens on average (vLLM's "mean acceptance length"), and each step costs one
forward over `1 + k` rows per request instead of 1. That is the whole trade:

* it pays when the forward is **memory-bound** (a GPU at small batch: the weights are read once for 1 row or 5) and
  the acceptance is high (text that repeats its prompt);
* it loses where extra rows cost nearly their full price: at **large batches** (the forward is already
  compute-bound, and every rejected draft row is work thrown away) or on **open prose** (few drafts accepted).
  `benchmarks/RESULTS.md` has SmolLM2's numbers on this course's CPU, losses included.

## 7. What a draft model or EAGLE adds: lookahead slots

Prompt lookup only reads tokens. A **draft model** or an **EAGLE** head is a small network that runs after the
target on the new tokens and then on each of its own guesses, `k - 1` more times (the drafting loop in
[`llm_base_proposer.py`]({V}/v1/spec_decode/llm_base_proposer.py) uses the target's block table). Its guesses'
K/V go into the request's slots **past** the tokens the target was scheduled for, so the scheduler asks
`allocate_slots` for `num_lookahead_tokens` more; `VllmConfig.num_lookahead_tokens` is `num_speculative_tokens` for
EAGLE and draft models and 0 for n-gram ([`config/vllm.py`]({V}/config/vllm.py)). pagedkv's `allocate_slots` takes
the same argument:
""".replace("{V}", V))

code("""
for lookahead in (0, 4):
    kv = KVCacheManager(block_size=4, num_gpu_blocks=16)
    request = Request("B", list(range(6)), max_tokens=20)
    kv.allocate_slots(request, 6, num_lookahead_tokens=lookahead)
    print(f"num_lookahead_tokens={lookahead}: {len(kv.get_block_ids('B'))} blocks for 6 tokens; "
          f"cached blocks {sum(kv.block_pool.block_hash(b) is not None for b in kv.get_block_ids('B'))}")
""")

md("""
Four lookahead slots push 6 tokens' slots to 10: a third block. Lookahead slots are never cached either: they lie past
`request.num_tokens`. (vLLM passes `num_lookahead_tokens` when it admits a waiting request too. A draft model also
needs a second model's weights and KV cache, which is why this course's laptop runs n-gram.)

## Exercise
""")

md("""
**E1 · Rollback at a block boundary.** Blocks of 16 slots, prefix caching on. A request has `num_tokens = 28` and
`num_computed_tokens = 27` (a decode), and the proposer gives it 6 drafts; the budget schedules all of them. The
target accepts the first draft only. After `update_from_output`, how many blocks does the request hold, what is its
`num_computed_tokens`, and how many of its blocks are in the prefix cache? Set `e1 = (blocks, num_computed_tokens,
cached_blocks)`.
""")

code("""
### BEGIN SOLUTION
e1 = (3, 29, 1)
### END SOLUTION
""", nbgrader={"grade": False, "grade_id": "spec-rollback-blocks-answer", "locked": False, "schema_version": 3,
               "solution": True, "task": False})

code("""
from pagedkv.labs import check  # pagedkv must be installed where this runs (grading too)
check.exercise("spec-rollback-blocks", e1)
""", nbgrader={"grade": True, "grade_id": "spec-rollback-blocks-check", "locked": True, "points": 1,
               "schema_version": 3, "solution": False, "task": False})

md("""
## What vLLM does beyond this

vLLM 0.33 can also pad new decodes' drafts to one length, change `k` with the batch size (dynamic speculative decoding),
and, with async scheduling (notebook 16), schedules the next step before this one's drafts are verified, keeping
placeholders for the tokens in flight. The rule this notebook is about stays: drafts get slots like any token,
rejected ones roll `num_computed_tokens` back, and only `num_tokens` is ever hashed.
""")

nb = nbf.v4.new_notebook(cells=cells)
nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
               "language_info": {"name": "python"}}
nbf.write(nb, "notebooks/14_speculative_decoding.ipynb")
