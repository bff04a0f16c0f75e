"""vLLM's hybrid Mamba tests that seed the cache with an unadmitted request, seeded admitted.

``differences.py`` lists vLLM 0.33's three hybrid Mamba scheduler tests (``SEEDED``):
they fill the cache through the KV cache manager with a request built outside the
scheduler (``_seed_hybrid_prefix``), whose blocks are cached under vLLM's unscoped
hashes, so the admitted request they then schedule finds none of them. Here the same
test functions run governed with every request they build admitted first (the suite's
default tenant), so the seeding caches in the scoped namespace: every case must then
pass, which shows the differences come from the seeding alone, not from how kvgov
governs the Mamba state group.

Run by ``make test-vllm`` from the folder holding vLLM's ``tests/``, with
``-p kvgov_vllm_suite`` (``run_test_vllm.py``); not a kvgov test module (no ``test_``
prefix: kvgov's own pytest never collects it).
"""

from __future__ import annotations

from typing import Any

import pytest

import tests.v1.core.test_scheduler as vllm_tests

_BINDING: list[Any] = []


def _seed(manager: Any, *args: Any, **kwargs: Any) -> Any:
    _BINDING[:] = [manager.kvgov]  # the governed manager's binding: admit what is built next
    return _SEED(manager, *args, **kwargs)


def _create(*args: Any, **kwargs: Any) -> Any:
    requests = _CREATE(*args, **kwargs)
    for request in requests:
        if _BINDING:
            assert _BINDING[0].admit(request) is None
    return requests


_SEED = vllm_tests._seed_hybrid_prefix
_CREATE = vllm_tests.create_requests


@pytest.fixture(autouse=True)
def _admitted(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgov.govern.vllm.scheduler import GovernedScheduler

    _BINDING.clear()
    monkeypatch.setattr(vllm_tests, "Scheduler", GovernedScheduler)
    monkeypatch.setattr(vllm_tests, "_seed_hybrid_prefix", _seed)
    monkeypatch.setattr(vllm_tests, "create_requests", _create)


@pytest.mark.parametrize(("matched", "expected"), [(0, 16), (16, 32)])
def test_hybrid_per_group_hit_divergence_with_connector(matched: int, expected: int) -> None:
    vllm_tests.test_hybrid_per_group_hit_divergence_with_connector(matched, expected)


@pytest.mark.parametrize(("max_hit", "expected"), [(95, 80), (0, 0)])
def test_hybrid_divergent_hit_fallback_is_capped(max_hit: int, expected: int) -> None:
    vllm_tests.test_hybrid_divergent_hit_fallback_is_capped_at_retained_auxiliary_outputs(
        max_hit, expected
    )


@pytest.mark.parametrize(
    ("divergent", "matched", "blocks", "expected"),
    [(True, 0, 5, 16), (True, 16, 6, 80), (False, 16, 6, 32)],
)
def test_hybrid_fa_deeper_hit_respects_connector_lookup_policy(
    divergent: bool, matched: int, blocks: int, expected: int
) -> None:
    vllm_tests.test_hybrid_fa_deeper_hit_respects_connector_lookup_policy(
        divergent, matched, blocks, expected
    )
