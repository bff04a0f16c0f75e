"""Open the parts every binding's governor needs: key deriver, policy client, audit log,
and the offload tiers when configured.

One place builds them for :meth:`GovernedKVCache.create` and for the vLLM
binding, so both read the secret, load the bundle and open the audit store the
same way, and both close what was opened when a later step fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgov.audit import AuditLog
from kvgov.audit.writer import WriterKind
from kvgov.policy import PolicyClient

from .keys import KeyDeriver, keychain_setting, load_key_secret
from .offload_config import OffloadConfig, open_offloading
from .offloading import Offloading

__all__ = ["GovernorParts", "close_parts", "open_parts"]


@dataclass(frozen=True, slots=True)
class GovernorParts:
    """The opened parts of a governor (the pool comes from the binding).

    Attributes:
        deriver: the key deriver holding the secret.
        policy: the policy client.
        audit: the audit log.
        offload: the offload tiers, or None without them.
    """

    deriver: KeyDeriver
    policy: PolicyClient
    audit: AuditLog
    offload: Offloading | None = None

    def close(self) -> None:
        """Close the audit log, the policy client and the tiers (a failed build's clean-up)."""
        close_parts(self.audit, self.policy, self.offload)


def close_parts(audit: AuditLog, policy: PolicyClient, offload: Offloading | None) -> None:
    """Close the audit log, then the policy client and the tiers, even if one raises."""
    try:
        audit.close()
    finally:
        try:
            policy.close()
        finally:
            if offload is not None:
                offload.close()


def open_parts(
    *,
    policy_dir: str | os.PathLike[str] | None,
    policy_data: Mapping[str, Any] | None,
    audit_url: str,
    key_secret: bytes | None,
    ephemeral_secret: bool,
    clock: Callable[[], float],
    worker_id: str | None,
    policy_engine: Any,
    offload: OffloadConfig | None = None,
    audit_writer: WriterKind = "thread",
) -> GovernorParts:
    """Read the key secret, load the policy bundle, open the audit log and the tiers.

    Args are those of :meth:`kvgov.govern.GovernedKVCache.create`, and ``audit_writer``:
    where the audit log seals and stores (``AuditLog``'s ``writer``).

    Raises:
        KeySecretError: no usable secret.
        InvalidArgument: ``KVGOV_KEYCHAIN`` is not auto, native or python, or is native
            where the compiled key chain is not installed.
        PolicyLoadError: the policy bundle does not load or its tests fail.
        AuditSchemaError: the audit database needs ``kvgov db upgrade``.
        KEKError: offload is configured without a usable key-encryption key.
        InvalidArgument: a bad offload configuration.
    """
    deriver = KeyDeriver(
        load_key_secret(key_secret, ephemeral=ephemeral_secret, environ=dict(os.environ)),
        implementation=keychain_setting(os.environ),
    )
    policy = PolicyClient.create(
        policy_dir=None if policy_dir is None else Path(policy_dir),
        policy_data=policy_data,
        engine=policy_engine,
    )
    try:
        audit = AuditLog(audit_url, worker_id=worker_id, clock=clock, writer=audit_writer)
    except BaseException:
        policy.close()
        raise
    parts = GovernorParts(deriver=deriver, policy=policy, audit=audit)
    if offload is None:
        return parts
    try:  # after the audit log: it brings the key table's schema up to date
        tiers = open_offloading(offload, audit_url=audit_url, clock=clock)
    except BaseException:
        parts.close()
        raise
    return GovernorParts(deriver=deriver, policy=policy, audit=audit, offload=tiers)
