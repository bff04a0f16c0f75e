"""Fixtures of the fault suite: a freezable PostgreSQL, a full disk, and the figures report.

Every test in this directory is marked ``faults``: ``make test-faults`` runs them
(``make test`` does not; ``.ci/run`` runs both). Every fault case records what
happened to the events it wrote with ``fault_report.add(case, written=...,
spooled=..., quarantined=..., lost=..., critical_lost=...)`` (more figures become
more columns); the table is printed at the end. To add a case (the cache under OPA
down, a purge under a frozen database), write a test in a new module here that
uses these fixtures and reports its figures the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.pg_proxy import pg_proxy  # noqa: F401 - shared fixture


@dataclass
class FaultReport:
    """Figures per fault case, printed at the end of the session."""

    rows: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, case: str, **figures: int) -> None:
        """Record a case's figures (events written, spooled, quarantined, lost, ...)."""
        self.rows[case] = figures


_REPORT = FaultReport()


@pytest.fixture(scope="session")
def fault_report() -> FaultReport:
    """The session's fault figures."""
    return _REPORT


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.faults)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _REPORT.rows:
        return
    cols = ["written", "spooled", "quarantined", "lost", "critical_lost"]
    cols += sorted({k for f in _REPORT.rows.values() for k in f} - set(cols))
    terminalreporter.section("fault suite: what happened to the events")
    # each column as wide as its name or its widest figure, two spaces between columns
    widths = [
        max(len(c), *(len(str(f.get(c, "-"))) for f in _REPORT.rows.values())) + 2 for c in cols
    ]
    first = max(len("case"), *(len(case) for case in _REPORT.rows))
    terminalreporter.write_line(
        f"{'case':<{first}}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True))
    )
    for case, figures in sorted(_REPORT.rows.items()):
        cells = "".join(f"{figures.get(c, '-')!s:>{w}}" for c, w in zip(cols, widths, strict=True))
        terminalreporter.write_line(f"{case:<{first}}{cells}")
