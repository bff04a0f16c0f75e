"""Policy decision latency: cached, embedded (regorus) and reference (OPA) uncached, OPA server.

Run: .venv/bin/python benchmarks/bench_policy.py [--quick]

Figures (median of repeats, microseconds per decision, this machine):
  cached            PolicyClient.admission on a cache hit (scope-tuple key, kept typed answer)
  cache lookup      CachedEngine.evaluate with a caller key (the LRU alone)
  embedded <rule>   EmbeddedEngine.evaluate, no cache, per bundle rule
  reference <rule>  ReferenceEngine.evaluate (OPA v1.20.2 in-process), no cache, per rule
  reference batch   ReferenceEngine.evaluate_many, 100 admissions per call, per decision
  reference cached  PolicyClient.admission over the reference engine, a cache hit
  opa loopback      OpaServerEngine against tests/policy/opa_fake.py on 127.0.0.1
                    (Python http.server answering from the reference engine)
Targets: cached <= 2 us, embedded uncached <= 50 us (none for the reference engine:
about 120 us on a quiet machine is what OPA costs; the cache in front takes the rest).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgov.policy.client import PolicyClient, scope_key
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.opa_server import OpaServerEngine
from kvgov.policy.reference import ReferenceEngine
from tests.policy.opa_fake import FakeOpa
from tests.policy.samples import SCOPE

ADMISSION_INPUT: dict[str, Any] = {"scope": SCOPE, "tokens": 512, "priority": None}
RULES: dict[str, tuple[str, dict[str, Any]]] = {
    "admission": ("kvgov/admission/decision", ADMISSION_INPUT),
    "sharing": ("kvgov/sharing/decision", {"requester": SCOPE, "owner": SCOPE}),
    "groups": ("kvgov/sharing/groups", {"scope": SCOPE}),
    "retention": ("kvgov/retention/decision", {"scope": SCOPE}),
    "offload": ("kvgov/offload/decision", {"scope": SCOPE, "tier": "host"}),
}


def per_call_us(fn: Callable[[], object], n: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean microseconds per call of ``n`` calls."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (few iterations)")
    args = parser.parse_args()
    scale = 1 if args.quick else 20
    repeats = 3 if args.quick else 7

    engine = EmbeddedEngine()
    client = PolicyClient(EmbeddedEngine(run_tests=False))
    cached = client.engine
    key = (scope_key(SCOPE), 512, None)

    rows: list[tuple[str, float]] = []
    cached_us = per_call_us(lambda: client.admission(SCOPE, 512, None), 2000 * scale, repeats)
    rows.append(("cached (PolicyClient.admission hit)", cached_us))
    lookup_us = per_call_us(
        lambda: cached.evaluate("kvgov/admission/decision", ADMISSION_INPUT, key=key),
        2000 * scale,
        repeats,
    )
    rows.append(("cache lookup (CachedEngine, caller key)", lookup_us))
    json_key_us = per_call_us(
        lambda: cached.evaluate("kvgov/admission/decision", ADMISSION_INPUT), 500 * scale, repeats
    )
    rows.append(("cache lookup (canonical JSON key)", json_key_us))
    embedded: dict[str, float] = {}
    for name, (path, inp) in RULES.items():
        embedded[name] = per_call_us(partial(engine.evaluate, path, inp), 100 * scale, repeats)
        rows.append((f"embedded uncached: {name}", embedded[name]))

    reference = ReferenceEngine(run_tests=False)
    ref: dict[str, float] = {}
    for name, (path, inp) in RULES.items():
        reference.evaluate(path, inp)  # OPA prepares each rule's query once (~0.1 s)
        ref[name] = per_call_us(partial(reference.evaluate, path, inp), 20 * scale, repeats)
        rows.append((f"reference uncached: {name}", ref[name]))
    batch = [ADMISSION_INPUT] * 100
    ref_batch_us = (
        per_call_us(
            lambda: reference.evaluate_many("kvgov/admission/decision", batch), scale, repeats
        )
        / 100
    )
    rows.append(("reference batch (evaluate_many): admission", ref_batch_us))
    ref_client = PolicyClient(reference)
    ref_cached_us = per_call_us(
        lambda: ref_client.admission(SCOPE, 512, None), 2000 * scale, repeats
    )
    rows.append(("reference cached (PolicyClient.admission hit)", ref_cached_us))

    server = FakeOpa(reference)
    opa = OpaServerEngine(server.url, timeout=5.0)
    try:
        opa_us = per_call_us(
            lambda: opa.evaluate("kvgov/admission/decision", ADMISSION_INPUT), 20 * scale, repeats
        )
    finally:
        opa.close()
        server.close()
        reference.close()
    rows.append(("opa server, loopback: admission", opa_us))

    width = max(len(r[0]) for r in rows)
    print(f"{'decision':<{width}}  {'us/decision':>12}")
    print("-" * (width + 14))
    for label, us in rows:
        print(f"{label:<{width}}  {us:>12.2f}")
    print()
    print(f"embedded admission / cached: {embedded['admission'] / cached_us:.0f}x")
    print(f"reference / embedded admission: {ref['admission'] / embedded['admission']:.1f}x")
    print(f"opa loopback / embedded admission: {opa_us / embedded['admission']:.1f}x")
    print(
        f"targets: cached <= 2 us ({'met' if cached_us <= 2 else 'MISSED'}), "
        f"embedded <= 50 us ({'met' if embedded['admission'] <= 50 else 'MISSED'})"
    )
    print(f"RESULT policy_cached_us={cached_us:.2f}")
    print(f"RESULT policy_cache_lookup_us={lookup_us:.2f}")
    print(f"RESULT policy_cache_json_key_us={json_key_us:.2f}")
    print(f"RESULT policy_embedded_us={embedded['admission']:.2f}")
    for name, us in embedded.items():
        print(f"RESULT policy_embedded_{name}_us={us:.2f}")
    for name, us in ref.items():
        print(f"RESULT policy_reference_{name}_us={us:.2f}")
    print(f"RESULT policy_reference_us={ref['admission']:.2f}")
    print(f"RESULT policy_reference_batch_us={ref_batch_us:.2f}")
    print(f"RESULT policy_reference_cached_us={ref_cached_us:.2f}")
    print(f"RESULT policy_opa_loopback_us={opa_us:.2f}")
    print(f"RESULT policy_embedded_over_cached_x={embedded['admission'] / cached_us:.1f}")


if __name__ == "__main__":
    main()
