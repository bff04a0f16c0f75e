"""Scheduler-side KV connectors for the connector tests, loaded by ``kv_connector_module_path``.

``BlockHashStore`` models vLLM's ``OffloadingConnector`` (and kvgov's own): external
KV keyed by ``request.block_hashes``, in a store every scheduler of the test shares
(a fleet's shared tier). ``SaltRecorder`` models LMCache's adapter: it keys by token
ids and ``cache_salt``, and records the salt it saw.
"""

from __future__ import annotations

from typing import Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)


class _Scheduler(KVConnectorBase_V1):
    """The worker side is never used here: the tests drive the scheduler only."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()


class BlockHashStore(_Scheduler):
    """Offers the leading blocks whose hashes a finished request saved (shared by all instances)."""

    saved: ClassVar[set[Any]] = set()

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        block_size = self._vllm_config.cache_config.block_size
        n = 0
        for h in request.block_hashes:
            if h not in self.saved:
                break
            n += 1
        n = min(n, (request.num_tokens - 1) // block_size)  # the last token is computed
        return max(0, n * block_size - num_computed_tokens), False

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        self.saved.update(request.block_hashes)
        return False, None


class SaltRecorder(_Scheduler):
    """Offers nothing; records the ``cache_salt`` of every request it is asked about."""

    seen: ClassVar[list[Any]] = []

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        self.seen.append((request.request_id, request.cache_salt))
        return 0, False


class AsyncLoader(_Scheduler):
    """Offers every full prompt block but the last as an async load; frees late (delay_free)."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        block_size = self._vllm_config.cache_config.block_size
        n = (request.num_tokens - 1) // block_size
        return max(0, n * block_size - num_computed_tokens), True

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        return True, None


class AsyncLoaderForLoads(AsyncLoader):
    """:class:`AsyncLoader` for requests whose id starts with ``load`` only; others find nothing."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        if not request.request_id.startswith("load"):
            return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        return request.request_id.startswith("load"), None
