"""The policy engine protocol and the decision every engine returns.

A rule path names one Rego rule in slash form, as OPA's REST data API does:
``kvgov/admission/decision`` is ``data.kvgov.admission.decision``. Engines accept
the dotted form (with or without the ``data.`` prefix) too and normalise it with
:func:`normalize_path`.

Fail closed: an engine never raises from :meth:`PolicyEngine.evaluate`. Any engine
error, timeout or unreadable answer becomes a :class:`Decision` with ``allow=False``
and ``error`` set (built by :func:`failed_decision`), which the caller audits.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "UNKNOWN_REVISION",
    "Decision",
    "PolicyEngine",
    "TimedRevision",
    "failed_decision",
    "json_shape",
    "make_decision",
    "new_decision_id",
    "normalize_path",
]

#: The revision of an engine that cannot tell what its decisions were computed from
#: (the OPA server engine before its first successful read, or after a failed one).
#: A decision cache never stores or serves a decision under it.
UNKNOWN_REVISION = "unknown"

_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Types a JSON-shaped result holds as leaves (regorus and json.loads give these).
_SCALARS = frozenset({str, int, float, bool, type(None)})


@dataclass(frozen=True, slots=True)
class Decision:
    """One policy decision, as written to the audit trail.

    Attributes:
        path: the rule evaluated, slash form (``kvgov/admission/decision``).
        result: the rule's value as JSON-shaped Python (sets become sorted lists);
            None when the rule was undefined or the engine failed.
        allow: True only when the rule produced a value and that value allows: for an
            object with an ``allow`` key, that key is exactly ``True``; for a boolean,
            the boolean; for any other defined value (a TTL, share groups), True.
            Always False on an error or an undefined rule.
        reason: the policy's ``reason`` string where the result carries one, else a
            short description of what happened (undefined rule, engine error).
        decision_id: a fresh random UUID, version 4, in its 36-character text form
            (see :func:`new_decision_id`), naming this decision in the audit trail.
            A decision served from the cache keeps the id of the evaluation it came
            from, so audit can link the two.
        bundle_revision: the revision of the bundle that decided.
        engine: the engine's name (``embedded`` / ``opa-server``).
        seconds: wall time the engine took to evaluate; a cached decision carries
            the time of the evaluation it came from.
        error: the engine error when the decision failed closed; None otherwise.
        cached: True when this decision was served from a decision cache.
    """

    path: str
    result: Any
    allow: bool
    reason: str
    decision_id: str
    bundle_revision: str
    engine: str
    seconds: float
    error: str | None = None
    cached: bool = False


@runtime_checkable
class PolicyEngine(Protocol):
    """What every policy engine offers: evaluate a rule on an input, fail closed.

    Attributes:
        name: the engine's name, written into every decision.
    """

    name: str

    @property
    def bundle_revision(self) -> str:
        """The revision of the bundle now active (see docs/policy.md)."""
        ...

    def evaluate(self, path: str, input: Mapping[str, Any]) -> Decision:
        """Evaluate one rule on one input; never raises for engine failures.

        Args:
            path: the rule, slash form (``kvgov/admission/decision``).
            input: the policy input (JSON-shaped).

        Returns:
            The decision; on any failure ``allow`` is False and ``error`` is set.
        """
        ...

    def close(self) -> None:
        """Release the engine's resources; later evaluations fail closed."""
        ...


@runtime_checkable
class TimedRevision(Protocol):
    """An engine whose revision is read from elsewhere and trusted only for a while.

    The OPA server engine is one: it re-reads its revision every ``revision_ttl``
    seconds, so a change on the server can go unseen for that long, and a decision
    may have been computed from content newer than the revision it is tagged with.
    :class:`~kvgov.policy.cache.CachedEngine` therefore keeps such an engine's
    decisions at most ``revision_ttl`` seconds, measured on :meth:`now`.
    """

    @property
    def revision_ttl(self) -> float:
        """Seconds a read revision is trusted (and a cached decision kept)."""
        ...

    def now(self) -> float:
        """The engine's monotonic clock, in seconds (what ``revision_ttl`` is measured on)."""
        ...


def normalize_path(path: str) -> str:
    """Return the slash form of a rule path, checking every segment.

    Accepts ``kvgov/admission/decision``, ``/kvgov/admission/decision``,
    ``kvgov.admission.decision`` and ``data.kvgov.admission.decision``.

    Args:
        path: the rule path.

    Returns:
        The slash form, e.g. ``kvgov/admission/decision``.

    Raises:
        ValueError: the path is empty or a segment is not a Rego identifier (this
            also keeps a path from smuggling URL syntax into the OPA server engine).
    """
    p = path.strip()
    if "/" not in p:
        if p.startswith("data."):
            p = p[len("data.") :]
        segments = p.split(".")
    else:
        segments = p.strip("/").split("/")
    if not segments or any(not _SEGMENT.match(s) for s in segments):
        raise ValueError(
            f"invalid rule path {path!r}: use identifiers separated by '/', "
            "e.g. 'kvgov/admission/decision'"
        )
    return "/".join(segments)


def json_shape(value: Any) -> Any:
    """Return ``value`` with every mapping as a dict and every tuple as a list.

    Args:
        value: a JSON-like value built from any mappings and sequences.

    Returns:
        A value ``json.dumps`` accepts (if its leaves are JSON scalars).
    """
    if isinstance(value, Mapping):
        return {k: json_shape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_shape(v) for v in value]
    return value


def new_decision_id() -> str:
    """Return a fresh decision id: a random version-4 UUID in its 36-character text form.

    The same bits and text as ``str(uuid.uuid4())``: 16 bytes from ``os.urandom``
    with the version (4) and variant (RFC 4122) bits set, written as
    ``8-4-4-4-12`` lowercase hex digits. It is formatted straight from the bytes
    because building a ``uuid.UUID`` object costs about 2 µs more, on every
    uncached decision.

    Returns:
        The id, e.g. ``"3f0c2a9e-5b1d-4c7e-9a2b-6d8e0f1a2b3c"``.
    """
    b = bytearray(os.urandom(16))
    b[6] = b[6] & 0x0F | 0x40
    b[8] = b[8] & 0x3F | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _jsonable(value: Any) -> Any:
    """Return ``value`` with sets as sorted lists and tuples as lists (JSON shape).

    A value already in JSON shape is returned as is, not copied: the engines hand
    over fresh values (mostly a flat object of scalars), so a copy buys nothing.
    """
    kind = type(value)
    if kind in _SCALARS or (kind is dict and _SCALARS.issuperset(map(type, value.values()))):
        return value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=lambda v: (type(v).__name__, repr(v)))
    return value


def _allows(result: Any) -> bool:
    if result is None:
        return False
    if isinstance(result, bool):
        return result
    if isinstance(result, dict):
        if "allow" in result:
            return result["allow"] is True
        return True
    return not (isinstance(result, float) and not math.isfinite(result))


def make_decision(
    path: str, result: Any, *, bundle_revision: str, engine: str, seconds: float
) -> Decision:
    """Build the decision for a rule that was evaluated without an engine error.

    Args:
        path: the rule, slash form.
        result: the rule's value (None when undefined); sets become sorted lists.
        bundle_revision: the revision that decided.
        engine: the engine's name.
        seconds: how long evaluation took.

    Returns:
        A decision with a fresh ``decision_id``; an undefined rule denies with reason
        ``"undefined: rule <path> produced no result"``.
    """
    if result is None:
        reason = f"undefined: rule {path} produced no result"
    else:
        result = _jsonable(result)
        given = result.get("reason") if isinstance(result, dict) else None
        reason = given if isinstance(given, str) else ""
    return Decision(
        path=path,
        result=result,
        allow=_allows(result),
        reason=reason,
        decision_id=new_decision_id(),
        bundle_revision=bundle_revision,
        engine=engine,
        seconds=seconds,
    )


def failed_decision(
    path: str, error: str, *, bundle_revision: str, engine: str, seconds: float
) -> Decision:
    """Build the fail-closed decision for an engine error, timeout or bad answer.

    Args:
        path: the rule, slash form (as given when it could not be normalised).
        error: what failed; also the reason, prefixed with ``"policy error: "``.
        bundle_revision: the revision active at the time.
        engine: the engine's name.
        seconds: how long the attempt took.

    Returns:
        A deny with ``result=None`` and ``error`` set.
    """
    return Decision(
        path=path,
        result=None,
        allow=False,
        reason=f"policy error: {error}",
        decision_id=new_decision_id(),
        bundle_revision=bundle_revision,
        engine=engine,
        seconds=seconds,
        error=error,
    )
