"""Signed scope tokens: moved to :mod:`kvgov.govern.scope_token` (every binding verifies them)."""

from __future__ import annotations

from ..scope_token import ScopeTokenVerifier, scope_token_message, sign_scope_token

__all__ = ["ScopeTokenVerifier", "scope_token_message", "sign_scope_token"]
