"""vLLM's own tests that must fail with kvgov's classes in place, and why (docs/vllm.md lists them).

Every other test that passes on stock vLLM must pass governed (``compare_suites.py``
fails the run otherwise). An entry names a test function (all its parametrizations),
the text its governed failure must contain, and the reason. Two kinds:

* a KV connector, refused at start (``UnsupportedEngine``): its external KV loads
  bypass the scoped keys and the owners (the fleet issue);
* the test looks the cache up with a *probe* request built outside the scheduler:
  never admitted, it carries vLLM's unscoped sha256 hashes and finds nothing keyed
  in a tenant's namespace. That is the isolation working.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIFFERENCES", "Difference"]

CONNECTOR = "cannot govern a KV connector"
PROBE = "assert 0 =="

_REASONS = {
    CONNECTOR: "KV connector: refused at start (external KV loads bypass scoped keys and owners)",
    PROBE: "probes the cache with a request that was never admitted: unscoped keys find nothing",
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
S = "test_scheduler.py::"

DIFFERENCES: tuple[Difference, ...] = (
    _d(P + "test_hisparse_admitted_async_loads_can_finish_with_nothing_running", CONNECTOR),
    _d(P + "test_hisparse_async_admission_requires_full_prompt_host_pages", CONNECTOR),
    _d(S + "test_abort_request_finished_recving", CONNECTOR),
    _d(S + "test_abort_request_waiting_for_remote_kvs", CONNECTOR),
    _d(S + "test_async_load_reservation_prevents_wedge_e2e", CONNECTOR),
    _d(S + "test_delayed_kv_connector_free_keeps_scheduler_active", CONNECTOR),
    _d(S + "test_external_prefix_cache_metrics", CONNECTOR),
    _d(S + "test_has_sync_kv_loads", CONNECTOR),
    _d(S + "test_kv_connector_basic", CONNECTOR),
    _d(S + "test_kv_connector_handles_preemption", CONNECTOR),
    _d(S + "test_kv_connector_honors_skip_reading_prefix_cache", CONNECTOR),
    _d(S + "test_kv_connector_records_external_cache_hit_sources", CONNECTOR),
    _d(S + "test_kv_connector_unable_to_allocate", CONNECTOR),
    _d(S + "test_pause_new_drains_async_kv_loads", CONNECTOR),
    _d(S + "test_prefix_cache_query_not_inflated_by_connector_defer", CONNECTOR),
    _d(S + "test_prefix_hit_is_capped_at_retained_auxiliary_outputs", CONNECTOR),
    _d(S + "test_prepend_skipped_requests_order", CONNECTOR),
    _d(S + "test_priority_scheduling_preemption_and_resumption_when_out_of_kv", CONNECTOR),
    _d(S + "test_spec_decode_padding_resumed_request_without_running_requests", CONNECTOR),
    _d(S + "test_throttle_prefills_defers_remote_kv_resume_with_local_prefill", CONNECTOR),
    _d(S + "test_throttle_prefills_excludes_fully_transferred_remote_kv", CONNECTOR),
    _d(S + "test_hybrid_divergent_hit_fallback_is_capped_at_retained_auxiliary_outputs", CONNECTOR),
    _d(S + "test_hybrid_fa_deeper_hit_respects_connector_lookup_policy", CONNECTOR),
    _d(S + "test_hybrid_per_group_hit_divergence_with_connector", CONNECTOR),
    _d(S + "test_streaming_lookahead_hashes_follow_recomputed_kv", PROBE),
    _d(S + "test_scheduler_publishes_lookahead_blocks_at_allocation", PROBE),
    _d(S + "test_finished_spec_request_caches_completed_blocks", PROBE),
    _d(S + "test_async_output_does_not_cache_inflight_tokens", PROBE),
)
