"""``kvgov fleet``: operator-signed orders to every governed engine, and their evidence.

``purge``, ``invalidate``, ``rotate-secret`` and ``rollout`` write one signed order into
the audit database and print its id; ``status`` lists the engines and the orders;
``wait ORDER`` exits 0 once every live engine completed the order with verified
evidence, 1 otherwise (docs/fleet.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from kvgov.audit.fleet import EngineRecord, FleetStore, Order, OrderResult, sign_order
from kvgov.audit.queries import AuditQueries
from kvgov.audit.signing import SigningKey, load_signing_key
from kvgov.cli.common import default_url, print_table, url_option
from kvgov.cli.errors import EXIT_EVIDENCE, CommandError, ErrorsToExitCodes
from kvgov.exceptions import InvalidFleetOrder, SigningKeyError
from kvgov.govern.fleet import bundle_digest
from kvgov.govern.keys import secret_key_id
from kvgov.schema import SCOPE_FILTERS
from kvgov.secrecy import KeyFileOpenToOthers, read_key_file

__all__ = ["EngineProgress", "fleet_group", "order_progress", "print_order_evidence"]

#: Seconds without a heartbeat after which an engine counts as stopped.
STALE_AFTER = 15.0

_key_option = click.option(
    "--key",
    "key_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The operator's Ed25519 private key (PEM, mode 0600; `kvgov audit keygen`).",
)


def _signing_key(path: str) -> SigningKey:
    key = load_signing_key(Path(path))
    if key is None:  # a path is always given: load_signing_key returns a key or raises
        raise SigningKeyError(f"no key in {path}")
    return key


def _issue(url: str | None, key_path: str, kind: str, payload: Mapping[str, Any]) -> None:
    key = _signing_key(key_path)
    order = sign_order(key, kind, payload)
    with FleetStore(url or default_url(), auto_upgrade=False) as store:
        stored = store.issue(order)
    click.echo(stored.order_id)
    click.echo(f"{kind} order {stored.order_id} issued, signed by {key.key_id}", err=True)


@click.group("fleet", cls=ErrorsToExitCodes)
def fleet_group() -> None:
    """Orders to every governed engine of a fleet (erasure, invalidation, key rotation,
    policy rollout) through the audit database, and each engine's evidence."""


@fleet_group.command("purge")
@click.option("--tenant", required=True, help="The tenant to erase on every engine.")
@_key_option
@url_option
def purge_cmd(tenant: str, key_path: str, url: str | None) -> None:
    """Erase TENANT's KV on every engine; prints the order id."""
    _issue(url, key_path, "purge", {"tenant": tenant})


def _filter_options(f: Any) -> Any:
    for name in reversed(SCOPE_FILTERS):
        f = click.option(f"--{name.replace('_', '-')}", name, default=None)(f)
    return f


@fleet_group.command("invalidate")
@_filter_options
@_key_option
@url_option
def invalidate_cmd(key_path: str, url: str | None, **filters: str | None) -> None:
    """Drop every block of a matching scope on every engine (e.g. --model-revision r1)."""
    wanted = {k: v for k, v in filters.items() if v is not None}
    if not wanted:
        raise InvalidFleetOrder("give at least one scope field, e.g. --model-revision r1")
    _issue(url, key_path, "invalidate", {"filter": wanted})


@fleet_group.command("rotate-secret")
@click.option(
    "--secret-file",
    required=True,
    help="The new cache-key secret's file, at this path on every engine host (mode 0600); "
    "the order carries its path and key id, never the secret.",
)
@_key_option
@url_option
def rotate_secret_cmd(secret_file: str, key_path: str, url: str | None) -> None:
    """Switch every engine to the secret in SECRET_FILE (each checks its key id)."""
    try:
        secret = read_key_file(Path(secret_file)).rstrip(b"\r\n")
    except KeyFileOpenToOthers as exc:
        raise InvalidFleetOrder(f"secret file {exc}") from None
    except OSError as exc:
        raise InvalidFleetOrder(f"cannot read secret file {secret_file}: {exc.strerror}") from None
    payload = {"secret_file": str(Path(secret_file).resolve()), "key_id": secret_key_id(secret)}
    _issue(url, key_path, "rotate_secret", payload)


@fleet_group.command("rollout")
@click.option(
    "--bundle",
    "bundle_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The Rego bundle directory; it is loaded and its tests run before the order is issued.",
)
@_key_option
@url_option
def rollout_cmd(bundle_dir: Path, key_path: str, url: str | None) -> None:
    """Load the bundle in BUNDLE on every engine; each reports its new revision."""
    from kvgov.policy.testing import load_bundle

    bundle = load_bundle(bundle_dir)  # refuses a bundle that does not load or test
    files = {
        p.relative_to(bundle_dir).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(bundle_dir.rglob("*"))
        if p.is_file() and p.suffix in (".rego", ".json")
    }
    click.echo(f"bundle revision here: {bundle.revision}", err=True)
    _issue(url, key_path, "rollout", {"files": files, "digest": bundle_digest(files)})


# ---------------------------------------------------------------------- status and wait


def _state(engine: EngineRecord, now_us: int, stale_after: float) -> str:
    if engine.stopped_us is not None:
        return "stopped"
    if now_us - engine.heartbeat_us > stale_after * 1_000_000:
        return "not heartbeating"
    return "live"


@dataclass(frozen=True, slots=True)
class EngineProgress:
    """One engine's standing with one order.

    Attributes:
        engine_id: the engine.
        state: ``live``, ``stopped`` or ``not heartbeating``.
        status: its result (``completed``, ``unverified``, ``refused``, ``failed``), or
            ``pending``.
        evidence: ``verified`` when its result is completed and its evidence event is in
            the trail with the order id; otherwise what is missing.
        result: the result row, if any.
    """

    engine_id: str
    state: str
    status: str
    evidence: str
    result: OrderResult | None

    @property
    def done(self) -> bool:
        """Completed with verified evidence."""
        return self.evidence == "verified"


def _evidence(q: AuditQueries | None, order_id: str, result: OrderResult | None) -> str:
    if result is None:
        return "no result yet"
    if result.status != "completed" or result.verified is not True:
        return f"result {result.status}"
    if result.event_id is None:
        return "no evidence event"
    if q is None:
        return "trail unreadable"
    record = q.event(result.event_id)
    if record is None:
        return f"event {result.event_id} not in the trail"
    if record.details.get("order_id") != order_id:
        return f"event {result.event_id} names another order"
    if record.details.get("verified", True) is not True:
        return f"event {result.event_id} is not verified"
    return "verified"


def order_progress(
    store: FleetStore, q: AuditQueries | None, order: Order, stale_after: float = STALE_AFTER
) -> list[EngineProgress]:
    """Every engine's standing with ``order``: each live engine, and each other engine
    that has a result or was registered when the order was issued."""
    now = store.now_us()
    results = {r.engine_id: r for r in store.results(order.order_id)}
    out = []
    for engine in store.engines():
        state = _state(engine, now, stale_after)
        result = results.get(engine.engine_id)
        if state != "live" and result is None and engine.heartbeat_us < order.issued_us:
            # gone before the order: its KV went with its process
            out.append(
                EngineProgress(
                    engine.engine_id,
                    state,
                    "gone before the order",
                    "KV gone with its process",
                    None,
                )
            )
            continue
        status = "pending" if result is None else result.status
        out.append(
            EngineProgress(
                engine.engine_id, state, status, _evidence(q, order.order_id, result), result
            )
        )
    return out


def _order(store: FleetStore, order_id: str) -> Order:
    order = store.order(order_id)
    if order is None:
        raise CommandError.of(f"no order {order_id!r} in {store.url}", EXIT_EVIDENCE)
    return order


@fleet_group.command("status")
@click.option(
    "--stale-after",
    type=float,
    default=STALE_AFTER,
    show_default=True,
    help="Seconds without a heartbeat after which an engine counts as stopped.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@url_option
def status_cmd(stale_after: float, as_json: bool, url: str | None) -> None:
    """The engines (state, last heartbeat, policy revision, key id) and the orders."""
    with FleetStore(url or default_url(), auto_upgrade=False) as store:
        now = store.now_us()
        engines = store.engines()
        orders = store.orders()
        results = store.results()
    done: dict[str, dict[str, str]] = {}
    for r in results:
        done.setdefault(r.order_id, {})[r.engine_id] = r.status
    live = [e.engine_id for e in engines if _state(e, now, stale_after) == "live"]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "engines": [
                        {
                            "engine_id": e.engine_id,
                            "kind": e.kind,
                            "state": _state(e, now, stale_after),
                            "heartbeat_age_s": (now - e.heartbeat_us) / 1e6,
                            "policy_revision": e.policy_revision,
                            "key_id": e.key_id,
                            "audit_stream": e.audit_stream,
                            "versions": dict(e.versions),
                        }
                        for e in engines
                    ],
                    "orders": [
                        {
                            "order_id": o.order_id,
                            "kind": o.kind,
                            "issued_us": o.issued_us,
                            "results": done.get(o.order_id, {}),
                            "pending": [e for e in live if e not in done.get(o.order_id, {})],
                        }
                        for o in orders
                    ],
                },
                indent=2,
            )
        )
        return
    print_table(
        f"engines ({len(engines)})",
        ("engine", "kind", "state", "heartbeat", "policy revision", "key id"),
        [
            (
                e.engine_id,
                e.kind,
                _state(e, now, stale_after),
                f"{(now - e.heartbeat_us) / 1e6:.1f}s ago",
                e.policy_revision[:16],
                e.key_id,
            )
            for e in engines
        ],
    )
    print_table(
        f"orders ({len(orders)})",
        ("order", "kind", "completed", "pending (live engines)", "refused/failed"),
        [
            (
                o.order_id,
                o.kind,
                str(sum(1 for s in done.get(o.order_id, {}).values() if s == "completed")),
                " ".join(e for e in live if e not in done.get(o.order_id, {})) or "-",
                str(
                    sum(1 for s in done.get(o.order_id, {}).values() if s in ("refused", "failed"))
                ),
            )
            for o in orders
        ],
    )


@fleet_group.command("wait")
@click.argument("order_id")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds to wait.")
@click.option(
    "--stale-after",
    type=float,
    default=STALE_AFTER,
    show_default=True,
    help="Seconds without a heartbeat after which an engine counts as stopped.",
)
@url_option
def wait_cmd(order_id: str, timeout: float, stale_after: float, url: str | None) -> None:
    """Exit 0 once every live engine completed ORDER_ID with verified evidence, else 1."""
    target = url or default_url()
    deadline = time.monotonic() + timeout
    with FleetStore(target, auto_upgrade=False) as store, AuditQueries(target) as q:
        order = _order(store, order_id)
        while True:
            rows = order_progress(store, q, order, stale_after)
            live = [r for r in rows if r.state == "live"]
            if (live and all(r.done for r in live)) or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    for r in rows:
        click.echo(
            f"{r.engine_id}: {r.state}, {r.status}, {r.evidence}"
            + (f" ({r.result.event_id})" if r.result and r.result.event_id else "")
        )
    missing = [r.engine_id for r in rows if r.state == "live" and not r.done]
    if not live:
        raise CommandError.of(f"no live engine in the fleet for order {order_id}", EXIT_EVIDENCE)
    if missing:
        raise CommandError.of(
            f"order {order_id} not completed with verified evidence by: {', '.join(missing)}",
            EXIT_EVIDENCE,
        )


def print_order_evidence(url: str, order_id: str, fmt: str) -> None:
    """``kvgov audit erasure --order``: one line per engine, its result and its evidence.

    Raises:
        CommandError: no such order (exit 1), or an engine that is live has not completed
            it with verified evidence (exit 1, after the lines).
    """
    with FleetStore(url, auto_upgrade=False) as store, AuditQueries(url) as q:
        order = _order(store, order_id)
        rows = order_progress(store, q, order)
    records = [
        {
            "engine_id": r.engine_id,
            "state": r.state,
            "status": r.status,
            "evidence": r.evidence,
            "event_id": r.result.event_id if r.result else None,
            "verified": r.result.verified if r.result else None,
            "detail": dict(r.result.detail) if r.result else {},
        }
        for r in rows
    ]
    if fmt in ("json", "jsonl"):
        if fmt == "json":
            click.echo(
                json.dumps({"order_id": order_id, "kind": order.kind, "engines": records}, indent=2)
            )
        else:
            for rec in records:
                click.echo(json.dumps({"order_id": order_id, **rec}, sort_keys=True))
    else:
        click.echo(f"order {order_id} ({order.kind}): {len(records)} engine(s)")
        for rec in records:
            click.echo(
                f"{rec['engine_id']}: {rec['state']}, {rec['status']}, {rec['evidence']}"
                + (f", event {rec['event_id']}" if rec["event_id"] else "")
            )
    missing = [r.engine_id for r in rows if r.state == "live" and not r.done]
    if missing:
        raise CommandError.of(
            f"order {order_id} lacks verified evidence from: {', '.join(missing)}", EXIT_EVIDENCE
        )
