"""A request's cache scope, for every engine binding: :class:`ScopeResolver`.

Where each field of the :class:`~kvgov.govern.CacheScope` comes from:

=====================  ========================================================
tenant                 ``extra_args["kvgov_tenant"]``, else ``default_tenant``
classification         ``extra_args["kvgov_classification"]``, else ``default_classification``
template_version       ``extra_args["kvgov_template"]``, else ``default_template``
model, model_revision  the engine's model config (``model``, ``revision``; the
                       ``model_revision`` setting overrides the revision)
tokenizer, revision    the engine's model config (``tokenizer``,
                       ``tokenizer_revision``; the ``tokenizer_revision`` setting
                       overrides it)
adapter, revision      the request's ``lora_request``: its name, and its path
                       (digested when longer than a scope field may be)
public prefix          ``extra_args["kvgov_public_prefix_tokens"]`` (vLLM only,
                       :meth:`ScopeResolver.resolve_request`): the first N prompt
                       tokens are public, keyed under the scope with classification
                       ``public``; signed by a ``v2`` token
=====================  ========================================================

``extra_args`` is the mapping the engine hands over: vLLM's ``extra_args`` (the OpenAI
server fills it from a request's ``vllm_xargs``), SGLang's ``custom_params``; a client
can write either: a trusted front end must set the three fields for the
caller it authenticated and strip any the client sent, and should sign them
(:mod:`kvgov.govern.scope_token`). A field with neither a value nor a
default refuses the request (fail closed); a field that is not a valid scope
field (:func:`kvgov.govern.scope.check_scope_field`) refuses it before any token
is checked. With ``require_scope_token`` every request needs a valid token, one
whose scope comes from the defaults too. This module needs no engine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgov.defaults import MAX_SCOPE_FIELD_CHARS, MAX_SCOPES, UNVERSIONED
from kvgov.exceptions import BindingConfigError, InvalidScope, ScopeTokenError

from .scope import CacheScope, check_scope_field
from .scope_token import PUBLIC_PREFIX_FIELD, ScopeTokenVerifier, check_public_prefix

if TYPE_CHECKING:
    from .vllm.settings import BindingSettings

__all__ = [
    "CLASSIFICATION_KEY",
    "PUBLIC_PREFIX_KEY",
    "SCOPE_KEYS",
    "TEMPLATE_KEY",
    "TENANT_KEY",
    "TOKEN_KEY",
    "EngineScope",
    "ScopeResolver",
    "revision_of",
]

#: ``extra_args`` key of the tenant.
TENANT_KEY = "kvgov_tenant"
#: ``extra_args`` key of the data classification.
CLASSIFICATION_KEY = "kvgov_classification"
#: ``extra_args`` key of the prompt-template version.
TEMPLATE_KEY = "kvgov_template"
#: ``extra_args`` key of the front end's signed scope token.
TOKEN_KEY = "kvgov_scope_token"
#: ``extra_args`` key of the public prefix's token count (signed by a ``v2`` token).
PUBLIC_PREFIX_KEY = PUBLIC_PREFIX_FIELD
#: Every ``extra_args`` key the binding reads; a front end strips all of them from clients.
SCOPE_KEYS = (TENANT_KEY, CLASSIFICATION_KEY, TEMPLATE_KEY, TOKEN_KEY, PUBLIC_PREFIX_KEY)


@dataclass(frozen=True, slots=True)
class EngineScope:
    """What the engine says about the KV of every request it serves.

    Attributes:
        model: the model name or path.
        model_revision: its weights revision.
        tokenizer: the tokenizer name or path.
        tokenizer_revision: its revision.
    """

    model: str
    model_revision: str
    tokenizer: str
    tokenizer_revision: str


def revision_of(value: object) -> str:
    """A revision usable as a scope field: the value, its digest if too long, or ``unversioned``.

    Args:
        value: a revision, a path, or None.

    Returns:
        ``value`` if it is a printable string of at most 256 characters,
        ``"sha256:<32 hex>"`` of it if it is a longer (or unprintable) string,
        :data:`kvgov.defaults.UNVERSIONED` if it is None or empty.
    """
    if value is None or value == "":
        return UNVERSIONED
    text = str(value)
    if len(text) <= MAX_SCOPE_FIELD_CHARS and text.isprintable():
        return text
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32]


class ScopeResolver:
    """Turns a request's ``extra_args`` and adapter into its scope, or refuses it.

    Args:
        settings: the binding's settings (defaults, whether tokens are required).
        engine: the engine's own fields.
        verifier: checks signed scope tokens; None when no scope-token key is set.

    """

    __slots__ = (
        "_defaults",
        "_engine",
        "_require",
        "_scopes",
        "_unscoped",
        "_valid_defaults",
        "_verifier",
    )

    def __init__(
        self,
        settings: BindingSettings,
        engine: EngineScope,
        verifier: ScopeTokenVerifier | None,
    ) -> None:
        self._defaults = (
            settings.default_tenant,
            settings.default_classification,
            settings.default_template,
        )
        # which defaults pass check_scope_field, checked once (an invalid one still
        # refuses each request that falls back on it, as it did)
        self._valid_defaults = tuple(
            _passes(name, default)
            for name, default in zip(
                (TENANT_KEY, CLASSIFICATION_KEY, TEMPLATE_KEY), self._defaults, strict=True
            )
        )
        self._require = settings.require_scope_token
        self._engine = engine
        self._verifier = verifier
        self._scopes: dict[tuple[object, ...], CacheScope] = {}
        # the scope of a request naming none, for the base model, without tokens required:
        # the defaults' (set once it resolved)
        self._unscoped: CacheScope | None = None

    @classmethod
    def from_settings(
        cls,
        settings: BindingSettings,
        engine: EngineScope,
        environ: Mapping[str, str],
        clock: Callable[[], float],
    ) -> ScopeResolver:
        """The resolver a binding opens with: its scope-token verifier, if a key is set.

        Raises:
            BindingConfigError: ``require_scope_token`` is on and no scope-token key is set.
        """
        key = settings.scope_token_key(environ)
        if settings.require_scope_token and key is None:
            raise BindingConfigError(
                "require_scope_token",
                True,
                "needs the scope-token key: set KVGOV_SCOPE_TOKEN_KEY or scope_token_key_file",
            )
        verifier = (
            None
            if key is None
            else ScopeTokenVerifier(key, max_ttl=settings.scope_token_max_ttl, clock=clock)
        )
        return cls(settings, engine, verifier)

    def resolve(self, extra_args: Mapping[str, object] | None, adapter: object) -> CacheScope:
        """The scope of one request, for a binding that offers no public prefixes.

        As :meth:`resolve_request`, and a request that declares a public prefix is
        refused (its system prompt would otherwise be kept as its own, silently).

        Raises:
            InvalidScope: as :meth:`resolve_request`, or the request carries a
                non-zero ``kvgov_public_prefix_tokens``.
            ScopeTokenError: as :meth:`resolve_request`.
        """
        scope, prefix = self.resolve_request(extra_args, adapter)
        if prefix:
            raise InvalidScope(
                PUBLIC_PREFIX_KEY, prefix, "this engine's binding offers no public prefixes"
            )
        return scope

    def resolve_request(
        self, extra_args: Mapping[str, object] | None, adapter: object
    ) -> tuple[CacheScope, int]:
        """The scope of one request, and how many of its leading tokens are public.

        Args:
            extra_args: the request's ``sampling_params.extra_args`` (or None).
            adapter: the request's ``lora_request`` (anything with ``lora_name`` and
                ``lora_path``), or None for the base model.

        Returns:
            The scope, and the public prefix's tokens (0: none).

        Raises:
            InvalidScope: ``extra_args`` is not a mapping, a field is missing with no
                default, or is not a valid scope field
                (:func:`~kvgov.govern.scope.check_scope_field`: not a string, empty, too
                long, a NUL, a lone surrogate, a non-printable character), or the
                public prefix is not an int in ``0..2**32-1``.
            ScopeTokenError: the request carries no token while ``require_scope_token``
                is on (whether its fields came from ``extra_args`` or the defaults), or
                its token is expired, malformed or forged (or does not sign its public
                prefix), or it carries a token and the engine has no key.
        """
        if extra_args is None:
            if adapter is None and self._unscoped is not None:
                return self._unscoped, 0  # nothing to read: the defaults' scope, as below
            xa: Mapping[str, object] = {}
        elif isinstance(extra_args, Mapping):
            xa = extra_args
        else:
            raise InvalidScope("extra_args", f"<{type(extra_args).__name__}>", "must be a mapping")
        fields: list[str] = []
        for name, default, valid in zip(
            (TENANT_KEY, CLASSIFICATION_KEY, TEMPLATE_KEY),
            self._defaults,
            self._valid_defaults,
            strict=True,
        ):
            value = xa.get(name)
            if value is None:
                if default is None:
                    raise InvalidScope(name, None, _MISSING[name])
                if valid:
                    fields.append(default)
                    continue
                value = default
            fields.append(check_scope_field(name, value))
        tenant, classification, template = fields
        prefix = xa.get(PUBLIC_PREFIX_KEY)
        prefix = 0 if prefix is None else check_public_prefix(prefix)
        token = xa.get(TOKEN_KEY)
        # required: every request, a defaulted scope too (the token then signs the defaults)
        if token is not None or self._require:
            if self._verifier is None:
                raise ScopeTokenError(
                    "the request carries a kvgov_scope_token but the engine has no scope-token "
                    "key (set KVGOV_SCOPE_TOKEN_KEY or scope_token_key_file)"
                )
            self._verifier.verify(
                token,
                tenant=tenant,
                classification=classification,
                template_version=template,
                public_prefix_tokens=prefix,
            )
        lora = None
        if adapter is not None:
            lora = (
                revision_of(getattr(adapter, "lora_name", None)),
                revision_of(getattr(adapter, "lora_path", None)),
            )
        key = (tenant, classification, template, lora)
        scope = self._scopes.get(key)
        if scope is None:
            engine = self._engine
            scope = CacheScope(
                tenant=tenant,
                classification=classification,
                model=engine.model,
                model_revision=engine.model_revision,
                tokenizer=engine.tokenizer,
                tokenizer_revision=engine.tokenizer_revision,
                template_version=template,
                adapter=lora[0] if lora else None,
                adapter_revision=lora[1] if lora else None,
            )
            if len(self._scopes) >= MAX_SCOPES:
                self._scopes.clear()
            self._scopes[key] = scope
        if extra_args is None and adapter is None and not self._require:
            self._unscoped = scope
        return scope, prefix


def _passes(name: str, value: object) -> bool:
    """Whether ``value`` passes :func:`check_scope_field` (None: no default, False)."""
    if value is None:
        return False
    try:
        check_scope_field(name, value)
    except InvalidScope:
        return False
    return True


_MISSING = {
    TENANT_KEY: (
        "the request carries no scope: a trusted front end must set kvgov_tenant (and "
        "kvgov_classification, kvgov_template) in the request's extra_args / vllm_xargs "
        "(SGLang: custom_params), "
        "or the engine must be configured with a default_tenant"
    ),
    CLASSIFICATION_KEY: (
        "the request names no data classification: the front end must set "
        "kvgov_classification, or the engine must be configured with a default_classification"
    ),
    TEMPLATE_KEY: (
        "the request names no prompt-template version: the front end must set "
        "kvgov_template, or the engine must be configured with a default_template"
    ),
}
