"""Loading a bundle: syntax and compile errors, data.json, policy_data, revision."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

import pytest

from kvgov.exceptions import PolicyLoadError, PolicyTestFailure
from kvgov.policy.bundle import BUNDLE_DIR, deep_merge
from kvgov.policy.testing import load_bundle


def test_bundled_policy_loads_with_its_tests() -> None:
    """The bundled policy loads, compiles and passes its tests."""
    b = load_bundle()
    assert b.directory == BUNDLE_DIR
    assert {f.name for f in b.policies} >= {"admission.rego", "sharing.rego", "retention.rego"}
    assert all(f.name.endswith("_test.rego") for f in b.tests)
    assert b.revision.startswith("sha256:")


@pytest.mark.parametrize(
    ("name", "text", "line", "column"),
    [
        pytest.param(
            "broken.rego",
            "package kvgov.broken\n\nimport rego.v1\n\nallow if {\n\tinput.x ==\n}\n",
            7,
            1,
            id="syntax",
        ),
        pytest.param("old.rego", "package kvgov.old\n\nallow { input.x == 1 }\n", 3, 7, id="v0"),
        pytest.param(
            "fn.rego",
            "package kvgov.fn\n\nimport rego.v1\n\nallow if nope(1)\n",
            5,
            None,
            id="unknown-function",
        ),
        pytest.param("data.json", '{\n  "kvgov": ,\n}\n', 2, None, id="data-json"),
    ],
)
def test_load_errors_name_file_and_position(
    bundle_copy: Path, name: str, text: str, line: int, column: int | None
) -> None:
    """A syntax error, Rego v0 syntax (no `if`), an unknown function (caught at load, not
    at the first decision) or data.json that is not JSON raise PolicyLoadError naming
    the file and line, and the column where the parser gives one."""
    (bundle_copy / name).write_text(text)
    with pytest.raises(PolicyLoadError) as info:
        load_bundle(bundle_copy)
    err = info.value
    assert err.file is not None and err.file.endswith(name)
    assert err.line == line
    if column is not None:
        assert err.column == column
        assert f"{name}:{line}:{column}" in str(err)


def test_data_json_must_be_an_object(bundle_copy: Path) -> None:
    """A data.json holding a list is refused."""
    (bundle_copy / "data.json").write_text("[1, 2]")
    with pytest.raises(PolicyLoadError, match="JSON object"):
        load_bundle(bundle_copy)


def test_failing_tests_refuse_the_bundle(bundle_copy: Path) -> None:
    """A bundle whose tests fail raises PolicyTestFailure naming them."""
    f = bundle_copy / "retention.rego"
    f.write_text(f.read_text().replace('"restricted data is never retained"', '"never"'))
    (bundle_copy / "extra_test.rego").write_text(
        "package extra_test\n\nimport rego.v1\n\ntest_false if false\n"
    )
    with pytest.raises(PolicyTestFailure) as info:
        load_bundle(bundle_copy)
    assert "extra_test.test_false" in info.value.failures


def test_failing_tests_can_be_skipped(bundle_copy: Path) -> None:
    """run_tests=False loads a bundle whose tests fail."""
    (bundle_copy / "extra_test.rego").write_text(
        "package extra_test\n\nimport rego.v1\n\ntest_false if false\n"
    )
    assert load_bundle(bundle_copy, run_tests=False).tests


def test_missing_directory_is_a_load_error(tmp_path: Path) -> None:
    """A directory that does not exist is refused."""
    with pytest.raises(PolicyLoadError, match="does not exist"):
        load_bundle(tmp_path / "nope")


def test_policy_data_is_deep_merged() -> None:
    """policy_data merges object by object over data.json; lists are replaced."""
    b = load_bundle(policy_data={"kvgov": {"config": {"retention_seconds": {"internal": 5}}}})
    cfg = b.data["kvgov"]["config"]
    assert cfg["retention_seconds"]["internal"] == 5
    assert cfg["retention_seconds"]["public"] == 86400
    assert b.base_data["kvgov"]["config"]["retention_seconds"]["internal"] == 3600


def test_deep_merge_does_not_mutate() -> None:
    """deep_merge returns a new dict and leaves both inputs alone."""
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    over = {"a": {"c": [2], "e": 3}}
    assert deep_merge(base, over) == {"a": {"b": 1, "c": [2], "e": 3}, "d": 1}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}


def test_deep_merge_merges_any_mapping_not_only_dicts() -> None:
    """A read-only mapping on top merges key by key (deepmerge would replace the subtree)."""
    base = {"a": {"b": 1, "c": [2]}, "d": 1}
    over = MappingProxyType({"a": MappingProxyType({"e": 3})})
    assert deep_merge(base, over) == {"a": {"b": 1, "c": [2], "e": 3}, "d": 1}


def test_policy_data_must_be_json(bundle_copy: Path) -> None:
    """policy_data that is not JSON-serialisable is refused."""
    with pytest.raises(PolicyLoadError, match="JSON"):
        load_bundle(bundle_copy, policy_data={"x": object()}, run_tests=False)


def test_revision_changes_with_content(bundle_copy: Path) -> None:
    """The revision is a content hash: same content, same revision; any change, new one."""
    r1 = load_bundle(bundle_copy, run_tests=False).revision
    assert load_bundle(bundle_copy, run_tests=False).revision == r1
    assert load_bundle(bundle_copy, policy_data={"x": 1}, run_tests=False).revision != r1
    f = bundle_copy / "kvgov.rego"
    f.write_text(f.read_text() + "\n# a comment\n")
    assert load_bundle(bundle_copy, run_tests=False).revision != r1


def test_declared_revision_is_kept_with_the_hash(bundle_copy: Path) -> None:
    """A top-level `revision` in data.json prefixes the content hash."""
    path = bundle_copy / "data.json"
    data = json.loads(path.read_text())
    data["revision"] = "2024-06-01"
    path.write_text(json.dumps(data))
    r1 = load_bundle(bundle_copy, run_tests=False).revision
    assert r1.startswith("2024-06-01+sha256:")
    r2 = load_bundle(bundle_copy, policy_data={"x": 1}, run_tests=False).revision
    assert r2.startswith("2024-06-01+sha256:") and r2 != r1


def test_the_bundled_revision_did_not_move_with_rfc_8785() -> None:
    """RFC 8785 writes the bundled data.json as json.dumps(sort_keys) did: same revision."""
    assert load_bundle().revision.endswith("sha256:70ee773e99604761")
