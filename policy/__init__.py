"""kvgov policy: the Rego bundle and the engines that evaluate it, fail closed.

``PolicyClient`` is what the govern layer uses: typed accessors (admission,
sharing, share groups, retention, offload, classifications) over a decision
cache over an engine: the embedded regorus engine by default, OPA itself
in-process (the reference engine), or an OPA server.
Any engine error, timeout or wrong-shaped result denies. See docs/policy.md.
"""

from kvgov.policy.bundle import BUNDLE_DIR, Bundle, PolicyFile, deep_merge, load_bundle
from kvgov.policy.cache import CachedEngine, CacheStats
from kvgov.policy.client import (
    AdmissionDecision,
    OffloadDecision,
    PolicyClient,
    RetentionDecision,
    ShareGroups,
    SharingDecision,
)
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import Decision, PolicyEngine, normalize_path
from kvgov.policy.opa_server import OpaServerEngine
from kvgov.policy.reference import CoverageReport, FileCoverage, ReferenceEngine
from kvgov.policy.testing import RegoTestReport, RegoTestResult, run_tests

__all__ = [
    "BUNDLE_DIR",
    "AdmissionDecision",
    "Bundle",
    "CacheStats",
    "CachedEngine",
    "CoverageReport",
    "Decision",
    "EmbeddedEngine",
    "FileCoverage",
    "OffloadDecision",
    "OpaServerEngine",
    "PolicyClient",
    "PolicyEngine",
    "PolicyFile",
    "ReferenceEngine",
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
