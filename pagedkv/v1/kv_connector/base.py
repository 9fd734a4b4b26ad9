"""The KV connector interface (vLLM 0.33: ``vllm/distributed/kv_transfer/kv_connector/v1/base.py``,
``KVConnectorBase_V1``; the output type is ``KVConnectorOutput`` in ``vllm/v1/outputs.py``).

A connector has two halves that never share memory, one per role (``KVConnectorRole``): the **scheduler** side
decides, the **worker** side copies. They talk only through the step's ``SchedulerOutput`` (which carries the
scheduler side's ``KVConnectorMetadata``) and the model runner's ``KVConnectorOutput`` (which carries back what the
worker finished). The scheduler calls its half where 0.33's ``Scheduler`` does:

1. ``get_num_new_matched_tokens(request, num_computed_tokens)``, on admission, right after the GPU prefix-cache
   lookup: how many tokens *beyond* the local hit the connector can supply (``num_external_computed_tokens``), and
   whether they arrive asynchronously. ``None`` means "ask me again next step" (the request is skipped);
2. ``update_state_after_alloc(request, block_ids, num_external_tokens)``, once ``allocate_slots`` gave the request
   its blocks: the connector plans the load into them;
3. ``build_connector_meta(scheduler_output)``, at the end of ``schedule()``: the step's loads and stores;
4. ``update_connector_output(kv_connector_output)``, in ``update_from_output``: the transfers that completed;
5. ``request_finished(request, block_ids)``, when a request finishes, before its blocks are freed (True would
   mean "keep the blocks until I am done with them").

The worker half is called by the model runner around the forward pass: ``handle_preemptions`` and
``start_load_kv`` before it, ``wait_for_save`` after it, then ``get_finished``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata:
    """What the scheduler side tells the worker side for one step (each connector subclasses it)."""


@dataclass
class KVConnectorOutput:
    """What the worker side reports after a step (vLLM: ``vllm/v1/outputs.py``)."""

    finished_sending: set = field(default_factory=set)  # requests whose blocks may now be freed
    finished_recving: set = field(default_factory=set)  # requests whose asynchronous load landed
    kv_connector_worker_meta: object = None  # connector-specific: e.g. the transfer jobs that completed


class KVConnectorBase_V1:  # noqa: N801 (vLLM's name)
    """The hooks, with what a connector that does nothing answers."""

    def __init__(self, role: KVConnectorRole):
        self.role = role
        self._kv_cache_manager = None

    # ------------------------------------------------------------ scheduler side
    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        self._kv_cache_manager = kv_cache_manager

    def on_new_request(self, request) -> None:
        """A request was added to the scheduler."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return 0, False

    def update_state_after_alloc(self, request, block_ids: list, num_external_tokens: int) -> None:
        """``block_ids``: the request's whole block table after ``allocate_slots``."""

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """The worker side's report for the step just run."""

    def request_finished(self, request, block_ids: list) -> tuple[bool, dict | None]:
        return False, None

    def has_pending_push_work(self) -> bool:
        """Transfers still in flight: the engine keeps stepping until they complete (vLLM 0.33:
        ``Scheduler.has_requests``)."""
        return False

    # ------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: list) -> None:
        """The model runner's per-layer caches, which the worker side copies to and from."""

    def handle_preemptions(self, metadata: KVConnectorMetadata) -> None:
        """Before the forward pass: finish any copy out of blocks this step hands to another request."""

    def start_load_kv(self, metadata: KVConnectorMetadata) -> None:
        """Before the forward pass: start the step's loads (and the stores the last step deferred)."""

    def wait_for_save(self, metadata: KVConnectorMetadata) -> None:
        """After the forward pass: the step's stores (their K/V has just been written)."""

    def get_finished(self, finished_req_ids: set) -> tuple[set, set]:
        """``(finished_sending, finished_recving)`` request ids."""
        return set(), set()

    def build_connector_worker_meta(self):
        return None
