"""Alembic environment and revisions of the kvgov audit schema (run via ``kvgov db``)."""
