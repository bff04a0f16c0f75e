"""`kvgov policy test` (both engines, coverage) and `kvgov policy eval`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kvgov.cli.policy import policy_group
from tests.support.policy import needs_reference


def test_policy_group_is_a_click_group() -> None:
    """policy_group is the click group the kvgov CLI mounts (which adds replay)."""
    import click

    import kvgov.cli.main  # noqa: F401  (mounts `policy replay`, whatever ran before)

    assert isinstance(policy_group, click.Group)
    assert set(policy_group.commands) == {"test", "eval", "diff", "replay"}


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


@needs_reference
def test_test_runs_on_both_engines() -> None:
    """`policy test --engine both` runs the tests on regorus and on OPA and reports each."""
    result = CliRunner().invoke(policy_group, ["test", "-q", "--engine", "both"])
    assert result.exit_code == 0, result.output
    assert "0 failed on the embedded engine" in result.output
    assert "0 failed on the reference engine" in result.output


@needs_reference
def test_an_opa_only_defect_fails_on_the_reference_engine(bundle_copy: Path) -> None:
    """The OPA #1877 defect put back (`not n > t.max_tokens` added to the hot path):
    regorus passes the bundle, OPA fails it, and `policy test --engine reference` exits 1."""
    f = bundle_copy / "admission.rego"
    source = f.read_text()
    limit = (
        '\tlimit := object.get(t, "max_tokens", data.kvgov.config.max_tokens)\n'
        "\tis_number(limit)\n\tn <= limit\n"
    )
    assert limit in source
    f.write_text(source.replace(limit, limit + "\tnot n > t.max_tokens\n"))
    embedded = CliRunner().invoke(policy_group, ["test", "-q", str(bundle_copy)])
    assert embedded.exit_code == 0, embedded.output
    reference = CliRunner().invoke(
        policy_group, ["test", "-q", "--engine", "reference", str(bundle_copy)]
    )
    assert reference.exit_code == 1
    failed = re.search(r"(\d+) failed on the reference engine", reference.output)
    assert failed is not None and int(failed.group(1)) >= 10  # 13 when written


@needs_reference
def test_coverage_is_printed_and_its_floor_enforced(bundle_copy: Path) -> None:
    """--coverage prints each module's coverage (OPA runs too); --min-coverage fails a
    bundle whose tests leave too much uncovered."""
    result = CliRunner().invoke(policy_group, ["test", "-q", "--coverage"])
    assert result.exit_code == 0, result.output
    assert "sharing.rego" in result.output and "coverage: " in result.output
    (bundle_copy / "sharing_test.rego").unlink()
    low = CliRunner().invoke(policy_group, ["test", "-q", "--min-coverage", "90", str(bundle_copy)])
    assert low.exit_code == 1
    assert "coverage is below 90%" in low.output


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
