"""Comparing two bundles on generated inputs, without history (``kvgov policy diff``).

Replay (:mod:`kvgov.policy.replay`) asks what a change would have done to
recorded traffic; diff asks what it does to every request the configuration
can tell apart. The inputs are generated from both bundles' data, so a change
to either side's configuration is exercised:

- tenants: every tenant either bundle configures (``tenants``, share-group
  publishers and readers), and two no bundle names (so that cross-tenant
  sharing is asked even of a bundle that configures no tenant);
- classifications: every label either bundle lists, and one neither does;
- scopes: each tenant and label with no adapter and with one;
- admission: each scope with token counts 0, 1, 512 and every configured
  limit and limit + 1 (either bundle's ``max_tokens``, a tenant's), and
  priorities null, 0, 50, 100 and every configured default;
- sharing: each pair of tenants (a tenant with itself too) on the same scope,
  and one pair that differs in the model revision;
- retention, share groups: each scope; offload: each scope with every tier
  either bundle lists and ``gpu``;
- and a few malformed inputs per rule (no scope, a field missing, negative or
  fractional tokens, a priority out of range, an empty tier), whose outcome is
  the deny both bundles should give.

Every input is evaluated through :class:`~kvgov.policy.client.PolicyClient` on both
bundles and outcomes are compared as replay compares them
(:mod:`kvgov.policy.review`). Inputs are deterministic, so a diff is repeatable.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from kvgov.policy.client import (
    ADMISSION_PATH,
    GROUPS_PATH,
    OFFLOAD_PATH,
    RETENTION_PATH,
    SHARING_PATH,
    PolicyClient,
)
from kvgov.policy.review import Change, ReviewReport, compare, evaluate_outcome, who

__all__ = ["diff_bundles", "generate_inputs"]

#: The scope every generated one is built from (tenant and label replaced).
BASE_SCOPE: Final[Mapping[str, Any]] = {
    "tenant": "acme",
    "classification": "internal",
    "model": "llama-3-8b",
    "model_revision": "r1",
    "adapter": None,
    "adapter_revision": None,
    "tokenizer": "llama3",
    "tokenizer_revision": "v1",
    "template_version": "sys-v3",
}
_UNNAMED_TENANTS: Final = ("kvgov-diff-tenant-a", "kvgov-diff-tenant-b")
_UNLISTED_LABEL: Final = "kvgov-diff-unlisted-label"


def _config(data: Mapping[str, Any]) -> Mapping[str, Any]:
    kvgov = data.get("kvgov")
    config = kvgov.get("config") if isinstance(kvgov, Mapping) else None
    return config if isinstance(config, Mapping) else {}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _numbers(values: Iterable[Any]) -> list[int | float]:
    return [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


def _tenants(configs: list[Mapping[str, Any]]) -> list[str]:
    names: set[str] = set()
    for config in configs:
        names.update(k for k in _mapping(config.get("tenants")) if k)
        for group in _mapping(config.get("share_groups")).values():
            group = _mapping(group)
            names.update(_strings(group.get("publishers")) + _strings(group.get("readers")))
    unnamed = [t for t in _UNNAMED_TENANTS if t not in names]
    return [*sorted(n for n in names if n), *unnamed]


def _labels(configs: list[Mapping[str, Any]]) -> list[str]:
    labels: set[str] = set()
    for config in configs:
        labels.update(_strings(config.get("classifications")))
    return [*sorted(labels), _UNLISTED_LABEL]


def _token_counts(configs: list[Mapping[str, Any]]) -> list[int | float]:
    limits: list[Any] = []
    for config in configs:
        limits.append(config.get("max_tokens"))
        limits += [_mapping(t).get("max_tokens") for t in _mapping(config.get("tenants")).values()]
    counts: set[int | float] = {0, 1, 512}
    for limit in _numbers(limits):
        if 0 <= limit < 2**53:
            counts.update({limit, int(limit) + 1})
    return sorted(counts)


def _priorities(configs: list[Mapping[str, Any]]) -> list[int | float | None]:
    values: list[Any] = [0, 50, 100]
    for config in configs:
        values.append(config.get("default_priority"))
        values += [_mapping(t).get("priority") for t in _mapping(config.get("tenants")).values()]
    return [None, *sorted(set(_numbers(values)))]


def _tiers(configs: list[Mapping[str, Any]]) -> list[str]:
    tiers = {"gpu"}
    for config in configs:
        for listed in _mapping(config.get("offload_tiers")).values():
            tiers.update(_strings(listed))
    return sorted(tiers)


def _malformed(scope: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    missing = {k: v for k, v in scope.items() if k != "model"}
    return {
        ADMISSION_PATH: [
            {},
            {"scope": missing, "tokens": 1, "priority": None},
            {"scope": scope, "tokens": -1, "priority": None},
            {"scope": scope, "tokens": 1.5, "priority": None},
            {"scope": scope, "tokens": 1, "priority": 101},
        ],
        SHARING_PATH: [{}, {"requester": missing, "owner": missing}],
        RETENTION_PATH: [{}, {"scope": missing}],
        GROUPS_PATH: [{}, {"scope": missing}],
        OFFLOAD_PATH: [{}, {"scope": scope, "tier": ""}, {"scope": missing, "tier": "cpu"}],
    }


def generate_inputs(*data: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Generate the inputs a diff evaluates (see the module docstring).

    Args:
        data: the merged data of each bundle compared (``Bundle.data``).

    Yields:
        ``(rule path, policy input)``, deterministically.
    """
    configs = [_config(d) for d in data]
    tenants, labels = _tenants(configs), _labels(configs)
    scopes = [
        {**BASE_SCOPE, "tenant": t, "classification": c, "adapter": a, "adapter_revision": r}
        for t in tenants
        for c in labels
        for a, r in ((None, None), ("lora", "a1"))
    ]
    counts, priorities, tiers = _token_counts(configs), _priorities(configs), _tiers(configs)
    for scope in scopes:
        for tokens in counts:
            for priority in priorities:
                yield ADMISSION_PATH, {"scope": scope, "tokens": tokens, "priority": priority}
        yield RETENTION_PATH, {"scope": scope}
        yield GROUPS_PATH, {"scope": scope}
        for tier in tiers:
            yield OFFLOAD_PATH, {"scope": scope, "tier": tier}
        if scope["tenant"] == tenants[0]:
            other = {**scope, "model_revision": "r2"}
            yield SHARING_PATH, {"requester": other, "owner": scope}
        for requester in tenants:
            yield SHARING_PATH, {"requester": {**scope, "tenant": requester}, "owner": scope}
    for path, inputs in _malformed({**BASE_SCOPE, "tenant": tenants[0]}).items():
        for policy_input in inputs:
            yield path, policy_input


def diff_bundles(
    old: PolicyClient,
    new: PolicyClient,
    inputs: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    max_examples: int = 3,
) -> ReviewReport:
    """Evaluate inputs on two bundles and count the outcomes that differ.

    Args:
        old: a client over the bundle before the change.
        new: a client over the bundle after it.
        inputs: ``(rule path, input)`` pairs, e.g. :func:`generate_inputs`.
        max_examples: differences kept as examples per kind.

    Returns:
        The report: ``before`` is the old bundle's outcome, ``after`` the new one's.
    """
    report = ReviewReport(max_examples=max_examples)
    for path, policy_input in inputs:
        before = evaluate_outcome(old, path, policy_input)
        after = evaluate_outcome(new, path, policy_input)
        report.evaluated += 1
        kinds = compare(path, before, after)
        if not kinds:
            continue
        tenant, classification = who(path, policy_input)
        for kind in kinds:
            report.add(Change(kind, path, tenant, classification, policy_input, before, after))
    return report
