"""The fleet proof (``make test-fleet``): engine processes on one PostgreSQL, driven by
the ``kvgov`` command.

Three native ``GovernedKVCache`` processes (tests/fleet/native_engine.py) and one
governed vLLM OpenAI server (vllm-cpu 0.32, the tiny model; its fleet agent in the
engine core, its worker's KV tensors read back with ``benchmarks/vllm_kv_probe.py``)
on one PostgreSQL, one set of orders for all four:

* a purge of ``acme``, issued while one native engine is stopped: every live engine
  completes it with verified evidence; the vLLM worker's blocks that held acme's KV
  read back zero, the other tenants' still hold theirs; the stopped engine runs the
  purge when it starts again;
* a rollout of a bundle that denies the tenant ``blocked``: every engine refuses
  ``blocked`` after it acknowledged, none before;
* an invalidation of model revision ``r1``: the vLLM worker's KV reads back all zero;
* an order signed with a key no engine trusts, and one written into the table unsigned
  under the operator's key id: refused by every engine, audited, and nothing ran (the
  vLLM worker still holds the KV of the tenant they named).

Run by ``tests/fleet/run_test_fleet.py`` with the vllm-cpu venv's python (vLLM must be
importable: the test fails, naming the runner, where it is not).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgov.audit import AuditQueries, upgrade, verify
from kvgov.audit.fleet import FleetStore, Order
from kvgov.audit.signing import generate_key_files, load_signing_key
from tests.govern.fleet.conftest import blocking_bundle

pytestmark = [pytest.mark.fleet, pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).parents[2]
NATIVE = ("native-1", "native-2", "native-3")
VLLM = "vllm-1"
ENGINES = (*NATIVE, VLLM)
SECRET = "fleet-cache-key-secret-" + "s" * 24  # the vLLM engine's KVGOV_KEY_SECRET
VLLM_BLOCKS = 61  # a small pool: the probe reads every block


def _kvgov(url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from kvgov.cli.main import main; main()", *args]
    if "--url" not in args and args[0] in ("fleet", "audit"):
        cmd += ["--url", url]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def _benchmarks() -> Any:
    """``benchmarks/vllm_cpu_env.py`` (standard library), once vLLM is known importable."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            "the fleet proof starts a governed vLLM server: run it with the vllm-cpu venv's "
            "python (make test-fleet, i.e. tests/fleet/run_test_fleet.py)"
        )
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    import vllm_cpu_env

    return vllm_cpu_env


class Fleet:
    def __init__(self, url: str, tmp: Path, pub: Path) -> None:
        self.url, self.tmp, self.pub = url, tmp, pub
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.server: Any = None  # vllm_cpu_env.Server, the engine VLLM

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

    def start_vllm(self) -> None:
        """The governed vLLM OpenAI server ``VLLM`` in the fleet (its start is waited later)."""
        env = _benchmarks()
        model = env.ensure_model(Path(sys.executable), self.tmp / "tiny")
        self.server = env.Server(
            VLLM, Path(sys.executable), model, self.tmp / f"{VLLM}.log", governed=True,
            num_blocks=VLLM_BLOCKS, kv_probe=True, cwd=self.tmp,
            kvgov={"audit_url": self.url, "worker_id": VLLM, "model_revision": "r1",
                   "fleet_url": self.url, "fleet_operator_keys_file": str(self.pub),
                   "fleet_poll_interval": 0.5},
            env={"KVGOV_KEY_SECRET": SECRET},
        ).start()  # fmt: skip

    def stop(self, engine_id: str) -> None:
        if engine_id == VLLM:
            self.server.stop()  # SIGINT: the engine shuts down, its agent and trail flushed
            self.server = None
            return
        proc = self.procs.pop(engine_id)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)

    def running(self) -> list[str]:
        return [*self.procs, *([VLLM] if self.server is not None else [])]

    def state_path(self, engine_id: str) -> Path:
        return self.tmp / f"{engine_id}.json"

    def state(self, engine_id: str) -> dict[str, Any]:
        path = self.state_path(engine_id)
        return json.loads(path.read_text()) if path.exists() else {}

    def until(self, what: str, ok: Any, limit: float = 300.0) -> None:
        """Wait for a condition of the processes (a liveness limit, not a timing claim)."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if ok():
                return
            for eid, p in self.procs.items():
                if p.poll() is not None:
                    log = (self.tmp / f"{eid}.log").read_text(errors="replace")
                    raise AssertionError(f"{eid} exited {p.returncode}:\n{log[-3000:]}")
            if self.server is not None and self.server.proc.poll() is not None:
                raise AssertionError(f"{VLLM} exited:\n{self.server.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"not reached within {limit}s: {what}")

    # -- the vLLM engine, over HTTP
    def complete(self, tenant: str, seed: str) -> int:
        """One completion as ``tenant`` (the scope in ``vllm_xargs``); the HTTP status."""
        body = {
            "model": "tiny", "prompt": _benchmarks().prompt(seed), "max_tokens": 2,
            "temperature": 0.0,
            "vllm_xargs": {"kvgov_tenant": tenant, "kvgov_classification": "internal",
                           "kvgov_template": "x"},
        }  # fmt: skip
        req = urllib.request.Request(
            f"{self.server.base_url}/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def kv_nonzero(self) -> set[int]:
        """The vLLM worker's blocks holding a non-zero KV byte (``vllm_kv_probe``)."""
        state = self.server.kv_state()
        assert state["num_blocks"] >= VLLM_BLOCKS, state
        return set(state["nonzero"])


@pytest.fixture()
def fleet(pg_url: str, tmp_path: Path) -> Iterator[tuple[Fleet, Path, Path]]:
    upgrade(pg_url)
    operator = generate_key_files(tmp_path / "keys" / "operator.pem")
    intruder = generate_key_files(tmp_path / "keys" / "intruder.pem")
    f = Fleet(pg_url, tmp_path, operator.public)
    try:
        yield f, operator.private, intruder.private
    finally:
        for eid in f.running():
            f.stop(eid)


def _wait(url: str, order_id: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return _kvgov(url, "fleet", "wait", order_id, "--timeout", str(timeout), "--stale-after",
                  "10", check=False)  # fmt: skip


def _latencies(url: str, order_id: str) -> dict[str, float]:
    """Per engine: seconds from the order's issue to its result (``done_us``)."""
    with FleetStore(url, auto_upgrade=False) as store:
        order = store.order(order_id)
        assert order is not None
        return {r.engine_id: (r.done_us - order.issued_us) / 1e6 for r in store.results(order_id)}


def _report(kind: str, url: str, order_id: str, took: float) -> None:
    lat = _latencies(url, order_id)
    each = ", ".join(f"{e} {s:.2f} s" for e, s in sorted(lat.items()))
    print(f"\n{kind}: issue -> result per engine: {each}; issue + kvgov fleet wait: {took:.1f} s")


@pytest.mark.timeout(1800)  # a liveness limit: a vLLM start takes 35-90 s, minutes under load
def test_purge_restart_rollout_invalidate_and_a_forged_order_across_the_fleet(
    fleet: tuple[Fleet, Path, Path], tmp_path: Path
) -> None:
    f, key, wrong_key = fleet
    url = f.url
    t0 = time.monotonic()
    for eid in NATIVE:
        f.start(eid)
    f.start_vllm()  # 35-90 s to start: the native engines start meanwhile
    f.until("every native engine registered, acme written",
            lambda: all(f.state(e).get("registered") and f.state(e).get("acme_blocks")
                        for e in NATIVE), limit=420)  # fmt: skip
    assert not any(f.state(e)["acme_zero"] for e in NATIVE)
    native_ready = time.monotonic() - t0
    vllm_start = f.server.wait(timeout=600)
    print(f"\nready: the native engines at {native_ready:.0f} s, the vLLM server at "
          f"{time.monotonic() - t0:.0f} s (its start {vllm_start:.0f} s)")  # fmt: skip
    # the vLLM engine's KV: the other tenants' first, then acme's (prompts of 120 tokens,
    # 3 full blocks each stay cached; the partial tail is zeroed at release)
    assert f.complete("globex", "globex") == 200
    assert f.complete("blocked", "blocked") == 200  # the policy of the start allows it
    others = f.kv_nonzero()
    assert f.complete("acme", "acme-1") == 200
    assert f.complete("acme", "acme-2") == 200
    acme = f.kv_nonzero() - others
    assert len(others) >= 6 and len(acme) >= 6, (others, acme)

    def vllm_live() -> bool:
        with FleetStore(url, auto_upgrade=False) as store:
            return any(e.engine_id == VLLM and e.kind == "vllm" for e in store.engines())

    f.until(f"{VLLM} registered", vllm_live)
    f.stop("native-3")  # stopped before the order

    # -- purge: the live engines complete it; the stopped one is not waited for
    t = time.monotonic()
    order_id = _kvgov(url, "fleet", "purge", "--tenant", "acme", "--key", str(key)).stdout.strip()
    done = _wait(url, order_id)
    assert done.returncode == 0, done.stdout + done.stderr
    _report("purge", url, order_id, time.monotonic() - t)
    assert f"{VLLM}: live, completed, verified" in done.stdout
    # the vLLM worker: acme's blocks read back zero, the other tenants' hold their KV
    left = f.kv_nonzero()
    assert not left & acme, f"acme's KV left in blocks {sorted(left & acme)}"
    assert left == others
    f.until("the purge read back zero", lambda: all(f.state(e)["acme_zero"] for e in NATIVE[:2]))
    # -- restarted after the order: it runs it on start
    f.start("native-3", acme=False)
    f.until("native-3 ran the missed purge", lambda: f.state("native-3").get("executed", 0) >= 1)
    done = _wait(url, order_id)
    assert done.returncode == 0, done.stdout + done.stderr
    for eid in ENGINES:
        assert f"{eid}: live, completed, verified" in done.stdout
    evidence = _kvgov(url, "audit", "erasure", "--order", order_id).stdout.splitlines()
    print("\n" + "\n".join(evidence))
    assert len(evidence) == 1 + len(ENGINES)
    assert any(line.startswith(f"{VLLM}: live, completed, verified") for line in evidence)
    with AuditQueries(url) as q:
        events = [e for e in q.erasure("acme") if e.details.get("order_id") == order_id]
        confirmed = [e for e in q.events(type="fleet_order")
                     if e.details.get("order_id") == order_id and e.stream == VLLM]  # fmt: skip
    assert sorted(e.stream for e in events) == sorted(ENGINES)
    # a native engine reads its pool back itself; the vLLM engine core cannot read the
    # workers' bytes: its erasure says so, and its confirmation (the step that carried
    # the zeroing came back) is the verified evidence -- read back above with the probe
    assert all(e.details["verified"] is True for e in events if e.stream != VLLM)
    (vllm_erasure,) = [e for e in events if e.stream == VLLM]
    assert vllm_erasure.details["blocks_zeroized"] == len(acme)
    (ok,) = confirmed
    assert ok.details["outcome"] == "confirmed" and ok.details["verified"] is True
    assert ok.details["evidence_event_id"] == vllm_erasure.event_id

    # -- rollout: blocked is refused after each engine's acknowledgement, never before
    with FleetStore(url, auto_upgrade=False) as store:
        old = {e.engine_id: e.policy_revision for e in store.engines()}
    assert all(f.state(e)["probes"][-1]["allowed"] for e in NATIVE)
    assert f.complete("blocked", "blocked-before") == 200
    bundle = blocking_bundle(tmp_path / "bundle")
    t = time.monotonic()
    rollout = _kvgov(url, "fleet", "rollout", "--bundle", str(bundle), "--key", str(key))
    rollout_id = rollout.stdout.strip()
    done = _wait(url, rollout_id)
    assert done.returncode == 0, done.stdout + done.stderr
    _report("rollout", url, rollout_id, time.monotonic() - t)
    with FleetStore(url, auto_upgrade=False) as store:
        results = {r.engine_id: r for r in store.results(rollout_id)}
    for eid in NATIVE:
        new = results[eid].detail["policy_revision"]
        assert new != old[eid]
        f.until(f"{eid} probed after the rollout",
                lambda eid=eid, new=new: f.state(eid)["probes"][-1]["revision"] == new)  # fmt: skip
        probes = f.state(eid)["probes"]
        assert {p["allowed"] for p in probes if p["revision"] == new} == {False}
        assert {p["allowed"] for p in probes if p["revision"] != new} <= {True}
    assert results[VLLM].detail["policy_revision"] != old[VLLM]
    assert f.complete("blocked", "blocked-after") == 403  # the rolled-out bundle denies it
    assert f.complete("globex", "globex-after") == 200  # and still serves the others

    # -- invalidate: every block of model revision r1 leaves every cache
    t = time.monotonic()
    inv = _kvgov(url, "fleet", "invalidate", "--model-revision", "r1", "--key", str(key))
    inv_id = inv.stdout.strip()
    done = _wait(url, inv_id)
    assert done.returncode == 0, done.stdout + done.stderr
    _report("invalidate", url, inv_id, time.monotonic() - t)
    assert f.kv_nonzero() == set(), "the invalidated blocks read back zero in the vLLM worker"

    # -- forged: signed by a key no engine trusts; unsigned: written straight into the
    # table (as one who can write the database could) under the operator's key id
    assert f.complete("globex", "globex-last") == 200
    globex = f.kv_nonzero()
    assert globex, "globex's KV in the vLLM worker: what the bad orders would purge"
    forged = _kvgov(url, "fleet", "purge", "--tenant", "globex", "--key", str(wrong_key))
    forged_id = forged.stdout.strip()
    signer = load_signing_key(key)
    assert signer is not None
    operator_id = signer.key_id
    with FleetStore(url, auto_upgrade=False) as store:
        now_us = int(time.time() * 1e6)
        unsigned = Order(uuid.uuid4().hex, "purge", {"tenant": "globex"}, now_us, operator_id, b"")
        unsigned_id = store.issue(unsigned).order_id
        bad = (forged_id, unsigned_id)
        f.until("every engine refused the forged and the unsigned order",
                lambda: all(len(store.results(o)) == len(ENGINES) for o in bad))  # fmt: skip
        for o in bad:
            assert {r.status for r in store.results(o)} == {"refused"}
    done = _wait(url, forged_id, timeout=1)  # what the operator sees
    assert done.returncode == 1, done.stdout + done.stderr
    for eid in ENGINES:
        assert f"{eid}: live, refused, result refused" in done.stdout, done.stdout
    assert f.kv_nonzero() == globex, "neither order ran: globex's KV is where it was"
    for eid in f.running():
        f.stop(eid)
    with AuditQueries(url) as q:
        refusals = [e for e in q.events(type="fleet_order") if e.details.get("order_id") in bad]
    for o in bad:
        mine = [e for e in refusals if e.details["order_id"] == o]
        assert sorted(e.stream for e in mine) == sorted(ENGINES), o
        assert all(e.details["outcome"] == "refused" for e in mine)
    assert verify(url).ok
    print(f"\nthe fleet proof: {time.monotonic() - t0:.0f} s (the vLLM start {vllm_start:.0f} s)")
