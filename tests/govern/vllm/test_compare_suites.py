"""The stock-vs-governed comparison of vLLM's tests (no vLLM needed) and the docs that list it."""

from __future__ import annotations

from pathlib import Path

from .suite.compare_suites import Outcome, compare, main, read_junit
from .suite.differences import DIFFERENCES, Difference

DOCS = Path(__file__).parents[3] / "docs" / "vllm.md"
EXPECTED = Difference(
    "test_scheduler.py::test_kv_connector_basic", ("cannot govern a KV connector",)
)


def _junit(path: Path, cases: dict[str, tuple[str, str]]) -> Path:
    body = []
    for name, (status, message) in cases.items():
        module, test = name.split("::")
        inner = "" if status == "passed" else f'<{status} message="{message}"/>'
        body.append(
            f'<testcase classname="tests.v1.core.{module[:-3]}" name="{test}">{inner}</testcase>'
        )
    path.write_text(f"<testsuites><testsuite>{''.join(body)}</testsuite></testsuites>")
    return path


def test_an_expected_difference_is_not_a_regression() -> None:
    """A listed test failing with its expected message passes the comparison."""
    stock = {"test_scheduler.py::test_kv_connector_basic[True]": Outcome("passed")}
    governed = {
        "test_scheduler.py::test_kv_connector_basic[True]": Outcome(
            "failed", "UnsupportedEngine: kvgov cannot govern a KV connector (...)"
        )
    }
    verdict = compare(stock, governed, [EXPECTED])
    assert verdict.ok and len(verdict.expected) == 1


def test_any_other_regression_fails_the_run() -> None:
    """A test that passed stock and fails governed, unlisted or for another reason, fails it."""
    stock = {
        "test_scheduler.py::test_other": Outcome("passed"),
        "test_scheduler.py::test_kv_connector_basic[True]": Outcome("passed"),
    }
    governed = {
        "test_scheduler.py::test_other": Outcome("failed", "assert 1 == 2"),
        "test_scheduler.py::test_kv_connector_basic[True]": Outcome("failed", "KeyError: 'x'"),
    }
    verdict = compare(stock, governed, [EXPECTED])
    assert not verdict.ok
    assert [t for t, _ in verdict.regressions] == [
        "test_scheduler.py::test_kv_connector_basic[True]",
        "test_scheduler.py::test_other",
    ]


def test_a_test_missing_from_the_governed_run_fails_it() -> None:
    """A governed run that did not run a test that passed stock is not a pass."""
    verdict = compare({"test_scheduler.py::test_a": Outcome("passed")}, {}, [])
    assert verdict.missing == ("test_scheduler.py::test_a",) and not verdict.ok


def test_tests_failing_stock_are_not_compared() -> None:
    """What fails stock (models or packages this machine lacks) says nothing about kvgov."""
    stock = {"test_scheduler.py::test_llava": Outcome("failed", "no torchvision")}
    governed = {"test_scheduler.py::test_llava": Outcome("failed", "no torchvision")}
    assert compare(stock, governed, []).ok


def test_the_script_reads_junit_and_exits_1_on_a_regression(tmp_path: Path) -> None:
    """End to end on JUnit XML files: exit 0 when only listed tests differ, else 1."""
    listed = DIFFERENCES[0]
    case = f"{listed.test}[0]"
    stock = _junit(
        tmp_path / "stock.xml",
        {case: ("passed", ""), "test_scheduler.py::test_plain": ("passed", "")},
    )
    good = _junit(
        tmp_path / "good.xml",
        {
            case: ("failure", listed.fails_with[0]),
            "test_scheduler.py::test_plain": ("passed", ""),
        },
    )
    bad = _junit(
        tmp_path / "bad.xml",
        {case: ("passed", ""), "test_scheduler.py::test_plain": ("error", "boom")},
    )
    assert read_junit([stock])["test_scheduler.py::test_plain"].status == "passed"
    assert main(["--stock", str(stock), "--governed", str(good)]) == 0
    assert main(["--stock", str(stock), "--governed", str(bad)]) == 1


def test_docs_list_every_expected_difference_with_its_reason() -> None:
    """docs/vllm.md names each vLLM test that must differ governed (the list stays true)."""
    text = DOCS.read_text(encoding="utf-8")
    missing = [d.test for d in DIFFERENCES if d.test.split("::")[1] not in text]
    assert missing == []
    reasons = {d.reason.split(":")[0] for d in DIFFERENCES}
    assert all(reason.split(" (")[0] in text for reason in reasons)
