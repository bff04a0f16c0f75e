"""A wrongly typed column stops the queries and exports with one clear line, never a traceback.

Issue #25, item 9 made ``kvgov audit verify`` report such rows as edits; the
compliance queries and exports (``audit events``, ``audit export``) read the same
rows and crashed on them (``bytes is not JSON serializable``, ``int('abc')``, a JSON
decode error inside the driver). They now exit 1 (evidence) and name the event.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.cli.audit import audit_group

from .conftest import attacker
from .test_verify import WRONG_TYPES_ANY_DB, WRONG_TYPES_SQLITE, _lit

#: The columns a query reads (``prev_hash`` and ``chain_format`` are verify's alone).
_READ = {"stream", "seq", "time_us", "type", "token_count", "block_ids", "details", "hash"}
#: A BLOB holding JSON text decodes to the same list or dict as the text (the driver
#: reads both): the queries show what was written, and ``verify`` reports the BLOB.
_SQLITE_CASES = [
    c
    for c in WRONG_TYPES_SQLITE
    if c[0] == "audit_events"
    and c[1] in _READ
    and not (c[1] in ("block_ids", "details") and c[2].startswith("X'"))
]
_COMMANDS = [["events"], ["export", "--format", "jsonl"], ["export", "--format", "csv"]]


def _check(url: str, populate, column: str, value: str, where: str) -> None:  # type: ignore[no-untyped-def]
    populate(url, 20)
    if url.startswith("postgresql") and value.startswith("X'"):
        value = _lit(url, bytes.fromhex(value[2:-1]))
    attacker(url, f"UPDATE audit_events SET {column} = {value} WHERE {where}")
    for args in _COMMANDS:
        result = CliRunner().invoke(audit_group, [*args, "--url", url])
        assert result.exit_code == 1, (args, result.output, result.exception)
        assert result.exception is None or isinstance(result.exception, SystemExit), args
        assert "malformed event" in result.output and "kvgov audit verify" in result.output


@pytest.mark.parametrize(("table", "column", "value", "where"), _SQLITE_CASES)
def test_a_wrongly_typed_column_stops_the_queries_on_sqlite(
    tmp_path: Path,
    populate,
    table: str,
    column: str,
    value: str,
    where: str,  # type: ignore[no-untyped-def]
) -> None:
    """A BLOB, text, real or integer where another type belongs: exit 1, the event named."""
    _check(f"sqlite:///{tmp_path / 'audit.db'}", populate, column, value, where)


@pytest.mark.parametrize(("table", "column", "value", "where"), WRONG_TYPES_ANY_DB)
def test_a_wrongly_shaped_json_column_stops_the_queries(
    db_url: str,
    populate,
    table: str,
    column: str,
    value: str,
    where: str,  # type: ignore[no-untyped-def]
) -> None:
    """JSON of the wrong shape (SQLite and PostgreSQL): exit 1, the event named."""
    _check(db_url, populate, column, value, where)


def test_an_intact_trail_is_still_exported(tmp_path: Path, populate) -> None:  # type: ignore[no-untyped-def]
    """The type checks refuse nothing kvgov writes."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    populate(url, 20)
    result = CliRunner().invoke(audit_group, ["export", "--format", "jsonl", "--url", url])
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) >= 20
