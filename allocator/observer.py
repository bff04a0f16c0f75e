"""Evicted blocks shown before they are zeroized: :class:`EvictedBlocks`, the observer type.

A pool zeroizes a cached block in the same call that evicts it (``allocate``
under pressure, ``evict``, ``revoke``), so nobody outside the pool can read its
bytes afterwards. A caller that wants to keep a copy somewhere else (the
governor's encrypted offload tiers) registers an observer with
:meth:`BlockPool.set_eviction_observer`; the pool calls it once per batch,
after the blocks lost their keys and before they are zeroized::

    allocate / evict / revoke (pool lock held)
      take CACHED blocks out of the queue and the key index
      BlocksEvicted event
      observer(EvictedBlocks(ids, keys, reason))   <- the bytes are still there
      zeroize the batch, BlocksZeroized event

The pool knows nothing of what the observer does with them: it hands over block
ids, their keys and the eviction reason (``"capacity"``, ``"expired"``,
``"purged"``, ...), the caller decides which reasons matter. Closing the pool
calls no observer (everything is zeroized at once).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["EvictedBlocks", "EvictionObserver"]


class EvictedBlocks:
    """Blocks being evicted, shown to an eviction observer before they are zeroized.

    Valid only during the observer call: once it returns the blocks are zeroized
    (and may be handed out again), so a view kept longer reads zeros or another
    owner's KV. The observer runs with the pool's lock held and must not call the
    pool (its lock is not re-entrant).

    Attributes:
        block_ids: the blocks, in eviction order.
        keys: the key each block held, same order.
        reason: why they are evicted (``"capacity"``, ``"expired"``, ``"purged"``,
            ``"invalidated"``, ``"secret_rotated"``, or a caller's reason).
    """

    __slots__ = ("_bytes", "_tensor", "block_ids", "keys", "reason")

    def __init__(
        self,
        block_ids: tuple[int, ...],
        keys: tuple[bytes, ...],
        reason: str,
        tensor: torch.Tensor,
    ) -> None:
        self.block_ids = block_ids
        self.keys = keys
        self.reason = reason
        self._tensor = tensor
        # the pool's bytes as one flat view, made on first use (host memory only)
        self._bytes: memoryview | None = None

    def view(self, block_id: int) -> torch.Tensor:
        """The bytes of one evicted block (a view into the pool, valid during the call only).

        Args:
            block_id: one of :attr:`block_ids`.

        Returns:
            ``[num_layers, 2, block_size, num_kv_heads, head_dim]``, contiguous.
        """
        return self._tensor[block_id]

    def payload(self, block_id: int) -> memoryview | torch.Tensor:
        """The bytes of one evicted block, the cheapest way to read them for a copy.

        Where the pool lives in host memory this is a zero-copy, read-only byte view
        (no tensor is made per block: the pool's bytes are viewed once per batch);
        on a GPU it is :meth:`view`, which the reader copies to the host. Valid
        during the call only, as :meth:`view`.

        Args:
            block_id: one of :attr:`block_ids`.
        """
        tensor = self._tensor
        if tensor.device.type != "cpu":
            return tensor[block_id]
        flat = self._bytes
        if flat is None:
            raw = tensor.view(-1).view(torch.uint8).numpy()
            flat = memoryview(raw).toreadonly()  # type: ignore[arg-type]
            self._bytes = flat
        n = len(flat) // tensor.shape[0]
        return flat[block_id * n : (block_id + 1) * n]


#: Called by the pool with each batch of evicted blocks, before they are zeroized. It
#: should not raise; if it does, the batch is zeroized and freed first and the error
#: propagates out of the pool call that evicted (nothing is lost or left readable).
EvictionObserver = Callable[[EvictedBlocks], None]
