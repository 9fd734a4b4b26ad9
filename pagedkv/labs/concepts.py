"""The course's one vocabulary, and its notebooks in order: what each introduces and what it uses.

Every notebook's metadata carries ``"pagedkv": {"introduces": [...], "uses": [...]}`` with slugs from
``CONCEPTS``; ``tests/test_course_map.py`` checks that each concept is introduced in exactly one notebook and
used only after it, and ``python -m pagedkv map`` writes COURSE_MAP.md from these lists. ``COURSE`` gives each
notebook its part, its one idea and where the paper's engine (vLLM 0.6.3, "v0") and today's (0.33) meet in it.
A notebook not written yet is ``planned``: its intended lists stand here until its file exists; from then on its
own metadata counts.
"""

from __future__ import annotations

from dataclasses import dataclass

CONCEPTS: dict[str, str] = {
    # memory: sizes
    "kv-cache": "the K and V vectors of every earlier token, kept so that a decode step computes only the new one",
    "kv-bytes-per-token": "2 (K and V) x layers x KV heads x head size x bytes per value: one token's K/V",
    "gqa-mqa": "several query heads sharing one KV head (grouped- or multi-query attention): a smaller cache",
    "tensor-parallel-kv-heads": "under tensor parallelism each GPU caches only its share of the KV heads, whole",
    "mla-latent-cache": "multi-head latent attention caches one compressed latent and a RoPE key per layer",
    "kv-memory-budget": "the blocks a GPU holds: memory left after weights and activations, divided by a block's bytes",
    "block": "a fixed-size page of KV slots for block_size consecutive tokens of one request",
    "block-size-tradeoff": "large blocks waste slots in each request's last block; small ones lengthen tables",
    "per-layer-page-size": ("each layer's KVCacheSpec sets its page: MLA changes the formula; a sliding window keeps "
                            "the page, only fewer blocks; a Mamba state has a size of its own, padded to one"),
    "null-block": "a block reserved for good that a table points at where it holds no real block",
    # memory: waste
    "contiguous-reservation": "a contiguous chunk reserved per request for its longest possible output (Orca-style)",
    "internal-fragmentation": "reserved slots inside a request's memory that no token will ever fill",
    "external-fragmentation": "free memory in holes between reservations, too small for the next request",
    # memory: the free list
    "free-block-queue": ("free blocks in one queue: allocation takes the head; a freed block goes to the head, "
                         "or to the tail if prefix caching named it"),
    "ref-count": "how many tables point at a block; it is free again when the count falls to 0",
    "block-table": "a request's list of physical blocks, logical block i at entry i",
    "slot-mapping": "a token's slot: block_table[pos // block_size] * block_size + pos % block_size",
    "free-tail-first": "a request frees its table last block first, so its prefix waits longest in the queue",
    "watermark-admission": "v0's can_allocate: OK, LATER or NEVER, keeping a watermark of blocks free",
    "allocate-slots": "vLLM today's admission: allocate_slots hands out a request's blocks or returns None",
    "swap": "v0 copying a sequence's blocks to CPU blocks and back, contents intact",
    # memory: sharing
    "prefix-hash": "a full block named by a hash of its parent's name and its own tokens",
    "prefix-cache-hit": "a new prompt's leading full blocks found by name and shared (get_computed_blocks)",
    "cached-free-block": "a free block that keeps its name until handed out again: hit, or evicted LRU",
    "unnamed-blocks-first": "0.33 puts freed blocks without a name at the queue's head, named ones at its tail",
    "full-hit-cap": "a hit is capped at num_tokens - 1, in whole blocks: the model must run on one token",
    "hit-rate": "the share of prompt tokens the prefix cache serves, against the cache's size",
    "fork": "v0 giving a new sequence the same block table, every block's ref count + 1, no copy",
    "copy-on-write": "a write into a shared, partly filled block copies it first (v0)",
    "n-fan-out": "vLLM today serves n > 1 as n child requests that share full blocks through the prefix cache",
    "sequence-group": "v0's request with several sequences (samples or beams) forked from one prompt",
    "parallel-sampling": "n samples of one prompt sharing its blocks",
    "beam-search": "keeping the best beam_width continuations each step, ranked by log-probability per token",
    "sharing-savings": "the memory sharing saves, against the paper's Fig. 15 and §6.3",
    "block-map": "a picture of the pools, tables, ref counts, fill and free queue, drawn from snapshot()",
    "visualizer-widget": "a paged cache driven by hand, one action a click, each effect predicted first",
    # compute
    "paged-decode-kernel": "one query row per sequence attending its keys through the block table",
    "softmax-reductions": "max, then sum of exp(logit - max): a softmax in two block-wide reductions",
    "warp-per-block": "the paper's kernel: a warp per KV block, a thread group per token",
    "gqa-thread-block": "one thread block per KV head and its group of query heads: K/V read once per group",
    "paged-attention-v2": "partitions of a long context computed apart, merged by their max and sum",
    "cache-layout": "how a block's K and V sit in memory: the paper's x-split key layout and today's",
    # serving: the paper's scheduler
    "continuous-batching": "iteration-level batching: requests join and leave the batch at every step",
    "preemption": "taking a running request's blocks when the pool runs out, the victim the latest",
    "preemption-recompute": "a victim's blocks freed, its tokens computed again when it is readmitted",
    "swap-recompute-cost": "the cost of a swap against a recompute, by block size (the paper's Fig. 19)",
    "full-prompt-admission": "0.33 admits a request only if its whole sequence fits, not just its first chunk "
                             "(scheduler_reserve_full_isl)",
    "recompute-only": "vLLM today preempts by recompute only: no swapped queue",
    # serving: today
    "token-budget": "one max_num_batched_tokens per step over running, then waiting requests: no phases",
    "chunked-prefill": "a prompt computed over several steps, a chunk beside other requests' decodes",
    "num-computed-tokens": "per request, the tokens whose K/V is cached; a step catches it up with num_tokens",
    "beam-search-loop": "today's beam search: one request per beam per step, outside the engine",
    "cu-seqlens-q": "where each sequence's query rows start in a step's one query tensor (query_start_loc)",
    "causal-offset": "row i of a q_len-row chunk sits at position seq_len - q_len + i and reads keys up to it",
    "sliding-window-attention": "a layer whose rows read only the last W keys",
    "unified-attention": "one kernel over a mixed batch of prefill chunks and decodes (unified_attention)",
    "engine-loop": "schedule, run the model on the step's tokens through the pages, sample, repeat",
    "paged-equals-dense": "paging changes where K/V lives and when it is computed, never what the model writes",
    "worker-block-table": "the GPU worker's persistent copy of each table, sent only what changed; CUDA graphs",
    "kv-cache-groups": "layers grouped by attention type, one block table per group over one pool",
    "sliding-window-release": "a sliding-window group giving blocks out of its window back while a request runs",
    "sliding-block-retention": "which full blocks of a sliding group keep a prefix-cache name (retention interval)",
    "hybrid-prefix-hit": "the prefix hit every group agrees on, shorter when a sliding group's cache has a gap",
    # planned notebooks (14-16)
    "spec-decode": "draft tokens verified in one step: lookahead slots, num_computed_tokens rolled back on a reject",
    "kv-connector": "an interface that loads and saves a request's blocks outside the engine's pool",
    "kv-offloading": "a CPU tier of blocks kept under their hashes and loaded back on a prefix hit",
    "async-scheduling": "scheduling step n + 1 while step n runs, with placeholders for tokens not yet sampled",
}


@dataclass(frozen=True)
class Notebook:
    """One notebook of the course: ``name`` is its file name without the number (``"free_list_allocation"``)."""

    number: int
    name: str
    part: str  # "memory", "compute" or "serving"
    idea: str
    meets: str  # where the paper's engine (0.6.3) and today's (0.33) meet in it
    planned: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # (introduces, uses) until the file exists

    @property
    def file(self) -> str:
        return f"{self.number:02d}_{self.name}.ipynb"


COURSE: tuple[Notebook, ...] = (
    Notebook(1, "block_size_arithmetic", "memory", "how big one token's K/V is, and how many blocks a GPU holds",
             "v0's `get_cache_block_size` and today's `page_size_bytes`; both engines' memory profiling"),
    Notebook(2, "memory_waste", "memory", "why pages: reserving contiguous memory per request wastes most of it",
             "the paper's Fig. 2: its ordering reproduced, most of its gap closed by the paper's own baselines"),
    Notebook(3, "free_list_allocation", "memory",
             "a free queue and ref counts hand out blocks; a block table maps a request's tokens to slots",
             "today's `BlockPool` and `allocate_slots` beside v0's watermark and OK / LATER / NEVER"),
    Notebook(4, "prefix_caching", "memory", "full blocks named by their tokens, shared by every request that has them",
             "today's prefix cache (on by default, the full-hit cap) beside v0's optional one"),
    Notebook(5, "copy_on_write_forks", "memory", "forked sequences share blocks until one writes into a shared one",
             "v0's fork and copy-on-write; today's fan-out of `n > 1` through the prefix cache"),
    Notebook(6, "beam_search_sharing", "memory", "samples and beams of one request share their prompt's blocks",
             "today's beam search, a loop of one-token requests sharing through the prefix cache; v0's sequence "
             "groups fork and copy on write, measured against the paper's numbers"),
    Notebook(7, "block_table_visualizer", "memory", "every piece of paged memory on one picture, driven by hand",
             "the widget drives v0's interface: fork, beam step and swap, none in 0.33's engine, each with its "
             "reason; one free under the queue rules of 0.10.2's V1, 0.6.3 and 0.33"),
    Notebook(8, "paged_attention_kernel", "compute", "attention reads each sequence's K/V through its block table",
             "the paper's decode kernel (v1/v2, ops still in 0.11.0, gone from 0.33); today's kernels in "
             "notebook 11"),
    Notebook(9, "scheduler", "serving", "continuous batching, and preemption when the blocks run out",
             "v0's parts (watermark, swap, recompute); the step's rules from 0.6.3's two schedulers and 0.33's, "
             "in a table, rule by rule; notebook 10 puts today's engine beside it"),
    Notebook(10, "vllm_today", "serving",
             "one request through vLLM today's scheduler and block pool: one token budget, chunks, recompute only",
             "the story is 0.33's; the paper's engine in one section, rule by rule, with the reason for each "
             "difference, measured on the same workloads"),
    Notebook(11, "unified_attention", "serving", "one kernel for the mixed batch of prefill chunks and decodes",
             "0.33's `unified_attention` and FlashAttention varlen; the paper's kernel is its `q_len = 1` case"),
    Notebook(12, "tiny_vllm", "serving", "an engine end to end: a real model served through the paged cache",
             "today's engine (v1) throughout, v0 once with its swap; what 0.33 adds, file by file, and where the "
             "course teaches it"),
    Notebook(13, "hybrid_kv_cache", "serving", "sliding-window layers give their blocks back: KV cache groups",
             "0.33 only (v0 had no KV cache groups)"),
    Notebook(14, "speculative_decoding", "serving", "draft tokens verified in one step, and what a rejection undoes",
             "0.33's drafts scheduled as query tokens and rolled back; 0.6.3 speculated in a worker of its own "
             "(`vllm/spec_decode/`), its scheduler reserving `num_lookahead_slots`"),
    Notebook(15, "kv_offloading", "serving", "a CPU tier under the prefix cache: swap's memory without swap",
             "v0's swap beside 0.33's offloading connector (issue #43)",
             planned=(("kv-connector", "kv-offloading"), ("prefix-hash", "prefix-cache-hit", "cached-free-block",
                                                          "swap", "recompute-only"))),
    Notebook(16, "async_scheduling", "serving", "scheduling the next step while this one runs",
             "0.33's async scheduling (issue #44)",
             planned=(("async-scheduling",), ("token-budget", "num-computed-tokens", "worker-block-table"))),
)

PARTS = {"memory": "Part 1 · memory", "compute": "Part 2 · compute", "serving": "Part 3 · serving"}


def by_name(name: str) -> Notebook:
    """The notebook called ``name`` (file name without number, or with it)."""
    name = name.removesuffix(".ipynb")
    name = name.split("_", 1)[1] if name[:2].isdigit() else name
    return next(n for n in COURSE if n.name == name)
