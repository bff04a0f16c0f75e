"""Trace replay: deterministic tokens and tenants, and the governed cache against the baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.allocator import BlockPool
from kvgov.cli.main import main
from kvgov.exceptions import InvalidArgument
from kvgov.govern import GovernedKVCache
from kvgov.govern.replay import (
    MOONCAKE_BLOCK_TOKENS,
    TraceRequest,
    expand_tokens,
    load_trace,
    replay_bare,
    replay_governed,
    replay_spec,
    replay_ungoverned,
    run_replay,
    tenant_of,
    trace_scope,
)

TRACE = Path(__file__).parents[2] / "data" / "mooncake" / "mooncake_conversation_trace.jsonl"


def _trace() -> Path:
    if not TRACE.is_file():  # pragma: no cover - the trace ships in the repository
        pytest.fail(f"the Mooncake trace is missing at {TRACE}")
    return TRACE


def test_equal_hash_ids_give_equal_tokens_and_different_ids_differ() -> None:
    """Token expansion is deterministic per hash id and cut to the input length."""
    a = expand_tokens(TraceRequest(0, 600, 1, (3, 4)))
    b = expand_tokens(TraceRequest(0, 1024, 1, (3, 5)))
    assert len(a) == 600 and len(b) == 1024
    assert a[:MOONCAKE_BLOCK_TOKENS] == b[:MOONCAKE_BLOCK_TOKENS]
    assert a[MOONCAKE_BLOCK_TOKENS:] != b[MOONCAKE_BLOCK_TOKENS:600]


def test_a_conversation_stays_in_one_tenant() -> None:
    """Requests sharing the block after the system prompt map to the same tenant."""
    turn1 = TraceRequest(0, 1024, 1, (0, 77))
    turn2 = TraceRequest(5, 2048, 1, (0, 77, 78, 79))
    assert tenant_of(turn1, 8) == tenant_of(turn2, 8)
    spread = {tenant_of(TraceRequest(0, 1, 1, (0, c)), 4) for c in range(100)}
    assert spread == {f"tenant-{k}" for k in range(4)}


def test_bad_trace_lines_are_named(tmp_path: Path) -> None:
    """A malformed line raises InvalidArgument naming file and line."""
    bad = tmp_path / "t.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"x": 1}\n'
    )
    with pytest.raises(InvalidArgument, match=r"t\.jsonl:2"):
        load_trace(bad)
    with pytest.raises(InvalidArgument, match="no such file"):
        load_trace(tmp_path / "missing.jsonl")


def test_one_tenant_replay_matches_the_ungoverned_hit_rate_exactly() -> None:
    """With one tenant, governance costs no hits: 500 requests, same capacity, same hits."""
    report = run_replay(_trace(), tenants=1, blocks=8192, limit=500)
    assert report["governed"]["requests"] == report["ungoverned"]["requests"] == 500
    assert report["governed"]["hit_tokens"] == report["ungoverned"]["hit_tokens"] > 0
    assert report["isolation_cost"] == 0


def test_tenants_cost_hits_and_a_shared_prefix_wins_some_back() -> None:
    """Isolation loses cross-conversation hits; sharing the public system prompt regains some."""
    isolated = run_replay(_trace(), tenants=4, blocks=4096, limit=300)
    shared = run_replay(_trace(), tenants=4, blocks=4096, limit=300, share_public_prefix=True)
    assert isolated["governed"]["hit_tokens"] <= isolated["ungoverned"]["hit_tokens"]
    assert isolated["cross_tenant_reuses"] == 0
    assert shared["cross_tenant_reuses"] > 0
    assert shared["governed"]["hit_tokens"] > isolated["governed"]["hit_tokens"]


def test_replay_command_prints_json() -> None:
    """`kvgov replay --json` reports both caches."""
    result = CliRunner().invoke(
        main, ["replay", str(_trace()), "--limit", "50", "--blocks", "2048", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report) >= {"governed", "ungoverned", "isolation_cost"}


def test_replaying_in_parts_keeps_the_caches_and_their_hits(tmp_path: Path) -> None:
    """A trace replayed in chunks through one pool and one governed cache (as
    bench_governed.py does, alternating them) hits exactly as a whole replay does."""
    requests = load_trace(_trace(), 150)
    whole = replay_ungoverned(4096, 16, requests)
    pool = BlockPool(replay_spec(16), 4096)
    scope = trace_scope("tenant-0")
    bare_hits = gov_hits = 0
    with GovernedKVCache.create(
        spec=replay_spec(16),
        num_blocks=4096,
        audit_url=f"sqlite:///{tmp_path / 'audit.db'}",
        ephemeral_secret=True,
    ) as cache:
        for start in range(0, len(requests), 40):
            part = requests[start : start + 40]
            bare_hits += replay_bare(pool, part).hit_tokens
            gov_hits += replay_governed(cache, part, lambda _r: scope).hit_tokens
    pool.close()
    assert whole.hit_tokens > 0
    assert bare_hits == gov_hits == whole.hit_tokens


def test_a_host_tier_wins_back_hits_a_small_pool_lost() -> None:
    """`kvgov replay --tier-url host://...`: evicted prefixes come back from the encrypted tier."""
    args = ["replay", str(_trace()), "--limit", "150", "--blocks", "128", "--block-size", "512"]
    plain = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    result = CliRunner().invoke(
        main, [*args, "--tier-url", "host://?capacity=64MiB&pin=0", "--json"]
    )
    assert result.exit_code == 0, result.output
    tiered = json.loads(result.output)
    assert plain["offload"] is None
    restored = tiered["offload"]["restored_tokens"]
    assert restored > 0 and tiered["offload"]["tiers"]["host"]["hits"] * 512 == restored
    assert tiered["governed"]["hit_tokens"] > plain["governed"]["hit_tokens"]
    assert tiered["ungoverned"] == {**plain["ungoverned"], **_timings(tiered["ungoverned"])}


def _timings(r: dict[str, float]) -> dict[str, float]:
    keys = ("seconds", "requests_per_second", "blocks_per_second", "microseconds_per_block")
    return {k: r[k] for k in keys}
