"""``kvgov db ...``: the audit database's schema (Alembic migrations), guarded.

``upgrade`` creates or upgrades the schema; ``current`` reads the revision (a SQLite
file that does not exist is an error, never created); ``downgrade`` needs an
explicit ``--revision``, refuses to drop tables holding rows unless
``--yes-destroy-audit-trail``, and records a downgrade that keeps the trail in it
(a ``schema_migration`` event of stream :data:`MIGRATION_STREAM`) before it runs;
an upgrade of a trail holding events is recorded once it reaches the head.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kvgov.audit.events import AuditEvent, EventType
from kvgov.audit.store import (
    DowngradePlan,
    current_revision,
    downgrade,
    head_revision,
    mask_url,
    plan_downgrade,
    require_database,
    row_counts,
    upgrade,
)
from kvgov.audit.writer import AuditLog
from kvgov.cli.common import default_url, url_option
from kvgov.cli.errors import EXIT_ENVIRONMENT, EXIT_USAGE, CommandError, ErrorsToExitCodes

__all__ = ["MIGRATION_STREAM", "db_group"]

#: The stream ``kvgov db`` records schema migrations in.
MIGRATION_STREAM = "kvgov-db"

_default_url = default_url
_url_option = url_option


@click.group("db", cls=ErrorsToExitCodes)
def db_group() -> None:
    """Manage the audit database schema (Alembic migrations)."""


def _db_url(url_arg: str | None, url_opt: str | None) -> str:
    return url_arg or url_opt or _default_url()


def _migrate(
    run: Callable[..., str], url_arg: str | None, url: str | None, revision: str, sql: bool
) -> None:
    """Run ``upgrade`` or ``downgrade``; print the SQL (offline) or the revision reached."""
    target = _db_url(url_arg, url)
    out = run(target, revision, sql=sql)
    if sql:
        click.echo(out)
    else:
        click.echo(f"{mask_url(target)} is at {current_revision(target) or 'base'}")


_signing_key_option = click.option(
    "--signing-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Sign the checkpoint of the migration's audit event with this key (the "
    "writers', so that `verify --public-key` trusts it) [default: $KVGOV_SIGNING_KEY].",
)


@db_group.command("upgrade")
@click.argument("url_arg", metavar="[URL]", required=False)
@_url_option
@click.option("--revision", default="head", show_default=True)
@click.option("--sql", is_flag=True, help="Print the SQL instead of running it (offline).")
@_signing_key_option
def upgrade_cmd(
    url_arg: str | None, url: str | None, revision: str, sql: bool, signing_key: Path | None
) -> None:
    """Upgrade the audit schema to the head revision.

    An upgrade of a trail that holds events is recorded in it (a schema_migration
    event of stream kvgov-db) once the schema is at the head.
    """
    if sql:
        _migrate(upgrade, url_arg, url, revision, sql)
        return
    target = _db_url(url_arg, url)
    before = current_revision(target)
    events = row_counts(target).get("audit_events", 0)
    upgrade(target, revision)
    after = current_revision(target)
    click.echo(f"{mask_url(target)} is at {after or 'base'}")
    if after == before or not events:
        return
    if after != head_revision():
        click.echo(
            f"not recorded in the trail: it is written at the head revision only "
            f"({head_revision()}); run `kvgov db upgrade` to reach it",
            err=True,
        )
        return
    details = {"operation": "upgrade", "from": before or "base", "to": after}
    _record_migration(target, details, signing_key, done=True)


@db_group.command("downgrade")
@click.argument("url_arg", metavar="[URL]", required=False)
@_url_option
@click.option(
    "--revision",
    default=None,
    help="Target revision (required): base (drops the audit trail) or a revision id.",
)
@click.option(
    "--yes-destroy-audit-trail",
    "destroy",
    is_flag=True,
    help="Allow a downgrade that drops tables holding audit events, checkpoints or keys.",
)
@click.option("--sql", is_flag=True, help="Print the SQL (needs --revision FROM:TO).")
@_signing_key_option
def downgrade_cmd(
    url_arg: str | None,
    url: str | None,
    revision: str | None,
    destroy: bool,
    sql: bool,
    signing_key: Path | None,
) -> None:
    """Downgrade the audit schema to --revision.

    A downgrade that keeps the audit trail is recorded in it first (a
    schema_migration event of stream kvgov-db); one that drops tables holding rows
    is refused unless --yes-destroy-audit-trail is given.
    """
    target = _db_url(url_arg, url)
    if sql:
        if revision is None:
            raise click.UsageError("--sql needs --revision FROM:TO")
        click.echo(downgrade(target, revision, sql=True))
        return
    if revision is None:
        counts = row_counts(target)
        raise CommandError.of(
            f"give the target revision with --revision (base drops the audit trail); "
            f"{mask_url(target)} holds {counts.get('audit_events', 0)} audit event(s) "
            "that a downgrade to base would delete",
            EXIT_USAGE,
        )
    plan = plan_downgrade(target, revision)
    lost = {t: n for t, n in plan.dropped.items() if n}
    if lost and not destroy:
        what = ", ".join(f"{t} ({n} rows)" for t, n in lost.items())
        raise CommandError.of(
            f"refused: downgrading {mask_url(target)} to {revision} drops {what}: "
            f"{plan.events_lost} audit event(s) would be lost. Export them first "
            "(`kvgov audit export`); pass --yes-destroy-audit-trail to go on",
            EXIT_USAGE,
        )
    if plan.trail_survives and plan.events:  # an empty trail stays empty, as on upgrade
        _record_migration(target, _downgrade_details(plan), signing_key, done=False)
    downgrade(target, revision)
    click.echo(f"{mask_url(target)} is at {current_revision(target) or 'base'}")
    if lost:
        click.echo(f"dropped {', '.join(lost)}: {plan.events_lost} audit event(s) deleted")


def _downgrade_details(plan: DowngradePlan) -> dict[str, Any]:
    return {
        "operation": "downgrade",
        "from": plan.current,
        "to": plan.target or "base",
        "dropped": plan.dropped,
    }


def _record_migration(
    url: str, details: dict[str, Any], signing_key: Path | None, *, done: bool
) -> None:
    """Record a migration in the trail (stored in the database, or the command fails).

    A downgrade is recorded before it runs (``done`` False: not stored, not run); an
    upgrade after (``done`` True: it ran, its record waits in the spool).
    """
    event = AuditEvent(EventType.SCHEMA_MIGRATION, details=details)
    key = str(signing_key) if signing_key is not None else None
    with AuditLog(url, MIGRATION_STREAM, signing_key=key, auto_upgrade=False) as log:
        recorded = log.record_durable(event)
    if recorded.stored:
        return
    what = "the upgrade ran but" if done else "the downgrade was not run:"
    raise CommandError.of(
        f"{what} its audit event could not be stored in the database ({recorded.reason}); "
        f"it waits in {log.spool_path}",
        EXIT_ENVIRONMENT,
    )


@db_group.command("current")
@click.argument("url_arg", metavar="[URL]", required=False)
@_url_option
def current_cmd(url_arg: str | None, url: str | None) -> None:
    """Print the database's schema revision and the one this kvgov needs."""
    target = _db_url(url_arg, url)
    require_database(target)  # a mistyped SQLite path must not become an empty file
    cur = current_revision(target, read_only=True)
    head = head_revision()
    state = "up to date" if cur == head else "run `kvgov db upgrade`"
    click.echo(f"{mask_url(target)}: current {cur or 'none'}, head {head} ({state})")
