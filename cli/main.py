"""The ``kvgov`` command: demo, replay, capacity, and the policy / audit / db groups."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress

from kvgov.cli.audit import audit_group, db_group
from kvgov.cli.common import emit_records, format_options, print_table
from kvgov.cli.errors import ErrorsToExitCodes
from kvgov.cli.fleet import fleet_group
from kvgov.cli.policy import policy_group
from kvgov.cli.policy_replay import replay_command as policy_replay_command
from kvgov.exceptions import InvalidArgument
from kvgov.govern.logs import configure_logging
from kvgov.govern.sizes import parse_size

__all__ = ["main"]


def _parse_bytes(text: str) -> int:
    try:
        return parse_size(text, name="--memory")
    except InvalidArgument as exc:
        raise click.BadParameter(f"{text!r}: {exc.reason}") from None


@click.group(cls=ErrorsToExitCodes)
@click.version_option(package_name="kvgov")
def main() -> None:
    """kvgov: governance for the KV cache of a multi-tenant LLM server."""
    configure_logging()


policy_group.add_command(policy_replay_command)
main.add_command(policy_group)
main.add_command(audit_group)
main.add_command(db_group)
main.add_command(fleet_group)


@main.command("capacity")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="A Hugging Face config.json.",
)
@click.option("--layers", type=int, help="Decoder layers (without --config).")
@click.option("--kv-heads", type=int, help="KV heads (without --config).")
@click.option("--head-dim", type=int, help="Head dimension (without --config).")
@click.option("--dtype", default=None, help="KV dtype: float16, bfloat16, float32, fp8.")
@click.option("--memory", required=True, help="KV memory budget, e.g. 40GiB.")
@click.option(
    "--context",
    "mean_context",
    type=int,
    required=True,
    help="Mean tokens per sequence (prompt + output).",
)
@click.option("--block-size", type=int, default=16, show_default=True)
@format_options
def capacity_command(
    config_path: str | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    dtype: str | None,
    memory: str,
    mean_context: int,
    block_size: int,
    fmt: str,
) -> None:
    """How many blocks, tokens and concurrent sequences fit in a KV memory budget.

    Also shows how the figures change with fp8 KV and with other block sizes.
    """
    from kvgov.allocator import KVSpec  # torch: only the commands that size KV need it
    from kvgov.allocator.sizing import capacity
    from kvgov.allocator.spec import parse_dtype

    budget = _parse_bytes(memory)
    if config_path is not None:
        if any(v is not None for v in (layers, kv_heads, head_dim)):
            raise click.UsageError("give either --config or --layers/--kv-heads/--head-dim")
        try:
            config = json.loads(Path(config_path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{config_path} is not JSON: {exc}") from None
        if dtype is not None:
            config = {**config, "torch_dtype": dtype}
        base = KVSpec.from_hf_config(config, block_size=block_size)
    else:
        if layers is None or kv_heads is None or head_dim is None:
            raise click.UsageError("give --config, or all of --layers, --kv-heads, --head-dim")
        base = KVSpec(
            layers, kv_heads, head_dim, block_size=block_size, dtype=parse_dtype(dtype or "float16")
        )
    rows = []
    variants = [("as given", base)]
    fp8 = parse_dtype("fp8")
    if base.dtype != fp8:
        variants.append(("fp8 KV", replace(base, dtype=fp8)))
    for size in (8, 16, 32, 64):
        if size != base.block_size:
            variants.append((f"block {size}", replace(base, block_size=size)))
    for label, spec in variants:
        cap = capacity(spec, budget, mean_context)
        rows.append(
            {
                "variant": label,
                "dtype": str(spec.dtype).removeprefix("torch."),
                "block_size": spec.block_size,
                "bytes_per_token": spec.bytes_per_token,
                "bytes_per_block": spec.bytes_per_block,
                "blocks": cap.blocks,
                "tokens": cap.tokens,
                "concurrent_sequences": cap.sequences,
            }
        )
    if fmt == "json":
        click.echo(
            json.dumps(
                {"memory_bytes": budget, "mean_context": mean_context, "rows": rows}, indent=2
            )
        )
        return
    columns = ("variant", "dtype", "block", "bytes/token", "bytes/block", "blocks", "tokens",
               "sequences")  # fmt: skip
    keys = ("variant", "dtype", "block_size", "bytes_per_token", "bytes_per_block", "blocks",
            "tokens", "concurrent_sequences")  # fmt: skip
    emit_records(
        fmt,
        rows,
        f"KV capacity in {memory} at a mean context of {mean_context} tokens",
        columns,
        lambda i: [f"{v:,}" if isinstance(v, int) else str(v) for v in (rows[i][k] for k in keys)],
        csv_fields=keys,
        csv_row=lambda i: [rows[i][k] for k in keys],
        right=columns[2:],
    )


@main.command("replay")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--tenants",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Spread conversations over this many tenants (deterministic).",
)
@click.option(
    "--blocks",
    type=click.IntRange(min=1),
    default=65_536,
    show_default=True,
    help="Cache capacity in blocks (both caches).",
)
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N requests."
)
@click.option(
    "--share-public-prefix",
    is_flag=True,
    help="Grant the trace's common first block (system prompt) to a share group.",
)
@click.option(
    "--audit-url",
    default=None,
    help="Audit database of the governed cache (default: a temporary SQLite file).",
)
@click.option(
    "--tier-url",
    "tier_urls",
    multiple=True,
    metavar="URL",
    help="An encrypted offload tier of the governed cache, fastest first (repeatable), e.g. "
    "'host://?capacity=1GiB' or 'redis://127.0.0.1:6379/0?capacity=4GiB'; KEK from "
    "KVGOV_KEK, else one drawn for the run.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def replay_command(
    trace: str,
    tenants: int,
    blocks: int,
    block_size: int,
    limit: int | None,
    share_public_prefix: bool,
    audit_url: str | None,
    tier_urls: tuple[str, ...],
    as_json: bool,
) -> None:
    """Replay a Mooncake trace through the governed cache and an ungoverned LRU cache.

    Both caches have the same capacity; the difference in hit rate is the cost
    of tenant isolation. With --tier-url, the governed cache also keeps evicted
    blocks in encrypted offload tiers and restores them on later misses.

    TRACE is a Mooncake JSONL file (a kvgov checkout ships two in data/mooncake/;
    the wheel does not carry them).
    """
    from kvgov.govern.replay import run_replay

    console = Console(stderr=True)
    with Progress(
        console=console, transient=True, disable=as_json or not console.is_terminal
    ) as bar:
        task = bar.add_task("replaying", total=None)
        report = run_replay(
            trace,
            tenants=tenants,
            blocks=blocks,
            block_size=block_size,
            limit=limit,
            share_public_prefix=share_public_prefix,
            audit_url=audit_url,
            progress=lambda done: bar.update(task, completed=done),
            tier_urls=tier_urls,
        )
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    print_table(
        f"Replay of {trace}: {report['requests']} requests, "
        f"{tenants} tenant(s), {blocks} blocks of {block_size}",
        ("cache", "hit rate", "prefill tokens avoided", "requests/s", "blocks/s", "µs/block"),
        [
            (
                name,
                f"{report[name]['hit_rate']:.2%}",
                f"{report[name]['hit_tokens']:,}",
                f"{report[name]['requests_per_second']:,.0f}",
                f"{report[name]['blocks_per_second']:,.0f}",
                f"{report[name]['microseconds_per_block']:.2f}",
            )
            for name in ("governed", "ungoverned")
        ],
        right=("hit rate", "prefill tokens avoided", "requests/s", "blocks/s", "µs/block"),
    )
    cost = 100 * report["isolation_cost"]
    click.echo(f"isolation cost: {cost:.2f} percentage points of hit rate")
    offload = report["offload"]
    if offload is not None:
        for name, t in offload["tiers"].items():
            click.echo(f"offload tier {name}: {t['puts']:,} blocks sealed, {t['hits']:,} restored")
        click.echo(f"prefill tokens restored from the tiers: {offload['restored_tokens']:,}")


@main.command("demo")
@click.option("--quick", is_flag=True, help="A short run (for tests and smoke checks).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="kvgov-demo",
    show_default=True,
    help="Where the report, chart and audit database go.",
)
@click.option("--device", default=None, help="torch device (default: cuda if present, else cpu).")
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help="Serve Prometheus metrics on this port while the demo runs.",
)
@click.option(
    "--audit-url",
    metavar="URL",
    default=None,
    help="Write the audit trail to this database (e.g. a PostgreSQL after `kvgov db upgrade`), "
    "as a new stream; default: a fresh OUT/audit.db.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def demo_command(
    quick: bool,
    out_dir: str,
    device: str | None,
    metrics_port: int | None,
    audit_url: str | None,
    as_json: bool,
) -> None:
    """A multi-tenant simulation on the embedded defaults, with its report and audit trail."""
    from kvgov.allocator import resolve_device
    from kvgov.cli.demo import run_demo

    if device is not None:
        resolve_device(device)  # e.g. cuda without CUDA: one error line, nothing created
    code = run_demo(
        out_dir=Path(out_dir),
        quick=quick,
        device=device,
        metrics_port=metrics_port,
        audit_url=audit_url,
        as_json=as_json,
    )
    sys.exit(code)
