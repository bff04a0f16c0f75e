"""The retention and erasure methods of the governed cache: :class:`CacheMaintenance`.

The class is spread over two modules, as the block pool is: this one holds
what removes KV on the operator's word or the clock's (sweep, the sweeper,
purge, invalidation, secret rotation), each a thin call into
:mod:`kvgov.govern.erasure` with the cache's governor and running sequences;
:mod:`kvgov.govern.cache` holds the rest.
"""

from __future__ import annotations

from kvgov.exceptions import InvalidArgument

from . import erasure
from .governor import Governor
from .results import ErasureReport, InvalidationReport
from .sequence import NativeSequence
from .sweeper import Sweeper, check_interval

__all__ = ["CacheMaintenance"]


class CacheMaintenance:
    """Sweep, purge, invalidate, rotate: see :class:`~kvgov.govern.GovernedKVCache`.

    Not meant to be built on its own; the cache sets the attributes below.
    """

    _gov: Governor
    _seqs: dict[str, NativeSequence]
    _sweeper: Sweeper | None

    def sweep(self) -> int:
        """Evict and zeroize every cached block past its retention deadline.

        Offload tiers are swept too: objects past their deadline are deleted. The
        sweep's audit event says ``verified`` when every expired block is FREE and
        reads back as zero bytes.

        Returns:
            How many device blocks expired.
        """
        return erasure.sweep(self._gov)

    def start_sweeper(self, interval: float) -> None:
        """Run :meth:`sweep` every ``interval`` seconds on a daemon thread until :meth:`close`.

        Args:
            interval: seconds between sweeps (> 0).

        Raises:
            InvalidArgument: interval not a finite number of at least 0.01 seconds
                (``defaults.MIN_SWEEP_INTERVAL``), or a sweeper already runs.
        """
        interval = check_interval(interval)
        with self._gov.lock:
            self._gov.check_open()
            if self._sweeper is not None:
                raise InvalidArgument("interval", interval, "a sweeper already runs")
            self._sweeper = Sweeper(self, interval)
            self._sweeper.start()

    def purge_tenant(self, tenant: str) -> ErasureReport:
        """Erase a tenant from the cache (right to be forgotten).

        Every cached block the tenant wrote (including blocks it published to share groups)
        is evicted and zeroized now and read back to check it is zero; blocks still held by
        running sequences (the tenant's own, or another tenant's that reuses its public
        blocks) cannot be freed: they become unreachable by key and are zeroized when their
        last holder releases them; the tenant's running sequences will cache nothing. New
        admissions for the tenant are refused while this runs. With offload tiers, the
        tenant is crypto-shredded: its data key is destroyed first (every copy in every tier
        is unreadable from then on), then its objects are deleted; the report and the
        erasure event name the destroyed key ids and the deletions per tier. The erasure
        event is durable before this returns, written after the cache lock is released.

        Args:
            tenant: the tenant.

        Returns:
            The erasure evidence: ``verified`` only when every block the tenant
            wrote, keyed or not, is FREE now and reads back as zero bytes;
            otherwise ``held_blocks`` says how many are still held by running
            sequences (the erasure event says the same): end or cancel those
            sequences and purge again for a verified report; ``evidence``
            ``"stored"`` or ``"spooled"`` (the audit database did not answer in
            time; the event is replayed into it later).

        Raises:
            InvalidScope: tenant is not a valid identifier.
            KeyStoreUnavailable: the tenant's offload data key could not be
                destroyed (the device blocks are zeroized, the attempt is audited);
                call it again once the key store is back.
            AuditUnavailable: the erasure could not be audited (the blocks are
                zeroized all the same).
        """
        return erasure.purge_tenant(self._gov, tenant, self._seqs.values())

    def invalidate(
        self,
        *,
        model: str | None = None,
        model_revision: str | None = None,
        adapter: str | None = None,
        adapter_revision: str | None = None,
        tokenizer: str | None = None,
        tokenizer_revision: str | None = None,
        template_version: str | None = None,
    ) -> InvalidationReport:
        """Drop every block keyed under a scope matching all the given fields.

        Run it after a weight, adapter, tokenizer or template update. Fields left
        None match anything; at least one must be given. Offload tiers lose the
        objects of every matching scope this worker knows (see docs/offload.md).

        Returns:
            What was dropped; ``verified`` when every block of a matching scope is
            FREE and reads back as zero bytes, else ``held_blocks`` of them are
            still held by running sequences (zeroized at their release).

        Raises:
            InvalidArgument: no field given, or a value that is not a non-empty string.
        """
        given = (
            model,
            model_revision,
            adapter,
            adapter_revision,
            tokenizer,
            tokenizer_revision,
            template_version,
        )
        wanted = {k: v for k, v in zip(erasure.SCOPE_FILTERS, given, strict=True) if v is not None}
        return erasure.invalidate(self._gov, wanted, self._seqs.values())

    def rotate_secret(self, new_secret: bytes) -> int:
        """Switch to a new cache-key secret; every old key becomes unreachable.

        Cached blocks keyed with the old secret are evicted and zeroized; blocks
        of running sequences are unindexed and zeroized at release, and those
        sequences cache nothing more (their chains were derived with the old secret).
        Every object of the offload tiers is deleted.

        Args:
            new_secret: at least 32 bytes.

        Returns:
            Blocks evicted and zeroized now (the rotation's audit event names the
            blocks still held, ``held_blocks``, and whether the rest read back zero,
            ``verified``).

        Raises:
            KeySecretError: the new secret is too short (nothing changed).
        """
        return erasure.rotate_secret(self._gov, new_secret, self._seqs.values())
