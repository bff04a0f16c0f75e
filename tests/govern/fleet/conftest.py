"""Fixtures of the fleet tests: operator keys, a migrated database, a bundle denying a tenant."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kvgov.audit import SigningKey, upgrade
from kvgov.policy.bundle import BUNDLE_DIR


@pytest.fixture()
def operator() -> SigningKey:
    return SigningKey.from_private_key(Ed25519PrivateKey.generate(), "configured")


@pytest.fixture()
def intruder() -> SigningKey:
    return SigningKey.from_private_key(Ed25519PrivateKey.generate(), "configured")


@pytest.fixture()
def fleet_url(any_db_url: str) -> str:
    upgrade(any_db_url)
    return any_db_url


def blocking_bundle(dest: Path, tenant: str = "blocked") -> Path:
    """A copy of the bundled policy whose data denies ``tenant``'s admissions."""
    shutil.copytree(BUNDLE_DIR, dest)
    data = json.loads((dest / "data.json").read_text(encoding="utf-8"))
    data["kvgov"]["config"]["tenants"][tenant] = {"admission": False}
    (dest / "data.json").write_text(json.dumps(data), encoding="utf-8")
    return dest
