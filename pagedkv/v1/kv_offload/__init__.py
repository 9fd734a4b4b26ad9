"""A second tier of KV blocks behind the GPU pool (vLLM 0.33: ``vllm/v1/kv_offload/``).

``base``: the names the connector and a backend share (offload keys, lookup results, the per-request context);
``cpu``: the CPU backend (its chunk pool and ref counts in ``cpu/manager.py``, the eviction policies in
``cpu/policies.py``, its size in chunks from GiB in ``cpu/spec.py``).
"""
