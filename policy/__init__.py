"""kvgov policy: the Rego bundle and the engines that evaluate it, fail closed.

``PolicyClient`` is what the govern layer uses: typed accessors (admission,
sharing, share groups, retention, offload, classifications) over a decision
cache over an engine: the embedded regorus engine by default, OPA itself
in-process (the reference engine), or an OPA server.
Any engine error, timeout or wrong-shaped result denies. For a policy review:
:func:`run_tests` on either engine (with OPA's coverage), :func:`diff_bundles`
over :func:`generate_inputs`, and :func:`replay` of recorded decisions. See
docs/policy.md.
"""

from kvgov.policy.bundle import BUNDLE_DIR, Bundle, PolicyFile, deep_merge
from kvgov.policy.cache import CachedEngine, CacheStats
from kvgov.policy.client import (
    AdmissionDecision,
    CacheAmount,
    EvictionSettings,
    OffloadDecision,
    PolicyClient,
    RetentionDecision,
    ShareGroups,
    SharingDecision,
    TenantEviction,
)
from kvgov.policy.diff import diff_bundles, generate_inputs
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import Decision, PolicyEngine, normalize_path
from kvgov.policy.opa_server import OpaServerEngine
from kvgov.policy.reference import ReferenceEngine
from kvgov.policy.replay import read_decision_log, replay
from kvgov.policy.review import Change, Outcome, ReviewReport
from kvgov.policy.runner import run_tests
from kvgov.policy.testing import (
    CoverageReport,
    FileCoverage,
    RegoTestReport,
    RegoTestResult,
    load_bundle,
)

__all__ = [
    "BUNDLE_DIR",
    "AdmissionDecision",
    "Bundle",
    "CacheAmount",
    "CacheStats",
    "CachedEngine",
    "Change",
    "CoverageReport",
    "Decision",
    "EmbeddedEngine",
    "EvictionSettings",
    "FileCoverage",
    "OffloadDecision",
    "OpaServerEngine",
    "Outcome",
    "PolicyClient",
    "PolicyEngine",
    "PolicyFile",
    "ReferenceEngine",
    "RegoTestReport",
    "RegoTestResult",
    "RetentionDecision",
    "ReviewReport",
    "ShareGroups",
    "SharingDecision",
    "TenantEviction",
    "deep_merge",
    "diff_bundles",
    "generate_inputs",
    "load_bundle",
    "normalize_path",
    "read_decision_log",
    "replay",
    "run_tests",
]
