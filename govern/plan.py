"""How one admission's blocks are keyed: :class:`KeyPlan` and :func:`plan_keys`.

::

    tokens: |<- public prefix (whole blocks) ->|<------ the rest ------>|<- tail ->|
    keys:    P0 = H(proot)  P1 = H(P0)          R2 = H(C)   R3 = H(R2)   (none)
             keyed under the scope with          C = continuation_root(root, P1):
             classification "public", in the     keyed under the scope itself, in
             namespace that scope publishes in   its own publish namespace

Without a public prefix every full block chains from the scope's publish root.
A scope whose retention is 0 seconds may keep nothing: its plan keys nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgov.policy import Decision, PolicyClient

from .keys import CacheKey, KeyDeriver, continuation_root
from .views import PUBLIC, ScopeView, ScopeViews

__all__ = ["PUBLIC", "KeyPlan", "plan_keys", "unkeyed_plan"]


@dataclass(slots=True)
class KeyPlan:
    """The geometry of one admission and how its full blocks are keyed.

    Attributes:
        num_tokens: prompt tokens.
        num_full: full blocks (the ones that get keys).
        num_blocks: blocks the prompt needs, the partial tail included.
        max_hit: the most leading blocks a hit may cover: one prompt token is
            always left to compute, as vLLM does (the caller needs its logits,
            and must never write into a shared block).
        root: namespace root of the scope's own blocks (its tenant's, or its
            publish group's).
        rest_parent: parent of the first block after the public prefix (the
            root without one).
        read_roots: the other namespaces the scope may look up in.
        keys: one key per full block; empty when nothing may be cached.
        prefix_blocks: leading blocks keyed under the public prefix scope.
        prefix_view: that scope, or None without a public prefix.
        prefix_ttl: its retention in seconds.
        ttl: retention of the rest in seconds; None: nothing may be cached.
        prefix_read_roots: the other namespaces the prefix scope may read.
        failed: the retention and share-group decisions that failed closed (an
            engine error), for the governor to audit.
    """

    num_tokens: int
    num_full: int
    num_blocks: int
    max_hit: int
    root: bytes
    rest_parent: bytes
    read_roots: tuple[bytes, ...] = ()
    keys: list[CacheKey] = field(default_factory=list)
    prefix_blocks: int = 0
    prefix_view: ScopeView | None = None
    prefix_ttl: float | None = None
    ttl: float | None = None
    prefix_read_roots: tuple[bytes, ...] = ()
    failed: list[Decision] = field(default_factory=list)

    @property
    def cacheable(self) -> bool:
        """Whether the admission's full blocks are keyed and may be cached."""
        return self.ttl is not None

    def last_parent(self) -> bytes:
        """The parent the first block of decode growth chains from."""
        if self.ttl is not None and self.num_full > self.prefix_blocks:
            return self.keys[self.num_full - 1]
        return self.rest_parent


def unkeyed_plan(view: ScopeView, num_tokens: int, block_size: int) -> KeyPlan:
    """The plan of an admission that caches nothing (the policy said ``cache: false``)."""
    num_full, max_hit, num_blocks = _geometry(num_tokens, block_size)
    return KeyPlan(num_tokens, num_full, num_blocks, max_hit, view.own_root, view.own_root)


def plan_keys(
    policy: PolicyClient,
    views: ScopeViews,
    deriver: KeyDeriver,
    view: ScopeView,
    packed: bytes,
    block_size: int,
    public_prefix_tokens: int,
) -> KeyPlan:
    """Decide the namespaces, retention and keys of a cacheable admission.

    Args:
        policy: asked for retention (and, through ``views``, share groups).
        views: scope views and namespaces.
        deriver: derives the key chains.
        view: the admitted scope.
        packed: the prompt's packed tokens.
        block_size: tokens per block.
        public_prefix_tokens: leading tokens that are public.

    Returns:
        The plan; its ``ttl`` is None when retention allows nothing to be kept.
    """
    num_tokens = len(packed) // 4
    num_full, max_hit, num_blocks = _geometry(num_tokens, block_size)
    failed: list[Decision] = []
    root, read_roots, ttl = _namespaces_and_ttl(policy, views, view, failed)
    plan = KeyPlan(num_tokens, num_full, num_blocks, max_hit, root, root, failed=failed)
    if ttl <= 0:  # nothing may be kept: key nothing
        return plan
    plan.read_roots, plan.ttl = read_roots, ttl
    derive = deriver.derive_chain
    prefix_blocks = min(public_prefix_tokens // block_size, num_full)
    if prefix_blocks:
        pview = views.public(view)
        proot, prefix_read_roots, pttl = _namespaces_and_ttl(policy, views, pview, failed)
        if pttl > 0:
            prefix_keys = derive(proot, packed, pview.digest, block_size, prefix_blocks)
            plan.rest_parent = continuation_root(root, prefix_keys[-1])
            rest = derive(
                plan.rest_parent,
                packed,
                view.digest,
                block_size,
                num_full - prefix_blocks,
                first=prefix_blocks,
            )
            plan.keys = prefix_keys + rest
            plan.prefix_blocks, plan.prefix_view = prefix_blocks, pview
            plan.prefix_ttl, plan.prefix_read_roots = pttl, prefix_read_roots
            return plan
    plan.keys = derive(root, packed, view.digest, block_size, num_full)
    return plan


def _namespaces_and_ttl(
    policy: PolicyClient, views: ScopeViews, view: ScopeView, failed: list[Decision]
) -> tuple[bytes, tuple[bytes, ...], float]:
    """A scope's publish root, readable roots and retention; failed decisions go to ``failed``."""
    root, read_roots, groups = views.namespaces(view)
    retention = policy.retention(view.fields)
    for decision in (groups, retention.decision):
        if decision.error is not None:
            failed.append(decision)
    return root, read_roots, float(retention.ttl_seconds)


def _geometry(num_tokens: int, block_size: int) -> tuple[int, int, int]:
    """Full blocks, the most leading blocks a hit may cover, and blocks needed."""
    max_hit = (num_tokens - 1) // block_size if num_tokens else 0
    return num_tokens // block_size, max_hit, -(-num_tokens // block_size)
