"""Alembic environment for the audit store, online and offline.

kvgov runs this programmatically (``kvgov.audit.store``): online with a connection handed in
through ``config.attributes["connection"]`` (or a URL in ``sqlalchemy.url``), offline
(``kvgov db upgrade --sql``) rendering SQL for a URL's dialect.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

import kvgov.audit.fleet  # registers the fleet tables on the metadata
import kvgov.audit.offload_keys  # noqa: F401  (registers offload_keys on the metadata)
from kvgov.audit.models import metadata

config = context.config
target_metadata = metadata


def run_migrations_offline() -> None:
    """Render SQL for the configured URL without connecting."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against a live database (a given connection, or one made from the URL)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_with(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("no connection and no sqlalchemy.url given to the audit migrations")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.begin() as conn:
        _run_with(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
