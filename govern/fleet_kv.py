"""A fleet's shared KV tier, without vLLM: names, the cost rule, sealed save and load, erasure.

What :class:`~kvgov.govern.vllm.kv_connector.GovernedKVConnector` needs that does not
depend on vLLM lives here, so it is tested without it:

* :class:`FleetNames` -- what a shared Redis sees of a block. The object's key is the
  request's block hash (kvgov's keyed chain: an HMAC under the cache-key secret, in
  the request's namespace); its scope digest and its tenant are keyed hashes too
  (``HMAC(secret, tag || ...)``), so neither Redis keys nor object headers name a
  tenant, a scope or a prompt. Every engine of a fleet holds the same secret (its
  block hashes must match), so every engine derives the same names.
* :class:`CostModel` -- offload only when it pays: restore throughput (bytes/s, from
  the loads) and the engine's prefill rate (tokens/s, from the forward passes), as
  moving averages; a load or save is skipped while restoring a block would take
  longer than recomputing it, on figures measured within ``cost_max_age_s``: an
  older figure no longer decides (loads and saves go ahead, and measure it again).
* :class:`FleetStore` -- one :class:`~kvgov.offload.OffloadStore` over a
  :class:`~kvgov.offload.RedisTier` and a shared wrapped-key store: ``present``
  (how many leading blocks are stored, one round trip, a miss while Redis is down or
  backing off), ``save`` and ``load`` (sealed with the owning tenant's data key, the
  AAD binding the object to its key, scope and tenant names).
* :class:`ConnectorOffloading` -- the governor's offload hook
  (:attr:`kvgov.govern.governor.Governor.offload`) for the connector's tier, so
  ``purge_tenant`` crypto-shreds the tenant's objects for the whole fleet (its data
  key is destroyed in the shared key store), ``invalidate`` deletes the objects of
  the matching scopes this engine knows, ``rotate_secret`` drops every object.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvgov.defaults import DATA_KEY_RECHECK_SECONDS, REDIS_KEY_PREFIX
from kvgov.exceptions import BindingConfigError, TierUnavailable
from kvgov.offload import (
    DeleteReport,
    KeyProvider,
    OffloadResult,
    OffloadStore,
    RedisTier,
    Restored,
    RestoreMiss,
    ShredReport,
    WrappedKeyStore,
)
from kvgov.retry import Backoff

from .keys import KeyDeriver, ScopeDigest
from .offloading import Offloading
from .scope import CacheScope

__all__ = [
    "ConnectorOffloading",
    "CostModel",
    "FleetNames",
    "FleetSettings",
    "FleetStore",
    "kvgov_settings",
]

#: How long a cost figure decides before it must be measured again (seconds).
COST_MAX_AGE_S = 60.0

_TENANT_TAG = b"kvgov.fleet-kv.tenant.v1\x00"
_SCOPE_TAG = b"kvgov.fleet-kv.scope.v1\x00"


def kvgov_settings(
    extra: Mapping[str, Any] | None, where: str, known: Iterable[str], expects: str
) -> Mapping[str, Any]:
    """``extra["kvgov"]``, an engine's extra config for a kvgov KV backend: a mapping of
    settings named in ``known`` (each value is the caller's to check).

    Raises:
        BindingConfigError: not a mapping (``expects`` says what is), or a setting not
            in ``known`` (named at ``where``).
    """
    raw = (extra or {}).get("kvgov")
    if not isinstance(raw, Mapping):
        raise BindingConfigError(where, raw, expects)
    names = set(known)
    unknown = sorted(set(raw) - names)
    if unknown:
        raise BindingConfigError(where, unknown, f"settings among {sorted(names)}")
    return raw


class FleetNames:
    """Keyed names of tenants and scopes in the shared tier (see the module docstring).

    Args:
        deriver: the cache-key secret's deriver (the same secret on every engine).
    """

    def __init__(self, deriver: KeyDeriver) -> None:
        self._deriver = deriver

    def tenant(self, tenant: str) -> str:
        """The tenant's name in the tier and the key store: ``t-`` and 32 hex digits."""
        h = hashlib.sha256(tenant.encode("utf-8")).digest()
        return "t-" + self._deriver.derive_key(_TENANT_TAG, b"", ScopeDigest(h))[:16].hex()

    def scope(self, own_root: bytes, digest: bytes) -> bytes:
        """The scope digest objects carry: keyed over the tenant's root and the scope digest."""
        return bytes(self._deriver.derive_key(_SCOPE_TAG + own_root, b"", ScopeDigest(digest)))


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """The connector's settings (``kv_connector_extra_config["kvgov"]``).

    Attributes:
        redis_url: the fleet's Redis (``rediss://user:password@host:port/0`` in production;
            ``rediss+cluster://...`` for a Redis Cluster, see docs/fleet-kv.md).
        key_store_url: the shared wrapped-key store's database (the fleet's PostgreSQL).
        prefix: the Redis key prefix, one per fleet.
        tier_name: the tier's name (bound into every object's AAD; one per fleet).
        capacity_bytes: the tier's capacity, for the whole fleet.
        timeout_s: the deadline of one Redis call; past it, a lookup or load is a miss.
        key_recheck_s: how long an engine trusts a data key before re-reading its state
            (how long a purge on another engine may take to reach this one).
        restore_bytes_per_s, prefill_tokens_per_s: starting figures of the cost rule
            (None: assume a load pays until one is measured).
        cost_rule: skip a load or save while recomputing is cheaper (False: always use
            the tier, whatever the figures say; they are still measured and reported).
        cost_max_age_s: how long a figure of the cost rule decides; an older one does not
            (the tier is used until it is measured again, and the new measurement
            replaces it), so one slow sample cannot switch the tier off for good.
    """

    redis_url: str
    key_store_url: str
    prefix: str = REDIS_KEY_PREFIX + ":fleet"
    tier_name: str = "fleet"
    capacity_bytes: int = 1 << 30
    timeout_s: float = 0.25
    key_recheck_s: float = DATA_KEY_RECHECK_SECONDS
    restore_bytes_per_s: float | None = None
    prefill_tokens_per_s: float | None = None
    cost_rule: bool = True
    cost_max_age_s: float = COST_MAX_AGE_S

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> FleetSettings:
        """Read ``kv_connector_extra_config``'s ``kvgov`` mapping.

        Raises:
            BindingConfigError: a missing or malformed setting.
        """
        raw = kvgov_settings(
            extra,
            "kv_connector_extra_config.kvgov",
            cls.__dataclass_fields__,
            "a mapping with redis_url and key_store_url",
        )
        for name in ("redis_url", "key_store_url"):
            if not isinstance(raw.get(name), str) or not raw[name]:
                raise BindingConfigError(f"kv_connector_extra_config.kvgov.{name}", None, "a URL")
        if not isinstance(raw.get("cost_rule", True), bool):
            raise BindingConfigError(
                "kv_connector_extra_config.kvgov.cost_rule", raw["cost_rule"], "true or false"
            )
        for name in ("timeout_s", "key_recheck_s", "capacity_bytes", "cost_max_age_s"):
            value = raw.get(name, 1)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise BindingConfigError(
                    f"kv_connector_extra_config.kvgov.{name}", value, "a positive number"
                )
        return cls(**dict(raw))


class CostModel:
    """Offload only when it pays: restoring a block must be faster than recomputing it.

    Each rate is a throughput over the recent past: decayed sums of bytes (tokens) and of
    seconds (each weighted ``1 - alpha`` more per later sample), divided. A sample counts
    by its size, so a 32-token step that happened to run fast does not outweigh a
    480-token one (an average of per-step rates did: on a loaded CPU it had the rule
    skip loads that were 3x faster than recomputing). With no figure yet, a load is
    assumed to pay (the first loads measure it); a measurement replaces a starting
    figure.

    A figure decides for ``max_age_s`` after it was last measured (a starting figure:
    after the model was made). Past that it is stale: :meth:`pays` says yes, so loads
    and saves use the tier again and measure it, and the next sample replaces the stale
    figure instead of being averaged into it. Without this, a figure that only a load
    measures (restore throughput) and that says "recompute" would never be measured
    again: one slow sample would switch the tier off for the engine's life. A slow tier
    is thus tried again at most once per ``max_age_s``. Thread-safe.

    Args:
        restore_bytes_per_s, prefill_tokens_per_s: starting figures (None: unknown).
        alpha: the weight the past loses per sample.
        max_age_s: how long a figure decides after it was measured.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        *,
        restore_bytes_per_s: float | None = None,
        prefill_tokens_per_s: float | None = None,
        alpha: float = 0.2,
        max_age_s: float = COST_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._alpha = alpha
        self._max_age = max_age_s
        self._clock = clock
        now = clock()
        self.restore_bytes_per_s = restore_bytes_per_s
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self._restore: tuple[float, float] | None = None  # decayed (bytes, seconds)
        self._prefill: tuple[float, float] | None = None  # decayed (tokens, seconds)
        #: when each figure was last measured (or set), on ``clock``
        self._restore_at = now
        self._prefill_at = now
        #: bytes of one block's payload, once a save or load showed it
        self.block_bytes: int | None = None
        #: the latest load's own throughput (bytes/s), beside the decayed figure
        self.last_restore_bytes_per_s: float | None = None
        #: loads measured so far
        self.restore_samples = 0
        self.skipped_loads = 0
        self.skipped_saves = 0

    def _add(
        self, sums: tuple[float, float] | None, amount: float, seconds: float
    ) -> tuple[float, float]:
        if sums is None:
            return amount, seconds
        keep = 1 - self._alpha
        return keep * sums[0] + amount, keep * sums[1] + seconds

    def _stale(self, at: float, now: float) -> bool:
        return now - at > self._max_age

    def restored(self, nbytes: int, seconds: float, blocks: int) -> None:
        """A load of ``nbytes`` in ``blocks`` blocks took ``seconds``."""
        if nbytes <= 0 or seconds <= 0 or blocks <= 0:
            return
        with self._lock:
            now = self._clock()
            past = None if self._stale(self._restore_at, now) else self._restore
            self._restore = self._add(past, nbytes, seconds)
            self._restore_at = now
            self.restore_bytes_per_s = self._restore[0] / self._restore[1]
            self.last_restore_bytes_per_s = nbytes / seconds
            self.restore_samples += 1
            self.block_bytes = nbytes // blocks

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A forward pass computed ``tokens`` tokens in ``seconds``."""
        if tokens <= 0 or seconds <= 0:
            return
        with self._lock:
            now = self._clock()
            past = None if self._stale(self._prefill_at, now) else self._prefill
            self._prefill = self._add(past, tokens, seconds)
            self._prefill_at = now
            self.prefill_tokens_per_s = self._prefill[0] / self._prefill[1]

    def _verdict(self, tokens_per_block: int, now: float) -> tuple[bool, bool]:
        """(pays, measuring): measuring when a figure is missing or stale (then it pays)."""
        rate, prefill, size = (
            self.restore_bytes_per_s,
            self.prefill_tokens_per_s,
            self.block_bytes,
        )
        if rate is None or prefill is None or size is None:
            return True, True
        if self._stale(self._restore_at, now) or self._stale(self._prefill_at, now):
            return True, True
        return size / rate < tokens_per_block / prefill, False

    def pays(self, tokens_per_block: int) -> bool:
        """Whether to use the tier: restoring a block is faster than recomputing it on the
        figures so far, or a figure is missing or stale (using the tier measures it)."""
        with self._lock:
            return self._verdict(tokens_per_block, self._clock())[0]

    def skip(self, what: str) -> None:
        """Count a skipped ``load`` or ``save``."""
        with self._lock:
            if what == "load":
                self.skipped_loads += 1
            else:
                self.skipped_saves += 1

    def metrics(self, tokens_per_block: int) -> dict[str, Any]:
        """The figures behind the decisions, their age, and what they decide.

        ``offload_pays`` is the verdict; ``measuring`` says it is yes only because a
        figure is missing or stale. ``restore_s_per_block`` and ``recompute_s_per_block``
        are what the verdict compares (None while a figure is missing).
        """
        with self._lock:
            now = self._clock()
            pays, measuring = self._verdict(tokens_per_block, now)
            rate, prefill, size = (
                self.restore_bytes_per_s,
                self.prefill_tokens_per_s,
                self.block_bytes,
            )
            return {
                "restore_bytes_per_s": rate,
                "last_restore_bytes_per_s": self.last_restore_bytes_per_s,
                "restore_samples": self.restore_samples,
                "prefill_tokens_per_s": prefill,
                "block_bytes": size,
                "restore_s_per_block": None if rate is None or size is None else size / rate,
                "recompute_s_per_block": None if prefill is None else tokens_per_block / prefill,
                "restore_age_s": now - self._restore_at,
                "prefill_age_s": now - self._prefill_at,
                "skipped_loads": self.skipped_loads,
                "skipped_saves": self.skipped_saves,
                "offload_pays": pays,
                "measuring": measuring,
            }


class FleetStore:
    """The fleet's sealed Redis tier: present, save, load, erasure (see the module docstring).

    Args:
        tier: the shared Redis tier (its ``timeout`` bounds every call).
        key_store: the shared wrapped-key store.
        kek: the key-encryption key every engine holds.
        key_recheck_s: how long a data key is trusted before its state is read again.
        clock: seconds since the epoch.
    """

    def __init__(
        self,
        tier: RedisTier,
        key_store: WrappedKeyStore,
        kek: KeyProvider,
        *,
        key_recheck_s: float = DATA_KEY_RECHECK_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tier = tier
        self.key_store = key_store
        self.store = OffloadStore(
            [tier], key_store, kek, clock=clock, key_recheck_seconds=key_recheck_s
        )
        self._backoff = Backoff(1.0, 30.0, clock=time.monotonic)
        self._lock = threading.Lock()

    def present(self, block_keys: list[bytes]) -> int | None:
        """How many of ``block_keys``, from the first, are stored; None if Redis is unavailable.

        One pipelined round trip, bounded by the tier's timeout; after a failure the
        tier is not asked again until its backoff ends (a miss meanwhile).
        """
        with self._lock:
            if not self._backoff.ready():
                return None
        try:
            found = self.tier.exists(block_keys)
        except TierUnavailable:
            with self._lock:
                self._backoff.failed()
            return None
        with self._lock:
            if self._backoff.failures:
                self._backoff.succeeded()
        n = 0
        for hit in found:
            if not hit:
                break
            n += 1
        return n

    def save(
        self, block_key: bytes, scope: bytes, tenant: str, deadline: float, payload: object
    ) -> OffloadResult:
        """Seal one block under ``tenant``'s data key and store it (``OffloadStore.offload``)."""
        return self.store.offload(block_key, scope, tenant, deadline, payload)

    def load(
        self, block_key: bytes, scope: bytes, tenant: str, *, into: object = None
    ) -> Restored | RestoreMiss:
        """Verify and decrypt one block (see ``OffloadStore.restore``); refusals are reported."""
        return self.store.restore(block_key, scope, tenant, into=into)

    def close(self) -> None:
        """Close the tier and the key store."""
        try:
            self.store.close()
        finally:
            self.key_store.close()


class ConnectorOffloading(Offloading):
    """The governor's offload hook for the connector's tier: erasure reaches the fleet's copies.

    Args:
        fleet: the scheduler side's fleet store.
        names: the keyed names (tenant and scope in the tier).
        known: the scopes this engine has met (digest -> (own root, scope)), for
            ``invalidate``.
    """

    def __init__(
        self,
        fleet: FleetStore,
        names: Callable[[], FleetNames],
        known: Callable[[], Mapping[bytes, tuple[bytes, CacheScope]]],
    ) -> None:
        super().__init__(fleet.store)
        self._names = names
        self._known = known

    def shred(self, tenant: str) -> ShredReport:
        """Destroy the tenant's data key in the shared key store, then delete its objects."""
        return self.store.shred(self._names().tenant(tenant))

    def invalidate(self, matches: Callable[[CacheScope], bool]) -> DeleteReport:
        """Delete the objects of every scope that ``matches``, among those this engine met."""
        names = self._names()
        stale = {
            names.scope(root, digest)
            for digest, (root, scope) in self._known().items()
            if matches(scope)
        }
        if not stale:
            return DeleteReport({t: 0 for t in self.tier_names}, ())
        return self.store.delete_where(lambda info: info.scope_digest in stale)

    def close(self) -> None:
        """Nothing: the connector closes its own store."""
