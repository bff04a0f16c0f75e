"""`kvgov policy test` and `kvgov policy eval`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kvgov.policy.cli import policy_group


def test_policy_group_is_a_click_group() -> None:
    """policy_group is the click group the kvgov CLI mounts."""
    import click

    assert isinstance(policy_group, click.Group)
    assert set(policy_group.commands) == {"test", "eval"}


def test_test_passes_on_the_bundled_policy() -> None:
    """`policy test` exits 0 and prints a summary for the bundled policy."""
    result = CliRunner().invoke(policy_group, ["test"])
    assert result.exit_code == 0, result.output
    assert "0 failed" in result.output and "PASS" in result.output


def test_test_fails_on_a_wrong_policy(bundle_copy: Path) -> None:
    """A deliberately wrong policy (cross-tenant internal sharing allowed) exits non-zero."""
    f = bundle_copy / "sharing.rego"
    f.write_text(
        f.read_text().replace(
            'shareable_classification := "public"', 'shareable_classification := "internal"'
        )
    )
    result = CliRunner().invoke(policy_group, ["test", str(bundle_copy)])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "failed" in result.output


def test_test_reports_a_syntax_error(bundle_copy: Path) -> None:
    """A bundle that does not parse exits 2 naming the file and line."""
    (bundle_copy / "bad.rego").write_text("package kvgov.bad\n\nallow if {\n")
    result = CliRunner().invoke(policy_group, ["test", str(bundle_copy)])
    assert result.exit_code == 2
    assert "bad.rego" in result.output


def test_eval_inline_json(scope: dict[str, Any]) -> None:
    """`policy eval RULE --input JSON` prints the decision as JSON."""
    payload = json.dumps({"scope": scope, "tokens": 3, "priority": None})
    result = CliRunner().invoke(
        policy_group, ["eval", "kvgov/admission/decision", "--input", payload]
    )
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert d["allow"] is True and d["result"]["cache"] is True and d["engine"] == "embedded"


def test_eval_input_file_and_data_file(tmp_path: Path, scope: dict[str, Any]) -> None:
    """--input and --data accept files; data is merged over data.json."""
    inp = tmp_path / "in.json"
    inp.write_text(json.dumps({"scope": scope}))
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"kvgov": {"config": {"retention_seconds": {"internal": 42}}}}))
    result = CliRunner().invoke(
        policy_group, ["eval", "kvgov/retention/decision", "--input", str(inp), "--data", str(data)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["result"]["ttl_seconds"] == 42


def test_eval_bad_json_is_a_usage_error() -> None:
    """Input that is neither a file nor JSON is a usage error."""
    result = CliRunner().invoke(
        policy_group, ["eval", "kvgov/admission/decision", "--input", "{nope"]
    )
    assert result.exit_code == 2


def test_eval_failed_decision_exits_1() -> None:
    """A decision that failed closed (bad path) is printed and exits 1."""
    result = CliRunner().invoke(policy_group, ["eval", "kvgov/../x", "--input", "{}"])
    assert result.exit_code == 1
    assert json.loads(result.output)["error"] is not None
