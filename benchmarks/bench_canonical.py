"""Cost of kvgov.canonical.canonical_json (RFC 8785) on the values kvgov encodes.

Run: .venv/bin/python benchmarks/bench_canonical.py [--quick]

Figures (median of repeats, microseconds per call, this machine):
  policy input      the admission input of benchmarks/bench_policy.py (a scope dict)
  audit details     an erasure event's details (ints, a float, nested dict)
  rfc example       RFC 8785 section 3.2.2's example (floats the fast path hands over)
  JSONEncoder       json.JSONEncoder(sort_keys, compact).encode on the policy input: plain
                    sorted JSON, no RFC 8785 check (it builds its C encoder per call)
  cache, json key   CachedEngine.evaluate with no caller key: canonical key + LRU hit
No target: the figures show what RFC 8785 costs against plain sorted JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_policy import per_call_us

from kvgov.canonical import canonical_json
from kvgov.policy.cache import CachedEngine
from kvgov.policy.embedded import EmbeddedEngine
from tests.policy.samples import SCOPE

POLICY_INPUT: dict[str, Any] = {"scope": SCOPE, "tokens": 512, "priority": None}
DETAILS: dict[str, Any] = {
    "bytes_zeroized": 1_048_576,
    "seconds": 0.00125,
    "verified": True,
    "offload": {"deleted": {"host": 3, "disk": 0}, "unreachable": [], "shredded": True},
}
RFC_EXAMPLE: Any = json.loads(
    '{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
    '"string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
    '"literals": [null, true, false]}'
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (few iterations)")
    args = parser.parse_args()
    n = 2000 if args.quick else 20000
    repeats = 3 if args.quick else 9
    c_encode = json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode
    cached = CachedEngine(EmbeddedEngine(run_tests=False))
    rows = [
        ("policy input", per_call_us(lambda: canonical_json(POLICY_INPUT), n, repeats)),
        ("audit details", per_call_us(lambda: canonical_json(DETAILS), n, repeats)),
        ("rfc example", per_call_us(lambda: canonical_json(RFC_EXAMPLE), n // 10, repeats)),
        ("JSONEncoder", per_call_us(lambda: c_encode(POLICY_INPUT), n, repeats)),
        (
            "cache, json key",
            per_call_us(
                lambda: cached.evaluate("kvgov/admission/decision", POLICY_INPUT), n, repeats
            ),
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'value':<{width}}  {'us/call':>8}")
    for label, us in rows:
        print(f"{label:<{width}}  {us:>8.2f}")
    for label, us in rows:
        print(f"RESULT canonical_{label.replace(' ', '_').replace(',', '')}_us={us:.2f}")


if __name__ == "__main__":
    main()
