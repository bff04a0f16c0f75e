"""kvgov policy: the Rego bundle and the engines that evaluate it, fail closed.

``PolicyClient`` is what the govern layer uses: typed accessors (admission,
sharing, share groups, retention, offload, classifications) over a decision
cache over an engine, the embedded regorus engine by default or an OPA server.
Any engine error, timeout or wrong-shaped result denies. See docs/policy.md.
"""

from policy.bundle import BUNDLE_DIR, Bundle, PolicyFile, deep_merge, load_bundle
from policy.cache import CachedEngine, CacheStats
from policy.client import (
    AdmissionDecision,
    OffloadDecision,
    PolicyClient,
    RetentionDecision,
    ShareGroups,
    SharingDecision,
)
from policy.embedded import EmbeddedEngine
from policy.engine import Decision, PolicyEngine, normalize_path
from policy.opa_server import OpaServerEngine
from policy.testing import RegoTestReport, RegoTestResult, run_tests

__all__ = [
    "BUNDLE_DIR",
    "AdmissionDecision",
    "Bundle",
    "CacheStats",
    "CachedEngine",
    "Decision",
    "EmbeddedEngine",
    "OffloadDecision",
    "OpaServerEngine",
    "PolicyClient",
    "PolicyEngine",
    "PolicyFile",
    "RegoTestReport",
    "RegoTestResult",
    "RetentionDecision",
    "ShareGroups",
    "SharingDecision",
    "deep_merge",
    "load_bundle",
    "normalize_path",
    "run_tests",
]
