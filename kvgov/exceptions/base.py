"""The root of the hierarchy; import it from :mod:`kvgov.exceptions`."""

from __future__ import annotations


class KVGovError(Exception):
    """Root of every error kvgov raises on purpose."""


class InternalError(KVGovError):
    """kvgov found its own state broken: this is a bug in kvgov.

    Args:
        what: what was found broken.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(
            f"internal error: {what}. This is a bug in kvgov; please report it with this message."
        )
