"""Prometheus metrics over stats(), and the list of them in docs/operations.md."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvgov.audit.metrics import AUDIT_METRICS, AuditCollector
from kvgov.exceptions import InvalidTokens, PolicyDenied
from kvgov.govern import GovernedKVCache
from kvgov.govern.metrics import CACHE_METRICS, CacheCollector, serve_metrics

from .conftest import make_scope, push_out

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"


def test_metrics_endpoint_serves_stats(make_cache: Callable[..., GovernedKVCache]) -> None:
    """Per-tenant counters and pool states appear on /metrics with their values."""
    cache = make_cache()
    cache.admit("a", make_scope(), list(range(13)))
    cache.release("a")
    cache.admit("b", make_scope(), list(range(13)))
    server = serve_metrics(cache, 0)
    try:
        port = server.server_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
    assert 'kvgov_requests_total{tenant="acme"} 2.0' in text
    assert 'kvgov_hit_tokens_total{tenant="acme"} 12.0' in text
    assert 'kvgov_pool_blocks{state="owned"} 4.0' in text
    assert "kvgov_live_sequences 1.0" in text
    assert "kvgov_audit_queue_depth{" in text  # the audit log's collector is served too


def test_offload_tiers_have_their_metrics(
    make_offload_cache: Callable[..., GovernedKVCache],
) -> None:
    """Per tier: fill, puts, hits, refusals; per tenant: blocks offloaded and restored."""
    cache = make_offload_cache()
    cache.admit("a", make_scope(), list(range(13)))
    cache.release("a")
    push_out(cache)
    cache.admit("b", make_scope(), list(range(13)))
    text = generate_latest(_registry(cache)).decode()
    assert 'kvgov_offload_puts_total{tier="host"} 3.0' in text
    assert 'kvgov_offload_hits_total{tier="host"} 3.0' in text
    assert 'kvgov_offload_stored_objects{tier="host"} 3.0' in text
    assert 'kvgov_offload_available{tier="host"} 1.0' in text
    assert 'kvgov_offload_policy_denials_total{tier="host"} 0.0' in text
    assert 'kvgov_offloaded_blocks_total{tenant="acme"} 3.0' in text
    assert 'kvgov_restored_blocks_total{tenant="acme"} 3.0' in text
    assert "kvgov_offload_restore_errors_total 0.0" in text


def test_without_offload_there_are_no_offload_metrics(
    make_cache: Callable[..., GovernedKVCache],
) -> None:
    """A cache without tiers exports no empty offload families."""
    text = generate_latest(_registry(make_cache())).decode()
    assert "kvgov_offload" not in text and "offloaded_blocks" not in text


def test_names_follow_prometheus_conventions() -> None:
    """kvgov_ first, _total on counters only, a unit or what is counted last."""
    for m in (*CACHE_METRICS, *AUDIT_METRICS):
        assert re.fullmatch(r"kvgov_[a-z0-9_]+", m.name), m.name
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        if m.type == "histogram":
            assert m.name.endswith("_seconds"), m.name
    assert "kvgov_zeroized_bytes_total" in {m.name for m in CACHE_METRICS}


def test_zeroization_counters_count_blocks_and_bytes(
    make_cache: Callable[..., GovernedKVCache],
) -> None:
    """kvgov_zeroized_{blocks,bytes}_total equal what stats() says was zeroized."""
    cache = make_cache()
    cache.admit("a", make_scope(), list(range(13)))
    cache.release("a")  # the partial block is zeroized
    registry = _registry(cache)
    t = cache.stats().tenants["acme"]
    assert t.blocks_zeroized > 0
    labels = {"tenant": "acme"}
    assert registry.get_sample_value("kvgov_zeroized_blocks_total", labels) == t.blocks_zeroized
    assert registry.get_sample_value("kvgov_zeroized_bytes_total", labels) == t.bytes_zeroized


def test_latency_histograms_and_pool_usage(make_cache: Callable[..., GovernedKVCache]) -> None:
    """Admissions by outcome, engine evaluations per rule, and the pool's usage ratio."""
    banned = {"kvgov": {"config": {"tenants": {"banned": {"admission": False}}}}}
    cache = make_cache(num_blocks=8, policy_data=banned)
    registry = _registry(cache)
    value = registry.get_sample_value
    assert value("kvgov_pool_usage_ratio") == 0.0
    cache.admit("a", make_scope(), list(range(20)))  # 2 of 8 blocks
    cache.admit("b", make_scope(), list(range(20)))  # the full block is shared
    with pytest.raises(PolicyDenied):
        cache.admit("c", make_scope(tenant="banned"), [1, 2, 3])
    with pytest.raises(InvalidTokens):
        cache.admit("d", make_scope(), [-1])
    count = "kvgov_admission_duration_seconds_count"
    assert value(count, {"outcome": "admitted"}) == 2
    assert value(count, {"outcome": "denied"}) == 1
    assert value(count, {"outcome": "error"}) == 1
    inf = value("kvgov_admission_duration_seconds_bucket", {"outcome": "admitted", "le": "+Inf"})
    assert inf == 2
    assert value("kvgov_admission_duration_seconds_sum", {"outcome": "admitted"}) > 0
    free = cache.stats().total.blocks_by_state["free"]
    assert value("kvgov_pool_usage_ratio") == (8 - free) / 8 > 0
    # every engine evaluation (a decision-cache miss) is in the policy histogram, per rule
    stats = cache.stats()
    rules = stats.policy_latency
    assert "kvgov/admission/decision" in rules
    evaluated = sum(
        value("kvgov_policy_evaluation_duration_seconds_count", {"rule": rule}) or 0
        for rule in rules
    )
    assert evaluated == stats.decision_cache_misses > 0


def test_the_documented_metrics_are_the_exported_ones(
    make_offload_cache: Callable[..., GovernedKVCache],
) -> None:
    """docs/operations.md's table lists exactly the families the collectors export."""
    documented = _documented_metrics()
    declared = {m.name: (m.type, m.labels) for m in (*CACHE_METRICS, *AUDIT_METRICS)}
    assert documented == declared
    # and the declarations are what a scrape of a cache with a tier and its audit log shows
    cache = make_offload_cache()
    cache.admit("a", make_scope(), list(range(13)))
    registry = _registry(cache)
    registry.register(AuditCollector(cache.audit))
    scraped = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        scraped[name] = family.type
    assert scraped == {name: kind for name, (kind, _labels) in declared.items()}


def test_the_alert_rules_name_real_metrics() -> None:
    """Every metric an example alert rule of docs/operations.md uses is exported."""
    text = OPERATIONS.read_text(encoding="utf-8")
    rules = text[text.index("```yaml") : text.index("```", text.index("```yaml") + 7)]
    used = set(re.findall(r"\bkvgov_[a-z0-9_]+", rules))
    assert used
    known = {m.name for m in (*CACHE_METRICS, *AUDIT_METRICS)}
    for name in used:
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert name in known or base in known, name


def _documented_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The rows of the metrics table: name -> (type, labels)."""
    lines = OPERATIONS.read_text(encoding="utf-8").splitlines()
    start = lines.index("<!-- metrics-table: every metric the collectors export -->")
    rows: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in lines[start + 3 :]:
        if not line.startswith("|"):
            break
        name, kind, labels, _meaning = (c.strip() for c in line.strip("|").split("|", 3))
        assert name not in rows, f"{name} listed twice"
        rows[name.strip("`")] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)))
    return rows


def _registry(cache: GovernedKVCache) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(CacheCollector(cache))
    return registry
