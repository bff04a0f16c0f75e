"""What a fleet agent asks of the engine it serves: :class:`FleetTarget`, and the
native binding's adapter, :class:`NativeTarget` (``GovernedKVCache``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvgov.audit import AuditLog
from kvgov.govern.results import ErasureReport, InvalidationReport, RotationReport
from kvgov.policy import PolicyClient

__all__ = ["Done", "FleetTarget", "NativeTarget"]


@dataclass(frozen=True, slots=True)
class Done:
    """What executing an order produced: its evidence event and whether it verified.

    ``pending``: the order's effect completes later (a vLLM engine's workers zero the
    erased blocks in the step that carries them): the agent calls it at each step
    boundary until it returns the final :class:`Done` (None meanwhile), then records
    a ``fleet_order`` event (``outcome: confirmed``) naming this one's event, and the
    result.
    """

    event_id: str | None
    verified: bool | None
    detail: Mapping[str, Any] = field(default_factory=dict)
    pending: Callable[[], Done | None] | None = None


class FleetTarget(Protocol):
    """An engine a fleet agent governs: identity, state, and the four operations.

    Every operation runs on the engine's own thread at a step boundary and writes its
    audit event with ``details.order_id``.
    """

    @property
    def kind(self) -> str:
        """``native`` or ``vllm``."""

    @property
    def audit(self) -> AuditLog:
        """The engine's audit log (its stream is the engine's evidence)."""

    @property
    def policy(self) -> PolicyClient:
        """The engine's policy client (its revision keys the decision cache)."""

    def key_id(self) -> str:
        """The public name of the engine's cache-key secret."""

    def purge(self, tenant: str, order_id: str) -> Done:
        """Erase a tenant."""

    def invalidate(self, wanted: Mapping[str, str], order_id: str) -> Done:
        """Drop every block of a matching scope."""

    def rotate_secret(self, secret: bytes, order_id: str) -> Done:
        """Switch the cache-key secret."""


def _erasure(report: ErasureReport | InvalidationReport | RotationReport) -> Done:
    detail = {
        "blocks_zeroized": report.blocks_zeroized,
        "held_blocks": report.held_blocks,
        "detached_blocks": report.detached_blocks,
    }
    return Done(report.event_id, report.verified, detail)


class NativeTarget:
    """A ``GovernedKVCache`` as a fleet target.

    Args:
        cache: the cache (a ``GovernedKVCache``; typed loosely so that this module does
            not import the cache module, which imports nothing of the fleet either).
    """

    kind = "native"

    def __init__(self, cache: Any) -> None:
        self._cache = cache

    @property
    def audit(self) -> AuditLog:
        """The cache's audit log."""
        audit: AuditLog = self._cache.audit
        return audit

    @property
    def policy(self) -> PolicyClient:
        """The cache's policy client."""
        policy: PolicyClient = self._cache.policy
        return policy

    def key_id(self) -> str:
        """The cache-key secret's public name."""
        return str(self._cache.governor.deriver.key_id)

    def purge(self, tenant: str, order_id: str) -> Done:
        """``GovernedKVCache.purge_tenant`` with the order id."""
        return _erasure(self._cache.purge_tenant(tenant, order_id=order_id))

    def invalidate(self, wanted: Mapping[str, str], order_id: str) -> Done:
        """``GovernedKVCache.invalidate`` with the order id."""
        return _erasure(self._cache.invalidate(**dict(wanted), order_id=order_id))

    def rotate_secret(self, secret: bytes, order_id: str) -> Done:
        """``GovernedKVCache.rotate_secret_report`` with the order id."""
        return _erasure(self._cache.rotate_secret_report(secret, order_id=order_id))
