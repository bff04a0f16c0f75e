"""`kvgov policy replay`: recorded decisions re-evaluated against a candidate bundle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvgov.audit import AuditEvent, AuditLog, AuditQueries, EventType
from kvgov.audit.export import DECISION_EVENT_TYPES
from kvgov.cli.audit import audit_group
from kvgov.cli.main import main
from kvgov.exceptions import PolicyError
from kvgov.policy.bundle import BUNDLE_DIR
from kvgov.policy.client import PolicyClient
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.replay import read_decision_log, replay
from tests.policy.samples import SCOPE
from tests.policy.trail import record_admission, record_lookup

#: The deployment that recorded the trail: acme publishes public blocks to globex,
#: globex has a default priority of 20.
DEPLOYED: dict[str, Any] = {
    "kvgov": {
        "config": {
            "tenants": {"globex": {"priority": 20}},
            "share_groups": {
                "docs": {
                    "publishers": ["acme"],
                    "readers": ["globex"],
                    "classifications": ["public"],
                }
            },
        }
    }
}
TENANTS = ("acme", "globex", "initech")
LABELS = ("public", "internal", "restricted")
T0 = 1_750_000_000.0
#: Admissions in the trail: tenants x labels x tokens (128; 300000, over the default
#: limit) x priorities (null, 80).
ADMISSIONS = len(TENANTS) * len(LABELS) * 2 * 2


def scope(tenant: str, label: str) -> dict[str, Any]:
    return {**SCOPE, "tenant": tenant, "classification": label}


def write_data(tmp_path: Path, name: str, data: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.fixture()
def deployed(tmp_path: Path) -> Path:
    """The deployment's policy_data (DEPLOYED) as a file for --data."""
    return write_data(tmp_path, "deployed.json", DEPLOYED)


@pytest.fixture()
def trail(sqlite_url: str, tmp_path: Path) -> str:
    """An audit trail of admissions and cross-tenant lookups, one second apart from T0,
    decided by the shipped bundle with DEPLOYED data; the last event is a policy error."""
    now = [T0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    client = PolicyClient(EmbeddedEngine(BUNDLE_DIR, DEPLOYED))
    with AuditLog(sqlite_url, "w1", clock=clock, spool_path=tmp_path / "s.jsonl") as log:
        for tenant in TENANTS:
            for label in LABELS:
                for tokens in (128, 300_000):
                    for priority in (None, 80):
                        record_admission(log, client, scope(tenant, label), tokens, priority)
        for requester in ("globex", "initech"):
            for label in ("public", "internal"):
                record_lookup(log, client, requester, scope("acme", label))
        log.record(
            AuditEvent(
                type=EventType.POLICY_ERROR,
                **scope("initech", "internal"),
                token_count=64,
                decision_id="err-1",
                policy_revision=client.bundle_revision,
                details={"requested_priority": None, "reason": "policy error: timeout"},
            )
        )
    client.close()
    return sqlite_url


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, ["policy", "replay", *args])


def replay_on(candidate: Path, data: Path, trail: str, *args: str) -> Any:
    """Replay the trail on a candidate bundle directory with policy_data from a file."""
    return invoke("--candidate", str(candidate), "--data", str(data), "--url", trail, *args)


def test_replaying_on_the_recording_bundle_changes_nothing(trail: str, deployed: Path) -> None:
    """Every recorded decision replays to the outcome recorded: nothing would change."""
    result = replay_on(BUNDLE_DIR, deployed, trail, "--json", "--fail-on-change")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    # admissions, their retention where cacheable, 4 lookups (not the error)
    cacheable = len(TENANTS) * 2 * 2  # public and internal, 128 tokens, both priorities
    assert report["evaluated"] == ADMISSIONS + cacheable + 4
    assert report["changed"] == 0
    assert report["skipped"] == {"recorded an engine error (failed closed): not compared": 1}


def test_replay_catches_a_candidate_that_denies_a_tenant(
    trail: str, tmp_path: Path, deployed: Path
) -> None:
    """A candidate whose data.json disables initech's admissions flips exactly initech's
    admitted requests, counted by classification, and --fail-on-change exits 1."""
    candidate = tmp_path / "candidate"
    shutil.copytree(BUNDLE_DIR, candidate)
    data = json.loads((candidate / "data.json").read_text())
    data["kvgov"]["config"]["tenants"] = {"initech": {"admission": False}}
    (candidate / "data.json").write_text(json.dumps(data))
    result = replay_on(candidate, deployed, trail, "--json", "--fail-on-change")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    denied = {
        (r["tenant"], r["classification"]): r["count"]
        for r in report["counts"]
        if r["kind"] == "admission_denied"
    }
    # initech's admitted requests: 128 tokens, both priorities, every label
    assert denied == {
        ("initech", "public"): 2,
        ("initech", "internal"): 2,
        ("initech", "restricted"): 2,
    }
    example = report["examples"]["admission_denied"][0]
    assert example["after"] == {
        "allow": False, "cache": False, "priority": 0,
        "reason": "admission disabled for tenant initech",
    }  # fmt: skip
    assert example["before"]["allow"] is True and example["decision_id"]
    assert example["timestamp"].startswith("2025-06-15T")
    assert report["by_kind"] == {"admission_denied": 6}


def test_replay_passes_an_equivalent_refactor(trail: str, tmp_path: Path, deployed: Path) -> None:
    """A refactor of admission.rego (the decision computed from deny instead of the
    written-out hot path) passes its tests on both engines and changes no decision."""
    refactor = tmp_path / "refactor"
    shutil.copytree(BUNDLE_DIR, refactor)
    rego = refactor / "admission.rego"
    source = rego.read_text()
    start = source.index('decision := {\n\t"allow": true,')
    end = source.index("} else := {", start)
    rego.write_text(
        source[:start]
        + 'decision := {"allow": true, "cache": a.cache, "priority": p, "reason": a.reason} if {\n'
        + "\tcount(deny) == 0\n"
        + "\tt := scope.tenant_config(input.scope.tenant)\n"
        + '\tp := granted_priority(object.get(input, "priority", null), t)\n'
        + "\ta := admitted(input.scope.classification, t)\n"
        + source[end:]
    )
    assert rego.read_text() != source
    tested = CliRunner().invoke(main, ["policy", "test", "-q", "--engine", "both", str(refactor)])
    assert tested.exit_code == 0, tested.output
    result = replay_on(refactor, deployed, trail, "--fail-on-change")
    assert result.exit_code == 0, result.output
    assert "0 would change" in result.output


def test_recorded_engine_errors_are_not_compared(trail: str, deployed: Path) -> None:
    """A decision that failed closed on an engine error is skipped, not counted as a
    flip, even though the candidate would admit its input (a transient timeout must
    not fail a --fail-on-change gate)."""
    result = replay_on(BUNDLE_DIR, deployed, trail, "--json", "--tenant", "initech")
    report = json.loads(result.output)
    assert report["changed"] == 0
    assert report["skipped"] == {"recorded an engine error (failed closed): not compared": 1}


def test_sharing_grants_gained_and_lost(trail: str, tmp_path: Path) -> None:
    """A candidate without the share group loses globex's grant; one that lets
    initech read gains initech's."""
    groups = {
        "docs": {"publishers": ["acme"], "readers": ["initech"], "classifications": ["public"]}
    }
    data = write_data(tmp_path, "groups.json", {"kvgov": {"config": {"share_groups": groups}}})
    result = replay_on(BUNDLE_DIR, data, trail, "--json")
    report = json.loads(result.output)
    rows = {(r["kind"], r["tenant"], r["classification"]) for r in report["counts"]}
    assert ("sharing_lost", "globex", "public") in rows
    assert ("sharing_gained", "initech", "public") in rows


def test_time_window_and_tenant_select_decisions(trail: str, deployed: Path) -> None:
    """--since / --until bound the window (UTC); --tenant keeps decisions it asks or owns."""
    with AuditQueries(trail) as q:
        times = [r.time for r in q.iter_events(DECISION_EVENT_TYPES)]
    # the first two events: acme's public admissions, each with its retention
    until = json.loads(
        replay_on(BUNDLE_DIR, deployed, trail, "--json", "--until", times[2].isoformat()).output
    )
    assert until["evaluated"] == 4
    since = json.loads(
        replay_on(BUNDLE_DIR, deployed, trail, "--json", "--since", times[2].isoformat()).output
    )
    assert since["evaluated"] == ADMISSIONS + len(TENANTS) * 4 + 4 - 4
    globex = json.loads(
        replay_on(BUNDLE_DIR, deployed, trail, "--json", "--tenant", "globex").output
    )
    # globex's 12 admissions, 4 retentions, and the 2 lookups it made of acme's blocks
    assert globex["evaluated"] == 12 + 4 + 2


def test_replay_of_an_exported_decision_log(trail: str, tmp_path: Path, deployed: Path) -> None:
    """`audit export --format opa-decision-log` writes what `policy replay
    --decision-log` reads, with the same result as replaying the trail."""
    log_file = tmp_path / "decisions.jsonl"
    exported = CliRunner().invoke(
        audit_group, ["export", "--format", "opa-decision-log", "--url", trail,
                      "--output", str(log_file)],
    )  # fmt: skip
    assert exported.exit_code == 0, exported.output
    from_log = ("--candidate", str(BUNDLE_DIR), "--data", str(deployed), "--json",
                "--decision-log", str(log_file))  # fmt: skip
    from_trail = replay_on(BUNDLE_DIR, deployed, trail, "--json")
    assert json.loads(invoke(*from_log).output) == json.loads(from_trail.output)
    globex = invoke(*from_log, "--tenant", "globex")
    assert json.loads(globex.output)["evaluated"] == 12 + 4 + 2


def test_unreviewed_rules_and_bad_entries_are_skipped() -> None:
    """Entries of other rules or without an input are skipped and counted by reason."""
    client = PolicyClient(EmbeddedEngine(run_tests=False))
    report = replay(
        [
            {"path": "kvgov/classifications", "input": {}, "result": ["public"]},
            {"path": "kvgov/admission/decision", "result": {"allow": True}},
            {"path": "data.kvgov.retention.decision", "input": {"scope": SCOPE},
             "result": {"ttl_seconds": 3600}},
        ],
        client,
    )  # fmt: skip
    client.close()
    assert report.evaluated == 1 and report.changed == 0
    assert report.skipped == {
        "rule 'kvgov/classifications' is not reviewed": 1,
        "no input recorded": 1,
    }


def test_a_bad_decision_log_is_a_policy_error(tmp_path: Path) -> None:
    """A line that is not a JSON object names its line number; the CLI exits 2."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"path": "kvgov/admission/decision"}\n\n[1]\n')
    with pytest.raises(PolicyError, match=r"bad\.jsonl:3"):
        list(read_decision_log(bad))
    result = invoke("--candidate", str(BUNDLE_DIR), "--decision-log", str(bad))
    assert result.exit_code == 2 and "bad.jsonl:3" in result.output


def test_source_is_required_and_exclusive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly one of --url and --decision-log (or $KVGOV_AUDIT_URL) is a usage error otherwise."""
    monkeypatch.delenv("KVGOV_AUDIT_URL", raising=False)
    assert invoke("--candidate", str(BUNDLE_DIR)).exit_code == 2
    log_file = tmp_path / "d.jsonl"
    log_file.write_text("")
    both = invoke(
        "--candidate", str(BUNDLE_DIR), "--url", "sqlite://", "--decision-log", str(log_file)
    )
    assert both.exit_code == 2


def test_an_unreadable_trail_exits_3(tmp_path: Path) -> None:
    """A database without the audit schema is an environment error (exit 3), one line."""
    result = invoke("--candidate", str(BUNDLE_DIR), "--url", f"sqlite:///{tmp_path / 'empty.db'}")
    assert result.exit_code == 3, result.output
    assert result.output.startswith("cannot read the audit trail:")


def test_a_candidate_that_does_not_load_exits_2(tmp_path: Path, trail: str) -> None:
    """A candidate with a syntax error exits 2 naming the file."""
    bundle_copy = tmp_path / "rego"
    shutil.copytree(BUNDLE_DIR, bundle_copy)
    (bundle_copy / "bad.rego").write_text("package kvgov.bad\n\nallow if {\n")
    result = invoke("--candidate", str(bundle_copy), "--url", trail)
    assert result.exit_code == 2 and "bad.rego" in result.output
