"""Offload test doubles: an in-memory wrapped-key store, an attacker's raw access to a tier."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvgov.offload import DiskTier, RedisTier, SealedBlock, Tier
from kvgov.offload.objects import decode, encode


@dataclass
class MemoryKeyStore:
    """A WrappedKeyStore in a dict (the SQL one is tested in tests/audit)."""

    rows: dict[str, Any] = dataclasses.field(default_factory=dict)

    def live(self, tenant: str) -> Any:
        return next(
            (r for r in self.rows.values() if r.tenant == tenant and r.destroyed_us is None), None
        )

    def get(self, key_id: str) -> Any:
        return self.rows.get(key_id)

    def create(
        self, *, key_id: str, tenant: str, kek_id: str, wrapped: bytes, created_us: int
    ) -> Any:
        existing = self.live(tenant)
        if existing is not None:
            return existing
        self.rows[key_id] = _Row(key_id, tenant, kek_id, wrapped, created_us, None)
        return self.rows[key_id]

    def destroy(self, tenant: str, destroyed_us: int) -> list[str]:
        ids = [k for k, r in self.rows.items() if r.tenant == tenant and r.destroyed_us is None]
        for k in ids:
            self.rows[k] = dataclasses.replace(
                self.rows[k], wrapped=None, destroyed_us=destroyed_us
            )
        return ids

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Row:
    key_id: str
    tenant: str
    kek_id: str
    wrapped: bytes | None
    created_us: int
    destroyed_us: int | None


class Raw:
    """An attacker's byte-level access to the object stored at a location of a tier."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier

    def read(self, location: bytes) -> bytes:
        """The encoded object at ``location``."""
        if isinstance(self.tier, DiskTier):
            return self.tier.path_of(location).read_bytes()
        if isinstance(self.tier, RedisTier):
            data = self.tier._redis.client().get(self.tier.object_key(location))
            assert data is not None
            return bytes(data)
        obj = self.tier.get(location)
        assert obj is not None
        return encode(obj)

    def write(self, location: bytes, data: bytes) -> None:
        """Put ``data`` at ``location`` as the tier's own bytes (the index keeps its entry).

        The host tier holds objects, not bytes: ``data`` must decode there.
        """
        if isinstance(self.tier, DiskTier):
            self.tier.path_of(location).write_bytes(data)
        elif isinstance(self.tier, RedisTier):
            self.tier._redis.client().set(self.tier.object_key(location), data)
        else:
            self.put_object(location, decode(data, tier="host", block_key=location))

    def put_object(self, location: bytes, obj: SealedBlock) -> None:
        """Put an object at ``location`` whatever block key its header names (host tier)."""
        index = self.tier._index  # type: ignore[attr-defined]
        info = dataclasses.replace(obj.info(), block_key=location)
        index.pop(location)
        index.add(info, obj)

    def truncate(self, location: bytes, n: int) -> None:
        """Cut ``n`` bytes off the end of the object (for the host tier: of its ciphertext)."""
        if isinstance(self.tier, DiskTier | RedisTier):
            self.write(location, self.read(location)[:-n])
        else:
            obj = self.tier.get(location)
            assert obj is not None
            self.put_object(location, dataclasses.replace(obj, ciphertext=obj.ciphertext[:-n]))
