"""The two halves of ``OffloadingConnector`` (vLLM 0.33:
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/``)."""
