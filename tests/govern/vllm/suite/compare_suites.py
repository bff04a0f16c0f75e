"""Compare vLLM's tests run stock and governed (JUnit XML from the same job); fail on a regression.

    python compare_suites.py --stock stock.xml --governed governed-1.xml [governed-2.xml ...]

A test that passed stock and does not pass governed must be one of
``differences.DIFFERENCES`` and fail with one of its expected messages; any other
is a regression, and the exit status is 1. Tests that fail stock (they need model
classes or packages this machine lacks) are not compared. Prints the counts per
file and every expected difference met. Standard library only (it runs in either venv).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    from .differences import DIFFERENCES, Difference
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from differences import DIFFERENCES, Difference  # type: ignore[no-redef]

__all__ = ["Outcome", "Verdict", "compare", "read_junit"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One test's result: ``passed``, ``failed``, ``error`` or ``skipped``, and the message."""

    status: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the comparison found.

    Attributes:
        expected: tests that differ as ``DIFFERENCES`` says, with the entry.
        regressions: tests that passed stock and do not pass governed, unexpectedly.
        missing: tests that passed stock and did not run governed.
    """

    expected: tuple[tuple[str, Difference], ...]
    regressions: tuple[tuple[str, Outcome], ...]
    missing: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No regression and nothing missing."""
        return not self.regressions and not self.missing


def read_junit(paths: Iterable[Path]) -> dict[str, Outcome]:
    """Every test case of the files, as ``file.py::name[params]`` -> outcome."""
    out: dict[str, Outcome] = {}
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            module = (case.get("classname") or "").rsplit(".", 1)[-1]
            key = f"{module}.py::{case.get('name')}"
            status, message = "passed", ""
            for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
                node = case.find(tag)
                if node is not None:
                    status, message = name, (node.get("message") or "") + (node.text or "")
                    break
            out[key] = Outcome(status, message)
    return out


def _entry(test: str, differences: Sequence[Difference]) -> Difference | None:
    function = test.split("[", 1)[0]
    return next((d for d in differences if d.test == function), None)


def compare(
    stock: dict[str, Outcome],
    governed: dict[str, Outcome],
    differences: Sequence[Difference] = DIFFERENCES,
) -> Verdict:
    """Check every test that passed stock against its governed outcome."""
    expected, regressions, missing = [], [], []
    for test, outcome in sorted(stock.items()):
        if outcome.status != "passed":
            continue
        got = governed.get(test)
        if got is None:
            missing.append(test)
            continue
        if got.status == "passed":
            continue
        entry = _entry(test, differences)
        if entry is not None and any(text in got.message for text in entry.fails_with):
            expected.append((test, entry))
        else:
            regressions.append((test, got))
    return Verdict(tuple(expected), tuple(regressions), tuple(missing))


def _counts(results: dict[str, Outcome]) -> dict[str, Counter[str]]:
    per_file: dict[str, Counter[str]] = {}
    for test, outcome in results.items():
        per_file.setdefault(test.split("::", 1)[0], Counter())[outcome.status] += 1
    return per_file


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock", type=Path, nargs="+", required=True)
    parser.add_argument("--governed", type=Path, nargs="+", required=True)
    args = parser.parse_args(argv)
    stock, governed = read_junit(args.stock), read_junit(args.governed)
    for label, results in (("stock", stock), ("governed", governed)):
        for name, counts in sorted(_counts(results).items()):
            shown = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            print(f"{label:9s} {name}: {shown}")
    verdict = compare(stock, governed)
    functions = Counter(entry.test for _, entry in verdict.expected)
    print(
        f"expected differences: {len(verdict.expected)} tests in {len(functions)} functions "
        "(docs/vllm.md lists why)"
    )
    for function, n in sorted(functions.items()):
        print(f"  {function} ({n})")
    for test in verdict.missing:
        print(f"MISSING governed: {test}")
    for test, outcome in verdict.regressions:
        print(f"REGRESSION: {test}: {outcome.status}: {outcome.message.splitlines()[:1]}")
    print(f"RESULT {'ok' if verdict.ok else 'FAILED'}: {len(verdict.regressions)} regressions")
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
