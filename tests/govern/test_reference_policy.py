"""A governed cache deciding with OPA itself: policy_engine="reference"."""

from __future__ import annotations

from collections.abc import Callable

from kvgov.govern import GovernedKVCache
from kvgov.policy.reference import ReferenceEngine
from tests.support.policy import needs_reference

from .conftest import make_scope

pytestmark = needs_reference


def test_a_cache_admits_and_reuses_with_the_reference_engine(
    make_cache: Callable[..., GovernedKVCache],
) -> None:
    """GovernedKVCache.create(policy_engine="reference") decides on OPA: a tenant without
    overrides is admitted and cached (on OPA it failed closed before the bundle's fix),
    and the same prompt is served from cache."""
    cache = make_cache(policy_engine="reference")
    assert isinstance(cache.policy.engine.engine, ReferenceEngine)
    tokens = list(range(40))
    first = cache.admit("r1", make_scope(), tokens)
    assert first.decision_id and first.cached_tokens == 0
    cache.release("r1")
    again = cache.admit("r2", make_scope(), tokens)
    assert again.cached_tokens > 0
    cache.release("r2")
