"""`kvgov audit ...` and `kvgov db ...` commands (placeholder until the audit issue lands)."""

import click

audit_group = click.Group("audit", help="Verify the audit trail and run compliance queries.")
db_group = click.Group("db", help="Manage the audit database schema.")
