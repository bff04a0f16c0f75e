"""The cache scope: everything that must match before KV state may be reused."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kvgov.exceptions import InvalidScope
from kvgov.schema import SCOPE_FIELDS, TEXT_LIMITS, text_problem

__all__ = ["SCOPE_FIELDS", "CacheScope", "check_scope_field"]


@dataclass(frozen=True, slots=True)
class CacheScope:
    """Who a request belongs to and what produced its KV state.

    Two requests may share cached KV only if every field is equal (or the
    sharing policy grants a share group, and then every field but the tenant
    is equal). The fields are validated at construction; whether the
    classification is one the policy knows is checked by the cache, which
    holds the loaded policy.

    Attributes:
        tenant: the customer or business unit that owns the data.
        classification: the data label, e.g. ``public``, ``internal``,
            ``confidential``, ``restricted`` (the bundled policy's labels).
        model: model name; ``model_revision`` its weights revision.
        adapter: LoRA or other adapter name, or None for the base model;
            ``adapter_revision`` is required with an adapter and refused without.
        tokenizer: tokenizer name; ``tokenizer_revision`` its revision.
        template_version: the prompt-template (system prompt, chat template)
            version, so a template change never reuses stale KV.

    Raises:
        InvalidScope: a field is not a string, is empty, longer than the audit
            store's column for it (256 characters, :data:`kvgov.schema.TEXT_LIMITS`)
            or has a non-printable character (NUL, a lone surrogate, a control
            character), or the adapter fields are inconsistent. So every scope
            that constructs can be written to the audit trail.
    """

    tenant: str
    classification: str
    model: str
    model_revision: str
    tokenizer: str
    tokenizer_revision: str
    template_version: str
    adapter: str | None = None
    adapter_revision: str | None = None

    def __post_init__(self) -> None:
        for name in SCOPE_FIELDS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            check_scope_field(name, value)
        if (self.adapter is None) != (self.adapter_revision is None):
            raise InvalidScope(
                "adapter_revision",
                self.adapter_revision,
                "adapter and adapter_revision go together: give both or neither",
            )

    def as_dict(self) -> dict[str, Any]:
        """The scope as the policy sees it (``input.scope``), every field present.

        Returns:
            A new dict; adapter fields are None for the base model.
        """
        return {name: getattr(self, name) for name in SCOPE_FIELDS}


_OPTIONAL = frozenset({"adapter", "adapter_revision"})


def check_scope_field(name: str, value: object) -> str:
    """Check one scope field by :class:`CacheScope`'s rules, before a scope is built from it.

    Args:
        name: the field's name (a key of :data:`kvgov.schema.TEXT_LIMITS`, or another
            name of a required scope field: the limit is then 256 characters).
        value: what was given, of any type.

    Returns:
        ``value``, a non-empty printable string the audit store can hold.

    Raises:
        InvalidScope: it is not a string, is empty, too long, or holds a NUL, a lone
            surrogate or another non-printable character (a control, a bidi override).
            The error shows at most a short, escaped excerpt of the value.
    """
    if not isinstance(value, str):
        raise InvalidScope(name, _excerpt(value), f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidScope(name, value, "must not be empty")
    problem = text_problem(value, TEXT_LIMITS.get(name, _FIELD_LIMIT))
    if problem is None and not value.isprintable():
        problem = "must contain printable characters only"
    if problem is not None:
        raise InvalidScope(name, _excerpt(value), problem)
    return value


_FIELD_LIMIT = TEXT_LIMITS["classification"]
_EXCERPT_CHARS = 32


def _excerpt(value: object) -> object:
    """What an InvalidScope shows of a bad value: short (its repr escapes what is unprintable)."""
    if isinstance(value, str):
        return value[:_EXCERPT_CHARS] + ("..." if len(value) > _EXCERPT_CHARS else "")
    kind = type(value)
    if value is None or kind is bool or kind is float:
        return value
    if kind is int and value.bit_length() <= 64:  # type: ignore[attr-defined]  # huge: repr raises
        return value
    return f"<{type(value).__name__}>"


# An import-time guard: the policy input, the scope digest and the audit events are
# built from SCOPE_FIELDS (the policy's scope schema), so it must name every field.
if {f.name for f in fields(CacheScope)} != set(SCOPE_FIELDS):  # pragma: no cover
    raise RuntimeError("SCOPE_FIELDS is out of date with CacheScope")
