"""How a governed cache's offload tiers are configured: :class:`OffloadConfig` and tier URLs.

::

    GovernedKVCache.create(..., offload=OffloadConfig(
        tiers=["host://?capacity=8GiB",                                 # fastest first
               "disk:///var/cache/kvgov?capacity=64GiB",
               "rediss://kv-cache.internal:6380/0?capacity=256GiB"],
        kek=None,          # None: LocalKEK.from_env() (KVGOV_KEK, else KVGOV_KEK_FILE)
        key_store=None,    # None: kvgov.audit.SqlWrappedKeyStore on the cache's audit URL
    ))

A tier is a URL or a ready :class:`~kvgov.offload.Tier` (``HostMemoryTier(...)``,
for tests and experts). Tier URLs:

=================================================  ======================================
``host://?capacity=SIZE[&name=host][&pin=auto]``   this process's RAM (pinned: auto, 1, 0)
``disk:///PATH?capacity=SIZE[&name=disk][&fsync=1]``  one file per block under PATH
``redis://[user:pw@]HOST:PORT/DB?capacity=SIZE``   a Redis shared by the fleet (``rediss://``
``[&name=redis][&prefix=kvgov:offload]``           for TLS); other query parameters go to
``[&timeout=0.5]``                                 redis-py as they are
``redis+cluster://[user:pw@]HOST:PORT/0?...``      the same on a Redis Cluster (one seed
                                                   node; ``rediss+cluster://`` for TLS)
=================================================  ======================================

``SIZE`` is bytes or a number with a unit (``512MiB``, ``8GiB``, ``1.5GB``; see
:func:`~kvgov.govern.sizes.parse_size`). A tier's
name is what the offload policy is asked about (``data.kvgov.config.offload_tiers``
lists names per classification) and is bound into every object it stores: workers
sharing a Redis tier must give it the same name and prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kvgov import defaults
from kvgov.audit import SqlWrappedKeyStore
from kvgov.exceptions import InvalidArgument
from kvgov.offload import (
    DiskTier,
    HostMemoryTier,
    KeyProvider,
    LocalKEK,
    OffloadStore,
    RedisTier,
    Tier,
    WrappedKeyStore,
)
from kvgov.secrecy import redact_url

from .offloading import Offloading
from .sizes import parse_size

__all__ = ["OffloadConfig", "open_offloading", "parse_size", "parse_tier_url"]

_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """The encrypted offload tiers of a governed cache (see the module docstring).

    Attributes:
        tiers: tier URLs or ready tiers, in lookup order (fastest first); names differ.
        kek: the key-encryption key; None reads ``KVGOV_KEK`` or ``KVGOV_KEK_FILE``.
        key_store: where wrapped data keys live; None opens a
            :class:`~kvgov.audit.SqlWrappedKeyStore` on the cache's audit URL (the
            fleet's workers must share it, as they share the audit database).
        retry_seconds: how long a failed tier is skipped before it is tried again.
        key_recheck_seconds: how long a worker trusts an unwrapped data key before it
            rereads the key's state (how late a shred on another worker takes effect).
    """

    tiers: Sequence[str | Tier]
    kek: KeyProvider | None = None
    key_store: WrappedKeyStore | None = None
    retry_seconds: float = defaults.TIER_RETRY_SECONDS
    key_recheck_seconds: float = defaults.DATA_KEY_RECHECK_SECONDS

    def __post_init__(self) -> None:
        if isinstance(self.tiers, str) or not isinstance(self.tiers, Sequence) or not self.tiers:
            raise InvalidArgument(
                "tiers", self.tiers, "a non-empty list of tier URLs or tiers, fastest first"
            )
        object.__setattr__(self, "tiers", tuple(self.tiers))


def _flag(name: str, value: str) -> bool:
    if value.lower() not in _FLAGS:
        raise InvalidArgument(name, value, "1 or 0 (true or false)")
    return _FLAGS[value.lower()]


def parse_tier_url(url: str) -> Tier:
    """Build the tier a URL names (see the module docstring for the forms).

    Raises:
        InvalidArgument: an unknown scheme, no or a bad capacity, an unknown option.
        InvalidOffloadArgument: the tier refuses an option (a bad name, a bad path).
    """
    if not isinstance(url, str):
        raise InvalidArgument(
            "tier", type(url).__name__, "a tier URL such as host://?capacity=8GiB"
        )
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "capacity" not in options:
        raise InvalidArgument("tier", redact_url(url), "give its size: ...?capacity=8GiB")
    capacity = parse_size(options.pop("capacity"))
    scheme = parts.scheme.lower()
    tier: Tier
    if scheme == "host":
        pin = options.pop("pin", "auto")
        tier = HostMemoryTier(
            capacity,
            name=options.pop("name", "host"),
            pin_memory=None if pin == "auto" else _flag("pin", pin),
        )
    elif scheme == "disk":
        path = parts.netloc + parts.path
        if not path:
            raise InvalidArgument(
                "tier", redact_url(url), "name a directory: disk:///var/cache/kvgov?..."
            )
        tier = DiskTier(
            path,
            capacity,
            name=options.pop("name", "disk"),
            fsync=_flag("fsync", options.pop("fsync", "1")),
        )
    elif scheme in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
        name = options.pop("name", "redis")
        prefix = options.pop("prefix", defaults.REDIS_KEY_PREFIX)
        timeout = _seconds(options.pop("timeout", str(defaults.REDIS_TIMEOUT_SECONDS)))
        rest = urlunsplit(parts._replace(query=urlencode(options)))
        options = {}
        tier = RedisTier(rest, capacity, name=name, prefix=prefix, timeout=timeout)
    else:
        raise InvalidArgument(
            "tier",
            redact_url(url),
            "the scheme must be host://, disk://, redis://, rediss://, redis+cluster:// "
            "or rediss+cluster://",
        )
    if options:
        raise InvalidArgument("tier", redact_url(url), f"unknown option(s) {sorted(options)}")
    return tier


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidArgument("timeout", text, "a positive number of seconds")
    return value


def open_offloading(
    config: OffloadConfig, *, audit_url: str, clock: Callable[[], float]
) -> Offloading:
    """Open a configuration's tiers, key store and KEK as an :class:`Offloading`.

    Args:
        config: the configuration.
        audit_url: where the wrapped-key store lives unless ``config.key_store`` is given.
        clock: the cache's clock (deadlines, sweeps).

    Raises:
        InvalidArgument: a bad tier URL or configuration.
        InvalidOffloadArgument: a tier refuses its options, or two tiers share a name.
        KEKError: no usable key-encryption key.
        AuditSchemaError: the key store's database needs ``kvgov db upgrade``.
    """
    if not isinstance(config, OffloadConfig):
        raise InvalidArgument("offload", config, "an OffloadConfig (or None for no offload)")
    kek = LocalKEK.from_env() if config.kek is None else config.kek
    tiers: list[Tier] = []
    owned = None
    try:
        for t in config.tiers:
            tiers.append(parse_tier_url(t) if isinstance(t, str) else t)
        key_store = config.key_store
        if key_store is None:
            key_store = owned = SqlWrappedKeyStore(audit_url)
        store = OffloadStore(
            tiers,
            key_store,
            kek,
            clock=clock,
            retry_seconds=config.retry_seconds,
            key_recheck_seconds=config.key_recheck_seconds,
        )
    except BaseException:
        for tier in tiers:
            if any(tier is t for t in config.tiers):
                continue  # the caller's own tier
            tier.close()
        if owned is not None:
            owned.close()
        raise
    return Offloading(store, key_store=owned)
