"""The fleet proof (``make test-fleet``): engine processes on one PostgreSQL, driven by
the ``kvgov fleet`` command.

Three native ``GovernedKVCache`` processes (tests/fleet/native_engine.py) stand for the
fleet; real vLLM servers are not started here (see docs/fleet.md, "What is proven").
One engine is stopped before a purge and restarted after it: it runs the purge on
start. Then a rollout of a bundle that denies the tenant ``blocked``: every engine
refuses ``blocked`` after it acknowledged, none before. Then an order signed with a key
no engine trusts: refused by every engine, and audited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgov.audit import AuditQueries, upgrade, verify
from kvgov.audit.fleet import FleetStore
from kvgov.audit.signing import generate_key_files
from tests.govern.fleet.conftest import blocking_bundle

pytestmark = [pytest.mark.fleet, pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).parents[2]
ENGINES = ("native-1", "native-2", "native-3")


def _kvgov(url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from kvgov.cli.main import main; main()", *args]
    if "--url" not in args and args[0] in ("fleet", "audit"):
        cmd += ["--url", url]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


class Fleet:
    def __init__(self, url: str, tmp: Path, pub: Path) -> None:
        self.url, self.tmp, self.pub = url, tmp, pub
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, engine_id: str, *, acme: bool = True) -> None:
        state = self.state_path(engine_id)
        state.unlink(missing_ok=True)
        cmd = [sys.executable, str(ROOT / "tests/fleet/native_engine.py"), "--url", self.url,
               "--engine-id", engine_id, "--operator-pub", str(self.pub),
               "--state", str(state)]  # fmt: skip
        if not acme:
            cmd.append("--no-acme")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        log = (self.tmp / f"{engine_id}.log").open("ab")
        self.procs[engine_id] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)

    def stop(self, engine_id: str) -> None:
        proc = self.procs.pop(engine_id)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)

    def state_path(self, engine_id: str) -> Path:
        return self.tmp / f"{engine_id}.json"

    def state(self, engine_id: str) -> dict[str, Any]:
        path = self.state_path(engine_id)
        return json.loads(path.read_text()) if path.exists() else {}

    def until(self, what: str, ok: Any, limit: float = 120.0) -> None:
        """Wait for a condition of the processes (a liveness limit, not a timing claim)."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if ok():
                return
            for eid, p in self.procs.items():
                if p.poll() is not None:
                    log = (self.tmp / f"{eid}.log").read_text(errors="replace")
                    raise AssertionError(f"{eid} exited {p.returncode}:\n{log[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(f"not reached within {limit}s: {what}")


@pytest.fixture()
def fleet(pg_url: str, tmp_path: Path) -> Iterator[tuple[Fleet, Path, Path]]:
    upgrade(pg_url)
    operator = generate_key_files(tmp_path / "keys" / "operator.pem")
    intruder = generate_key_files(tmp_path / "keys" / "intruder.pem")
    f = Fleet(pg_url, tmp_path, operator.public)
    try:
        yield f, operator.private, intruder.private
    finally:
        for eid in list(f.procs):
            f.stop(eid)


def _wait(url: str, order_id: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return _kvgov(url, "fleet", "wait", order_id, "--timeout", str(timeout), "--stale-after",
                  "10", check=False)  # fmt: skip


def test_purge_restart_rollout_and_a_forged_order_across_the_fleet(
    fleet: tuple[Fleet, Path, Path], tmp_path: Path
) -> None:
    f, key, wrong_key = fleet
    url = f.url
    for eid in ENGINES:
        f.start(eid)
    f.until("every engine registered, acme written",
            lambda: all(f.state(e).get("registered") and f.state(e).get("acme_blocks")
                        for e in ENGINES))  # fmt: skip
    assert not any(f.state(e)["acme_zero"] for e in ENGINES)
    f.stop("native-3")  # stopped before the order

    # -- purge: the live engines complete it; the stopped one is not waited for
    order_id = _kvgov(url, "fleet", "purge", "--tenant", "acme", "--key", str(key)).stdout.strip()
    done = _wait(url, order_id)
    assert done.returncode == 0, done.stdout + done.stderr
    f.until("the purge read back zero", lambda: all(f.state(e)["acme_zero"] for e in ENGINES[:2]))
    # -- restarted after the order: it runs it on start
    f.start("native-3", acme=False)
    f.until("native-3 ran the missed purge", lambda: f.state("native-3").get("executed", 0) >= 1)
    done = _wait(url, order_id)
    assert done.returncode == 0, done.stdout + done.stderr
    for eid in ENGINES:
        assert f"{eid}: live, completed, verified" in done.stdout
    evidence = _kvgov(url, "audit", "erasure", "--order", order_id).stdout.splitlines()
    assert len(evidence) == 1 + len(ENGINES)
    with AuditQueries(url) as q:
        events = [e for e in q.erasure("acme") if e.details.get("order_id") == order_id]
    assert sorted(e.stream for e in events) == sorted(ENGINES)
    assert all(e.details["verified"] is True for e in events)

    # -- rollout: blocked is refused after each engine's acknowledgement, never before
    with FleetStore(url, auto_upgrade=False) as store:
        old = {e.engine_id: e.policy_revision for e in store.engines()}
    assert all(f.state(e)["probes"][-1]["allowed"] for e in ENGINES)
    bundle = blocking_bundle(tmp_path / "bundle")
    rollout = _kvgov(url, "fleet", "rollout", "--bundle", str(bundle), "--key", str(key))
    rollout_id = rollout.stdout.strip()
    done = _wait(url, rollout_id)
    assert done.returncode == 0, done.stdout + done.stderr
    with FleetStore(url, auto_upgrade=False) as store:
        results = {r.engine_id: r for r in store.results(rollout_id)}
    for eid in ENGINES:
        new = results[eid].detail["policy_revision"]
        assert new != old[eid]
        f.until(f"{eid} probed after the rollout",
                lambda eid=eid, new=new: f.state(eid)["probes"][-1]["revision"] == new)  # fmt: skip
        probes = f.state(eid)["probes"]
        assert {p["allowed"] for p in probes if p["revision"] == new} == {False}
        assert {p["allowed"] for p in probes if p["revision"] != new} <= {True}

    # -- forged: signed by a key no engine trusts
    forged = _kvgov(url, "fleet", "purge", "--tenant", "globex", "--key", str(wrong_key))
    forged_id = forged.stdout.strip()
    done = _wait(url, forged_id, timeout=15)
    assert done.returncode == 1
    with FleetStore(url, auto_upgrade=False) as store:
        f.until("every engine refused the forged order",
                lambda: len(store.results(forged_id)) == len(ENGINES))  # fmt: skip
        assert {r.status for r in store.results(forged_id)} == {"refused"}
    for eid in list(f.procs):
        f.stop(eid)
    with AuditQueries(url) as q:
        refusals = [e for e in q.events(type="fleet_order")
                    if e.details.get("order_id") == forged_id]  # fmt: skip
    assert sorted(e.stream for e in refusals) == sorted(ENGINES)
    assert all(e.details["outcome"] == "refused" for e in refusals)
    assert verify(url).ok
