"""`kvgov policy diff`: two bundles compared on inputs generated from their configuration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kvgov.cli.policy import policy_group
from kvgov.policy.bundle import BUNDLE_DIR
from kvgov.policy.client import PolicyClient
from kvgov.policy.diff import diff_bundles, generate_inputs
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.testing import load_bundle
from tests.support.policy import needs_reference

OLD: dict[str, Any] = {
    "kvgov": {"config": {"tenants": {"acme": {"max_tokens": 4096}}, "max_tokens": 8192}}
}
NEW: dict[str, Any] = {
    "kvgov": {
        "config": {
            "classifications": ["public", "internal", "confidential", "restricted", "secret"],
            "share_groups": {
                "docs": {
                    "publishers": ["globex"],
                    "readers": ["initech"],
                    "classifications": ["public"],
                }
            },
        }
    }
}


def data(over: dict[str, Any]) -> dict[str, Any]:
    return dict(load_bundle(policy_data=over, run_tests=False).data)


def test_inputs_cover_every_configured_tenant_label_and_limit() -> None:
    """Tenants, labels and token limits of either bundle appear, with an unnamed tenant
    pair and an unlisted label; limits are asked at and just above."""
    inputs = list(generate_inputs(data(OLD), data(NEW)))
    scopes = [i["scope"] for p, i in inputs if p == "kvgov/retention/decision" and "scope" in i]
    tenants = {s["tenant"] for s in scopes if isinstance(s, dict)}
    assert {"acme", "globex", "initech", "kvgov-diff-tenant-a", "kvgov-diff-tenant-b"} <= tenants
    labels = {s["classification"] for s in scopes if isinstance(s, dict)}
    assert {"secret", "kvgov-diff-unlisted-label", "public", "restricted"} <= labels
    tokens = {i["tokens"] for p, i in inputs if p == "kvgov/admission/decision" and "tokens" in i}
    assert {4096, 4097, 8192, 8193} <= tokens
    assert inputs == list(generate_inputs(data(OLD), data(NEW)))  # repeatable


def test_a_bundle_against_itself_differs_nowhere() -> None:
    """The same bundle twice: every generated decision is the same."""
    inputs = list(generate_inputs(data({})))
    old = PolicyClient(EmbeddedEngine(run_tests=False))
    new = PolicyClient(EmbeddedEngine(run_tests=False))
    report = diff_bundles(old, new, inputs)
    assert report.evaluated == len(inputs) > 100 and report.changed == 0


def test_a_new_share_group_and_limit_are_found(tmp_path: Path) -> None:
    """diff reports the sharing grant a new group adds and the admissions a lower limit
    denies, with the revisions, as JSON; --fail-on-change exits 1."""
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(BUNDLE_DIR, old)
    shutil.copytree(BUNDLE_DIR, new)
    config = json.loads((new / "data.json").read_text())
    config["kvgov"]["config"]["share_groups"] = NEW["kvgov"]["config"]["share_groups"]
    config["kvgov"]["config"]["max_tokens"] = 4096
    (new / "data.json").write_text(json.dumps(config))
    result = CliRunner().invoke(
        policy_group, ["diff", str(old), str(new), "--json", "--fail-on-change"]
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["old_revision"] != report["new_revision"]
    rows = {(r["kind"], r["tenant"], r["classification"]) for r in report["counts"]}
    assert ("sharing_gained", "initech", "public") in rows
    assert ("groups_changed", "globex", "public") in rows
    assert report["by_kind"]["admission_denied"] > 0
    denied = report["examples"]["admission_denied"][0]
    assert denied["input"]["tokens"] > 4096 and "max_tokens 4096" in denied["after"]["reason"]
    same = CliRunner().invoke(policy_group, ["diff", str(old), str(old), "--fail-on-change"])
    assert same.exit_code == 0 and "0 would change" in same.output


@needs_reference
def test_diff_on_the_reference_engine() -> None:
    """--engine reference evaluates both bundles on OPA."""
    result = CliRunner().invoke(
        policy_group, ["diff", str(BUNDLE_DIR), str(BUNDLE_DIR), "--engine", "reference", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["changed"] == 0
