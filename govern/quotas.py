"""Eviction as policy: each tenant's KV cache floor and cap, and how long a
priority lasts, read from the policy and held in the governor's ledger
(:class:`EvictionRules`).

The policy's data says them (``kvgov/eviction/decision``, see
``policy/rego/eviction.rego`` and docs/policy.md); :func:`resolve` turns them
into blocks of one pool and validates them: a malformed entry, a floor above its
cap, or floors that add up to more than the pool raise
:class:`~kvgov.exceptions.InvalidQuota` and change nothing. The governor reads
them at start and again whenever the bundle's revision changes
(:meth:`~kvgov.govern.governor.Governor.sync_eviction`), and hands the quotas
to a pool that enforces them (:class:`~kvgov.govern.protocol.QuotaPool`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvgov.allocator import Quota
from kvgov.allocator.quota import check_quotas
from kvgov.exceptions import InvalidQuota
from kvgov.policy import EvictionSettings

__all__ = ["EvictionRules", "resolve"]


@dataclass(frozen=True, slots=True)
class EvictionRules:
    """The eviction settings in force, in blocks of the governed pool.

    Attributes:
        quotas: tenant -> its floor and cap (tenants with neither are absent).
        durations: tenant -> seconds its blocks' priority lasts before it decays.
        revision: the policy bundle revision they were read from (None: never read).
    """

    quotas: Mapping[str, Quota] = field(default_factory=dict)
    durations: Mapping[str, float] = field(default_factory=dict)
    revision: str | None = None


def resolve(settings: EvictionSettings, num_blocks: int, revision: str) -> EvictionRules:
    """The policy's eviction settings for a pool of ``num_blocks`` blocks.

    Args:
        settings: what the policy said (:meth:`~kvgov.policy.PolicyClient.eviction`).
        num_blocks: the governed pool's size.
        revision: the bundle revision they come from.

    Returns:
        The rules, validated.

    Raises:
        InvalidQuota: the policy reported errors (malformed data, or it could not
            be evaluated), a floor is above its cap, or the floors add up to more
            than the pool.
    """
    if settings.errors:
        raise InvalidQuota(None, "; ".join(settings.errors))
    quotas: dict[str, Quota] = {}
    durations: dict[str, float] = {}
    for tenant, t in settings.tenants.items():
        if t.floor is not None or t.cap is not None:
            quotas[tenant] = Quota(
                floor=t.floor.resolve(num_blocks) if t.floor is not None else 0,
                cap=t.cap.resolve(num_blocks) if t.cap is not None else None,
            )
        if t.priority_duration is not None:
            durations[tenant] = t.priority_duration
    return EvictionRules(check_quotas(quotas, num_blocks), durations, revision)
