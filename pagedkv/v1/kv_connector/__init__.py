"""KV connectors: how K/V enters and leaves the GPU pool besides the model's own writes (vLLM 0.33:
``vllm/distributed/kv_transfer/kv_connector/v1/``).

``base``: the interface, 0.33's ``KVConnectorBase_V1`` with the hooks the scheduler calls and the ones the model
runner calls; ``offloading_connector``: 0.33's native CPU offloading (``OffloadingConnector``), its scheduler side in
``offloading/scheduler.py`` and its worker side in ``offloading/worker.py``.
"""

from .base import KVConnectorBase_V1, KVConnectorMetadata, KVConnectorOutput, KVConnectorRole
from .offloading_connector import OffloadingConnector

__all__ = ["KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorOutput", "KVConnectorRole",
           "OffloadingConnector"]
