"""The messages between the offloading connector's two halves (vLLM 0.33: ``.../offloading/common.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base import KVConnectorMetadata


@dataclass
class TransferJob:
    """One copy: ``src`` blocks to ``dst`` blocks, pairwise. A store copies GPU blocks to CPU chunks; a load, CPU
    chunks to GPU blocks."""

    req_id: object
    src: list
    dst: list
    is_store: bool


@dataclass
class OffloadingConnectorMetadata(KVConnectorMetadata):
    load_jobs: dict = field(default_factory=dict)  # job id -> TransferJob
    store_jobs: dict = field(default_factory=dict)  # job id -> TransferJob
    jobs_to_flush: set = field(default_factory=set)  # store jobs to run now: their GPU blocks change hands this step


@dataclass
class OffloadingWorkerMetadata:
    completed_jobs: set = field(default_factory=set)  # job ids the worker finished since its last report
