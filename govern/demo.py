"""``kvgov demo``: a multi-tenant day on the embedded defaults, with its evidence.

Three tenants share one governed cache:

* ``bank`` — multi-turn advisor sessions (``internal``) behind a public system
  prompt that is published to the ``public-prompts`` share group;
* ``clinic`` — questions over a few ``confidential`` retrieval documents that
  are reused within the clinic only, and ``restricted`` patient records that
  are admitted but never cached; the clinic asks to be erased mid-run;
* ``chatbot`` — a ``public`` chatbot behind the same public system prompt, so
  it reuses the bank's prompt blocks across tenants, as the share group allows.

Midway, the bank's share grant is revoked (a policy reload): the chatbot's
later hits on blocks the bank published are refused by the sharing policy and
audited. Later the model is upgraded to a new revision, which invalidates the
old cache. Simulated time runs on a fake clock, so confidential documents
expire under their retention and the sweeper finds them.

Every block written gets real random fp16 KV, so zeroization is real work.
Blocks evicted for capacity go to an encrypted host-memory tier (four times
the pool) when the offload policy allows it (internal and confidential data;
never restricted, never what is published to the share group), sealed under a
data key per tenant wrapped by a KEK drawn for the run; later admissions
restore them as hits, and the clinic's erasure crypto-shreds its key.

At the end: a PNG chart and the report as JSON (``report.json``), which the
command (:mod:`kvgov.cli.demo`) prints as a table per tenant, the offload tier's
figures, the audit trail's verification and the compliance queries a reviewer
would run next (``--json`` prints the JSON instead of the tables). Hit rates are
printed as percentages; in the JSON report ``hit_rate``
is the fraction (0 to 1) and ``hit_rate_percent`` the same as a percentage.

The audit trail goes to ``audit.db`` in the output directory (a fresh file each
run, stream ``demo-worker``), or with ``--audit-url`` to that database, e.g. a
PostgreSQL upgraded with ``kvgov db upgrade`` first, as a new stream
``demo-<random>`` each run.
"""

from __future__ import annotations

import json
import random
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvgov.allocator import KVSpec
from kvgov.audit import verify
from kvgov.audit.store import mask_url
from kvgov.offload import HostMemoryTier, LocalKEK

from .cache import GovernedKVCache
from .offload_config import OffloadConfig
from .scope import CacheScope

__all__ = ["QUICK", "DemoConfig", "simulate"]

_SYSTEM_PROMPT = [1_000 + i for i in range(64)]  # 4 blocks of 16 tokens, public


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """Size of the simulation.

    Attributes:
        steps: simulated requests.
        num_blocks: pool size.
        seconds_per_step: simulated seconds between requests.
        seed: the random seed (the run is deterministic).
        host_tier_factor: the encrypted host tier holds this many pools' worth of
            blocks (0: no offload tier).
    """

    steps: int = 1_500
    num_blocks: int = 1_024
    seconds_per_step: float = 2.0
    seed: int = 7
    host_tier_factor: int = 4


QUICK = DemoConfig(steps=240, num_blocks=256, seconds_per_step=12.0)

#: Policy data the demo runs under: one share group for public prompts, and a
#: short retention for confidential documents so that expiry shows within the run.
DEMO_POLICY_DATA: dict[str, Any] = {
    "kvgov": {
        "config": {
            "share_groups": {
                "public-prompts": {
                    "publishers": ["bank", "chatbot"],
                    "classifications": ["public"],
                }
            },
            "tenants": {"clinic": {"retention_seconds": {"confidential": 300}}},
        }
    }
}


class _Clock:
    """The simulation's clock: starts at a fixed epoch, moves only when told."""

    def __init__(self) -> None:
        self.now = 1_767_225_600.0  # 2026-01-01T00:00:00Z

    def __call__(self) -> float:
        return self.now


def _scope(tenant: str, classification: str, revision: str) -> CacheScope:
    return CacheScope(
        tenant=tenant,
        classification=classification,
        model="demo-llm-8b",
        model_revision=revision,
        tokenizer="demo-tok",
        tokenizer_revision="1",
        template_version="chat-v2",
    )


def simulate(
    out_dir: Path,
    config: DemoConfig,
    device: str,
    *,
    on_step: Callable[[int], None] | None = None,
    metrics_port: int | None = None,
    audit_url: str | None = None,
) -> dict[str, Any]:
    """Run the simulation and return the report (also written to ``out_dir``).

    Args:
        out_dir: where ``audit.db``, ``report.json`` and ``blocks.png`` go.
        config: its size.
        device: torch device of the pool.
        on_step: called after each request with the step number.
        metrics_port: serve Prometheus metrics on this port while it runs.
        audit_url: the audit database; None: a fresh ``out_dir/audit.db``. Another
            database must be at the schema's head revision (``kvgov db upgrade``);
            the run writes a new stream there.

    Returns:
        The report (per-tenant counters, erasure, invalidation, verification).

    Raises:
        AuditSchemaError: ``audit_url`` is not at the head revision.
    """
    if audit_url is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        db = out_dir / "audit.db"
        for stale in out_dir.glob("audit.db*"):
            stale.unlink()
        audit_url = f"sqlite:///{db}"
        worker_id = "demo-worker"
    else:
        worker_id = f"demo-{uuid.uuid4().hex[:12]}"
    rng = random.Random(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    clock = _Clock()
    spec = KVSpec(num_layers=4, num_kv_heads=4, head_dim=64, block_size=16, dtype=torch.float16)
    offload = None
    if config.host_tier_factor:
        # a sealed object is the block plus a header of under 200 bytes
        per_object = spec.bytes_per_block + 256
        tier = HostMemoryTier(config.host_tier_factor * config.num_blocks * per_object)
        offload = OffloadConfig(tiers=[tier], kek=LocalKEK(secrets.token_bytes(32)))
    cache = GovernedKVCache.create(
        spec=spec,
        num_blocks=config.num_blocks,
        device=device,
        policy_data=DEMO_POLICY_DATA,
        audit_url=audit_url,
        ephemeral_secret=True,
        clock=clock,
        worker_id=worker_id,
        verify_zeroization=True,
        offload=offload,
    )
    out_dir.mkdir(parents=True, exist_ok=True)  # another database: once it was accepted
    server = None
    if metrics_port is not None:
        from .metrics import serve_metrics

        server = serve_metrics(cache, metrics_port)
    kv = torch.empty((16, *spec.block_shape), dtype=spec.dtype)
    documents = [[50_000 + 1_000 * d + i for i in range(160)] for d in range(4)]
    sessions: dict[str, list[int]] = {}
    revision = "r1"
    timeline: list[dict[str, float]] = []
    erasure: dict[str, Any] | None = None
    invalidation: dict[str, Any] | None = None
    revoked_at: int | None = None
    expired = 0
    purge_step = int(config.steps * 0.6)
    revoke_step = int(config.steps * 0.45)
    upgrade_step = int(config.steps * 0.8)
    try:
        for step in range(config.steps):
            clock.now += config.seconds_per_step
            if step == revoke_step:
                policy_data = json.loads(json.dumps(DEMO_POLICY_DATA))
                policy_data["kvgov"]["config"]["share_groups"]["public-prompts"]["publishers"] = [
                    "chatbot"
                ]
                policy_data["kvgov"]["config"]["share_groups"]["public-prompts"]["readers"] = [
                    "bank"
                ]
                cache.policy.reload(policy_data=policy_data)
                revoked_at = step
            if step == purge_step:
                erased = cache.purge_tenant("clinic")
                erasure = {
                    "step": step,
                    "tenant": erased.tenant,
                    "blocks_zeroized": erased.blocks_zeroized,
                    "bytes_zeroized": erased.bytes_zeroized,
                    "in_flight_sequences": list(erased.in_flight_sequences),
                    "verified": erased.verified,
                    "event_id": erased.event_id,
                    "destroyed_key_ids": list(erased.destroyed_key_ids),
                    "offload_deleted": dict(erased.offload_deleted),
                }
            if step == upgrade_step:
                inv = cache.invalidate(model="demo-llm-8b", model_revision=revision)
                revision = "r2"
                invalidation = {
                    "step": step,
                    "blocks_zeroized": inv.blocks_zeroized,
                    "detached_blocks": inv.detached_blocks,
                    "event_id": inv.event_id,
                }
            if step % 10 == 0:
                expired += cache.sweep()
            tenant = rng.choices(["bank", "clinic", "chatbot"], weights=[4, 3, 3])[0]
            seq_id = f"req-{step}"
            prefix = 0
            if tenant == "bank":
                session = f"bank-{rng.randrange(12)}"
                history = sessions.setdefault(session, list(_SYSTEM_PROMPT))
                history.extend(rng.randrange(32_000) for _ in range(rng.randrange(20, 60)))
                tokens, scope, prefix = list(history), _scope("bank", "internal", revision), 64
            elif tenant == "chatbot":
                question = [rng.randrange(32_000) for _ in range(rng.randrange(8, 40))]
                tokens, scope = _SYSTEM_PROMPT + question, _scope("chatbot", "public", revision)
            elif rng.random() < 0.3:
                record = [rng.randrange(32_000) for _ in range(rng.randrange(40, 120))]
                tokens, scope = record, _scope("clinic", "restricted", revision)
            else:
                doc = documents[rng.randrange(len(documents))]
                question = [rng.randrange(32_000) for _ in range(rng.randrange(8, 30))]
                tokens, scope = doc + question, _scope("clinic", "confidential", revision)
            adm = cache.admit(seq_id, scope, tokens, public_prefix_tokens=prefix)
            new_blocks = adm.block_ids[adm.cached_tokens // spec.block_size :]
            for i, b in enumerate(new_blocks):
                if i % len(kv) == 0:
                    kv.copy_(torch.randn(kv.shape, generator=gen).to(spec.dtype))
                cache.block(b).copy_(kv[i % len(kv)], non_blocking=True)
            generated = [rng.randrange(32_000) for _ in range(rng.randrange(4, 24))]
            new = cache.append(seq_id, generated)
            for b in new:
                cache.block(b).copy_(kv[0])
            if tenant == "bank":
                sessions[session].extend(generated)
            cache.release(seq_id)
            if step % 5 == 0 or step == config.steps - 1:
                stats = cache.stats()
                states = stats.total.blocks_by_state
                timeline.append(
                    {
                        "step": step,
                        "minutes": (step + 1) * config.seconds_per_step / 60,
                        "free": states.get("free", 0),
                        "owned": states.get("owned", 0),
                        "cached": states.get("cached", 0),
                        "dirty": states.get("dirty", 0),
                        "hit_rate": stats.total.hit_rate,
                    }
                )
            if on_step is not None:
                on_step(step + 1)
        offload_report = _offload_report(cache, config)
    finally:
        cache.close()
        if server is not None:
            server.shutdown()
    final = cache.stats()  # after close: includes the zeroization of the whole pool
    verification = verify(audit_url)
    report: dict[str, Any] = {
        "config": {
            "steps": config.steps,
            "num_blocks": config.num_blocks,
            "bytes_per_block": spec.bytes_per_block,
            "device": device,
            "simulated_minutes": config.steps * config.seconds_per_step / 60,
        },
        "audit_url": mask_url(audit_url),
        "audit_stream": worker_id,
        "tenants": {
            name: {
                "requests": t.requests,
                "queried_tokens": t.queried_tokens,
                "hit_tokens": t.hit_tokens,
                "hit_rate": t.hit_rate,
                "hit_rate_percent": _percent(t.hit_rate),
                "prefill_tokens_avoided": t.prefill_tokens_avoided,
                "cross_tenant_reuses": t.cross_tenant_reuses,
                "cross_tenant_denied": t.cross_tenant_denied,
                "denials": dict(t.denials),
                "evictions": dict(t.evictions),
                "blocks_zeroized": t.blocks_zeroized,
                "bytes_zeroized": t.bytes_zeroized,
            }
            for name, t in final.tenants.items()
        },
        "total": {
            "requests": final.total.requests,
            "hit_rate": final.total.hit_rate,
            "hit_rate_percent": _percent(final.total.hit_rate),
            "prefill_tokens_avoided": final.total.prefill_tokens_avoided,
            "blocks_zeroized": final.total.blocks_zeroized,
            "bytes_zeroized": final.total.bytes_zeroized,
            "evictions": dict(final.total.evictions),
            "expired_by_sweeps": expired,
        },
        "offload": offload_report,
        "share_grant_revoked_at_step": revoked_at,
        "erasure": erasure,
        "invalidation": invalidation,
        "verification": {
            "ok": verification.ok,
            "events": sum(s.events for s in verification.streams),
            "streams": len(verification.streams),
            "checkpoints": sum(s.checkpoints for s in verification.streams),
            "problems": [str(p) for p in verification.problems],
        },
        "timeline": timeline,
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    _chart(timeline, out_dir / "blocks.png", report)
    return report


def _percent(fraction: float) -> float:
    """A fraction as a percentage, to two decimals (0.12345 -> 12.35)."""
    return round(100.0 * fraction, 2)


def _offload_report(cache: GovernedKVCache, config: DemoConfig) -> dict[str, Any] | None:
    """The host tier's figures at the end of the run (before close empties it)."""
    stats = cache.stats()
    snap = stats.offload
    if snap is None:
        return None
    host = snap.tiers["host"]
    return {
        "tier": "host",
        "capacity_bytes": host.capacity_bytes,
        "pool_multiple": config.host_tier_factor,
        "stored_bytes": host.stored_bytes,
        "stored_blocks": host.stored_blocks,
        "puts": host.puts,
        "hits": host.hits,
        "evictions": host.evictions,
        "expired": host.expired,
        "deleted": host.deleted,
        "refusals": dict(host.refusals),
        "decrypt_failures": host.decrypt_failures,
        "policy_denied": dict(snap.policy_denied),
        "not_offloaded": dict(snap.not_offloaded),
        "restored_tokens": stats.total.blocks_restored * cache.spec.block_size,
        "tenants": {
            name: {"offloaded": t.blocks_offloaded, "restored": t.blocks_restored}
            for name, t in stats.tenants.items()
        },
    }


def _chart(timeline: list[dict[str, float]], path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [p["minutes"] for p in timeline]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    top.stackplot(
        minutes,
        [p["free"] for p in timeline],
        [p["owned"] for p in timeline],
        [p["cached"] for p in timeline],
        [p["dirty"] for p in timeline],
        labels=["free (zeroed)", "owned", "cached", "dirty"],
        colors=["#d9d9d9", "#4c72b0", "#55a868", "#c44e52"],
    )
    top.set_ylabel("blocks")
    top.set_title("kvgov demo: block states and cumulative hit rate over simulated time")
    top.legend(loc="upper right", fontsize=8)
    bottom.plot(minutes, [100.0 * p["hit_rate"] for p in timeline], color="#8172b2")
    bottom.set_ylabel("hit rate, % of prompt tokens")
    bottom.set_xlabel("simulated minutes")
    bottom.set_ylim(0, 100)
    minutes_per_step = report["config"]["simulated_minutes"] / report["config"]["steps"]
    for label, key in (("share grant revoked", "share_grant_revoked_at_step"),):
        if report.get(key) is not None:
            bottom.axvline(report[key] * minutes_per_step, ls=":", color="grey")
            bottom.text(report[key] * minutes_per_step, 90, label, fontsize=8)
    for label, key in (("clinic erased", "erasure"), ("model r1 -> r2", "invalidation")):
        if report.get(key):
            x = report[key]["step"] * minutes_per_step
            for ax in (top, bottom):
                ax.axvline(x, ls="--", color="black", lw=0.8)
            bottom.text(x, 80, label, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
