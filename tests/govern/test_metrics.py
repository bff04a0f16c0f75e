"""Prometheus metrics over stats()."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest

from kvgov.govern import GovernedKVCache
from kvgov.govern.metrics import CacheCollector, serve_metrics

from .conftest import make_scope, push_out


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
    assert 'kvgov_offload_stored_blocks{tier="host"} 3.0' in text
    assert 'kvgov_offload_available{tier="host"} 1.0' in text
    assert 'kvgov_offload_policy_denied_total{tier="host"} 0.0' in text
    assert 'kvgov_blocks_offloaded_total{tenant="acme"} 3.0' in text
    assert 'kvgov_blocks_restored_total{tenant="acme"} 3.0' in text
    assert "kvgov_offload_restore_errors_total 0.0" in text


def test_without_offload_there_are_no_offload_metrics(
    make_cache: Callable[..., GovernedKVCache],
) -> None:
    """A cache without tiers exports no empty offload families."""
    text = generate_latest(_registry(make_cache())).decode()
    assert "kvgov_offload" not in text and "blocks_offloaded" not in text


def _registry(cache: GovernedKVCache) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(CacheCollector(cache))
    return registry
