"""Every graded exercise of the course: its title, a hint, and how its answer is computed.

An exercise's id is a stable slug (``"next-block-after-frees"``), never a notebook number, so the course can be
reordered without renaming anything; ``notebook`` names its notebook without the number (``"free_list_allocation"``
for ``03_free_list_allocation.ipynb``), and the label a student sees ("E1", "E2") is its place among that
notebook's exercises here (``label``). nbgrader's grade ids are ``<slug>-answer`` and ``<slug>-check``.

No expected value is written down here either: each ``expected`` function
replays the situation on the package itself (an allocator, a manager, a
scheduler, the tiny model), so an answer is right exactly when it agrees with
what the code the notebook teaches does.  Function exercises list their test
``cases`` and a readable ``solution``, which ``check.reveal`` shows; where the
package can answer a case on its own, ``reference`` replays it there instead.

Hints point at the idea, never at the number; ``mistakes`` name the slip behind a known wrong answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Exercise:
    title: str
    hint: str
    notebook: str = ""  # the notebook's file name without its number and ".ipynb"
    expected: Callable[[], object] | None = None  # value exercises: computes the answer
    solution: Callable | None = None  # function exercises: one way to write it (shown by check.reveal)
    cases: tuple = ()  # function exercises: the argument tuples it is checked on
    reference: Callable | None = None  # function exercises: the package's own answer (default: ``solution``)
    tolerance: float = 0.0
    # value exercises: (computes a known wrong answer, what was wrong in the reasoning that gives it), so a check
    # can say what to rethink instead of "too high" or "too low"
    mistakes: tuple = ()
    # value exercises with a list answer: False when saying which value is wrong gives it away (block ids found by
    # elimination); a wrong list is then only "at least one of its values is not right", as a tuple's always is
    say_which: bool = True
    # function exercises of several functions (``solution`` and ``reference`` are tuples of them): how one case is
    # put to them, ``run(functions, *case)``; the check compares what it returns (within ``tolerance``, relative)
    run: Callable | None = None
    # value exercises whose answer is a way to get somewhere (a list of actions): the check replays the answer,
    # ``outcome(answer)``, and compares what it gives with what ``expected()``'s answer gives (a bad answer raises a
    # PagedKVError that says what is wrong); ``mistakes`` are then wrong answers whose outcomes are known slips
    outcome: Callable[[object], object] | None = None

    def __post_init__(self):
        if self.cases and self.reference is None:
            object.__setattr__(self, "reference", self.solution)


# --------------------------------------- block_size_arithmetic
def _tp_blocks_per_gpu(tp: int, heads_tp: int | None = None, weights_tp: int | None = None,
                       utilization: float = 0.9):
    """Llama-2-70B on one of ``tp`` 80 GiB cards, v0.6.3's rule: 0.9 of the card less the GPU's share of the
    weights and 2 GiB of activations, cut into 16-token blocks of its share of the KV heads. ``heads_tp`` and
    ``weights_tp`` replay slips: the heads, or the weights, split as if over another number of GPUs."""
    from ..sizing import MODELS, GiB, cache_block_bytes

    spec = MODELS["llama-2-70b"]
    heads_tp = tp if heads_tp is None else heads_tp
    weights_tp = tp if weights_tp is None else weights_tp
    shard = dataclasses.replace(spec, num_heads=spec.num_heads // heads_tp, num_kv_heads=spec.num_kv_heads // heads_tp)
    budget = utilization * 80 * GiB - (spec.weight_bytes / weights_tp + 2 * GiB)
    return int(budget // cache_block_bytes(shard, 16))


def _tp_blocks_growth(**slip):
    """Blocks per GPU at tensor parallelism 8 over blocks per GPU at 4: each GPU's block halves (one KV head where
    it kept two) and its budget grows (an eighth of the weights where it held a quarter), so more than 2x."""
    return _tp_blocks_per_gpu(8, **slip) / _tp_blocks_per_gpu(4, **slip)


def _requests_at_block_sizes(per_request=None, null_block: bool = True, utilization: float = 0.92,
                             cuda_graphs: int = 1):
    """Llama-3-8B on one 80 GiB card in vLLM 0.33 as notebook 01 models it (0.92 of the card less the weights,
    2 GiB of activations and a 1 GiB CUDA-graph estimate; one block kept back, the null block): how many requests of
    1,025 tokens each its cache holds at once, nothing shared, at block_size 16 and at 128. A request holds whole
    blocks, ``ceil(1025 / block_size)``. ``per_request`` (blocks a request takes, from the block size) and the
    others replay slips."""
    from ..sizing import MODELS, GiB, blocks_needed, num_gpu_blocks

    spec = MODELS["llama-3-8b"]
    peak = spec.weight_bytes + 2 * GiB + cuda_graphs * GiB
    per_request = per_request or (lambda block_size: blocks_needed(1025, block_size))
    answer = []
    for block_size in (16, 128):
        blocks = num_gpu_blocks(spec, block_size, 80 * GiB, peak, gpu_memory_utilization=utilization) - null_block
        answer.append(int(blocks // per_request(block_size)))
    return tuple(answer)


def _jamba_fp8_block_size(attention_dtype: str = "fp8", mamba_dtype: str = "bfloat16", alignment: int = 16):
    """Jamba-v0.1 with ``--kv-cache-dtype fp8`` in vLLM 0.33 (``_align_hybrid_block_size`` in
    ``vllm/platforms/interface.py``): the attention layers' K/V in fp8 (8 KV heads of 128, 1 byte a value), the Mamba
    states in the model's bf16 (``--mamba-cache-dtype auto``; ``mamba1_state_shape``: a conv state of 8,192 x 3, which
    0.33 stores transposed by default, the same bytes, and an SSM state of 8,192 x 16). block_size is the smallest
    multiple of 16 whose attention page holds the Mamba state; the Mamba page is padded to that page. Returns
    (block_size, padding bytes). The arguments replay slips."""
    from ..v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mamba = MambaSpec(shapes=((8192, 3), (8192, 16)), dtypes=(mamba_dtype, mamba_dtype)).page_size_bytes
    token = FullAttentionSpec(block_size=1, num_kv_heads=8, head_size=128, dtype=attention_dtype).page_size_bytes
    block_size = alignment * -(-mamba // (alignment * token))
    return block_size, block_size * token - mamba


# ---------------------------------------- free_list_allocation
def _next_block_after_frees(ignore_ref_counts: bool = False, one_by_one_in_one_call: bool = False,
                            to_tail: bool = False):
    """vLLM today's pool, caching off: a fresh 6-block pool hands out 4 blocks (0 to 3), and a second user touches
    block 1. Then ``free_blocks([2])``, and ``free_blocks([3, 1, 0])`` in one call: the blocks ``get_new_blocks(3)``
    returns next, in order. The flags replay slips: a touched block freed as if it had one user, one call's blocks
    put back one after another, or freed blocks put at the tail."""
    from ..v1.block_pool import BlockPool

    pool = BlockPool(num_gpu_blocks=6, block_size=16, enable_caching=False)
    pool.get_new_blocks(4)
    if not ignore_ref_counts:
        pool.touch([1])

    def free(block_ids):
        if to_tail:
            for block_id in block_ids:
                pool.allocator.free(block_id)  # one user fewer; at 0, to the tail
        else:
            pool.free_blocks(block_ids)

    free([2])
    if one_by_one_in_one_call:
        for block_id in (3, 1, 0):
            free([block_id])
    else:
        free([3, 1, 0])
    return pool.get_new_blocks(3)


def _table_after_a_free(freed_to: str = "0.33"):
    """vLLM today's pool, caching off: a 6-block pool, X (8 tokens) and Y (12) given slots, X freed, Z (10 tokens)
    given slots: Z's table, and the slot its last token's K/V is written to. ``freed_to`` replays a slip:
    ``"tail"`` (freed blocks at the tail, last block first) or ``"head, unreversed"`` (at the head in table order,
    the table's first block first in line)."""
    from ..v1 import KVCacheManager, Request

    kv = KVCacheManager(4, 6, enable_caching=False)
    requests = {name: Request(name, list(range(n)), max_tokens=1) for name, n in (("X", 8), ("Y", 12), ("Z", 10))}
    for name in "XY":
        kv.allocate_slots(requests[name], requests[name].num_tokens)
    if freed_to == "0.33":
        kv.free(requests["X"])
    else:
        table = kv.get_block_ids("X")
        kv.free(requests["X"])
        blocks = [kv.allocator.blocks[block_id] for block_id in table]
        for block in blocks:  # undo 0.33's placement, then put the blocks where the slip puts them
            kv.allocator.free_queue.remove(block)
        if freed_to == "tail":
            for block in reversed(blocks):
                kv.allocator.free_queue.append(block)
        else:
            kv.allocator.free_queue.prepend_n(blocks)
    kv.allocate_slots(requests["Z"], 10)
    table = kv.get_block_ids("Z")
    return table, table[9 // 4] * 4 + 9 % 4


def _longest_prompts(watermark: float = 0.05):
    """100 blocks of 16, watermark 0.05, 60 blocks in use: the longest prompt can_allocate admits now (OK),
    and the longest it does not refuse for ever (not NEVER), found by asking it."""
    from ..manager import AllocStatus, BlockSpaceManager

    manager = BlockSpaceManager(16, 100, watermark=watermark)
    manager.allocate("running", range(60 * 16))
    status = {tokens: manager.can_allocate(tokens) for tokens in range(1, 100 * 16 + 1)}
    return (max(t for t, s in status.items() if s == AllocStatus.OK),
            max(t for t, s in status.items() if s != AllocStatus.NEVER))


# ----------------------------------------- copy_on_write_forks
def _child_append_copies():
    """A 5-token sequence forked; the child appends 4 tokens in one call: the blocks copied from, and the blocks in
    use after. Both leave out the new blocks' ids, which depend on the order a manager takes them in (pagedkv copies
    first; v0.6.3's ``BlockTable.append_token_ids`` takes the fresh block first), so the answer holds for both."""
    from ..manager import BlockSpaceManager

    manager = BlockSpaceManager(4, 10)
    manager.allocate("p", range(5))
    manager.fork("p", "c")
    copies = manager.append_slots("c", range(4))
    return sorted(src for src, _ in copies), manager.num_total_gpu_blocks - manager.num_free_gpu_blocks


def _fork_of_a_fork(free_b: bool = True):
    """A (6 tokens, blocks [0, 1]) forked into B, B forked into C, B freed; then C appends, then A appends:
    block 1's ref count before C's append, and the copies each append returns."""
    from ..manager import BlockSpaceManager

    manager = BlockSpaceManager(4, 10)
    manager.allocate("A", range(6))
    manager.fork("A", "B")
    manager.fork("B", "C")
    if free_b:
        manager.free("B")
    ref_count = manager.allocators["gpu"].refcount(1)
    return ref_count, manager.append_slots("C", [6]), manager.append_slots("A", [7])


def _fan_out_whole_blocks(first_tokens: bool = True):
    """Section 6 on an 8-token prompt (two full blocks), block size 4, n = 3, each sample writing its first token:
    the prompt tokens each 0.33 child computes (children admitted one after another), 0.33's blocks in use, v0's
    copy-on-write copies (a sequence forked twice) and v0's blocks in use. ``first_tokens=False`` replays a slip:
    0.33's blocks counted before the first tokens' slots."""
    from ..manager import BlockSpaceManager
    from ..v1.kv_cache_manager import KVCacheManager
    from ..v1.scheduler import Request

    prompt = list(range(1, 9))
    kv = KVCacheManager(block_size=4, num_gpu_blocks=10)
    computed, children = [], []
    for index in range(3):
        child = Request(f"{index}_req", prompt, max_tokens=4)
        hit_blocks, num_hit = kv.get_computed_blocks(child)
        kv.allocate_slots(child, len(prompt) - num_hit, num_hit, hit_blocks)
        computed.append(len(prompt) - num_hit)
        children.append(child)
    for index, child in enumerate(children if first_tokens else ()):
        child.num_computed_tokens = len(prompt)
        child.output_token_ids.append(100 + index)
        kv.allocate_slots(child, 1)
    v0 = BlockSpaceManager(4, 10)
    v0.allocate("0", prompt)
    v0.fork("0", "1")
    v0.fork("0", "2")
    copies = sum(len(v0.append_slots(s, [100])) for s in ("0", "1", "2"))
    return computed, kv.num_gpu_blocks - kv.num_free_blocks, copies, v0.num_total_gpu_blocks - v0.num_free_gpu_blocks


# ----------------------------------------- beam_search_sharing
def _beam_loop_tokens():
    """Today's beam search (vLLM 0.33's ``LLM.beam_search``: pagedkv's ``v1.beam_search``, which ``generate`` runs
    on the v1 engine) at width 2 on a 10-token prompt, block size 4, on the tiny Llama with a pool from which no
    named block is evicted: the tokens the model computes at step 3, at step 4, and over steps 1 to 8. A search of
    ``s`` steps runs on a fresh engine for each ``s``: its count less the one after ``s - 1`` steps is step ``s``'s."""
    from ..decoding import synthetic_prompt, tiny_engine
    from ..sampling import BeamSearchParams

    computed = [0]
    for steps in range(1, 9):
        engine = tiny_engine(64, block_size=4, version="v1")
        engine.generate([synthetic_prompt(10)], BeamSearchParams(beam_width=2, max_tokens=steps))
        computed.append(engine.stats.num_computed_tokens)
    return computed[3] - computed[2], computed[4] - computed[3], computed[8]


def _partial_block_prompt():
    """n = 3 samples of 6 tokens from a 9-token prompt (two full blocks and one token), block size 4, on the tiny
    Llama: the copy-on-write copies over the request, and its peak blocks (the engine's own ``peak_gpu_blocks``)."""
    from ..decoding import GroupDecoding, synthetic_prompt, tiny_engine
    from ..sampling import SamplingParams

    engine = tiny_engine(16, block_size=4, watermark=0.0)
    group = GroupDecoding(engine, synthetic_prompt(9), SamplingParams(n=3, seed=0, max_tokens=6, ignore_eos=True))
    result = group.run()
    return sum(s.cow_copies for s in result.steps), engine.stats.peak_gpu_blocks


def _partial_block_prompt_slip(every_writer_copies: bool = False, unshared: bool = False):
    """The slips: each of the 3 samples copies the partial block (the last writer too), or every sample keeps its
    own copy of the prompt's blocks (5 of its 6 tokens written)."""
    from ..sizing import blocks_needed

    if unshared:
        return 2, 3 * blocks_needed(9 + 5, 4)
    return 3, 2 + 1 + 3 * 2  # two shared full blocks, the partial block kept by nobody, and each sample's own two


def _parallel_savings_sharegpt_like(limit: bool = True):
    """A 160-token prompt, 336 output tokens, blocks of 16, no EOS: the smallest ``n`` whose saving at the peak
    (replayed on the block manager as the engine drives it, ``replayed_parallel_savings``) reaches 25 %, and the
    saving's limit as ``n`` grows: the prompt's full blocks over the blocks a sample holds at the peak."""
    from ..decoding import replayed_parallel_savings
    from ..sizing import blocks_needed

    n = 2
    while replayed_parallel_savings(n, 160, 336) < 0.25:
        n += 1
    return n, (160 // 16) / blocks_needed(160 + 335, 16)


# ---------------------------------------------- prefix_caching
def _blocks_named_alike(chained: bool = True):
    """P = [1..12]; Q holds P's three blocks of tokens in the order 0, 2, 1: which of Q's blocks have a name
    (a chained hash) that P's chain has too."""
    from ..prefix import hash_block_tokens

    def chain(blocks):
        hashes, parent = [], None
        for tokens in blocks:
            name = hash_block_tokens(parent if chained else None, tokens)
            hashes.append(name)
            parent = name
        return hashes

    p_blocks = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    q_names = chain([p_blocks[0], p_blocks[2], p_blocks[1]])
    return [i for i, name in enumerate(q_names) if name in set(chain(p_blocks))]


def _admit_prompt(kv, request) -> int:
    """The scheduler's admission of a waiting request on vLLM today's manager: the prefix hit, then slots for the
    rest of the prompt (vLLM 0.33: ``Scheduler.schedule`` calling ``get_computed_blocks``, then
    ``allocate_slots``). Returns the tokens the hit served."""
    computed, num_computed = kv.get_computed_blocks(request)
    kv.allocate_slots(request, request.num_tokens - num_computed, num_computed, computed)
    request.num_computed_tokens = request.num_tokens
    return num_computed


def _blocks_of_a_returning_prefix(slip: str | None = None):
    """vLLM today's pool, 8 blocks of 4, caching on: R = [0..8] runs and is freed; S = [0..7] (R's two full
    blocks) is admitted: S's table. ``slip``: ``"no cap"`` (every full block hits; pagedkv's v0-shaped manager
    with 0.33's free order) or ``"unnamed to the tail"`` (R's partial block freed to the tail)."""
    from ..manager import BlockSpaceManager
    from ..v1 import KVCacheManager, Request

    if slip == "no cap":
        manager = BlockSpaceManager(4, 8, watermark=0.0, enable_prefix_caching=True, unnamed_blocks_first=True)
        manager.allocate("R", range(9))
        manager.free("R")
        return manager.allocate("S", range(8))
    kv = KVCacheManager(block_size=4, num_gpu_blocks=8)
    first = Request("R", list(range(9)), max_tokens=1)
    _admit_prompt(kv, first)
    last_block = kv.get_block_ids("R")[-1]
    kv.free(first)
    if slip == "unnamed to the tail":
        block = kv.allocator.blocks[last_block]
        kv.allocator.free_queue.remove(block)
        kv.allocator.free_queue.append(block)
    _admit_prompt(kv, Request("S", list(range(8)), max_tokens=1))
    return kv.get_block_ids("S")


def _lru_survivors(tail_first: bool = True, others: bool = True):
    """vLLM today's pool, 4 blocks of 4, caching on: A = [1..9] runs and is freed, B (8 new tokens) and C (4) are
    admitted and keep running: the tokens of A the prefix cache would serve now (``get_computed_blocks``)."""
    from ..v1 import KVCacheManager, Request

    kv = KVCacheManager(block_size=4, num_gpu_blocks=4)
    prompt_a = list(range(1, 10))
    request_a = Request("A", prompt_a, max_tokens=1)
    _admit_prompt(kv, request_a)
    if tail_first:
        kv.free(request_a)
    else:  # the slip: the table given back in its own order, first block first
        table = kv.get_block_ids("A")
        kv.free(request_a)
        named = [kv.allocator.blocks[b] for b in table if kv.block_pool.block_hash(b) is not None]
        for block in named:
            kv.allocator.free_queue.remove(block)
        for block in named:
            kv.allocator.free_queue.append(block)
    if others:
        _admit_prompt(kv, Request("B", list(range(20, 28)), max_tokens=1))
        _admit_prompt(kv, Request("C", list(range(40, 44)), max_tokens=1))
    return kv.get_computed_blocks(Request("A again", prompt_a, max_tokens=1))[1]


# ------------------------------------------------ memory_waste
def _pow2_never_used(rule: str = "reserve_pow2_output", buddy_rounds: bool = True):
    """The paper's Pow2 (``reserve_pow2_output``: the prompt plus the next power of two of the output), a 161-token
    prompt and outputs equally likely from 129 to 512: the mean fraction of the slots a request holds that no token of
    it will ever fill, its chunk placed first fit and under the buddy allocator, by ``pagedkv.sim``'s own rule and
    allocators. ``rule`` and ``buddy_rounds`` replay slips."""
    from ..sim import Buddy, FirstFit, chunk_slots

    prompt, outputs = 161, range(129, 513)

    def never_used(space):
        return sum(1 - (prompt + output) / space.held(chunk_slots(rule, prompt, output)) for output in outputs) \
            / len(outputs)

    return never_used(FirstFit), never_used(Buddy if buddy_rounds else FirstFit)


def _oracle_over_paged(paged_whole_blocks: bool = True, oracle_whole_chunk: bool = True,
                       last_token_only: bool = False):
    """One request, a 100-token prompt and 300 tokens to produce, 16-token blocks: the slots it holds, summed over
    its life (after each of its 300 decode steps, with the tokens it has then), under the oracle over paged, the
    paged blocks counted by pagedkv's ``BlockSpaceManager``. The flags replay slips."""
    from ..manager import BlockSpaceManager

    prompt, output, block_size = 100, 300, 16
    manager = BlockSpaceManager(block_size, num_gpu_blocks=64)
    manager.allocate("r", [0] * prompt)
    oracle = paged = 0
    for produced in range(1, output + 1):
        manager.append_slots("r", [0])
        tokens = prompt + produced
        blocks = len(manager.get_block_table("r")) * block_size
        if last_token_only and produced < output:
            continue
        oracle += prompt + output if oracle_whole_chunk else tokens
        paged += blocks if paged_whole_blocks else tokens
    return oracle / paged


def ledger(prompt, output, generated, block_size=16):
    """(token states, reserved, internal) of one paged request's slots, as ``pagedkv.sim._serve_paged`` files
    them: the request holds whole blocks for the tokens it has."""
    tokens = prompt + generated
    held = -(-tokens // block_size) * block_size  # the slots of the blocks it holds
    filled = min(held, prompt + output)  # those a token of this request will land in one day
    return tokens, filled - tokens, held - filled


# -------------------------------------- paged_attention_kernel
def lane_work(lane, block_size, num_words):
    """Which tokens of a KV block, and which 64-bit words of each, one lane of the 'vllm' kernel reads."""
    group_size = max(32 // block_size, 1)  # lanes per token: vLLM's THREAD_GROUP_SIZE
    groups_per_warp = 32 // group_size
    group, rank = lane // group_size, lane % group_size
    tokens = list(range(group, block_size, groups_per_warp))
    words = list(range(rank, num_words, group_size))
    return tokens, words


def _kernel_lane_work(lane, block_size, num_words):
    """The same, from the layout the kernel is built with (``cuda_vllm.thread_group_layout``) and the two index
    lines of its K pass (``qk_logits`` in ``grouped_phases``): token ``group + t * groups_per_warp``, words ``rank,
    rank + group_size, ...`` (tests/test_kernel_figures.py holds them to the kernel's source)."""
    from ..kernels.cuda_vllm import thread_group_layout

    layout = thread_group_layout(block_size, num_words)
    group, rank = lane // layout.group_size, lane % layout.group_size
    tokens = [group + t * layout.groups_per_warp for t in range(layout.tokens_per_group)]
    words = [w for w in (rank + v * layout.group_size for v in range(layout.words_per_thread)) if w < num_words]
    return tokens, words


def merge(a, b):
    """Two partial softmax summaries ``(m, s, acc)`` (max logit, sum of exp(logit - m), unnormalised output sum of
    exp(logit - m) * v) merged into one: one step of an online softmax, as vLLM 0.33's ``unified_attention``
    rescales its ``acc`` by ``alpha`` (``v1/attention/ops/triton_unified_attention.py``)."""
    import math

    (m_a, s_a, acc_a), (m_b, s_b, acc_b) = a, b
    m = max(m_a, m_b)
    alpha_a, alpha_b = math.exp(m_a - m), math.exp(m_b - m)  # each part rescaled to the new max
    return m, alpha_a * s_a + alpha_b * s_b, alpha_a * acc_a + alpha_b * acc_b


def log_sum_exp(part):
    """log(sum of exp(logit)) over a part's keys, from its summary: what ``merge_attn_states`` takes as a part's
    LSE (``v1/attention/ops/merge_attn_states.py``, vLLM 0.33)."""
    import math

    m, s, _ = part
    return m + math.log(s)


def _three_way_merge(functions, order, a, b, c):
    """E2's check: three parts merged in the order named, then ``(m, s, acc, log_sum_exp)`` of the result."""
    merge_fn, lse_fn = functions
    merged = merge_fn(merge_fn(a, b), c) if order == "(a with b) with c" else merge_fn(a, merge_fn(b, c))
    return [*merged, lse_fn(merged)]


def _merge_cases():
    """Three sets of parts (m, s, acc), each merged both ways; s >= 1, as a part's own max contributes exp(0)."""
    parts = (((1.0, 2.0, 0.5), (3.0, 1.0, -1.0), (0.0, 1.5, 2.0)),
             ((800.0, 1.5, 0.25), (790.0, 4.0, 2.0), (805.0, 1.0, -0.5)),  # exp(800) overflows
             ((-2.0, 5.0, 1.0), (2.5, 1.25, -3.0), (-40.0, 7.0, 10.0)))
    return tuple((order, *abc) for abc in parts for order in ("(a with b) with c", "a with (b with c)"))


def value_address(block, token, kv_head, d, block_size, num_kv_heads, head_size):
    """Where value element ``d`` of (block, token, kv_head) sits in one layer's cache in vLLM 0.33's LBNHC layout,
    counted in elements from the cache's start: block, token, head, then K's and V's ``head_size`` each."""
    row = (block * block_size + token) * num_kv_heads + kv_head  # (token, head) rows of 2 * head_size elements
    return row * 2 * head_size + head_size + d  # V after K in its row


def _lbnhc_value_address(block, token, kv_head, d, block_size, num_kv_heads, head_size):
    """The same, read off torch's strides: a cache whose element i holds i, viewed as FlashAttention views it
    (logical (num_blocks, num_kv_heads, block_size, 2 * head_size) over LBNHC memory, then ``transpose(1, 2)`` and
    ``split(head_size, dim=-1)``, ``v1/attention/backends/flash_attn.py``)."""
    import torch

    num_blocks = block + 1
    memory = torch.arange(num_blocks * block_size * num_kv_heads * 2 * head_size)
    kv_cache = memory.view(num_blocks, block_size, num_kv_heads, 2 * head_size).transpose(1, 2)
    _, value_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return int(value_cache[block, token, kv_head, d])


# vLLM 0.33's rules for one step's attention on two backends. Triton (``v1/attention/backends/triton_attn.py``): one
# ``unified_attention`` call a layer over every row, launching ``kernel_unified_attention`` on the 2-D grid, or, when
# ``use_3d`` holds, on the 3-D grid and then ``reduce_segments`` (``v1/attention/ops/triton_unified_attention.py``).
# FlashInfer (``v1/attention/backends/flashinfer.py``): the batch comes decodes first, ``split_decodes_and_prefills``
# finds where they end, and ``forward`` runs a prefill call ``if num_prefill_tokens > 0`` and a decode call
# ``if num_decode_tokens > 0``.
MIN_LAUNCH_GRID_SIZE_2D = 128  # triton_attn.py
MAX_3D_QUERY_LEN = 8  # triton_unified_attention.py


def _triton_use_3d(q_lens, num_heads: int, num_kv_heads: int, ignore_kv_heads: bool = False) -> bool:
    """``use_3d`` for a causal step without speculative decoding. ``seq_threshold_3D`` is
    ``MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads``, a default CUDA-graph capture size for 2, 4 or 8 KV heads, so the
    builder's snap to the nearest one leaves it; its scratch holds that many query rows (one per decode)."""
    block_q = 16 // (num_heads // num_kv_heads)  # BLOCK_M = 16 for up to 16 query heads per KV head
    threshold = MIN_LAUNCH_GRID_SIZE_2D // (1 if ignore_kv_heads else num_kv_heads)
    max_seqlen_q = max(q_lens)
    return (max_seqlen_q <= MAX_3D_QUERY_LEN and len(q_lens) * -(-max_seqlen_q // block_q) <= threshold
            and sum(q_lens) <= threshold)


def _step_calls(q_lens, num_layers: int, num_heads: int = 32, num_kv_heads: int = 8, per_request: bool = False,
                both_halves: bool = False, no_reduce: bool = False, ignore_kv_heads: bool = False):
    """One step of a ``num_layers`` model in vLLM 0.33: (Triton's attention calls, the kernels they launch,
    FlashInfer's attention calls). The flags replay slips: a FlashInfer call per request, both halves run in every
    step, the 3-D path's reduce forgotten, ``seq_threshold_3D`` taken as ``MIN_LAUNCH_GRID_SIZE_2D`` itself."""
    decodes, prefills = [q for q in q_lens if q <= 1], [q for q in q_lens if q > 1]
    halves = len(q_lens) if per_request else 2 if both_halves else bool(decodes) + bool(prefills)
    use_3d = _triton_use_3d(q_lens, num_heads, num_kv_heads, ignore_kv_heads)
    kernels = 1 if no_reduce else 1 + use_3d  # kernel_unified_attention, then reduce_segments in 3-D
    return num_layers, num_layers * kernels, num_layers * halves


SPLIT_STEPS = ((512, 200), (1,) * 4, (1,) * 40)  # E1's steps A (two prompt chunks), B (four decodes), C (forty)


def _split_step_calls(num_layers: int = 32, **slip):
    """A 32-layer model, 32 query heads over 8 KV heads, three steps: A (two prompt chunks of 512 and 200 rows), B
    (four long decodes), C (forty decodes)."""
    return tuple(_step_calls(q_lens, num_layers, **slip) for q_lens in SPLIT_STEPS)


# -------------------------------------- block_table_visualizer
SWAP_HOME_ACTIONS = ("add_sequence", "append", "fork", "free")  # the widget's buttons, less swaps and beam steps


def _swap_home_actions():
    """One answer to E1: a sequence that takes the five blocks ahead of block 2 (4, 5, 6, 7 and 3), then is freed,
    last block first, so that 3 joins the queue right behind 2."""
    return [("add_sequence", 17), ("free", "C")]


def _b_after_swap_in(actions):
    """Section 1's swap pool (block size 4, 8 GPU blocks, 4 CPU blocks: A with 7 tokens, B with 6, B swapped out),
    then ``actions`` on the visualizer, as the widget's buttons run them, then B swapped in: B's GPU block table.
    An answer that is not a list of at most three such actions, or an action the widget refuses, raises a
    ``PagedKVValueError`` that says which."""
    from ..errors import PagedKVValueError
    from ..viz import BlockTableVisualizer

    shape = ('give e1 as a list of at most three actions, each a tuple (method, arguments...), e.g. '
             '[("add_sequence", 3), ("fork", "C")]')
    if not isinstance(actions, (list, tuple)) or len(actions) > 3 or not all(
            isinstance(a, tuple) and a and isinstance(a[0], str) for a in actions):
        raise PagedKVValueError(shape)
    pool = BlockTableVisualizer(block_size=4, num_gpu_blocks=8, num_cpu_blocks=4)
    pool.add_sequence(7)
    pool.add_sequence(6)
    pool.swap_out("B")
    for i, (method, *args) in enumerate(actions, 1):
        call = f"{method}({', '.join(map(repr, args))})"
        if method not in SWAP_HOME_ACTIONS:
            raise PagedKVValueError(f"action {i}, {call}: use {', '.join(SWAP_HOME_ACTIONS)} (no swaps)")
        try:
            done = getattr(pool, method)(*args)
        except TypeError as error:
            raise PagedKVValueError(f"action {i}, {call}: {error}") from None
        if not done:
            raise PagedKVValueError(f"action {i}, {call}, changed nothing: {pool.message}")
    if not pool.swap_in("B"):
        raise PagedKVValueError(f"after your actions, {pool.message}")
    return pool.snapshot().tables["B"]


def _names_evicted(rule: str):
    """Cell 9's pool (prefix caching on, block size 4, 12 GPU blocks): A with 12 tokens, B with A's first 9; A freed,
    then B; then a request of 36 fresh tokens (9 blocks, no hit). The free blocks whose prefix-cache name its
    allocation evicts, under this widget's manager (``rule="widget"``: every freed block to the tail) or pagedkv's
    0.33 ``KVCacheManager`` (``"0.33"``: a freed block with no name to the head, a named one to the tail)."""
    if rule == "widget":
        from ..viz import BlockTableVisualizer

        viz = BlockTableVisualizer(block_size=4, num_gpu_blocks=12, num_cpu_blocks=0, enable_prefix_caching=True)
        viz.add_sequence(12)
        viz.add_sequence(9, reuse_prompt=True)
        viz.free("A")
        viz.free("B")
        names = {b.block_id: b.block_hash for b in viz.snapshot().blocks if b.block_hash}
        viz.add_sequence(36)
        after = {b.block_id: b.block_hash for b in viz.snapshot().blocks}
        return {b for b, name in names.items() if after[b] != name}
    from ..v1 import KVCacheManager

    kv = KVCacheManager(block_size=4, num_gpu_blocks=12)  # enable_caching=True, vLLM's default
    prompt = list(range(100, 112))
    a, _ = _admit(kv, "A", prompt)
    b, _ = _admit(kv, "B", prompt[:9])
    kv.free(a)
    kv.free(b)
    names = {block: kv.block_pool.block_hash(block) for block in range(12) if kv.block_pool.block_hash(block)}
    _admit(kv, "new", list(range(500, 536)))
    return {block for block, name in names.items() if kv.block_pool.block_hash(block) != name}


def _names_evicted_both():
    return _names_evicted("widget"), _names_evicted("0.33")


# -------------------------------- vllm_today (v1's block pool)
SYSTEM_PROMPT_V1 = list(range(100, 108))  # notebook 10's 8-token system prompt


def _admit(kv, request_id, prompt):
    """Notebook 10's ``admit``: a prefix-cache lookup, then slots for the rest; None when it does not fit."""
    from ..v1.scheduler import Request

    request = Request(request_id, prompt, max_tokens=8)
    hits, num_cached = kv.get_computed_blocks(request)
    if kv.allocate_slots(request, request.num_tokens - num_cached, num_cached, hits) is None:
        return None, num_cached
    return request, num_cached


# --------------------------------------------------- scheduler
def _preemption_replay(arrival_order=("q4", "q1", "q3", "q0", "q2")):
    """E1's situation on a real Scheduler: how many requests the step preempts, and who still runs after it."""
    from ..manager import BlockSpaceManager
    from ..scheduler import Scheduler

    manager = BlockSpaceManager(block_size=1, num_gpu_blocks=len(arrival_order), watermark=0.0)
    scheduler = Scheduler(manager, max_num_seqs=8, max_num_batched_tokens=64)
    for name in arrival_order:
        scheduler.add_request(name, [1], max_tokens=4)
    scheduler.update(scheduler.schedule(), dict.fromkeys(arrival_order, 1))  # pool full, each needs a block
    out = scheduler.schedule()
    return len(out.preempted), list(scheduler.running)


def _swap_crossover_block_size():
    """The smallest power-of-two block size at which swapping 500 tokens out and back in costs less than
    recomputing them, under the notebook's CostModel on a host with 20 us of overhead per copy (twice the
    default, so the answer is not section 6's table's)."""
    from ..sim import CostModel

    cost = CostModel(copy_overhead_ms=0.02)
    return next(b for b in (2 ** i for i in range(12)) if 2 * cost.swap_ms(500, b) < cost.recompute_ms(500))


def _v0_swap_back_steps():
    """Notebook 09's swap run (section 5) under vLLM 0.6.3's ``_schedule_default`` with ``--preemption-mode swap``
    on its default block manager (v2), replayed by ``v063_replay`` (its rules are listed there): the first step at
    which r2, and then r1, runs again after it is swapped out."""
    from .v063_replay import Replay063

    replay = Replay063(block_size=2, num_gpu_blocks=6, num_cpu_blocks=8, watermark=0.0, preemption_mode="swap",
                       max_num_seqs=4, max_num_batched_tokens=16)
    for name in ("r0", "r1", "r2"):
        replay.add_request(name, prompt_len=2, max_tokens=6)
    steps = replay.run()

    def back(name):
        out = next(i for i, step in enumerate(steps) if name in step.swapped_out)
        return next(i for i, step in enumerate(steps) if i > out and name in step.scheduled)

    return back("r2"), back("r1")


# --------------------------------------------------- tiny_vllm
@cache
def _tiny():
    from ..model import load_tiny

    return load_tiny()


def _resumed_row():
    """Notebook 12's E1 on the tiny model's v1 engine: block size 4, 7 blocks, prefix caching on; A ("The list ")
    and B ("A class is ") arrive together, 14 new tokens each; B is preempted in step 4 and admitted again in step
    14. In that step: the block ids the scheduler sends the worker for B (what ``sent_to_worker`` gives: a request
    absent the step before is sent its whole table, as vLLM 0.33 sends a resumed request), and the tokens of B the
    prefix cache serves."""
    from ..engine import LLMEngine

    model, tokenizer = _tiny()
    engine = LLMEngine(model, version="v1", num_gpu_blocks=7, block_size=4)  # prefix caching on by default
    engine.add_request("A", tokenizer.encode("The list "), max_tokens=14)
    engine.add_request("B", tokenizer.encode("A class is "), max_tokens=14)
    before, preempted_in = {}, None
    while engine.has_unfinished_requests():
        out = engine.step()
        step, tables = engine.stats.steps - 1, {r: list(t) for r, t in engine.snapshot().tables.items()}
        if "B" in out.preempted_req_ids:
            preempted_in = step
        if "B" in out.scheduled_new_reqs and preempted_in is not None:
            assert (preempted_in, step) == (4, 14), "the exercise's text names steps 4 and 14"
            return len(tables["B"][len(before.get("B", [])):]), engine.scheduler.requests["B"].num_cached_tokens
        before = tables
    raise AssertionError("B was never preempted and admitted again, as the exercise's text says")


def _capture_sizes(cap: int = 512) -> list:
    """vLLM 0.33's default CUDA-graph capture sizes (``_set_cudagraph_sizes`` in ``vllm/config/vllm.py``): 1, 2, 4,
    the multiples of 8 below 256, then those of 16 up to the cap (512 on most GPUs)."""
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, cap + 1, 16))


def _graph_padding(steps=((1,) * 5, (1,) * 5 + (30,)), pad_tokens: bool = True, pad_mixed_rows: bool = False,
                   pad_decode_rows: bool = True) -> tuple:
    """Notebook 12's E2 on a vLLM 0.33 worker with the default graphs (``FULL_AND_PIECEWISE``): each step, the
    tokens its requests run. A step replays the smallest captured size at least its tokens; past its real tokens
    the slot mapping holds -1. A pure-decode step replays a full graph captured with one request per token
    (``cudagraph_utils.py``), so its block table has that many rows and those past the real requests are zeroed
    (``gather_block_tables``); a mixed step replays the piecewise graphs, captured with no request count
    (``num_reqs=None``): attention runs outside them on the step's real rows. Per step: (slot-mapping length,
    zeroed block-table rows). The flags replay slips."""
    answer = []
    for tokens in steps:
        num_tokens, num_reqs = sum(tokens), len(tokens)
        padded = next(s for s in _capture_sizes() if s >= num_tokens) if pad_tokens else num_tokens
        decode = all(t == 1 for t in tokens)
        pads_rows = pad_decode_rows if decode else pad_mixed_rows
        answer += [padded, padded - num_reqs if pads_rows else 0]
    return tuple(answer)


# -------------------------------------------------- vllm_today
def _second_prompt_first_token_step():
    """v1, budget 256: 8 requests decoding; prompt A (1,000 tokens) first scheduled in step 1, prompt B (1,000)
    added right after step 1. The step (counting from 1) in which B samples its first token."""
    from ..v1 import KVCacheManager, Scheduler

    s = Scheduler(KVCacheManager(16, 512), max_num_batched_tokens=256)
    for i in range(8):
        s.add_request(i, [1, 2, 3], 500)
    out = s.schedule()  # the eight short prompts
    s.update_from_output(out, {r: 5 for r in s.sampling_request_ids(out)})
    s.add_request("A", list(range(1000)), 1)
    step = 0
    while True:
        step += 1
        out = s.schedule()
        sampled = s.sampling_request_ids(out)
        s.update_from_output(out, {r: 5 for r in sampled})
        if step == 1:
            s.add_request("B", list(range(1000, 2000)), 1)
        if "B" in sampled:
            return step


def _story_first_tokens(long_prefill_token_threshold: int = 4):
    """Notebook 10's story (12 blocks of 4, a budget of 8; A and B first, R after step 1) with a cap on each chunk:
    the steps in which A and R sample their first tokens."""
    from ..scheduler import stand_in_model
    from ..v1 import KVCacheManager, Scheduler

    s = Scheduler(KVCacheManager(block_size=4, num_gpu_blocks=12), max_num_batched_tokens=8,
                  long_prefill_token_threshold=long_prefill_token_threshold)
    s.add_request("A", SYSTEM_PROMPT_V1 + [1, 2, 3], 16)
    s.add_request("B", [50, 51, 52, 53, 54], 12)
    first, step = {}, 0
    while "R" not in first:
        if step == 2:
            s.add_request("R", SYSTEM_PROMPT_V1 + list(range(200, 214)), 8)
        out = s.schedule()
        sampled = s.sampling_request_ids(out)
        for request_id in sampled:
            first.setdefault(request_id, step)
        s.update_from_output(out, {r: stand_in_model(s.requests[r].all_token_ids) for r in sampled})
        step += 1
    return first["A"], first["R"]


def _preempted_and_back(enable_caching: bool = True):
    """v1, 6 blocks of 4, a budget of 16: X (9 prompt tokens), Y (5) and Z (7), sharing nothing, arrive together,
    6 new tokens each. The first request preempted, the step it is preempted in, the step it is admitted again,
    and the tokens the prefix cache serves it then."""
    from ..scheduler import stand_in_model
    from ..v1 import KVCacheManager, Scheduler

    s = Scheduler(KVCacheManager(block_size=4, num_gpu_blocks=6, enable_caching=enable_caching),
                  max_num_batched_tokens=16)
    for name, start, length in (("X", 100, 9), ("Y", 200, 5), ("Z", 300, 7)):
        s.add_request(name, list(range(start, start + length)), 6)
    victim = preempted_in = None
    step = 0
    while s.has_unfinished_requests():
        out = s.schedule()
        if victim is None and out.preempted_req_ids:
            victim, preempted_in = out.preempted_req_ids[0], step
        if victim in out.scheduled_new_reqs:
            return victim, preempted_in, step, s.requests[victim].num_cached_tokens
        sampled = s.sampling_request_ids(out)
        s.update_from_output(out, {r: stand_in_model(s.requests[r].all_token_ids) for r in sampled})
        step += 1
    raise AssertionError("nobody was preempted and admitted again, as the exercise's text says")


# --------------------------------------------- hybrid_kv_cache
@cache
def _retention_interval_names(interval: int | None = 16):
    """Notebook 13's section-3 request on the tiny hybrid (window 8 on layers 0 and 2, block 4, 24 blocks), with
    ``prefix_cache_retention_interval=interval``: A ("The list of it", 14 tokens) generates 12 and finishes; then B,
    A's first 20 tokens (its prompt and first 6 outputs) and 5 of its own. Returns (the logical blocks of A's
    sliding table that got a name, B's prompt tokens from the prefix cache). ``interval`` replays slips: 0 (the
    default's names) or None (dense)."""
    from ..engine import LLMEngine
    from ..model import LlamaForCausalLM
    from ..v1.scheduler import Request

    model, tokenizer = _tiny()
    config = dataclasses.replace(model.config, sliding_window=8,
                                 layer_types=["sliding_attention", "full_attention"] * 2)
    hybrid = LlamaForCausalLM(config)
    hybrid.load_state_dict(model.state_dict())
    engine = LLMEngine(hybrid, version="v1", num_gpu_blocks=24, block_size=4,
                       prefix_cache_retention_interval=interval)
    kv = engine.kv_cache_manager
    engine.add_request("A", tokenizer.encode("The list of it"), 12)
    named: set = set()
    while engine.has_unfinished_requests():
        engine.step()
        if "A" in engine.scheduler.requests:
            sliding = kv.get_block_ids("A")[0]
            named |= {i for i, b in enumerate(sliding) if b != kv.null_block and kv.block_pool.block_hash(b)}
            tokens = engine.scheduler.requests["A"].all_token_ids
    own = tokenizer.encode(" sets")  # 5 tokens, the first not A's 21st: B's block 5 is its own
    assert len(own) == 5 and own[0] != tokens[20], "the exercise's text says B goes its own way after 20 tokens"
    request = Request("B", tokens[:20] + own, max_tokens=1)
    return tuple(sorted(named)), kv.get_computed_blocks(request)[1]


def _agreed_hit_with_a_gap():
    """Window 8, block 4, a 25-token prompt (6 full blocks before its last token): the full group has all 6
    cached, the sliding group blocks 0, 1, 2 and 4. (tokens hit, null entries in the sliding group's hit)."""
    from ..v1 import KVCacheManager
    from ..v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, get_kv_cache_groups
    from ..v1.scheduler import Request

    specs = [SlidingWindowSpec(4, 1, 2, sliding_window=8), FullAttentionSpec(4, 1, 2)]
    kv = KVCacheManager(4, 32, True, get_kv_cache_groups(specs))
    request = Request("r", list(range(25)), max_tokens=1)
    hashes = kv.block_hashes(request, 24)
    for group, keep in ((0, {0, 1, 2, 4}), (1, set(range(6)))):  # as if earlier requests had cached them
        blocks = kv.block_pool.get_new_blocks(6)
        kv.block_pool.cache_full_blocks(group, blocks, hashes, 0, 6)
        for i in set(range(6)) - keep:
            kv.block_pool.prefix_caches[group].evict(blocks[i])
        kv.block_pool.free_blocks(blocks)
    (sliding, _), num_tokens = kv.get_computed_blocks(request)
    return num_tokens, sliding.count(kv.null_block)

# ------------------------------------------- unified_attention
def _next_step_metadata(cumulative: bool = True, causal_offset: bool = True):
    """Notebook 11's scheduler run (blocks of 4, budget 16, three 5-token requests decoding, a 30-token prompt
    arriving after step 0), one step past the one it shows: that step's ``cu_seqlens_q``, and the key positions
    its rows read in all (``kernel_figures.chunk_reads``, the rule the kernels use)."""
    import itertools

    from ..decoding import synthetic_prompt
    from ..v1 import KVCacheManager, Scheduler
    from ..viz.kernel_figures import chunk_reads
    from ..viz.scheduler_widget import stand_in_model

    tiny = Scheduler(KVCacheManager(4, 24), max_num_batched_tokens=16)
    for i in range(3):
        tiny.add_request(f"d{i}", synthetic_prompt(5, seed=i), 8)
    for step in range(4):
        out = tiny.schedule()
        if step == 3:
            break
        tiny.update_from_output(out, {r: stand_in_model(tiny.requests[r].all_token_ids)
                                      for r in tiny.sampling_request_ids(out)})
        if step == 0:
            tiny.add_request("long", synthetic_prompt(30, seed=9), 4)
    q_lens = list(out.num_scheduled_tokens.values())
    cu_seqlens_q = [0, *itertools.accumulate(q_lens)]
    seq_lens = [tiny.requests[r].num_computed_tokens for r in out.num_scheduled_tokens]  # this step's tokens included
    if not causal_offset:  # the slip: each row reads only this step's keys
        seq_lens = q_lens
    keys = sum(len(row["keys"]) for row in chunk_reads(cu_seqlens_q, seq_lens))
    return (cu_seqlens_q if cumulative else q_lens), keys


# ----------------------------------------------------------- speculative decoding
def _rollback_at_a_block_boundary(accepted: int = 1, cached_past_drafts: bool = False):
    """Blocks of 16, a decode at num_tokens 28 / num_computed_tokens 27 with 6 drafts, ``accepted`` of them accepted:
    (blocks held, num_computed_tokens, blocks in the prefix cache), replayed on the v1 scheduler. The mistakes:
    blocks given back at the rollback, or the drafts' block cached."""
    from ..v1 import KVCacheManager, Scheduler

    kv = KVCacheManager(16, 8)
    scheduler = Scheduler(kv, num_spec_tokens=6)
    scheduler.add_request("r", list(range(27)), 40)
    scheduler.update_from_output(scheduler.schedule(), {"r": 27})  # 28 tokens, 27 computed
    drafts = list(range(100, 106))
    scheduler.update_draft_token_ids({"r": drafts})
    out = scheduler.schedule()
    scheduler.update_from_output(out, {"r": drafts[:accepted] + [200]})
    request, table = scheduler.requests["r"], kv.get_block_ids("r")
    cached = sum(kv.block_pool.block_hash(b) is not None for b in table)
    if cached_past_drafts:  # as if blocks were cached up to num_computed_tokens when scheduled (34 slots)
        cached = (request.num_computed_tokens + 6 - accepted) // 16
    return len(table), request.num_computed_tokens, cached


def _cached_after_verify(accepted_counts=(2, 3), named_up_to: str = "num_computed_tokens"):
    """Blocks of 16, a decode at num_tokens 45 / num_computed_tokens 44 with 5 drafts (positions 45-49): the blocks
    in the prefix cache right after ``update_from_output``, for each number of accepted drafts, replayed on the v1
    scheduler (vLLM 0.33 calls ``cache_blocks`` there whenever speculation is on). ``named_up_to``: the mistakes,
    counted from the same replay: blocks named up to ``num_tokens`` (the last sampled token's K/V counted), or only
    by the step's ``allocate_slots`` (the call in ``update_from_output`` forgotten)."""
    from ..v1 import KVCacheManager, Scheduler

    named = []
    for accepted in accepted_counts:
        kv = KVCacheManager(16, 8)
        scheduler = Scheduler(kv, num_spec_tokens=5)
        scheduler.add_request("r", list(range(44)), 60)
        scheduler.update_from_output(scheduler.schedule(), {"r": 44})  # 45 tokens, 44 computed
        drafts = list(range(100, 105))
        scheduler.update_draft_token_ids({"r": drafts})
        out = scheduler.schedule()
        at_schedule = sum(kv.block_pool.block_hash(b) is not None for b in kv.get_block_ids("r"))
        scheduler.update_from_output(out, {"r": drafts[:accepted] + [200]})
        request = scheduler.requests["r"]
        named.append({"num_computed_tokens": sum(kv.block_pool.block_hash(b) is not None
                                                 for b in kv.get_block_ids("r")),
                      "num_tokens": request.num_tokens // 16, "allocate_slots": at_schedule}[named_up_to])
    return tuple(named)


# -------------------------------------------------- async_scheduling
def _async_tokens_computed():
    """Async scheduling (a queue of two steps), block size 16, no prefix caching: A (31-token prompt,
    max_tokens=100) samples EOS as its 2nd token; B (31-token prompt, max_tokens=2) has no stop token. Replayed on
    AsyncScheduler with the engine's loop: (the tokens the model computes for A, thrown-away ones included, the most
    blocks A holds, the same two for B)."""
    from collections import deque

    from ..v1 import AsyncScheduler, KVCacheManager

    kv = KVCacheManager(16, 64, enable_caching=False)
    s = AsyncScheduler(kv)
    s.add_request("A", list(range(31)), 100, stop_token_ids=[2])
    s.add_request("B", list(range(100, 131)), 2)
    computed, peak, queue, sampled_so_far = {"A": 0, "B": 0}, {"A": 0, "B": 0}, deque(), {"A": 0, "B": 0}
    while s.has_unfinished_requests() or queue:
        if s.has_unfinished_requests():
            out = s.schedule()
            for request_id, num_tokens in out.num_scheduled_tokens.items():
                computed[request_id] += num_tokens
            for request_id in peak:
                peak[request_id] = max(peak[request_id], len(kv.req_to_blocks.get(request_id, ())))
            sampled = {}
            for request_id in s.sampling_request_ids(out):
                sampled_so_far[request_id] += 1
                sampled[request_id] = 2 if request_id == "A" and sampled_so_far["A"] == 2 else 7  # A: EOS second
            if not out.is_empty:
                queue.appendleft((out, sampled))
                if len(queue) < 2:
                    continue
        s.update_from_output(*queue.pop())
    return computed["A"], peak["A"], computed["B"], peak["B"]


def _stale_token_delivered():
    """Async scheduling, 5 blocks of 2: A and B (3-token prompts, max_tokens=6) prefill in step 0; step 1 is
    scheduled before step 0's output; scheduling step 2 preempts one of them with step 1 in flight. The engine loop
    goes on (a queue of two steps; every ``schedule()`` call is a step, an empty one too) until the victim is
    scheduled again: (the preempted request, the step it is readmitted in, the tokens it is scheduled for then)."""
    from collections import deque

    from ..v1 import AsyncScheduler, KVCacheManager

    s = AsyncScheduler(KVCacheManager(2, 5, enable_caching=False), max_num_batched_tokens=16)
    s.add_request("A", [1, 2, 3], 6)
    s.add_request("B", [4, 5, 6], 6)
    queue, victim = deque(), None
    for step in range(20):
        out = s.schedule()
        if victim is None:
            victim = next((r for r in ("A", "B") if s.requests[r].num_stale_output_tokens), None)
        elif victim in out.num_scheduled_tokens:
            return victim, step, out.num_scheduled_tokens[victim]
        queue.appendleft((out, {r: 7 for r in s.sampling_request_ids(out)}))
        if len(queue) == 2:
            s.update_from_output(*queue.pop())  # the oldest step's output
    raise AssertionError("the victim was never readmitted")


# --------------------------------------- kv_offloading
def _two_tier_hit(gpu_blocks=(0, 1), cpu_blocks=(0, 2, 3, 4)):
    """Block size 4, a 20-token prompt P (blocks P0..P4). The GPU pool still caches P0 and P1 (free, named); the CPU
    tier holds P0, P2, P3 and P4. Replayed on v1's scheduler with the offloading connector: (prompt tokens served by
    the GPU prefix cache, tokens loaded from the CPU tier, prompt tokens the model computes once the load landed)."""
    from ..v1 import KVCacheManager, Scheduler
    from ..v1.kv_connector import KVConnectorOutput, KVConnectorRole, OffloadingConnector
    from ..v1.kv_connector.offloading.common import OffloadingWorkerMetadata
    from ..v1.kv_offload.base import ReqContext, make_offload_key
    from ..v1.scheduler import Request

    prompt = list(range(100, 120))
    kv = KVCacheManager(4, 16)
    connector = OffloadingConnector(KVConnectorRole.SCHEDULER, block_size=4, num_cpu_blocks=8)
    scheduler = Scheduler(kv, connector=connector)
    earlier = Request("earlier", prompt, max_tokens=1)  # an earlier request left these blocks behind
    kv.allocate_slots(earlier, 20)
    hashes = [h for h, _, _ in kv.req_to_hashes["earlier"]]
    for i, block_id in enumerate(kv.get_block_ids("earlier")):
        if i not in gpu_blocks:
            kv.block_pool.prefix_caches[0].evict(block_id)
    kv.free(earlier)
    keys = [make_offload_key(hashes[i], 0) for i in cpu_blocks]
    context = ReqContext("earlier")
    connector.manager.prepare_store(keys, context)
    connector.manager.complete_store(keys, context)
    scheduler.add_request("P", prompt, 4)
    out = scheduler.schedule()
    request = scheduler.requests["P"]
    from_gpu, from_cpu = request.num_cached_tokens, request.num_computed_tokens - request.num_cached_tokens
    done = OffloadingWorkerMetadata(set(out.kv_connector_metadata.load_jobs))
    scheduler.update_from_output(out, {}, KVConnectorOutput(set(), {"P"} if from_cpu else set(), done))
    out = scheduler.schedule()
    return from_gpu, from_cpu, out.num_scheduled_tokens["P"]


def _blocks_stored_by_a_turn(gpu_hit_blocks: int = 2, cpu_hit_blocks: int = 3):
    """Block size 8, a 58-token prompt and a 20-token answer. The GPU prefix cache serves blocks 0-1; the CPU tier
    holds blocks 2-4 and loads them. Replayed on v1's scheduler with the offloading connector (every copy done
    within its step): the indices of the request's blocks this turn stores in the CPU tier."""
    from ..v1 import KVCacheManager, Scheduler
    from ..v1.kv_connector import KVConnectorOutput, KVConnectorRole, OffloadingConnector
    from ..v1.kv_connector.offloading.common import OffloadingWorkerMetadata
    from ..v1.kv_offload.base import ReqContext, make_offload_key
    from ..v1.scheduler import Request

    prompt = list(range(200, 258))
    kv = KVCacheManager(8, 32)
    connector = OffloadingConnector(KVConnectorRole.SCHEDULER, block_size=8, num_cpu_blocks=32)
    scheduler = Scheduler(kv, connector=connector)
    earlier = Request("earlier", prompt, max_tokens=1)  # an earlier request left these blocks behind
    kv.allocate_slots(earlier, len(prompt))
    hashes = [h for h, _, _ in kv.req_to_hashes["earlier"]]
    for block_id in kv.get_block_ids("earlier")[gpu_hit_blocks:]:
        kv.block_pool.prefix_caches[0].evict(block_id)
    kv.free(earlier)
    keys = [make_offload_key(h, 0) for h in hashes]
    stored_before = keys[gpu_hit_blocks:gpu_hit_blocks + cpu_hit_blocks]
    connector.manager.prepare_store(stored_before, ReqContext("earlier"))
    connector.manager.complete_store(stored_before)
    scheduler.add_request("turn", prompt, 20)
    while scheduler.has_requests():
        out = scheduler.schedule()
        meta = out.kv_connector_metadata
        done = OffloadingWorkerMetadata(set(meta.load_jobs) | set(meta.store_jobs))
        loaded = {job.req_id for job in meta.load_jobs.values()}
        sampled = {r: 7 for r in scheduler.sampling_request_ids(out)}
        scheduler.update_from_output(out, sampled, KVConnectorOutput(set(), loaded, done))
    request_keys = [make_offload_key(h, 0) for h, _, _ in kv.block_hashes(Request("x", prompt + [7] * 20, 1), 78)]
    return [i for i, key in enumerate(request_keys) if key in connector.manager.policy.chunks
            and key not in stored_before]


EXERCISES: dict[str, Exercise] = {
    "tp-blocks-growth": Exercise("blocks per GPU at tensor parallelism 8 over those at 4, Llama-2-70B",
                      notebook="block_size_arithmetic", expected=_tp_blocks_growth, tolerance=0.01,
                      mistakes=((lambda: _tp_blocks_growth(weights_tp=4), "you halved each GPU's block, but left it "
                                 "the weights it held at 4 GPUs; the weights are split over 8 GPUs too, so each GPU's "
                                 "budget grows as well."),
                                (lambda: _tp_blocks_growth(heads_tp=4), "you grew each GPU's budget, but kept its "
                                 "block as at 4 GPUs; over 8 GPUs each keeps one of the 8 KV heads, not two."),
                                (lambda: _tp_blocks_growth(utilization=1.0), "you gave the cache the whole card; "
                                 "vLLM uses only gpu_memory_utilization of it.")),
                      hint="twice as many GPUs share the model: list what one GPU holds (weights, activations, "
                           "blocks) and, for each, whether it shrinks; then what the block itself holds."),
    "requests-at-two-block-sizes": Exercise("(1,025-token requests the cache holds at block_size 16, at 128)",
                      notebook="block_size_arithmetic", expected=_requests_at_block_sizes,
                      mistakes=((lambda: _requests_at_block_sizes(per_request=lambda block_size: 1025 / block_size),
                                 "you divided the blocks by 1,025 / block_size; a request holds whole blocks, and its "
                                 "last one, partly empty, is a whole block too."),
                                (lambda: _requests_at_block_sizes(per_request=lambda block_size: 1025 // block_size),
                                 "1,025 tokens do not fit in 1,025 // block_size blocks: the tokens past the last full "
                                 "block need one more."),
                                (lambda: _requests_at_block_sizes(null_block=False, utilization=0.90,
                                                                  cuda_graphs=0),
                                 "that is v0.6.3's budget; the question is about 0.33's.")),
                      hint="first the blocks: how many does 0.33's budget cut at each block size (section 3), and "
                           "which one does it keep back? Then how many blocks does one 1,025-token request hold at "
                           "each size (section 4)?"),
    "jamba-fp8-block-size": Exercise("(Jamba's block_size with an fp8 KV cache, padding bytes in each Mamba page)",
                      notebook="block_size_arithmetic", expected=_jamba_fp8_block_size,
                      mistakes=((lambda: _jamba_fp8_block_size(mamba_dtype="fp8"), "--kv-cache-dtype sets the "
                                 "attention layers' K/V only; the Mamba states keep their own, the model's bf16."),
                                (lambda: _jamba_fp8_block_size(attention_dtype="bfloat16"), "that is the bf16 cache of "
                                 "section 5; in fp8 an attention token takes half the bytes, so a page that holds the "
                                 "Mamba state needs more tokens."),
                                (lambda: _jamba_fp8_block_size(alignment=1), "0.33 keeps block_size a multiple of the "
                                 "attention kernel's block, 16 here, as in section 5.")),
                      hint="what does --kv-cache-dtype apply to, and what does that do to each of the two pages? "
                           "Then redo section 5's steps: the smallest multiple of 16 tokens whose attention page holds "
                           "the Mamba state, and what that page has left over."),
    "pow2-buddy-never-used": Exercise("(mean share never used under the paper's Pow2: placed first fit, under a "
                      "buddy allocator)", notebook="memory_waste", expected=_pow2_never_used, tolerance=0.005,
                      mistakes=((lambda: _pow2_never_used("reserve_pow2"), "you rounded the whole length up to a power "
                                 "of two; the paper's rule rounds only the output, and adds the prompt on top."),
                                (lambda: _pow2_never_used(buddy_rounds=False), "the buddy allocator hands out only "
                                 "blocks of a power of two: which block holds a chunk of the prompt plus a power of "
                                 "two?")),
                      hint="which chunk does the rule give a 161-token prompt with 200 tokens to produce, and with "
                           "400? Which block does a buddy allocator hand out for each? Then, request by request, the "
                           "share of what it holds past its final length."),
    "oracle-over-paged": Exercise("the oracle's slots over paging's, summed over the request's life",
                      notebook="memory_waste", expected=_oracle_over_paged, tolerance=0.005,
                      mistakes=((lambda: _oracle_over_paged(paged_whole_blocks=False), "you counted paging's token "
                                 "states only; a paged request holds whole blocks, the empty slots of its last one "
                                 "too."),
                                (lambda: _oracle_over_paged(oracle_whole_chunk=False), "the oracle's chunk is as long "
                                 "as the request's final length from admission on, not only as its tokens so far."),
                                (lambda: _oracle_over_paged(last_token_only=True), "that compares the two at the last "
                                 "token only, as section 2's static count does; the question sums over every step.")),
                      hint="after p produced tokens, what does each hold: the oracle's chunk, and the paged "
                           "request's whole blocks? Add each up over p = 1 to 300."),
    "three-ledgers": Exercise("ledger", notebook="memory_waste", solution=ledger,
                      cases=((100, 300, 50), (40, 100, 25), (32, 10, 0), (100, 290, 288), (100, 290, 290),
                             (100, 290, 288, 32), (19, 58, 0), (19, 58, 0, 256), (10, 6, 6)),
                      hint="a paged request holds whole blocks for the tokens it has, no more. An empty slot in them "
                           "is reserved if a later token of this request will land in it, internal if none will."),
    "next-block-after-frees": Exercise("the blocks get_new_blocks(3) returns",
                      notebook="free_list_allocation", expected=_next_block_after_frees,
                      mistakes=((lambda: _next_block_after_frees(ignore_ref_counts=True), "block 1 had two users "
                                 "when free_blocks([3, 1, 0]) ran: how many has it after that call, and is it free?"),
                                (lambda: _next_block_after_frees(one_by_one_in_one_call=True), "you put the blocks "
                                 "of free_blocks([3, 1, 0]) back one after another. Does one call hand the queue its "
                                 "blocks one at a time, or as one list? Compare section 5's free(B)."),
                                (lambda: _next_block_after_frees(to_tail=True), "you put the freed blocks at the "
                                 "tail; with caching off, which end does free_blocks put them at?")),
                      hint="write out the free queue and the ref counts of blocks 0 to 3 after every call: which "
                           "blocks reach 0, to which end do they go, and in which order?", say_which=False),
    "table-after-a-free": Exercise("(Z's block table, the slot of Z's last token)",
                      notebook="free_list_allocation", expected=_table_after_a_free,
                      mistakes=((lambda: _table_after_a_free(freed_to="tail"), "you put X's freed blocks at the "
                                 "tail; with caching off, which end of the queue does free_blocks put them at?"),
                                (lambda: _table_after_a_free(freed_to="head, unreversed"), "you put X's blocks at "
                                 "the head in table order; free() hands free_blocks the table reversed, last block "
                                 "first.")),
                      hint="write the free queue out after every call: in which order does freeing a request give "
                           "its blocks back, and to which end? Then slot = block * block_size + offset."),
    "watermark-longest-prompts": Exercise("(longest prompt answered OK now, longest not answered NEVER)",
                      notebook="free_list_allocation", expected=_longest_prompts,
                      mistakes=((lambda: _longest_prompts(watermark=0.0), "you let a prompt take every free "
                                 "block; both tests keep the watermark's blocks back."),
                                (lambda: tuple(t // 16 for t in _longest_prompts()), "those are blocks; the "
                                 "question asks for tokens, and a prompt's last block may be full."),
                                (lambda: tuple(t - 16 for t in _longest_prompts()), "you kept one block more "
                                 "than the watermark; both tests compare with >=, so a prompt may leave exactly "
                                 "the watermark free.")),
                      hint="what must each test leave free, counting from which pool, and does leaving exactly "
                           "that much pass?"),
    "blocks-named-alike": Exercise("Q's blocks named as one of P's",
                      notebook="prefix_caching", expected=_blocks_named_alike,
                      mistakes=((lambda: _blocks_named_alike(chained=False), "you named each block by its own tokens "
                                 "alone; a name chains in its parent's name."),),
                      hint="what goes into a block's name besides its own tokens? Compare that input, block by "
                           "block, for Q and for P."),
    "returning-prefix-table": Exercise("the new request's blocks",
                      notebook="prefix_caching", expected=_blocks_of_a_returning_prefix,
                      mistakes=((lambda: _blocks_of_a_returning_prefix("no cap"), "you let both of S's blocks hit; "
                                 "S is exactly two full blocks, and get_computed_blocks caps a hit at "
                                 "num_tokens - 1 tokens, in whole blocks."),
                                (lambda: _blocks_of_a_returning_prefix("unnamed to the tail"), "you put R's freed "
                                 "partial block at the tail; a block without a name goes to the free queue's head.")),
                      hint="which of R's blocks keep a name when freed, and which end of the free queue does each "
                           "go to? Then: how many of S's tokens may a hit serve at most?"),
    "lru-survivors": Exercise("tokens of A still cached", notebook="prefix_caching", expected=_lru_survivors,
                      mistakes=((lambda: _lru_survivors(tail_first=False), "you freed A's blocks first block first; "
                                 "free() gives a table back from its last block, so which of A's blocks waits "
                                 "longest in the queue?"),
                                (lambda: _lru_survivors(others=False), "you kept all of A's named blocks; B and C "
                                 "took fresh blocks from the head of the free queue: which blocks were there?")),
                      hint="new blocks come from the free queue's head; A's partial block went to the head, its named "
                           "blocks to the tail last block first; a hit counts only up to its first missing block."),
    "child-append-copies": Exercise("(blocks copied from, blocks in use)", notebook="copy_on_write_forks",
                      expected=_child_append_copies,
                      mistakes=((lambda: ([], 3), "no copy in your answer: the append runs past block 1, but where do "
                                 "its first tokens go, and who else holds that block?"),
                                (lambda: ([0, 1], 5), "block 0 is full and receives no token: only a shared block "
                                 "that is written into is copied."),
                                (lambda: ([1], 3), "count every block someone holds, the parent's included: does the "
                                 "parent give up anything when the child copies?")),
                      hint="which of the child's blocks receive the 4 new tokens, and which of those is shared? Then "
                           "how many slots do the 4 tokens need beyond it, and which blocks does each sequence "
                           "hold at the end?"),
    "fork-of-a-fork": Exercise("(block 1's ref count before C's append, C's copies, A's copies)",
                      notebook="copy_on_write_forks", expected=_fork_of_a_fork,
                      mistakes=((lambda: _fork_of_a_fork(free_b=False), "B still holds its references in your "
                                 "answer; freeing B drops one from each of its blocks."),),
                      hint="a fork adds one reference to every block of the sequence it copies, and freeing a "
                           "sequence drops one from each of its blocks. A write copies a partly filled block only "
                           "while someone else still holds it, and the writer's reference moves to the copy."),
    "fan-out-whole-blocks": Exercise("(tokens each 0.33 child computes, 0.33 blocks in use, v0 copies, v0 blocks in "
                      "use)", notebook="copy_on_write_forks", expected=_fan_out_whole_blocks,
                      mistakes=((lambda: ([8, 0, 0], 5, 0, 5), "the later children cannot hit the whole prompt: a hit "
                                 "stops at num_tokens - 1 tokens, in whole blocks (notebook 04)."),
                                (lambda: _fan_out_whole_blocks(first_tokens=False)[:2] + (0, 5), "those are 0.33's "
                                 "blocks after the prefill; each child's first token needs a slot too: is there one "
                                 "left in its blocks?"),
                                (lambda: ([8, 4, 4], 7, 2, 4), "that is section 6's v0 bill, where the last prompt "
                                 "block had room; here it is full: which block does each sample's token go into?"),
                                (lambda: ([8, 4, 4], 7, 0, 2), "a fork adds no blocks, but the samples' first tokens "
                                 "need slots too: are there any free in the prompt's blocks?")),
                      hint="0.33: a hit stops at num_tokens - 1 tokens, in whole blocks (notebook 04), and what is "
                           "not hit is computed into blocks of the child's own. v0: which block does each sample's "
                           "first token land in (section 4)? Then count every block someone holds, in each engine."),
    "beam-loop-tokens": Exercise("(tokens computed at step 3, at step 4, over steps 1 to 8)",
                      notebook="beam_search_sharing", expected=_beam_loop_tokens,
                      mistakes=((lambda: (2, 2, 24), "that is what a search by forking computes, one token a beam; a "
                                 "new request finds only full blocks that have a name: where does a beam's last "
                                 "named block end?"),
                                (lambda: (4, 1, 23), "count over the step's two requests, not one beam's."),
                                (lambda: (0, 2, 30), "a beam's newest token was only sampled, never computed: can a "
                                 "block that holds it have a name yet?"),
                                (lambda: (8, 2, 36), "the count over steps 1 to 8 includes step 1's prompt.")),
                      hint="per request: its tokens less its hit, and a hit is whole blocks that have a name (notebook "
                           "04). A block is named once a request has filled it: which of a beam's blocks did its "
                           "parent's request fill a step earlier?"),
    "partial-block-prompt": Exercise("(copy-on-write copies over the request, peak blocks in use)",
                      notebook="beam_search_sharing", expected=_partial_block_prompt,
                      mistakes=((lambda: _partial_block_prompt_slip(every_writer_copies=True), "the last sample to "
                                 "write finds the block's ref count back at 1: does it still need a copy?"),
                                (lambda: _partial_block_prompt_slip(unshared=True), "you counted the prompt's full "
                                 "blocks once per sample; the samples are forked from one prompt and share them.")),
                      hint="a write copies a shared, partly filled block while someone else still holds it, and the "
                           "writer's reference moves to the copy (notebook 05). For the peak, the last step "
                           "allocates a slot for every sample's previous token; the token it samples last is never "
                           "written."),
    "parallel-sampling-savings": Exercise("(smallest n saving 25 %, the saving's limit as n grows)",
                      notebook="beam_search_sharing", expected=_parallel_savings_sharegpt_like, tolerance=0.005,
                      hint="write the saving at the peak as a formula in n: count the blocks one sample holds then "
                           "(is the last sampled token ever written?), and which of them the samples hold once. "
                           "Then solve for 25 %, and let n grow."),
    "visualizer-swap-home": Exercise("(B's GPU block table after your actions and the swap in)",
                      notebook="block_table_visualizer", expected=_swap_home_actions, outcome=_b_after_swap_in,
                      mistakes=((lambda: [("add_sequence", 16), ("free", "C")], "B is back on its old blocks, but "
                                 "in the other order: when B comes back, which of the two waits nearer the queue's "
                                 "head, and what put it there?"),
                                (lambda: [], "with nothing done first, the swap in takes the two blocks at the "
                                 "queue's head: which blocks stand ahead of 2 and 3 there?")),
                      hint="a swap in takes its GPU blocks from the free queue's head, in order. Write the queue out "
                           "after the swap out, then ask what must leave the head, and what must come back behind "
                           "block 2, for 2 and 3 to be the first two. A free gives a table back last block first, "
                           "each block to the tail."),
    "visualizer-evicted-names": Exercise("(named free blocks the 36-token request evicts: in this widget, under "
                      "0.33's rule)", notebook="block_table_visualizer", expected=_names_evicted_both,
                      mistakes=((lambda: ({2}, {2}), "under 0.33 a freed block without a name does not wait at the "
                                 "tail: where does B's partly filled block 3 go, and which blocks does the new "
                                 "request take then?"),
                                (lambda: (set(), set()), "in this widget every freed block joins the tail, named or "
                                 "not, in the order the frees give them back: which block is ninth from the head "
                                 "after both frees?"),
                                (lambda: ({2, 3}, set()), "block 3 is only partly filled, so it never had a name: "
                                 "handing it out evicts nothing.")),
                      hint="write each rule's free queue out after both frees, marking the blocks that hold a name "
                           "(only full blocks have one, notebook 04), then hand out 9 blocks from its head. A free "
                           "walks a table last block first; a block joins the queue only when its ref count "
                           "reaches 0."),
    "lane-work": Exercise("lane_work",
                      notebook="paged_attention_kernel", solution=lane_work, reference=_kernel_lane_work,
                      cases=((13, 8, 32), (21, 2, 32), (31, 8, 16), (30, 4, 8), (7, 32, 32), (3, 64, 32),
                             (0, 128, 16), (9, 1, 64)),  # never block size 16: section 4's figure draws it
                      hint="first find the group size (never under one lane), the lane's group and its rank in "
                           "the group. How many groups fit in a warp? When a block has more tokens than that, which "
                           "token does group 0 take after token 0? And which word does rank 0 load after word 0?"),
    "softmax-merge": Exercise("merge and log_sum_exp", notebook="paged_attention_kernel",
                      solution=(merge, log_sum_exp), run=_three_way_merge, cases=_merge_cases(), tolerance=1e-9,
                      hint="each part's s and acc were measured from its own max: what becomes of every one of their "
                           "terms when the max they are measured from changes? How does acc relate to section 6's "
                           "o_p? For log_sum_exp: which of the part's numbers already holds its sum of exp, and "
                           "measured from what? Take exp only of a difference, never of a logit alone (section 3)."),
    "lbnhc-value-address": Exercise("value_address",
                      notebook="paged_attention_kernel", solution=value_address, reference=_lbnhc_value_address,
                      cases=((1, 3, 1, 0, 4, 2, 8), (0, 2, 0, 5, 4, 2, 8), (1, 0, 1, 7, 4, 2, 8),
                             (3, 5, 2, 100, 16, 8, 128), (2, 15, 0, 63, 16, 1, 64), (0, 7, 3, 0, 8, 4, 32)),
                      hint="LBNHC names the dimensions from the slowest to the fastest: how many elements does one "
                           "step of each skip, from the last dimension back to the block? And where in a (token, "
                           "head) row does V start?"),
    "preemption-victim": Exercise("(preempted this step, still running)", notebook="scheduler",
                      expected=_preemption_replay,
                      hint="in which order does the scheduler walk the running requests, and whose blocks does "
                           "each one that needs a block take? What is left to take when the one that needs a block "
                           "is the last one left in the queue?",
                      mistakes=((lambda: (2, ["q4", "q1", "q3"]), "can a request that gets no block skip the step "
                                                                  "and keep its own blocks? Whom can the last one "
                                                                  "left take from?"),)),
    "swap-crossover-block-size": Exercise("crossover block size",
                      notebook="scheduler", expected=_swap_crossover_block_size,
                      hint="recompute's cost does not depend on the block size; a swap pays the bytes once and a "
                           "fixed overhead per copy, per block, layer, K and V, and it goes out and back in: solve "
                           "for the number of blocks first, then turn blocks into a block size."),
    "v0-swap-back-steps": Exercise("(the step r2 runs again, the step r1 runs again)",
                      notebook="scheduler", expected=_v0_swap_back_steps,
                      hint="go step by step from step 0. Before a running request's next token, what does 0.6.3's "
                           "can_append_slots ask for: the blocks the token needs, or one free block for every block "
                           "it touches, whatever room its last block has? When that fails, who is swapped out? In a "
                           "step that swapped nobody out, what does can_swap_in count for the head of the swapped "
                           "queue: its blocks, and a block more only when its last block is full? And when does a "
                           "finished request give its blocks back?",
                      mistakes=((lambda: (6, 9), "does 0.6.3's can_append_slots count the blocks a running "
                                                 "request's next token needs, or the blocks its append touches? "
                                                 "What does that make of a step in which no block is free?"),
                                (lambda: (7, 6), "that is pagedkv's run: does 0.6.3 count a running request's next "
                                                 "block, and read its swapped queue, as pagedkv does?"),
                                (lambda: (6, 6), "in which order does 0.6.3 read its swapped queue? And what does "
                                                 "v2's can_swap_in count for a request whose last block has room?"),
                                (lambda: (5, 5), "can both come back in one step? Count what can_swap_in asks of "
                                                 "each against the blocks still free once the running requests "
                                                 "have their slots."))),
    "chunked-first-token-step": Exercise("the step in which B samples its first token",
                      notebook="vllm_today", expected=_second_prompt_first_token_step,
                      hint="running requests go first, in the order they were admitted, so A's chunks come before B "
                           "gets anything; once A has sampled it is one more decode, one token a step."),
    "story-with-a-chunk-cap": Exercise("(the step A first samples in, the step R first samples in)",
                      notebook="vllm_today", expected=_story_first_tokens,
                      hint="the cap applies to every request's chunk, running or waiting, in any step that begins with "
                           "more than one request running or waiting; a decode is 1 token, under any cap. Walk the "
                           "budget step by step from step 0.",
                      mistakes=((lambda: (1, 5), "at step 0 A and B are both waiting: the cap is lifted only for a "
                                                 "request that is alone."),
                                (lambda: (2, 4), "R's chunks are capped too: more than one request is running in "
                                                 "each of its steps."))),
    "preempted-and-back": Exercise("(victim, step preempted in, step admitted again, tokens from the cache)",
                      notebook="vllm_today", expected=_preempted_and_back,
                      hint="start with the gate in step 0: whose whole sequence fits beside the others'? Then count "
                           "each running request's slots step by step. When one needs a block and none is free, who "
                           "is last in running? Its full blocks are named when freed: who takes blocks before it comes "
                           "back, and how many free blocks does its return need?",
                      mistakes=((lambda: ("Z", 2, 6, 0), "Z arrived last, but is it running? The gate looks at its "
                                                         "whole sequence, not the chunk the budget leaves it."),
                                (lambda: ("Y", 4, 5, 8), "Y's hits sit in the free queue: they count against the "
                                                         "free blocks, beside the one new block it needs."),
                                (lambda: _preempted_and_back(enable_caching=False),
                                 "Y's full blocks keep their names in the free queue until they are handed out: "
                                 "does anyone take a block while Y waits?"))),
    "split-step-calls": Exercise("(step A, step B, step C), each (Triton calls, kernels they launch, FlashInfer "
                                 "calls)",
                      notebook="unified_attention", expected=_split_step_calls,
                      mistakes=((lambda: _split_step_calls(num_layers=1), "that is one layer's count: every layer "
                                 "of the model makes its own attention calls."),
                                (lambda: _split_step_calls(per_request=True), "FlashInfer's split makes two groups, "
                                 "not one per request: a decode call over all the decodes, a prefill call over all "
                                 "the prefill rows."),
                                (lambda: _split_step_calls(both_halves=True), "does FlashInfer's forward run a half "
                                 "that has no rows in the step?"),
                                (lambda: _split_step_calls(no_reduce=True), "a unified_attention call that goes 3-D "
                                 "launches a second kernel after the first: which steps go 3-D?"),
                                (lambda: _split_step_calls(ignore_kv_heads=True),
                                 "seq_threshold_3D is not MIN_LAUNCH_GRID_SIZE_2D itself: the 2-D grid runs each "
                                 "query tile once per KV head.")),
                      hint="for each step, one layer first: which rows does it have, and how many calls does each "
                           "backend make for them? Then Triton's use_3d: how long is the step's longest query, and "
                           "how do its sequences compare with seq_threshold_3D for 8 KV heads? A 3-D call launches "
                           "more than one kernel."),
    "next-step-metadata": Exercise("(cu_seqlens_q, key positions read in all)",
                      notebook="unified_attention", expected=_next_step_metadata,
                      mistakes=((lambda: _next_step_metadata(cumulative=False), "you gave each sequence's number "
                                 "of query rows; cu_seqlens_q is their running sum, starting at 0."),
                                (lambda: _next_step_metadata(causal_offset=False), "you counted only the keys "
                                 "written in this step; a row also reads every key earlier steps wrote.")),
                      hint="who takes the budget first, and how much of the prompt is left after its two chunks? "
                           "Then apply section 1's rule to every row: where does it sit, and which keys does it read?"),
    "resumed-request-row": Exercise("(block ids sent for B in step 14, B's tokens from the prefix cache)",
                      notebook="tiny_vllm", expected=_resumed_row,
                      mistakes=((lambda: (3, 4), "the worker dropped B's row when B was preempted: a block B gets "
                                 "back from the prefix cache is not in the worker's table either."),
                                (lambda: (0, 4), "the worker dropped B's row when B was preempted: what must it be "
                                 "sent to run B again?"),
                                (lambda: (4, 12), "A kept growing while B waited: which free blocks did it take, and "
                                 "what happened to their names?"),
                                (lambda: (4, 0), "B freed its table last block first, so its first block went to the "
                                 "free queue last: did A reach it?")),
                      hint="what did the worker keep of B's row when B was preempted? For the cache: B frees its "
                           "table last block first, a block without a name goes to the head of the free queue and a "
                           "named one to its tail; which blocks does A take while B waits, and which of B's blocks "
                           "still have their names in step 14?"),
    "cuda-graph-padded-rows": Exercise("(A's slot mapping, A's zeroed rows, B's slot mapping, B's zeroed rows)",
                      notebook="tiny_vllm", expected=_graph_padding,
                      mistakes=((lambda: _graph_padding(pad_tokens=False, pad_decode_rows=False),
                                 "a graph replays the sizes it was recorded for: each step is padded up to one."),
                                (lambda: _graph_padding(pad_mixed_rows=True), "step B is a mixed batch: which graphs "
                                 "does it replay, and does the attention that reads its block table run inside them?"),
                                (lambda: _graph_padding(pad_decode_rows=False), "step A replays the decode graph, "
                                 "attention and all: for how many requests was that graph recorded?")),
                      hint="which graph does each step replay, and for how many tokens was it recorded? Then ask of "
                           "each: does the attention that reads the block table run inside that graph, and for how "
                           "many requests was it recorded?"),
    "retention-interval-names": Exercise("(A's named sliding entries, B's hit tokens)",
                      notebook="hybrid_kv_cache", expected=_retention_interval_names,
                      hint="which token counts are resume points now, besides the prompt's replay boundary, and how "
                           "many blocks just before each does a sliding hit need? Which of those blocks filled before "
                           "A finished? For B: how far does its full group hit, and where, searching leftwards from "
                           "there, is the first run of named sliding blocks long enough?",
                      mistakes=((lambda: _retention_interval_names(0),
                                 "those are the names 0.33's default keeps (interval 0); a positive interval adds "
                                 "resume points of its own: which token counts are they with 16?"),
                                (lambda: _retention_interval_names(None),
                                 "that names every full block (the dense mode, None); with 16, which blocks does a "
                                 "resume point keep named, and which stay unnamed?"),
                                (lambda: ((2, 3), _retention_interval_names()[1]),
                                 "the prompt's replay boundary is still a resume point when an interval is set: which "
                                 "blocks does it keep?"),
                                (lambda: (_retention_interval_names()[0], 20),
                                 "that is the full group's hit alone: does the sliding group hold the named run it "
                                 "needs just before 20 tokens?"),
                                (lambda: (_retention_interval_names()[0], 12),
                                 "search the sliding group leftwards from the full group's hit: is the run before 12 "
                                 "the first long enough one you meet?"))),
    "agreed-hit-with-a-gap": Exercise("(hit tokens, null entries in the sliding group's hit)",
                      notebook="hybrid_kv_cache", expected=_agreed_hit_with_a_gap,
                      hint="search the sliding group from the right for ceil((8 - 1) / 4) cached blocks in a row; "
                           "the hit ends after that run, and the full group serves any shorter prefix.",
                      mistakes=((lambda: (24, 4), "that is the full group's hit alone; the sliding group needs the 2 "
                                 "blocks just before the hit point cached, and block 5 is not."),)),
    "spec-rollback-blocks": Exercise(
        "(blocks held, num_computed_tokens, blocks in the prefix cache)", notebook="speculative_decoding",
        expected=_rollback_at_a_block_boundary,
        hint="the step schedules the last token and every draft, and allocate_slots gives them all slots; "
             "update_from_output rolls back only num_computed_tokens. A block is hashed when allocate_slots "
             "schedules the step (up to num_tokens, never a draft) and, with speculation on, in update_from_output "
             "(up to the rolled-back num_computed_tokens): a block needs all its slots holding K/V that will stay.",
        mistakes=((lambda: (2, 29, 1), "which call would have given the drafts' block back, and was it made? (In a "
                   "full-attention group vLLM 0.33 frees blocks only when a request finishes or is preempted.)"),
                  (lambda: (3, 34, 1), "schedule() counted every draft as computed; how many did the target reject, "
                   "and what does update_from_output do with that number?"),
                  (lambda: (3, 30, 1), "does the token the target adds (the replacement for the first rejected "
                   "draft) have K/V yet? In which step is a sampled token's K/V computed?"),
                  (lambda: _rollback_at_a_block_boundary(cached_past_drafts=True),
                   "up to which token count does allocate_slots cache blocks when the step is scheduled, and does "
                   "that count include a draft? And after the rollback, how many tokens have K/V that stays?"))),
    "spec-cached-after-verify": Exercise(
        "(blocks in the prefix cache with 2 drafts accepted, with 3 accepted)", notebook="speculative_decoding",
        expected=_cached_after_verify,
        hint="after the rollback, which positions hold K/V that will stay? update_from_output names every block full "
             "of them (cache_blocks with num_computed_tokens); a block needs all 16 of its slots verified.",
        mistakes=((lambda: _cached_after_verify(named_up_to="num_tokens"),
                   "with 2 drafts accepted the request has 48 tokens, so block 2 is full of tokens; but does every one "
                   "of them have K/V that stays? How many rows did the rollback take back, and is the token this "
                   "step sampled among the computed ones?"),
                  (lambda: _cached_after_verify(named_up_to="allocate_slots"),
                   "allocate_slots stopped at num_tokens (45) when the step was scheduled; is that the only call "
                   "that names a speculating request's blocks? And with 3 accepted, which position is the last one "
                   "holding K/V that stays (count the step's first row, the token that was pending)?"))),
    "async-tokens-computed": Exercise("(tokens computed for A, A's peak blocks, tokens computed for B, B's peak "
                                      "blocks)", notebook="async_scheduling",
                      expected=_async_tokens_computed,
                      hint="count the steps scheduled for each request, prefill included, and the tokens each of "
                           "them runs on; a step already scheduled runs even if its request has finished, and every "
                           "token a step runs on needs a KV slot.",
                      mistakes=((lambda: (32, 2, 32, 2), "you gave A and B the same counts. Does the scheduler learn "
                                 "that A stops the way it learns that B stops, and at the same moment?"),
                                (lambda: (33, 3, 33, 3), "you gave A and B the same counts. Does the scheduler learn "
                                 "that A stops the way it learns that B stops, and at the same moment?"),
                                (lambda: (33, 2, 32, 2), "the token A's extra step runs on needs a KV slot; is there "
                                 "one left for it in the blocks A holds?"),
                                (lambda: (33, 3, 32, 3), "does any step run on B's last sampled token, and so give it "
                                 "a slot?"))),
    "stale-token-delivered": Exercise("(the preempted request, the step it is scheduled again in, its tokens then)",
                      notebook="async_scheduling", expected=_stale_token_delivered,
                      hint="in step 2's schedule, who asks for a block first, and whom does the v1 scheduler preempt "
                           "when none is free? Then follow the pool step by step: when does the other request give "
                           "its blocks back, and which steps were scheduled before that?",
                      mistakes=((lambda: ("B", 6, 5), "which call frees the blocks of the request that finishes, "
                                 "and does the engine loop make it before or after it schedules the next step?"),
                                (lambda: ("B", 7, 4), "count the victim's tokens when it comes back: its prompt and "
                                 "every output token it has, the stale one included, are recomputed."),
                                (lambda: ("B", 7, 3), "count the victim's tokens when it comes back: its prompt and "
                                 "every output token it has, the stale one included, are recomputed."),
                                (lambda: ("B", 3, 5), "when step 3 is scheduled, how many blocks are free, and how "
                                 "many does the victim need to come back?"))),
    "offload-two-tier-hit": Exercise(
        "(prompt tokens from the GPU prefix cache, tokens loaded from the CPU tier, prompt tokens computed)",
        notebook="kv_offloading", expected=_two_tier_hit,
        hint="the GPU lookup comes first and stops at its first missing block (and at num_tokens - 1); the connector "
             "is asked only for what comes after that, again as a run with no gap, but up to num_tokens; a request "
             "whose every prompt token is computed still needs logits for its last one.",
        mistakes=((lambda: (8, 8, 4), "the CPU tier's hit is not capped at num_tokens - 1: the connector may offer "
                   "the whole prompt; the scheduler then recomputes just the last token."),
                  (lambda: (8, 12, 0), "with every prompt token loaded, the model still runs on the last one to get "
                   "the logits of the first output token."),
                  (lambda: (8, 0, 12), "the CPU lookup does not start at token 0: it starts after the GPU hit, so the "
                   "block missing from the CPU tier is one the GPU already serves."))),
    "offload-blocks-stored-by-a-turn": Exercise(
        "the indices of the request's blocks it stores in the CPU tier", notebook="kv_offloading",
        expected=_blocks_stored_by_a_turn,
        hint="only full blocks of the prompt are stored (offload_prompt_only); a request whose hit was loaded from "
             "the CPU tier starts storing after the loaded blocks (they are there already).",
        mistakes=((lambda: [5, 6, 7, 8, 9], "blocks that hold generated tokens are not stored: offload_prompt_only "
                   "is on by default."),
                  (lambda: [5, 6, 7], "block 7 holds the prompt's last 2 tokens and generated ones: only full prompt "
                   "blocks are stored."),
                  (lambda: [0, 1, 5, 6], "blocks 0 and 1 came from the GPU prefix cache, and the connector's store "
                   "pointer starts after the chunks it loaded: it never offers them."))),
}


def label(key: str) -> str:
    """``"E1"``, ``"E2"``...: the exercise's place among its notebook's exercises, in the order of ``EXERCISES``."""
    notebook = EXERCISES[key].notebook
    return f"E{[k for k, e in EXERCISES.items() if e.notebook == notebook].index(key) + 1}"


def of_notebook(notebook: str) -> list[str]:
    """The ids of a notebook's exercises, in order; ``notebook`` is a file name with or without number/suffix."""
    name = notebook.removesuffix(".ipynb")
    name = name.split("_", 1)[1] if name[:2].isdigit() else name
    return [k for k, e in EXERCISES.items() if e.notebook == name]
