"""Which scope wrote each block: :class:`Owners`.

The governor needs the owner of a block long after the request that wrote it
is gone: to check a sharing grant on a hit, to attribute an eviction or a
zeroization to a tenant, and to select the blocks a purge or an invalidation
must reach. A pool knows nothing of tenants, so the governor keeps this table
itself, indexed by the pool's block ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter

from .scope import CacheScope

__all__ = ["Owners"]


class Owners:
    """A list from block id to the scope that first wrote the block, or None.

    Invariant (checked by the governor's ``_check_invariants``): the entry of a
    block is its writer's scope while the block is OWNED, CACHED or DIRTY, and
    None while it is FREE. The governor sets it when a block is handed out and
    clears it when the pool reports the block zeroized.

    Only the governor, under its lock, changes it.

    Args:
        num_blocks: blocks in the pool.
    """

    __slots__ = ("table",)

    def __init__(self, num_blocks: int) -> None:
        #: The entries, by block id; read directly on hot paths.
        self.table: list[CacheScope | None] = [None] * num_blocks

    def assign(self, block_ids: Sequence[int], scope: CacheScope) -> None:
        """Record ``scope`` as the writer of newly handed-out blocks."""
        table = self.table
        for b in block_ids:
            table[b] = scope

    def group(
        self, block_ids: Sequence[int], *, clear: bool = False
    ) -> list[tuple[CacheScope | None, Sequence[int]]]:
        """Group block ids by owning scope, in first-seen order; ``clear`` forgets the owners.

        One owner for the whole batch is the rule (a request's blocks, a one-tenant
        cache): that case costs one C-level gather and one count, which compares by
        identity first. Otherwise blocks are grouped by object identity: every block
        of one admission holds the same scope object, and hashing a scope's nine
        fields per block would dominate the cost.
        """
        owner = self.table
        n = len(block_ids)
        if n == 0:
            return []
        first = owner[block_ids[0]]
        if n == 1 or itemgetter(*block_ids)(owner).count(first) == n:
            if clear:
                for b in block_ids:
                    owner[b] = None
            return [(first, block_ids)]
        groups: dict[int, tuple[CacheScope | None, list[int]]] = {}
        last: object = groups  # a sentinel no owner can be
        current: list[int] = []
        for b in block_ids:
            scope = owner[b]
            if scope is not last:  # runs of one owner are the rule: one identity test per block
                group = groups.get(id(scope))
                if group is None:
                    group = groups[id(scope)] = (scope, [])
                current, last = group[1], scope
            current.append(b)
            if clear:
                owner[b] = None
        return list(groups.values())

    def select(self, matches: Callable[[CacheScope], bool]) -> list[int]:
        """Every block whose owner ``matches``, ascending."""
        return [b for b, owner in enumerate(self.table) if owner is not None and matches(owner)]

    def of_tenant(self, tenant: str) -> list[int]:
        """Every block the tenant wrote (published blocks included), ascending."""
        return self.select(lambda owner: owner.tenant == tenant)

    def held(self) -> list[int]:
        """Every block that has an owner (not FREE), ascending."""
        return [b for b, owner in enumerate(self.table) if owner is not None]
