"""kvgov.secrecy: the one URL redactor, and the key-file reader that refuses open files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import make_url

from kvgov.secrecy import KeyFileOpenToOthers, read_key_file, redact_url

SECRET = "s3cret-Pw"

CASES = [
    # (URL given, redacted text)
    ("postgresql://u:s3cret-Pw@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgresql+psycopg://u:s3cret-Pw@h/db", "postgresql+psycopg://u:***@h/db"),
    ("postgresql://u@h/db?password=s3cret-Pw", "postgresql://u@h/db?password=***"),
    (
        "postgresql://u@h/db?sslmode=require&password=s3cret-Pw&application_name=w1",
        "postgresql://u@h/db?sslmode=require&password=***&application_name=w1",
    ),
    ("postgresql://u@h/db?sslpassword=s3cret-Pw", "postgresql://u@h/db?sslpassword=***"),
    ("postgresql://u@h/db?p%61ssword=s3cret-Pw", "postgresql://u@h/db?p%61ssword=***"),
    ("postgresql://u:s3cret@-Pw@h/db", "postgresql://u:***@h/db"),  # unescaped @
    ("postgresql://u:s3c:ret/-Pw#x?y@h:5432/db", "postgresql://u:***@h:5432/db"),  # : / # ?
    ("postgresql://u:s3cret%40-Pw@h/db", "postgresql://u:***@h/db"),  # percent-encoded
    ("postgresql://u:s3cret-Pw@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
    ("redis://:s3cret-Pw@cache:6379/0", "redis://:***@cache:6379/0"),
    (
        "rediss://default:s3cret-Pw@cache:6380/0?capacity=1GiB",
        "rediss://default:***@cache:6380/0?capacity=1GiB",
    ),
    ("unix:///run/redis.sock?password=s3cret-Pw", "unix:///run/redis.sock?password=***"),
    ("http://u:s3cret-Pw@opa:8181", "http://u:***@opa:8181"),
    ("sqlite:////tmp/audit.db", "sqlite:////tmp/audit.db"),  # nothing to hide
    ("sqlite:///kvgov-audit.db", "sqlite:///kvgov-audit.db"),
    ("sqlite:////tmp/a@b.db", "sqlite:////tmp/a@b.db"),  # an @ in a path is no password
    ("postgresql://h1:5432,h2:5433/db", "postgresql://h1:5432,h2:5433/db"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),  # no password
    ("host://?capacity=8GiB", "host://?capacity=8GiB"),
    ("postgresql://u:s3cret-Pw/db", "postgresql://***"),  # malformed: no host after it
    ("u:s3cret-Pw@h", "***"),  # no scheme: unsure, hidden whole
    ("host=h password=s3cret-Pw", "host=h password=***"),  # a libpq DSN
]


@pytest.mark.parametrize(("url", "shown"), CASES, ids=[c[0] for c in CASES])
def test_every_form_of_url_is_shown_without_its_password(url: str, shown: str) -> None:
    """Each form keeps what helps (scheme, user, host, other options) and hides the secret."""
    assert redact_url(url) == shown
    assert "s3cret" not in shown and "Pw" not in shown


def test_a_sqlalchemy_url_object_is_redacted_query_included() -> None:
    """A URL object's own rendering hides only the userinfo password; the query is hidden too."""
    shown = redact_url(make_url(f"postgresql://u:{SECRET}@h/db?password={SECRET}"))
    assert shown == "postgresql://u:***@h/db?password=***"


def test_the_redactor_never_raises() -> None:
    """A value whose text cannot even be made is shown as *** instead of failing the caller."""

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError(SECRET)

    assert redact_url(Unprintable()) == "***"
    assert redact_url(None) == "None"
    assert redact_url("") == ""


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_key_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    """Any access for group or others refuses the file, with the chmod to run."""
    key = tmp_path / "k"
    key.write_bytes(b"key")
    key.chmod(mode)
    with pytest.raises(KeyFileOpenToOthers, match="chmod 600") as info:
        read_key_file(key)
    assert info.value.mode == mode


def test_a_key_file_of_the_owner_alone_is_read(tmp_path: Path) -> None:
    """Mode 0600: the bytes come back."""
    key = tmp_path / "k"
    key.write_bytes(b"key")
    key.chmod(0o600)
    assert read_key_file(key) == b"key"
