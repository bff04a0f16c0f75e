"""No password or key reaches the audit layer's output, messages or files (issue #25, 6 and 7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from kvgov.audit import AuditLog, upgrade
from kvgov.audit.durability import marker_path
from kvgov.audit.signing import load_signing_key
from kvgov.audit.store import mask_url, normalize_url
from kvgov.cli.audit import audit_group
from kvgov.cli.db import db_group
from kvgov.exceptions import InvalidAuditUrl, SigningKeyError

SECRET = "s3cret-Pw"


@pytest.fixture()
def url_with_query_password(pg_url: str) -> str:
    """The test database, with a password as a query parameter (trust auth ignores it)."""
    return f"{pg_url}?password={SECRET}"


def test_db_upgrade_and_current_hide_a_query_password(url_with_query_password: str) -> None:
    """``kvgov db upgrade`` and ``db current`` print the URL with ``password=***``."""
    runner = CliRunner()
    for args in (["upgrade", url_with_query_password], ["current", url_with_query_password]):
        result = runner.invoke(db_group, args)
        assert result.exit_code == 0, result.output
        assert SECRET not in result.output
        assert "password=***" in result.output


def test_verify_of_an_empty_trail_hides_a_query_password(url_with_query_password: str) -> None:
    """The "holds no events" error names the database without its password."""
    assert CliRunner().invoke(db_group, ["upgrade", url_with_query_password]).exit_code == 0
    result = CliRunner().invoke(audit_group, ["verify", "--url", url_with_query_password])
    assert result.exit_code != 0
    assert "holds no events" in result.output
    assert SECRET not in result.output and "password=***" in result.output


def test_the_run_marker_on_disk_hides_a_query_password(
    url_with_query_password: str, tmp_path: Path
) -> None:
    """The writer's ``*.run.json`` records the database without its password."""
    upgrade(url_with_query_password)
    spool = tmp_path / "w1.spool.jsonl"
    with AuditLog(url_with_query_password, "w1", spool_path=spool):
        text = marker_path(spool).read_text(encoding="utf-8")
    assert SECRET not in text and "password=***" in text


def test_a_password_with_an_unescaped_at_is_refused_without_its_tail() -> None:
    """``user:p@ss@host``: refused (the tail would be taken for the host), nothing of it shown."""
    url = "postgresql://u:s3cret@tail-Pw@db.internal/audit"
    with pytest.raises(InvalidAuditUrl, match="unescaped @") as info:
        normalize_url(url)
    for text in (str(info.value), info.value.url, mask_url(url)):
        assert "s3cret" not in text and "tail-Pw" not in text
        assert "db.internal" in text


def test_an_unparsable_url_chains_no_exception_holding_it() -> None:
    """The parser's own error (which may quote the URL) is not attached to the refusal."""
    with pytest.raises(InvalidAuditUrl) as info:
        normalize_url(f"postgresql://u:{SECRET}@h:notaport/db")
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def _pem() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


def _body(pem: str) -> str:
    return "".join(line for line in pem.splitlines() if not line.startswith("-----"))


@pytest.mark.parametrize("form", ["quoted", "base64 body", "BOM"])
def test_a_signing_key_value_that_is_no_pem_is_never_echoed(form: str) -> None:
    """A key pasted wrongly into KVGOV_SIGNING_KEY: refused by its length, no part shown."""
    pem = _pem()
    value = {"quoted": f'"{pem}"', "base64 body": _body(pem), "BOM": "\ufeff" + pem}[form]
    with pytest.raises(SigningKeyError) as info:
        load_signing_key(environ={"KVGOV_SIGNING_KEY": value})
    message = str(info.value)
    assert f"not a PEM and not a readable file ({len(value)} characters)" in message
    body = _body(pem)
    assert not [body[i : i + 8] for i in range(len(body) - 7) if body[i : i + 8] in message]
    assert info.value.__cause__ is None and info.value.__context__ is None


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_a_signing_key_file_open_to_others_is_refused(tmp_path: Path) -> None:
    """Mode 0644 is refused with the chmod to run; 0600 loads (as KEK files are treated)."""
    path = tmp_path / "writer.pem"
    path.write_text(_pem())
    path.chmod(0o644)
    with pytest.raises(SigningKeyError, match=r"group or others.*chmod 600"):
        load_signing_key(environ={"KVGOV_SIGNING_KEY": str(path)})
    path.chmod(0o600)
    key = load_signing_key(environ={"KVGOV_SIGNING_KEY": str(path)})
    assert key is not None and key.origin == "configured"


def test_a_missing_key_file_given_as_a_path_object_is_named(tmp_path: Path) -> None:
    """A Path is a path, not key text: the message may name it."""
    missing = tmp_path / "nope.pem"
    with pytest.raises(SigningKeyError, match=r"nope\.pem"):
        load_signing_key(missing)
