"""What the offloading connector and an offloading backend share (vLLM 0.33: ``vllm/v1/kv_offload/base.py``).

A block of KV stored outside the GPU pool is found by an **offload key**: the block hash the GPU prefix cache already
names it by, with its KV cache group (``make_offload_key``). The backend answers a lookup with ``LookupResult``:
``HIT`` (ready to load), ``HIT_PENDING`` (its store has not finished: the connector asks again next step) or
``MISS``. ``ReqContext`` is what the backend may remember about one request: where each of its keys ends (in tokens)
and per-policy state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


def make_offload_key(block_hash: str, group_idx: int) -> tuple:
    """The key of one offloaded chunk: its last block's hash and its KV cache group (vLLM packs the two into
    bytes; a tuple here, so a block map can print the hash)."""
    return (block_hash, group_idx)


class LookupResult(enum.Enum):
    MISS = "miss"
    HIT = "hit"
    HIT_PENDING = "hit_pending"  # stored, but the copy has not completed: not readable yet


@dataclass
class ReqContext:
    """One request as the backend sees it: the token position each of its keys ends at, and policy state."""

    request_id: object
    key_positions: dict = field(default_factory=dict)  # key -> end token (vLLM: set_offload_key_position)
    state: dict = field(default_factory=dict)  # type -> per-request state of a manager or policy

    def set_offload_key_position(self, key, end_token: int) -> None:
        self.key_positions[key] = end_token

    def get_offload_key_position(self, key) -> int | None:
        return self.key_positions.get(key)


@dataclass
class PrepareStoreOutput:
    """What ``prepare_store`` decided: the keys to copy (those not stored yet), the CPU chunks they go to, and the
    keys evicted to make room."""

    keys_to_store: list
    store_spec: list  # CPU chunk ids, one per key to store
    evicted_keys: list
