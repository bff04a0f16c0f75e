"""The Rego test runner, and the bundle's own tests through the embedded engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgov.exceptions import PolicyLoadError
from kvgov.policy.runner import run_tests
from tests.support.policy import needs_reference


def test_every_bundle_test_passes() -> None:
    """Every test_ rule of the bundled policy passes in the embedded engine."""
    report = run_tests()
    failing = [f"{r.qualified_name}: {r.detail}" for r in report.results if not r.passed]
    assert failing == []
    assert len(report.results) >= 60


def test_every_decision_package_has_tests() -> None:
    """Each decision package of the bundle has its own test package."""
    packages = {r.package for r in run_tests().results}
    for p in ("admission", "sharing", "retention", "offload", "scope"):
        assert f"kvgov.{p}_test" in packages


def test_wrong_policy_fails_its_tests(bundle_copy: Path) -> None:
    """A deliberately wrong policy (restricted cached) makes named tests fail."""
    f = bundle_copy / "admission.rego"
    source = f.read_text()
    wrong = source.replace('cls == "restricted"\n} else', 'cls == "nothing"\n} else', 1)
    assert wrong != source
    f.write_text(wrong)
    report = run_tests(bundle_copy)
    assert not report.passed
    assert "kvgov.admission_test.test_restricted_is_admitted_but_never_cached" in report.failures


def test_error_in_a_test_is_a_failure(bundle_copy: Path) -> None:
    """A test that raises an evaluation error fails with the error as detail."""
    (bundle_copy / "err_test.rego").write_text(
        "package err_test\n\nimport rego.v1\n\n"
        'test_boom if {\n\tx := {"a": 1}\n\tx.a == "1" + 1\n}\n'
    )
    report = run_tests(bundle_copy)
    (result,) = [r for r in report.results if r.package == "err_test"]
    assert not result.passed
    assert result.detail != ""


def test_bundle_without_tests_does_not_pass(tmp_path: Path) -> None:
    """A bundle with no test_ rules is not accepted as tested."""
    (tmp_path / "p.rego").write_text("package p\n\nimport rego.v1\n\nallow := true\n")
    report = run_tests(tmp_path)
    assert report.results == ()
    assert not report.passed


def test_syntax_error_in_test_file_is_a_load_error(bundle_copy: Path) -> None:
    """A test module that does not parse raises PolicyLoadError naming it."""
    (bundle_copy / "bad_test.rego").write_text("package bad_test\n\ntest_x if {\n")
    with pytest.raises(PolicyLoadError) as info:
        run_tests(bundle_copy)
    assert info.value.file is not None and info.value.file.endswith("bad_test.rego")


FORMS = """package kvgov.forms.deep_test

import rego.v1

test_if_block if {
\ttrue
}

test_assign := true if {
\t1 == 1
}

test_assign_plain := true

  test_indented if true

test_contains contains "x" if true

default test_default := true

test_fails if false

test_helper(x) := x

not_a_test := true

message := `
test_inside_a_raw_string
`
"""

FOUND = {
    "test_if_block": True,
    "test_assign": True,
    "test_assign_plain": True,
    "test_indented": True,
    "test_contains": True,
    "test_default": True,
    "test_fails": False,
}


@pytest.mark.parametrize("engine", ["embedded", pytest.param("reference", marks=needs_reference)])
def test_tests_are_found_in_any_valid_form(bundle_copy: Path, engine: str) -> None:
    """Every way of writing a test_ rule is found (a default, indented, `:= ... if`,
    `contains`, in a dotted package); functions and text in strings are not tests."""
    (bundle_copy / "forms_test.rego").write_text(FORMS)
    report = run_tests(bundle_copy, engine=engine)
    mine = {r.name: r.passed for r in report.results if r.package == "kvgov.forms.deep_test"}
    assert mine == FOUND
    assert report.failures == ("kvgov.forms.deep_test.test_fails",)


@pytest.mark.parametrize("engine", ["embedded", pytest.param("reference", marks=needs_reference)])
def test_a_package_path_with_a_quoted_segment_is_evaluated(bundle_copy: Path, engine: str) -> None:
    """`package team["kv-cache"].checks_test`: found, and evaluated under that path."""
    (bundle_copy / "quoted_test.rego").write_text(
        'package team["kv-cache"].checks_test\n\nimport rego.v1\n\n'
        "test_passes if true\n\ntest_fails if false\n"
    )
    report = run_tests(bundle_copy, engine=engine)
    mine = {r.qualified_name: r.passed for r in report.results if r.package.startswith("team")}
    assert mine == {
        'team["kv-cache"].checks_test.test_passes': True,
        'team["kv-cache"].checks_test.test_fails': False,
    }
