"""`kvgov audit keygen`: private folders (0700), key files 0600, no silent overwrite."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.audit.signing import generate_key_files, load_public_key, load_signing_key
from kvgov.cli.audit import audit_group
from kvgov.exceptions import SigningKeyError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture()
def open_umask() -> Iterator[None]:
    """A permissive umask (022 is common, 000 happens): the modes must not depend on it."""
    old = os.umask(0o000)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_keygen_creates_missing_folders_0700_and_key_files_0600(tmp_path: Path) -> None:
    """Every missing folder on the way is made 0700; the private and public key 0600."""
    key = tmp_path / "etc" / "kvgov" / "keys" / "checkpoint.pem"
    result = CliRunner().invoke(audit_group, ["keygen", str(key)])
    assert result.exit_code == 0, result.output
    for folder in (tmp_path / "etc", tmp_path / "etc" / "kvgov", key.parent):
        assert _mode(folder) == 0o700, folder
    assert _mode(key) == 0o600 and _mode(key.with_name("checkpoint.pem.pub")) == 0o600
    signer = load_signing_key(key)
    assert signer is not None
    assert load_public_key(key.with_name("checkpoint.pem.pub")) is not None


def test_an_existing_folder_keeps_its_mode(tmp_path: Path) -> None:
    """keygen does not chmod a folder it did not create."""
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    assert CliRunner().invoke(audit_group, ["keygen", str(folder / "k.pem")]).exit_code == 0
    assert _mode(folder) == 0o755


def test_keygen_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    """An existing key (or only its .pub) is never replaced without --force: exit 2,
    both files byte for byte as before."""
    key = tmp_path / "k.pem"
    runner = CliRunner()
    assert runner.invoke(audit_group, ["keygen", str(key)]).exit_code == 0
    before = (key.read_bytes(), key.with_name("k.pem.pub").read_bytes())
    refused = runner.invoke(audit_group, ["keygen", str(key)])
    assert refused.exit_code == 2 and "--force" in refused.output
    assert (key.read_bytes(), key.with_name("k.pem.pub").read_bytes()) == before
    forced = runner.invoke(audit_group, ["keygen", str(key), "--force"])
    assert forced.exit_code == 0, forced.output
    assert key.read_bytes() != before[0] and _mode(key) == 0o600
    assert key.with_name("k.pem.pub").read_bytes() != before[1]


def test_a_lone_public_key_is_not_overwritten_either(tmp_path: Path) -> None:
    """Only PATH.pub exists: refused, and no private key is left behind."""
    pub = tmp_path / "k.pem.pub"
    pub.write_text("an auditor's copy")
    with pytest.raises(SigningKeyError, match="already exist"):
        generate_key_files(tmp_path / "k.pem")
    assert pub.read_text() == "an auditor's copy" and not (tmp_path / "k.pem").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pem.pub"]
