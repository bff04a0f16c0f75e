"""``kvgov demo``: run :func:`kvgov.govern.demo.simulate`, show progress and the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvgov.audit import AuditQueries
from kvgov.audit.store import mask_url
from kvgov.cli.common import print_table
from kvgov.govern.demo import QUICK, DemoConfig, simulate

__all__ = ["run_demo"]


def _print_offload(console: Console, o: dict[str, Any] | None) -> None:
    if not o:
        return
    per_tenant = ", ".join(
        f"{name} {t['offloaded']:,}/{t['restored']:,}"
        for name, t in o["tenants"].items()
        if t["offloaded"] or t["restored"]
    )
    kept = {
        **{f"policy ({k})": v for k, v in o["policy_denied"].items() if v},
        **o["not_offloaded"],
    }
    console.print(
        f"host tier (AES-256-GCM, {o['capacity_bytes'] / 2**20:,.0f} MiB = "
        f"{o['pool_multiple']}x the pool): {o['puts']:,} evicted blocks sealed, {o['hits']:,} "
        f"restored as hits ({o['restored_tokens']:,} prefill tokens avoided), "
        f"{o['stored_blocks']:,} held at the end"
    )
    console.print(
        f"  sealed/restored by tenant: {per_tenant or '-'}; kept out: "
        + (", ".join(f"{k} {v:,}" for k, v in sorted(kept.items())) or "-")
        + f"; refused objects: {sum(o['refusals'].values())}"
    )


def run_demo(
    *,
    out_dir: Path,
    quick: bool = False,
    device: str | None = None,
    metrics_port: int | None = None,
    audit_url: str | None = None,
    as_json: bool = False,
) -> int:
    """Run the demo with a progress bar and print the report; the CLI's ``kvgov demo``.

    Args:
        out_dir: output directory.
        quick: the short configuration.
        device: torch device; default CUDA where present, else CPU.
        metrics_port: serve Prometheus metrics on this port while it runs.
        audit_url: the audit database (see :func:`simulate`); None: ``out_dir/audit.db``.
        as_json: print the report as JSON on stdout (nothing else goes there).

    Returns:
        The process exit status: 0, or 1 if the audit trail did not verify.
    """
    config = QUICK if quick else DemoConfig()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    # with --json, stdout holds the JSON alone: the header and progress go to stderr
    console = Console(stderr=as_json, soft_wrap=True)  # a suggested command stays one line
    where = "SQLite audit" if audit_url is None else f"audit in {mask_url(audit_url)}"
    console.print(
        f"[bold]kvgov demo[/bold]: 3 tenants, {config.steps} requests, {config.num_blocks} "
        f"blocks on {device}, {where} and the embedded Rego engine -> {out_dir}/"
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task("simulating", total=config.steps)
        report = simulate(
            out_dir,
            config,
            device,
            on_step=lambda n: bar.update(task, completed=n),
            metrics_port=metrics_port,
            audit_url=audit_url,
        )
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        sys.stdout.flush()
    else:
        _print_report(console, report, out_dir, audit_url or report["audit_url"])
    return 0 if report["verification"]["ok"] else 1


def _print_report(console: Console, report: dict[str, Any], out_dir: Path, url: str) -> None:
    """The tables and lines of the report; ``url`` opens the audit database."""
    columns = (
        "tenant",
        "requests",
        "hit rate",
        "prefill avoided",
        "cross-tenant reuse",
        "cross-tenant denied",
        "evictions by reason",
        "blocks zeroized",
        "MiB zeroized",
    )
    rows = [
        (
            name,
            str(t["requests"]),
            f"{t['hit_rate']:.1%}",
            f"{t['prefill_tokens_avoided']:,}",
            str(t["cross_tenant_reuses"]),
            str(t["cross_tenant_denied"]),
            ", ".join(f"{k} {v}" for k, v in sorted(t["evictions"].items())) or "-",
            f"{t['blocks_zeroized']:,}",
            f"{t['bytes_zeroized'] / 2**20:,.1f}",
        )
        for name, t in report["tenants"].items()
    ]
    print_table(
        "Per tenant",
        columns,
        rows,
        right=[c for c in columns if c not in ("tenant", "evictions by reason")],
        console=console,
    )
    e, inv = report["erasure"], report["invalidation"]
    if e:
        console.print(
            f"erasure of [bold]{e['tenant']}[/bold] at step {e['step']}: {e['blocks_zeroized']} "
            f"blocks ({e['bytes_zeroized']:,} bytes) zeroized, read back as zero: {e['verified']}, "
            f"audit event {e['event_id']}"
        )
    if e and report.get("offload"):
        deleted = sum(e["offload_deleted"].values())
        console.print(
            f"  host tier: {e['tenant']}'s data key {', '.join(e['destroyed_key_ids'])} destroyed "
            f"first (every copy unreadable), then {deleted} sealed objects deleted"
            if e["destroyed_key_ids"]
            else f"  host tier: {e['tenant']} had nothing sealed yet; no key to destroy"
        )
    if inv:
        console.print(
            f"model upgrade r1 -> r2 at step {inv['step']}: {inv['blocks_zeroized']} cached "
            f"blocks invalidated and zeroized"
        )
    console.print(f"retention sweeps expired {report['total']['expired_by_sweeps']} blocks")
    _print_offload(console, report.get("offload"))
    v = report["verification"]
    status = "[green]OK[/green]" if v["ok"] else "[red]FAILED[/red]"
    console.print(
        f"kvgov audit verify: {status} - {v['events']:,} events in {v['streams']} stream(s), "
        f"{v['checkpoints']} signed checkpoint(s)"
    )
    for problem in v["problems"]:
        console.print(f"  [red]{problem}[/red]")
    shown = report["audit_url"]  # the password masked
    console.print(
        f"overall hit rate: {report['total']['hit_rate']:.1%} of prompt tokens served from cache"
    )
    console.print("\nA reviewer would run next:")
    for cmd in (
        f"kvgov audit verify --url {shown}",
        f"kvgov audit reuse --tenant bank --url {shown}",
        f"kvgov audit erasure --tenant clinic --url {shown}",
        f"kvgov audit denials --url {shown}",
        f"kvgov audit export --format csv --url {shown} --output {out_dir}/audit.csv",
    ):
        console.print(f"  {cmd}")
    with AuditQueries(url) as queries:
        erasures = queries.erasure("clinic")
    if erasures:
        console.print(f"\nerasure evidence on record for clinic: {len(erasures)} event(s)")
    console.print(f"\nreport: {out_dir}/report.json   chart: {out_dir}/blocks.png")
