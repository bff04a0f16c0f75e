"""`kvgov policy` in CI: eval --fail-on-deny, test --format json and --junit FILE."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvgov.cli.policy import policy_group
from kvgov.policy.runner import run_tests
from tests.support.policy import needs_reference

ADMISSION = "kvgov/admission/decision"


def _eval(scope: dict[str, Any], *flags: str) -> tuple[int, dict[str, Any]]:
    payload = json.dumps({"scope": scope, "tokens": 3, "priority": None})
    result = CliRunner().invoke(policy_group, ["eval", ADMISSION, "--input", payload, *flags])
    return result.exit_code, json.loads(result.output)


def test_eval_fail_on_deny_exits_1_on_a_deny(scope: dict[str, Any]) -> None:
    """A deny exits 0 by default (the decision is the output) and 1 with --fail-on-deny."""
    denied = {**scope, "classification": "bogus"}
    code, decision = _eval(denied)
    assert code == 0 and decision["allow"] is False
    code, decision = _eval(denied, "--fail-on-deny")
    assert code == 1 and decision["allow"] is False and "bogus" in decision["reason"]


def test_eval_fail_on_deny_exits_0_on_an_allow(scope: dict[str, Any]) -> None:
    """An allow stays exit 0 with --fail-on-deny."""
    code, decision = _eval(scope, "--fail-on-deny")
    assert code == 0 and decision["allow"] is True


def test_test_format_json_reports_every_test() -> None:
    """--format json: one object, a report per engine, one result per test_ rule."""
    result = CliRunner().invoke(policy_group, ["test", "--format", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    [embedded] = out["engines"]
    names = {r["qualified_name"] for r in embedded["results"]}
    assert out["passed"] is True and embedded["engine"] == "embedded"
    assert names == {r.qualified_name for r in run_tests().results}
    assert embedded["tests"] == len(names) and embedded["failed"] == 0


def _broken(bundle_copy: Path) -> Path:
    (bundle_copy / "ci_test.rego").write_text(
        "package ci.checks_test\n\nimport rego.v1\n\n"
        "test_passes if true\n\ntest_is_false := false\n\ntest_undefined if { 1 == 2 }\n"
    )
    return bundle_copy


def test_test_format_json_marks_failures(bundle_copy: Path) -> None:
    """Failing tests: exit 1, passed false, each failure with its detail."""
    result = CliRunner().invoke(
        policy_group, ["test", str(_broken(bundle_copy)), "--format", "json"]
    )
    assert result.exit_code == 1
    [report] = json.loads(result.output)["engines"]
    failed = {r["name"]: r["detail"] for r in report["results"] if not r["passed"]}
    assert failed == {"test_is_false": "false", "test_undefined": "undefined"}


@pytest.mark.parametrize("engine", ["embedded", pytest.param("reference", marks=needs_reference)])
def test_junit_file_has_one_testcase_per_test_and_marks_failures(
    bundle_copy: Path, tmp_path: Path, engine: str
) -> None:
    """--junit FILE: parseable XML, one testcase per Rego test, failures marked."""
    bundle = _broken(bundle_copy)
    junit = tmp_path / "out" / "rego.xml"
    junit.parent.mkdir()
    result = CliRunner().invoke(
        policy_group, ["test", str(bundle), "--engine", engine, "--junit", str(junit)]
    )
    assert result.exit_code == 1
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    [suite] = root.findall("testsuite")
    cases = suite.findall("testcase")
    expected = run_tests(bundle, engine=engine).results
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        (r.package, r.name) for r in expected
    ]
    failing = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failing) == {"test_is_false", "test_undefined"}
    assert failing["test_undefined"].get("type") == "undefined"  # type: ignore[union-attr]
    assert suite.get("tests") == str(len(expected)) and suite.get("failures") == "2"
    assert root.get("failures") == "2"


@needs_reference
def test_junit_on_both_engines_has_a_suite_each(tmp_path: Path) -> None:
    """--engine both: one testsuite per engine, each with every test, all passing."""
    junit = tmp_path / "rego.xml"
    result = CliRunner().invoke(policy_group, ["test", "--engine", "both", "--junit", str(junit)])
    assert result.exit_code == 0, result.output
    suites = ET.parse(junit).getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == ["rego (embedded engine)", "rego (reference engine)"]
    n = len(run_tests().results)
    assert all(len(s.findall("testcase")) == n and s.get("failures") == "0" for s in suites)


def test_test_output_in_a_pipe_keeps_every_name_whole() -> None:
    """Not a terminal: every qualified test name is printed whole, nothing cut with `…`."""
    result = CliRunner().invoke(policy_group, ["test"])
    assert result.exit_code == 0 and "…" not in result.output
    for r in run_tests().results:
        assert r.qualified_name in result.output
