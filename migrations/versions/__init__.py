"""Revisions of the audit schema, oldest first."""
