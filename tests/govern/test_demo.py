"""`kvgov demo --quick`: the report's numbers agree with the audit trail."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.audit import AuditQueries
from kvgov.cli.main import main


def test_quick_demo_report_matches_the_audit_log(tmp_path: Path) -> None:
    """Requests, reuses, denials, zeroization and the erasure in report.json equal the trail."""
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "kvgov audit verify: OK" in result.output
    report = json.loads((out / "report.json").read_text())
    assert (out / "blocks.png").stat().st_size > 10_000
    # not a terminal: whole values, tab-separated, and each suggested command on one line
    assert "…" not in result.output
    lines = result.output.splitlines()
    assert lines[1].split("\t")[:3] == ["tenant", "requests", "hit rate"]
    for name, t in report["tenants"].items():
        assert f"{name}\t{t['requests']}\t{t['hit_rate']:.1%}\t" in result.output
    export = f"  kvgov audit export --format csv --url {report['audit_url']} --output "
    assert any(line.startswith(export) and line.endswith("audit.csv") for line in lines)
    assert report["verification"]["ok"] and not report["verification"]["problems"]

    with AuditQueries(report["audit_url"]) as q:
        events = list(q.iter_all())
    assert report["verification"]["events"] == len(events)
    admissions = Counter(e.tenant for e in events if e.type == "admission")
    cross = Counter(e.requester_tenant for e in events if e.type == "cross_tenant_reuse")
    denied = Counter(e.requester_tenant for e in events if e.type == "share_denied")
    zeroized: Counter[str | None] = Counter()
    for e in events:
        if e.type == "zeroization":
            zeroized[e.tenant] += len(e.block_ids)
    for tenant, t in report["tenants"].items():
        assert t["requests"] == admissions[tenant]
        assert t["cross_tenant_reuses"] == cross[tenant]
        assert t["cross_tenant_denied"] == denied[tenant]
        assert t["blocks_zeroized"] == zeroized[tenant]
    assert sum(admissions.values()) == report["total"]["requests"] == report["config"]["steps"]
    # the scenario really exercised every path it claims
    assert report["tenants"]["chatbot"]["cross_tenant_reuses"] > 0
    assert report["tenants"]["chatbot"]["cross_tenant_denied"] > 0
    assert report["total"]["expired_by_sweeps"] > 0
    assert report["invalidation"]["blocks_zeroized"] > 0
    erasure = [e for e in events if e.type == "erasure"]
    assert len(erasure) == 1 and erasure[0].tenant == "clinic"
    assert erasure[0].details["blocks_zeroized"] == report["erasure"]["blocks_zeroized"] > 0
    assert report["erasure"]["verified"] is True
    # the host tier: what the report says it sealed and restored is what the trail holds
    offload = report["offload"]
    sealed: Counter[str | None] = Counter()
    restored: Counter[str | None] = Counter()
    for e in events:
        if e.type == "offload":
            assert e.details["tier"] == "host"
            sealed[e.tenant] += len(e.block_ids)
        elif e.type == "offload_restore":
            assert e.tenant == e.requester_tenant  # only a tenant's own blocks come back
            restored[e.requester_tenant] += len(e.block_ids)
    for tenant, t in offload["tenants"].items():
        assert t["offloaded"] == sealed[tenant]
        assert t["restored"] == restored[tenant]
    assert offload["puts"] == sum(sealed.values()) > 0
    assert offload["hits"] == sum(restored.values()) > 0
    assert offload["tenants"]["chatbot"]["offloaded"] == 0  # public, in the share group
    assert not any(e.type == "offload" and e.classification == "restricted" for e in events)
    assert "host tier (AES-256-GCM" in result.output
    # hit rates are printed as percentages, from the same figures the report holds
    total = report["total"]
    assert total["hit_rate_percent"] == round(100 * total["hit_rate"], 2) > 0
    shown = re.search(r"overall hit rate: ([0-9.]+)%", result.output)
    assert shown is not None, result.output
    assert float(shown.group(1)) == pytest.approx(100 * total["hit_rate"], abs=0.05)
    for t in report["tenants"].values():
        assert t["hit_rate_percent"] == round(100 * t["hit_rate"], 2)


def test_quick_demo_json_is_the_report(tmp_path: Path) -> None:
    """`--json` prints the report, and only the report, on stdout: what report.json holds."""
    out = tmp_path / "demo"
    args = ["demo", "--quick", "--json", "--out", str(out), "--device", "cpu"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == json.loads((out / "report.json").read_text())
    assert printed["verification"]["ok"] is True
    assert printed["audit_stream"] == "demo-worker"
    assert "Per tenant" not in result.stdout  # no table on stdout
    assert set(printed["tenants"]) == {"bank", "clinic", "chatbot"}


@pytest.mark.postgres
def test_quick_demo_writes_its_trail_into_postgresql(pg_url: str, tmp_path: Path) -> None:
    """`--audit-url` writes the demo's trail into that database, as a stream of its own."""
    runner = CliRunner()
    nowhere = tmp_path / "refused"
    refused = runner.invoke(main, ["demo", "--quick", "--audit-url", pg_url, "--out", str(nowhere)])
    assert refused.exit_code == 3, refused.output  # no schema yet: nothing was written
    assert "kvgov db upgrade" in refused.output
    assert not nowhere.exists()
    upgraded = runner.invoke(main, ["db", "upgrade", pg_url])
    assert upgraded.exit_code == 0, upgraded.output

    out = tmp_path / "demo"
    args = ["demo", "--quick", "--json", "--audit-url", pg_url, "--out", str(out)]
    result = runner.invoke(main, [*args, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert not (out / "audit.db").exists()
    assert report["audit_url"].startswith("postgresql")
    stream = report["audit_stream"]
    with AuditQueries(pg_url) as q:
        events = list(q.iter_all())
    assert len(events) == report["verification"]["events"] > 0
    assert {e.event_id.rsplit(":", 1)[0] for e in events} == {stream}
    admissions = sum(e.type == "admission" for e in events)
    assert admissions == report["total"]["requests"]
    erasures = [e for e in events if e.type == "erasure"]
    assert [e.tenant for e in erasures] == ["clinic"]
