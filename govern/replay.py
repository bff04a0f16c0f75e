"""Replay Mooncake request traces through the governed cache and an ungoverned baseline.

A Mooncake trace line is ``{"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [...]}``; each hash id stands for one 512-token block of prompt and
equal ids mean equal prefix blocks. Replay gives each id deterministic tokens::

    token j of hash id h  =  (h * 512 + j) mod 2**32        (j in 0..511)

so equal ids give equal tokens (and equal cache keys) and different ids give
different tokens. A request's prompt is its ids' tokens cut to ``input_length``.

Tenants: with ``tenants=N``, a request goes to ``tenant-k`` where
``k = (c * 2654435761 mod 2**32) mod N`` and ``c`` is the conversation id: the
request's second hash id (its first block after the system prompt every
request of the trace shares), or its first when it has only one. All turns of
a conversation share that prefix, so a conversation stays in one tenant.

The ungoverned baseline is what a serving engine does today: one namespace,
keys are plain chained SHA-256 of the tokens, same pool, same capacity, same
LRU eviction, and the same rule of leaving at least one prompt token to compute.

With offload tiers (``tier_urls``) the governed cache also seals blocks evicted
for capacity into them and restores them on later misses; the replay's policy
allows every given tier for the trace's ``internal`` scopes, and the KEK is
``KVGOV_KEK`` (or ``KVGOV_KEK_FILE``) when set, else one drawn for the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvgov import defaults
from kvgov.allocator import BlockPool, KVSpec
from kvgov.exceptions import InvalidArgument, OutOfBlocks
from kvgov.offload import LocalKEK, Tier

from .cache import GovernedKVCache
from .keys import pack_tokens
from .offload_config import OffloadConfig, parse_tier_url
from .scope import CacheScope
from .stats import CacheStats

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "ReplayResult",
    "TraceRequest",
    "expand_tokens",
    "load_trace",
    "replay_bare",
    "replay_governed",
    "replay_spec",
    "replay_ungoverned",
    "run_replay",
    "tenant_of",
    "trace_scope",
]

#: Tokens one Mooncake hash id stands for.
MOONCAKE_BLOCK_TOKENS = 512
_GOLDEN = 2654435761


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a Mooncake trace.

    Attributes:
        timestamp_ms: arrival time in milliseconds from the trace start.
        input_length: prompt tokens.
        output_length: generated tokens.
        hash_ids: the prompt's 512-token block ids, a prefix chain.
    """

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Cache behaviour and cost of one replay.

    Attributes:
        name: ``governed`` or ``ungoverned``.
        requests: requests replayed (skipped ones excluded).
        skipped: requests longer than the whole pool, not replayed.
        prompt_tokens: prompt tokens of the replayed requests.
        hit_tokens: prompt tokens served from cache (prefill avoided).
        blocks: blocks handed out (hit or new).
        seconds: wall time of the replay loop.
        cpu_seconds: CPU time of the whole process (every thread, the audit
            writer's included) during the loop; steadier than wall time on a
            shared machine.
    """

    name: str
    requests: int
    skipped: int
    prompt_tokens: int
    hit_tokens: int
    blocks: int
    seconds: float
    cpu_seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens served from cache."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def requests_per_second(self) -> float:
        """Replay throughput in requests."""
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def blocks_per_second(self) -> float:
        """Replay throughput in blocks."""
        return self.blocks / self.seconds if self.seconds else 0.0

    @property
    def microseconds_per_block(self) -> float:
        """Mean wall time per block handed out."""
        return self.seconds / self.blocks * 1e6 if self.blocks else 0.0


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Read a Mooncake JSONL trace.

    Args:
        path: the trace file.
        limit: read at most this many requests.

    Returns:
        The requests in file order.

    Raises:
        InvalidArgument: the file is missing or a line is not a valid request
            (the message names the line).
    """
    p = Path(path)
    if not p.is_file():
        raise InvalidArgument("trace", str(path), "no such file")
    out: list[TraceRequest] = []
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                req = TraceRequest(
                    timestamp_ms=int(raw["timestamp"]),
                    input_length=int(raw["input_length"]),
                    output_length=int(raw["output_length"]),
                    hash_ids=tuple(int(h) for h in raw["hash_ids"]),
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidArgument(
                    "trace", f"{path}:{lineno}", f"not a Mooncake request line ({exc})"
                ) from None
            if req.input_length < 0 or any(h < 0 for h in req.hash_ids):
                raise InvalidArgument("trace", f"{path}:{lineno}", "negative length or hash id")
            out.append(req)
    return out


def expand_tokens(req: TraceRequest) -> list[int]:
    """The request's deterministic prompt tokens (see the module docstring).

    Args:
        req: a trace request.

    Returns:
        ``req.input_length`` token ids (fewer if the hash ids cover fewer).
    """
    tokens: list[int] = []
    for h in req.hash_ids:
        base = h * MOONCAKE_BLOCK_TOKENS
        tokens.extend((base + j) & 0xFFFFFFFF for j in range(MOONCAKE_BLOCK_TOKENS))
        if len(tokens) >= req.input_length:
            break
    return tokens[: req.input_length]


def tenant_of(req: TraceRequest, tenants: int) -> str:
    """The tenant a request is replayed under (see the module docstring).

    Args:
        req: a trace request.
        tenants: how many tenants (>= 1).

    Returns:
        ``tenant-k``.
    """
    if not req.hash_ids:
        return "tenant-0"
    conversation = req.hash_ids[1] if len(req.hash_ids) > 1 else req.hash_ids[0]
    return f"tenant-{(conversation * _GOLDEN % 2**32) % tenants}"


def trace_scope(tenant: str) -> CacheScope:
    """The scope trace requests of ``tenant`` are replayed under (``internal`` data).

    Args:
        tenant: the tenant, e.g. from :func:`tenant_of`.

    Returns:
        A scope whose other fields are fixed, so only the tenant separates requests.
    """
    return CacheScope(
        tenant=tenant,
        classification="internal",
        model="trace-model",
        model_revision="1",
        tokenizer="trace-tokenizer",
        tokenizer_revision="1",
        template_version="1",
    )


def replay_spec(block_size: int) -> KVSpec:
    """A tiny KV layout for replays: cache behaviour, not memory, is measured."""
    return KVSpec(
        num_layers=1, num_kv_heads=1, head_dim=8, block_size=block_size, dtype=torch.float16
    )


def replay_governed(
    cache: GovernedKVCache,
    requests: Sequence[TraceRequest],
    scope_of: Callable[[TraceRequest], CacheScope],
    *,
    public_prefix_tokens: int = 0,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay requests through a governed cache: admit, then release, one at a time.

    Args:
        cache: the governed cache (its capacity is the pool's).
        requests: the trace.
        scope_of: the scope each request runs under.
        public_prefix_tokens: leading tokens of every request that are public
            (see :meth:`GovernedKVCache.admit`).
        progress: called with the number of requests done, now and then.

    Returns:
        Hits and cost.
    """
    prompts = [expand_tokens(r) for r in requests]
    scopes = [scope_of(r) for r in requests]
    bs = cache.spec.block_size
    limit = cache.num_blocks * bs
    hit = prompt = blocks = skipped = done = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for i, tokens in enumerate(prompts):
        if len(tokens) > limit:
            skipped += 1
            continue
        adm = cache.admit(
            f"r{i}", scopes[i], tokens, public_prefix_tokens=min(public_prefix_tokens, len(tokens))
        )
        cache.release(f"r{i}")
        hit += adm.cached_tokens
        prompt += len(tokens)
        blocks += len(adm.block_ids)
        done += 1
        if progress is not None and done % 256 == 0:
            progress(done)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return ReplayResult("governed", done, skipped, prompt, hit, blocks, seconds, cpu)


def replay_ungoverned(
    num_blocks: int, block_size: int, requests: Sequence[TraceRequest]
) -> ReplayResult:
    """Replay through a bare pool with one namespace and plain SHA-256 chained keys.

    Args:
        num_blocks: pool capacity.
        block_size: tokens per block.
        requests: the trace.

    Returns:
        Hits and cost.
    """
    pool = BlockPool(replay_spec(block_size), num_blocks)
    try:
        return replay_bare(pool, requests)
    finally:
        pool.close()


def replay_bare(pool: BlockPool, requests: Iterable[TraceRequest]) -> ReplayResult:
    """Replay requests through a bare pool (one namespace, plain SHA-256 chained keys).

    The pool keeps its cached blocks between calls, so a trace can be replayed in
    parts (as ``benchmarks/bench_governed.py`` does, alternating with a governed
    cache).

    Args:
        pool: the pool (its capacity is the cache's).
        requests: the trace, or a part of it.

    Returns:
        Hits and cost of these requests.
    """
    bs = pool.spec.block_size
    step = 4 * bs
    limit = pool.num_blocks * bs
    prompts = [expand_tokens(r) for r in requests]
    hit = prompt = blocks = skipped = done = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for tokens in prompts:
        n = len(tokens)
        if n > limit:
            skipped += 1
            continue
        packed = pack_tokens(tokens)
        full = n // bs
        keys: list[bytes] = []
        parent = b""
        for i in range(full):
            parent = hashlib.sha256(parent + packed[i * step : (i + 1) * step]).digest()
            keys.append(parent)
        max_hit = (n - 1) // bs if n else 0
        hits = pool.lookup(keys[:max_hit]) if max_hit else []
        try:
            new = pool.allocate(-(-n // bs) - len(hits))
        except OutOfBlocks:  # pragma: no cover - excluded by the length check above
            pool.free(hits)
            raise
        table = hits + new
        if full > len(hits):
            pool.set_keys(table[len(hits) : full], keys[len(hits) : full])
        pool.free(table[::-1])
        pool.take_events()
        hit += len(hits) * bs
        prompt += n
        blocks += len(table)
        done += 1
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return ReplayResult("ungoverned", done, skipped, prompt, hit, blocks, seconds, cpu)


def run_replay(
    trace: str | Path,
    *,
    tenants: int = 1,
    blocks: int = 65_536,
    block_size: int = 16,
    limit: int | None = None,
    share_public_prefix: bool = False,
    audit_url: str | None = None,
    progress: Callable[[int], None] | None = None,
    tier_urls: Sequence[str] = (),
) -> dict[str, Any]:
    """Replay a trace through the governed cache and the ungoverned baseline, same capacity.

    Args:
        trace: a Mooncake JSONL file.
        tenants: tenants to spread conversations over (see :func:`tenant_of`).
        blocks: capacity of both caches, in blocks.
        block_size: tokens per block.
        limit: replay only the first ``limit`` requests.
        share_public_prefix: mark the trace's common first block (512 tokens of
            system prompt) public and grant it to a share group of all tenants.
        audit_url: the governed cache's audit database; None for a SQLite file
            in a temporary directory, removed afterwards.
        progress: called with requests done.
        tier_urls: offload tier URLs for the governed cache (see
            :func:`~kvgov.govern.parse_tier_url`), fastest first; none by default.

    Returns:
        A JSON-able report: both results, the isolation cost (ungoverned minus
        governed hit rate), the governed cache's cross-tenant reuse count and,
        with tiers, their figures.
    """
    requests = load_trace(trace, limit)
    names = sorted({tenant_of(r, tenants) for r in requests})
    config: dict[str, Any] = {}
    if share_public_prefix:
        config["share_groups"] = {
            "system-prompt": {"publishers": names, "classifications": ["public"]}
        }
    offload, tier_names = _offload_config(tier_urls)
    if offload is not None:
        config["offload_tiers"] = {"internal": tier_names}
    policy_data = {"kvgov": {"config": config}} if config else None
    prefix = MOONCAKE_BLOCK_TOKENS if share_public_prefix else 0
    scopes = {name: trace_scope(name) for name in names}
    with (
        tempfile.TemporaryDirectory(prefix="kvgov-replay-") as tmp,
        GovernedKVCache.create(
            spec=replay_spec(block_size),
            num_blocks=blocks,
            audit_url=audit_url or f"sqlite:///{Path(tmp) / 'audit.db'}",
            ephemeral_secret=True,
            policy_data=policy_data,
            offload=offload,
        ) as cache,
    ):
        governed = replay_governed(
            cache,
            requests,
            lambda r: scopes[tenant_of(r, tenants)],
            public_prefix_tokens=prefix,
            progress=progress,
        )
        final = cache.stats()
    cross = final.total.cross_tenant_reuses
    ungoverned = replay_ungoverned(blocks, block_size, requests)

    def as_dict(r: ReplayResult) -> dict[str, Any]:
        return {
            "requests": r.requests,
            "skipped": r.skipped,
            "prompt_tokens": r.prompt_tokens,
            "hit_tokens": r.hit_tokens,
            "hit_rate": r.hit_rate,
            "blocks": r.blocks,
            "seconds": r.seconds,
            "requests_per_second": r.requests_per_second,
            "blocks_per_second": r.blocks_per_second,
            "microseconds_per_block": r.microseconds_per_block,
        }

    return {
        "trace": str(trace),
        "requests": len(requests),
        "tenants": tenants,
        "blocks": blocks,
        "block_size": block_size,
        "share_public_prefix": share_public_prefix,
        "governed": as_dict(governed),
        "ungoverned": as_dict(ungoverned),
        "isolation_cost": ungoverned.hit_rate - governed.hit_rate,
        "cross_tenant_reuses": cross,
        "offload": None if final.offload is None else _offload_figures(final, block_size),
    }


def _offload_config(tier_urls: Sequence[str]) -> tuple[OffloadConfig | None, list[str]]:
    """The replay's tiers (built here, so their names are known) and their names."""
    if not tier_urls:
        return None, []
    env = os.environ
    if env.get(defaults.KEK_ENV) or env.get(defaults.KEK_FILE_ENV):
        kek = LocalKEK.from_env()
    else:
        kek = LocalKEK(secrets.token_bytes(32))  # the run's own: nothing outlives it
    tiers: list[Tier] = []
    try:
        for url in tier_urls:
            tiers.append(parse_tier_url(url))
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return OffloadConfig(tiers=tiers, kek=kek), [t.name for t in tiers]


def _offload_figures(stats: CacheStats, block_size: int) -> dict[str, Any]:
    """Per tier: sealed, restored, refused; and the prefill the restores avoided."""
    tiers = {} if stats.offload is None else stats.offload.tiers
    return {
        "restored_tokens": stats.total.blocks_restored * block_size,
        "tiers": {
            name: {"puts": t.puts, "hits": t.hits, "evictions": t.evictions, "refusals": t.refusals}
            for name, t in tiers.items()
        },
    }
