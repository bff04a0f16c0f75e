"""vLLM's own tests that must fail with kvgov's classes in place, and why (docs/vllm.md lists them).

Every other test that passes on stock vLLM must pass governed (``compare_suites.py``
fails the run otherwise). An entry names a test function (all its parametrizations),
the text its governed failure must contain, and the reason. Two kinds are the
isolation working:
  the test looks the cache up with a *probe* request built outside the scheduler:
  never admitted, it carries vLLM's unscoped sha256 hashes and finds nothing keyed
  in a tenant's namespace;
  the test *seeds* the cache through the KV cache manager with a request built outside
  the scheduler (vLLM's Mamba hybrid tests: ``_seed_hybrid_prefix``): never admitted,
  its blocks are cached under vLLM's unscoped hashes, and the request it then schedules
  (admitted, keyed in the tenant's namespace) finds none of them. The scheduler starts
  over the Mamba group and governs it; with the seeding request admitted the same tests
  pass governed (docs/vllm.md, "vLLM's own tests, governed").
And one refusal: the test starts vLLM's ``DecodeBenchConnector``, refused by name (it
  fills KV with synthetic data).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIFFERENCES", "Difference"]

PROBE = "assert 0 =="
SEEDED = "NewRequestData(req_id=replay"
DECODE_BENCH = "kvgov cannot govern the KV connector"

_REASONS = {
    PROBE: "probes the cache with a request that was never admitted: unscoped keys find nothing",
    SEEDED: "seeds the cache through the manager with a request that was never admitted: "
    "the admitted request's scoped keys find none of its blocks",
    DECODE_BENCH: "starts DecodeBenchConnector, which kvgov refuses by name (it fills KV "
    "with synthetic data)",
}


@dataclass(frozen=True, slots=True)
class Difference:
    """One vLLM test function that fails governed by design.

    Attributes:
        test: ``file::function``; every parametrization of it is covered.
        fails_with: texts one of which its governed failure message contains.
    """

    test: str
    fails_with: tuple[str, ...]

    @property
    def reason(self) -> str:
        """Why it must differ (one line per kind of failure)."""
        return "; ".join(_REASONS[f] for f in self.fails_with)


def _d(test: str, *fails_with: str) -> Difference:
    return Difference(test, fails_with)


P = "test_prefix_caching.py::"
R = "test_prefix_replay.py::"
S = "test_scheduler.py::"

DIFFERENCES: tuple[Difference, ...] = (
    _d(S + "test_streaming_lookahead_hashes_follow_recomputed_kv", PROBE),
    _d(S + "test_scheduler_publishes_lookahead_blocks_at_allocation", PROBE),
    _d(S + "test_finished_spec_request_caches_completed_blocks", PROBE),
    _d(S + "test_async_output_does_not_cache_inflight_tokens", PROBE),
    _d(S + "test_hybrid_divergent_hit_fallback_is_capped_at_retained_auxiliary_outputs", SEEDED),
    _d(S + "test_hybrid_fa_deeper_hit_respects_connector_lookup_policy", SEEDED),
    _d(S + "test_hybrid_per_group_hit_divergence_with_connector", SEEDED),
    _d(R + "test_decode_bench_fill_does_not_replay", DECODE_BENCH),
)
