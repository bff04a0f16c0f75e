"""``kvgov fleet`` and ``kvgov audit erasure --order`` on SQLite and PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.audit import SigningKey, load_signing_key
from kvgov.audit.fleet import FleetStore
from kvgov.audit.signing import generate_key_files
from kvgov.cli.main import main
from kvgov.govern import GovernedKVCache
from kvgov.govern.fleet import FleetAgent, NativeTarget, trusted_keys
from kvgov.govern.keys import secret_key_id
from tests.govern.conftest import make_scope
from tests.govern.fleet.conftest import blocking_bundle

CacheFactory = Callable[..., GovernedKVCache]


@pytest.fixture()
def key_file(tmp_path: Path) -> Path:
    return generate_key_files(tmp_path / "keys" / "operator.pem").private


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def _agent(url: str, cache: GovernedKVCache, key_file: Path) -> FleetAgent:
    key = load_signing_key(key_file)
    assert key is not None
    pub = key.private_key.public_key()
    agent = FleetAgent(url, "native-1", NativeTarget(cache), trusted_keys([pub]))
    cache.add_boundary_hook(agent.drain)
    return agent


def test_purge_wait_status_and_the_evidence_per_engine(
    fleet_url: str, make_cache: CacheFactory, key_file: Path
) -> None:
    cache = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, cache, key_file)
    agent.sync()  # registered
    adm = cache.admit("s1", make_scope(tenant="acme"), list(range(1, 9)))
    cache.release("s1")
    code, out, _ = _run("fleet", "purge", "--tenant", "acme", "--key", str(key_file),
                        "--url", fleet_url)  # fmt: skip
    assert code == 0
    order_id = out.strip()
    code, out, err = _run("fleet", "wait", order_id, "--timeout", "0", "--url", fleet_url)
    assert code == 1  # not run yet
    assert "native-1" in err and "no result yet" in out
    code, out, _ = _run("fleet", "status", "--url", fleet_url)
    assert code == 0 and "native-1" in out and order_id in out
    agent.sync()
    cache.admit("s2", make_scope(tenant="globex"), [1, 2, 3, 4])  # boundary: the purge runs
    agent.sync()
    assert cache.pool.read_back_zero(list(adm.block_ids))
    cache.audit.flush()
    code, out, err = _run("fleet", "wait", order_id, "--timeout", "5", "--url", fleet_url)
    assert code == 0, (out, err)
    assert "native-1: live, completed, verified" in out
    code, out, _ = _run("audit", "erasure", "--order", order_id, "--url", fleet_url)
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == f"order {order_id} (purge): 1 engine(s)"
    assert lines[1].startswith("native-1: live, completed, verified, event ")
    agent.stop()


def test_an_engine_that_stopped_is_reported_not_waited_for(
    fleet_url: str, make_cache: CacheFactory, key_file: Path
) -> None:
    cache = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, cache, key_file)
    agent.sync()
    agent.stop()
    code, out, _ = _run("fleet", "purge", "--tenant", "acme", "--key", str(key_file),
                        "--url", fleet_url)  # fmt: skip
    order_id = out.strip()
    code, out, err = _run("fleet", "wait", order_id, "--timeout", "0", "--url", fleet_url)
    assert code == 1
    assert "native-1: stopped, gone before the order, KV gone with its process" in out
    assert "no live engine" in err


def test_invalidate_rotate_and_rollout_orders_are_issued_and_checked(
    fleet_url: str, key_file: Path, tmp_path: Path
) -> None:
    code, _, err = _run("fleet", "invalidate", "--key", str(key_file), "--url", fleet_url)
    assert code == 2 and "at least one scope field" in err
    code, _, _ = _run("fleet", "invalidate", "--model-revision", "r1", "--key", str(key_file),
                        "--url", fleet_url)  # fmt: skip
    assert code == 0
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32 + b"\n")
    os.chmod(secret, 0o644)
    code, _, err = _run("fleet", "rotate-secret", "--secret-file", str(secret),
                        "--key", str(key_file), "--url", fleet_url)  # fmt: skip
    assert code == 2 and "group or others" in err
    os.chmod(secret, 0o600)
    code, rotate_id, _ = _run("fleet", "rotate-secret", "--secret-file", str(secret),
                              "--key", str(key_file), "--url", fleet_url)  # fmt: skip
    assert code == 0
    bundle = blocking_bundle(tmp_path / "bundle")
    code, rollout_id, _ = _run("fleet", "rollout", "--bundle", str(bundle),
                               "--key", str(key_file), "--url", fleet_url)  # fmt: skip
    assert code == 0
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        rotate = store.order(rotate_id.strip())
        rollout = store.order(rollout_id.strip())
    assert rotate is not None and rollout is not None
    assert rotate.payload["key_id"] == secret_key_id(b"s" * 32)  # the id, never the secret
    assert "s" * 32 not in str(rotate.payload)
    assert "data.json" in rollout.payload["files"]


def test_a_bad_key_file_issues_nothing(fleet_url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    os.chmod(bad, 0o600)
    code, _, err = _run("fleet", "purge", "--tenant", "acme", "--key", str(bad),
                        "--url", fleet_url)  # fmt: skip
    assert code == 2 and "signing key" in err
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        assert store.orders() == []


def test_a_rotation_order_switches_the_secret_of_the_engine(
    fleet_url: str, make_cache: CacheFactory, key_file: Path, tmp_path: Path
) -> None:
    cache = make_cache(audit_url=fleet_url)
    agent = _agent(fleet_url, cache, key_file)
    before = cache.governor.deriver.key_id
    secret = tmp_path / "secret"
    secret.write_bytes(b"n" * 40)
    os.chmod(secret, 0o600)
    code, out, _ = _run("fleet", "rotate-secret", "--secret-file", str(secret),
                        "--key", str(key_file), "--url", fleet_url)  # fmt: skip
    assert code == 0
    agent.sync()
    assert agent.drain() == 1
    assert cache.governor.deriver.key_id == secret_key_id(b"n" * 40) != before
    agent.sync()
    with FleetStore(fleet_url, auto_upgrade=False) as store:
        (result,) = store.results(out.strip())
    assert (result.status, result.verified) == ("completed", True)
    agent.stop()


def test_the_signer_is_the_operator_key(key_file: Path) -> None:
    key = load_signing_key(key_file)
    assert isinstance(key, SigningKey)
