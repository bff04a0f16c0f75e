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

from . import native
from .scope import CacheScope

__all__ = ["Owners", "assign_unowned", "group"]


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
        native.assign(self.table, block_ids, scope)

    def assign_unowned(self, block_ids: Sequence[int], scope: CacheScope) -> list[int]:
        """Record ``scope`` as the writer of the blocks among ``block_ids`` without one.

        Returns those blocks, in order (chosen before any is set). Compiled where
        :data:`kvgov.govern.native.NATIVE_BLOCKS` (:func:`assign_unowned` is the pure loop).

        Raises:
            IndexError: an id is not a block of the table (the compiled path sets none;
                it also refuses a negative id, which the pure loop would index from
                the end).
        """
        blocks = native.blocks
        if blocks is not None:
            new: list[int] = blocks.assign_unowned(self.table, block_ids, scope)
            return new
        return assign_unowned(self.table, block_ids, scope)

    def group(
        self, block_ids: Sequence[int], *, clear: bool = False
    ) -> list[tuple[CacheScope | None, Sequence[int]]]:
        """Group block ids by owning scope, in first-seen order; ``clear`` forgets the owners.

        Compiled where :data:`kvgov.govern.native.NATIVE_BLOCKS`; :func:`group` is the
        pure loop and its specification.
        """
        blocks = native.blocks
        if blocks is not None:
            groups: list[tuple[CacheScope | None, Sequence[int]]] = blocks.group(
                self.table, block_ids, clear
            )
            return groups
        return group(self.table, block_ids, clear=clear)

    def select(self, matches: Callable[[CacheScope], bool]) -> list[int]:
        """Every block whose owner ``matches``, ascending."""
        return [b for b, owner in enumerate(self.table) if owner is not None and matches(owner)]

    def of_tenant(self, tenant: str) -> list[int]:
        """Every block the tenant wrote (published blocks included), ascending."""
        return self.select(lambda owner: owner.tenant == tenant)

    def held(self) -> list[int]:
        """Every block that has an owner (not FREE), ascending."""
        return [b for b, owner in enumerate(self.table) if owner is not None]


def assign_unowned(
    table: list[CacheScope | None], block_ids: Sequence[int], scope: CacheScope
) -> list[int]:
    """:meth:`Owners.assign_unowned` in Python: the specification of the compiled path."""
    if not block_ids:
        return []
    got = itemgetter(*block_ids)(table) if len(block_ids) > 1 else (table[block_ids[0]],)
    new = (
        list(block_ids)
        if got.count(None) == len(block_ids)
        else [b for b, owner in zip(block_ids, got, strict=True) if owner is None]
    )
    for b in new:
        table[b] = scope
    return new


def group(
    table: list[CacheScope | None], block_ids: Sequence[int], *, clear: bool = False
) -> list[tuple[CacheScope | None, Sequence[int]]]:
    """:meth:`Owners.group` in Python: the specification of the compiled path.

    One owner for the whole batch is the rule (a request's blocks, a one-tenant
    cache): that case costs one C-level gather and one count, which compares by
    identity first, and its group holds ``block_ids`` itself. Otherwise blocks are
    grouped by object identity: every block of one admission holds the same scope
    object, and hashing a scope's nine fields per block would dominate the cost.
    """
    n = len(block_ids)
    if n == 0:
        return []
    first = table[block_ids[0]]
    if n == 1 or itemgetter(*block_ids)(table).count(first) == n:
        if clear:
            for b in block_ids:
                table[b] = None
        return [(first, block_ids)]
    groups: dict[int, tuple[CacheScope | None, list[int]]] = {}
    last: object = groups  # a sentinel no owner can be
    current: list[int] = []
    for b in block_ids:
        scope = table[b]
        if scope is not last:  # runs of one owner are the rule: one identity test per block
            entry = groups.get(id(scope))
            if entry is None:
                entry = groups[id(scope)] = (scope, [])
            current, last = entry[1], scope
        current.append(b)
        if clear:
            table[b] = None
    return list(groups.values())
