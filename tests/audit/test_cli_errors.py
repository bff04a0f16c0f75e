"""Every CLI error is one line saying what to do, with exit status 1, 2 or 3 by kind.

1: evidence failure (tampering found); 2: usage error (bad argument, bad URL, bad key
file); 3: environment error (database unreachable, schema missing, permission denied).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kvgov.audit import downgrade, upgrade
from kvgov.cli.audit import audit_group, db_group

from .conftest import attacker

QUERIES = [
    ["verify"],
    ["reuse", "--tenant", "acme"],
    ["erasure", "--tenant", "acme"],
    ["denials"],
    ["decisions", "--policy-revision", "rev-a"],
    ["events"],
    ["events", "--count-by", "type"],
    ["export"],
    ["checkpoints"],
    ["quarantine", "replay"],
]


def _one_error_line(result: Result, code: int) -> str:
    """The command failed with ``code``, printing exactly one ``error:`` line, no traceback."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def _run(group: object, args: list[str]) -> Result:
    return CliRunner().invoke(group, args)  # type: ignore[arg-type]


@pytest.mark.parametrize("args", QUERIES)
@pytest.mark.parametrize(
    ("url", "code", "hint"),
    [
        ("postgresql://postgres@127.0.0.1:1/none", 3, "server runs"),
        ("not a url", 2, "not an audit database URL"),
        ("foo://bar", 2, "not an audit database URL"),
        ("sqlite:////nonexistent/dir/audit.db", 3, "no audit database"),
    ],
)
def test_query_commands_fail_in_one_line(args: list[str], url: str, code: int, hint: str) -> None:
    """An unreachable database, a bad URL or a missing file: one line, the right status."""
    assert hint in _one_error_line(_run(audit_group, [*args, "--url", url]), code)


@pytest.mark.parametrize(
    ("args", "url", "code"),
    [
        (["current"], "postgresql://postgres@127.0.0.1:1/none", 3),
        (["current"], "not a url", 2),
        (["current"], "foo://bar", 2),
        (["upgrade", "--sql"], "not a url", 2),  # offline SQL needs no server
        (["upgrade", "--sql"], "foo://bar", 2),
    ],
)
def test_db_commands_fail_in_one_line(args: list[str], url: str, code: int) -> None:
    """kvgov db current / upgrade on a bad target: one line, the right status."""
    _one_error_line(_run(db_group, [*args, url]), code)


@pytest.fixture()
def no_schema(tmp_path: Path) -> str:
    """A SQLite database taken down to base: its schema is missing."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url)
    downgrade(url, "base")
    return url


@pytest.mark.parametrize("args", [q for q in QUERIES if q != ["quarantine", "replay"]])
def test_missing_schema_is_an_environment_error(args: list[str], no_schema: str) -> None:
    """A database without the schema: status 3 and the command that fixes it."""
    assert "kvgov db upgrade" in _one_error_line(_run(audit_group, [*args, "--url", no_schema]), 3)


@pytest.fixture()
def denied_url(pg_url: str) -> Iterator[str]:
    """A PostgreSQL audit database and a role that may log in but read nothing."""
    from sqlalchemy.engine import make_url

    from tests.conftest import _pg_admin_connect

    upgrade(pg_url)
    role = f"kvgov_noperm_{uuid.uuid4().hex[:8]}"
    with _pg_admin_connect() as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        yield make_url(pg_url).set(username=role).render_as_string(hide_password=False)
    finally:
        with _pg_admin_connect() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


@pytest.mark.postgres
@pytest.mark.parametrize("args", [["verify"], ["denials"], ["export"], ["checkpoints"]])
def test_permission_denied_is_an_environment_error(args: list[str], denied_url: str) -> None:
    """A role without SELECT: status 3 and what to grant."""
    assert "grant" in _one_error_line(_run(audit_group, [*args, "--url", denied_url]), 3)


def test_usage_errors_exit_2(sqlite_url: str, tmp_path: Path) -> None:
    """A bad key file, a list without its key, a bad revision: status 2, one line."""
    upgrade(sqlite_url)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    _one_error_line(
        _run(audit_group, ["verify", "--url", sqlite_url, "--public-key", str(junk)]), 2
    )
    listing = tmp_path / "streams.json"
    listing.write_text("{}")
    _one_error_line(
        _run(audit_group, ["verify", "--url", sqlite_url, "--expect-streams", str(listing)]), 2
    )
    _one_error_line(_run(audit_group, ["streams", "--url", sqlite_url, "--key", str(junk)]), 2)
    _one_error_line(_run(db_group, ["upgrade", sqlite_url, "--revision", "nope"]), 2)


def test_tampering_is_an_evidence_failure(sqlite_url: str, populate: object) -> None:
    """verify exits 1 when it finds tampering (the report, not an error line, says where)."""
    populate(sqlite_url, 12)  # type: ignore[operator]
    attacker(sqlite_url, "UPDATE audit_events SET tenant = 'x' WHERE seq = 3")
    result = _run(audit_group, ["verify", "--url", sqlite_url, "--no-progress"])
    assert result.exit_code == 1 and "seq 3" in result.output


def test_the_kvgov_entry_point_uses_the_same_exit_codes() -> None:
    """`kvgov audit ...` through the top-level command: the same one line and status."""
    from kvgov.cli.main import main

    result = CliRunner().invoke(main, ["audit", "denials", "--url", "not a url"])
    _one_error_line(result, 2)
