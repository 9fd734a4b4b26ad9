"""The course's key runs, recorded as traces: what ``python -m pagedkv trace <run>`` plays and ``make site`` embeds.

One line of ``RUNS`` per run: its name, the notebook it belongs to (the file name without its number, so
renumbering the course moves nothing), a title, and a function that records it. Each is small and deterministic
(a stand-in model, or the shipped tiny Llama on the torch backend), a second or two on a laptop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import PagedKVValueError
from ..manager import BlockSpaceManager
from ..paged_cache import PagedKVCache
from ..scheduler import Scheduler
from ..v1 import KVCacheManager
from ..v1 import Scheduler as V1Scheduler
from .trace import Trace, TraceRecorder, record_engine, record_scheduler


@dataclass(frozen=True)
class Run:
    name: str  # python -m pagedkv trace <name>
    notebook: str  # the notebook's file name without NN_ and .ipynb
    title: str
    record: Callable[[], Trace]


def _kv(cache: PagedKVCache, n: int) -> torch.Tensor:
    return torch.zeros(n, cache.engine.num_kv_heads, cache.engine.head_size)


def _moves(events) -> dict:
    """The block moves a cache logged: copy-on-write copies, and the swaps' (src, dst) pairs."""
    kinds = {"swap_out": "swapped_out", "swap_in": "swapped_in"}
    moves = {"copied": [], "swapped_out": [], "swapped_in": []}
    for event in events:
        moves[kinds.get(event.kind, "copied")] += list(event.copies)
    return moves


def _cache_step(recorder: TraceRecorder, cache: PagedKVCache, label: str, action, summary: str = "") -> None:
    """Run one hand-made call on ``cache`` and record it with the event the cache logged."""
    before = len(cache.events)
    action()
    moves = _moves(cache.events[before:])
    swapped = [e for e in cache.events[before:] if e.kind in ("swap_out", "swap_in")]
    touched = [b for e in cache.events[before:] if e.kind not in ("free", "swap_out") for b in e.blocks]
    if swapped and swapped[0].kind == "swap_out":
        touched = [("cpu", b) for b in swapped[0].blocks]
    recorder.record(label, summary=summary or label, highlight=touched or None, **moves)


def free_list() -> Trace:
    """Blocks handed out from the head of the free queue, given back tail first, taken again."""
    cache = PagedKVCache(num_gpu_blocks=8, block_size=4, num_kv_heads=1, head_size=1, watermark=0.0)
    rec = TraceRecorder(cache, "The free queue", "hand-driven cache",
                        "A 6-token request takes blocks 0 and 1 from the head of the free queue; B takes the next "
                        "ones; freeing A gives its blocks back, last block first, and C takes them again.")
    steps = [("add A (6 tokens)", lambda: cache.add_sequence("A", _kv(cache, 6), _kv(cache, 6))),
             ("add B (9 tokens)", lambda: cache.add_sequence("B", _kv(cache, 9), _kv(cache, 9))),
             ("append 2 to A", lambda: cache.append("A", _kv(cache, 2), _kv(cache, 2))),
             ("append 1 to A", lambda: cache.append("A", _kv(cache, 1), _kv(cache, 1))),
             ("free A", lambda: cache.free("A")),
             ("add C (5 tokens)", lambda: cache.add_sequence("C", _kv(cache, 5), _kv(cache, 5))),
             ("free B", lambda: cache.free("B"))]
    for label, action in steps:
        _cache_step(rec, cache, label, action)
    return rec.trace()


def fork_and_copy_on_write() -> Trace:
    """A fork shares every block; the first append into the shared partial block copies it."""
    cache = PagedKVCache(num_gpu_blocks=8, block_size=4, num_kv_heads=1, head_size=1, watermark=0.0)
    rec = TraceRecorder(cache, "A fork and its copy-on-write", "hand-driven cache",
                        "B forks from A and shares both its blocks (ref count 2); B's first token goes into the "
                        "shared, partly filled block 1, so that block is copied first; A's append then writes in "
                        "place, its block no longer shared.")
    one = lambda: _kv(cache, 1)  # noqa: E731
    steps = [("add A (6 tokens)", lambda: cache.add_sequence("A", _kv(cache, 6), _kv(cache, 6))),
             ("fork A -> B", lambda: cache.fork("A", "B")),
             ("append 1 to B (copy-on-write)", lambda: cache.append("B", one(), one())),
             ("append 1 to A", lambda: cache.append("A", one(), one())),
             ("append 1 to B", lambda: cache.append("B", one(), one())),
             ("append 1 to B (a new block)", lambda: cache.append("B", one(), one())),
             ("free A", lambda: cache.free("A"))]
    for label, action in steps:
        _cache_step(rec, cache, label, action)
    return rec.trace()


def beam_search() -> Trace:
    """Beam search on the tiny Llama (v0's engine): beams fork and share, dropped beams' blocks come back."""
    from ..decoding import synthetic_prompt, tiny_engine
    from ..sampling import BeamSearchParams

    engine = tiny_engine(num_gpu_blocks=24, block_size=4, backend="torch")
    engine.add_request("beam", synthetic_prompt(10), BeamSearchParams(beam_width=3, max_tokens=10, ignore_eos=True))
    return record_engine(engine, "Beam search on shared blocks",
                         "Three beams of a 10-token prompt on the tiny Llama (v0's engine): the prompt is prefilled "
                         "once and forked, appends into shared blocks are copied, and a dropped beam's blocks go "
                         "back to the free queue.")


def prefix_hits() -> Trace:
    """vLLM v1's prefix cache: a shared system prompt hit by later requests; cached free blocks; eviction."""
    manager = KVCacheManager(block_size=4, num_gpu_blocks=12)
    scheduler = V1Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=16)
    system = list(range(100, 110))  # 10 tokens: two full blocks and a partial one
    arrivals = {0: [("r0", system + [1, 2], 4)], 4: [("r1", system + [3, 4, 5], 4)],
                7: [("r2", system + [6], 3), ("r3", list(range(500, 514)), 3)], 12: [("r4", system + [7, 8], 3)]}
    return record_scheduler(scheduler, manager, "Prefix hits",
                            "vLLM v1's prefix cache (stand-in model): r1, r2 and r4 share r0's 10-token system "
                            "prompt, so their first two blocks are hits; a finished request's blocks stay cached in "
                            "the free queue (marked *) until they are handed out again.", arrivals=arrivals)


def preemption() -> Trace:
    """The paper's scheduler (v0) on a small pool: requests grow until one is preempted by recompute."""
    manager = BlockSpaceManager(block_size=4, num_gpu_blocks=10, num_cpu_blocks=0, watermark=0.0)
    scheduler = Scheduler(manager, max_num_seqs=8, max_num_batched_tokens=64, preemption_mode="recompute")
    arrivals = {0: [("r0", list(range(7)), 12), ("r1", list(range(9)), 10), ("r2", list(range(5)), 12)],
                3: [("r3", list(range(6)), 6)]}
    return record_scheduler(scheduler, manager, "Preemption by recompute",
                            "v0's scheduler on 10 blocks of 4: as the running requests grow, no block is left for "
                            "a decode, and the latest arrival is preempted: its blocks freed, its tokens computed "
                            "again when it is admitted back.", arrivals=arrivals)


def hybrid_request() -> Trace:
    """A hybrid model (a sliding window of 8 and full attention): two tables per request; the null block."""
    from .scheduler_widget import hybrid_groups

    manager = KVCacheManager(4, 16, kv_cache_groups=hybrid_groups(4, 8), max_num_batched_tokens=8)
    scheduler = V1Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=8)
    arrivals = {0: [("r0", list(range(14)), 10)], 2: [("r1", list(range(200, 205)), 8)]}
    return record_scheduler(scheduler, manager, "A hybrid request",
                            "vLLM v1 on a hybrid model: every request holds a full-attention table and a sliding-"
                            "window table over one pool; blocks that leave the 8-token window go back to the free "
                            "queue and the null block stands in for them.", arrivals=arrivals)


def visualizer_run() -> Trace:
    """The block-table visualizer (``BlockTableVisualizer``, prefix caching on) clicked through: add, a second
    prompt sharing the first's blocks, fork, append (a copy-on-write), swap out, free, swap in; what the widget shows
    click by click, with no kernel."""
    from .visualizer import BlockTableVisualizer

    viz = BlockTableVisualizer(num_gpu_blocks=16, num_cpu_blocks=8, enable_prefix_caching=True)
    rec = TraceRecorder(viz, "The block-table visualizer, clicked through", "hand-driven cache",
                        "BlockTableVisualizer(enable_prefix_caching=True) on 16 GPU and 8 CPU blocks of 4: A's prompt; "
                        "B with the same first 8 tokens (two blocks shared from the prefix cache); a fork of A and the "
                        "fork's first append (a copy-on-write); B swapped out to the CPU; A freed; B swapped back in; "
                        "D with the start of B's prompt.")
    clicks = [lambda: viz.add_sequence(10), lambda: viz.add_sequence(9, reuse_prompt=True), lambda: viz.fork("A"),
              lambda: viz.append("C"), lambda: viz.append("A", 2), lambda: viz.swap_out("B"), lambda: viz.free("A"),
              lambda: viz.swap_in("B"), lambda: viz.add_sequence(6, reuse_prompt=True)]
    for click in clicks:
        before = len(viz.cache.events)
        click()
        rec.record(viz.log[-1], summary=viz.message or viz.log[-1], highlight=viz.last_touched,
                   **_moves(viz.cache.events[before:]))
    return rec.trace()


def v1_engine_with_requests(num_requests: int = 20):
    """The tiny Llama on pagedkv's v1 engine (40 blocks of 8, a 64-token budget), ``num_requests`` queued whose
    prompts share prefixes (four starting points in the same text)."""
    from ..decoding import synthetic_prompt, tiny_engine

    engine = tiny_engine(num_gpu_blocks=40, block_size=8, version="v1", backend="torch", max_num_batched_tokens=64,
                         max_num_seqs=8)
    for i in range(num_requests):
        engine.add_request(f"r{i}", synthetic_prompt(20 + 7 * (i % 5), seed=i % 4), 24 + 16 * (i % 4),
                           ignore_eos=True)
    return engine


def engine_v1(num_requests: int = 20, max_steps: int = 200) -> Trace:
    """The tiny Llama served by the v1 engine for ``max_steps`` steps: chunked prefill, preemption, prefix hits."""
    engine = v1_engine_with_requests(num_requests)
    return record_engine(engine, "The v1 engine, 200 steps",
                         f"{num_requests} requests on the tiny Llama through pagedkv's v1 engine (40 blocks of 8, "
                         "a 64-token budget): chunked prefill, prefix hits, preemption by recompute.",
                         max_steps=max_steps)


RUNS = [
    Run("free-list", "free_list_allocation", "The free queue", free_list),
    Run("fork", "copy_on_write_forks", "A fork and its copy-on-write", fork_and_copy_on_write),
    Run("beam-search", "beam_search_sharing", "Beam search on shared blocks", beam_search),
    Run("prefix-hits", "prefix_caching", "Prefix hits", prefix_hits),
    Run("preemption", "scheduler", "Preemption by recompute", preemption),
    Run("visualizer", "block_table_visualizer", "The block-table visualizer, clicked through", visualizer_run),
    Run("hybrid", "hybrid_kv_cache", "A hybrid request", hybrid_request),
    Run("engine-v1", "tiny_vllm", "The v1 engine, 200 steps", engine_v1),
]


def get_run(name: str) -> Run:
    for run in RUNS:
        if run.name == name:
            return run
    raise PagedKVValueError(f"no run named {name!r}; the runs: {', '.join(r.name for r in RUNS)}.")
