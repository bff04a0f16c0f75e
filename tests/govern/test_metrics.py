"""Prometheus metrics over stats()."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

from kvgov.govern import GovernedKVCache
from kvgov.govern.metrics import serve_metrics

from .conftest import make_scope


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
