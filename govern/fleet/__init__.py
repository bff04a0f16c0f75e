"""The fleet's control plane, engine side: :class:`FleetAgent` registers an engine,
heartbeats, receives operator-signed orders (purge, invalidate, rotate-secret, rollout)
from the audit database and runs them between steps (docs/fleet.md)."""

from __future__ import annotations

from kvgov.govern.fleet.agent import FleetAgent, bundle_digest, trusted_keys
from kvgov.govern.fleet.target import Done, FleetTarget, NativeTarget

__all__ = ["Done", "FleetAgent", "FleetTarget", "NativeTarget", "bundle_digest", "trusted_keys"]
