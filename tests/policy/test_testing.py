"""The Rego test runner, and the bundle's own tests through the embedded engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgov.exceptions import PolicyLoadError
from kvgov.policy.testing import run_tests


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
