"""``OffloadStore``: ordered tiers, tenant keys and the checks, behind the calls a governor makes.

::

    offload(key, digest, tenant, deadline, payload, tiers=allowed)
      data key of tenant (created, wrapped, recorded on first use)
      for each tier, in order:  not allowed? -> NOT_ALLOWED   down? -> UNAVAILABLE
                                seal (AAD binds tier, key, digest, tenant, deadline)
                                tier.put -> STORED (LRU evictions counted)
    restore(key, digest, tenant, into=None)
      for each tier, in order:  tier.get finds nothing                -> next tier
                                header names another key, scope, tenant -> MISBOUND
                                its deadline has passed                 -> EXPIRED
                                older than the replay floor             -> REPLAYED
                                its data key is destroyed               -> KEY_DESTROYED
                                its data key is another tenant's        -> MISBOUND
                                AES-GCM does not open it                -> TAMPERED
                                otherwise                               -> Restored
      a refused object is reported and (unless MISBOUND) deleted; the next tier is tried

A tier that fails (Redis down, disk full) raises ``TierUnavailable``: the store logs
it once, counts it, skips the tier for ``retry_seconds`` (longer after failures in a
row: exponential backoff with jitter) and carries on with the others (or none). It
never stores plaintext in place of ciphertext: sealing happens before any tier is
called, and a tier only ever receives sealed blocks.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import structlog

from kvgov.defaults import DATA_KEY_RECHECK_SECONDS, TIER_RETRY_MAX_SECONDS, TIER_RETRY_SECONDS
from kvgov.exceptions import (
    InvalidOffloadArgument,
    KeyStoreUnavailable,
    ObjectCorrupt,
    ObjectMisbound,
    ObjectRefused,
    ObjectTampered,
    TierUnavailable,
    UnknownTier,
)
from kvgov.retry import Backoff

from .crypto import open_sealed, seal
from .keys import DataKeyRing, KeyProvider, WrappedKeyStore
from .objects import FORMAT_VERSION, TAG_BYTES, ObjectInfo, SealedBlock, encoded_nbytes
from .payload import Sink, readable, writable
from .replay import ReplayFloor
from .results import (
    REFUSAL_REASONS,
    DeleteReport,
    MissReason,
    OffloadResult,
    OffloadStats,
    PutOutcome,
    Refusal,
    Restored,
    RestoreMiss,
    ShredReport,
    TierPut,
    TierStats,
)
from .tier import Tier, put_copies

__all__ = ["OffloadStore"]

_log = structlog.get_logger("kvgov.offload")

#: Longest tenant name accepted, in characters (as a scope field).
MAX_TENANT_CHARS = 256
#: Largest payload one object may hold (AES-GCM in ``cryptography`` takes < 2**31 bytes).
MAX_PAYLOAD_BYTES = 2**31 - 1 - TAG_BYTES
#: Seal buffers a store keeps for reuse, and the largest it keeps (a larger object is
#: sealed into a buffer of its own, dropped after its put).
SEAL_BUFFERS_KEPT = 4
SEAL_BUFFER_MAX_BYTES = 64 << 20
#: Seal buffers are allocated in multiples of this, so that objects of one payload size
#: whose headers differ a little in length (tenant names) share them.
_SEAL_BUFFER_STEP = 64 << 10


class _SealBuffers:
    """Buffers to seal objects into for the tiers whose ``put`` copies the bytes out.

    A new block-sized buffer is fresh memory whose pages the kernel faults in and
    zeroes as they are first written: about 1 ms for a 2.25 MiB block on the machine
    of docs/fleet-kv.md#benchmark, four times AES-GCM over it. So a buffer is taken
    for one object and given back once its tier has copied the object out
    (:func:`~kvgov.offload.tier.put_copies`). It only ever holds sealed objects
    (header and ciphertext: what the tier stores anyway), never plaintext. At most
    :data:`SEAL_BUFFERS_KEPT` are kept, the largest ones. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[bytearray] = []

    def take(self, nbytes: int) -> bytearray:
        """A buffer of at least ``nbytes``: the smallest kept one that fits, or a new one."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if len(b) >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda i: len(self._free[i])))
        return bytearray(-(-nbytes // _SEAL_BUFFER_STEP) * _SEAL_BUFFER_STEP)

    def give(self, buf: bytearray) -> None:
        """Keep ``buf`` for a later object (nothing uses the object it held any more)."""
        if len(buf) > SEAL_BUFFER_MAX_BYTES:
            return
        with self._lock:
            self._free.append(buf)
            if len(self._free) > SEAL_BUFFERS_KEPT:
                self._free.pop(min(range(len(self._free)), key=lambda i: len(self._free[i])))


@dataclass(slots=True)
class _TierState:
    """One tier's health and counters; changed under the store's lock only."""

    tier: Tier
    #: When the tier is tried again after failures in a row (kvgov.retry: exponential
    #: backoff with jitter, on the store's clock); ``failures == 0`` while it is healthy.
    backoff: Backoff
    puts: int = 0
    put_bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expired: int = 0
    deleted: int = 0
    unavailable: int = 0
    decrypt_failures: int = 0
    refusals: Counter[str] = field(default_factory=Counter)


def _check_bytes(name: str, value: object) -> bytes:
    if not isinstance(value, bytes) or not 0 < len(value) < 256:
        raise InvalidOffloadArgument(name, value, "must be bytes of length 1..255")
    return value


def _check_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not 0 < len(tenant) <= MAX_TENANT_CHARS:
        raise InvalidOffloadArgument(
            "tenant", tenant, f"must be a non-empty string of at most {MAX_TENANT_CHARS} chars"
        )
    return tenant


class OffloadStore:
    """Encrypted KV offload over ordered tiers (fastest first), with per-tenant keys.

    Thread-safe. Several stores (workers) may share a tier (Redis) and a key store:
    each seals under the same tenant data keys, so one restores what another
    offloaded, for the same block key, scope digest and tenant only.

    Args:
        tiers: the tiers, in lookup order (say host, disk, Redis); names must differ.
        key_store: where wrapped data keys live (``kvgov.audit.SqlWrappedKeyStore``).
        kek: the key-encryption key (``LocalKEK.from_env()``, or a KMS provider).
        clock: seconds since the epoch; deadlines and ``sweep`` read it.
        retry_seconds: how long a failed tier is skipped before it is tried again, at
            least; doubled per failure in a row up to ``retry_max_seconds``, plus up to
            half as much again at random (:class:`kvgov.retry.Backoff`).
        retry_max_seconds: the longest skip before jitter.
        key_recheck_seconds: how long an unwrapped data key is trusted before its state
            is read again (the delay before a shred on another worker takes effect here).

    Raises:
        InvalidOffloadArgument: no tiers, or two with one name.
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        key_store: WrappedKeyStore,
        kek: KeyProvider,
        *,
        clock: Callable[[], float] = time.time,
        retry_seconds: float = TIER_RETRY_SECONDS,
        retry_max_seconds: float = TIER_RETRY_MAX_SECONDS,
        key_recheck_seconds: float = DATA_KEY_RECHECK_SECONDS,
    ) -> None:
        names = [t.name for t in tiers]
        if not names:
            raise InvalidOffloadArgument("tiers", [], "give at least one tier")
        if len(set(names)) != len(names):
            raise InvalidOffloadArgument("tiers", names, "tier names must differ")
        self._states = {
            t.name: _TierState(t, Backoff(retry_seconds, retry_max_seconds, clock=clock))
            for t in tiers
        }
        self._keys = DataKeyRing(key_store, kek, clock=clock, recheck_seconds=key_recheck_seconds)
        self._clock = clock
        self._floor = ReplayFloor()
        self._lock = threading.Lock()
        self._last_written_us = 0
        self._buffers = _SealBuffers()

    @property
    def tier_names(self) -> tuple[str, ...]:
        """The tiers' names, in lookup order."""
        return tuple(self._states)

    # ------------------------------------------------------------------ health

    def _usable(self, st: _TierState, now: float) -> bool:
        with self._lock:
            if st.backoff.ready(now):
                return True
            st.unavailable += 1
            return False

    def _failed(self, st: _TierState, exc: TierUnavailable | KeyStoreUnavailable) -> None:
        with self._lock:
            first = st.backoff.failures == 0
            wait = st.backoff.failed()
            st.unavailable += 1
            up = [n for n, s in self._states.items() if s.backoff.failures == 0]
        if first:
            _log.warning(
                "offload tier unavailable",
                tier=st.tier.name,
                reason=str(exc),
                retry_in_s=round(wait, 3),
                continuing_with=up,
            )

    def _ok(self, st: _TierState) -> None:
        if st.backoff.failures == 0:
            return
        with self._lock:
            st.backoff.succeeded()
        _log.warning("offload tier available again", tier=st.tier.name)

    # ------------------------------------------------------------------ offload

    def offload(
        self,
        block_key: bytes,
        scope_digest: bytes,
        tenant: str,
        deadline: float,
        payload: object,
        *,
        tiers: Collection[str] | None = None,
    ) -> OffloadResult:
        """Seal a block under the tenant's data key and store it in each allowed tier.

        Each tier gets its own sealing (the tier name is in the AAD), so a copy cannot
        be moved from one tier to another.

        Args:
            block_key: the block's cache key (1..255 bytes).
            scope_digest: its scope digest (1..255 bytes).
            tenant: the owner tenant, whose data key seals it.
            deadline: retention deadline, seconds since the epoch; it travels with every
                copy (and becomes the Redis TTL).
            payload: the KV bytes: bytes-like, or a tensor (a GPU tensor is copied to host).
            tiers: the tier names the offload policy allowed; None allows every tier.

        Returns:
            One :class:`~kvgov.offload.TierPut` per tier, in tier order.

        Raises:
            InvalidOffloadArgument: a malformed argument or a payload of 2 GiB or more.
            UnknownTier: ``tiers`` names a tier this store does not have.
            KEKError: the tenant's key was wrapped by another KEK.
            DataKeyDestroyed: the tenant was shredded while this offload ran (the
                governor refuses a purging tenant's work first).
        """
        _check_bytes("block_key", block_key)
        _check_bytes("scope_digest", scope_digest)
        _check_tenant(tenant)
        for name in tiers or ():
            if name not in self._states:
                raise UnknownTier(name, self.tier_names)
        view = readable(payload)
        if len(view) > MAX_PAYLOAD_BYTES:
            raise InvalidOffloadArgument("payload", f"<{len(view)} bytes>", "must be under 2 GiB")
        now = self._clock()
        now_us, deadline_us = int(now * 1e6), _deadline_us(deadline)
        nbytes = encoded_nbytes(block_key, scope_digest, tenant, len(view))
        allowed = [tiers is None or n in tiers for n in self._states]
        if deadline_us <= now_us:
            return self._uniform(PutOutcome.EXPIRED, allowed)
        try:
            key = self._keys.sealing_key(tenant)
        except KeyStoreUnavailable as exc:
            _log.warning("offload key store unavailable; nothing offloaded", reason=exc.reason)
            return self._uniform(PutOutcome.UNAVAILABLE, allowed)
        written_us = self._next_written_us(now_us)
        puts = []
        for ok, st in zip(allowed, self._states.values(), strict=True):
            name = st.tier.name
            if not ok:
                puts.append(TierPut(name, PutOutcome.NOT_ALLOWED, 0, 0))
            elif nbytes > st.tier.capacity_bytes:
                puts.append(TierPut(name, PutOutcome.TOO_LARGE, 0, 0))
            elif not self._usable(st, now):
                puts.append(TierPut(name, PutOutcome.UNAVAILABLE, 0, 0))
            else:
                # a tier that copies the object out gets it in a reused buffer, given back
                # after its put; one that keeps the object (host memory), in its own
                buffer = self._buffers.take(nbytes) if put_copies(st.tier) else None
                try:
                    obj = seal(
                        key,
                        tier=name,
                        block_key=block_key,
                        scope_digest=scope_digest,
                        deadline_us=deadline_us,
                        written_us=written_us,
                        payload=view,
                        buffer=buffer,
                    )
                    puts.append(self._put(st, obj, now_us))
                finally:
                    if buffer is not None:
                        self._buffers.give(buffer)
        return OffloadResult(tuple(puts), key.key_id.hex())

    def _put(self, st: _TierState, obj: SealedBlock, now_us: int) -> TierPut:
        try:
            evicted = st.tier.put(obj, now_us)
        except TierUnavailable as exc:
            self._failed(st, exc)
            return TierPut(st.tier.name, PutOutcome.UNAVAILABLE, 0, 0)
        self._ok(st)
        self._floor.raise_to(st.tier.name, obj.block_key, obj.written_us, obj.deadline_us)
        with self._lock:
            st.puts += 1
            st.put_bytes += obj.nbytes
            st.evictions += len(evicted)
        return TierPut(st.tier.name, PutOutcome.STORED, obj.nbytes, len(evicted))

    def _uniform(self, outcome: PutOutcome, allowed: list[bool]) -> OffloadResult:
        puts = (
            TierPut(n, outcome if ok else PutOutcome.NOT_ALLOWED, 0, 0)
            for ok, n in zip(allowed, self._states, strict=True)
        )
        return OffloadResult(tuple(puts), None)

    def _next_written_us(self, now_us: int) -> int:
        with self._lock:
            self._last_written_us = max(now_us, self._last_written_us + 1)
            return self._last_written_us

    # ------------------------------------------------------------------ restore

    def restore(
        self, block_key: bytes, scope_digest: bytes, tenant: str, *, into: object = None
    ) -> Restored | RestoreMiss:
        """Find the block in the tiers, in order, and return it verified and decrypted.

        Args:
            block_key: the block's cache key.
            scope_digest: the scope digest the requester's block must have.
            tenant: the tenant whose data key must have sealed it.
            into: optionally, a writable buffer or contiguous tensor of exactly the
                payload's size to decrypt into (a device block, a pinned staging buffer);
                it is zeroed again if a refused object was decrypted into it.

        Returns:
            :class:`~kvgov.offload.Restored` (tier, payload, refusals met on the way), or
            :class:`~kvgov.offload.RestoreMiss` (reason, refusals). Refusals are to be
            audited by the caller.

        Raises:
            InvalidOffloadArgument: a malformed argument, or ``into`` is not the size
                of the (authentic) payload.
        """
        _check_bytes("block_key", block_key)
        _check_bytes("scope_digest", scope_digest)
        _check_tenant(tenant)
        sink = None if into is None else writable(into)
        now = self._clock()
        now_us = int(now * 1e6)
        refusals: list[Refusal] = []
        seen: set[MissReason] = set()
        for st in self._states.values():
            name = st.tier.name
            if not self._usable(st, now):
                seen.add(MissReason.UNAVAILABLE)
                continue
            try:
                obj = st.tier.get(block_key)
                self._ok(st)
                if obj is None:
                    self._count(st, "misses")
                    continue
                payload = self._open(name, obj, block_key, scope_digest, tenant, now_us, sink)
            except TierUnavailable as exc:
                self._failed(st, exc)
                seen.add(MissReason.UNAVAILABLE)
                continue
            except KeyStoreUnavailable as exc:
                _log.warning("offload key store unavailable; restore misses", reason=exc.reason)
                self._count(st, "misses")
                seen.add(MissReason.UNAVAILABLE)
                continue
            except ObjectRefused as exc:
                refusals.append(self._refuse(st, exc))
                continue
            if payload is None:
                self._count(st, "expired")
                self._count(st, "misses")
                self._delete_quietly(st, block_key)
                seen.add(MissReason.EXPIRED)
                continue
            self._floor.raise_to(name, block_key, obj.written_us, obj.deadline_us)
            self._count(st, "hits")
            if sink is not None:
                sink.finish()
            return Restored(name, payload, obj.key_id.hex(), tuple(refusals))
        return RestoreMiss(_summary(refusals, seen), tuple(refusals))

    def _open(
        self,
        tier: str,
        obj: SealedBlock,
        block_key: bytes,
        scope_digest: bytes,
        tenant: str,
        now_us: int,
        sink: Sink | None,
    ) -> bytes | memoryview | None:
        """Check and decrypt one object; None if it has expired. Raises ``ObjectRefused``."""
        if obj.format_version != FORMAT_VERSION:
            raise ObjectCorrupt(tier, block_key, f"format version {obj.format_version} is unknown")
        if obj.block_key != block_key:
            raise ObjectMisbound(tier, block_key, "it is stored under this key but names another")
        if obj.scope_digest != scope_digest:
            raise ObjectMisbound(tier, block_key, "it was sealed for another scope")
        if obj.tenant != tenant:
            raise ObjectMisbound(tier, block_key, "it was sealed for another tenant")
        if obj.deadline_us <= now_us:
            return None
        self._floor.check(tier, block_key, obj.written_us)
        key = self._keys.opening_key(tenant, obj.key_id, tier=tier, block_key=block_key)
        if sink is not None and len(sink.view) != obj.payload_bytes:
            # authenticate first: a truncated object is a refusal, not the caller's mistake;
            # into a scratch buffer that is zeroed after, so no plaintext is left behind
            scratch = memoryview(bytearray(obj.payload_bytes))
            try:
                open_sealed(
                    key,
                    obj,
                    tier=tier,
                    block_key=block_key,
                    scope_digest=scope_digest,
                    into=scratch,
                )
            finally:
                scratch[:] = bytes(len(scratch))
            raise InvalidOffloadArgument(
                "into", f"<{len(sink.view)} bytes>", f"the block holds {obj.payload_bytes} bytes"
            )
        view = None if sink is None else sink.view
        return open_sealed(
            key, obj, tier=tier, block_key=block_key, scope_digest=scope_digest, into=view
        )

    def _refuse(self, st: _TierState, exc: ObjectRefused) -> Refusal:
        with self._lock:
            st.refusals[exc.reason] += 1
            st.misses += 1
            if isinstance(exc, ObjectTampered):
                st.decrypt_failures += 1
        _log.warning(
            "offloaded object refused", tier=exc.tier, reason=exc.reason, detail=exc.detail
        )
        if not isinstance(exc, ObjectMisbound):
            # provably bad for everyone; a misbound object may be another tenant's or
            # scope's genuine block (a share group's key), which this requester may not
            # have but must not be able to delete either
            self._delete_quietly(st, exc.block_key)
        return Refusal(st.tier.name, MissReason(exc.reason), exc.detail)

    def _delete_quietly(self, st: _TierState, block_key: bytes) -> None:
        try:
            st.tier.delete(block_key)
        except TierUnavailable as exc:
            self._failed(st, exc)

    def _count(self, st: _TierState, counter: str, n: int = 1) -> None:
        with self._lock:
            setattr(st, counter, getattr(st, counter) + n)

    # ------------------------------------------------------------------ erasure, retention

    def delete(self, block_key: bytes) -> DeleteReport:
        """Delete a block's copies from every tier (replays of them are refused afterwards)."""
        _check_bytes("block_key", block_key)

        def one(tier: Tier) -> list[ObjectInfo]:
            info = tier.delete(block_key)
            return [] if info is None else [info]

        return self._delete_each(one, floor=True)

    def delete_by_tenant(self, tenant: str) -> DeleteReport:
        """Delete every object of ``tenant`` from every tier (its key stays: see :meth:`shred`)."""
        _check_tenant(tenant)
        return self._delete_each(lambda t: t.delete_by_tenant(tenant), floor=True)

    def delete_where(self, predicate: Callable[[ObjectInfo], bool]) -> DeleteReport:
        """Delete every object whose info satisfies ``predicate`` (invalidation by scope digest).

        Example: ``store.delete_where(lambda info: info.scope_digest in stale_digests)``.
        """
        return self._delete_each(lambda t: t.delete_where(predicate), floor=True)

    def shred(self, tenant: str) -> ShredReport:
        """Crypto-shred a tenant: destroy its data key first, then delete its objects.

        Once the key is destroyed every copy in every tier (replicas, disk remnants,
        backups of Redis) is unreadable at once, on this worker immediately and on the
        others within their ``key_recheck_seconds``; deleting the objects afterwards
        frees the space. A tier that cannot be reached is listed in the report.

        Returns:
            The destroyed key ids (evidence for the erasure report) and deletions per tier.

        Raises:
            KeyStoreUnavailable: the key could not be destroyed; nothing was claimed.
        """
        _check_tenant(tenant)
        destroyed = self._keys.destroy(tenant)
        report = self._delete_each(lambda t: t.delete_by_tenant(tenant), floor=False)
        _log.info(
            "tenant crypto-shredded",
            tenant=tenant,
            destroyed_key_ids=list(destroyed),
            deleted=dict(report.deleted),
            unreachable=list(report.unreachable),
        )
        return ShredReport(tenant, destroyed, report.deleted, report.unreachable)

    def sweep(self, now: float | None = None) -> DeleteReport:
        """Delete every object whose retention deadline is at or before ``now``.

        Args:
            now: seconds since the epoch; default the store's clock.

        Returns:
            Expired objects deleted per tier; tiers that could not be reached are listed.
        """
        now_us = int((self._clock() if now is None else now) * 1e6)

        def expired(tier: Tier) -> list[ObjectInfo]:
            return [i for i in tier.list_expired(now_us) if tier.delete(i.block_key) is not None]

        report = self._delete_each(expired, floor=False, counter="expired")
        self._floor.prune(now_us)
        return report

    def _delete_each(
        self,
        fn: Callable[[Tier], list[ObjectInfo]],
        *,
        floor: bool,
        counter: str = "deleted",
    ) -> DeleteReport:
        """Run a deletion on every tier (down ones too: erasure is worth a timeout)."""
        now_us = int(self._clock() * 1e6)
        deleted: dict[str, int] = {}
        unreachable = []
        for st in self._states.values():
            try:
                infos = fn(st.tier)
            except TierUnavailable as exc:
                self._failed(st, exc)
                unreachable.append(st.tier.name)
                continue
            self._ok(st)
            if floor:
                for info in infos:
                    self._floor.raise_to(st.tier.name, info.block_key, now_us + 1, info.deadline_us)
            self._count(st, counter, len(infos))
            deleted[st.tier.name] = len(infos)
        return DeleteReport(deleted, tuple(unreachable))

    # ------------------------------------------------------------------ stats

    def stats(self) -> OffloadStats:
        """Counters per tier; a reachable tier is asked how full it is."""
        now = self._clock()
        out = {}
        for name, st in self._states.items():
            usage = None
            if st.backoff.ready(now):
                try:
                    usage = st.tier.usage()
                except TierUnavailable as exc:
                    self._failed(st, exc)
            with self._lock:
                out[name] = TierStats(
                    name=name,
                    capacity_bytes=st.tier.capacity_bytes,
                    stored_bytes=None if usage is None else usage.stored_bytes,
                    stored_blocks=None if usage is None else usage.stored_blocks,
                    available=st.backoff.failures == 0,
                    puts=st.puts,
                    put_bytes=st.put_bytes,
                    hits=st.hits,
                    misses=st.misses,
                    evictions=st.evictions,
                    expired=st.expired,
                    deleted=st.deleted,
                    unavailable=st.unavailable,
                    decrypt_failures=st.decrypt_failures,
                    refusals=dict(st.refusals),
                )
        return OffloadStats(out)

    def close(self) -> None:
        """Close every tier (local tiers drop their objects); the key store is the caller's."""
        for st in self._states.values():
            with contextlib.suppress(TierUnavailable):
                st.tier.close()


def _deadline_us(deadline: object) -> int:
    if isinstance(deadline, bool) or not isinstance(deadline, int | float):
        raise InvalidOffloadArgument("deadline", deadline, "must be seconds since the epoch")
    if not math.isfinite(deadline):
        raise InvalidOffloadArgument("deadline", deadline, "must be finite")
    return int(deadline * 1e6)


def _summary(refusals: list[Refusal], seen: set[MissReason]) -> MissReason:
    reasons = {r.reason for r in refusals} | seen
    for reason in (*REFUSAL_REASONS, MissReason.EXPIRED, MissReason.UNAVAILABLE):
        if reason in reasons:
            return reason
    return MissReason.ABSENT
