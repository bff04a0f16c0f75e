"""Errors of policy evaluation (``kvgov.policy``).

Import them from :mod:`kvgov.exceptions`, never from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgov.exceptions.base import KVGovError


class PolicyError(KVGovError):
    """Root of errors raised by the policy layer (``policy``)."""


class PolicyLoadError(PolicyError):
    """A Rego bundle failed to load (syntax error, bad data.json, failing tests).

    Args:
        message: what went wrong.
        file: the file at fault, where known.
        line: 1-based line, where known.
        column: 1-based column, where known.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.column = column
        where = ""
        if file is not None:
            where = file
            if line is not None:
                where += f":{line}"
                if column is not None:
                    where += f":{column}"
            where += ": "
        super().__init__(f"{where}{message}")


class PolicyTestFailure(PolicyLoadError):
    """A bundle's own Rego tests failed, so it was not activated.

    Args:
        failures: names of the failing ``test_`` rules.
    """

    def __init__(self, failures: Sequence[str]) -> None:
        self.failures = tuple(failures)
        super().__init__(f"{len(self.failures)} policy test(s) failed: {', '.join(self.failures)}")


class PolicyDenied(PolicyError):
    """The policy refused a request (or failed closed).

    Args:
        path: the rule that decided, e.g. ``kvgov/admission/decision``.
        reason: the policy's reason (or the engine error when it failed closed).
        decision_id: the decision's id, as written to the audit trail.
    """

    def __init__(self, path: str, reason: str, decision_id: str) -> None:
        self.path = path
        self.reason = reason
        self.decision_id = decision_id
        super().__init__(f"denied by {path}: {reason} (decision {decision_id})")


class PolicyUnavailable(PolicyError):
    """The policy engine could not answer (down, timed out, answered garbage).

    Callers that must decide fail closed on it: the governor turns it into an
    audited :class:`PolicyDenied`.

    Args:
        what: what could not be read, e.g. ``"the classifications"``.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(
            f"the policy engine could not give {what}; requests are refused (fail closed) "
            "until it answers again: check the engine (OPA server reachable, bundle loaded)"
        )
