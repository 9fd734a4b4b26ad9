"""Every "predict, then run" question of the course: what the check calls it, a hint, and the slips behind
known wrong answers.

A prediction earns no points: the student writes a guess, the next cell runs the package, and
``check.prediction(key, prediction, truth)`` compares the guess with what the run produced (``truth``, computed in
that cell). The hint and the known wrong answers live here, keyed by a stable slug as ``exercises.py`` keeps the
exercises, so the check cell a student reads shows neither a wrong answer to work back from nor a nudge before
the guess is made. ``notebook`` names its notebook without the number, as an exercise's does.

``mistakes`` pairs a wrong answer (written as the slip computes it, so ``42 + 27`` says where it comes from) with
what to rethink; ``check`` prints the matching one instead of "not right", and the hint for any other wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prediction:
    title: str  # what the verdict calls it: "your prediction (B's block table)"
    notebook: str  # the notebook's file name without its number and ".ipynb"
    hint: str = ""
    mistakes: tuple = ()  # (a known wrong answer, what was wrong in the reasoning that gives it)


PREDICTIONS: dict[str, Prediction] = {
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
    "second-request-block-table": Prediction(
        "your prediction (B's block table)", "free_list_allocation",
        hint="6 tokens in blocks of 4 take how many blocks? B's table starts where A's ends.",
    ),
    "decode-last-block": Prediction(
        "your prediction (A's last block)", "free_list_allocation",
        hint="when does A's last block fill up, and where does the next block come from?",
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
    "allocate-or-none": Prediction(
        "your prediction (blocks or None, per prompt)", "free_list_allocation",
        hint="count the free blocks first, then what each prompt needs at once.",
    ),

    # ----------------------------------- prefix_caching
    "hash-chain-names-changed": Prediction(
        "your prediction (names changed)", "prefix_caching",
        hint="a block's name hashes its parent's name: what happens to every name after a changed one?",
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
        hint="how many of turn 1's 21 tokens have K/V, and how many full blocks do they fill?",
    ),
    "shared-system-prompt-blocks": Prediction(
        "your prediction (the first pool size at the ceiling)", "prefix_caching",
        hint="which freed blocks join the queue's tail behind a system prompt, and how many requests arrive "
             "between two uses of the rarest prompt?",
        mistakes=(
            (48, "48 blocks hold the 32 system-prompt blocks and one request at a time; but what else does a freed "
                 "request leave in the queue, and at which end?"),
            (64, "64 blocks hold the system prompts twice over; but what else does a freed request leave in the "
                 "queue, and at which end?"),
        ),
    ),

    # ----------------------------------- copy_on_write_forks
    "fork-blocks-and-ref-counts": Prediction(
        "your prediction (GPU blocks in use, ref counts of blocks 0 and 1)", "copy_on_write_forks",
        hint="what does a fork give the child: new blocks, or entries that point at the parent's blocks?",
        mistakes=(
            ((2 + 2, [1, 1, 1, 1]), "that copies the parent's blocks; a fork copies the block table only."),
            ((2, [1, 1]), "the blocks did not move, but how many sequences hold each one now?"),
        ),
    ),
    "first-write-copy": Prediction(
        "your prediction (the copies the child's append returns)", "copy_on_write_forks",
        hint="which block receives the new token, who else holds it, and which block does the free queue hand out "
             "next?",
        mistakes=(
            ([], "block 1 has room, but is the child the only one that holds it?"),
            ([(2, 1)], "a pair is (src, dst): the block copied from comes first."),
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
        hint="per request: its tokens minus its hit, and a hit is whole named blocks, at most num_tokens - 1 tokens "
             "(notebook 04). Which blocks did the previous step fill and name?",
        mistakes=(
            ((4, 4),
             "an 8-token request fills 2 blocks; its hit is capped at num_tokens - 1 = 7 tokens, in whole blocks: "
             "how many of its 8 tokens does the model compute?"),
            ((16, 16),
             "step 2's requests each filled their second block, and a full block is named: what does a 9-token beam "
             "in step 3 find in the cache?"),
            ((4, 1), "count over the four requests, not one"),
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
        "your prediction (the step R samples in)", "vllm_today",
        hint="R has 22 - 14 tokens left after step 2; each step, the decodes take 2 of the 8.",
        mistakes=(
            (3,
             "step 3 has room for 6 of R's 8 remaining tokens: R samples only when its chunk reaches its last token."),
        ),
    ),
    "first-preemption-victim": Prediction(
        "your prediction (victim, blocks still cached)", "vllm_today",
        hint="who is last in running? Count the victim's tokens: which of its own blocks are full?",
        mistakes=(
            (("A", 4), "A arrived first: first come, first served protects it; the last to arrive goes first."),
            (("R", 3), "R had 24 computed tokens: its last block was full, named, when it was freed."),
            (("R", 6), "blocks 0 and 1 are A's too: their ref counts fall to 1, they stay in use."),
        ),
    ),
    "readmission-after-preemption": Prediction(
        "your prediction (step, tokens from the cache)", "vllm_today",
        hint="R needs 7 blocks for 25 tokens; its hits that sit in the free queue count against the free blocks too."
             " And which end of the queue do A and B take their new blocks from?",
        mistakes=(
            ((8, 24),
             "all of R's blocks were cached at step 8, but 25 tokens need 7 blocks: 6 hits, 4 of them free-queue "
             "blocks, and 1 new: 5 free blocks, and 4 were free."),
            ((13, 24), "A and B took blocks from the head of the queue while R waited: whose blocks were there?"),
            ((13, 8), "only the blocks handed out were evicted; R's first two own blocks were still at the tail."),
        ),
    ),
    "pool-table-p": Prediction(
        "P's block table", "vllm_today",
        hint="blocks come from the head of the free queue, in order.",
    ),
    "pool-table-q": Prediction(
        "Q's block table", "vllm_today",
        hint="which of P's blocks are full and named? Q shares those; the rest comes from the head of the queue.",
    ),
    "pool-queue-after-step-3": Prediction(
        "the queue's first three", "vllm_today",
        hint="a block returns only when its ref count falls to 0; one without a hash goes to the head.",
    ),
    "pool-queue-after-frees": Prediction(
        "the free queue", "vllm_today",
        hint="last block first: unnamed blocks to the head, named ones to the tail.",
    ),
    "pool-table-s": Prediction(
        "S's block table", "vllm_today",
        hint="a free block that still has its name can be hit and taken back out of the queue; new blocks come from "
             "the head.",
    ),
    "pool-table-s2": Prediction(
        "S2's block table", "vllm_today",
        hint="every full block of S is named; the partly filled last one is not.",
    ),
    "pool-table-d": Prediction(
        "D's block table", "vllm_today",
        hint="write the queue after both frees first (last block first, head or tail by hash), then take 8 from its "
             "head.",
    ),

    # ----------------------------------- tiny_vllm
    "engine-prefix-cache-hit": Prediction(
        "your prediction (prompt tokens served from the prefix cache)", "tiny_vllm",
        hint="only full blocks have names; count the full blocks every later prompt has in common with the first, "
             "from its start",
        mistakes=(
            (192, "the system prompt fills 4 blocks; what do the 5th blocks of the four prompts hold?"),
            (256,
             "a hit is whole blocks the later prompt shares from its start: which block is the first that differs?"),
        ),
    ),
    "smollm2-kv-bytes": Prediction(
        "your prediction (bytes per token, per block of 16)", "tiny_vllm",
        hint="2 (K and V) x layers x KV heads x head size x 4 bytes; GQA: count the KV heads, not the query heads",
        mistakes=(
            ((138_240, 2_211_840), "that counts 9 heads: how many KV heads does SmolLM2 have?"),
            ((23_040, 368_640), "that is one of K and V, or float16: both are cached, 4 bytes each"),
            ((1_536, 24_576), "that is one layer; the cache holds every layer's K and V"),
        ),
    ),

    # ----------------------------------- hybrid_kv_cache
    "hybrid-agreed-hits": Prediction(
        "your prediction (B's hit, C's hit)", "hybrid_kv_cache",
        hint="which sliding blocks did A name? A hit needs the 2 sliding blocks just before it.",
        mistakes=(
            ((24, 24),
             "that is the dense mode (every full sliding block named); in 0.33's default A named only the sliding "
             "blocks before its own replay boundary."),
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
    "offload-cpu-evictions": Prediction(
        "your prediction (the CPU chunks D's store evicts)", "kv_offloading",
        hint="count the chunks D needs and the free ones; the tier evicts from the front of its order.",
        mistakes=(
            (["B8", "B7", "B6", "B5", "B4", "B3", "B2", "B1", "B0"], "how many chunks are free?"),
            (["B0", "B1", "B2", "B3", "B4", "B5", "B6", "B7"], "which end of the order goes first?"),
            (["A3", "A2", "A1", "A0", "B8", "B7", "B6", "B5"], "did A's second turn change where A0-A3 stand?"),
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
        "your prediction (steps scheduled)", "async_scheduling",
        hint="count the schedule lines of the text timeline above.",
    ),
    "async-blocks-at-eos": Prediction(
        "your prediction (sync, async)", "async_scheduling",
        hint="list the steps each loop has scheduled when the EOS comes back, and the token positions they give "
             "slots to; a block holds 3 slots.",
    ),
}
