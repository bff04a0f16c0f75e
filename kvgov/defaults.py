"""Every default kvgov uses, named once and documented here.

Change a default by passing the matching argument; never edit these at run
time (they are read at construction, and mutating module state would be
hidden global state).
"""

from __future__ import annotations

from typing import Final

from kvgov.schema import SCOPE_FIELDS, TEXT_LIMITS

# --------------------------------------------------------------------------- allocator

#: Tokens per KV block, as in vLLM and SGLang.
BLOCK_SIZE: Final = 16
#: Eviction priority of a cached block when the admission policy gives none (0-100,
#: lower is evicted first, as TensorRT-LLM's retention priority).
DEFAULT_PRIORITY: Final = 50
#: Lowest and highest eviction priority.
MIN_PRIORITY: Final = 0
MAX_PRIORITY: Final = 100

# --------------------------------------------------------------------------- policy

#: Decisions kept by the LRU decision cache in front of a policy engine.
DECISION_CACHE_SIZE: Final = 65_536
#: Seconds an OPA server has to answer before the decision fails closed.
OPA_TIMEOUT_SECONDS: Final = 0.5
#: Seconds the OPA server engine trusts the bundle revision it read before reading it again.
OPA_REVISION_TTL_SECONDS: Final = 10.0

# --------------------------------------------------------------------------- audit

#: Where the audit trail goes when no URL is given.
AUDIT_URL: Final = "sqlite:///kvgov-audit.db"
#: Events the background writer queue holds before ``record`` blocks the caller.
AUDIT_QUEUE_SIZE: Final = 262_144
#: Events written per database round trip by the background writer.
AUDIT_BATCH_SIZE: Final = 2_048
#: Events between two signed checkpoints of one stream.
CHECKPOINT_EVERY: Final = 10_000
#: Seconds after which a stream with unsigned events signs a checkpoint even if fewer
#: than ``CHECKPOINT_EVERY`` events came: bounds the unsigned tail in time.
CHECKPOINT_SECONDS: Final = 60.0
#: Seconds a critical event (``CRITICAL_EVENT_TYPES``, e.g. an erasure) waits for the
#: audit database before it is written to the local spool instead and ``record``
#: returns: the longest a caller (and the cache lock it holds) waits on a hung database.
AUDIT_CRITICAL_DEADLINE_SECONDS: Final = 2.0
#: Seconds an event may stay only in memory (queued, or behind a database call that
#: has not returned) before it is written to the spool: bounds what ``kill -9`` loses
#: while the writer keeps up (when it falls behind, the queue size bounds it).
AUDIT_MAX_QUEUE_AGE_SECONDS: Final = 1.0
#: Seconds one statement of the audit writer may run on PostgreSQL (``statement_timeout``;
#: on SQLite, the wait for another writer's lock).
AUDIT_STATEMENT_TIMEOUT_SECONDS: Final = 5.0
#: Seconds any audit statement waits for a table lock on PostgreSQL (``lock_timeout``).
AUDIT_LOCK_TIMEOUT_SECONDS: Final = 2.0
#: ``kvgov audit verify --require-checkpoints``: most events a stream may hold after its
#: last signed checkpoint (the writer signs every ``CHECKPOINT_EVERY`` events).
VERIFY_MAX_UNSIGNED_EVENTS: Final = CHECKPOINT_EVERY
#: ``--require-checkpoints``: most seconds (by event time) a stream's events may span
#: after its last signed checkpoint (the writer signs every ``CHECKPOINT_SECONDS``).
VERIFY_MAX_UNSIGNED_SECONDS: Final = 2 * CHECKPOINT_SECONDS
#: Environment variable holding a PEM Ed25519 private key for checkpoints.
SIGNING_KEY_ENV: Final = "KVGOV_SIGNING_KEY"
#: Environment variable the ``kvgov audit`` / ``kvgov db`` commands read the URL from.
AUDIT_URL_ENV: Final = "KVGOV_AUDIT_URL"

# --------------------------------------------------------------------------- govern

#: Environment variable holding the cache-key secret.
KEY_SECRET_ENV: Final = "KVGOV_KEY_SECRET"
#: Environment variable choosing the key chain's code: ``auto`` (the compiled chain where
#: installed, else Python), ``native`` (the compiled chain or refuse to start), ``python``.
KEYCHAIN_ENV: Final = "KVGOV_KEYCHAIN"
#: Shortest cache-key secret accepted, in bytes (the HMAC-SHA256 key size).
MIN_KEY_SECRET_BYTES: Final = 32
#: Longest identifier accepted in a cache scope field: the audit store's width for the
#: scope columns (``kvgov.schema.TEXT_LIMITS``, the one source of these limits).
MAX_SCOPE_FIELD_CHARS: Final = min(TEXT_LIMITS[f] for f in SCOPE_FIELDS)
#: Distinct scopes one bounded scope memory keeps: the offload manager's scopes remembered
#: for invalidation (the oldest forgotten first) and the vLLM binding's resolved scopes (the
#: cache of them cleared when full).
MAX_SCOPES: Final = 65_536
#: Shortest interval between two retention sweeps of ``start_sweeper``, in seconds: a
#: smaller one would spin a CPU on the cache lock for no retention that matters.
MIN_SWEEP_INTERVAL: Final = 0.01

# --------------------------------------------------------------------------- offload

#: Environment variable holding the key-encryption key (64 hex characters, 32 bytes).
KEK_ENV: Final = "KVGOV_KEK"
#: Environment variable naming a file that holds the key-encryption key (32 raw bytes
#: or 64 hex characters; readable by its owner only).
KEK_FILE_ENV: Final = "KVGOV_KEK_FILE"
#: Seconds a worker trusts a data key it has unwrapped before it reads the key's state
#: from the key store again: the longest a worker keeps decrypting (or encrypting under)
#: a key another worker has just destroyed.
DATA_KEY_RECHECK_SECONDS: Final = 5.0
#: Seconds an offload tier that failed (Redis down, disk full) is skipped before the
#: store tries it again, at least: each failure in a row doubles the skip, up to
#: ``TIER_RETRY_MAX_SECONDS``, plus up to half as much again at random (kvgov.retry).
TIER_RETRY_SECONDS: Final = 5.0
#: The longest skip of a failed offload tier, before jitter.
TIER_RETRY_MAX_SECONDS: Final = 60.0
#: Replay floors (per tier and block key) an offload store keeps before dropping the
#: oldest; each costs about 210 bytes besides its block key (55 MB in all).
REPLAY_FLOOR_ENTRIES: Final = 1 << 18
#: Seconds a Redis tier waits to connect, and for each reply, before it counts as down.
REDIS_TIMEOUT_SECONDS: Final = 0.5
#: Prefix of every Redis key an offload tier writes (the tier name follows, in braces,
#: so all of a tier's keys share one Redis Cluster hash slot).
REDIS_KEY_PREFIX: Final = "kvgov:offload"

# --------------------------------------------------------------------------- vLLM binding

#: The key of kvgov's settings in vLLM's ``additional_config`` (``--additional-config``).
VLLM_CONFIG_KEY: Final = "kvgov"
#: Prefix of the environment variable each binding setting falls back to: setting
#: ``audit_url`` is read from ``KVGOV_AUDIT_URL``, ``policy_dir`` from ``KVGOV_POLICY_DIR``.
SETTING_ENV_PREFIX: Final = "KVGOV_"
#: Environment variable holding the key that signs scope tokens (at least 32 bytes).
SCOPE_TOKEN_KEY_ENV: Final = "KVGOV_SCOPE_TOKEN_KEY"
#: Shortest scope-token key accepted, in bytes (the HMAC-SHA256 key size).
MIN_SCOPE_TOKEN_KEY_BYTES: Final = 32
#: Longest a scope token may still be valid for when it arrives, in seconds: a token
#: expiring further ahead is refused, which bounds how long a leaked token can be replayed.
SCOPE_TOKEN_MAX_TTL_SECONDS: Final = 300.0
#: Longest a "done" zeroization of the vLLM binding waits, in seconds, to be written
#: together with later ones (it is written at once when the engine goes idle).
ZEROIZATION_DONE_FLUSH_SECONDS: Final = 1.0
#: The revision recorded for a model, tokenizer or adapter the engine names without one.
UNVERSIONED: Final = "unversioned"
