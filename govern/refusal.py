"""The refusals an engine binding decides itself, as audit events that always construct.

A request's ``extra_args`` (and its id) come from the client: any JSON, any
Unicode (NUL, lone surrogates, bidi overrides, huge strings). A refusal must be
audited whatever the client sent, so everything a refusal event and the
client's message hold is made printable and bounded here first:

- ``details.reason``: the reason, each non-printable character escaped
  (``\\x00``, ``\\ud800``, ``\\u202e``), at most :data:`REASON_CHARS` characters;
- ``details.claimed``: the scope fields the request named (``kvgov_tenant``,
  ``kvgov_classification``, ``kvgov_template``): a valid scope field as sent, an
  invalid string escaped and cut to :data:`CLAIM_CHARS`, anything else as
  ``<type>``;
- ``sequence_id``: the engine's request id, escaped and cut to the column's width.

The request id is the client's too (vLLM's OpenAI server builds it from the
``X-Request-Id`` header, SGLang's from ``rid``): an id the audit trail cannot hold as a
``sequence_id`` (:func:`request_id_problem`) is refused at admission, so the events
written later, inside the engine's scheduler (admission, reuse, erasure), always construct.

``details.path`` names the binding (``kvgov.vllm/scope``, ``kvgov.sglang/scope``); the
vLLM binding's paths are :data:`SCOPE_PATH` and :data:`ERROR_PATH`. This module needs no engine.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.canonical import JCS_INT_MAX
from kvgov.exceptions import InvalidScope
from kvgov.schema import TEXT_LIMITS, text_problem

from .scope import check_scope_field
from .scope_resolver import SCOPE_KEYS

if TYPE_CHECKING:
    from .ledger import Ledger

__all__ = [
    "CLAIM_CHARS",
    "ERROR_PATH",
    "REASON_CHARS",
    "SCOPE_PATH",
    "describe_error",
    "printable",
    "refusal_event",
    "refuse",
    "request_id_problem",
]

_log = logging.getLogger("kvgov.binding")

#: The ``details.path`` of refusals the binding decides itself (a bad request id, no or bad
#: scope, bad token).
SCOPE_PATH = "kvgov.vllm/scope"
#: The ``details.path`` of a request refused because admitting it failed unexpectedly.
ERROR_PATH = "kvgov.vllm/error"
#: Longest ``details.reason`` (and client message reason), in characters.
REASON_CHARS = 1024
#: Longest excerpt of an invalid claimed scope field, in characters.
CLAIM_CHARS = 64
_SEQUENCE_CHARS = TEXT_LIMITS["sequence_id"]


def request_id_problem(seq_id: str) -> str | None:
    """Why the engine's request id cannot be an audit event's ``sequence_id``, or None if it can.

    The rule is the audit store's (:func:`kvgov.schema.text_problem`): at most
    ``TEXT_LIMITS["sequence_id"]`` characters, no NUL, no lone surrogate.

    Returns:
        None, or the reason of the refusal (it never quotes the id).
    """
    problem = text_problem(seq_id, _SEQUENCE_CHARS)
    return None if problem is None else f"the request id {problem}"


def printable(text: str, limit: int) -> str:
    """``text`` with every non-printable character escaped, at most ``limit`` characters.

    NUL, controls, lone surrogates, bidi overrides and other format characters
    become ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``, so the result is storable in
    any audit column and shows in a log or terminal as it is.
    """
    head = text[:limit]
    if head.isprintable():
        return head
    return "".join(c if c.isprintable() else _escape(c) for c in head)[:limit]


def _escape(c: str) -> str:
    o = ord(c)
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _claimed(extra_args: object) -> dict[str, str]:
    """The scope fields a request named, each made printable (module docstring)."""
    if not isinstance(extra_args, Mapping):
        return {}
    claimed: dict[str, str] = {}
    for key in SCOPE_KEYS[:3]:
        try:
            value = extra_args.get(key)
        except Exception:  # a foreign mapping whose get fails: nothing to show
            continue
        if value is None:
            continue
        if not isinstance(value, str):
            claimed[key] = f"<{type(value).__name__}>"
            continue
        try:
            claimed[key] = check_scope_field(key, value)
        except InvalidScope:
            claimed[key] = printable(value, CLAIM_CHARS)
    return claimed


def refusal_event(
    seq_id: str,
    num_tokens: object,
    reason: str,
    extra_args: object,
    *,
    decision_id: str,
    path: str = SCOPE_PATH,
) -> AuditEvent:
    """The ``policy_denied`` event of a refusal the binding decided itself.

    Args:
        seq_id: the engine's request id.
        num_tokens: the prompt's tokens (kept when an int in ``0..2**53-1``, else None).
        reason: why it is refused.
        extra_args: the request's ``extra_args``, anything the client sent.
        decision_id: the refusal's id (also in the client's message).
        path: ``kvgov.<engine>/scope`` or ``kvgov.<engine>/error`` (:data:`SCOPE_PATH`,
            :data:`ERROR_PATH` for vLLM).

    Returns:
        A valid event, whatever ``seq_id``, ``reason`` and ``extra_args`` hold.
    """
    count = num_tokens if type(num_tokens) is int and 0 <= num_tokens <= JCS_INT_MAX else None
    return AuditEvent(
        type=EventType.POLICY_DENIED,
        sequence_id=printable(seq_id, _SEQUENCE_CHARS) if isinstance(seq_id, str) else None,
        token_count=count,
        decision_id=decision_id,
        details={
            "reason": printable(reason, REASON_CHARS),
            "path": path,
            "claimed": _claimed(extra_args),
        },
    )


def refuse(
    ledger: Ledger,
    audit: AuditLog,
    seq_id: str,
    num_tokens: object,
    reason: str,
    extra_args: object,
    *,
    path: str = SCOPE_PATH,
) -> str:
    """Audit a refusal the binding decided itself; return the client's message.

    Never raises: a refusal that cannot be audited (the trail is unavailable or
    closed) is still a refusal, and its message says it was not audited.

    Returns:
        ``"kvgov: <reason> (decision <id>)"``, the reason made printable.
    """
    binding, _, kind = path.partition("/")
    decision_id = f"kvgov-{binding.removeprefix('kvgov.')}-{uuid.uuid4().hex}"
    shown = printable(reason, REASON_CHARS)
    ledger.unattributed.denials["scope" if kind == "scope" else "error"] += 1
    try:
        audit.record(
            refusal_event(seq_id, num_tokens, shown, extra_args, decision_id=decision_id, path=path)
        )
    except Exception as exc:  # AuditUnavailable, a closed trail: refused all the same
        _log.error("kvgov: a refusal could not be audited: %s", type(exc).__name__)
        return f"kvgov: request refused ({shown}); the refusal could not be audited: " + (
            printable(_describe(exc), REASON_CHARS)
        )
    return f"kvgov: {shown} (decision {decision_id})"


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose str() fails
        return type(exc).__name__


def describe_error(exc: BaseException) -> str:
    """The reason of a request refused because admitting it raised ``exc`` unexpectedly.

    Names the error's type only: its text may hold internals the client must not see
    (the engine's log has the traceback).
    """
    return f"request refused: admitting it failed unexpectedly ({type(exc).__name__})"
