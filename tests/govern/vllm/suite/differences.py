"""vLLM's own tests that must fail with kvgov's classes in place, and why (docs/vllm.md lists them).

Every other test that passes on stock vLLM must pass governed (``compare_suites.py``
fails the run otherwise). An entry names a test function (all its parametrizations),
the text its governed failure must contain, and the reason. One kind is left:
the test looks the cache up with a *probe* request built outside the scheduler:
  never admitted, it carries vLLM's unscoped sha256 hashes and finds nothing keyed
  in a tenant's namespace. That is the isolation working.
And two refusals: the test builds a scheduler over a Mamba state group, which kvgov
  refuses at start with ``UnsupportedEngine`` (docs/vllm.md, "KV layouts: governed and
  refused": vLLM's worker zeroer clears attention layers only); or it starts vLLM's
  ``DecodeBenchConnector``, refused by name (it fills KV with synthetic data).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIFFERENCES", "Difference"]

PROBE = "assert 0 =="
MAMBA = "kvgov cannot govern a Mamba state group"
DECODE_BENCH = "kvgov cannot govern the KV connector"

_REASONS = {
    PROBE: "probes the cache with a request that was never admitted: unscoped keys find nothing",
    MAMBA: "builds a Mamba state group, which kvgov refuses at start (its worker zeroer "
    "clears attention layers only)",
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
    _d(S + "test_hybrid_divergent_hit_fallback_is_capped_at_retained_auxiliary_outputs", MAMBA),
    _d(S + "test_hybrid_fa_deeper_hit_respects_connector_lookup_policy", MAMBA),
    _d(S + "test_hybrid_per_group_hit_divergence_with_connector", MAMBA),
    _d(R + "test_decode_bench_fill_does_not_replay", DECODE_BENCH),
)
