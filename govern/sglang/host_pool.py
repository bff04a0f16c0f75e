"""HiCache's host pool (L2), zeroed: :class:`HostPoolZeroer`.

SGLang's ``HostKVCache`` hands host pages out and takes them back (``alloc``,
``free``, ``clear``) and never writes over what they held: a page a tenant's KV was
backed up into, freed when the tree evicts it from host memory, is handed to the
next backup as it is. The governed cache re-classes each host pool in place
(:func:`kvgov.govern.sglang.fence.govern_host_pool`) so that every page it takes
back is zeroed here, under the pool's lock, before ``alloc`` can hand it out again:
one indexed fill per buffer per call (every page the call frees at once, never a
fill per page), and the whole buffer at ``clear``.

The buffer's layout decides what a fill indexes: SGLang's MHA host pool keeps K and
V as one tensor ``[2, layers, slots, ...]`` (``layer_first``), ``[2, slots, layers,
...]`` (``page_first``) or ``[2, pages, layers, page_size, ...]``
(``page_first_direct``); its MLA pool ``[layers, slots, ...]`` or ``[slots, layers,
...]``. Any other layout or pool is refused at start (``UnsupportedEngine``).
Needs torch, not SGLang.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from kvgov.exceptions import UnsupportedEngine

__all__ = ["HostPoolZeroer"]

#: layout -> (the dimension that indexes token slots or pages, whether it indexes pages),
#: for SGLang's MHA host pool (K and V in one tensor: dimension 0 is K/V)
_MHA = {"layer_first": (2, False), "page_first": (1, False), "page_first_direct": (1, True)}
#: the same for its MLA host pool (one latent KV tensor)
_MLA = {"layer_first": (1, False), "page_first": (0, False), "page_first_direct": (0, True)}


class HostPoolZeroer:
    """Zeroes the pages an SGLang host pool takes back (see the module docstring).

    Args:
        pool: SGLang's host pool (``MHATokenToKVPoolHost`` or ``MLATokenToKVPoolHost``).
        on_zeroed: called with the number of pages and bytes just zeroed, and the seconds
            it took (the governance counts and audits them).

    Raises:
        UnsupportedEngine: a pool or layout whose buffer kvgov does not know how to index.
    """

    def __init__(
        self, pool: Any, on_zeroed: Callable[[int, int, float], None] | None = None
    ) -> None:
        found = getattr(pool, "kv_buffer", None)
        layout = str(getattr(pool, "layout", ""))
        kind = type(pool).__name__
        mla = "MLA" in kind
        table = _MLA if mla else _MHA
        buffer = found if isinstance(found, torch.Tensor) else torch.empty(0)
        fits = isinstance(found, torch.Tensor) and layout in table
        if fits:
            dim, by_page = table[layout]
            page = int(getattr(pool, "page_size", 0) or 0)
            size = int(getattr(pool, "size", -1))
            want = size // page if by_page and page else size
            # the indexed dimension holds every slot (page); an MHA pool's dimension 0 is K, V
            fits = (
                buffer.dim() > dim
                and page > 0
                and int(buffer.shape[dim]) == want
                and (mla or int(buffer.shape[0]) == 2)
            )
        if not fits:
            raise UnsupportedEngine(
                f"a HiCache host pool {kind} of layout {layout!r} (kvgov cannot zero its pages)",
                "use the MHA or MLA host pool with --hicache-mem-layout layer_first, "
                "page_first or page_first_direct",
            )
        dim, by_page = table[layout]
        self.pool = pool
        self.buffer: torch.Tensor = buffer
        self.dim = dim
        self.by_page = by_page
        self.page_size = int(pool.page_size)
        self.on_zeroed = on_zeroed
        slots = int(buffer.shape[dim]) * (self.page_size if by_page else 1)
        self.bytes_per_slot = buffer.numel() * buffer.element_size() // max(slots, 1)
        #: pages zeroed so far (counted per call)
        self.pages_zeroed = 0

    def zero(self, indices: torch.Tensor) -> None:
        """Zero the token slots ``indices`` (whole pages) in the buffer: one indexed fill."""
        if not indices.numel():
            return
        start = time.perf_counter()
        idx = indices.reshape(-1).to(device=self.buffer.device, dtype=torch.int64)
        if self.by_page:
            idx = torch.unique(torch.div(idx, self.page_size, rounding_mode="floor"))
        self.buffer.index_fill_(self.dim, idx, 0)
        pages = -(-int(indices.numel()) // self.page_size)
        self.pages_zeroed += pages
        if self.on_zeroed is not None:
            self.on_zeroed(
                pages, int(indices.numel()) * self.bytes_per_slot, time.perf_counter() - start
            )

    def zero_all(self) -> None:
        """Zero the whole buffer (the pool's ``clear``: every page is free again)."""
        self.buffer.zero_()

    def reads_zero(self, indices: torch.Tensor) -> bool:
        """Whether the token slots ``indices`` read zero (a read-back, for tests and checks)."""
        if not indices.numel():
            return True
        idx = indices.reshape(-1).to(device=self.buffer.device, dtype=torch.int64)
        if self.by_page:
            idx = torch.unique(torch.div(idx, self.page_size, rounding_mode="floor"))
        return not bool(self.buffer.index_select(self.dim, idx).any())
