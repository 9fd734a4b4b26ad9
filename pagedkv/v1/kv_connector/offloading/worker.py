"""The offloading connector's worker side: the copies (vLLM 0.33: ``.../offloading/worker.py``,
``OffloadingConnectorWorker``, over ``vllm/v1/kv_offload/cpu/gpu_worker.py``'s transfer handlers).

Every layer's ``CacheEngine`` holds the GPU pool and the CPU tier's chunks (its ``"cpu"`` pool, one block per
chunk); a job copies the same block pairs in every layer (``CacheEngine.swap``, vLLM's ``swap_blocks``). Around
the forward pass, as 0.33's model runner calls it:

* ``handle_preemptions``: stores this step must not wait for (their GPU blocks are handed to another request now)
  run at once, with the stores the last step deferred;
* ``start_load_kv``: the last step's deferred stores, then this step's loads;
* ``wait_for_save`` (after the forward): this step's stores are queued for the start of the next step, "so that
  offloading starts after transfers related to token sampling";
* ``get_finished``: requests whose load landed (``finished_recving``); ``build_connector_worker_meta``: the jobs
  done.

vLLM runs the copies on CUDA streams and reports them when they complete; here each copy runs when it is submitted,
so it is done by the end of the step that submits it.
"""

from __future__ import annotations

from .common import OffloadingWorkerMetadata


class OffloadingConnectorWorker:
    def __init__(self):
        self.kv_caches: list = []  # one CacheEngine per layer
        self._unsubmitted_store_jobs: list = []  # (job id, TransferJob), deferred to the next step's start
        self._load_jobs: dict = {}  # job id -> request id, submitted, not yet reported
        self._completed_jobs: set = set()

    def register_kv_caches(self, kv_caches: list) -> None:
        self.kv_caches = list(kv_caches)

    def _submit(self, job_id, job) -> None:
        src_pool, dst_pool = ("gpu", "cpu") if job.is_store else ("cpu", "gpu")
        pairs = list(zip(job.src, job.dst))
        for cache in self.kv_caches:
            cache.swap(src_pool, dst_pool, pairs)
        self._completed_jobs.add(job_id)

    def _submit_deferred_stores(self) -> None:
        for job_id, job in self._unsubmitted_store_jobs:
            self._submit(job_id, job)
        self._unsubmitted_store_jobs.clear()

    def handle_preemptions(self, metadata) -> None:
        for job_id in sorted(metadata.jobs_to_flush):
            job = metadata.store_jobs.pop(job_id, None)
            if job is not None:
                self._unsubmitted_store_jobs.append((job_id, job))
        self._submit_deferred_stores()

    def start_kv_transfers(self, metadata) -> None:
        self._submit_deferred_stores()
        for job_id, job in metadata.load_jobs.items():
            self._load_jobs[job_id] = job.req_id
            self._submit(job_id, job)

    def prepare_store_kv(self, metadata) -> None:
        self._unsubmitted_store_jobs.extend(metadata.store_jobs.items())

    def get_finished(self, finished_req_ids: set) -> tuple[set, set]:
        finished_recving = {self._load_jobs.pop(j) for j in list(self._load_jobs) if j in self._completed_jobs}
        return set(), finished_recving

    def build_connector_worker_meta(self) -> OffloadingWorkerMetadata | None:
        if not self._completed_jobs:
            return None
        meta = OffloadingWorkerMetadata(self._completed_jobs)
        self._completed_jobs = set()
        return meta
