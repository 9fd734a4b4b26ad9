"""vLLM 0.33's native CPU offloading as a KV connector (``vllm/distributed/kv_transfer/kv_connector/v1/
offloading_connector.py``, ``OffloadingConnector``), switched on by ``kv_offloading_size`` (GiB;
``vllm/config/cache.py``, ``kv_offloading_backend="native"``).

One class, two roles, as in vLLM: the scheduler's instance owns the CPU tier's bookkeeping
(``CPUOffloadingManager``) and decides (``offloading/scheduler.py``); the model runner's instance copies
(``offloading/worker.py``). This file only routes each hook to its half.
"""

from __future__ import annotations

from ..kv_offload.cpu.manager import CPUOffloadingManager
from .base import KVConnectorBase_V1, KVConnectorOutput, KVConnectorRole
from .offloading.scheduler import OffloadingConnectorScheduler
from .offloading.worker import OffloadingConnectorWorker


class OffloadingConnector(KVConnectorBase_V1):
    """``num_cpu_blocks`` CPU blocks behind a GPU pool of ``block_size``-token blocks (``offload_prompt_only``:
    0.33's default, store only prompt blocks)."""

    def __init__(self, role: KVConnectorRole, block_size: int, num_cpu_blocks: int,
                 offload_prompt_only: bool = True, enable_prefix_caching: bool = True):
        super().__init__(role)
        self.num_cpu_blocks = num_cpu_blocks
        self.connector_scheduler = self.connector_worker = None
        if role is KVConnectorRole.SCHEDULER:
            self.connector_scheduler = OffloadingConnectorScheduler(
                CPUOffloadingManager(num_cpu_blocks), block_size, offload_prompt_only=offload_prompt_only,
                enable_prefix_caching=enable_prefix_caching)
        else:
            self.connector_worker = OffloadingConnectorWorker()

    @property
    def manager(self) -> CPUOffloadingManager:
        return self.connector_scheduler.manager

    # ------------------------------------------------------------ scheduler side
    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        self.connector_scheduler._kv_cache_manager = kv_cache_manager

    def on_new_request(self, request) -> None:
        self.connector_scheduler.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.connector_scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, block_ids: list, num_external_tokens: int) -> None:
        self.connector_scheduler.update_state_after_alloc(request, block_ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self.connector_scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.connector_scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids: list) -> tuple[bool, dict | None]:
        return self.connector_scheduler.request_finished(request)

    def has_pending_push_work(self) -> bool:
        return self.connector_scheduler.has_pending_push_work()

    def snapshot(self):
        """The CPU tier as plain data (``pagedkv.state.OffloadState``), for drawing."""
        return self.manager.snapshot(self.connector_scheduler.block_size)

    # ------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: list) -> None:
        self.connector_worker.register_kv_caches(kv_caches)

    def handle_preemptions(self, metadata) -> None:
        self.connector_worker.handle_preemptions(metadata)

    def start_load_kv(self, metadata) -> None:
        self.connector_worker.start_kv_transfers(metadata)

    def wait_for_save(self, metadata) -> None:
        self.connector_worker.prepare_store_kv(metadata)

    def get_finished(self, finished_req_ids: set) -> tuple[set, set]:
        return self.connector_worker.get_finished(finished_req_ids)

    def build_connector_worker_meta(self):
        return self.connector_worker.build_connector_worker_meta()

    def __repr__(self) -> str:
        return f"OffloadingConnector(role={self.role.name}, num_cpu_blocks={self.num_cpu_blocks})"
