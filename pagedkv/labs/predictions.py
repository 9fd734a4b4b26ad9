"""Every "predict, then run" question of the course: what the check calls it, a hint, and the slips behind
known wrong answers.

A prediction earns no points: the student writes a guess, the next cell runs the package, and
``check.prediction(key, prediction, truth)`` compares the guess with what the run produced (``truth``, computed in
that cell). The hint and the known wrong answers live here, keyed by a stable slug as ``exercises.py`` keeps the
exercises, so the check cell a student reads shows neither a wrong answer to work back from nor a nudge before
the guess is made. ``notebook`` names its notebook without the number, as an exercise's does.

``mistakes`` pairs a wrong answer (written as the slip computes it, so ``42 + 27`` says where it comes from) with
what to rethink; ``check`` prints the matching one instead of "not right", and the hint for any other wrong answer.

A question asked before anything runs (an exercise's warm-up) has no run to compare with: its ``expected`` computes
the answer from the package, as an exercise's does, and its check cell passes the guess alone,
``check.prediction(key, prediction)``, so the cell shows no call that would print the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Prediction:
    title: str  # what the verdict calls it: "your prediction (B's block table)"
    notebook: str  # the notebook's file name without its number and ".ipynb"
    hint: str = ""
    mistakes: tuple = ()  # (a known wrong answer, what was wrong in the reasoning that gives it)
    tolerance: float = 0.0  # relative: an estimate (a share, a ratio) is right within this fraction of the run's
    sizes: bool = True  # False: a part of the wrong length is only "not right" (where its length is half the answer)
    expected: Callable[[], object] | None = None  # no run to compare with: the answer, from the package
    from_run: Callable[[object], object] | None = None  # the check cell passes the run itself: the value to compare,
    # worked out of it here, so the cell shows no formula that would give the method away


def _first_victim_back(run) -> tuple:
    """Notebook 12's tight pool, from what its ``serve`` recorded (each step's tables, step -> victims, step ->
    requests back): the first victim's number, and the block ids the worker is sent for it in the step it comes
    back, its whole table, as vLLM 0.33 sends a resumed request (``sent_to_worker``: it held no table the step
    before)."""
    tables, preempted, back = run
    victim = preempted[min(preempted)][0]
    comeback = min(step for step, requests in back.items() if victim in requests)
    return int(victim.removeprefix("req")), len(tables[comeback][victim])


def _beam_ceiling(beam) -> float:
    """The most a beam search could save: at its last step, where it peaks without sharing, its beams would share
    every block but the one that holds their newest token, which distinct beams must keep apart (one block each)."""
    last = beam.steps[-1]
    per_beam = last.blocks_without_sharing // last.num_seqs
    return 1 - (per_beam - 1 + last.num_seqs) / beam.peak_without_sharing


def _step_grid(grid) -> tuple:
    """Notebook 11's launch of section 4's step, from ``kernel_figures.unified_grid`` (``cuda_unified.launch_plan``
    and, per tile, ``tile_owner``): queries a tile, query tiles, programs, and the first spare tile."""
    tiles, kv_heads, segments = grid.plan.grid
    return grid.plan.block_q, tiles, tiles * kv_heads * segments, grid.tiles.index(None)


def _more_preemptions_and_why(preempted: dict) -> tuple:
    """Notebook 10's admission at scale: which of v0 (recompute) and today preempts more often, from the run's
    counts; and the setting behind it: ``"watermark"`` if v0 with its watermark at today's default (0) preempts
    exactly as often as today on the same workload (one more run of the notebook's simulation), else None."""
    from ..sim import simulate

    today, v0 = preempted["today"], preempted["v0 recompute"]
    which = "same" if today == v0 else "today" if today > v0 else "v0"
    v0_no_watermark = simulate(policy="paged", workload="sharegpt", num_requests=200, block_size=16,
                               budget_tokens=8192, progress=False, watermark=0.0)
    return which, "watermark" if v0_no_watermark.preemptions == today else None


def _async_wall_estimate(run) -> float:
    """Async over synchronous wall time as the loop's estimate gives it from the stand-in's knobs, not the clock (the
    machine's load moves the clock): a synchronous step takes its host work and its forward one after the other; the
    async run, while each forward outlasts the host work beside it, takes its forwards back to back plus the first
    schedule and the last update. ``run``: the async engine, after its run."""
    steps = sum(e.kind == "forward" for e in run.trace)
    forward, host = run.simulated_forward_ms, 2 * run.simulated_host_ms  # host: a schedule and an update
    assert forward >= host, "the estimate holds while each forward outlasts its step's host work"
    return (steps * forward + host) / (steps * (forward + host))


PREDICTIONS: dict[str, Prediction] = {
    # ----------------------------------- block_size_arithmetic
    "mqa-times-smaller": Prediction(
        "your prediction (times smaller per token)", "block_size_arithmetic", tolerance=0.02,
        hint="only KV heads are cached: how many does each model keep per layer, and how wide is each?",
        mistakes=(
            (32 * 128 / (71 * 64), "you counted Falcon-7B's 71 query heads; whose K and V does the cache hold, and "
                                   "how many such heads does multi-query attention have per layer?"),
            (71 * 64 / (32 * 128), "you counted Falcon-7B's 71 query heads; whose K and V does the cache hold, and "
                                   "how many such heads does multi-query attention have per layer?"),
            (32,
             "you compared the number of KV heads only; Falcon-7B's heads are also narrower (64 against 128)."),
            (2, "you compared the heads' widths only; how many KV heads does each model keep per layer?"),
        ),
    ),
    "v033-extra-tokens-falcon": Prediction(
        "your prediction (tokens more in falcon-7b's cache in 0.33)", "block_size_arithmetic", tolerance=0.25,
        hint="first the bytes: what do the two extra points of gpu_memory_utilization give on an 80 GiB card, and "
             "what does 0.33 take out of them that v0.6.3 did not? Then how many bytes does one falcon-7b token take "
             "(section 1's table)?",
        mistakes=(
            (0.6, "that is the extra memory in GiB; the question asks how many tokens it holds."),
            (1.6 * 2**30 / 8192, "0.92 against 0.90 is right, but 0.33 also subtracts its CUDA-graph estimate, which "
                                 "v0.6.3 did not take from its budget."),
            (2.6 * 2**30 / 8192, "the CUDA-graph estimate is taken out of 0.33's budget, not added to it."),
        ),
    ),
    "block16-waste-share": Prediction(
        "your prediction (% of slots wasted at block size 16)", "block_size_arithmetic",
        hint="only a sequence's last block can be partly empty. Over many lengths, how many of its 16 slots are "
             "empty on average (not in one sequence), and how many slots does a sequence of average length hold?",
        mistakes=(
            (15 / 1024 * 100, "that is one sequence whose last block is nearly empty, like the 1,025 tokens above; "
                              "over many lengths a last block is on average about half full."),
            (16 / 1025 * 100, "that is a whole empty block per sequence; a last block is on average about half full."),
        ),
        tolerance=0.25,
    ),
    "layer-page-bytes": Prediction(
        "your prediction (page bytes: gpt-oss sliding, gpt-oss full, DeepSeek-V3 MLA)", "block_size_arithmetic",
        hint="a page is one block of one layer: how many tokens does it hold, and what does that kind of layer keep "
             "for each of them (which heads, which vectors, how wide, how many bytes a value)?",
        mistakes=(
            ((128 * 8 * 128 * 2, 16 * 8 * 128 * 2, 16 * 576 * 2),
             "how many tokens does one page hold: as many as the window, or block_size?"),
            ((16 * 8 * 64 * 2, 16 * 8 * 64 * 2, 16 * 576 * 2),
             "an attention layer keeps both K and V for each token."),
            ((16 * 64 * 128 * 2, 16 * 64 * 128 * 2, 16 * 576 * 2),
             "which heads does a layer cache: its query heads, or its KV heads?"),
            ((16 * 8 * 128 * 2, 16 * 8 * 128 * 2, 2 * 16 * 576 * 2),
             "does MLA keep a V beside its latent?"),
            ((16 * 8 * 128 * 2, 16 * 8 * 128 * 2, 128 * 16 * 576 * 2),
             "is MLA's latent kept for each head, or once for all of them?"),
            ((16 * 8 * 128 * 2, 16 * 8 * 128 * 2, 16 * 512 * 2),
             "MLA keeps a RoPE key beside the latent."),
        ),
    ),

    # ----------------------------------- memory_waste
    "oracle-chunk-share": Prediction(
        "your prediction (% of request 0's oracle chunk in token states, on average over its decode steps)",
        "memory_waste", tolerance=0.05,
        hint="what does the chunk hold after its first decode step, what after its last, and how much does each step "
             "add in between?",
        mistakes=(
            (100 * 120 / 449, "that is the chunk at admission, its prompt alone; each decode step fills one more of "
                              "its slots."),
            (50, "the chunk does not start empty: the prompt's tokens are in it from admission on."),
            (100, "the chunk is full only after its last token; until then some of its slots wait for tokens to "
                  "come."),
        ),
    ),
    "fig2-oracle-share": Prediction(
        "your prediction (% of the memory in token states under the oracle)", "memory_waste", tolerance=0.1,
        hint="start from how full the oracle's chunks are over their lives (section 2), then take away the memory "
             "no chunk holds while requests wait: how much can sit in holes between chunks of every size?",
        mistakes=(
            (60, "60% is how full the oracle's chunks are (section 2); while requests wait, the free slots between "
                 "chunks are part of the memory too."),
            (100, "the oracle wastes no slot past a request's last token, but a chunk holds its future tokens' slots "
                  "from admission on, and the holes between chunks hold nothing."),
        ),
    ),
    "fig2-paged-waste": Prediction(
        "your prediction (% of the memory paging does not keep in token states)", "memory_waste", tolerance=0.35,
        hint="a paged request's only empty slots are in its last block: about how many, beside the few hundred "
             "tokens a running request holds? Then: which blocks sit free while requests wait, by section 2's box "
             "(how the head of the queue is admitted, and the watermark)?",
        mistakes=(
            (0, "paging leaves no holes, but a request's last block is partly empty, and some blocks stay free while "
                "requests wait."),
            (100 * 8 / 490, "that is the last blocks' empty halves; blocks also sit free while requests wait: the "
                            "head of the queue waits for all its prompt's blocks, and the watermark keeps some back "
                            "(section 2's box)."),
        ),
    ),
    "alpaca-paged-waste": Prediction(
        "your prediction (% of the memory paging does not keep in token states on Alpaca)", "memory_waste",
        tolerance=0.35,
        hint="where are a paged request's empty slots, and about how many are there on average? Set them beside the "
             "tokens an Alpaca request holds on average over its life, not beside ShareGPT's few hundred.",
        mistakes=(
            (100 - 97.0, "that is ShareGPT's waste; an Alpaca request is far shorter, but its last block is as big."),
            (0, "paging leaves no holes, but a request's last block is partly empty, and some blocks stay free while "
                "requests wait."),
        ),
    ),
    "block-256-token-share": Prediction(
        "your prediction (% in token states at block size 256)", "memory_waste",
        hint="how many slots of a 256-token last block are empty on average, beside a request of about 500 tokens?",
        mistakes=(
            (97, "a small block wastes little, but the last block's empty half grows with the block."),
        ),
        tolerance=0.1,
    ),
    "budget-doubled-shares": Prediction(
        "your prediction (the oracle's and paging's token-state shares when the budget about doubles: rise, fall or "
        "stay)",
        "memory_waste",
        hint="doubling the memory about doubles how many requests run at once. Does a request's own waste, as a share "
             "of what it holds, depend on how many others run beside it?",
        mistakes=(
            (("rise", "rise"), "more memory holds more token states, but also more reservations and more free "
                               "slots: a share compares the two, and each request wastes as much as before."),
        ),
    ),
    # ----------------------------------- free_list_allocation
    "free-queue-next-block": Prediction(
        "your prediction (the block handed out next)", "free_list_allocation",
        hint="where did free_blocks put block 0: at the head, where get_new_blocks looks, or the tail?",
        mistakes=(
            (3,
             "that is first freed, first reused: a block put back at the tail. Look at the free queue printed after "
             "free_blocks."),
        ),
    ),
    "refcount-free-queue": Prediction(
        "your prediction (the free queue after the second free_blocks)", "free_list_allocation",
        hint="what is block 0's count after get_new_blocks and touch, what does each free_blocks do to it, and where "
             "does a block go when its count reaches 0?",
        mistakes=(
            ([1, 2, 3], "touch made two owners, and free_blocks ran twice: what is block 0's count after the second "
                        "call, and what happens to a block at 0?"),
            ([1, 2, 3, 0], "the count did reach 0, but with caching off a freed block goes to the head of the queue, "
                           "not the tail (section 1)."),
            ([0, 0, 1, 2, 3], "a block is in the free queue once or not at all; a count above 1 keeps it out."),
        ),
    ),
    "token-in-a-slot": Prediction(
        "your prediction (the request and position slot 13 holds)", "free_list_allocation",
        hint="run the formula backwards: which physical block holds slot 13, and how far into it is the slot? Then "
             "whose table holds that block, at which entry?",
        mistakes=(
            (("B", 13), "13 is the slot, a place in the pool; a position counts the request's own logical blocks, "
                        "entry by entry of its table."),
            (("B", 1), "1 is how far into its block the slot is; the position also counts the blocks before it in "
                       "B's table."),
            (("B", 13 - 6), "that is a contiguous cache, B's tokens right after A's 6; in pages each request fills "
                            "blocks of its own, and A's second block keeps its two empty slots."),
        ),
    ),
    "decode-table-and-slot": Prediction(
        "your prediction (A's table after 3 steps, the slot of A's newest token)", "free_list_allocation",
        hint="when does A's last block fill up, where does the next block come from (the free queue printed in "
             "section 3), and at which offset of it does the newest token sit?",
        mistakes=(
            (([0, 1, 2], 8), "block 2 is B's; a new block comes from the head of the free queue, whatever A's blocks "
                             "are."),
            (([0, 1, 5], 8), "8 is the newest token's position in A; its slot is its place in the pool, in the "
                             "physical block that holds it."),
            (([0, 1, 5], 5 * 4 + 1), "A's 9th token is at position 8: which offset of its third block is that?"),
        ),
    ),
    "free-queue-after-finish": Prediction(
        "your prediction (the queue's first three)", "free_list_allocation",
        hint="two things decide it: the order free() hands the blocks over, and which end of the queue a freed block"
             " joins (section 1).",
        mistakes=(
            ([2, 3, 4], "that is the table in its own order; free() reverses it first."),
            ([6, 7, 8], "with caching off, which end of the queue does a freed block join?"),
        ),
    ),
    "decode-steps-until-none": Prediction(
        "your prediction (the first decode step that gets None)", "free_list_allocation",
        hint="a decode step asks for one token's slot: when does that need a new block, how full is the running "
             "request's last block now, and how many decode tokens do the free blocks hold? Does section 6's watermark "
             "rule concern a running request?",
        mistakes=(
            (40 * 16, "that is the last step that still got its slot; the question is the first that does not."),
            (40, "that counts blocks; a decode step adds one token, and a block holds 16."),
            (1 + 39 * 16, "at that step the call takes the last free block and returns it, not None."),
            (16 + 40 * 16 + 1, "960 tokens fill their 60 blocks exactly: step 1's token already needs a new block."),
        ),
    ),
    "v0-admission-status": Prediction(
        "your prediction (OK, LATER or NEVER, per prompt)", "free_list_allocation",
        hint="first the watermark in blocks; then, for each prompt, two questions: would it leave the watermark free "
             "in an empty pool of 100 blocks, and does it leave it free of the 40 free now?",
        mistakes=(
            (("OK", "LATER", "LATER"), "1,600 tokens is 100 blocks, the whole pool: even in an empty pool, what would "
                                       "it leave for the watermark?"),
            (("OK", "NEVER", "NEVER"), "NEVER asks about the whole pool, not the blocks free now: would 45 blocks fit "
                                       "once the running request finishes?"),
            (("LATER", "LATER", "NEVER"), "30 blocks of the 40 free leave 10: is that less than the watermark?"),
        ),
    ),
    "swap-in-table": Prediction(
        "your prediction (A's GPU table after swap-in in 0.6.3, the slot of A's last token)", "free_list_allocation",
        hint="write 0.6.3's deque out after every step: which ids sit at its head after swap-out, and in which order? "
             "X takes from there first, then A, one block per table entry; then slot = block * 4 + offset.",
        mistakes=(
            (([5, 6, 7], 28), "that is pagedkv's queue printed above, with freed blocks at the tail; 0.6.3's "
                              "appendleft puts each freed block at the head."),
            (([2, 1, 0], 0), "X asked first: it takes blocks from the head before A is swapped back in."),
            (([2, 3, 4], 16), "each appendleft puts its block in front of the one freed before it: after 0, 1, 2 are "
                              "freed in that order, which is at the head?"),
            (([0, 1, 2], 8), "A's old blocks went back to the deque at swap-out, and X asked for blocks before A came "
                             "back."),
        ),
    ),

    # ----------------------------------- prefix_caching
    "hash-chain-names-changed": Prediction(
        "your prediction (names changed)", "prefix_caching", sizes=False,
        hint="which blocks get a name at all, and what goes into each block's name besides its own tokens?",
        mistakes=(
            (([0], [2]), "each name also hashes its parent's name: is anything that goes into block 1's name changed?"),
            (([0, 1, 2, 3], [2, 3]), "only full blocks get a name: how many of the 14 tokens fill whole blocks of 4?"),
        ),
    ),
    "second-request-cached-tokens": Prediction(
        "your prediction (req1's cached tokens, req1's block table)", "prefix_caching",
        hint="which of req1's blocks are full, and which of those has req0 named already? How many blocks does req0 "
             "hold, and where do req1's other blocks come from?",
        mistakes=(
            ((12, [0, 1, 2, 3, 4]), "req1 takes references only on the blocks the cache finds; its question goes "
             "into blocks of its own."),
            ((16, [0, 1, 2, 3, 4]), "req0's fourth block holds req0's question: is req1's fourth block the same?"),
        ),
    ),
    "full-hit-cap": Prediction(
        "your prediction (tokens served: 8-token, 9-token prompt)", "prefix_caching",
        hint="what must the model still compute to sample the next token, and in what unit does a hit come?",
        mistakes=(
            ((8, 8),
             "both blocks of the 8-token prompt are cached, but the model must run on at least one token: see the "
             "cap."),
            ((7, 8), "a hit comes in whole blocks: which blocks can the second run take whole?"),
        ),
    ),
    "freed-blocks-head-tail": Prediction(
        "your prediction (head, tail)", "prefix_caching",
        hint="which of req 2's blocks has no name? Which end does each kind go to, and in which order?",
    ),
    "multi-turn-cached-tokens": Prediction(
        "your prediction (turn 2's cached tokens)", "prefix_caching",
        hint="which of turn 1's 20 tokens did a step run the model on, and how many full blocks do those fill?",
        mistakes=(
            (20, "that counts all 20 of turn 1's tokens as cached; a block is named when its tokens get their slots: "
                 "which step would have given the answer's last token its slot?"),
            (12, "that counts turn 1's prompt only; its answer was decoded into the same pool, and allocate_slots "
                 "names blocks during decoding too."),
        ),
    ),
    "shared-system-prompt-blocks": Prediction(
        "your prediction (the first pool size at the ceiling)", "prefix_caching",
        hint="a system prompt's blocks come back only if no allocation reaches them at the queue's head first: "
             "which freed blocks join the tail behind them before their next use, and so how many blocks must the "
             "pool hold at once?",
        mistakes=(
            (48, "48 blocks hold the 32 system-prompt blocks and one request at a time; but what else does a freed "
                 "request leave in the queue, and at which end?"),
            (64, "64 blocks hold the system prompts twice over; but what else does a freed request leave in the "
                 "queue, and at which end?"),
        ),
    ),

    # ----------------------------------- copy_on_write_forks
    "fork-blocks-and-ref-counts": Prediction(
        "your prediction (GPU blocks in use, ref counts of blocks 0 and 1, the free queue's head)",
        "copy_on_write_forks",
        hint="write each table out after each fork: which physical blocks does it list? A block leaves the free "
             "queue only when a sequence is given it.",
        mistakes=(
            ((2 + 2 + 2, [1, 1], 2 + 2 + 2), "that gives each fork blocks of its own and copies the K/V into them; "
             "what does a fork copy: the blocks, or the block table?"),
            ((2, [2, 2], 2), "that counts one fork; the grandchild's table lists blocks too: which ones?"),
            ((2, [1, 1], 2), "the blocks did not move, but how many sequences hold each one now?"),
        ),
    ),
    "first-write-copy": Prediction(
        "your prediction (the copies the child's append returns)", "copy_on_write_forks",
        hint="which block receives the new token, who else holds it, and which block does the free queue hand out "
             "next?",
        mistakes=(
            ([], "block 1 has room, but is the child the only one that holds it?"),
            ([(2, 1)], "the right two blocks: which one is read and which one written, and in which order does "
                       "a copy pair name them?"),
            ([(0, 2), (1, 3)], "only the block the new token is written into is copied; block 0 receives nothing."),
        ),
    ),
    "full-block-fork-copies": Prediction(
        "your prediction (the copies the child's append returns)", "copy_on_write_forks",
        hint="which block receives the child's token: one of the shared blocks, or another?",
        mistakes=(
            ([(1, 3)], "block 1 has no empty slot: is the child's token written into it?"),
        ),
    ),
    "free-one-branch": Prediction(
        "your prediction (blocks back in the free queue, GPU blocks in use)", "copy_on_write_forks",
        hint="a free drops one reference from each of the sequence's blocks: which of the parent's blocks does "
             "nobody else hold?",
        mistakes=(
            (([0, 1], 1), "block 0 is still the child's: a free drops one reference, it does not give the block "
             "back."),
            (([], 3), "a block nobody holds any more goes back to the free queue at once."),
        ),
    ),
    "fan-out-tokens-computed": Prediction(
        "your prediction (prompt tokens each child computes, GPU blocks in use)", "copy_on_write_forks",
        hint="a child finds only blocks that have a name (notebook 04): which of the prompt's blocks get one, and "
             "when?",
        mistakes=(
            (([6, 6, 6], 3 * 2), "the children are admitted one after another, and the first child's blocks are "
             "named when they are allocated: what can the second child find?"),
            (([6, 0, 0], 2), "a hit takes only named blocks: is the prompt's partly filled block named?"),
        ),
    ),

    # ----------------------------------- beam_search_sharing
    "beam-step-tokens-computed": Prediction(
        "your prediction (tokens computed in step 2, in step 3)", "beam_search_sharing",
        hint="per request: its tokens minus its hit, and a hit is whole named blocks (notebook 04). Which blocks "
             "did the previous step fill and name?",
        mistakes=(
            ((4, 4),
             "block 1 of an 8-token request was never filled before (step 1's 7-token request left it at 3 "
             "tokens; the 8th was only sampled), so it has no name: how many of its 8 tokens does the "
             "model compute?"),
            ((16, 16),
             "step 2's requests each filled their second block, and a full block is named: what does a 9-token beam "
             "in step 3 find in the cache?"),
            ((4, 1), "count over the four requests, not one"),
        ),
    ),

    "parallel-step-7-blocks": Prediction(
        "your prediction (blocks with sharing at step 7, without)", "beam_search_sharing",
        hint="at step 7 each sample holds slots for the prompt and six tokens of its own: how many blocks is that? "
             "Then: after the first write, which of the prompt's blocks do the four samples still hold together, "
             "and does any block filled later have a second holder?",
        mistakes=(
            ((10, 16), "at step 2 three samples copied block 1 (the map above): after that, which of the prompt's "
                       "blocks do they still share?"),
            ((9, 12), "at step 7 each sample also holds a slot for its sixth token: step 1 sampled its first."),
            ((12, 16), "the block the samples share is in use too: count it once."),
        ),
    ),
    "beam-step-2-drops": Prediction(
        "your prediction (beams dropped at step 2, blocks the drops give back, copies at step 3)",
        "beam_search_sharing",
        hint="section 2's step 3: which of step 2's named second blocks do its requests hit, and what became of the "
             "beams that filled the others? Here, after step 2's writes, who holds each copy of block 1, and who "
             "holds block 1 itself? A dropped beam gives back only what nobody else holds. At step 3, does the block "
             "the survivors share have a free slot?",
        mistakes=(
            ((3, 2, 0), "the fourth beam to write found block 1's ref count back at 1 and wrote into it in place: "
                        "after that, who else holds block 1?"),
            ((3, 3, 3), "the block the survivors share at step 3 is full: a beam's next token needs a new block, and "
                        "v0 copies a shared block only when the write lands in it (notebook 05)."),
            ((3, 3, 4), "the block the survivors share at step 3 is full: a beam's next token needs a new block, and "
                        "v0 copies a shared block only when the write lands in it (notebook 05)."),
            ((3, 6, 0), "the dropped beams share the prompt's first block with the survivor: a free drops their "
                        "references, and the block stays."),
            ((0, 0, 0), "section 2's step 3 hit only some of step 2's named second blocks: a beam nobody extends is "
                        "dropped."),
        ),
    ),
    "whole-run-savings": Prediction(
        "your prediction (parallel sampling's saving, the most beam search could save)", "beam_search_sharing",
        tolerance=0.01, from_run=lambda runs: (runs["parallel"].savings, _beam_ceiling(runs["beam"])),
        hint="first the blocks one sequence's table holds at the last step: its 30 prompt tokens, and how many "
             "generated tokens hold a slot then (step 1 is the prefill)? Without sharing there are four such tables. "
             "Parallel samples share only the blocks that are never written again. For beam search, ask what four "
             "distinct beams must keep apart, and which of their blocks it lands in.",
        mistakes=(
            ((1 - 48 / 72, 1 - 21 / 72), "the prompt's last block is only partly filled: what happens to it at "
                                         "each sample's first write?"),
            ((1 - 51 / 72, 1 - 18 / 72), "four beams sharing every block would be one sequence: distinct beams "
                                         "differ somewhere."),
            ((1 - 51 / 72, 1 - 51 / 72), "that is what beams save sharing only the prompt, as the samples do: "
                                         "the least they save, not the most."),
        ),
    ),

    # ----------------------------------- block_table_visualizer
    "visualizer-free-returns": Prediction(
        "your prediction (the block handed out next, the blocks that join the free queue in its order, block 0's "
        "ref count)", "block_table_visualizer", sizes=False,
        hint="a block joins the free queue only when its ref count falls to 0: which of B's blocks does nobody else "
             "hold? Then, for this widget's manager (notebook 03 §7): at which end of the queue does a freed block "
             "wait, and in which order does a free walk a table (notebook 03 §5)?",
        mistakes=(
            ((4, [2, 3], 1), "in which order does a free walk B's table, first block first or last block first "
                             "(notebook 03 §5)?"),
            ((3, [3, 2], 1), "that puts each freed block at the queue's head; where does this widget's "
                             "manager put one (notebook 03 §7)?"),
            ((2, [2, 3], 1), "that puts each freed block at the queue's head; where does this widget's "
                             "manager put one (notebook 03 §7)?"),
            ((4, [3, 2, 0], 1), "block 0 is A's too: freeing B drops its ref count by one, and it stays in use."),
            ((4, [3, 2, 0], 0), "block 0 is A's too: freeing B drops its ref count by one, and it stays in use."),
            ((4, [3], 1), "block 2 is B's private copy of block 1: who else holds it once B is freed?"),
        ),
    ),
    "visualizer-beam-second-click": Prediction(
        "your prediction (copy-on-write copies at the second click, block 0's ref count after it)",
        "block_table_visualizer",
        hint="at the second click every beam writes its 7th token into the same partly filled block: which writers "
             "find it shared, and does the last one (notebook 05)? Then count the beams alive after the click, and "
             "ask which of their blocks every one of them still holds.",
        mistakes=(
            ((3, 3), "the last beam to write finds the block's ref count back at 1: does it still need a copy?"),
            ((0, 3), "the 7th token goes into a block that is partly filled and shared by the three beams: may a "
                     "shared block be written where it stands?"),
            ((2, 1), "a dropped beam gives up its reference to block 0, but the beams that live on, forks "
                     "included, all start with the prompt's first block: how many beams are there after the click?"),
            ((2, 2), "a dropped beam gives up its reference to block 0, but the fork that replaces it adds one: how "
                     "many beams are there after the click?"),
        ),
    ),
    "visualizer-swap-in": Prediction(
        "your prediction (C's block table, B's after the swap in)", "block_table_visualizer",
        hint="C, and then B coming back, take GPU blocks from the free queue's head. Write the queue out after the "
             "swap out: at which end does this widget's manager put a freed block, and in which order does it walk "
             "B's table (notebook 03 §5 and §7)?",
        mistakes=(
            (([3, 2, 4], [5, 6]), "that is B's blocks freed to the queue's head; where does this widget's "
                                  "manager put them (notebook 03 §7)?"),
            (([2, 3, 4], [5, 6]), "that is B's blocks freed to the queue's head; where does this widget's "
                                  "manager put them (notebook 03 §7)?"),
            (([4, 5, 6], [7, 2]), "in which order does the swap out hand B's blocks back to the queue, first block "
                                  "first or last block first?"),
            (([4, 5, 6], [2, 3]), "a swap in takes its GPU blocks from the queue's head, whatever ids B had before: "
                                  "which blocks are at the head when B comes back?"),
            (([4, 5, 6], [0, 1]), "those are B's CPU blocks; the swap in copies them into GPU blocks from the GPU "
                                  "pool's free queue."),
        ),
    ),
    "visualizer-v033-free": Prediction(
        "your prediction (the free queue after 0.33 frees B: caching off, caching on)", "block_table_visualizer",
        sizes=False,
        hint="first which of B's blocks reach ref count 0, and in which order 0.33 walks B's table; then, for each "
             "of them, does it hold a name, and so does prepend_n or append_n place it?",
        mistakes=(
            (([4, 5, 6, 7, 8, 9, 10, 11, 3, 2],) * 2, "that is this widget's rule, every freed block to the tail; "
                                                     "0.33 puts a block without a name at the head."),
            (([2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [3, 4, 5, 6, 7, 8, 9, 10, 11, 2]),
             "in which order does 0.33 walk B's table, and does prepend_n keep that order?"),
            (([3, 2, 4, 5, 6, 7, 8, 9, 10, 11],) * 2, "with caching on, B's full block 2 holds a name: at which end "
                                                     "does 0.33 queue a named block?"),
            (([3, 2, 0, 4, 5, 6, 7, 8, 9, 10, 11], [3, 0, 4, 5, 6, 7, 8, 9, 10, 11, 2]),
             "block 0 is A's too: freeing B drops its ref count by one, and it stays in use."),
        ),
    ),

    # ----------------------------------- paged_attention_kernel
    "decode-grid-blocks": Prediction(
        "your prediction (thread blocks in the grid, thread blocks that read block 0's KV head 1)",
        "paged_attention_kernel",
        hint="the grid has one thread block per (query head, sequence). Then: which rows of block_tables hold "
             "block 0 among the entries their seq_lens reach? Which query heads read KV head 1? A thread block "
             "reads what its own query head and sequence need, and nothing else.",
        mistakes=(
            ((16, 2), "count the sequences as well as the heads: which rows of block_tables hold block 0 as a "
                      "real entry?"),
            ((16, 6), "c's row is padded with 0: does a thread block read table entries past its sequence's "
                      "seq_lens?"),
            ((16, 8), "here two query heads share each KV head (4 over 2): which of them read KV head 1?"),
            ((16, 12), "two slips: which query heads read KV head 1, and are c's padded entries ever read?"),
            ((8, 2), "one thread block per (KV head, sequence) is section 5's grouped flavour; the teaching "
                     "kernel gives every query head its own thread block."),
        ),
    ),
    "warp-blocks-and-loads": Prediction(
        "your prediction (warp 1's logical blocks, 8-byte loads per lane per token, lanes with a real token in the "
        "last block)", "paged_attention_kernel",
        hint="how many blocks do 100 tokens fill, and how do 4 warps take them in turn? How many lanes share one "
             "token of a 16-token block, and how many 8-byte words is a key row of 128 fp16 values? The last "
             "block holds the tokens from 96 on.",
        mistakes=(
            (([1, 5], 32, 8), "a token's row is split among its thread group's lanes: how many lanes share a token "
                              "at block size 16?"),
            (([1], 16, 8), "count the blocks 100 tokens fill, and keep dealing them out to the 4 warps until none "
                           "is left."),
            (([4, 5, 6], 16, 8), "warps take blocks in turn (round-robin), not in runs."),
            (([1, 5], 16, 4), "each token has a thread group of lanes, not one lane: how many lanes share each of "
                              "the last block's tokens?"),
            (([1, 5], 16, 32), "every lane of that warp runs, but a lane whose token lies past the sequence's end "
                               "has its logit masked: how many lanes have one of the block's real tokens?"),
        ),
    ),
    "e1-tokens-per-lane": Prediction(
        "your answer (tokens one lane takes at block size 64, at block size 1)", "paged_attention_kernel",
        hint="a group is never less than one lane, and a warp has 32: how many groups share a block of 64 tokens, and "
             "how many lanes share a block's one token at block size 1?",
        mistakes=(
            ((1, 1), "at block size 64, how many groups does a warp hold, and how many tokens must they cover between "
                     "them?"),
            ((2, 32), "at block size 1, how many tokens does the block hold, and can one lane take more "
                      "tokens than the block has?"),
        ),
        expected=lambda: _tokens_per_lane(64, 1),
    ),
    "e3-key-offset": Prediction(
        "your answer (where key element 70 of token 5 sits in one KV head's block: block size 16, head 128, fp16)",
        "paged_attention_kernel",
        hint="in the paper's key layout [dim // x, token, x], which index changes fastest? How many elements does "
             "one step of the token skip, and one step of dim // x? Then which 16-byte vector holds dim 70, and "
             "where in it?",
        mistakes=(
            (5 * 128 + 70, "that is pagedkv's token-major order; the paper's key layout keeps only x dims of a "
                           "token together."),
            (70 * 16 + 5, "that is the paper's value layout, one dim of every token in turn; the key keeps x dims "
                          "of a token side by side."),
            ((70 // 8) * 8 + 5 * 8 + 70 % 8, "one step of dim // x skips a 16-byte vector of every token in the "
                                             "block, not of one token."),
            ((70 // 16) * 16 * 16 + 5 * 16 + 70 % 16, "x counts the elements in 16 bytes; how many fp16 values is "
                                                      "that?"),
        ),
        expected=lambda: _paper_key_offset(token=5, d=70),
    ),
    "gqa-blocks-and-reads": Prediction(
        "your prediction ((vllm: thread blocks per sequence, bytes of K loaded), (vllm-gqa: the same))",
        "paged_attention_kernel",
        hint="what does one thread block compute in each flavour: one query head, or a KV head with all its query "
             "heads? Every thread block loads the keys of its KV head for the whole sequence itself: 1,000 rows of "
             "128 fp16 values.",
        mistakes=(
            (((8, 512_000), (2, 512_000)), "a vllm thread block computes one query head and loads its KV head's "
                                           "keys for itself: do two thread blocks of one KV head share a load?"),
            (((8, 2_048_000), (2, 2_048_000)), "a vllm-gqa thread block loads each key once and multiplies it into "
                                               "all of its group's dot products."),
            (((2, 512_000), (8, 2_048_000)), "the vllm flavour is the one with a thread block per query head."),
            (((8, 4_096_000), (2, 1_024_000)), "that counts K and V; the question asks for K alone."),
            (((8, 1_024_000), (2, 256_000)), "an fp16 value takes 2 bytes."),
        ),
    ),
    "v1-or-v2-rule": Prediction(
        "your prediction (smallest num_seqs that picks v1 at 32 heads and 600 tokens, the kernel for (1, 32, 500), "
        "the kernel for (64, 32, 9000))", "paged_attention_kernel",
        hint="take the rule one test at a time: may the longest sequence use v1 at all? Does one 512-token "
             "partition cover it? If not, are there more than 512 (sequence, head) pairs?",
        mistakes=(
            ((16, "v1", "v2"), "the rule wants more than 512 (sequence, head) pairs, not 512 or more."),
            ((513, "v1", "v2"), "513 is a number of (sequence, head) pairs; the question asks for sequences, each "
                                "with 32 heads."),
            ((17, "v2", "v2"), "for (1, 32, 500): how many 512-token partitions does it need, and what does the "
                               "rule do when there is only one?"),
            ((17, "v1", "v1"), "for (64, 32, 9000), take the rule's first test: how long may the longest sequence "
                               "be for v1?"),
        ),
    ),

    # ----------------------------------- scheduler
    "static-vs-continuous-steps": Prediction(
        "your prediction (static steps, continuous steps, 0.6.3's default steps)", "scheduler",
        hint="static: a batch lasts as long as its longest request. Continuous: follow the three slots, a finished "
             "request's slot taken by the next waiting one in the following step. 0.6.3's default: the same slots, "
             "but a step that admits someone runs only prompts, so the running requests make no token in it.",
        mistakes=(
            ((19, 10, 12), "a request that wants 9 tokens takes 9 steps, not 10: its prefill step samples the first."),
            ((17, 10, 10), "0.6.3's default runs a step of prompts alone: in it the running requests make no token."),
        ),
    ),
    "admitted-in-step-0": Prediction(
        "your prediction (admitted in step 0)", "scheduler",
        hint="count each prompt's blocks in arrival order; can_allocate says OK only if the watermark's blocks are "
             "still free after the allocation, and nobody behind a waiting request overtakes it.",
        mistakes=(
            (["A", "B", "C"],
             "count the blocks the three prompts take together: what would be left for the watermark?"),
        ),
    ),
    "first-preemption-step-and-victim": Prediction(
        "your prediction (step, victim)", "scheduler",
        hint="track each request's tokens step by step: a new block is needed when a token starts one. When does the "
             "pool have no block for someone's next token? For the victim: first come, first served (section 3) "
             "holds in eviction too.",
        mistakes=(
            ((3, "r0"), "the victim is not the request that needs the block: it is the tail of running."),
        ),
    ),
    "recompute-work-done-twice": Prediction(
        "your prediction (r2's tokens computed twice, r1's and r2's together)", "scheduler",
        hint="a recomputed prefill runs prompt + generated tokens again; which of them had K/V before? The newest "
             "token had only been sampled.",
        mistakes=(
            ((5, 12), "the newest token of each was sampled but never run through the model: it had no K/V yet."),
        ),
    ),
    "preemption-cost-vs-block-size": Prediction(
        "your prediction (recompute, swap, crossover)", "scheduler",
        hint="recompute counts tokens only; a swap issues one copy per block, per layer, for K and for V, so its "
             "fixed overhead scales with the number of blocks while its bytes do not. Work out the bytes' time once "
             "(256 tokens of 819,200 B at 25 GB/s), then the copies' at a few block sizes: 256 tokens is 256 blocks "
             "of 1 or 1 block of 256.",
        mistakes=(
            (("same", "up", 1), "a larger block means fewer blocks for the same tokens: fewer copies."),
            (("same", "down", 16), "a preempted request is swapped out and later back in: count both directions."),
        ),
    ),
    "first-swap-out-and-return": Prediction(
        "your prediction (step of the first swap-out, its victim, the step it runs again)", "scheduler",
        hint="step 0 admits whoever fits: count each prompt's blocks of 4. From then on every running request adds a "
             "token a step and needs a new block when its newest token starts one; the running are served oldest "
             "first, and the tail of running gives its blocks up. A swapped request comes back, before anyone waiting, "
             "once its blocks fit, and a request frees its blocks after the step that samples its last token.",
        mistakes=(
            ((1, "r3", 3), "the victim is not the request that needs the block: who is at the tail of running?"),
            ((1, "r4", 2), "how many blocks are free in that step, and how many does r4 need back? A request frees "
                           "its blocks only after the step that samples its last token."),
        ),
    ),

    # ----------------------------------- vllm_today
    "admission-with-a-hit": Prediction(
        "your prediction (tokens from the cache, tokens this step)", "vllm_today",
        hint="which of R's blocks are full and named already? And who spends the budget before R?",
        mistakes=(
            ((8, 8), "the running requests go first: what do A's and B's decodes take?"),
            ((0, 6), "A holds the system prompt's two blocks, full and hashed: R can share them."),
            ((8, 14), "the budget is 8 tokens a step, for everyone together."),
        ),
    ),
    "chunked-prefill-sample-step": Prediction(
        "your prediction (the step R samples in, the tokens that step holds)", "vllm_today",
        hint="R has 22 - 14 tokens left after step 2; each step, the decodes take 2 of the 8. Is anyone left to take "
             "what R does not need?",
        mistakes=(
            ((3, 8),
             "step 3 has room for 6 of R's 8 remaining tokens: R samples only when its chunk reaches its last token."),
            ((4, 8), "the budget is a cap, not a quota: with nobody waiting, what R does not need stays unused."),
        ),
    ),
    "first-preemption-victim": Prediction(
        "your prediction (victim, blocks still cached)", "vllm_today",
        hint="first come, first served: which of the three does that order protect least? Count the victim's tokens: "
             "which of its own blocks are full?",
        mistakes=(
            (("A", 4), "A arrived first: first come, first served protects it; the last to arrive goes first."),
            (("R", 3), "R had 24 computed tokens: its last block was full, named, when it was freed."),
            (("R", 6), "blocks 0 and 1 are A's too: their ref counts fall to 1, they stay in use."),
        ),
    ),
    "readmission-after-preemption": Prediction(
        "your prediction (step, tokens from the cache)", "vllm_today",
        hint="R needs 7 blocks for 25 tokens; its hits that sit in the free queue count against the free blocks too."
             " Which end of the queue do A and B take their new blocks from, and in which step does one of them "
             "reach its max_tokens?",
        mistakes=(
            ((8, 24),
             "all of R's blocks were cached at step 8, but 25 tokens need 7 blocks: 6 hits, 4 of them free-queue "
             "blocks, and 1 new: 5 free blocks, and 4 were free."),
            ((13, 24), "A and B took blocks from the head of the queue while R waited: whose blocks were there?"),
            ((13, 8), "only the blocks handed out were evicted; R's first two own blocks were still at the tail."),
            ((17, 16), "B, with 12 tokens to generate, finishes before A does."),
        ),
    ),
    "gate-hits-from-the-queue": Prediction(
        "your prediction (S's block table, free blocks after)", "vllm_today",
        hint="a hit on a free block takes it out of the free queue, as a new block would; and only the chunk's "
             "slots are allocated now.",
        mistakes=(
            (([0, 1, 7], 4), "blocks 0 and 1 were free: a hit takes them out of the free queue, so they are not "
                             "free any more."),
            (([0, 1, 7, 8], 1), "the gate checks the whole sequence, but allocates only the chunk's slots."),
        ),
    ),
    "gate-whole-sequence": Prediction(
        "your prediction (tokens from the cache, admitted)", "vllm_today",
        hint="E's hits are held by S: they cost no free block. How many blocks do all of E's tokens need beside "
             "them, and how many are free?",
        mistakes=(
            ((8, True), "the chunk fits, but the gate asks whether E's whole sequence fits."),
            ((0, False), "S holds the system prompt's blocks, full and named: E can share them."),
        ),
    ),
    "full-isl-gate-preemptions": Prediction(
        "your prediction (preemptions with the gate on, with it off)", "vllm_today",
        hint="with the gate, a request starts only if its whole sequence fits beside what is already held. Without it,"
             " how many 128-token chunks fit in the first step, and what happens when two requests' later chunks need "
             "more blocks than the 32 the pool has?",
        mistakes=(
            ((0, 0), "without the gate a first chunk is admitted wherever it fits: do the later chunks still fit?"),
        ),
    ),
    "preemption-three-ways": Prediction(
        "your prediction (all three preempt equally often, the ones that compute tokens twice)", "vllm_today",
        hint="a preemption happens when a running request needs a block and none is free: does the way a victim is "
             "put aside change when the pool fills? Then: which way keeps a victim's K/V?",
        mistakes=(
            ((False, {"v0 recompute", "today"}),
             "a preemption comes when a running request needs a block and none is free; how a victim is put "
             "aside does not change when that happens."),
            ((True, {"today"}), "v0 in recompute mode throws the victim's K/V away too."),
            ((True, {"v0 swap", "v0 recompute", "today"}), "swap copies the victim's K/V out and back: nothing is "
                                                           "computed twice."),
        ),
    ),
    "more-preemptions-at-scale": Prediction(
        "your prediction (which preempts more often, the setting that makes the difference)", "vllm_today",
        hint="with no chunks and no prefix caching, compare the two admissions in section 7's table: which one holds "
             "blocks back, and so starts fewer requests into the same pool?",
        mistakes=(
            (("same", None), "the preemption rules match, but do the admissions? Look at what each keeps free."),
            (("today", "scheduler_reserve_full_isl"), "with no chunks, v0 admitted a prompt only if all of it fit "
                                                      "too: the gate changes nothing here."),
        ),
        from_run=_more_preemptions_and_why,
    ),

    # ----------------------------------- unified_attention
    "chunk-row-keys": Prediction(
        "your prediction ((first, last) key position row 0 reads, key positions the step reads in all)",
        "unified_attention",
        hint="which token of a is row 0? A row reads every key up to its own position, and none the step writes "
             "after it. Then add up the rows' counts, sequence by sequence.",
        mistakes=(
            (((0, 12), 5 * 13 + 10 + 4 * 4), "the mask cuts the keys after a row's position, though this step "
                                              "wrote them."),
            (((0, 7), 75 - 10), "a row reads its own key too: j <= position."),
            (((8, 8), 15 + 1 + 10), "a chunk's rows read the context earlier steps wrote as well, from key 0."),
        ),
    ),
    "window-unread-pages": Prediction(
        "your prediction (the pages no row reads under a window of 4)", "unified_attention",
        hint="under W = 4 the row at position p reads keys p - 3 to p. For each sequence, which of its pages hold "
             "only keys that fall before every one of its rows' windows?",
        mistakes=(
            ({0}, "b's one row has a window too: which of b's pages hold its keys?"),
            (set(), "a window reaches back only W - 1 keys before a row's own position: how far back does a's "
                    "first row reach?"),
        ),
    ),
    "second-chunk-first-row": Prediction(
        "your prediction (position of the prompt's first row in its second step, keys it reads)",
        "unified_attention",
        hint="the budget is 16 a step and the running decodes go first: how many of the prompt's tokens did its "
             "first step compute? A row reads every key up to its own position.",
        mistakes=(
            ((16, 17), "the three decodes take their tokens of the 16 first, in the prompt's first step too."),
            ((13, 13), "a row reads its own key too: keys 0 to its position."),
            ((13, 26), "the mask cuts the keys after the row's position, though this step wrote them."),
        ),
    ),
    "step-grid": Prediction(
        "your prediction (section 4's launch: BLOCK_Q, query tiles, programs, the spare tile)", "unified_attention",
        from_run=_step_grid,
        hint="a tile holds BLOCK_M = 16 (query, head) pairs for one KV head: how many query heads share a KV head "
             "here? The bound on tiles uses only the step's rows and its sequences, and each tile runs once per KV "
             "head. Sequence s's tiles start at cu_seqlens_q[s] // BLOCK_Q + s: which tile does no sequence's rows "
             "reach?",
        mistakes=(
            ((16, 16 // 16 + 4, (16 // 16 + 4) * 2, 4),
             "BLOCK_M counts (query, head) pairs: a tile's 16 rows hold every query head of its KV head for each "
             "query."),
            ((4, 16 // 4 + 4, (16 // 4 + 4) * 2, 7),
             "BLOCK_Q divides 16 by the query heads per KV head, not by all the query heads."),
            ((8, 16 // 8, 16 // 8 * 2, None),
             "a tile never holds rows of two sequences: the bound adds one tile per sequence for that."),
            ((8, 16 // 8 + 4, 16 // 8 + 4, 5), "the grid's second axis is the KV heads: each tile runs once per "
                                               "KV head."),
        ),
    ),
    "step-split-calls": Prediction(
        "your prediction (section 4's step, 32 layers: Triton's attention calls, FlashInfer's, the rows of "
        "FlashInfer's prefill call)", "unified_attention",
        hint="count one layer first: Triton's one call covers every row; FlashInfer's split puts the decodes in one "
             "call and the rest in another. Which of the step's requests are decodes, and how many rows do the others "
             "have?",
        mistakes=(
            ((1, 2, 13), "that is one layer's count: every layer of the model makes its own calls."),
            ((32, 128, 13), "FlashInfer's split makes two groups, not one per request: a decode call over all the "
                            "decodes, a prefill call over the other rows."),
            ((32, 64, 16), "the prefill call gets only the rows after the decodes."),
        ),
    ),

    "engine-blocks-after-30": Prediction(
        "your prediction (blocks per request after step 30)", "tiny_vllm",
        hint="how many tokens of each request hold a slot after step 30: its prompt, and what the decode steps "
             "added? Then count blocks of 16 for that many.",
        mistakes=(
            ([2, 2, 3, 2], "you counted the decoded tokens only: each request's prompt sits in its blocks too."),
            ([3, 3, 3, 3], "req2's prompt is 21 bytes, more than a block already: where does it end after 30 steps?"),
        ),
    ),
    "smollm2-chat-prefix-hit": Prediction(
        "your prediction (prompt tokens served from the prefix cache, with blocks of 16, with blocks of 32)",
        "tiny_vllm",
        hint="which blocks of a prompt have a name another request can hit: how many of the 24 shared tokens fill a "
             "whole block of each size? And when is a block named: after its prefill ran, or as soon as it is "
             "allocated for tokens that will fill it?",
        mistakes=(
            ((72, 72), "24 shared tokens each: only a full block has a name, and a block that also holds the "
                       "question matches nobody."),
            ((72, 0), "with blocks of 16, is the second block full of shared tokens?"),
            ((48, 72), "with blocks of 32, is any block full of shared tokens?"),
            ((48, 96), "with blocks of 32, the first block holds 24 shared tokens and 8 of the question: its name "
                       "covers all 32."),
            ((0, 0), "the four arrive in one step, but vLLM 0.33 names a block as soon as it is allocated for tokens "
                     "that will fill it."),
            ((64, 0), "that counts all four requests; the first one computes its prompt."),
        ),
    ),
    "tight-pool-first-victim": Prediction(
        "your prediction (the first victim, block ids sent for it when it comes back)", "tiny_vllm",
        hint="in which step does the pool first run out, and who is last in running then? When that request comes "
             "back, what does the worker still hold of its row, and how many tokens must its table cover?",
        mistakes=(
            ((0, 2), "req0 is the one that needs a block in step 8; notebook 10's rule takes the victim from the other "
                     "end of running."),
            ((4, 2), "req4 needs a block in step 8 too; notebook 10's rule takes the victim from the end of running."),
            ((7, 0), "the worker dropped req7's row when it was preempted: what must it be sent to run req7 again?"),
            ((7, 1), "req7 comes back with the tokens it had sampled before its preemption too: its table covers "
                     "all of them."),
        ),
        from_run=_first_victim_back,
    ),
    "tight-pool-no-prefix-cache": Prediction(
        "your prediction (steps, tokens through the model, prefix caching off)", "tiny_vllm",
        hint="with caching off, what does a readmitted request get back from its freed blocks? And does any step hold "
             "more blocks, or fewer, than with caching on?",
        mistakes=(
            ((74, 512), "that is the run with caching on: what did its readmitted requests get from the prefix cache, "
                        "and who computes those tokens now?"),
            ((74, 512 - 32), "the prefix cache saved tokens in the run with it on; off, those tokens are computed."),
            ((40, 398), "that is the roomy pool: the tight pool still preempts, cache or no cache."),
        ),
    ),
    "cuda-graph-padded-slots": Prediction(
        "your prediction (slot-mapping length in step 0, in step 8)", "tiny_vllm",
        hint="count the tokens each step runs (a prefix hit's tokens are not run; a finished chat leaves the batch), "
             "then round up to the next captured size.",
        mistakes=(
            ((152, 4), "step 0 does not run the 48 tokens the prefix cache served."),
            ((99, 3), "a graph replays the batch size it was recorded for: both steps are padded up to a captured "
                      "size."),
            ((104, 3), "a decode batch is padded too: is 3 a captured size?"),
            ((99, 4), "a prefill batch is padded too: is 99 a captured size?"),
            ((128, 4), "past 8 the captured sizes go up by 8, not by doubling."),
        ),
    ),

    # ----------------------------------- hybrid_kv_cache
    "hybrid-gpt-oss-groups": Prediction(
        "your prediction (groups, layers per block, padding slots)", "hybrid_kv_cache",
        hint="which of the two layer counts does the rule take as the group size here? Then how many groups of that "
             "size does each kind of layer need, and how many of their slots stay empty?",
        mistakes=(
            ((3, 12, 11), "the smallest count is the group size only when the largest is at least 1.5 times it: is "
                          "it, here?"),
            ((1, 25, 0), "a sliding and a full layer keep different tokens, so they never share a group."),
            ((2, 13, 0), "every group has as many slots as the group size: how many layers fill the sliding one?"),
            ((2, 25, 0), "a pool block holds one page for each layer of the group that owns it, not for every layer."),
        ),
    ),
    "hybrid-sliding-table-at-19": Prediction(
        "your prediction (null entries, real blocks, named entries)", "hybrid_kv_cache",
        hint="which positions does the token at 19 see, and which blocks of 4 lie wholly before them? For the names: "
             "where is the prompt's replay boundary, floored to a block, and how many blocks before it does a "
             "sliding hit there need?",
        mistakes=(
            ((4, 1, (1, 2)), "the token at 19 still sees position 12: is the block holding 12-15 wholly outside "
                             "the window?"),
            ((3, 2, (0, 1, 2)), "only the run just before the replay boundary is named, as long as a hit there "
                                "needs: ceil(7 / 4) blocks."),
            ((3, 2, (2, 3)), "the replay boundary (13) is floored to a whole block, not rounded up."),
            ((3, 2, ()), "the blocks before the replay boundary are named as they fill, even if they later leave "
                         "the window."),
        ),
    ),
    "hybrid-ratio-at-4096": Prediction(
        "your prediction (Gemma's ratio, gpt-oss's ratio)", "hybrid_kv_cache",
        hint="count layer-tokens at 4,096: a global layer keeps all 4,096, a sliding layer min(4,096, its window). "
             "The ratio is (all layers x 4,096) over that sum.",
        mistakes=(
            ((6, 2), "that is the limit at 128k tokens; at 4,096 the global layers' share is still large."),
            ((1, 1), "both windows (1,024 and 128) are already full at 4,096 tokens: the sliding layers keep less."),
        ),
    ),
    "hybrid-agreed-hits": Prediction(
        "your prediction (B's hit, C's hit)", "hybrid_kv_cache",
        hint="which sliding blocks did A name? A hit needs the 2 sliding blocks just before it.",
        mistakes=(
            ((24, 24),
             "that is the dense mode (every full sliding block named); in 0.33's default A named only the sliding "
             "blocks before its own replay boundary."),
            ((0, 0),
             "B's lookup records where its hit stopped short (the junction): does B name sliding blocks before it "
             "as it runs?"),
        ),
    ),

    # ----------------------------------- speculative_decoding
    "spec-rollback-after-rejection": Prediction(
        "your prediction (blocks, num_computed_tokens)", "speculative_decoding",
        hint="which positions hold K/V computed for tokens that stay? And which calls ran on A in this step: could "
             "either of them shrink its block table?",
        mistakes=(
            ((2, 7),
             "8 tokens fit in 2 blocks; but a table shrinks only when some call frees a block: which calls ran on A "
             "in this step, and what does each do to its table?"),
            ((3, 10),
             "schedule() counted all 5 rows as computed; how many drafts did the target reject, and what does the "
             "rollback do with that number?"),
            ((3, 8),
             "does token 21, the target's replacement for 18, have K/V in the cache yet? In which step is a sampled "
             "token's K/V computed?"),
        ),
    ),
    "spec-step-3-blocks": Prediction(
        "your prediction (new blocks, blocks with a hash)", "speculative_decoding",
        hint="where do step 3's query rows start, and where do they end? And which of A's blocks cover only tokens "
             "that are no guess (num_tokens counts no draft)?",
        mistakes=(
            ((1, 2), "which positions does step 3 write, and does A's table already reach the last of them?"),
            ((1, 1),
             "which positions does step 3 write, and does A's table already reach the last of them? And which tokens"
             " does block 1 hold now?"),
            ((0, 1),
             "block 1 held drafts when step 2 was scheduled; which tokens does it hold now, and is any of them a "
             "guess?"),
            ((0, 3), "block 2 is to hold drafts 22 and 23; does num_tokens count a draft?"),
        ),
    ),
    "spec-query-rows": Prediction(
        "your prediction (query rows with speculation)", "speculative_decoding",
        hint="plain decoding computes one row per token. Which of the speculating run's rows compute K/V that plain "
             "decoding never needs?",
        mistakes=(
            (42 + 27,
             "each draft is a query row; but an accepted draft's row computes the K/V of a token plain decoding "
             "computes too: is that row extra?"),
            (42 + 14,
             "which drafts' rows compute K/V that plain decoding never needs: the accepted ones or the rejected ones?"),
            (42, "the tokens are the same; are the rejected drafts' rows free?"),
            (42 - 14, "an accepted draft saves a step; does it save the row that computes its K/V?"),
            (42 - 13, "do rejected drafts save rows, or cost them?"),
        ),
    ),
    "spec-batch-steps": Prediction(
        "your prediction (steps of the batch with speculation, without)", "speculative_decoding",
        hint="in one engine step, which of the running requests get a forward? And after how many steps does the "
             "last of them have its 24 tokens?",
        mistakes=(
            ((10 + 18, 24 + 24),
             "that is the two runs one after the other; in one engine step, how many of the running requests get "
             "a forward?"),
            ((10 + 18, 24),
             "without speculation the two share every step; do they stop sharing when drafts are proposed?"),
            ((10, 24),
             "the repetitive prompt is done after its 10 steps; is the batch done then?"),
            ((14, 24),
             "a batch has no average step count: when does generate return, and which request is still running "
             "then?"),
            ((18, 48), "without speculation, do the two requests take turns, or share each step?"),
        ),
    ),
    "spec-lookahead-blocks": Prediction(
        "your prediction (blocks for 6 tokens with 4 lookahead slots, blocks with a hash)", "speculative_decoding",
        hint="how many slots does allocate_slots give B, counting the lookahead ones? And which of B's blocks is "
             "full of tokens that are in request.num_tokens?",
        mistakes=(
            ((2, 1),
             "a lookahead slot is a slot: how many slots must B's table reach for 6 tokens and 4 lookahead ones?"),
            ((3, 2),
             "block 1 holds two prompt tokens and two lookahead slots; does num_tokens count a lookahead slot?"),
            ((3, 0), "which tokens does block 0 hold, and are they all counted in num_tokens?"),
            ((3, 3), "does num_tokens count the lookahead slots a draft model will write?"),
        ),
    ),

    # ----------------------------------- kv_offloading
    "offload-second-turn": Prediction(
        "your prediction (loaded, computed, stored in A's second turn)", "kv_offloading",
        hint="§1 says what a request loads and which blocks a turn offers the tier; the map shows what each tier "
             "holds now.",
        mistakes=(
            ((0, 41, ["A0", "A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8", "A9"]),
             "the GPU pool lost A's blocks, but did every tier?"),
            ((16, 25, ["A0", "A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8", "A9"]),
             "which blocks does the tier hold already?"),
            ((16, 25, ["A4", "A5", "A6", "A7", "A8", "A9", "A10"]),
             "which tokens does A10 hold: are they all prompt tokens?"),
            ((24, 17, ["A6", "A7", "A8", "A9"]),
             "which of A's blocks did its first turn store, and what did A4 and A5 hold then?"),
        ),
    ),
    "offload-admitted-state": Prediction(
        "your prediction (A's status and num_computed_tokens after the step that admits it)", "kv_offloading",
        hint="a load is a copy the worker makes during a step: can the model run on a block that is still being "
             "filled? And num_computed_tokens is what the scheduler has planned for, not what has landed.",
        mistakes=(
            (("RUNNING", 41), "can the model run on tokens whose K/V is still being copied in?"),
            (("RUNNING", 16), "can the model run on tokens whose K/V is still being copied in?"),
            (("WAITING", 0), "the connector found a hit: where does the scheduler park a request whose load is in "
                             "flight?"),
            (("WAITING_FOR_REMOTE_KVS", 0), "the scheduler plans the rest of the prompt from the load's end: when "
                                            "does it count the loaded tokens?"),
        ),
    ),
    "offload-cpu-evictions": Prediction(
        "your prediction (the CPU chunks D's store evicts, and the chunks D0 and D1 land in)", "kv_offloading",
        hint="count the chunks D needs and the free ones; the tier evicts from the front of its order. Then hand out "
             "chunks as _allocate_chunks does: never-used ones first, then the free list from its end.",
        mistakes=(
            ((["B8", "B7", "B6", "B5", "B4", "B3", "B2", "B1", "B0"], 25, 4), "how many chunks are free?"),
            ((["B0", "B1", "B2", "B3", "B4", "B5", "B6", "B7"], 25, 11), "which end of the order goes first?"),
            ((["A3", "A2", "A1", "A0", "B8", "B7", "B6", "B5"], 25, 9),
             "did A's second turn change where A0-A3 stand?"),
            ((["B8", "B7", "B6", "B5", "B4", "B3", "B2", "B1"], 25, 12),
             "the free list is popped from its end: which chunk was freed last?"),
            ((["B8", "B7", "B6", "B5", "B4", "B3", "B2", "B1"], 5, 6),
             "does the tier reuse a freed chunk before one it never used?"),
            ((["B8", "B7", "B6", "B5", "B4", "B3", "B2", "B1"], 19, 5),
             "chunk 19 holds A4; which chunk is never used?"),
        ),
    ),
    "offload-third-turn-computed": Prediction(
        "your prediction (prompt tokens computed in A's third turn)", "kv_offloading",
        hint="a hit is a run of blocks from the prompt's start, and the model computes every token whose K/V no tier"
             " holds.",
        mistakes=(
            (25, "what does the connector find right after the GPU hit?"),
            (17, "which of A's blocks were prompt blocks in turn 2?"),
            (20, "which tokens of A's history has the model never run on?"),
            (13, "which GPU blocks did D take?"),
        ),
    ),

    # ----------------------------------- async_scheduling
    "async-steps-scheduled": Prediction(
        "your prediction (steps that run the model)", "async_scheduling",
        hint="the scheduler knows max_tokens in advance: would it schedule a step whose token is thrown away?",
        mistakes=(
            (6, "a length limit is known before the step is scheduled: see Scheduler.schedule's skip."),
            (4, "step 0, the prompt, samples the first token."),
        ),
    ),
    "async-wall-ratio": Prediction(
        "your prediction (async wall time / synchronous wall time)", "async_scheduling",
        hint="synchronously a step takes schedule + forward + update; with async scheduling, which of those still "
             "add up, and which run beside each other?",
        mistakes=((250 / 410, "that is the ratio of a step in the middle of the run; do its first and last steps "
                              "look like that?"),
                  ((6 * 250 + 80) / (6 * 410), "is there host work with no forward beside it at the run's start, "
                                               "and at its end?"),
                  (0.5, "where would a half come from? Time one async step from the knobs, then the whole run."),
                  (160 / 410, "the host work is hidden, not removed: what does a step take when the forward runs "
                              "beside it?"),
                  (1.0, "the forward does not have to wait for the update and the next schedule any more.")),
        tolerance=0.04, from_run=_async_wall_estimate,
    ),
    "async-blocks-at-eos": Prediction(
        "your prediction (sync, async)", "async_scheduling",
        hint="list the steps each loop has scheduled when the EOS comes back, and the token positions they give "
             "slots to; a block holds 3 slots.",
    ),
}


def _tokens_per_lane(*block_sizes, num_words: int = 32) -> tuple:
    """Tokens one lane of the 'vllm' kernel takes from a block, at each block size (E1's reference)."""
    from .exercises import _kernel_lane_work

    return tuple(len(_kernel_lane_work(0, block_size, num_words)[0]) for block_size in block_sizes)


def _paper_key_offset(token: int, d: int, block_size: int = 16, head_size: int = 128, element_bytes: int = 2) -> int:
    """Element offset of key element ``d`` of ``token`` in one KV head's block of the paper's key cache, read off
    torch's strides: the block viewed as ``[head_size // x, block_size, x]`` (``split_kv_cache``, vLLM 0.6.3)."""
    import torch

    x = 16 // element_bytes
    block = torch.arange(block_size * head_size).view(head_size // x, block_size, x)
    return int(block[d // x, token, d % x])
