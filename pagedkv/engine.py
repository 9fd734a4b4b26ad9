"""Layer 12 — ``LLMEngine``: a scheduler, a model and a paged KV cache for every layer, one step at a time.

vLLM splits this between ``vllm/engine/llm_engine.py`` (``step``),
``vllm/worker/model_runner.py`` (the flat batch and its attention metadata) and
``vllm/worker/cache_engine.py`` (the per-layer K/V tensors); nano-vllm between
``engine/llm_engine.py`` and ``engine/model_runner.py``.  One step:

    schedule  ->  move blocks (swap out, swap in, copy-on-write)  ->  run the model  ->  sample  ->  update

With ``async_scheduling=True`` (v1; vLLM 0.33's default, pagedkv's is off) two steps are in flight: the model runs
on a worker thread while this thread schedules the next step and processes the previous one's output (vLLM 0.33:
``EngineCore.step_with_batch_queue`` in ``vllm/v1/engine/core.py``).

The model sees one flat batch of new tokens (each prefill's uncached tokens,
one token per decode) with their positions, and a :class:`PagedKVStore` that
its attention layers call: it writes the new K/V through the slot mapping,
then makes one ``unified_paged_attention`` call for every row of the batch,
each reading its sequence's earlier tokens from the pages (vLLM 0.33's
``unified_attention``).  Every layer has its own K/V tensors; all layers of one
KV cache group share that group's block table per request, and the step's
attention metadata, as in vLLM (one group for a uniform model; a hybrid
model's sliding-window layers read their group's table, and the kernel's
``sliding_window`` keeps each query to its window).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import queue
import threading
import time
import warnings
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from .cache import CacheEngine, reshape_and_cache
from .errors import DuplicateSequenceError, PagedKVValueError, UnknownSequenceError
from .kernels import UnifiedAttentionMetadata
from .kernels.validate import BACKENDS
from .manager import BlockSpaceManager
from .model import LlamaForCausalLM
from .output_processor import Beams, Samples
from .sampling import BeamSearchParams, RequestOutput, SamplingParams
from .scheduler import PreemptionMode, Scheduler, SchedulerOutputs
from .v1 import AsyncScheduler, KVCacheManager, beam_search
from .v1 import Scheduler as V1Scheduler
from .v1 import SchedulerOutput as V1SchedulerOutput
from .v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, get_kv_cache_groups
from .v1.kv_connector import KVConnectorOutput, KVConnectorRole, OffloadingConnector
from .v1.kv_offload.cpu import cpu_chunk_bytes, cpu_num_chunks
from .v1.spec_decode import NgramProposer, SpeculativeConfig
from .validate import check_choice, check_hashable, check_int, is_list_like

PLACEHOLDER = -1  # a token id not known when its step was scheduled (vLLM: -1 in spec_token_ids too)
# async scheduling: the longest wait for a step's output, and for the forward thread to end (vLLM 0.33:
# VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS = 300, the multiprocess executor's wait for a step)
EXECUTE_MODEL_TIMEOUT_S = 300


@dataclass
class EngineStats:
    num_preemptions: int = 0  # recompute and swap alike
    num_prefix_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    peak_gpu_blocks: int = 0  # the most GPU blocks in use after any step's scheduling
    steps: int = 0
    num_computed_tokens: int = 0  # tokens the model ran on (prefill and decode)
    num_cow_copies: int = 0  # copy-on-write block copies (a sequence group's first appends into shared blocks)
    num_ignored: int = 0  # requests that could never fit the pool: finished with the tokens they had
    num_requests: int = 0  # requests added (v1: each child of a fanned-out n > 1 request counts)
    # speculative decoding (v1), as vLLM's SpecDecodingStats: drafts verified, their tokens, the accepted ones
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list = dataclasses.field(default_factory=list)  # drafts accepted up to i
    # v1 with a CPU tier (kv_offloading_size / kv_offloading_blocks), in tokens
    num_offload_stored_tokens: int = 0  # copied from GPU blocks to the CPU tier
    num_offload_evicted_tokens: int = 0  # dropped by the CPU tier to make room
    num_offload_loaded_tokens: int = 0  # copied back from the CPU tier into fresh GPU blocks
    num_offload_saved_tokens: int = 0  # prompt tokens not computed, because they came back from the CPU tier

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over drafted ones (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_rate_per_pos(self) -> list:
        """Per draft position ``i``: the share of drafts whose tokens ``0..i`` were all accepted (vLLM's
        "per-position acceptance rate")."""
        return [a / self.num_drafts if self.num_drafts else 0.0 for a in self.num_accepted_tokens_per_pos]


@dataclass(frozen=True)
class StepEvent:
    """A span of work in the async engine loop (``LLMEngine.trace``), what the timeline figure draws."""

    thread: str  # "main", or "forward": the model's lane (the forward thread; the main thread when synchronous)
    kind: str  # main: "schedule", "wait" (for a step's output), "update"; forward: "forward" (and the draws)
    step: int  # the step it belongs to (engine.stats.steps counts from 1; this from 0)
    start: float  # time.perf_counter() seconds
    end: float


class _ForwardThread:
    """The model's side of async scheduling: one thread running the submitted steps in order, as a GPU stream
    runs vLLM's kernels in launch order (torch releases the GIL inside its kernels, so it runs beside the main
    thread). A daemon, so a forward that never returns cannot keep Python from exiting."""

    def __init__(self):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="pagedkv-forward", daemon=True)
        self.thread.start()

    def submit(self, fn, *args) -> Future:
        future = Future()
        self._calls.put((future, fn, args))
        return future

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # handed to whoever waits for the step
                future.set_exception(error)

    def join(self) -> None:
        """Finish the steps submitted, then end the thread (at most ``EXECUTE_MODEL_TIMEOUT_S``)."""
        self._calls.put(None)
        self.thread.join(EXECUTE_MODEL_TIMEOUT_S)


@dataclass
class _Chunk:
    """One request's (or sequence's) tokens in this step's batch, whichever scheduler chose them."""

    key: object  # the sequence id (v0) or request id (v1)
    block_tables: tuple  # one block table per KV cache group (v0 and uniform models: one)
    token_ids: list  # the tokens the model runs on
    start: int  # the position of the first of them
    write_from: int  # positions before this are already in the cache (a prefix hit): not written again


@dataclass
class _GroupMetadata:
    """One KV cache group's view of the step: where its new K/V go and its block tables (vLLM builds attention
    metadata per KV cache group too)."""

    slot_mapping: torch.Tensor  # where each new token's K/V goes (-1: already in the prefix cache)
    metadata: UnifiedAttentionMetadata  # cu_seqlens_q and seq_lens are every group's; the block tables its own

    def __post_init__(self):
        """What every layer of the group reuses: the rows to write and their slots."""
        keep = self.slot_mapping >= 0
        self.rows = None if bool(keep.all()) else keep
        self.slots = self.slot_mapping[keep]


@dataclass
class PagedKVStore:
    """What ``LlamaAttention`` calls in a paged step: ``attend(layer, q, k, v)`` for the whole flat batch.

    Each layer writes the step's K/V into its pages (``reshape_and_cache``), then makes one
    ``unified_paged_attention`` call over every row: prefill chunks, prefix hits and decodes alike read their
    earlier tokens from the pages (vLLM 0.33: ``unified_attention`` in
    ``vllm/v1/attention/ops/triton_unified_attention.py``).  ``metadata`` (``cu_seqlens_q``, ``seq_lens``, block
    tables) is built once per step and shared by every layer, as vLLM's ``CommonAttentionMetadata`` is.
    """

    caches: list  # one CacheEngine per layer
    groups: list  # one _GroupMetadata per KV cache group
    layer_group: list  # the group of each layer
    backend: str

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               sliding_window: int | None = None) -> torch.Tensor:
        cache, group = self.caches[layer], self.groups[self.layer_group[layer]]
        new_kv = (k, v) if group.rows is None else (k[group.rows], v[group.rows])
        reshape_and_cache(cache.key_cache, cache.value_cache, group.slots, *new_kv)
        return group.metadata.attend(q, cache.key_cache, cache.value_cache, sliding_window=sliding_window,
                                     backend=self.backend)


class LLMEngine:
    """Serve many requests at once through one paged KV cache; greedy decoding or seeded sampling."""

    def __init__(self, model: LlamaForCausalLM, *, num_gpu_blocks: int, block_size: int = 16,
                 num_cpu_blocks: int = 0, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 preemption_mode=None, enable_prefix_caching: bool | None = None, watermark: float | None = None,
                 backend: str = "auto", block_manager: BlockSpaceManager | None = None, version: str = "v0",
                 long_prefill_token_threshold: int = 0, scheduler_reserve_full_isl: bool = True,
                 prefix_cache_retention_interval: int | None = 0, speculative_config: dict | None = None,
                 async_scheduling: bool = False, kv_offloading_size: float | None = None,
                 kv_offloading_blocks: int | None = None, simulated_host_ms: float = 0.0,
                 simulated_forward_ms: float = 0.0):
        """``version="v0"``: the paper's engine (``BlockSpaceManager`` and ``Scheduler``: swap, watermark,
        sequence groups; prefix caching off by default). ``version="v1"``: vLLM today (``pagedkv.v1``: one token
        budget, chunked prefill, recompute only, prefix caching on by default, ``n > 1`` fanned out; with
        ``scheduler_reserve_full_isl``, on as in vLLM, a request is admitted only when its full input
        sequence fits: its prompt, plus the outputs a resumed request already has).
        ``prefix_cache_retention_interval`` (v1, vLLM's default 0): which blocks a sliding-window group names in the
        prefix cache (``pagedkv.v1.KVCacheManager``; None names every full block).
        ``async_scheduling`` (v1): schedule step N+1 while step N runs, the model on a worker thread (vLLM 0.33's
        ``AsyncScheduler`` and batch queue; vLLM's default is on, pagedkv's off: the course teaches the
        synchronous loop first). Outputs are the same; ``close()`` (or ``with``) joins the thread, and so does
        ``generate`` when nothing is left to run.
        ``block_manager`` (v0): run on an existing manager of the same sizes (the visualizer draws the engine's
        sequences beside hand-made ones); by default the engine makes its own.
        ``speculative_config`` (v1): ``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a,
        "prompt_lookup_max": b}`` (vLLM's keys): each step verifies up to ``k`` prompt-lookup drafts per request in
        the same forward; the tokens are those decoding without it produces.
        ``kv_offloading_size`` (GiB, vLLM 0.33's ``--kv-offloading-size``) or ``kv_offloading_blocks`` (v1): a CPU
        tier of KV blocks behind the GPU pool, reached through vLLM's native ``OffloadingConnector``
        (``pagedkv.v1.kv_connector``).
        ``simulated_host_ms`` (v1, a teaching knob, not vLLM's): the main thread sleeps this many milliseconds in
        every ``schedule`` and every ``update_from_output`` span, as if preparing a batch's inputs and processing its
        outputs took that long. Next to a GPU's forward of a few milliseconds, that host work is a real share of a
        step; next to the tiny model's forward on a CPU, pagedkv's own is a few percent at most. The sleep holds no
        lock, as a GPU runs its kernels without the CPU, so the async loop can hide it; the outputs never change.
        ``simulated_forward_ms`` (v1, a teaching knob, not vLLM's): the model's lane stands in for a GPU whose forward
        takes this long: the real forward runs and samples, then the lane sleeps until the span has lasted
        ``simulated_forward_ms`` (no sleep if the real forward took longer). With both knobs set well above the
        tiny model's forward, both lanes mostly sleep, release Python's lock, and the timeline shows the loop's
        protocol rather than the machine's load; the tokens are the real model's."""
        if not isinstance(model, LlamaForCausalLM):
            raise PagedKVValueError(f"model must be a pagedkv.model.LlamaForCausalLM, got {type(model).__name__}; "
                                    "load one with LlamaForCausalLM.from_pretrained(dir) or load_tiny().")
        check_choice("backend", backend, BACKENDS)
        self.version = check_choice("version", version, ("v0", "v1"))
        if speculative_config is not None and version != "v1":
            raise PagedKVValueError("speculative_config: speculative decoding runs on vLLM today's scheduler: "
                                    "pass version='v1'.")
        spec = None if speculative_config is None else SpeculativeConfig.from_dict(speculative_config)
        _check_async_scheduling(async_scheduling, version, speculative_config)
        self.simulated_host_ms = _check_simulated_ms("simulated_host_ms", simulated_host_ms, version)
        self.simulated_forward_ms = _check_simulated_ms("simulated_forward_ms", simulated_forward_ms, version)
        if version == "v0" and (kv_offloading_size is not None or kv_offloading_blocks is not None):
            raise PagedKVValueError("kv_offloading_size / kv_offloading_blocks add a CPU tier through vLLM today's KV "
                                    "connector: pass version='v1' (v0 moves blocks to CPU by swapping: "
                                    "num_cpu_blocks with preemption_mode='swap').")
        offloading = kv_offloading_size is not None or kv_offloading_blocks is not None
        if offloading and (async_scheduling is True or speculative_config is not None):
            raise PagedKVValueError("kv_offloading_size / kv_offloading_blocks with async_scheduling or "
                                    "speculative_config: pagedkv runs the CPU tier with the synchronous loop and "
                                    "no drafts only (vLLM 0.33 combines them); turn one of them off.")
        config = model.config
        self.model = model.eval()
        self.backend = backend
        check_int("block_size", block_size, minimum=1)
        check_int("num_gpu_blocks", num_gpu_blocks, minimum=1)
        check_int("num_cpu_blocks", num_cpu_blocks, minimum=0)
        if version == "v1":
            _check_v1_settings(num_cpu_blocks, preemption_mode, watermark, block_manager)
            self.block_manager = None
            self.kv_cache_groups = kv_cache_groups_for(config, block_size, next(model.parameters()).dtype)
            num_offload_blocks = _num_offload_blocks(kv_offloading_size, kv_offloading_blocks, self.kv_cache_groups)
            caching = True if enable_prefix_caching is None else enable_prefix_caching
            # vLLM: VllmConfig.max_in_flight_tokens, every step in flight may hold a whole budget
            budget = check_int("max_num_batched_tokens", max_num_batched_tokens, minimum=1)
            max_in_flight_tokens = (2 if async_scheduling else 1) * budget
            self.kv_cache_manager = KVCacheManager(block_size, num_gpu_blocks, caching,
                                                   self.kv_cache_groups, max_num_batched_tokens,
                                                   prefix_cache_retention_interval, max_in_flight_tokens)
            connector = OffloadingConnector(KVConnectorRole.SCHEDULER, block_size, num_offload_blocks,
                                            enable_prefix_caching=caching) if num_offload_blocks else None
            scheduler_cls = AsyncScheduler if async_scheduling else V1Scheduler  # vLLM: get_scheduler_cls
            self.scheduler = scheduler_cls(self.kv_cache_manager, max_num_seqs, max_num_batched_tokens,
                                           long_prefill_token_threshold, scheduler_reserve_full_isl,
                                           num_spec_tokens=spec.num_speculative_tokens if spec else 0,
                                           num_lookahead_tokens=spec.num_lookahead_tokens if spec else 0,
                                           connector=connector)
        else:
            if long_prefill_token_threshold:
                raise PagedKVValueError("long_prefill_token_threshold chunks prompts, which only the v1 scheduler "
                                        "does: pass version='v1'.")
            if scheduler_reserve_full_isl is not True:
                raise PagedKVValueError(f"scheduler_reserve_full_isl={scheduler_reserve_full_isl!r}: the v0 "
                                        "scheduler always admits a whole prompt; the setting is the v1 scheduler's "
                                        "(pass version='v1', with True or False).")
            if prefix_cache_retention_interval is None or prefix_cache_retention_interval != 0:
                raise PagedKVValueError(f"prefix_cache_retention_interval={prefix_cache_retention_interval!r}: the "
                                        "v0 engine keeps every block of every layer, so it names every full block; "
                                        "the setting is the v1 manager's (pass version='v1').")
            if block_manager is None:
                block_manager = BlockSpaceManager(block_size, num_gpu_blocks, num_cpu_blocks,
                                                  0.01 if watermark is None else watermark,
                                                  bool(enable_prefix_caching))
            self.block_manager = _check_same_sizes(block_manager, block_size, num_gpu_blocks, num_cpu_blocks)
            self.kv_cache_manager = None
            # v0 keeps every block of every layer; sliding layers only mask (vLLM: unify_hybrid_kv_cache_specs)
            self.kv_cache_groups = kv_cache_groups_for(config, block_size, next(model.parameters()).dtype,
                                                       unify=True)
            self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens,
                                       preemption_mode or "recompute")
        dtype = next(model.parameters()).dtype
        self.layer_group = [0] * config.num_hidden_layers
        for group_id, group in enumerate(self.kv_cache_groups):
            for layer in group.layer_names:
                self.layer_group[layer] = group_id
        connector = self.scheduler.connector if version == "v1" else None
        num_offload_blocks = connector.num_cpu_blocks if connector is not None else 0
        self.caches = [CacheEngine(num_gpu_blocks, block_size, config.num_key_value_heads, config.head_dim,
                                   num_cpu_blocks or num_offload_blocks, dtype)
                       for _ in range(config.num_hidden_layers)]
        self.kv_connector = None  # the worker side of the KV connector: copies between the two pools of every layer
        if num_offload_blocks:
            self.kv_connector = OffloadingConnector(KVConnectorRole.WORKER, block_size, num_offload_blocks)
            self.kv_connector.register_kv_caches(self.caches)
        self.block_size = block_size
        self.speculative_config = spec
        self.drafter = None if spec is None else NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max,
                                                               spec.num_speculative_tokens,
                                                               config.max_position_embeddings)
        self.stats = EngineStats()
        self._num_generated = 0
        self._processors: dict = {}  # request_id -> Samples | Beams, until pop_finished() hands the output over
        self._parents: dict = {}  # v1: a request of n > 1 -> its n child request ids (vLLM's ParentRequest)
        # async scheduling: steps in flight, newest first (vLLM: EngineCore.batch_queue, max_concurrent_batches)
        self.async_scheduling = async_scheduling
        self.batch_queue_size = 2 if async_scheduling else 1
        self.batch_queue: deque = deque()  # (future of the step's sampled tokens, its SchedulerOutput)
        self._executor = None  # the forward thread, started by the first step in flight, joined when idle
        self._prev_sampled: dict = {}  # forward thread only: the tokens its last step sampled
        self._failed = None  # a forward that raised: the engine's requests are lost
        self.trace: list | None = None  # set to [] to record a StepEvent for each span of the v1 loop

    def snapshot(self):
        """The block manager's snapshot (v0) or the KV cache manager's (v1): every drawing reads it."""
        manager = self.block_manager if self.block_manager is not None else self.kv_cache_manager
        return manager.snapshot()

    # ------------------------------------------------------------ requests
    def add_request(self, request_id, prompt_token_ids, params=None, *, max_tokens: int | None = None,
                    ignore_eos: bool = False) -> None:
        """Queue a request. ``params``: an int (greedy, at most that many tokens; EOS ends it unless
        ``ignore_eos``; ``max_tokens=`` says the same), a :class:`SamplingParams` (``n`` seeded samples: the same
        tokens as ``generate_dense`` whatever the batch, pool or preemption) or a :class:`BeamSearchParams`
        (equal to ``beam_search_dense``). ``n > 1`` and beam search run as a sequence group sharing blocks."""
        params = self._sampling_params(params, max_tokens, ignore_eos)
        prompt = self.model.check_prompt("prompt_token_ids", prompt_token_ids)
        if self.version == "v1":
            return self._add_request_v1(request_id, prompt, params)
        if isinstance(params, BeamSearchParams):  # EOS ends a beam in the processor, not in the scheduler
            self.scheduler.add_request(request_id, prompt, params.max_tokens, num_seqs=params.beam_width)
            self._processors[request_id] = Beams(request_id, prompt, params, self.model.config.eos_token_id)
            self.stats.num_requests += 1
            return
        stop = self.model.stop_token_ids(params.ignore_eos) | frozenset(params.stop_token_ids)
        self.scheduler.add_request(request_id, prompt, params.max_tokens, stop, num_seqs=params.n)
        self._processors[request_id] = Samples(request_id, prompt, params, stop)
        self.stats.num_requests += 1

    def _add_request_v1(self, request_id, prompt: list, params) -> None:
        """v1: one sequence per request; ``n > 1`` fans out into child requests ``(request_id, i)`` that share the
        prompt's full blocks through the prefix cache (vLLM: ``vllm/v1/engine/parallel_sampling.py``)."""
        if isinstance(params, BeamSearchParams):
            raise PagedKVValueError("vLLM v1 runs beam search outside the engine: call "
                                    "pagedkv.beam_search(engine, prompts, params) (vLLM's LLM.beam_search).")
        check_hashable("request_id", request_id)
        if request_id in self._processors or request_id in self._parents:
            raise DuplicateSequenceError(f"request {request_id!r} was already added; use a new request_id.")
        stop = self.model.stop_token_ids(params.ignore_eos)
        children = [request_id] if params.n == 1 else [(request_id, i) for i in range(params.n)]
        taken = [c for c in children if c in self.scheduler.requests or c in self.scheduler.finished]
        if taken:
            raise DuplicateSequenceError(f"request id {taken[0]!r} is in use already; use a new request_id.")
        for i, child in enumerate(children):
            self.scheduler.add_request(child, prompt, dataclasses.replace(params, n=1), stop)
            self.stats.num_requests += 1
            self._processors[child] = Samples(child, prompt, params, stop | frozenset(params.stop_token_ids),
                                              index=None if params.n == 1 else i)
        if params.n > 1:
            self._parents[request_id] = (children, prompt)

    def _sampling_params(self, params, max_tokens, ignore_eos: bool):
        """``params`` checked (stop ids inside the vocabulary); an int becomes greedy ``SamplingParams``."""
        if (params is None) == (max_tokens is None):
            raise PagedKVValueError("pass params (an int max_tokens, SamplingParams or BeamSearchParams) or "
                                    f"max_tokens=, not both or neither (got params={params!r}, "
                                    f"max_tokens={max_tokens!r}).")
        params = max_tokens if params is None else params
        if isinstance(params, BeamSearchParams):
            return params
        if not isinstance(params, SamplingParams):
            params = SamplingParams(temperature=0, max_tokens=check_int("max_tokens", params, minimum=1),
                                    ignore_eos=ignore_eos)
        self.model.check_token_ids("stop_token_ids", params.stop_token_ids)
        return params

    def is_finished(self, request_id) -> bool:
        """Whether every sequence (v1: every child request) of ``request_id`` has finished."""
        ids = self._parents[request_id][0] if request_id in self._parents else [request_id]
        return all(r in self.scheduler.finished for r in ids)

    def pop_finished(self, request_id) -> RequestOutput:
        """A finished request's :class:`RequestOutput` (its tokens, log-probability and why it stopped), once."""
        if request_id in self._parents and self.is_finished(request_id):
            children, prompt = self._parents.pop(request_id)
            return RequestOutput(request_id, prompt, [self.pop_finished(child).outputs[0] for child in children])
        if request_id not in self.scheduler.finished:
            raise UnknownSequenceError(f"request {request_id!r} has not finished (or was popped already); step() "
                                       "until it leaves scheduler.requests.")
        return self._processors.pop(request_id).output(self.scheduler.finished.pop(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def abort_request(self, request_id) -> None:
        """v1: give up on an unfinished request (every child of an ``n > 1`` one). Its blocks go back at once, even
        with a step in flight for it, whose output is then dropped; nothing is returned for it (vLLM 0.33:
        ``LLMEngine.abort_request`` -> ``Scheduler.finish_requests``)."""
        if self.version != "v1":
            raise PagedKVValueError("abort_request is the v1 engine's (vLLM's finish_requests); pass version='v1'.")
        check_hashable("request_id", request_id)
        ids = self._parents[request_id][0] if request_id in self._parents else [request_id]
        if not any(r in self.scheduler.requests for r in ids):
            raise UnknownSequenceError(f"request {request_id!r} is not unfinished; unfinished ones: "
                                       f"{list(self.scheduler.requests)[:8]}.")
        self.scheduler.finish_requests(list(ids))
        for r in ids:
            self._processors.pop(r, None)
            self.scheduler.finished.pop(r, None)
        self._parents.pop(request_id, None)

    def generate(self, prompts: list[list[int]], params=None, *, max_tokens: int | None = None,
                 ignore_eos: bool = False):
        """Every prompt's continuation, in order, equal to ``generate_dense`` for each prompt alone.

        ``params`` an int: greedy, returns ``list[list[int]]``; ``SamplingParams`` or ``BeamSearchParams``:
        ``list[RequestOutput]`` (equal to ``generate_dense`` / ``beam_search_dense``).
        """
        if not (is_list_like(prompts) or is_list_like(prompts, ndim=2)):
            raise PagedKVValueError("prompts must be a list of token-id lists, e.g. [tokenizer.encode('The ')].")
        prompts = [self.model.check_prompt(f"prompts[{i}]", p) for i, p in enumerate(prompts)]
        sampling = self._sampling_params(params, max_tokens, ignore_eos)  # all checked before anything is added
        if self.version == "v1" and isinstance(sampling, BeamSearchParams):
            return beam_search(self, prompts, sampling)
        request_ids = []
        for prompt in prompts:
            request_ids.append(("generate", self._num_generated))
            self._num_generated += 1
            self.add_request(request_ids[-1], prompt, sampling)
        try:
            while not all(self.is_finished(r) for r in request_ids):
                self.step()
            while self.batch_queue and not self.has_unfinished_requests():
                self.step()  # async: the step in flight for requests that are done already (its output dropped)
            while (self.kv_connector is not None and self.scheduler.has_requests()
                   and not self.has_unfinished_requests()):
                self.step()  # vLLM's engine core steps on while the connector completes its copies
        except BaseException:
            self._shutdown_worker()  # never leave the forward thread behind
            raise
        outputs = [self.pop_finished(r) for r in request_ids]
        if isinstance(params, (SamplingParams, BeamSearchParams)):
            return outputs
        return [o.outputs[0].token_ids for o in outputs]

    # ------------------------------------------------------------ one step
    def step(self, after_schedule=None):
        """Schedule, move blocks, run the model on the batch, sample, update the scheduler. v0 only:
        ``after_schedule(out)``, if given, is called right after scheduling, when every scheduled sequence holds a
        slot for its next token and nothing is sampled yet (where ``stats.peak_gpu_blocks`` is counted)."""
        if self.version == "v1":
            if after_schedule is not None:
                raise PagedKVValueError("after_schedule is a v0 hook: the v1 engine has no sequence groups to count")
            return self._step_with_batch_queue() if self.async_scheduling else self._step_v1()
        out = self.scheduler.schedule()
        if after_schedule is not None:
            after_schedule(out)
        self._count(out)
        for request_id in out.ignored:
            self._warn_ignored(request_id)
        self._move_blocks(out)
        next_tokens = self._run_v0(out) if not out.is_empty else {}
        self.scheduler.update(out, next_tokens)
        return out

    def _step_v1(self) -> V1SchedulerOutput:
        """v1: each scheduled request runs its chunk; those whose chunk reaches their last token sample."""
        start = time.perf_counter()
        out = self.scheduler.schedule()
        self._count_v1(out)
        self._start_kv_transfers(out)
        if out.is_empty:
            if not out.preempted_req_ids:
                self._ignore_stuck_v1()
            self.scheduler.update_from_output(out, {}, self._finish_kv_transfers(out))
            return out
        step = self.stats.steps - 1
        chunks, drafts = self._chunks_v1(out), out.scheduled_spec_decode_tokens
        sampling = self.scheduler.sampling_request_ids(out)
        num_rows = {r: 1 + len(drafts.get(r, ())) for r in sampling}  # a draft's rows and the one after it
        self._simulated_host_work()
        self._record("main", "schedule", step, start)
        start = time.perf_counter()
        logits = self._forward(chunks, sampling, num_rows)
        sampled = self._sample_spec(out, sampling, logits) if drafts else self._sample(sampling, logits)
        self._simulated_forward(start)
        self._record("forward", "forward", step, start)  # on this thread, drawn in the model's lane
        start = time.perf_counter()
        self.scheduler.update_from_output(out, sampled, self._finish_kv_transfers(out))
        self._simulated_host_work()
        self._record("main", "update", step, start)
        if self.drafter is not None:
            self._propose_drafts(sampled)
            spec = self.scheduler.spec_decoding_stats  # the scheduler observed every draft it verified
            self.stats.num_drafts, self.stats.num_draft_tokens = spec.num_drafts, spec.num_draft_tokens
            self.stats.num_accepted_tokens = spec.num_accepted_tokens
            self.stats.num_accepted_tokens_per_pos = list(spec.num_accepted_tokens_per_pos)
        return out

    def _sample_spec(self, out: V1SchedulerOutput, sampling: list, logits: torch.Tensor) -> dict:
        """Verify every draft on its rows (``RejectionSampler``); requests without a draft sample one token."""
        argmax = logits.argmax(dim=-1).tolist()
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        sampled, row = {}, 0
        for request_id in sampling:
            draft = out.scheduled_spec_decode_tokens.get(request_id, [])
            rows = list(range(row, row + 1 + len(draft)))
            request = self.scheduler.requests[request_id]
            sampled[request_id] = self._processors[request_id].verify(request_id, rows, draft, logits, logprobs,
                                                                      argmax, len(request.output_token_ids))
            row += len(rows)
        return sampled

    def _propose_drafts(self, sampled: dict) -> None:
        """The n-gram proposer's next drafts for every request that sampled and runs on (vLLM's model runner
        proposes after sampling; ``Scheduler.update_draft_token_ids`` stores them)."""
        requests = self.scheduler.requests
        self.scheduler.update_draft_token_ids({r: self.drafter.propose_one(requests[r].all_token_ids)
                                               for r in sampled if r in requests})

    def _chunks_v1(self, out: V1SchedulerOutput) -> list:
        """Each scheduled request's tokens and block tables (copies), as the step was scheduled. A token sampled by
        the step in flight is not known yet: it is a placeholder (async scheduling), filled in on the forward
        thread."""
        chunks = []
        for request_id, num_tokens in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[request_id]
            start = request.num_computed_tokens - num_tokens  # schedule() already counted this step's tokens
            tokens = request.all_token_ids + out.scheduled_spec_decode_tokens.get(request_id, [])  # drafts: rows too
            tokens = tokens[start:start + num_tokens]
            tokens += [PLACEHOLDER] * (num_tokens - len(tokens))  # async: the token of the step in flight
            chunks.append(_Chunk(request_id, self.kv_cache_manager.get_block_ids_by_group(request_id),
                                 tokens, start, start))
        return chunks

    # ------------------------------------------------------------ async scheduling
    def _step_with_batch_queue(self) -> V1SchedulerOutput | None:
        """vLLM 0.33's ``EngineCore.step_with_batch_queue``: schedule a step and hand it to the forward thread;
        if the queue has room (two steps, ``VllmConfig.max_concurrent_batches`` under async scheduling), return
        at once; otherwise wait for the oldest step and process its output. Returns the ``SchedulerOutput`` whose
        output was processed, or None when this call only scheduled."""
        if self._failed is not None:
            raise PagedKVValueError(f"this engine's forward failed ({self._failed!r}); its requests are lost: make "
                                    "a new LLMEngine.")
        if self.scheduler.has_unfinished_requests():
            start = time.perf_counter()
            out = self.scheduler.schedule()
            self._count_v1(out)
            step = self.stats.steps - 1
            if not out.is_empty:
                sampling = self.scheduler.sampling_request_ids(out)  # known now: the next schedule() changes it
                processors = {r: self._processors[r] for r in sampling}
                chunks = self._chunks_v1(out)
                self._simulated_host_work()  # preparing the step's inputs: before it is handed over
                future = self._worker().submit(self._execute_model, chunks, sampling, processors, step)
                self.batch_queue.appendleft((future, out, step))
                self._record("main", "schedule", step, start)
                if len(self.batch_queue) < self.batch_queue_size:
                    return None  # fill the queue before waiting for an output
            elif not self.batch_queue and not out.preempted_req_ids:
                self._ignore_stuck_v1()
        if not self.batch_queue:
            return None
        out = self._process_output(*self.batch_queue.pop())
        if not self.batch_queue and not self.scheduler.has_unfinished_requests():
            self._shutdown_worker()
        return out

    def _process_output(self, future, out: V1SchedulerOutput, step: int) -> V1SchedulerOutput:
        """Wait for a step's sampled tokens and update the scheduler; a request finished or aborted meanwhile
        keeps nothing of it."""
        start = time.perf_counter()
        try:
            sampled, logprobs = future.result(timeout=EXECUTE_MODEL_TIMEOUT_S)
        except BaseException as error:
            self._failed = error
            self._shutdown_worker()
            raise
        self._record("main", "wait", step, start)
        start = time.perf_counter()
        for row, request_id in enumerate(sampled):
            if request_id in self.scheduler.requests:
                self._processors[request_id].record(request_id, sampled[request_id], logprobs[row])
        self.scheduler.update_from_output(out, sampled)
        self._simulated_host_work()
        self._record("main", "update", step, start)
        return out

    def _simulated_host_work(self) -> None:
        """``simulated_host_ms`` of host work, as a sleep: it holds no lock, so the forward thread runs meanwhile."""
        if self.simulated_host_ms:
            time.sleep(self.simulated_host_ms / 1e3)

    def _simulated_forward(self, start: float) -> None:
        """``simulated_forward_ms``: sleep until the forward span begun at ``start`` has lasted that long."""
        if self.simulated_forward_ms:
            time.sleep(max(0.0, start + self.simulated_forward_ms / 1e3 - time.perf_counter()))

    def _record(self, thread: str, kind: str, step: int, start: float) -> None:
        if self.trace is not None:  # list.append: safe from either thread
            self.trace.append(StepEvent(thread, kind, step, start, time.perf_counter()))

    def _execute_model(self, chunks: list, sampling: list, processors: dict, step: int) -> tuple[dict, torch.Tensor]:
        """On the forward thread: each placeholder becomes the token its request sampled in the step before (vLLM:
        the model runner's ``_prepare_input_ids`` copies ``prev_sampled_token_ids`` on the GPU), the model runs,
        and each sampling request draws its token. Returns the tokens and the log-probabilities of their rows;
        the engine's state is left to the main thread (only the pages and ``_prev_sampled`` change here)."""
        start = time.perf_counter()
        for chunk in chunks:
            chunk.token_ids = [self._prev_sampled[chunk.key] if t == PLACEHOLDER else t for t in chunk.token_ids]
        logits = self._forward(chunks, sampling)
        argmax = logits.argmax(dim=-1).tolist()
        sampled = {r: processors[r].draw(r, row, logits, argmax) for row, r in enumerate(sampling)}
        self._prev_sampled = sampled
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        self._simulated_forward(start)
        self._record("forward", "forward", step, start)
        return sampled, logprobs

    def _worker(self) -> _ForwardThread:
        if self._executor is None:
            self._executor = _ForwardThread()
        return self._executor

    def _shutdown_worker(self) -> None:
        """Join the forward thread once the steps in flight are done. Steps whose output was never processed leave
        their requests waiting for tokens that will not come: the engine is then marked failed."""
        if self.batch_queue:
            self._failed = self._failed or RuntimeError("steps in flight were dropped")
            self.batch_queue.clear()
        if self._executor is not None:
            self._executor.join()
            self._executor = None
        self._prev_sampled = {}

    def close(self) -> None:
        """Process the outputs of the steps in flight and join the forward thread (async scheduling; nothing to
        do otherwise). The engine stays usable: a later step starts the thread again."""
        try:
            while self.batch_queue and self._failed is None:
                self._process_output(*self.batch_queue.pop())
        finally:
            self._shutdown_worker()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start_kv_transfers(self, out: V1SchedulerOutput) -> None:
        """Before the forward pass, the KV connector's copies (vLLM 0.33: the model runner's
        ``handle_preemptions`` and ``start_load_kv``)."""
        if self.kv_connector is not None:
            self.kv_connector.handle_preemptions(out.kv_connector_metadata)
            self.kv_connector.start_load_kv(out.kv_connector_metadata)

    def _finish_kv_transfers(self, out: V1SchedulerOutput) -> KVConnectorOutput | None:
        """After it: the stores of K/V this step wrote, and what completed (vLLM: ``wait_for_save``,
        ``get_finished``)."""
        if self.kv_connector is None:
            return None
        self.kv_connector.wait_for_save(out.kv_connector_metadata)
        finished_sending, finished_recving = self.kv_connector.get_finished(out.finished_req_ids)
        return KVConnectorOutput(finished_sending, finished_recving, self.kv_connector.build_connector_worker_meta())

    def _ignore_stuck_v1(self) -> None:
        """Nothing ran and nothing runs: the first waiting request cannot fit even an empty pool. vLLM rejects such
        a request up front (``max_model_len``); here it finishes with what it has, with a warning."""
        kv = self.kv_cache_manager
        if not self.scheduler.requests or self.scheduler.running or kv.num_used_blocks:
            return
        if self.scheduler.connector is not None and self.scheduler.connector.has_pending_push_work():
            return  # a request waits for a copy to complete
        request_id = self.scheduler.waiting[0]
        self.scheduler.finish_ignored(request_id)
        self._warn_ignored(request_id)

    def _warn_ignored(self, request_id) -> None:
        """vLLM warns and marks an ignored request too: say why, with the numbers, and what to change."""
        self.stats.num_ignored += 1
        processor = self._processors[request_id]
        finished = self.scheduler.finished[request_id]
        generated = max((len(t) for t in finished.values()), default=0) if isinstance(finished, dict) \
            else len(finished)
        tokens = len(processor.prompt_token_ids) + generated
        needed = -(-tokens // self.block_size)
        if self.block_manager is not None:
            pool = (f"{self.block_manager.num_total_gpu_blocks} GPU blocks allow (watermark "
                    f"{self.block_manager.watermark_blocks})")
        else:
            pool = f"{self.kv_cache_manager.num_gpu_blocks} GPU blocks allow"
        warnings.warn(f"request {request_id!r} was ignored: its {tokens} tokens ({len(processor.prompt_token_ids)} "
                      f"of prompt, {generated} generated) need {needed} blocks of {self.block_size} per sequence, "
                      f"more than the pool's {pool}; it returns the tokens it has. Give the engine more "
                      "num_gpu_blocks, a larger block_size, or shorter prompts and max_tokens.",
                      RuntimeWarning, stacklevel=3)

    def _move_blocks(self, out: SchedulerOutputs) -> None:
        """The copies the scheduler asked for, before the model writes anything (vLLM: ``cache_engine``)."""
        for cache in self.caches:
            cache.swap("gpu", "cpu", out.blocks_to_swap_out)
            cache.swap("cpu", "gpu", out.blocks_to_swap_in)
            cache.copy_blocks(out.blocks_to_copy)

    def _run_v0(self, out: SchedulerOutputs) -> dict:
        """v0: every prefill (its uncached tokens) and every decode (its last token) runs and samples."""
        manager, chunks = self.block_manager, []
        for seq_id, tokens in out.prefills:
            num_cached = max(manager.num_cached_tokens(seq_id), out.shared_prefix.get(seq_id, 0))
            start = min(num_cached, len(tokens) - 1)  # a fully cached prompt still runs its last token
            chunks.append(_Chunk(seq_id, (manager.get_block_table(seq_id),), tokens[start:], start, num_cached))
        for seq_id in out.decodes:
            position = manager.get_num_tokens(seq_id) - 1
            token = self.scheduler.get_seq(seq_id).output_token_ids[-1]
            chunks.append(_Chunk(seq_id, (manager.get_block_table(seq_id),), [token], position, position))
        return self._sample(out.scheduled, self._forward(chunks, out.scheduled))

    @torch.inference_mode()
    def _forward(self, chunks: list, sampling: list, num_rows: dict | None = None) -> torch.Tensor:
        """One model pass over a flat batch: every chunk's tokens, in order, and one attention call per layer over
        all of them (the step's metadata built here, once per KV cache group). The logits of ``sampling``'s last
        rows (``num_rows[key]`` last rows for a request verifying drafts: each draft row attends causally to the
        rows before it, as a prefill chunk's rows do)."""
        input_ids, positions, last_row = [], [], {}
        for chunk in chunks:
            end = chunk.start + len(chunk.token_ids)
            input_ids += chunk.token_ids
            positions += range(chunk.start, end)
            last_row[chunk.key] = len(input_ids) - 1
        query_lens = [len(c.token_ids) for c in chunks]
        cu_seqlens_q = torch.tensor([0] + list(itertools.accumulate(query_lens)), dtype=torch.int32)
        seq_lens = torch.tensor([c.start + n for c, n in zip(chunks, query_lens)], dtype=torch.int32)
        groups = [self._group_metadata(chunks, g, cu_seqlens_q, seq_lens) for g in range(len(self.kv_cache_groups))]
        store = PagedKVStore(self.caches, groups, self.layer_group, self.backend)
        num_rows = num_rows or {}
        rows = [r for key in sampling for r in range(last_row[key] + 1 - num_rows.get(key, 1), last_row[key] + 1)]
        logits = self.model.last_logits(torch.tensor(input_ids), torch.tensor(positions), store, rows)
        self.stats.num_computed_tokens += len(input_ids)
        return logits

    def _group_metadata(self, chunks: list, group_id: int, cu_seqlens_q, seq_lens) -> _GroupMetadata:
        """One group's slot mapping and block tables for the batch (a chunk's new tokens never land in a null
        block: only blocks wholly before the window of its first new token are null)."""
        block_size, slots = self.block_size, []
        for chunk in chunks:
            table = chunk.block_tables[group_id]
            slots += [table[p // block_size] * block_size + p % block_size if p >= chunk.write_from else -1
                      for p in range(chunk.start, chunk.start + len(chunk.token_ids))]
        tables = _pad([c.block_tables[group_id] for c in chunks])
        return _GroupMetadata(torch.tensor(slots), UnifiedAttentionMetadata(cu_seqlens_q, seq_lens, tables))

    def _sample(self, seq_ids: list, logits: torch.Tensor) -> dict:
        """Every live sequence's next token: each request's processor samples, forks and prunes its own."""
        argmax = logits.argmax(dim=-1).tolist()  # every greedy row at once
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        rows_by_request: dict = {}
        for row, seq_id in enumerate(seq_ids):  # v1: a sequence is its own request
            request_id = seq_id if self.version == "v1" else self.scheduler.get_seq(seq_id).request_id
            rows_by_request.setdefault(request_id, {})[seq_id] = row
        next_tokens = {}
        for request_id, rows in rows_by_request.items():
            next_tokens.update(self._processors[request_id].process(self.scheduler, rows, logits, logprobs, argmax))
        return next_tokens

    def _count(self, out: SchedulerOutputs) -> None:
        """Statistics of a step just scheduled: blocks in use now, prefix hits of its prefills."""
        manager = self.block_manager
        self.stats.steps += 1
        self.stats.num_preemptions = self.scheduler.num_preemptions
        self.stats.num_prefix_cached_tokens += sum(manager.num_cached_tokens(s) for s, _ in out.prefills
                                                   if s not in out.shared_prefix)  # a fork's hits are its parent's
        self.stats.num_cow_copies += len(out.blocks_to_copy)
        in_use = manager.num_total_gpu_blocks - manager.num_free_gpu_blocks
        self.stats.peak_gpu_blocks = max(self.stats.peak_gpu_blocks, in_use)

    def _count_v1(self, out: V1SchedulerOutput) -> None:
        kv = self.kv_cache_manager
        self.stats.steps += 1
        self.stats.num_preemptions = self.scheduler.num_preemptions
        self.stats.num_prefix_cached_tokens += sum(self.scheduler.requests[r].num_cached_tokens
                                                   for r in out.scheduled_new_reqs)
        self.stats.peak_gpu_blocks = max(self.stats.peak_gpu_blocks, kv.num_used_blocks)  # any group's blocks
        if self.scheduler.connector is not None:
            tier, block_size = self.scheduler.connector.connector_scheduler, self.block_size
            self.stats.num_offload_stored_tokens = tier.manager.num_stored_chunks * block_size
            self.stats.num_offload_evicted_tokens = tier.manager.num_evicted_chunks * block_size
            self.stats.num_offload_loaded_tokens = tier.num_loaded_tokens
            self.stats.num_offload_saved_tokens = self.scheduler.num_external_computed_tokens

    def __repr__(self) -> str:
        return f"LLMEngine(version={self.version!r}, block_size={self.block_size}, {self.scheduler!r})"


def kv_cache_groups_for(config, block_size: int, dtype: torch.dtype, unify: bool = False) -> list:
    """The model's KV cache groups, as vLLM forms them: one spec per layer (its window, if it slides), grouped by
    ``get_kv_cache_groups``. A uniform model has one full-attention group; so has every model with ``unify`` (vLLM's
    ``--disable-hybrid-kv-cache-manager``: ``unify_hybrid_kv_cache_specs`` keeps every token of every layer)."""
    dtype_name = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(dtype,
                                                                                                      "float32")
    shape = dict(block_size=block_size, num_kv_heads=config.num_key_value_heads, head_size=config.head_dim,
                 dtype=dtype_name)
    specs = [FullAttentionSpec(**shape) if unify or config.layer_window(i) is None
             else SlidingWindowSpec(**shape, sliding_window=config.layer_window(i))
             for i in range(config.num_hidden_layers)]
    return get_kv_cache_groups(specs)


_SIMULATED = {"simulated_host_ms": "the main thread's extra work per schedule and per update",
              "simulated_forward_ms": "the least time a forward span lasts"}


def _check_simulated_ms(name: str, value, version: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1000:
        raise PagedKVValueError(f"{name} must be a number of milliseconds from 0 to 1000 ({_SIMULATED[name]}), "
                                f"got {value!r}.")
    if value and version != "v1":
        raise PagedKVValueError(f"{name} times the v1 engine loop's spans: pass version='v1', or leave {name} at 0.")
    return float(value)


def _check_async_scheduling(async_scheduling, version: str, speculative_config) -> None:
    if not isinstance(async_scheduling, bool):
        raise PagedKVValueError(f"async_scheduling must be True (schedule the next step while the model runs, "
                                f"vLLM 0.33's default) or False (pagedkv's default), got {async_scheduling!r}.")
    if async_scheduling and version != "v1":
        raise PagedKVValueError("async_scheduling=True needs the v1 engine (vLLM 0.33's AsyncScheduler): pass "
                                "version='v1', or drop async_scheduling for the paper's synchronous v0 loop.")
    if async_scheduling and speculative_config is not None:
        raise PagedKVValueError("async_scheduling=True with speculative_config: pagedkv proposes n-gram drafts on "
                                "the main thread from each step's sampled tokens, as vLLM 0.33's older V1 model "
                                "runner does, and follows that runner's restriction (VllmConfig refuses async "
                                "scheduling with ngram drafts on it; 0.33's default Model Runner V2 combines the "
                                "two); drop one of the two.")


def _check_v1_settings(num_cpu_blocks, preemption_mode, watermark, block_manager) -> None:
    """v0-only settings on a v1 engine: say what v1 does instead."""
    if num_cpu_blocks:
        raise PagedKVValueError(f"num_cpu_blocks={num_cpu_blocks}: vLLM v1 has no swap space (it preempts by "
                                "recompute only); drop num_cpu_blocks, or use version='v0' to swap.")
    if preemption_mode not in (None, "recompute", PreemptionMode.RECOMPUTE):
        raise PagedKVValueError(f"preemption_mode={preemption_mode!r}: vLLM v1 preempts by recompute only (swap "
                                "went with v0); drop the argument, or use version='v0'.")
    if watermark is not None:
        raise PagedKVValueError(f"watermark={watermark!r}: vLLM v1 has no watermark (allocate_slots either fits or "
                                "the scheduler preempts); drop the argument, or use version='v0'.")
    if block_manager is not None:
        raise PagedKVValueError("block_manager is a v0 BlockSpaceManager; a v1 engine makes its own "
                                "pagedkv.v1.KVCacheManager.")


def _num_offload_blocks(kv_offloading_size, kv_offloading_blocks, kv_cache_groups) -> int:
    """The CPU tier's size in blocks (0: none), from GiB as vLLM 0.33 sizes it or given in blocks."""
    if kv_offloading_size is not None and kv_offloading_blocks is not None:
        raise PagedKVValueError(f"kv_offloading_size={kv_offloading_size!r} and kv_offloading_blocks="
                                f"{kv_offloading_blocks!r}: size the CPU tier one way, in GiB or in blocks.")
    if kv_offloading_size is None and kv_offloading_blocks is None:
        return 0
    if any(group.sliding_window is not None for group in kv_cache_groups):
        raise PagedKVValueError("this model has sliding-window layers; pagedkv's offloading connector keeps "
                                "full-attention groups only (vLLM 0.33 offloads a sliding group's window too): run it "
                                "without kv_offloading_size / kv_offloading_blocks.")
    if kv_offloading_blocks is not None:
        return check_int("kv_offloading_blocks", kv_offloading_blocks, minimum=1)
    if isinstance(kv_offloading_size, bool) or not isinstance(kv_offloading_size, (int, float)) \
            or not math.isfinite(kv_offloading_size) or kv_offloading_size <= 0:
        raise PagedKVValueError(f"kv_offloading_size must be a positive number of GiB (e.g. 0.5), got "
                                f"{kv_offloading_size!r}.")
    bytes_per_block = sum(group.page_size_bytes for group in kv_cache_groups)
    num_blocks = cpu_num_chunks(kv_offloading_size, bytes_per_block)
    if num_blocks < 1:
        raise PagedKVValueError(f"kv_offloading_size={kv_offloading_size} GiB holds no block: one block of every "
                                f"layer takes {cpu_chunk_bytes(bytes_per_block)} bytes (padded to the host page). Give "
                                f"at least {cpu_chunk_bytes(bytes_per_block) / (1 << 30):.3g} GiB, or "
                                "kv_offloading_blocks=N.")
    return num_blocks


def _check_same_sizes(manager, block_size, num_gpu_blocks, num_cpu_blocks) -> BlockSpaceManager:
    if not isinstance(manager, BlockSpaceManager):
        raise PagedKVValueError(f"block_manager must be a BlockSpaceManager or None, got {type(manager).__name__}.")
    given = (block_size, num_gpu_blocks, num_cpu_blocks)
    has = (manager.block_size, manager.num_total_gpu_blocks, manager.num_total_cpu_blocks)
    if given != has:
        raise PagedKVValueError(f"block_manager has block_size, num_gpu_blocks, num_cpu_blocks = {has}, but the "
                                f"engine was given {given}: pass the manager's own sizes.")
    return manager


def _pad(tables: list[list[int]]) -> torch.Tensor:
    """Block tables as one int32 tensor, padded with 0 (entries past seq_len are never read)."""
    width = max((len(t) for t in tables), default=1)
    padded = torch.zeros((len(tables), width), dtype=torch.int32)
    for row, table in enumerate(tables):
        padded[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
    return padded
