"""Options every ``kvgov audit`` / ``kvgov db`` command shares."""

from __future__ import annotations

import os

import click

from kvgov.defaults import AUDIT_URL, AUDIT_URL_ENV

__all__ = ["default_url", "url_option"]


def default_url() -> str:
    """The audit database URL when ``--url`` is not given.

    Returns:
        ``$KVGOV_AUDIT_URL``, else :data:`kvgov.defaults.AUDIT_URL`.
    """
    return os.environ.get(AUDIT_URL_ENV) or AUDIT_URL


#: ``--url URL`` (default: ``$KVGOV_AUDIT_URL`` or ``sqlite:///kvgov-audit.db``).
url_option = click.option(
    "--url",
    default=None,
    metavar="URL",
    help=f"Audit database URL [default: ${AUDIT_URL_ENV} or {AUDIT_URL}].",
)
