"""What the governor derives once per scope, and where a scope's blocks are keyed.

A :class:`ScopeView` holds a scope's policy input, its digest and its tenant's
namespace root, computed the first time the scope is seen; :class:`ScopeViews`
caches them and answers which namespaces a scope publishes in and reads from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvgov.exceptions import InvalidScope, PolicyUnavailable
from kvgov.policy import Decision, PolicyClient

from .keys import NamespaceRoot, ScopeDigest, namespace_root, scope_digest
from .scope import CacheScope

__all__ = ["PUBLIC", "ScopeView", "ScopeViews"]

#: The classification of a public prefix (see ``admit(public_prefix_tokens=...)``).
PUBLIC = "public"

#: Views kept before the cache of them is cleared (a bound on memory, not a tuning knob:
#: a deployment has far fewer distinct scopes).
_MAX_VIEWS = 65_536


@dataclass(frozen=True, slots=True)
class ScopeView:
    """What the governor derives once per scope.

    Attributes:
        scope: the scope.
        fields: the scope as a dict: the policy input and the AuditEvent keyword
            arguments.
        digest: the scope digest (every field but the tenant).
        own_root: the namespace root of the scope's tenant.
        values: the values of ``fields``, in :data:`kvgov.schema.SCOPE_FIELDS` order
            (the ``scope`` of :func:`kvgov.audit.events.trusted_event`).
    """

    scope: CacheScope
    fields: Mapping[str, Any]
    digest: ScopeDigest
    own_root: NamespaceRoot
    values: tuple[str | None, ...]


class ScopeViews:
    """A cache of :class:`ScopeView` per scope and of namespace roots per share group.

    Safe to use without the governor's lock: dict reads and writes are atomic,
    and two threads deriving the same view at once get equal views.

    Args:
        policy: the policy client: its classifications are the labels a scope may
            carry, its share groups say where a scope publishes and reads.
    """

    def __init__(self, policy: PolicyClient) -> None:
        self._policy = policy
        self._views: dict[CacheScope, ScopeView] = {}
        # scope -> the view of its public prefix's scope (classification public)
        self._public: dict[CacheScope, ScopeView] = {}
        self._group_roots: dict[str, NamespaceRoot] = {}
        self._classifications = policy.classifications()

    def view(self, scope: CacheScope, *, admitted: bool = False) -> ScopeView:
        """The view of ``scope``, derived on first sight.

        Args:
            scope: the scope.
            admitted: the scope was already admitted (a block owner): its
                classification is not checked again.

        Raises:
            InvalidScope: the classification is unknown to the policy.
            PolicyUnavailable: the policy's classifications cannot be read (its
                engine is down); they are asked for again on the next call, so
                admissions recover when the engine does.
        """
        view = self._views.get(scope)
        if view is not None:
            return view
        if not admitted and scope.classification not in self._classifications:
            self._classifications = known = self._policy.classifications()
            if not known:
                raise PolicyUnavailable("the classifications")
            if scope.classification not in known:
                raise InvalidScope(
                    "classification",
                    scope.classification,
                    f"unknown to the policy; known: {sorted(known)}",
                )
        if len(self._views) >= _MAX_VIEWS:
            self._views.clear()
        fields = scope.as_dict()
        view = ScopeView(
            scope=scope,
            fields=fields,
            digest=scope_digest(scope),
            own_root=namespace_root("tenant", scope.tenant),
            values=tuple(fields.values()),
        )
        self._views[scope] = view
        return view

    def public(self, view: ScopeView) -> ScopeView:
        """The view of ``view``'s scope with classification ``public``: the scope a
        public prefix of its requests is keyed under, derived once per scope.

        Raises:
            InvalidScope, PolicyUnavailable: as :meth:`view` (the policy must know
                ``public``).
        """
        pview = self._public.get(view.scope)
        if pview is None:
            pview = self.view(replace(view.scope, classification=PUBLIC))
            if len(self._public) >= _MAX_VIEWS:
                self._public.clear()
            self._public[view.scope] = pview
        return pview

    def known(self) -> list[ScopeView]:
        """The views derived so far (at most the last 65,536 scopes), e.g. to invalidate by."""
        return list(self._views.values())

    def group_root(self, group: str) -> NamespaceRoot:
        """The namespace root of a share group."""
        root = self._group_roots.get(group)
        if root is None:
            root = self._group_roots[group] = namespace_root("group", group)
        return root

    def namespaces(self, view: ScopeView) -> tuple[bytes, tuple[bytes, ...], Decision]:
        """Where a scope's blocks are keyed, and the other namespaces it may find blocks in.

        Returns:
            The publish root (its tenant's namespace, or the share group the
            policy lets it publish in), the other roots it may read (its
            tenant's own and every group it may read), each once, and the
            share-group decision (with its error when it failed closed: no groups).
        """
        groups = self._policy.share_groups(view.fields)
        root = view.own_root if groups.publish is None else self.group_root(groups.publish)
        readable = (view.own_root, *(self.group_root(g) for g in groups.read))
        return root, tuple(dict.fromkeys(r for r in readable if r != root)), groups.decision
