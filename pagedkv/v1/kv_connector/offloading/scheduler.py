"""The offloading connector's scheduler side: which blocks go to the CPU tier and back, and in which step
(vLLM 0.33: ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``,
``OffloadingConnectorScheduler``).

With 0.33's defaults (``blocks_per_chunk = 1``, ``offload_prompt_only = True``, ``sync_load_budget_bytes = 0``,
eviction ``"lru"``), for a model of full-attention layers:

* **Keys.** Each full block of a request is keyed by its block hash (the GPU prefix cache's name for it), so a
  block stored by one request is found by any request with the same prefix.
* **Lookup** (``get_num_new_matched_tokens``, on admission, after the GPU prefix hit): the run of stored keys right
  after the local hit, up to ``num_tokens`` (a whole prompt may hit; the scheduler then recomputes its last token).
  A key whose store has not completed (``HIT_PENDING``), or that another request is loading, or a request with
  transfers still in flight, answers ``None``: ask again next step. A hit is always loaded **asynchronously**: the
  request waits in ``WAITING_FOR_REMOTE_KVS`` until the load lands.
* **Load** (``update_state_after_alloc``): the hit keys' CPU chunks into the freshly allocated GPU blocks after the
  local hit; the chunks are pinned until the load completes. Loaded chunks are not offered for storing again.
* **Store** (``build_connector_meta``, every step): for each scheduled request, the full blocks that will be
  computed once this step has run, **prompt blocks only**, from where the last store stopped; for a request that
  finished, what is left of its prompt. Keys already stored are only re-ranked. The worker copies a store after the
  forward pass (0.33 defers it to the start of the next step), and a key becomes readable when the worker reports
  it done; a store's GPU block that is handed to another request before it is copied is **flushed** (copied first).
* ``request_finished`` never delays freeing the blocks: the tier is a best-effort cache.

Left out (0.33 has them): blocks_per_chunk > 1 (the key of a chunk is its last block's hash), sliding-window and
Mamba groups (the engine refuses offloading for a hybrid model), partial tails, EAGLE groups, tiers behind the CPU,
synchronous loads (``sync_load_budget_bytes``), ``max_load_tokens``/``max_offload_tokens``, a store threshold, cache
reset, load failures, KV events and metrics, the ARC policy, and threads: every transfer here completes within the
step that starts it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ....prefix import hash_block_tokens
from ...kv_offload.base import LookupResult, ReqContext, make_offload_key
from .common import OffloadingConnectorMetadata, TransferJob


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class RequestOffloadState:
    """What the connector keeps per request (vLLM: ``RequestOffloadState`` and its one ``RequestGroupState``)."""

    req: object
    req_context: ReqContext
    block_hashes: list = field(default_factory=list)  # vLLM: request.block_hashes
    offload_keys: list = field(default_factory=list)  # one per full chunk of the request's tokens
    block_ids: list = field(default_factory=list)  # the request's GPU block table as last scheduled
    next_stored_chunk_idx: int = 0  # chunks before it are stored (or were loaded)
    num_locally_computed_tokens: int = 0  # the GPU prefix hit at the last lookup
    transfer_jobs: set = field(default_factory=set)  # in flight: one load, or stores
    finished_signaled: bool = False

    def update_offload_keys(self, block_size: int, blocks_per_chunk: int) -> None:
        tokens = self.req.all_token_ids
        for i in range(len(self.block_hashes), len(tokens) // block_size):
            parent = self.block_hashes[-1] if self.block_hashes else None
            self.block_hashes.append(hash_block_tokens(parent, tokens[i * block_size:(i + 1) * block_size]))
        tokens_per_chunk = block_size * blocks_per_chunk
        for i in range(len(self.offload_keys), len(self.block_hashes) // blocks_per_chunk):
            key = make_offload_key(self.block_hashes[(i + 1) * blocks_per_chunk - 1], 0)
            self.offload_keys.append(key)
            self.req_context.set_offload_key_position(key, (i + 1) * tokens_per_chunk)


@dataclass
class TransferJobStatus:
    req_id: object
    keys: list
    is_store: bool
    block_ids: list  # the GPU blocks it reads (a store) or writes (a load)


class OffloadingConnectorScheduler:
    """The decisions, over a ``CPUOffloadingManager``."""

    def __init__(self, manager, block_size: int, blocks_per_chunk: int = 1, offload_prompt_only: bool = True,
                 enable_prefix_caching: bool = True):
        self.manager = manager
        self.block_size = block_size
        self.blocks_per_chunk = blocks_per_chunk
        self.tokens_per_chunk = block_size * blocks_per_chunk
        self.offload_prompt_only = offload_prompt_only
        self._req_status: dict = {}  # request id -> RequestOffloadState
        self._jobs: dict = {}  # job id -> TransferJobStatus, until the worker reports it done
        self._job_counter = itertools.count()
        self._current_batch_load_jobs: dict = {}
        self._current_batch_allocated_block_ids: set = set()
        self._block_id_to_pending_jobs: dict = {}  # a finished request's store sources -> their pending jobs
        self._chunks_being_loaded = set() if enable_prefix_caching else None
        self.num_loaded_tokens = 0  # tokens whose K/V a load copies back to the GPU

    # ------------------------------------------------------------ admission
    def on_new_request(self, request) -> None:
        self._req_status[request.request_id] = RequestOffloadState(request, ReqContext(request.request_id))

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        state = self._req_status[request.request_id]
        state.block_ids.clear()
        state.next_stored_chunk_idx = 0  # restarting at token 0: offer every chunk again
        if state.transfer_jobs:
            return None, False
        state.update_offload_keys(self.block_size, self.blocks_per_chunk)
        state.num_locally_computed_tokens = num_computed_tokens
        num_hit_tokens = self._lookup(state)
        return num_hit_tokens, bool(num_hit_tokens)  # no sync-load budget by default: every load is async

    def _lookup(self, state: RequestOffloadState) -> int | None:
        """Tokens beyond the local hit whose chunks are all stored (vLLM: ``_lookup_complete_chunks`` for one
        full-attention group)."""
        num_computed, tpc, keys = state.num_locally_computed_tokens, self.tokens_per_chunk, state.offload_keys
        max_hit = min(state.req.num_tokens, len(keys) * tpc)
        if max_hit - num_computed < tpc:
            return 0
        start = num_computed // tpc
        num_hits, pending = 0, False
        for key in keys[start:min(cdiv(max_hit, tpc), len(keys))]:
            result = self.manager.lookup(key, state.req_context)
            if result is LookupResult.MISS:
                break
            num_hits += 1
            pending |= result is LookupResult.HIT_PENDING
        if num_hits == 0:
            return 0
        num_hit_tokens = min(max_hit, tpc * (start + num_hits)) - num_computed
        if num_hit_tokens < tpc:
            return 0
        if pending:
            return None
        if self._chunks_being_loaded and any(k in self._chunks_being_loaded
                                             for k in keys[start:cdiv(num_computed + num_hit_tokens, tpc)]):
            return None  # another request is loading one of them: wait for it, then hit on the GPU
        return num_hit_tokens

    def update_state_after_alloc(self, request, block_ids: list, num_external_tokens: int) -> None:
        """Plan the load of the hit into the request's fresh blocks after its local hit."""
        self._current_batch_allocated_block_ids.update(block_ids)
        if num_external_tokens == 0:
            return
        state = self._req_status[request.request_id]
        num_local = state.num_locally_computed_tokens
        num_cached = num_local + num_external_tokens
        start_block, end_block = cdiv(num_local, self.block_size), cdiv(num_cached, self.block_size)
        num_chunks = cdiv(num_cached, self.tokens_per_chunk)
        keys = state.offload_keys[start_block // self.blocks_per_chunk:num_chunks]
        dst = list(block_ids[start_block:end_block])
        state.next_stored_chunk_idx = num_chunks  # CHUNK_LEVEL policy: loaded chunks are not stored again
        src = self.manager.prepare_load(keys, state.req_context)
        job_id = next(self._job_counter)
        self._current_batch_load_jobs[job_id] = TransferJob(request.request_id, src, dst, is_store=False)
        state.transfer_jobs.add(job_id)
        self._jobs[job_id] = TransferJobStatus(request.request_id, keys, False, dst)
        if self._chunks_being_loaded is not None:
            self._chunks_being_loaded.update(keys)
        self.num_loaded_tokens += num_external_tokens

    # ------------------------------------------------------------ the step's plan
    def build_connector_meta(self, scheduler_output) -> OffloadingConnectorMetadata:
        self._update_req_states(scheduler_output)
        jobs_to_flush = set()
        for req_id in scheduler_output.preempted_req_ids:
            state = self._req_status.get(req_id)
            if state is not None:
                jobs_to_flush |= state.transfer_jobs - self._current_batch_load_jobs.keys()
        for block_id in self._current_batch_allocated_block_ids & self._block_id_to_pending_jobs.keys():
            jobs_to_flush |= self._block_id_to_pending_jobs[block_id]
        store_jobs = self._build_store_jobs(scheduler_output, jobs_to_flush)
        meta = OffloadingConnectorMetadata(self._current_batch_load_jobs, store_jobs, jobs_to_flush)
        for req_id in scheduler_output.finished_req_ids:
            state = self._req_status.get(req_id)
            if state is None:
                continue
            state.finished_signaled = True
            self.manager.on_request_finished(state.req_context)
            if not state.transfer_jobs:
                del self._req_status[req_id]
        self._current_batch_load_jobs = {}
        self._current_batch_allocated_block_ids = set()
        return meta

    def _update_req_states(self, scheduler_output) -> None:
        """Each scheduled request's keys and block table (vLLM reads them from the ``SchedulerOutput``); blocks
        new to a table this step count as handed out."""
        for req_id in scheduler_output.num_scheduled_tokens:
            state = self._req_status[req_id]
            state.update_offload_keys(self.block_size, self.blocks_per_chunk)
            table = self._kv_cache_manager.get_block_ids(req_id)
            is_full_table = req_id in scheduler_output.scheduled_new_reqs
            self._current_batch_allocated_block_ids.update(table if is_full_table else table[len(state.block_ids):])
            state.block_ids = list(table)

    def _num_offloadable_tokens(self, req, num_tokens: int) -> int:
        num = min(num_tokens, req.num_tokens)
        return min(num, len(req.prompt_token_ids)) if self.offload_prompt_only else num

    def _build_store_jobs(self, scheduler_output, jobs_to_flush: set) -> dict:
        store_jobs = {}
        for req_id in itertools.chain(scheduler_output.num_scheduled_tokens, scheduler_output.finished_req_ids):
            state = self._req_status.get(req_id)
            if state is None:
                continue
            req = state.req
            finished = req_id not in scheduler_output.num_scheduled_tokens
            if finished:  # the last sampled token's K/V was never computed
                num_tokens_after_batch = max(len(req.prompt_token_ids), req.num_tokens - 1)
            else:
                num_tokens_after_batch = req.num_computed_tokens + scheduler_output.num_scheduled_tokens[req_id]
            num_offloadable = self._num_offloadable_tokens(req, num_tokens_after_batch)
            num_chunks = min(num_offloadable // self.tokens_per_chunk, len(state.block_ids) // self.blocks_per_chunk,
                             len(state.offload_keys))
            start = state.next_stored_chunk_idx
            if num_chunks <= start:
                continue
            keys = state.offload_keys[start:num_chunks]
            store = self.manager.prepare_store(keys, state.req_context)
            if store is None:  # the tier is full of pinned chunks: try again next step
                continue
            state.next_stored_chunk_idx = num_chunks
            if not store.keys_to_store:
                continue
            to_store = set(store.keys_to_store)
            src = [state.block_ids[(start + i + 1) * self.blocks_per_chunk - 1]
                   for i, key in enumerate(keys) if key in to_store]
            job_id = next(self._job_counter)
            state.transfer_jobs.add(job_id)
            self._jobs[job_id] = TransferJobStatus(req_id, list(store.keys_to_store), True, src)
            store_jobs[job_id] = TransferJob(req_id, src, list(store.store_spec), is_store=True)
            if finished:  # its blocks are free already: watch them until the copy is done
                for block_id in src:
                    self._block_id_to_pending_jobs.setdefault(block_id, set()).add(job_id)
                    if block_id in self._current_batch_allocated_block_ids:
                        jobs_to_flush.add(job_id)
        return store_jobs

    # ------------------------------------------------------------ after the step
    def update_connector_output(self, connector_output) -> None:
        meta = connector_output.kv_connector_worker_meta
        for job_id in sorted(meta.completed_jobs if meta is not None else ()):
            job = self._jobs.pop(job_id)
            state = self._req_status[job.req_id]
            if job.is_store:
                self.manager.complete_store(job.keys, state.req_context)
            else:
                self.manager.complete_load(job.keys, state.req_context)
                if self._chunks_being_loaded:
                    self._chunks_being_loaded.difference_update(job.keys)
            for block_id in job.block_ids:
                pending = self._block_id_to_pending_jobs.get(block_id)
                if pending is not None:
                    pending.discard(job_id)
                    if not pending:
                        del self._block_id_to_pending_jobs[block_id]
            state.transfer_jobs.discard(job_id)
            if state.finished_signaled and not state.transfer_jobs:
                del self._req_status[job.req_id]

    def request_finished(self, request) -> tuple[bool, dict | None]:
        """Keys for the final tokens; a finished request's pending stores watch their blocks from now on. Never
        delays the free."""
        state = self._req_status.get(request.request_id)
        if state is None:
            return False, None
        state.update_offload_keys(self.block_size, self.blocks_per_chunk)
        for job_id in state.transfer_jobs:
            job = self._jobs[job_id]
            if job.is_store:
                for block_id in job.block_ids:
                    self._block_id_to_pending_jobs.setdefault(block_id, set()).add(job_id)
        return False, None

    def has_pending_push_work(self) -> bool:
        return bool(self._jobs)
